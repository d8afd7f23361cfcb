//! nvmlErrorString, the one NVML export that returns a pointer: it must never fall
//! through to an integer-returning stub, so it answers itself when the real NVML is
//! missing or lacks it.

use std::ffi::{CStr, c_char};

use crate::nvml::*;
use crate::real;
use crate::state::shim;

fn own_string(result: NvmlReturn) -> &'static CStr {
    match result {
        NVML_SUCCESS => c"Success",
        NVML_ERROR_UNINITIALIZED => c"Uninitialized",
        NVML_ERROR_INVALID_ARGUMENT => c"Invalid Argument",
        NVML_ERROR_NOT_SUPPORTED => c"Not Supported",
        NVML_ERROR_NOT_FOUND => c"Not Found",
        NVML_ERROR_INSUFFICIENT_SIZE => c"Insufficient Size",
        NVML_ERROR_DRIVER_NOT_LOADED => c"Driver Not Loaded",
        NVML_ERROR_FUNCTION_NOT_FOUND => c"Function Not Found",
        NVML_ERROR_ARGUMENT_VERSION_MISMATCH => c"Argument version mismatch",
        _ => c"Unknown Error",
    }
}

/// Written without `hook!`: its panic value is a string, not an error code.
#[unsafe(no_mangle)]
#[allow(non_snake_case, clippy::missing_safety_doc)]
pub unsafe extern "C" fn nvmlErrorString(result: NvmlReturn) -> *const c_char {
    vgpu_shimgen::runtime::guard(own_string(NVML_ERROR_UNKNOWN).as_ptr(), || {
        let shim = shim();
        let real_has_it = shim
            .library
            .as_ref()
            .is_some_and(|library| !library.missing.contains(&c"nvmlErrorString"));
        if !real_has_it {
            return own_string(result).as_ptr();
        }
        let real = real!(nvmlErrorString as fn(NvmlReturn) -> *const c_char);
        // SAFETY: forwarding to the real nvmlErrorString.
        unsafe { real(result) }
    })
}
