//! The NVML types and return codes the hooks need, from the public `nvml.h` ABI.

#![allow(dead_code)]

use std::ffi::c_void;

pub type NvmlReturn = u32;
pub type NvmlDevice = *mut c_void;

pub const NVML_SUCCESS: NvmlReturn = 0;
pub const NVML_ERROR_UNINITIALIZED: NvmlReturn = 1;
pub const NVML_ERROR_INVALID_ARGUMENT: NvmlReturn = 2;
pub const NVML_ERROR_NOT_SUPPORTED: NvmlReturn = 3;
pub const NVML_ERROR_NOT_FOUND: NvmlReturn = 6;
pub const NVML_ERROR_INSUFFICIENT_SIZE: NvmlReturn = 7;
pub const NVML_ERROR_DRIVER_NOT_LOADED: NvmlReturn = 9;
pub const NVML_ERROR_FUNCTION_NOT_FOUND: NvmlReturn = 13;
pub const NVML_ERROR_ARGUMENT_VERSION_MISMATCH: NvmlReturn = 25;
pub const NVML_ERROR_UNKNOWN: NvmlReturn = 999;

/// `nvmlMemory_t`.
#[repr(C)]
pub struct Memory {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
pub struct MemoryV2 {
    pub version: u32,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2`: the version callers put in `MemoryV2::version`.
pub const MEMORY_V2_VERSION: u32 = std::mem::size_of::<MemoryV2>() as u32 | (2 << 24);

/// `nvmlUtilization_t`.
#[repr(C)]
pub struct Utilization {
    pub gpu: u32,
    pub memory: u32,
}

/// `nvmlProcessUtilizationSample_t`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ProcessUtilizationSample {
    pub pid: u32,
    pub time_stamp: u64,
    pub sm_util: u32,
    pub mem_util: u32,
    pub enc_util: u32,
    pub dec_util: u32,
}

/// Byte sizes of the process records: `nvmlProcessInfo_v1_t` (pid, usedGpuMemory) and
/// `nvmlProcessInfo_v2_t` = the `_v3` record (adds gpuInstanceId, computeInstanceId).
/// Every layout starts with `u32 pid` at 0 and `u64 usedGpuMemory` at 8.
pub const PROCESS_INFO_V1_BYTES: usize = 16;
pub const PROCESS_INFO_V2_BYTES: usize = 24;
/// `nvmlProcessDetail_v1_t` adds usedGpuCcProtectedMemory.
pub const PROCESS_DETAIL_V1_BYTES: usize = 32;

/// `nvmlProcessDetailList_v1_t`.
#[repr(C)]
pub struct ProcessDetailList {
    pub version: u32,
    pub mode: u32,
    pub num_proc_array_entries: u32,
    pub proc_array: *mut u8,
}
