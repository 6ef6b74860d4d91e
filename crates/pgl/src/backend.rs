//! Which mechanism shares memory between ranks.
//!
//! - `Vmm` (the default for buffers weft allocates): `cuMemCreate` with the POSIX-fd handle type,
//!   granularity-aligned, fds passed to peers (pidfd_getfd), mapped into each process. Required
//!   for NVLink multicast (which weft never uses unless opted in) and needed for memory that
//!   outlives CUDA IPC's one-open-per-process rule.
//! - `Ipc`: `cuMemAlloc` memory shared with CUDA IPC handles. Works on a buffer the caller already
//!   owns (e.g. a framework tensor), which VMM cannot share; no granularity padding.
//!
//! [`Backend::choose`] picks one for a caller that leaves it open: `WEFT_PGL_BACKEND=ipc|vmm`
//! overrides the default there, an explicit choice wins over both. `Pgl::alloc` itself takes the
//! backend it is given (weft's own allocations pass theirs).

use crate::error::PglError;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum Backend {
    Ipc = 1,
    #[default]
    Vmm = 2,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Ipc => "ipc",
            Backend::Vmm => "vmm",
        }
    }

    pub fn from_code(code: u8) -> Option<Backend> {
        [Backend::Ipc, Backend::Vmm]
            .into_iter()
            .find(|b| *b as u8 == code)
    }

    /// The backend for a new allocation: `requested` if given, else `WEFT_PGL_BACKEND` (read
    /// through `var`), else the default. `existing_buffer` (sharing memory the caller owns) works
    /// only with IPC; `multicast` only with VMM.
    pub fn choose(
        requested: Option<Backend>,
        var: impl Fn(&str) -> Option<String>,
        existing_buffer: bool,
        multicast: bool,
    ) -> Result<Backend, PglError> {
        let from_env = match var("WEFT_PGL_BACKEND").as_deref() {
            None | Some("") => None,
            Some("ipc") => Some(Backend::Ipc),
            Some("vmm") => Some(Backend::Vmm),
            Some(other) => {
                return Err(PglError::Setting {
                    var: "WEFT_PGL_BACKEND",
                    value: other.to_string(),
                    reason: "is not \"ipc\" or \"vmm\"".into(),
                })
            }
        };
        let implied = if existing_buffer {
            Some(Backend::Ipc)
        } else if multicast {
            Some(Backend::Vmm)
        } else {
            None
        };
        let chosen = requested.or(implied).or(from_env).unwrap_or_default();
        if existing_buffer && chosen != Backend::Ipc {
            return Err(PglError::Unsupported("sharing an existing buffer needs the ipc backend (vmm can only share memory it allocated)".into()));
        }
        if multicast && chosen != Backend::Vmm {
            return Err(PglError::Unsupported(
                "multicast needs the vmm backend".into(),
            ));
        }
        Ok(chosen)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(v: Option<&str>) -> impl Fn(&str) -> Option<String> + '_ {
        move |_| v.map(String::from)
    }

    #[test]
    fn default_env_and_explicit_choices() {
        assert_eq!(
            Backend::choose(None, env(None), false, false).unwrap(),
            Backend::Vmm
        );
        assert_eq!(
            Backend::choose(None, env(Some("ipc")), false, false).unwrap(),
            Backend::Ipc
        );
        assert_eq!(
            Backend::choose(Some(Backend::Vmm), env(Some("ipc")), false, false).unwrap(),
            Backend::Vmm
        );
        let e = Backend::choose(None, env(Some("nvshmem")), false, false).unwrap_err();
        assert!(
            matches!(&e, PglError::Setting { var: "WEFT_PGL_BACKEND", value, .. } if value == "nvshmem"),
            "{e:?}"
        );
    }

    #[test]
    fn existing_buffers_need_ipc_and_multicast_needs_vmm() {
        assert_eq!(
            Backend::choose(None, env(Some("vmm")), true, false).unwrap(),
            Backend::Ipc
        );
        assert!(matches!(
            Backend::choose(Some(Backend::Vmm), env(None), true, false),
            Err(PglError::Unsupported(_))
        ));
        assert_eq!(
            Backend::choose(None, env(Some("ipc")), false, true).unwrap(),
            Backend::Vmm
        );
        assert!(Backend::choose(Some(Backend::Ipc), env(None), false, true)
            .unwrap_err()
            .to_string()
            .contains("vmm"));
    }
}
