//! Process lists: only the container's processes, with host PIDs mapped to the
//! container's own (the slot in the usage region records both), so that monitoring
//! inside a PID namespace shows real entries instead of none.
//!
//! Every record layout begins with `u32 pid` and `u64 usedGpuMemory` at offset 8, so one
//! filter serves v1 (16-byte), v2/v3 (24-byte) and detail (32-byte) records.

use crate::hook;
use crate::nvml::*;
use crate::state::view;

/// Runs `real` into a buffer of its own, keeps the container's records (PIDs rewritten)
/// and copies them to the caller with NVML's size protocol.
fn filtered(
    device: NvmlDevice,
    count: *mut u32,
    records: *mut u8,
    stride: usize,
    real: impl Fn(*mut u32, *mut u8) -> NvmlReturn,
) -> NvmlReturn {
    let view = match view() {
        Ok(None) => return real(count, records),
        Err(()) => return NVML_ERROR_INVALID_ARGUMENT,
        Ok(Some(view)) => view,
    };
    if count.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if view.find(device).is_none() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    let mut capacity = 256u32;
    let mut buffer;
    let mut found;
    loop {
        buffer = vec![0u8; capacity as usize * stride];
        found = capacity;
        let result = real(&mut found, buffer.as_mut_ptr());
        match result {
            NVML_SUCCESS => break,
            NVML_ERROR_INSUFFICIENT_SIZE if capacity < 65536 => capacity = found.max(capacity * 2),
            other => return other,
        }
    }
    let processes = view.processes();
    let mut kept: Vec<u8> = Vec::new();
    for record in buffer.chunks_exact(stride).take(found as usize) {
        let host_pid = u32::from_ne_bytes([record[0], record[1], record[2], record[3]]);
        if let Some(pid) = view.container_pid(&processes, host_pid) {
            let start = kept.len();
            kept.extend_from_slice(record);
            kept[start..start + 4].copy_from_slice(&pid.to_ne_bytes());
        }
    }
    let n = (kept.len() / stride) as u32;
    // SAFETY: `count` is the caller's non-null in/out count.
    let room = unsafe { *count };
    // SAFETY: as above.
    unsafe { *count = n };
    if n > room || (n > 0 && records.is_null()) {
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    // SAFETY: the caller's buffer holds `room` >= `n` records of `stride` bytes.
    unsafe { std::ptr::copy_nonoverlapping(kept.as_ptr(), records, kept.len()) };
    NVML_SUCCESS
}

hook! {
    fn nvmlDeviceGetComputeRunningProcesses(device: NvmlDevice, count: *mut u32, records: *mut u8) -> NvmlReturn |real| {
        // SAFETY: forwarding with our own buffer, of the same record layout.
        filtered(device, count, records, PROCESS_INFO_V1_BYTES, |c, r| unsafe { real(device, c, r) })
    }
}

hook! {
    fn nvmlDeviceGetComputeRunningProcesses_v2(device: NvmlDevice, count: *mut u32, records: *mut u8) -> NvmlReturn |real| {
        // SAFETY: forwarding with our own buffer, of the same record layout.
        filtered(device, count, records, PROCESS_INFO_V2_BYTES, |c, r| unsafe { real(device, c, r) })
    }
}

hook! {
    fn nvmlDeviceGetComputeRunningProcesses_v3(device: NvmlDevice, count: *mut u32, records: *mut u8) -> NvmlReturn |real| {
        // SAFETY: forwarding with our own buffer, of the same record layout.
        filtered(device, count, records, PROCESS_INFO_V2_BYTES, |c, r| unsafe { real(device, c, r) })
    }
}

hook! {
    fn nvmlDeviceGetGraphicsRunningProcesses(device: NvmlDevice, count: *mut u32, records: *mut u8) -> NvmlReturn |real| {
        // SAFETY: forwarding with our own buffer, of the same record layout.
        filtered(device, count, records, PROCESS_INFO_V1_BYTES, |c, r| unsafe { real(device, c, r) })
    }
}

hook! {
    fn nvmlDeviceGetGraphicsRunningProcesses_v2(device: NvmlDevice, count: *mut u32, records: *mut u8) -> NvmlReturn |real| {
        // SAFETY: forwarding with our own buffer, of the same record layout.
        filtered(device, count, records, PROCESS_INFO_V2_BYTES, |c, r| unsafe { real(device, c, r) })
    }
}

hook! {
    fn nvmlDeviceGetGraphicsRunningProcesses_v3(device: NvmlDevice, count: *mut u32, records: *mut u8) -> NvmlReturn |real| {
        // SAFETY: forwarding with our own buffer, of the same record layout.
        filtered(device, count, records, PROCESS_INFO_V2_BYTES, |c, r| unsafe { real(device, c, r) })
    }
}

hook! {
    fn nvmlDeviceGetMPSComputeRunningProcesses(device: NvmlDevice, count: *mut u32, records: *mut u8) -> NvmlReturn |real| {
        // SAFETY: forwarding with our own buffer, of the same record layout.
        filtered(device, count, records, PROCESS_INFO_V1_BYTES, |c, r| unsafe { real(device, c, r) })
    }
}

hook! {
    fn nvmlDeviceGetMPSComputeRunningProcesses_v2(device: NvmlDevice, count: *mut u32, records: *mut u8) -> NvmlReturn |real| {
        // SAFETY: forwarding with our own buffer, of the same record layout.
        filtered(device, count, records, PROCESS_INFO_V2_BYTES, |c, r| unsafe { real(device, c, r) })
    }
}

hook! {
    fn nvmlDeviceGetMPSComputeRunningProcesses_v3(device: NvmlDevice, count: *mut u32, records: *mut u8) -> NvmlReturn |real| {
        // SAFETY: forwarding with our own buffer, of the same record layout.
        filtered(device, count, records, PROCESS_INFO_V2_BYTES, |c, r| unsafe { real(device, c, r) })
    }
}

hook! {
    fn nvmlDeviceGetRunningProcessDetailList(device: NvmlDevice, list: *mut ProcessDetailList) -> NvmlReturn |real| {
        if list.is_null() {
            // SAFETY: forwarding; the real call reports the bad argument.
            return unsafe { real(device, list) };
        }
        // SAFETY: non-null list from the caller.
        let caller = unsafe { &mut *list };
        let (version, mode) = (caller.version, caller.mode);
        filtered(device, &mut caller.num_proc_array_entries, caller.proc_array, PROCESS_DETAIL_V1_BYTES, |count, records| {
            // SAFETY: the count is in/out, so pass it through a scratch copy of the list.
            let mut scratch = ProcessDetailList { version, mode, num_proc_array_entries: unsafe { *count }, proc_array: records };
            let result = unsafe { real(device, &mut scratch) };
            unsafe { *count = scratch.num_proc_array_entries };
            result
        })
    }
}
