//! libcuda-shim: a `libcuda.so.1` that forwards every export of the real driver and
//! enforces the container's quota.
//!
//! - `exports` (generated from `symbols/libcuda.so.*.txt`): the slot table, one naked
//!   trampoline per export the shim does not hook, and the hooks' addresses.
//! - `hooks`: the hooked exports, one file per API family (devices, contexts, which
//!   context is current, memory, VMM, pools, proc address lookup, launches, stream
//!   capture).
//! - `state`: load and policy: what the shim does when it is loaded, and the policy
//!   every hook acts on (forward, fail closed, enforce through the `Enforcer`).
//! - `devices`: the visible devices and the device a call lands on.
//! - `process`: this process's state (its `Ledger`, with its slot), rebuilt after
//!   fork; the slot is given back at exit.
//! - `fork_epoch`: the shim's one `pthread_atfork` handler and the fork generation that
//!   every per-process cache (process state, limiter, current context, captures) is
//!   checked against; `exit`: its one `atexit` handler (the limiter stands down, the
//!   slot is given back).
//! - `ledger`: the `Ledger`, this process's memory account (owned by its process
//!   state): what it holds on the card, counted in the usage region (single
//!   allocations, context overhead, VMM handles, memory pools, what the driver reserves
//!   on its own); pure, tested apart from the driver.
//! - `allocating`: the allocation paths, begin -> the hook's real call -> finish, which
//!   place each call on a device, ask the ledger, and report refusals.
//! - `meter`: the real NVML's figures for this process (context overhead, and the
//!   reconciliation that counts what the driver loads later).
//! - `ffi`: every read and write through a caller's pointer.
//! - `limiter`: the compute limiter behind the launch hooks; `current`: the per-thread
//!   cache of the current context and device it reads.
//! - `cuda`: the driver API's facts (from `vgpu-abi`); `stubs`: what a slot points to
//!   when there is nothing real to call.
//!
//! The real library is loaded when the shim is (an `.init_array` constructor), so the
//! trampolines never have to resolve anything on the call path.

#![allow(clippy::missing_safety_doc)]

mod allocating;
mod cuda;
mod current;
mod devices;
mod exit;
mod exports {
    include!(concat!(env!("OUT_DIR"), "/exports.rs"));
}
mod ffi;
mod fork_epoch;
mod hooks;
mod ledger;
mod limiter;
mod meter;
mod process;
mod state;
mod stubs;

/// Defines an exported, panic-guarded hook (see `vgpu_shimgen::define_hook`).
macro_rules! hook {
    ($($tokens:tt)*) => {
        ::vgpu_shimgen::define_hook!(crate::exports, crate::cuda::CUDA_ERROR_UNKNOWN; $($tokens)*);
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
        ::vgpu_shimgen::runtime::log(::vgpu_shimgen::runtime::Level::Debug, "cuda", format_args!($($arg)*))
    };
}
pub(crate) use debug;

// Loads the real driver and the config when the shim is loaded.
vgpu_shimgen::run_at_load!(state::shim);
