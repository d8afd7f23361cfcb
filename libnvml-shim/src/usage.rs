//! The container's usage as NVML answers it: its live processes (a private copy of the
//! usage region per query, so a truncated or replaced file can neither crash nor stall a
//! monitoring tool), the memory they hold on a device, and the mapping from an NVML
//! process-list PID (the caller's namespace on driver 580, the host's on older drivers)
//! to the container's own PID.

use std::path::Path;

use vgpu_abi::nvml::ProcessInfoV1;
use vgpu_contract::UtilizationScale;
use vgpu_contract::process;
use vgpu_contract::region::{self, ProcessUsage};
use vgpu_contract::snapshot::RegionSnapshot;

use crate::devices::VisibleGpu;
use crate::nvml::*;
use crate::state::View;
use crate::{debug, real};

/// This process's PID namespace (0 when unreadable).
fn my_pid_namespace() -> u64 {
    process::pid_namespace_in(Path::new("/proc"), "self").unwrap_or(0)
}

impl View {
    /// Bytes the container holds on a device: per live process, what the usage region
    /// counts or, where the real NVML lists the process with more, NVML's own figure
    /// (memory the driver loaded after the process last reconciled).
    pub fn used(&self, device: &VisibleGpu) -> u64 {
        let listed = real_processes(device.handle as NvmlDevice);
        held_on(
            &self.processes(),
            &listed,
            device.region_index,
            my_pid_namespace(),
        )
    }

    /// The container's live processes: a private copy of the usage region, without the
    /// processes this namespace can tell are gone. None when the region cannot be read
    /// (missing, damaged, not a regular file).
    pub fn processes(&self) -> Vec<ProcessUsage> {
        match RegionSnapshot::read(&self.region_path) {
            Ok(snapshot) => {
                let my_ns = my_pid_namespace();
                let mut processes = snapshot.processes();
                processes.retain(|process| !region::is_dead(process, my_ns));
                processes
            }
            Err(err) => {
                debug!("{err}; the container's usage reads 0");
                Vec::new()
            }
        }
    }

    /// An NVML process-list PID mapped to the container's PID, if it is one of ours.
    pub fn container_pid(&self, processes: &[ProcessUsage], nvml_pid: u32) -> Option<u32> {
        container_pid_in(processes, nvml_pid, my_pid_namespace())
    }

    /// How utilization is scaled for the container.
    pub fn utilization_scale(&self) -> UtilizationScale {
        self.config.utilization_scale
    }
}

/// The container's PID for NVML's `nvml_pid`, read from namespace `my_ns`.
fn container_pid_in(processes: &[ProcessUsage], nvml_pid: u32, my_ns: u64) -> Option<u32> {
    region::nvml_match(processes, nvml_pid, my_ns).map(|p| p.pid as u32)
}

/// What `processes` hold on the device of region index `index`: per process, its
/// counted bytes or NVML's figure for it in `listed`, whichever is more.
fn held_on(processes: &[ProcessUsage], listed: &[ProcessInfoV1], index: usize, my_ns: u64) -> u64 {
    processes
        .iter()
        .map(|process| {
            let counted = process.used.get(index).copied().unwrap_or(0);
            let reported = listed
                .iter()
                .filter(|entry| {
                    region::nvml_match(std::slice::from_ref(process), entry.pid, my_ns).is_some()
                })
                .map(|entry| entry.used_gpu_memory.min(region::MAX_COUNT))
                .max()
                .unwrap_or(0);
            counted.max(reported)
        })
        .fold(0u64, u64::saturating_add)
}

/// The real NVML's compute process list of a device (empty on any error).
fn real_processes(device: NvmlDevice) -> Vec<ProcessInfoV1> {
    let list = real!(
        nvmlDeviceGetComputeRunningProcesses
            as fn(NvmlDevice, *mut u32, *mut ProcessInfoV1) -> NvmlReturn
    );
    let mut capacity = 64u32;
    loop {
        let mut entries = vec![ProcessInfoV1::default(); capacity as usize];
        let mut count = capacity;
        // SAFETY: our own buffer of `count` records of nvmlProcessInfo_v1_t (the layout
        // of the unversioned call) and our own count, to the real call.
        match unsafe { list(device, &mut count, entries.as_mut_ptr()) } {
            NVML_SUCCESS => {
                entries.truncate((count as usize).min(entries.len()));
                return entries;
            }
            NVML_ERROR_INSUFFICIENT_SIZE if capacity < 4096 => capacity = count.max(capacity * 2),
            _ => return Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    /// The container's PID namespace; the host's is 1.
    const CONTAINER_NS: u64 = 4026532000;

    /// A container process: PID `pid` in the container's namespace, `host_pid` on the
    /// host (0 while the host has not filled it in), `used` bytes counted on device 0.
    fn process(pid: i32, host_pid: i32, used: u64) -> ProcessUsage {
        ProcessUsage {
            slot: 0,
            pid,
            host_pid,
            start_time: 0,
            pid_ns: CONTAINER_NS,
            used: vec![used],
            context: Vec::new(),
            busy_ns: Vec::new(),
            launches: Vec::new(),
        }
    }

    fn listed(pid: u32, used: u64) -> ProcessInfoV1 {
        ProcessInfoV1 {
            pid,
            used_gpu_memory: used,
        }
    }

    #[test]
    fn nvml_pids_map_to_the_containers_own() {
        let processes = [process(7, 31007, 0), process(9, 0, 0)];
        // Driver 580, read inside the container: NVML answers in our namespace.
        assert_eq!(container_pid_in(&processes, 7, CONTAINER_NS), Some(7));
        assert_eq!(container_pid_in(&processes, 9, CONTAINER_NS), Some(9));
        // Older drivers answer host PIDs: the host-recorded PID maps back.
        assert_eq!(container_pid_in(&processes, 31007, 1), Some(7));
        // Read from another namespace, a container PID is not ours to claim.
        assert_eq!(container_pid_in(&processes, 9, 1), None);
        // Someone else's process, and PID 0, are nobody of ours.
        assert_eq!(container_pid_in(&processes, 4242, CONTAINER_NS), None);
        assert_eq!(container_pid_in(&processes, 0, CONTAINER_NS), None);
    }

    #[test]
    fn each_process_holds_the_larger_of_its_count_and_nvmls_figure() {
        let processes = [process(7, 0, 600 * MIB), process(9, 0, 100 * MIB)];
        let nvml = [
            listed(7, 650 * MIB),     // module code loaded after the last reconciliation
            listed(9, 40 * MIB),      // NVML lags a fresh allocation
            listed(4242, 9000 * MIB), // another tenant's: not ours
        ];
        assert_eq!(held_on(&processes, &nvml, 0, CONTAINER_NS), 750 * MIB);
        assert_eq!(held_on(&processes, &[], 0, CONTAINER_NS), 700 * MIB);
        assert_eq!(
            held_on(&processes, &nvml, 3, CONTAINER_NS),
            690 * MIB,
            "device 3: NVML only"
        );
    }
}
