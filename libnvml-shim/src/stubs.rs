//! Slot targets for when there is nothing real to call. NVML exports return an
//! `nvmlReturn_t` in `eax` (the one exception, nvmlErrorString, is hooked).

use crate::nvml::{NVML_ERROR_DRIVER_NOT_LOADED, NVML_ERROR_FUNCTION_NOT_FOUND, NvmlReturn};

/// The real NVML could not be loaded.
pub extern "C" fn driver_not_loaded() -> NvmlReturn {
    NVML_ERROR_DRIVER_NOT_LOADED
}

/// The real NVML lacks this export.
pub extern "C" fn missing_in_driver() -> NvmlReturn {
    NVML_ERROR_FUNCTION_NOT_FOUND
}
