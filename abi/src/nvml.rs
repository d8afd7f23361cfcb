//! NVML (`nvml.h`) facts vgpu-shim needs: handle and return types, return codes, and
//! the layouts of the structs the shims read or fill.

use core::ffi::c_void;

/// `nvmlReturn_t`: what every NVML call returns (`NVML_SUCCESS` or an error).
pub type NvmlReturn = u32;
/// `nvmlDevice_t`: an opaque device handle (a pointer into NVML's own table).
pub type NvmlDevice = *mut c_void;

/// The call succeeded.
pub const NVML_SUCCESS: NvmlReturn = 0;
/// `nvmlInit` has not run.
pub const NVML_ERROR_UNINITIALIZED: NvmlReturn = 1;
/// An argument is invalid (a handle the caller may not use, say).
pub const NVML_ERROR_INVALID_ARGUMENT: NvmlReturn = 2;
/// The device does not support the query.
pub const NVML_ERROR_NOT_SUPPORTED: NvmlReturn = 3;
/// The caller may not do this.
pub const NVML_ERROR_NO_PERMISSION: NvmlReturn = 4;
/// No such device (or entry).
pub const NVML_ERROR_NOT_FOUND: NvmlReturn = 6;
/// The caller's buffer is too small; the count says how many are needed.
pub const NVML_ERROR_INSUFFICIENT_SIZE: NvmlReturn = 7;
/// The driver (the real NVML) is not loaded.
pub const NVML_ERROR_DRIVER_NOT_LOADED: NvmlReturn = 9;
/// The real NVML lacks this export.
pub const NVML_ERROR_FUNCTION_NOT_FOUND: NvmlReturn = 13;
/// A versioned struct carries a version this NVML does not know.
pub const NVML_ERROR_ARGUMENT_VERSION_MISMATCH: NvmlReturn = 25;
/// An unknown internal error (what a hook answers for a caught panic).
pub const NVML_ERROR_UNKNOWN: NvmlReturn = 999;

/// `nvmlMemory_t`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct Memory {
    /// Total memory in bytes.
    pub total: u64,
    /// Free memory in bytes.
    pub free: u64,
    /// Used memory in bytes.
    pub used: u64,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct MemoryV2 {
    /// The struct version the caller passes.
    pub version: u32,
    /// Total memory in bytes.
    pub total: u64,
    /// Reserved by the header.
    pub reserved: u64,
    /// Free memory in bytes.
    pub free: u64,
    /// Used memory in bytes.
    pub used: u64,
}

/// `nvmlMemory_v2`: the version callers put in `MemoryV2::version`.
pub const MEMORY_V2_VERSION: u32 = core::mem::size_of::<MemoryV2>() as u32 | (2 << 24);

/// `nvmlUtilization_t`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct Utilization {
    /// Percent of the sample period a kernel ran.
    pub gpu: u32,
    /// Percent of the sample period device memory was read or written.
    pub memory: u32,
}

/// `nvmlProcessUtilizationSample_t`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct ProcessUtilizationSample {
    /// The process (in the caller's PID namespace on driver 580, the host's on older drivers).
    pub pid: u32,
    /// When the sample was taken, in microseconds since the epoch.
    pub time_stamp: u64,
    /// SM utilization, percent.
    pub sm_util: u32,
    /// Memory utilization, percent.
    pub mem_util: u32,
    /// Encoder utilization, percent.
    pub enc_util: u32,
    /// Decoder utilization, percent.
    pub dec_util: u32,
}

/// `nvmlProcessInfo_v1_t`: the record of the unversioned process-list calls.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct ProcessInfoV1 {
    /// The process (in the caller's PID namespace on driver 580, the host's on older drivers).
    pub pid: u32,
    /// `usedGpuMemory`: device memory the process holds, in bytes.
    pub used_gpu_memory: u64,
}

/// Byte sizes of the process records: `nvmlProcessInfo_v1_t` (pid, usedGpuMemory) and
/// `nvmlProcessInfo_v2_t` = the `_v3` record (adds gpuInstanceId, computeInstanceId).
/// Every layout starts with `u32 pid` at 0 and `u64 usedGpuMemory` at 8.
pub const PROCESS_INFO_V1_BYTES: usize = 16;
/// `nvmlProcessInfo_v2_t` (and `_v3`): 24 bytes.
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
    /// The struct version the caller passes.
    pub version: u32,
    /// `mode`: 0 compute, 1 graphics, 2 MPS compute.
    pub mode: u32,
    /// `numProcArrayEntries`: records in `procArray` (in), records found (out).
    pub num_proc_array_entries: u32,
    /// `procArray`: the caller's records.
    pub proc_array: *mut u8,
}
