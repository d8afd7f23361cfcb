//! cuGetProcAddress and cuGetProcAddress_v2, through which the CUDA 11.3+ runtimes fetch
//! almost every driver function. The real lookup runs first (so every version rule and
//! per-thread-stream flag is the driver's own); the pointer it returns is mapped back to
//! the export whose address it is, and if the shim hooks that export, the hook is handed
//! out instead. No version table is needed, and nothing hooked can be bypassed.

use std::ffi::{c_char, c_void};

use crate::cuda::*;
use crate::exports::HOOKS;
use crate::ffi::{c_string, read_out, write_out};
use crate::state::{Policy, shim};
use crate::{debug, hook};

/// Replaces `*function` with the hook of the export it points to, if there is one.
fn swap_in_hook(symbol: *const c_char, function: *mut *mut c_void) {
    let shim = shim();
    if matches!(shim.policy, Policy::Passthrough) {
        return;
    }
    let Some(library) = &shim.library else { return };
    let Some(pointer) = read_out(function).filter(|pointer| !pointer.is_null()) else {
        return;
    };
    match library.index_of(pointer) {
        Some(index) => {
            if let Some(hook) = HOOKS[index] {
                write_out(function, hook as *mut c_void);
            }
        }
        None => {
            let name = c_string(symbol);
            debug!(
                "cuGetProcAddress({name}) returned {pointer:p}, which is no export: passed through"
            );
        }
    }
}

hook! {
    fn cuGetProcAddress(symbol: *const c_char, function: *mut *mut c_void, cuda_version: i32, flags: u64) -> CUresult |forward| {
        let result = forward();
        if result == CUDA_SUCCESS {
            swap_in_hook(symbol, function);
        }
        result
    }
}

hook! {
    fn cuGetProcAddress_v2(symbol: *const c_char, function: *mut *mut c_void, cuda_version: i32, flags: u64, status: *mut i32) -> CUresult |forward| {
        let result = forward();
        if result == CUDA_SUCCESS {
            swap_in_hook(symbol, function);
        }
        result
    }
}
