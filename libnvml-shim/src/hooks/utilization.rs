//! Utilization as the container sees it: the SM use of its own processes, from NVML's
//! per-process samples over the last second, scaled by `utilization_scale`: `limit`
//! (default) reads 100% when the container uses all of its core limit, `card` reads the
//! percent of the whole card.

use std::time::{SystemTime, UNIX_EPOCH};

use vgpu_common::UtilizationScale;

use crate::hook;
use crate::nvml::*;
use crate::real;
use crate::state::{View, VisibleGpu, view};

/// Samples of the last second, filtered to the container; PIDs rewritten to the
/// container's.
fn container_samples(
    view: &View,
    device: NvmlDevice,
) -> Result<Vec<ProcessUtilizationSample>, NvmlReturn> {
    let process_utilization = real!(
        nvmlDeviceGetProcessUtilization
            as fn(NvmlDevice, *mut ProcessUtilizationSample, *mut u32, u64) -> NvmlReturn
    );
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
        .saturating_sub(1_000_000);
    let mut count = 0u32;
    // SAFETY: a null buffer with count 0 asks for the size.
    let result = unsafe { process_utilization(device, std::ptr::null_mut(), &mut count, since) };
    if result != NVML_SUCCESS && result != NVML_ERROR_INSUFFICIENT_SIZE {
        return Err(result);
    }
    let mut samples = vec![ProcessUtilizationSample::default(); count as usize + 32];
    let mut count = samples.len() as u32;
    // SAFETY: `samples` holds `count` records.
    let result = unsafe { process_utilization(device, samples.as_mut_ptr(), &mut count, since) };
    if result != NVML_SUCCESS {
        return if result == NVML_ERROR_NOT_FOUND {
            Ok(Vec::new())
        } else {
            Err(result)
        };
    }
    samples.truncate(count as usize);
    let processes = view.processes();
    let mut latest: Vec<ProcessUtilizationSample> = Vec::new();
    for sample in samples {
        let Some(pid) = view.container_pid(&processes, sample.pid) else {
            continue;
        };
        let sample = ProcessUtilizationSample { pid, ..sample };
        match latest.iter_mut().find(|s| s.pid == pid) {
            Some(existing) if existing.time_stamp < sample.time_stamp => *existing = sample,
            Some(_) => {}
            None => latest.push(sample),
        }
    }
    Ok(latest)
}

fn scaled(view: &View, visible: &VisibleGpu, percent_of_card: u32) -> u32 {
    match (view.utilization_scale(), visible.core_limit) {
        (UtilizationScale::Limit, Some(limit)) if limit > 0 => {
            (percent_of_card * 100 / limit).min(100)
        }
        _ => percent_of_card.min(100),
    }
}

hook! {
    fn nvmlDeviceGetUtilizationRates(device: NvmlDevice, utilization: *mut Utilization) -> NvmlReturn |real| {
        let view = match view() {
            // SAFETY: forwarding the caller's own arguments to the real function (or
            // writing through out-pointers the real call has just validated).
            Ok(None) => return unsafe { real(device, utilization) },
            Err(()) => return NVML_ERROR_INVALID_ARGUMENT,
            Ok(Some(view)) => view,
        };
        let Some((_, visible)) = view.find(device) else { return NVML_ERROR_INVALID_ARGUMENT };
        if utilization.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        match container_samples(view, device) {
            Ok(samples) => {
                let sm: u32 = samples.iter().map(|s| s.sm_util).sum();
                let memory: u32 = samples.iter().map(|s| s.mem_util).sum();
                // SAFETY: checked non-null.
                unsafe { *utilization = Utilization { gpu: scaled(view, visible, sm), memory: scaled(view, visible, memory) } };
                NVML_SUCCESS
            }
            Err(error) => error,
        }
    }
}

hook! {
    fn nvmlDeviceGetProcessUtilization(device: NvmlDevice, samples: *mut ProcessUtilizationSample, count: *mut u32, since: u64) -> NvmlReturn |real| {
        let view = match view() {
            // SAFETY: forwarding the caller's own arguments to the real function (or
            // writing through out-pointers the real call has just validated).
            Ok(None) => return unsafe { real(device, samples, count, since) },
            Err(()) => return NVML_ERROR_INVALID_ARGUMENT,
            Ok(Some(view)) => view,
        };
        if view.find(device).is_none() || count.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let mine = match container_samples(view, device) {
            Ok(mine) => mine,
            Err(error) => return error,
        };
        // SAFETY: non-null in/out count.
        let room = unsafe { *count } as usize;
        // SAFETY: as above.
        unsafe { *count = mine.len() as u32 };
        if samples.is_null() || room < mine.len() {
            return NVML_ERROR_INSUFFICIENT_SIZE;
        }
        // SAFETY: the caller's buffer holds `room` samples.
        unsafe { std::ptr::copy_nonoverlapping(mine.as_ptr(), samples, mine.len()) };
        NVML_SUCCESS
    }
}
