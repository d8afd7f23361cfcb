//! Utilization as the container sees it: the SM use of its own processes, from NVML's
//! per-process samples over the last second, scaled by `utilization_scale`: `limit`
//! (default) reads 100% when the container uses all of its core limit, `card` reads the
//! percent of the whole card.

use std::time::{SystemTime, UNIX_EPOCH};

use vgpu_contract::UtilizationScale;

use crate::ffi::{read_out, write_out, write_records};
use crate::nvml::*;
use crate::state::{View, virtualize};
use crate::{hook, real};

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
    // SAFETY: a null buffer with our own count of 0 asks the real call for the size.
    let result = unsafe { process_utilization(device, std::ptr::null_mut(), &mut count, since) };
    if result != NVML_SUCCESS && result != NVML_ERROR_INSUFFICIENT_SIZE {
        return Err(result);
    }
    let mut samples = vec![ProcessUtilizationSample::default(); count as usize + 32];
    let mut count = samples.len() as u32;
    // SAFETY: our own buffer of `count` samples and our own count, to the real call.
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
    Ok(latest_per_process(samples, |pid| {
        view.container_pid(&processes, pid)
    }))
}

/// The latest sample of each container process (`container_pid` maps NVML's PIDs to
/// the container's, `None` for someone else's), PIDs rewritten.
fn latest_per_process(
    samples: impl IntoIterator<Item = ProcessUtilizationSample>,
    container_pid: impl Fn(u32) -> Option<u32>,
) -> Vec<ProcessUtilizationSample> {
    let mut latest: Vec<ProcessUtilizationSample> = Vec::new();
    for sample in samples {
        let Some(pid) = container_pid(sample.pid) else {
            continue;
        };
        let sample = ProcessUtilizationSample { pid, ..sample };
        match latest.iter_mut().find(|s| s.pid == pid) {
            Some(existing) if existing.time_stamp < sample.time_stamp => *existing = sample,
            Some(_) => {}
            None => latest.push(sample),
        }
    }
    latest
}

/// A percent of the whole card as the container is shown it: under `limit` scaling, a
/// share of its core limit (100% when it uses all of it), else of the card; never over
/// 100.
fn scaled(scale: UtilizationScale, core_limit: Option<u32>, percent_of_card: u32) -> u32 {
    match (scale, core_limit) {
        (UtilizationScale::Limit, Some(limit)) if limit > 0 => {
            (percent_of_card.saturating_mul(100) / limit).min(100)
        }
        _ => percent_of_card.min(100),
    }
}

hook! {
    fn nvmlDeviceGetUtilizationRates(device: NvmlDevice, utilization: *mut Utilization) -> NvmlReturn |forward| {
        virtualize(forward, |view| {
            let Some((_, visible)) = view.find(device) else { return NVML_ERROR_INVALID_ARGUMENT };
            if utilization.is_null() {
                return NVML_ERROR_INVALID_ARGUMENT;
            }
            match container_samples(view, device) {
                Ok(samples) => {
                    let sm: u32 = samples.iter().map(|s| s.sm_util).sum();
                    let memory: u32 = samples.iter().map(|s| s.mem_util).sum();
                    let scale = view.utilization_scale();
                    write_out(utilization, Utilization {
                        gpu: scaled(scale, visible.core_limit, sm),
                        memory: scaled(scale, visible.core_limit, memory),
                    });
                    NVML_SUCCESS
                }
                Err(error) => error,
            }
        })
    }
}

hook! {
    fn nvmlDeviceGetProcessUtilization(device: NvmlDevice, samples: *mut ProcessUtilizationSample, count: *mut u32, since: u64) -> NvmlReturn |forward| {
        virtualize(forward, |view| {
            if view.find(device).is_none() || count.is_null() {
                return NVML_ERROR_INVALID_ARGUMENT;
            }
            let mine = match container_samples(view, device) {
                Ok(mine) => mine,
                Err(error) => return error,
            };
            let room = read_out(count).unwrap_or(0) as usize;
            write_out(count, mine.len() as u32);
            if samples.is_null() || !write_records(samples, room, &mine) {
                return NVML_ERROR_INSUFFICIENT_SIZE;
            }
            NVML_SUCCESS
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(pid: u32, time_stamp: u64, sm_util: u32) -> ProcessUtilizationSample {
        ProcessUtilizationSample {
            pid,
            time_stamp,
            sm_util,
            ..ProcessUtilizationSample::default()
        }
    }

    #[test]
    fn limit_scaling_reads_100_at_the_core_limit_and_card_scaling_the_card() {
        use UtilizationScale::{Card, Limit};
        assert_eq!(scaled(Limit, Some(50), 25), 50);
        assert_eq!(scaled(Limit, Some(50), 50), 100);
        assert_eq!(
            scaled(Limit, Some(30), 45),
            100,
            "soft mode above its limit: capped"
        );
        assert_eq!(scaled(Limit, None, 40), 40, "no limit: the card's percent");
        assert_eq!(scaled(Limit, Some(0), 40), 40, "a zero limit never divides");
        assert_eq!(scaled(Card, Some(50), 25), 25);
        assert_eq!(scaled(Card, None, 250), 100);
        assert_eq!(scaled(Limit, Some(1), u32::MAX), 100, "no overflow");
    }

    #[test]
    fn only_the_latest_sample_of_each_container_process_counts() {
        let ours = |pid| match pid {
            31007 => Some(7),
            31009 => Some(9),
            _ => None,
        };
        let latest = latest_per_process(
            [
                sample(31007, 10, 30),
                sample(4242, 11, 90),
                sample(31007, 12, 40),
                sample(31009, 5, 10),
                sample(31007, 11, 99),
            ],
            ours,
        );
        let seen: Vec<_> = latest
            .iter()
            .map(|s| (s.pid, s.time_stamp, s.sm_util))
            .collect();
        assert_eq!(seen, [(7, 12, 40), (9, 5, 10)]);
    }
}
