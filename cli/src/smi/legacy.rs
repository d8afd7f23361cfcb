//! Fallbacks to the first versions of two NVML calls, for libraries (old drivers,
//! minimal simulated drivers) that lack the versions `nvml-wrapper` calls:
//! `nvmlDeviceGetMemoryInfo` (v1) and `nvmlDeviceGetComputeRunningProcesses` (v1).
//!
//! This is the only module of `vgpu smi` that calls NVML through raw symbols.

use std::ffi::{OsStr, c_int, c_uint, c_ulonglong, c_void};

use nvml_wrapper::Device;

use super::snapshot::{MemoryUsage, RawProcess};

const NVML_SUCCESS: c_int = 0;
const NVML_ERROR_INSUFFICIENT_SIZE: c_int = 7;
const NVML_VALUE_NOT_AVAILABLE: c_ulonglong = c_ulonglong::MAX;

/// `nvmlMemory_t` of nvml.h.
#[repr(C)]
#[derive(Default)]
struct MemoryV1 {
    total: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

/// `nvmlProcessInfo_v1_t` of nvml.h.
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct ProcessInfoV1 {
    pid: c_uint,
    used_gpu_memory: c_ulonglong,
}

type GetMemoryInfoV1 = unsafe extern "C" fn(*mut c_void, *mut MemoryV1) -> c_int;
type GetComputeProcessesV1 =
    unsafe extern "C" fn(*mut c_void, *mut c_uint, *mut ProcessInfoV1) -> c_int;

fn open(library: &OsStr) -> Option<libloading::Library> {
    // SAFETY: `library` is the NVML library this process already loaded and
    // initialized through nvml-wrapper; opening it again only takes another
    // reference to the loaded object and runs no new initializers.
    unsafe { libloading::Library::new(library) }.ok()
}

/// Memory info through `nvmlDeviceGetMemoryInfo`, or `None` if that fails too.
pub(super) fn memory_info_v1(library: &OsStr, device: &Device<'_>) -> Option<MemoryUsage> {
    let lib = open(library)?;
    let mut memory = MemoryV1::default();
    // SAFETY: the symbol has nvml.h's signature `nvmlReturn_t (nvmlDevice_t, nvmlMemory_t*)`,
    // which `GetMemoryInfoV1` spells out; the device handle comes from the same library and
    // `memory` is a live, writable `nvmlMemory_t`.
    let status = unsafe {
        let function = lib
            .get::<GetMemoryInfoV1>(b"nvmlDeviceGetMemoryInfo\0")
            .ok()?;
        function(device.handle().cast::<c_void>(), &mut memory)
    };
    (status == NVML_SUCCESS).then_some(MemoryUsage {
        total_bytes: memory.total,
        used_bytes: memory.used,
        free_bytes: memory.free,
    })
}

/// Compute processes through `nvmlDeviceGetComputeRunningProcesses`; empty if that fails.
pub(super) fn compute_processes_v1(library: &OsStr, device: &Device<'_>) -> Vec<RawProcess> {
    let Some(lib) = open(library) else {
        return Vec::new();
    };
    let mut capacity: c_uint = 64;
    for _attempt in 0..3 {
        let mut buffer = vec![ProcessInfoV1::default(); capacity as usize];
        let mut count = capacity;
        // SAFETY: the symbol has nvml.h's signature `nvmlReturn_t (nvmlDevice_t,
        // unsigned int*, nvmlProcessInfo_v1_t*)`; `count` holds the length of `buffer`,
        // so NVML writes at most `count` entries into it.
        let status = unsafe {
            let Ok(function) =
                lib.get::<GetComputeProcessesV1>(b"nvmlDeviceGetComputeRunningProcesses\0")
            else {
                return Vec::new();
            };
            function(
                device.handle().cast::<c_void>(),
                &mut count,
                buffer.as_mut_ptr(),
            )
        };
        match status {
            NVML_SUCCESS => {
                buffer.truncate((count as usize).min(buffer.len()));
                return buffer
                    .into_iter()
                    .map(|info| RawProcess {
                        pid: info.pid,
                        used_memory_bytes: (info.used_gpu_memory != NVML_VALUE_NOT_AVAILABLE)
                            .then_some(info.used_gpu_memory),
                        gpu_instance_id: None,
                        compute_instance_id: None,
                    })
                    .collect();
            }
            NVML_ERROR_INSUFFICIENT_SIZE => capacity = count.max(capacity).saturating_add(16),
            _ => return Vec::new(),
        }
    }
    Vec::new()
}
