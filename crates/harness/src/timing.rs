//! CUDA-event timing of repeated operations, and the statistics weft reports (signal-gemm's, which
//! also times its first-use choices).

pub use weft_signal_gemm::timing::{median, time_iterations};
