//! weft-signal-gemm: a persistent, warp-specialized Hopper GEMM (TMA + wgmma) whose epilogue
//! signals finished waves and writes through reorder maps, overlapped with NCCL or fused peer
//! communication.
//!
//! Not implemented yet (tracked by the signal-gemm issues). This crate deliberately exports
//! nothing until the GEMM exists and is measured against cuBLAS.
