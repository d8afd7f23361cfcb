//! vgpu-sim: a simulated NVIDIA driver. One shared library exports a subset of the CUDA
//! driver API (`cu*`, module `cuda`) and of NVML (`nvml*`, module `nvml`) with real
//! host-side bookkeeping, so the shims, the device plugin and their tests run on
//! machines without a GPU. It is installed as both `libcuda.so.1` and
//! `libnvidia-ml.so.1` in a "sim driver folder" (see README.md).
//!
//! This file owns the process-wide pieces both halves share: the machine description
//! (`Sim`: config + the cross-process state file), this process's state slot, the
//! opt-in stderr log and the panic hook.

pub(crate) mod clock;
pub(crate) mod config;
pub(crate) mod cuda;
pub(crate) mod ffi;
pub(crate) mod hostpid;
pub(crate) mod nvml;
pub(crate) mod state;
pub(crate) mod sync;
pub(crate) mod version;

use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use config::SimConfig;
use state::{SharedState, SlotIndex};

/// The simulated machine as this process sees it.
pub struct Sim {
    /// The machine description from `VGPU_SIM_*`.
    pub config: SimConfig,
    /// The cross-process state file every simulated process shares.
    pub state: SharedState,
}

static SIM: OnceLock<Result<Sim, String>> = OnceLock::new();
/// This process's slot in the state file, plus one; 0 while none is held.
static SLOT: AtomicUsize = AtomicUsize::new(0);

/// Whether `VGPU_LOG` names a level other than `off` (`vgpu_contract::log`).
pub fn log_enabled() -> bool {
    use vgpu_contract::log::Level;
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED.get_or_init(|| Level::from_env(Level::Off) != Level::Off)
}

/// One line on stderr, only when `VGPU_LOG` names a level.
pub fn log(message: &str) {
    if log_enabled() {
        eprintln!("vgpu-sim: {message}");
    }
}

/// Our own panic hook: this library has its own copy of std, so this changes nothing for
/// the host application; it keeps panic messages off stderr unless `VGPU_LOG` names a level.
pub fn install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        std::panic::set_hook(Box::new(|info| log(&format!("internal error: {info}"))));
    });
}

/// The machine, loading config and state on first use. A bad config or an unusable state
/// file gives one clear stderr line (always: it is why every call will fail) and None.
pub fn sim() -> Option<&'static Sim> {
    let loaded = SIM.get_or_init(|| {
        let result = SimConfig::from_env()
            .map_err(|err| format!("bad simulated GPU config: {err}"))
            .and_then(|config| match SharedState::open(&config.state_path) {
                Ok(state) => Ok(Sim { config, state }),
                Err(err) => Err(format!(
                    "simulated GPU state file {}: {err}",
                    config.state_path.display()
                )),
            });
        if let Err(message) = &result {
            eprintln!("vgpu-sim: {message}");
        }
        result
    });
    loaded.as_ref().ok()
}

/// This process's slot, claimed on first use. None when the state file is full of live processes.
pub fn my_slot(sim: &Sim) -> Option<SlotIndex> {
    let held = SLOT.load(Ordering::Acquire);
    if held != 0 {
        return Some(SlotIndex(held - 1));
    }
    let me = vgpu_contract::process::current();
    let claimed = sim.state.claim(me.pid, me.start_time, me.pid_ns)?;
    match SLOT.compare_exchange(0, claimed.0 + 1, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => Some(claimed),
        Err(other) => {
            sim.state.release_slot(claimed);
            Some(SlotIndex(other - 1))
        }
    }
}

/// After fork, the child is a new process: it must claim its own slot.
pub(crate) fn forget_slot_after_fork() {
    SLOT.store(0, Ordering::Release);
}
