//! libnvml-shim: a `libnvidia-ml.so.1` that forwards every export of the real NVML and
//! shows the container its virtual GPU: only its devices (renumbered from 0), its quota
//! as total memory, its own usage and processes, and its own utilization.
//!
//! - `exports` (generated from `symbols/libnvidia-ml.so.*.txt`): slots and trampolines.
//! - `hooks`: devices, memory, processes, utilization, error strings.
//! - `state`: the config, the usage region and the visible devices.

mod exports {
    include!(concat!(env!("OUT_DIR"), "/exports.rs"));
}
pub mod hooks;
mod nvml;
mod state;
mod stubs;

/// Defines an exported, panic-guarded hook (see `vgpu_shimgen::define_hook`).
macro_rules! hook {
    ($($tokens:tt)*) => {
        ::vgpu_shimgen::define_hook!(crate::exports, crate::nvml::NVML_ERROR_UNKNOWN; $($tokens)*);
    };
}
pub(crate) use hook;

/// Calls the real function behind export `$name` (see `vgpu_shimgen::call_real`).
macro_rules! real {
    ($($tokens:tt)*) => {
        ::vgpu_shimgen::call_real!(crate::exports, $($tokens)*)
    };
}
pub(crate) use real;

/// Debug logging, off unless `VGPU_LOG` asks.
macro_rules! debug {
    ($($arg:tt)*) => {
        ::vgpu_shimgen::runtime::log(::vgpu_shimgen::runtime::Level::Debug, "nvml", format_args!($($arg)*))
    };
}
pub(crate) use debug;

vgpu_shimgen::run_at_load!(state::shim);
