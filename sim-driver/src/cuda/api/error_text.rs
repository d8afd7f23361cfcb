//! `cuGetErrorName` and `cuGetErrorString` over the error table of `cuda::errors` (the
//! shim does not hook them).

use std::collections::HashMap;
use std::ffi::c_char;
use std::sync::OnceLock;

use super::support::{cuda, out};
use crate::cuda::errors::*;
use crate::ffi::write_out;

/// The `CUresult` names and strings as NUL-terminated statics.
fn error_strings() -> &'static HashMap<CUresult, (std::ffi::CString, std::ffi::CString)> {
    static TABLE: OnceLock<HashMap<CUresult, (std::ffi::CString, std::ffi::CString)>> =
        OnceLock::new();
    TABLE.get_or_init(|| {
        ERRORS
            .iter()
            .filter_map(|(code, name, text)| {
                Some((
                    *code,
                    (
                        std::ffi::CString::new(*name).ok()?,
                        std::ffi::CString::new(*text).ok()?,
                    ),
                ))
            })
            .collect()
    })
}

cuda! {
    fn cuGetErrorName(error: CUresult, name: *mut *const c_char) {
        match error_strings().get(&error) {
            Some((text, _)) => out(name, text.as_ptr()),
            None => {
                let _ = write_out(name, std::ptr::null());
                Err(CUDA_ERROR_INVALID_VALUE)
            }
        }
    }

    fn cuGetErrorString(error: CUresult, text: *mut *const c_char) {
        match error_strings().get(&error) {
            Some((_, string)) => out(text, string.as_ptr()),
            None => {
                let _ = write_out(text, std::ptr::null());
                Err(CUDA_ERROR_INVALID_VALUE)
            }
        }
    }
}
