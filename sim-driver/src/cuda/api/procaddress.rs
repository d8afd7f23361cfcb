//! `cuGetProcAddress(_v2)` over the version rules of `cuda::procaddr`, and
//! `cuGetExportTable` (as in the shim's `hooks/procaddress.rs`).

use std::ffi::{c_char, c_void};

use super::support::{Res, cuda, out};
use crate::cuda::errors::*;
use crate::ffi::{c_str, write_out};

/// `CUdriverProcAddressQueryResult`.
pub const CU_GET_PROC_ADDRESS_SUCCESS: i32 = 0;
pub const CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND: i32 = 1;
pub const CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT: i32 = 2;

/// The lookup behind both entry points. `cuGetProcAddress_v2` (given `status`) answers a
/// miss with CUDA_SUCCESS, a NULL function and the reason in `status`, as the 580 driver
/// does (measured); the original entry point answers CUDA_ERROR_NOT_FOUND.
fn get_proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: i32,
    flags: u64,
    status: *mut i32,
) -> Res {
    let miss = if status.is_null() {
        Err(CUDA_ERROR_NOT_FOUND)
    } else {
        Ok(())
    };
    let set_status = |value: i32| {
        if !status.is_null() {
            let _ = write_out(status, value);
        }
    };
    let name = c_str(symbol);
    if pfn.is_null() || name.is_none() || flags > 2 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let _ = write_out(pfn, std::ptr::null_mut());
    match crate::cuda::procaddr::resolve(name.as_deref().unwrap_or_default(), version, flags) {
        crate::cuda::procaddr::Lookup::Found(address) => {
            set_status(CU_GET_PROC_ADDRESS_SUCCESS);
            out(pfn, address as *mut c_void)
        }
        crate::cuda::procaddr::Lookup::VersionTooLow => {
            set_status(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
            miss
        }
        crate::cuda::procaddr::Lookup::NotFound => {
            set_status(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
            miss
        }
    }
}

cuda! {
    /// The private tables the real libcudart asks for are not simulated: runtime-API
    /// programs (cudaMalloc, <<<>>>) need a real GPU. Driver-API programs work.
    fn cuGetExportTable(table: *mut *const c_void, export_id: *const c_void) {
        let _ = export_id;
        let _ = write_out(table, std::ptr::null());
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }

    fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, version: i32, flags: u64) {
        get_proc_address(symbol, pfn, version, flags, std::ptr::null_mut())
    }

    fn cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, version: i32, flags: u64, status: *mut i32) {
        get_proc_address(symbol, pfn, version, flags, status)
    }
}
