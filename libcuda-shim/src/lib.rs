//! libcuda-shim: a `libcuda.so.1` that forwards every export of the real driver and
//! enforces the container's quota.
//!
//! - `exports` (generated from `symbols/libcuda.so.*.txt`): the slot table and one naked
//!   trampoline per export the shim does not hook.
//! - `hooks`: the hooked exports, grouped by job (devices, contexts and which is
//!   current, memory, proc address lookup, launches, stream capture).
//! - `limiter`: the compute limiter behind the launch hooks; `current`: the per-thread
//!   cache of the current context and device it reads.
//! - `state`: what the shim learned at load: the real library, the config, the usage
//!   region, the visible devices and this process's allocations.
//! - `stubs`: what a slot points to when there is nothing real to call.
//!
//! The real library is loaded when the shim is (an `.init_array` constructor), so the
//! trampolines never have to resolve anything on the call path.

#![allow(clippy::missing_safety_doc)]

mod cuda;
mod current;
mod ledger;
mod limiter;
mod exports {
    include!(concat!(env!("OUT_DIR"), "/exports.rs"));
}
pub mod hooks;
mod state;
mod stubs;

/// Defines an exported, panic-guarded hook (see `vgpu_shimgen::define_hook`).
macro_rules! hook {
    ($($tokens:tt)*) => {
        ::vgpu_shimgen::define_hook!(crate::exports, crate::cuda::CUDA_ERROR_UNKNOWN; $($tokens)*);
    };
}
pub(crate) use hook;

/// Debug logging, off unless `VGPU_LOG` asks.
macro_rules! debug {
    ($($arg:tt)*) => {
        ::vgpu_shimgen::runtime::log(::vgpu_shimgen::runtime::Level::Debug, "cuda", format_args!($($arg)*))
    };
}
pub(crate) use debug;

// Loads the real driver and the config when the shim is loaded.
vgpu_shimgen::run_at_load!(state::shim);
