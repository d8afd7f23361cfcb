//! NVML (`nvml.h`) facts vgpu-shim needs: handle and return types, return codes, and
//! the layouts of the structs the shims read or fill.

use core::ffi::c_void;

pub type NvmlReturn = u32;
pub type NvmlDevice = *mut c_void;

pub const NVML_SUCCESS: NvmlReturn = 0;
pub const NVML_ERROR_UNINITIALIZED: NvmlReturn = 1;
pub const NVML_ERROR_INVALID_ARGUMENT: NvmlReturn = 2;
pub const NVML_ERROR_NOT_SUPPORTED: NvmlReturn = 3;
pub const NVML_ERROR_NO_PERMISSION: NvmlReturn = 4;
pub const NVML_ERROR_NOT_FOUND: NvmlReturn = 6;
pub const NVML_ERROR_INSUFFICIENT_SIZE: NvmlReturn = 7;
pub const NVML_ERROR_DRIVER_NOT_LOADED: NvmlReturn = 9;
pub const NVML_ERROR_FUNCTION_NOT_FOUND: NvmlReturn = 13;
pub const NVML_ERROR_ARGUMENT_VERSION_MISMATCH: NvmlReturn = 25;
pub const NVML_ERROR_UNKNOWN: NvmlReturn = 999;

/// `nvmlMemory_t`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct Memory {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct MemoryV2 {
    pub version: u32,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2`: the version callers put in `MemoryV2::version`.
pub const MEMORY_V2_VERSION: u32 = core::mem::size_of::<MemoryV2>() as u32 | (2 << 24);

/// `nvmlUtilization_t`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct Utilization {
    pub gpu: u32,
    pub memory: u32,
}

/// `nvmlProcessUtilizationSample_t`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct ProcessUtilizationSample {
    pub pid: u32,
    pub time_stamp: u64,
    pub sm_util: u32,
    pub mem_util: u32,
    pub enc_util: u32,
    pub dec_util: u32,
}

/// `nvmlProcessInfo_v1_t`: the record of the unversioned process-list calls.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct ProcessInfoV1 {
    pub pid: u32,
    pub used_gpu_memory: u64,
}

/// Byte sizes of the process records: `nvmlProcessInfo_v1_t` (pid, usedGpuMemory) and
/// `nvmlProcessInfo_v2_t` = the `_v3` record (adds gpuInstanceId, computeInstanceId).
/// Every layout starts with `u32 pid` at 0 and `u64 usedGpuMemory` at 8.
pub const PROCESS_INFO_V1_BYTES: usize = 16;
pub const PROCESS_INFO_V2_BYTES: usize = 24;
/// `nvmlProcessDetail_v1_t` adds usedGpuCcProtectedMemory.
pub const PROCESS_DETAIL_V1_BYTES: usize = 32;

const _: () = assert!(core::mem::size_of::<ProcessInfoV1>() == PROCESS_INFO_V1_BYTES);
const _: () = assert!(core::mem::size_of::<MemoryV2>() == 40);
const _: () = assert!(core::mem::size_of::<ProcessUtilizationSample>() == 32);

/// `nvmlProcessDetailList_v1_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProcessDetailList {
    pub version: u32,
    pub mode: u32,
    pub num_proc_array_entries: u32,
    pub proc_array: *mut u8,
}
