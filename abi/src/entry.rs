//! The C types of the driver entry points the workspace calls through a looked-up
//! pointer (`vgpu probe`, through `dlsym` or `cuGetProcAddress_v2`), each beside its
//! export name, as `cuda.h` and `nvml.h` declare them. A caller names the entry point
//! (`CuMemAllocV2`) and gets its name and its type together, so the two cannot drift
//! apart at a call site.

use core::ffi::{CStr, c_char, c_int, c_uint, c_void};

use crate::cuda::{CUcontext, CUdevice, CUdeviceptr, CUresult};
use crate::nvml::{Memory, NvmlDevice, NvmlReturn};

/// A driver entry point: its export name and the C type of the function.
pub trait EntryPoint {
    /// The export name, as `dlsym` and `cuGetProcAddress` take it.
    const NAME: &'static CStr;
    /// The function's C type.
    type Function: Copy;
}

macro_rules! entry_points {
    ($($(#[$doc:meta])* $entry:ident = $name:literal: fn($($arg:ty),*) -> $ret:ty;)*) => {
        $(
            $(#[$doc])*
            pub enum $entry {}
            impl EntryPoint for $entry {
                const NAME: &'static CStr = $name;
                type Function = unsafe extern "C" fn($($arg),*) -> $ret;
            }
        )*
    };
}

entry_points! {
    /// `CUresult cuInit(unsigned int Flags)`.
    CuInit = c"cuInit": fn(c_uint) -> CUresult;
    /// `CUresult cuDriverGetVersion(int *driverVersion)`.
    CuDriverGetVersion = c"cuDriverGetVersion": fn(*mut c_int) -> CUresult;
    /// `CUresult cuDeviceGetCount(int *count)`.
    CuDeviceGetCount = c"cuDeviceGetCount": fn(*mut c_int) -> CUresult;
    /// `CUresult cuDeviceGet(CUdevice *device, int ordinal)`.
    CuDeviceGet = c"cuDeviceGet": fn(*mut CUdevice, c_int) -> CUresult;
    /// `CUresult cuDeviceGetName(char *name, int len, CUdevice dev)`.
    CuDeviceGetName = c"cuDeviceGetName": fn(*mut c_char, c_int, CUdevice) -> CUresult;
    /// `CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)`.
    CuDeviceTotalMemV2 = c"cuDeviceTotalMem_v2": fn(*mut usize, CUdevice) -> CUresult;
    /// `CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)`.
    CuDevicePrimaryCtxRetain = c"cuDevicePrimaryCtxRetain": fn(*mut CUcontext, CUdevice) -> CUresult;
    /// `CUresult cuCtxSetCurrent(CUcontext ctx)`.
    CuCtxSetCurrent = c"cuCtxSetCurrent": fn(CUcontext) -> CUresult;
    /// `CUresult cuMemGetInfo_v2(size_t *free, size_t *total)`.
    CuMemGetInfoV2 = c"cuMemGetInfo_v2": fn(*mut usize, *mut usize) -> CUresult;
    /// `CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)`.
    CuMemAllocV2 = c"cuMemAlloc_v2": fn(*mut CUdeviceptr, usize) -> CUresult;
    /// `CUresult cuMemFree_v2(CUdeviceptr dptr)`.
    CuMemFreeV2 = c"cuMemFree_v2": fn(CUdeviceptr) -> CUresult;
    /// `CUresult cuGetErrorName(CUresult error, const char **pStr)`.
    CuGetErrorName = c"cuGetErrorName": fn(CUresult, *mut *const c_char) -> CUresult;
    /// `CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
    /// cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus)`.
    CuGetProcAddressV2 = c"cuGetProcAddress_v2": fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> CUresult;
    /// `nvmlReturn_t nvmlInit_v2(void)`.
    NvmlInitV2 = c"nvmlInit_v2": fn() -> NvmlReturn;
    /// `nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)`.
    NvmlDeviceGetCountV2 = c"nvmlDeviceGetCount_v2": fn(*mut c_uint) -> NvmlReturn;
    /// `nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)`.
    NvmlDeviceGetHandleByIndexV2 = c"nvmlDeviceGetHandleByIndex_v2": fn(c_uint, *mut NvmlDevice) -> NvmlReturn;
    /// `nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)`.
    NvmlDeviceGetMemoryInfo = c"nvmlDeviceGetMemoryInfo": fn(NvmlDevice, *mut Memory) -> NvmlReturn;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_export_names_the_symbol_lists_hold() {
        // The versioned names a CUDA 12+ program links, not the macros' bare names.
        assert_eq!(CuMemAllocV2::NAME, c"cuMemAlloc_v2");
        assert_eq!(CuGetProcAddressV2::NAME, c"cuGetProcAddress_v2");
        assert_eq!(NvmlInitV2::NAME, c"nvmlInit_v2");
        assert_eq!(
            core::mem::size_of::<<CuMemAllocV2 as EntryPoint>::Function>(),
            core::mem::size_of::<*const c_void>()
        );
    }
}
