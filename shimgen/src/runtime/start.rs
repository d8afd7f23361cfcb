//! How a shim starts: the config it finds, the real library it loads, and the policy
//! that follows from the config (forward only, fail closed, or apply the quota), which
//! every hook then acts on through [`Policy::decide`] (or
//! [`Policy::decide_or_fail_with`]) or [`Policy::applied`].

use std::ffi::{CStr, c_void};

use super::log::{Level, log, notice};
use super::slots::{RealLibrary, Slots, load_real};

/// What the config says a shim should do with the calls it hooks.
pub enum Policy<T> {
    /// No config at all: a transparent forwarder.
    Passthrough,
    /// The config exists but is unusable: every device is hidden.
    FailClosed,
    /// The quota applies, through `T` (the shim's own machinery).
    Apply(Box<T>),
}

impl<T> Policy<T> {
    /// What a hook does under this policy: `apply` with the shim's machinery when the
    /// quota applies, `passthrough` when the shim only forwards, `fail_closed` when the
    /// config is unusable. Each hook states all three; no arm is left implicit.
    #[inline]
    pub fn decide<'a, R>(
        &'a self,
        fail_closed: impl FnOnce() -> R,
        passthrough: impl FnOnce() -> R,
        apply: impl FnOnce(&'a T) -> R,
    ) -> R {
        match self {
            Policy::Passthrough => passthrough(),
            Policy::FailClosed => fail_closed(),
            Policy::Apply(machinery) => apply(machinery),
        }
    }

    /// [`Policy::decide`] where failing closed answers the API's error code
    /// `fail_closed` (both APIs return `u32` codes), as the hook's own result or as the
    /// error of a `Result`.
    #[inline]
    pub fn decide_or_fail_with<'a, R: From<FailedClosed>>(
        &'a self,
        fail_closed: u32,
        passthrough: impl FnOnce() -> R,
        apply: impl FnOnce(&'a T) -> R,
    ) -> R {
        self.decide(|| R::from(FailedClosed(fail_closed)), passthrough, apply)
    }

    /// The machinery when the quota applies (for what a hook does only then, such as
    /// crediting a free after the real call succeeded).
    #[inline]
    pub fn applied(&self) -> Option<&T> {
        match self {
            Policy::Apply(machinery) => Some(machinery),
            Policy::Passthrough | Policy::FailClosed => None,
        }
    }
}

/// The error code a hook answers with when its shim fails closed.
pub struct FailedClosed(pub u32);

impl From<FailedClosed> for u32 {
    fn from(closed: FailedClosed) -> u32 {
        closed.0
    }
}

impl<T> From<FailedClosed> for Result<T, u32> {
    fn from(closed: FailedClosed) -> Result<T, u32> {
        Err(closed.0)
    }
}

/// The config as a shim starts with it.
pub enum StartConfig {
    /// No config anywhere: forward only.
    Absent,
    /// Unusable; the notice has been printed.
    Broken,
    /// The config and the file it came from.
    Found(vgpu_contract::Config, std::path::PathBuf),
}

/// What every shim does when it loads: read the config (`VGPU_CONFIG`; one stderr line
/// naming the file and the error, then fail closed, when it is unusable), find the real
/// library in the driver folder and fill the slots from it (one stderr line, and every
/// call returns `unloaded_effect`'s error, when it cannot be loaded).
pub struct Start {
    /// The shim's short name in notices (`cuda`, `nvml`).
    pub shim: &'static str,
    /// File name of the real library in the driver folder (`libcuda.so.1`).
    pub library: &'static str,
    /// What the application then gets, for the notices.
    pub unloaded_effect: &'static str,
    /// What the application gets when the config is unusable, for the notice.
    pub fail_closed_effect: &'static str,
}

impl Start {
    /// Reads the config and loads the real library into `slots`; returns the library
    /// (`None` when it cannot be loaded), the config and the driver folder.
    pub fn run<const N: usize>(
        &self,
        names: &'static [&'static CStr; N],
        slots: &Slots<N>,
        hooked: impl Fn(usize) -> bool,
        missing_stub: *mut c_void,
    ) -> (Option<RealLibrary>, StartConfig, std::path::PathBuf) {
        use vgpu_contract::config::{Config, Loaded};
        let config = match Config::load_from_env() {
            Ok(Loaded::Found(config, path)) => StartConfig::Found(config, path),
            Ok(Loaded::Absent) => StartConfig::Absent,
            Err(err) => {
                notice(
                    self.shim,
                    format_args!("config {err}; {}", self.fail_closed_effect),
                );
                StartConfig::Broken
            }
        };
        let driver_dir = Config::resolved_driver_dir(match &config {
            StartConfig::Found(config, _) => Some(config),
            _ => None,
        });
        let path = driver_dir.join(self.library);
        let real = match load_real(&path, names, slots, hooked, missing_stub) {
            Ok(real) => {
                log(
                    Level::Debug,
                    self.shim,
                    format_args!(
                        "loaded {} ({} of {N} exports, {} missing)",
                        path.display(),
                        real.resolved(),
                        real.missing.len()
                    ),
                );
                Some(real)
            }
            Err(err) => {
                notice(
                    self.shim,
                    format_args!(
                        "cannot load the real library {}: {err}; {}",
                        path.display(),
                        self.unloaded_effect
                    ),
                );
                None
            }
        };
        (real, config, driver_dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(policy: &Policy<u32>) -> String {
        policy.decide(
            || "closed".to_string(),
            || "forwarded".to_string(),
            |machinery| format!("applied {machinery}"),
        )
    }

    #[test]
    fn each_policy_runs_its_own_arm() {
        assert_eq!(outcome(&Policy::Passthrough), "forwarded");
        assert_eq!(outcome(&Policy::FailClosed), "closed");
        assert_eq!(outcome(&Policy::Apply(Box::new(7))), "applied 7");
        assert_eq!(Policy::Apply(Box::new(7)).applied(), Some(&7));
        assert_eq!(Policy::<u32>::Passthrough.applied(), None);
        assert_eq!(Policy::<u32>::FailClosed.applied(), None);
        let closed: Result<u8, u32> =
            Policy::<u32>::FailClosed.decide_or_fail_with(100, || Ok(1), |_| Ok(2));
        assert_eq!(closed, Err(100));
        let code: u32 = Policy::Apply(Box::new(7)).decide_or_fail_with(100, || 0, |m| *m);
        assert_eq!(code, 7);
    }
}
