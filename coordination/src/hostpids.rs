//! Which PID the host knows a container's process by: what NVML, asked from the host,
//! lists its work under. A region slot says the PID the process has in its own PID
//! namespace, that namespace, its start time and (filled by the host side, but in a file
//! the tenant can write) a host PID; none of it is believed until `/proc` of the host
//! agrees: the host PID's namespace, innermost `NSpid` and start time must all be the
//! slot's. A process of the host's own namespace is its own PID (start time checked).
//!
//! Answers are cached by (namespace, PID, start time), which no other process can ever
//! share; a process is looked for by a scan of `/proc` soon after it is first asked
//! about (at most once per [`NEW_SCAN_GAP_NS`]), and one not found then at most once per
//! [`RESCAN_NS`], so a host with many processes is not scanned every tick, not even by a
//! tenant that writes new identities into its slots every tick.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use vgpu_contract::process;
use vgpu_contract::region::ProcessUsage;

/// The least time between two scans of `/proc` for processes not found yet.
pub const RESCAN_NS: u64 = 1_000_000_000;
/// The least time between two scans of `/proc` for processes never looked for yet.
pub const NEW_SCAN_GAP_NS: u64 = 250_000_000;

/// (PID namespace, PID in it, start time).
type Key = (u64, i32, u64);

/// The host PIDs of containers' processes, checked against the host's `/proc`.
pub struct HostPids {
    proc_root: PathBuf,
    my_pid_ns: u64,
    known: HashMap<Key, u32>,
    /// Keys asked about since the last [`HostPids::forget_unused`].
    used: HashMap<Key, ()>,
    /// Keys a scan looked for already (and did not find).
    scanned_for: HashMap<Key, ()>,
    last_scan_ns: u64,
}

impl HostPids {
    /// Resolves against `proc_root`, the host's `/proc` as this process sees it.
    pub fn new(proc_root: &Path) -> HostPids {
        HostPids {
            proc_root: proc_root.to_path_buf(),
            my_pid_ns: process::pid_namespace_in(proc_root, "self").unwrap_or(0),
            known: HashMap::new(),
            used: HashMap::new(),
            scanned_for: HashMap::new(),
            last_scan_ns: 0,
        }
    }

    /// Finds the host PIDs of `processes` that are not known yet: a process of this
    /// namespace by its own PID, one whose slot names a host PID by checking that PID,
    /// the rest by one scan of `/proc`, made when one of them was never looked for (and
    /// [`NEW_SCAN_GAP_NS`] has passed), or else when one is due (`now_ns`). Then
    /// [`HostPids::get`].
    pub fn resolve(&mut self, processes: &[ProcessUsage], now_ns: u64) {
        let mut wanted = Vec::new();
        for (index, process) in processes.iter().enumerate() {
            let key = (process.pid_ns, process.pid, process.start_time);
            self.used.insert(key, ());
            if self.known.contains_key(&key) {
                continue;
            }
            let found = if process.pid_ns != 0 && process.pid_ns == self.my_pid_ns {
                (process::start_time_in(&self.proc_root, process.pid) == Some(process.start_time))
                    .then_some(process.pid)
            } else if process.host_pid > 0 && self.checks_out(process.host_pid, key) {
                Some(process.host_pid)
            } else {
                wanted.push((index, process.pid, process.pid_ns, process.start_time));
                None
            };
            if let Some(pid) = found.and_then(|pid| u32::try_from(pid).ok()) {
                self.known.insert(key, pid);
            }
        }
        let new = wanted.iter().any(|&(_, pid, pid_ns, start_time)| {
            !self.scanned_for.contains_key(&(pid_ns, pid, start_time))
        });
        let since_scan = now_ns.saturating_sub(self.last_scan_ns);
        let gap = if new { NEW_SCAN_GAP_NS } else { RESCAN_NS };
        if wanted.is_empty() || since_scan < gap {
            return;
        }
        self.last_scan_ns = now_ns;
        for &(_, pid, pid_ns, start_time) in &wanted {
            self.scanned_for.insert((pid_ns, pid, start_time), ());
        }
        for (index, host_pid) in vgpu_contract::region::find_host_pids(&wanted, &self.proc_root) {
            let process = &processes[index];
            if let Ok(pid) = u32::try_from(host_pid) {
                self.known
                    .insert((process.pid_ns, process.pid, process.start_time), pid);
            }
        }
    }

    /// The PID `process` has as this host sees it, once [`HostPids::resolve`] found it.
    pub fn get(&self, process: &ProcessUsage) -> Option<u32> {
        self.known
            .get(&(process.pid_ns, process.pid, process.start_time))
            .copied()
    }

    /// Whether `host_pid` in the host's `/proc` is the process of `key`.
    fn checks_out(&self, host_pid: i32, (pid_ns, pid, start_time): Key) -> bool {
        process::pid_namespace_in(&self.proc_root, &host_pid.to_string()) == Some(pid_ns)
            && process::ns_pids_in(&self.proc_root, host_pid)
                .and_then(|levels| levels.last().copied())
                == Some(pid)
            && process::start_time_in(&self.proc_root, host_pid) == Some(start_time)
    }

    /// Drops the answers nobody asked for since the last call (processes gone).
    pub fn forget_unused(&mut self) {
        let used = std::mem::take(&mut self.used);
        self.known.retain(|key, _| used.contains_key(key));
        self.scanned_for.retain(|key, _| used.contains_key(key));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(pid: i32, host_pid: i32, pid_ns: u64, start_time: u64) -> ProcessUsage {
        ProcessUsage {
            slot: 0,
            pid,
            host_pid,
            start_time,
            pid_ns,
            used: vec![],
            context: vec![],
            busy_ns: vec![],
            launches: vec![],
        }
    }

    #[test]
    fn own_namespace_processes_are_their_pid_and_claims_are_checked() {
        let me = process::current();
        let mut pids = HostPids::new(Path::new("/proc"));
        let now = 10 * RESCAN_NS;
        let mine = usage(me.pid, 0, me.pid_ns, me.start_time);
        let reborn = usage(me.pid, 0, me.pid_ns, me.start_time + 1);
        // A slot of another namespace claiming our PID as its host PID: its innermost
        // NSpid and namespace are not what it says.
        let forged = usage(7, me.pid, me.pid_ns ^ 1, me.start_time);
        let all = [mine.clone(), reborn.clone(), forged.clone()];
        pids.resolve(&all, now);
        assert_eq!(pids.get(&mine), Some(me.pid as u32));
        assert_eq!(
            pids.get(&reborn),
            None,
            "another start time is another process"
        );
        assert_eq!(pids.get(&forged), None, "a claim /proc does not back");
        pids.forget_unused();
        assert_eq!(pids.known.len(), 1);
        pids.forget_unused();
        assert!(pids.known.is_empty(), "nobody asked: forgotten");
    }

    #[test]
    fn scans_for_new_identities_are_rate_limited_too() {
        // A tenant may write a new identity into its slots every tick: each is looked
        // for soon, never by more than one scan per NEW_SCAN_GAP_NS.
        let proc_root = tempfile::tempdir().expect("tempdir");
        let mut pids = HostPids::new(proc_root.path());
        let start = 10 * RESCAN_NS;
        let forged = |n: i32| usage(n, 0, 4_026_531_000 + n as u64, 1);
        pids.resolve(&[forged(1)], start);
        assert_eq!(
            pids.last_scan_ns, start,
            "a new identity is looked for at once"
        );
        pids.resolve(&[forged(1), forged(2)], start + 50_000_000);
        assert_eq!(pids.last_scan_ns, start, "but not twice within the gap");
        let later = start + NEW_SCAN_GAP_NS;
        pids.resolve(&[forged(1), forged(2)], later);
        assert_eq!(
            pids.last_scan_ns, later,
            "the new one, once the gap has passed"
        );
        pids.resolve(&[forged(1), forged(2)], later + NEW_SCAN_GAP_NS);
        assert_eq!(
            pids.last_scan_ns, later,
            "nothing new: the slow rescan only"
        );
        pids.resolve(&[forged(1), forged(2)], later + RESCAN_NS);
        assert_eq!(pids.last_scan_ns, later + RESCAN_NS);
    }
}
