//! Copies between host memory and this rank's buffer of a [`Pgl`], blocking: for inputs written
//! from the host before a collective runs and results read back after it (examples, tests,
//! benchmarks' setup). Kernels and stream-ordered copies use [`Pgl::local_ptr`] instead.

use crate::driver::check;
use crate::element::PglElement;
use crate::error::{typed, PglError};
use crate::pgl::Pgl;
use cudarc::driver::sys;

impl<T: PglElement> Pgl<T> {
    /// Copies `host` into this rank's buffer from its first element; the copy has finished when
    /// this returns (the context is synchronised: a copy from pageable memory may otherwise
    /// still be in flight, unordered with the streams that read the buffer next). No kernel may
    /// use the buffer meanwhile. Err when `host` is longer than the buffer.
    pub fn copy_from_host(&self, host: &[T]) -> Result<(), PglError> {
        self.check_host_copy_len(host.len())?;
        if host.is_empty() {
            return Ok(());
        }
        self.context().bind_to_thread()?;
        // SAFETY: copies host.len() elements into this rank's buffer, which holds at least as
        // many; `host` outlives the call, which returns once the copy is done (below).
        let r = unsafe {
            sys::cuMemcpyHtoD_v2(
                self.local_ptr(),
                host.as_ptr().cast(),
                std::mem::size_of_val(host),
            )
        };
        typed(check(|| "copying host memory into a PGL".into(), r))?;
        self.context().synchronize()?;
        Ok(())
    }

    /// Copies the first `host.len()` elements of this rank's buffer into `host`. Synchronise the
    /// streams that write the buffer first (a plan's `synchronize`). Err when `host` is longer
    /// than the buffer.
    pub fn copy_to_host(&self, host: &mut [T]) -> Result<(), PglError> {
        self.check_host_copy_len(host.len())?;
        if host.is_empty() {
            return Ok(());
        }
        self.context().bind_to_thread()?;
        // SAFETY: copies host.len() elements of this rank's buffer, which holds at least as
        // many, into `host`; synchronous for pageable host memory.
        let r = unsafe {
            sys::cuMemcpyDtoH_v2(
                host.as_mut_ptr().cast(),
                self.local_ptr(),
                std::mem::size_of_val(host),
            )
        };
        typed(check(|| "copying a PGL into host memory".into(), r))
    }

    /// `PglError::Length` when a host copy of `n` elements would run past this rank's buffer.
    fn check_host_copy_len(&self, n: usize) -> Result<(), PglError> {
        if n > self.len() {
            return Err(PglError::Length(format!(
                "a host copy of {n} elements runs past this PGL's {} per rank",
                self.len()
            )));
        }
        Ok(())
    }
}
