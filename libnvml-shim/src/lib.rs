//! libnvml-shim: a `libnvidia-ml.so.1` that forwards every export of the real NVML and
//! shows the container its virtual GPU: only its devices (renumbered from 0), its quota
//! as total memory, its own usage and processes, and its own utilization.
//!
//! - `exports` (generated from `symbols/libnvidia-ml.so.*.txt`): slots, trampolines and
//!   the hooks' addresses.
//! - `hooks`: devices, memory, processes, utilization, error strings.
//! - `state`: load and policy: what the shim does when it is loaded, and the policy
//!   every hook acts on (forward, fail closed, show the container's `View`).
//! - `devices`: which GPUs the container sees, renumbered.
//! - `usage`: the container's processes and memory (the usage region and the real
//!   NVML's process list), and its PIDs.
//! - `ffi`: every read and write through a caller's pointer.
//! - `nvml`: NVML's facts (from `vgpu-abi`); `stubs`: what a slot points to when there
//!   is nothing real to call.

mod devices;
mod exports {
    include!(concat!(env!("OUT_DIR"), "/exports.rs"));
}
mod ffi;
mod hooks;
mod nvml;
mod state;
mod stubs;
mod usage;

/// Defines an exported, panic-guarded hook (see `vgpu_shimgen::define_hook`).
macro_rules! hook {
    ($($tokens:tt)*) => {
        ::vgpu_shimgen::define_hook!(crate::exports, crate::nvml::NVML_ERROR_UNKNOWN; $($tokens)*);
    };
}
pub(crate) use hook;

/// The real function behind export `$name` (see `vgpu_shimgen::call_real`).
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
