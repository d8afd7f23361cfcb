//! Load and policy: what the NVML shim does when it is loaded (the real NVML into the
//! slots, the config) and the policy every hook then acts on: forward only, fail closed
//! (no GPU is visible), or show the container its view ([`View`]).
//!
//! Hooks ask the policy through [`virtualize`] (the view's closure, the passthrough
//! closure, and NVML_ERROR_INVALID_ARGUMENT when failing closed) or, where failing closed
//! answers differently, through [`policy`]'s `decide` with all three arms. The view's
//! devices are in `crate::devices`, the container's usage in `crate::usage`.

use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::OnceLock;

use vgpu_contract::config::Config;
use vgpu_shimgen::runtime::{self, FailedClosed, RealLibrary, StartConfig};

use crate::devices::VisibleGpu;
use crate::exports::{self, SLOTS};
use crate::nvml::*;
use crate::stubs;

/// What the config says the shim should do; `Apply` shows the container's view.
pub type Policy = runtime::Policy<View>;

/// What the shim learned at load.
pub struct Shim {
    /// The real NVML library, when it could be loaded.
    pub library: Option<RealLibrary>,
    /// What the hooks do.
    pub policy: Policy,
}

/// The container's view of its GPUs.
pub struct View {
    /// The container's config.
    pub config: Config,
    /// The container's usage region (read through a private copy per query).
    pub(crate) region_path: PathBuf,
    /// The visible devices, once the real NVML can name them.
    pub(crate) devices: OnceLock<Vec<VisibleGpu>>,
}

static SHIM: OnceLock<Shim> = OnceLock::new();

/// The shim's state, loaded on first use (normally by the load-time constructor).
#[inline]
pub fn shim() -> &'static Shim {
    SHIM.get_or_init(load)
}

/// The policy every hook acts on.
#[inline]
pub fn policy() -> &'static Policy {
    &shim().policy
}

/// What a hook does under the policy: `apply` with the view when the config applies,
/// `passthrough` when the shim only forwards, NVML_ERROR_INVALID_ARGUMENT when it fails
/// closed (the devices a caller could name do not exist for it).
#[inline]
pub fn virtualize<R: From<FailedClosed>>(
    passthrough: impl FnOnce() -> R,
    apply: impl FnOnce(&'static View) -> R,
) -> R {
    policy().decide_or_fail_with(NVML_ERROR_INVALID_ARGUMENT, passthrough, apply)
}

fn load() -> Shim {
    let start = runtime::Start {
        shim: "nvml",
        library: "libnvidia-ml.so.1",
        unloaded_effect: "every NVML call returns NVML_ERROR_DRIVER_NOT_LOADED",
        fail_closed_effect: "no GPU is visible (fail-closed)",
    };
    let (library, config, _) = start.run(
        &exports::NAMES,
        &SLOTS,
        |index| exports::HOOKS[index].is_some(),
        stubs::missing_in_driver as *mut c_void,
    );
    let policy = match config {
        StartConfig::Absent => Policy::Passthrough,
        StartConfig::Broken => Policy::FailClosed,
        StartConfig::Found(config, path) => {
            let region_path = config.resolved_region_path(&path);
            Policy::Apply(Box::new(View {
                config,
                region_path,
                devices: OnceLock::new(),
            }))
        }
    };
    Shim { library, policy }
}
