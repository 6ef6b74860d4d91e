//! Copies between host memory and this rank's buffer of a [`Pgl`], blocking: for inputs written
//! from the host before a collective runs and results read back after it (examples, tests,
//! benchmarks' setup). Kernels and stream-ordered copies use [`Pgl::local_ptr`] instead.

use crate::driver::check;
use crate::element::PglElement;
use crate::pgl::Pgl;
use anyhow::ensure;
use cudarc::driver::sys;

impl<T: PglElement> Pgl<T> {
    /// Copies `host` into this rank's buffer from its first element; the copy has finished when
    /// this returns (the context is synchronised: a copy from pageable memory may otherwise
    /// still be in flight, unordered with the streams that read the buffer next). No kernel may
    /// use the buffer meanwhile. Err when `host` is longer than the buffer.
    pub fn copy_from_host(&self, host: &[T]) -> anyhow::Result<()> {
        if !self.ready_for_host_copy(host.len(), "do not fit")? {
            return Ok(());
        }
        // SAFETY: copies host.len() elements into this rank's buffer, which holds at least as
        // many; `host` outlives the call, which returns once the copy is done (below).
        let r = unsafe {
            sys::cuMemcpyHtoD_v2(
                self.local_ptr(),
                host.as_ptr().cast(),
                std::mem::size_of_val(host),
            )
        };
        check(|| "copying host memory into a PGL".into(), r)?;
        self.context().synchronize()?;
        Ok(())
    }

    /// Copies the first `host.len()` elements of this rank's buffer into `host`. Synchronise the
    /// streams that write the buffer first (a plan's `synchronize`). Err when `host` is longer
    /// than the buffer.
    pub fn copy_to_host(&self, host: &mut [T]) -> anyhow::Result<()> {
        if !self.ready_for_host_copy(host.len(), "are more than")? {
            return Ok(());
        }
        // SAFETY: copies host.len() elements of this rank's buffer, which holds at least as
        // many, into `host`; synchronous for pageable host memory.
        let r = unsafe {
            sys::cuMemcpyDtoH_v2(
                host.as_mut_ptr().cast(),
                self.local_ptr(),
                std::mem::size_of_val(host),
            )
        };
        check(|| "copying a PGL into host memory".into(), r)
    }

    /// Whether a copy of `n` elements has anything to do (Err when they `relation` this rank's
    /// buffer); the context is bound when it has.
    fn ready_for_host_copy(&self, n: usize, relation: &str) -> anyhow::Result<bool> {
        ensure!(
            n <= self.len(),
            "{n} elements {relation} this PGL's {} per rank",
            self.len()
        );
        if n == 0 {
            return Ok(false);
        }
        self.context().bind_to_thread()?;
        Ok(true)
    }
}
