//! weft-grpcoll: native intranode GroupCast / GroupReduce kernels over pgl peer buffers, with an
//! NCCL AlltoAll-v baseline.
//!
//! Not implemented yet (tracked by the grpcoll issue). This crate deliberately exports nothing
//! until the kernels exist and are checked against the baseline.
