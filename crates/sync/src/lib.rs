//! weft-sync: device `signal` / `signal_all` / `wait` / `barrier` primitives over pgl-allocated
//! counters, bounded spins with a host-visible error slot, and their host side.
//!
//! Not implemented yet (tracked by the sync issue). This crate deliberately exports nothing until
//! the primitives exist and are tested on GPUs.
