//! Load and policy: what the shim does when it is loaded (the real driver into the
//! slots, the config, the usage region) and the policy every hook then acts on: forward
//! only, fail closed, or enforce through the [`Enforcer`].
//!
//! Hooks ask the policy one of two ways: [`enforce`] states what happens under each
//! policy (the enforcing closure, the passthrough closure, and the fail-closed
//! `CUDA_ERROR_NO_DEVICE`), [`enforcing`] gives the enforcer only when the quota applies
//! (and [`after_success`] runs what a hook does only then, after its real call
//! succeeded, such as crediting a free).
//!
//! The rest of what the enforcer knows lives beside it, one job a module: the visible
//! devices (`crate::devices`), the allocation paths (`crate::allocating`: begin -> the
//! hook's real call -> finish), this process's state (`crate::process`), which owns
//! its `Ledger` of what it holds (`crate::ledger`), the NVML meter (`crate::meter`),
//! and the one fork and one exit service (`crate::fork_epoch`, `crate::exit`). The
//! enforcer itself counts nothing: every byte counted goes through the ledger.

use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::OnceLock;

use vgpu_contract::config::Config;
use vgpu_contract::region::{OpenOutcome, Region, RegionError};
use vgpu_shimgen::runtime::{self, FailedClosed, RealLibrary, StartConfig};

use crate::cuda::*;
use crate::exports::{self, SLOTS};
use crate::stubs;

// The names the limiter reaches through `state` (`state::{Visible, real}`).
pub(crate) use crate::devices::Visible;
pub(crate) use crate::real;

/// What the config says the shim should do; `Apply` enforces quotas.
pub type Policy = runtime::Policy<Enforcer>;

/// What the shim learned at load.
pub struct Shim {
    /// The real driver library, when it could be loaded.
    pub library: Option<RealLibrary>,
    /// What the hooks do.
    pub policy: Policy,
}

/// The live quota machinery.
pub struct Enforcer {
    /// The container's config.
    pub config: Config,
    /// The container's usage region (or this process's private one).
    pub region: Region,
    /// The real driver folder (for the real NVML).
    pub driver_dir: PathBuf,
    /// The visible devices, once the real driver can name them.
    pub(crate) devices: OnceLock<Vec<Visible>>,
    /// The container's region is damaged or foreign while live processes hold it:
    /// this process refuses every allocation rather than count outside it.
    pub(crate) refused: bool,
}

static SHIM: OnceLock<Shim> = OnceLock::new();

/// The shim's state, loaded on first use (normally by the load-time constructor).
#[inline]
pub fn shim() -> &'static Shim {
    SHIM.get_or_init(load)
}

/// The shim's state if it has been loaded (never loads it: for the exit service).
pub fn loaded() -> Option<&'static Shim> {
    SHIM.get()
}

/// The policy every hook acts on.
#[inline]
pub fn policy() -> &'static Policy {
    &shim().policy
}

/// What a hook does under the policy: `apply` with the enforcer when the quota applies,
/// `passthrough` when the shim only forwards, CUDA_ERROR_NO_DEVICE when it fails closed.
#[inline]
pub fn enforce<R: From<FailedClosed>>(
    passthrough: impl FnOnce() -> R,
    apply: impl FnOnce(&'static Enforcer) -> R,
) -> R {
    policy().decide_or_fail_with(CUDA_ERROR_NO_DEVICE, passthrough, apply)
}

/// The enforcer when the quota applies; `None` when the shim forwards or fails closed.
#[inline]
pub fn enforcing() -> Option<&'static Enforcer> {
    policy().applied()
}

/// Runs `then` with the enforcer when the real call's `result` is a success and the
/// quota applies (crediting a free, learning a pool); returns `result`.
#[inline]
pub fn after_success(result: CUresult, then: impl FnOnce(&'static Enforcer)) -> CUresult {
    if result == CUDA_SUCCESS
        && let Some(enforcer) = enforcing()
    {
        then(enforcer);
    }
    result
}

fn load() -> Shim {
    let start = runtime::Start {
        shim: "cuda",
        library: "libcuda.so.1",
        unloaded_effect: "every CUDA call returns CUDA_ERROR_NOT_INITIALIZED",
        fail_closed_effect: "hiding every GPU (fail-closed)",
    };
    let (library, config, driver_dir) = start.run(
        &exports::NAMES,
        &SLOTS,
        |index| exports::HOOKS[index].is_some(),
        stubs::missing_in_driver as *mut c_void,
    );
    let policy = match config {
        StartConfig::Absent => Policy::Passthrough,
        StartConfig::Broken => Policy::FailClosed,
        StartConfig::Found(config, path) => match Enforcer::new(config, path, driver_dir) {
            Some(enforcer) => Policy::Apply(Box::new(enforcer)),
            None => Policy::FailClosed,
        },
    };
    crate::process::register_handlers();
    Shim { library, policy }
}

impl Enforcer {
    fn new(config: Config, config_path: PathBuf, driver_dir: PathBuf) -> Option<Enforcer> {
        let devices = config.region_devices();
        let region_path = config.resolved_region_path(&config_path);
        let (region, refused) = match Region::open(&region_path, &devices) {
            Ok((region, outcome)) => {
                if let OpenOutcome::Rebuilt(reason) = outcome {
                    runtime::notice(
                        "cuda",
                        format_args!(
                            "usage region {} was rebuilt (no live process held it): {reason}",
                            region_path.display()
                        ),
                    );
                }
                (region, false)
            }
            Err(err) => {
                // Held: another process's usage is in there, so counting apart from it
                // would pass the quota; refuse. Unopenable: the quota must still hold
                // inside this process.
                let held = matches!(err, RegionError::Held { .. });
                let effect = if held {
                    "every allocation of this process is refused"
                } else {
                    "enforcing the quota for this process alone"
                };
                let private = std::env::temp_dir()
                    .join(format!("vgpu-private-{}.region", std::process::id()));
                let _ = std::fs::remove_file(&private);
                match Region::open(&private, &devices) {
                    Ok((region, _)) => {
                        let _ = std::fs::remove_file(&private);
                        runtime::notice("cuda", format_args!("{err}; {effect}"));
                        (region, held)
                    }
                    Err(second) => {
                        runtime::notice(
                            "cuda",
                            format_args!("{err}; {second}; hiding every GPU (fail-closed)"),
                        );
                        return None;
                    }
                }
            }
        };
        Some(Enforcer {
            config,
            region,
            driver_dir,
            devices: OnceLock::new(),
            refused,
        })
    }
}
