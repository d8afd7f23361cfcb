//! cuGetProcAddress and cuGetProcAddress_v2, through which the CUDA 11.3+ runtimes fetch
//! almost every driver function. The real lookup runs first (so every version rule and
//! per-thread-stream flag is the driver's own); the pointer it returns is mapped back to
//! the export whose address it is, and if the shim hooks that export, the hook is handed
//! out instead. No version table is needed, and nothing hooked can be bypassed.

use std::ffi::{CStr, c_char, c_void};

use crate::cuda::*;
use crate::exports::HOOKS;
use crate::state::{Policy, shim};
use crate::{debug, hook};

/// Replaces `*function` with the hook of the export it points to, if there is one.
fn swap_in_hook(symbol: *const c_char, function: *mut *mut c_void) {
    let shim = shim();
    if matches!(shim.policy, Policy::Passthrough) || function.is_null() {
        return;
    }
    let Some(real) = &shim.real else { return };
    // SAFETY: the real lookup succeeded, so it wrote `*function`.
    let pointer = unsafe { *function };
    if pointer.is_null() {
        return;
    }
    match real.index_of(pointer) {
        Some(index) => {
            if let Some(hook) = HOOKS[index] {
                // SAFETY: `function` is the caller's valid out-pointer.
                unsafe { *function = hook as *mut c_void };
            }
        }
        None => {
            let name = if symbol.is_null() {
                "?".into()
            } else {
                // SAFETY: the driver accepted `symbol` as a C string.
                unsafe { CStr::from_ptr(symbol) }.to_string_lossy()
            };
            debug!(
                "cuGetProcAddress({name}) returned {pointer:p}, which is no export: passed through"
            );
        }
    }
}

hook! {
    fn cuGetProcAddress(symbol: *const c_char, function: *mut *mut c_void, cuda_version: i32, flags: u64) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let result = unsafe { real(symbol, function, cuda_version, flags) };
        if result == CUDA_SUCCESS {
            swap_in_hook(symbol, function);
        }
        result
    }
}

hook! {
    fn cuGetProcAddress_v2(symbol: *const c_char, function: *mut *mut c_void, cuda_version: i32, flags: u64, status: *mut i32) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let result = unsafe { real(symbol, function, cuda_version, flags, status) };
        if result == CUDA_SUCCESS {
            swap_in_hook(symbol, function);
        }
        result
    }
}
