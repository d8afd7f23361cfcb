//! Slot targets for when there is nothing real to call. Every CUDA driver export
//! returns a `CUresult` in `eax`; these ignore their arguments, so one stub serves every
//! signature.

use crate::cuda::{CUDA_ERROR_NOT_INITIALIZED, CUDA_ERROR_NOT_SUPPORTED, CUresult};

/// Before the real driver is loaded, or when it could not be.
pub extern "C" fn driver_not_loaded() -> CUresult {
    CUDA_ERROR_NOT_INITIALIZED
}

/// The real driver lacks this export (an older driver than the shim knows).
pub extern "C" fn missing_in_driver() -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}
