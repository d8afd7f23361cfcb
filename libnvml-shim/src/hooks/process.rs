//! Process lists: only the container's processes, with host PIDs mapped to the
//! container's own (the slot in the usage region records both), so that monitoring
//! inside a PID namespace shows real entries instead of none.
//!
//! Every record layout begins with `u32 pid` and `u64 usedGpuMemory` at offset 8, so one
//! filter serves v1 (16-byte), v2/v3 (24-byte) and detail (32-byte) records.

use crate::ffi::{read_descriptor, read_out, write_out, write_records};
use crate::hook;
use crate::nvml::*;
use crate::state::{View, virtualize};

/// The records of `device` that belong to the container, PIDs rewritten: `list` is
/// the real call into a buffer of our own (count in and out, records), retried with
/// more room while NVML says it needs it.
fn container_list(
    view: &View,
    stride: usize,
    mut list: impl FnMut(&mut u32, *mut u8) -> NvmlReturn,
) -> Result<Vec<u8>, NvmlReturn> {
    let mut capacity = 256u32;
    loop {
        let mut buffer = vec![0u8; capacity as usize * stride];
        let mut found = capacity;
        match list(&mut found, buffer.as_mut_ptr()) {
            NVML_SUCCESS => {
                let processes = view.processes();
                return Ok(container_records(&buffer, stride, found as usize, |pid| {
                    view.container_pid(&processes, pid)
                }));
            }
            NVML_ERROR_INSUFFICIENT_SIZE if capacity < 65536 => capacity = found.max(capacity * 2),
            other => return Err(other),
        }
    }
}

/// The first `found` records of `stride` bytes in `buffer` whose PID `container_pid`
/// maps, with the PID rewritten to the container's; every other byte kept.
fn container_records(
    buffer: &[u8],
    stride: usize,
    found: usize,
    container_pid: impl Fn(u32) -> Option<u32>,
) -> Vec<u8> {
    let mut kept = Vec::new();
    for record in buffer.chunks_exact(stride).take(found) {
        let nvml_pid = u32::from_ne_bytes([record[0], record[1], record[2], record[3]]);
        if let Some(pid) = container_pid(nvml_pid) {
            let start = kept.len();
            kept.extend_from_slice(record);
            kept[start..start + 4].copy_from_slice(&pid.to_ne_bytes());
        }
    }
    kept
}

/// NVML's size protocol: the count to report is how many records there are; they are
/// copied when the caller's buffer (`room` records) takes them all, else
/// NVML_ERROR_INSUFFICIENT_SIZE.
fn hand_over(kept: &[u8], stride: usize, room: u32, records: *mut u8) -> (NvmlReturn, u32) {
    let count = (kept.len() / stride) as u32;
    if count > room || !write_records(records, room as usize * stride, kept) {
        return (NVML_ERROR_INSUFFICIENT_SIZE, count);
    }
    (NVML_SUCCESS, count)
}

/// The real function of a process-list export (device, count in/out, records).
type ProcessList = unsafe extern "C" fn(NvmlDevice, *mut u32, *mut u8) -> NvmlReturn;

/// A process-list call: the caller's `count` (in/out) and `records` of `stride` bytes;
/// `real` is the hook's own real function, whose records have that stride.
fn filtered(
    device: NvmlDevice,
    count: *mut u32,
    records: *mut u8,
    stride: usize,
    forward: impl FnOnce() -> NvmlReturn,
    real: ProcessList,
) -> NvmlReturn {
    virtualize(forward, |view| {
        if count.is_null() || view.find(device).is_none() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: our own count and buffer (of `stride`-byte records, the layout of
        // `real`'s export), to that real function.
        let list = |found: &mut u32, buffer: *mut u8| unsafe { real(device, found, buffer) };
        let kept = match container_list(view, stride, list) {
            Ok(kept) => kept,
            Err(error) => return error,
        };
        let room = read_out(count).unwrap_or(0);
        let (result, found) = hand_over(&kept, stride, room, records);
        write_out(count, found);
        result
    })
}

hook! {
    fn nvmlDeviceGetComputeRunningProcesses(device: NvmlDevice, count: *mut u32, records: *mut u8) -> NvmlReturn |forward, real| {
        filtered(device, count, records, PROCESS_INFO_V1_BYTES, forward, real)
    }
}

hook! {
    fn nvmlDeviceGetComputeRunningProcesses_v2(device: NvmlDevice, count: *mut u32, records: *mut u8) -> NvmlReturn |forward, real| {
        filtered(device, count, records, PROCESS_INFO_V2_BYTES, forward, real)
    }
}

hook! {
    fn nvmlDeviceGetComputeRunningProcesses_v3(device: NvmlDevice, count: *mut u32, records: *mut u8) -> NvmlReturn |forward, real| {
        filtered(device, count, records, PROCESS_INFO_V2_BYTES, forward, real)
    }
}

hook! {
    fn nvmlDeviceGetGraphicsRunningProcesses(device: NvmlDevice, count: *mut u32, records: *mut u8) -> NvmlReturn |forward, real| {
        filtered(device, count, records, PROCESS_INFO_V1_BYTES, forward, real)
    }
}

hook! {
    fn nvmlDeviceGetGraphicsRunningProcesses_v2(device: NvmlDevice, count: *mut u32, records: *mut u8) -> NvmlReturn |forward, real| {
        filtered(device, count, records, PROCESS_INFO_V2_BYTES, forward, real)
    }
}

hook! {
    fn nvmlDeviceGetGraphicsRunningProcesses_v3(device: NvmlDevice, count: *mut u32, records: *mut u8) -> NvmlReturn |forward, real| {
        filtered(device, count, records, PROCESS_INFO_V2_BYTES, forward, real)
    }
}

hook! {
    fn nvmlDeviceGetMPSComputeRunningProcesses(device: NvmlDevice, count: *mut u32, records: *mut u8) -> NvmlReturn |forward, real| {
        filtered(device, count, records, PROCESS_INFO_V1_BYTES, forward, real)
    }
}

hook! {
    fn nvmlDeviceGetMPSComputeRunningProcesses_v2(device: NvmlDevice, count: *mut u32, records: *mut u8) -> NvmlReturn |forward, real| {
        filtered(device, count, records, PROCESS_INFO_V2_BYTES, forward, real)
    }
}

hook! {
    fn nvmlDeviceGetMPSComputeRunningProcesses_v3(device: NvmlDevice, count: *mut u32, records: *mut u8) -> NvmlReturn |forward, real| {
        filtered(device, count, records, PROCESS_INFO_V2_BYTES, forward, real)
    }
}

hook! {
    fn nvmlDeviceGetRunningProcessDetailList(device: NvmlDevice, list: *mut ProcessDetailList) -> NvmlReturn |forward, real| {
        // Null: the real call reports the bad argument.
        let Some(caller) = read_descriptor(list) else { return forward() };
        virtualize(forward, |view| {
            if view.find(device).is_none() {
                return NVML_ERROR_INVALID_ARGUMENT;
            }
            let kept = container_list(view, PROCESS_DETAIL_V1_BYTES, |count, records| {
                // The count is in/out, so it goes through a scratch copy of the list.
                let mut scratch = ProcessDetailList { num_proc_array_entries: *count, proc_array: records, ..caller };
                // SAFETY: our own scratch list (the caller's version and mode, our own
                // buffer of `count` records), to the real function of this export.
                let result = unsafe { real(device, &mut scratch) };
                *count = scratch.num_proc_array_entries;
                result
            });
            let kept = match kept {
                Ok(kept) => kept,
                Err(error) => return error,
            };
            let (result, found) = hand_over(&kept, PROCESS_DETAIL_V1_BYTES, caller.num_proc_array_entries, caller.proc_array);
            write_out(list, ProcessDetailList { num_proc_array_entries: found, ..caller });
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A v2 record (24 bytes): pid, 4 bytes of padding, used memory, then an 8-byte tail.
    fn record(pid: u32, used: u64, tail: u64) -> Vec<u8> {
        let mut bytes = pid.to_ne_bytes().to_vec();
        bytes.extend_from_slice(&[0; 4]);
        bytes.extend_from_slice(&used.to_ne_bytes());
        bytes.extend_from_slice(&tail.to_ne_bytes());
        bytes
    }

    /// The container's processes are host PIDs 31007 (its PID 7) and 31009 (its 9).
    fn ours(pid: u32) -> Option<u32> {
        match pid {
            31007 => Some(7),
            31009 => Some(9),
            _ => None,
        }
    }

    #[test]
    fn only_the_containers_records_are_kept_with_its_own_pids() {
        let mut buffer = [record(500, 1, 2), record(31009, 3, 4), record(31007, 5, 6)].concat();
        // Room NVML did not fill: a stale record past `found` must not count.
        buffer.extend(record(31007, 99, 99));
        let kept = container_records(&buffer, PROCESS_INFO_V2_BYTES, 3, ours);
        assert_eq!(kept, [record(9, 3, 4), record(7, 5, 6)].concat());
        assert!(container_records(&buffer, PROCESS_INFO_V2_BYTES, 0, ours).is_empty());
    }

    #[test]
    fn the_size_protocol_reports_the_count_and_copies_only_what_fits() {
        let kept = [record(9, 3, 4), record(7, 5, 6)].concat();
        let stride = PROCESS_INFO_V2_BYTES;
        let mut room = vec![0u8; 2 * stride];
        assert_eq!(
            hand_over(&kept, stride, 2, room.as_mut_ptr()),
            (NVML_SUCCESS, 2)
        );
        assert_eq!(room, kept);
        let mut small = vec![0u8; stride];
        assert_eq!(
            hand_over(&kept, stride, 1, small.as_mut_ptr()),
            (NVML_ERROR_INSUFFICIENT_SIZE, 2)
        );
        assert_eq!(
            small,
            vec![0; stride],
            "nothing copied into too small a buffer"
        );
        assert_eq!(
            hand_over(&kept, stride, 5, std::ptr::null_mut()),
            (NVML_ERROR_INSUFFICIENT_SIZE, 2),
            "a null buffer asks for the size"
        );
        assert_eq!(
            hand_over(&[], stride, 0, std::ptr::null_mut()),
            (NVML_SUCCESS, 0)
        );
    }
}
