//! The host PIDs of containers' CUDA processes. A process records its own PID in its
//! usage-region slot, which inside a PID namespace is not the PID the host's NVML
//! reports; the plugin (in the host's PID namespace) finds the host PID and writes it
//! into the slot, so NVML inside the container can list the container's processes.
//!
//! The region is read as a private copy ([`RegionSnapshot`]) and the PID goes in with
//! [`write_host_pid`] (`pwrite`): the host never maps a tenant's file. A host process
//! matches a slot when its PID namespace is the slot's, its innermost `NSpid` is the
//! slot's PID and its start time is the slot's.

use std::collections::BTreeMap;
use std::path::Path;

use vgpu_common::process::{INIT_PID_NS, ns_pids_in, pid_namespace_in, start_time_in};
use vgpu_common::region::ProcessUsage;
use vgpu_common::snapshot::write_host_pid;

/// A slot whose host PID is not known yet.
struct Wanted {
    slot: usize,
    pid: i32,
    start_time: u64,
}

/// Fills the host PIDs missing from `processes` (a snapshot of the region at `region`)
/// by one pass over `proc_root` (the host's `/proc`); returns how many were written.
/// Costs nothing when no slot lacks one.
pub fn fill(region: &Path, processes: &[ProcessUsage], proc_root: &Path) -> usize {
    let mut by_namespace: BTreeMap<u64, Vec<Wanted>> = BTreeMap::new();
    for process in processes {
        if process.host_pid == 0 && process.pid_ns != 0 && process.pid_ns != INIT_PID_NS {
            by_namespace
                .entry(process.pid_ns)
                .or_default()
                .push(Wanted {
                    slot: process.slot,
                    pid: process.pid,
                    start_time: process.start_time,
                });
        }
    }
    if by_namespace.is_empty() {
        return 0;
    }
    let Ok(entries) = std::fs::read_dir(proc_root) else {
        return 0;
    };
    let mut written = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Ok(host_pid) = name.parse::<i32>() else {
            continue;
        };
        let Some(wanted) = pid_namespace_in(proc_root, name).and_then(|ns| by_namespace.get(&ns))
        else {
            continue;
        };
        let inner = ns_pids_in(proc_root, host_pid).and_then(|levels| levels.last().copied());
        let started = start_time_in(proc_root, host_pid);
        for slot in wanted {
            if inner == Some(slot.pid) && started == Some(slot.start_time) {
                match write_host_pid(region, slot.slot, host_pid) {
                    Ok(()) => written += 1,
                    Err(err) => tracing::debug!(error = %err, "cannot record a host PID"),
                }
            }
        }
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_common::process::Identity;
    use vgpu_common::region::{Region, RegionDevice};
    use vgpu_common::snapshot::RegionSnapshot;

    /// A process of the fake host `/proc`: host PID, PID namespace, PID inside, start.
    fn host_process(proc_root: &Path, host: i32, ns: u64, inner: i32, start: u64) {
        let dir = proc_root.join(host.to_string());
        std::fs::create_dir_all(dir.join("ns")).expect("mkdir");
        std::os::unix::fs::symlink(format!("pid:[{ns}]"), dir.join("ns/pid")).expect("ns");
        std::fs::write(
            dir.join("status"),
            format!("Name:\tpython3\nNSpid:\t{host}\t{inner}\n"),
        )
        .expect("status");
        let fields = format!("S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {start} 0 0");
        std::fs::write(dir.join("stat"), format!("{host} (python3) {fields}")).expect("stat");
    }

    #[test]
    fn a_container_slot_gets_its_host_pid_by_pwrite() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("usage.region");
        let device = RegionDevice {
            id: "GPU-x".into(),
            memory_limit: 1 << 30,
            core_limit: 0,
            core_mode: 0,
        };
        let (region, _) = Region::open(&path, &[device]).expect("region");
        let container_process = Identity {
            pid: 12,
            start_time: 5151,
            pid_ns: 4026532001,
        };
        region.attach(&container_process).expect("attach");
        drop(region);
        let proc_root = dir.path().join("proc");
        host_process(&proc_root, 4000, 4026532002, 12, 5151); // another namespace
        host_process(&proc_root, 4001, 4026532001, 12, 1); // started at another time
        host_process(&proc_root, 4002, 4026532001, 12, 5151); // the one
        let before = RegionSnapshot::read(&path).expect("copy").processes();
        assert_eq!(before[0].host_pid, 0);
        assert_eq!(fill(&path, &before, &proc_root), 1);
        let after = RegionSnapshot::read(&path).expect("copy").processes();
        assert_eq!(after[0].host_pid, 4002);
        // Known host PIDs are left alone: nothing to scan.
        assert_eq!(fill(&path, &after, &proc_root), 0);
    }
}
