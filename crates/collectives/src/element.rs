//! Element types the collectives move and sum (sums accumulate in f32).

use weft_pgl::PglElement;

/// A type the collective kernels handle; `KERNEL` is its kernel in kernels/collectives/collectives.cu.
pub trait CollectiveElement: PglElement {
    const KERNEL: &'static str;
}

impl CollectiveElement for f32 {
    const KERNEL: &'static str = "weft_collective_f32";
}
impl CollectiveElement for half::bf16 {
    const KERNEL: &'static str = "weft_collective_bf16";
}
impl CollectiveElement for half::f16 {
    const KERNEL: &'static str = "weft_collective_f16";
}
