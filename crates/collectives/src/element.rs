//! Element types the collectives move and sum (sums accumulate in f32).

use weft_pgl::PglElement;

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
    impl Sealed for half::f16 {}
}

/// A type the collective kernels handle (sealed: exactly f32, bf16 and f16); `KERNEL` is its
/// kernel in kernels/collectives/collectives.cu (the sentinel two-shot AllReduce: `KERNEL` +
/// `_two_shot`), `INDEX` its place among the loaded kernels.
pub trait CollectiveElement: PglElement + sealed::Sealed {
    const KERNEL: &'static str;
    const INDEX: usize;
}

impl CollectiveElement for f32 {
    const KERNEL: &'static str = "weft_collective_f32";
    const INDEX: usize = 0;
}
impl CollectiveElement for half::bf16 {
    const KERNEL: &'static str = "weft_collective_bf16";
    const INDEX: usize = 1;
}
impl CollectiveElement for half::f16 {
    const KERNEL: &'static str = "weft_collective_f16";
    const INDEX: usize = 2;
}
