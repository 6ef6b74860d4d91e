//! weft-barrier: KernelBarrier, a device counter that communication kernels arrive on at launch
//! and a one-thread wait kernel that holds the compute stream until they are resident.
//!
//! Not implemented yet (tracked by the barrier issue). This crate deliberately exports nothing
//! until the barrier exists and its overlap is measured.
