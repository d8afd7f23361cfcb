//! Liveness: telling whether a slot's owner is still alive (by PID and start time in
//! its own PID namespace, by host PID from the initial one, else unknown and never
//! dead), freeing the slots of owners that are certainly gone, and finding the host
//! PIDs of owners in other namespaces (the host fills them in). A tenant can write any
//! PID into its slot: nothing here ever trusts one without its start time.

use std::path::Path;
use std::sync::atomic::Ordering;

use super::Region;
use super::layout::MAX_SLOTS;
use super::read::{ProcessUsage, RegionBytes};
use super::slots::{STATE_CLAIMING, STATE_LIVE, SlotId, pid_of, state_of};
use crate::process::{self, Liveness};

/// The slots a reader in PID namespace `my_ns` can tell are dead, with their owner words.
pub(crate) fn dead_slots(bytes: &impl RegionBytes, my_ns: u64) -> Vec<(usize, u64)> {
    (0..bytes.scan_end())
        .filter_map(|index| {
            let slot = bytes.slot(index);
            let owner = slot.owner.load(Ordering::SeqCst);
            let state = state_of(owner);
            if state != STATE_LIVE && state != STATE_CLAIMING {
                return None;
            }
            let liveness = judge(
                pid_of(owner),
                state == STATE_CLAIMING,
                slot.start_time.load(Ordering::SeqCst),
                slot.pid_ns.load(Ordering::SeqCst),
                slot.host_pid.load(Ordering::SeqCst),
                my_ns,
            );
            (liveness == Liveness::Dead).then_some((index, owner))
        })
        .collect()
}

/// What a process in PID namespace `my_ns` can say about a slot's owner: judged by PID
/// and start time in its own namespace; by host PID (when the host filled it) from the
/// initial namespace; else unknown, never dead.
pub fn judge(
    pid: i32,
    claiming: bool,
    start_time: u64,
    pid_ns: u64,
    host_pid: i32,
    my_ns: u64,
) -> Liveness {
    if pid_ns == my_ns {
        if claiming {
            // The start time may not be written yet: only a vanished PID is dead.
            return if process::pid_is_gone(pid) {
                Liveness::Dead
            } else {
                Liveness::Unknown
            };
        }
        process::liveness(pid, start_time)
    } else if my_ns == process::INIT_PID_NS && host_pid > 0 && !claiming {
        process::liveness(host_pid, start_time)
    } else {
        Liveness::Unknown
    }
}

/// Whether a listed process is dead as seen from namespace `my_ns` (see [`judge`]).
pub fn is_dead(process: &ProcessUsage, my_ns: u64) -> bool {
    judge(
        process.pid,
        false,
        process.start_time,
        process.pid_ns,
        process.host_pid,
        my_ns,
    ) == Liveness::Dead
}

/// The container process that an NVML process-list entry's `nvml_pid` names, for a
/// reader in PID namespace `my_ns`. NVML of driver 580 answers in the caller's own PID
/// namespace, so the entry is the process of our namespace with that PID; older drivers
/// report host PIDs, so failing that it is the process whose host PID (filled in by the
/// host, or its own PID in the initial namespace) is `nvml_pid`.
pub fn nvml_match(processes: &[ProcessUsage], nvml_pid: u32, my_ns: u64) -> Option<&ProcessUsage> {
    let pid = i32::try_from(nvml_pid).ok().filter(|pid| *pid > 0)?;
    processes
        .iter()
        .find(|p| p.pid_ns == my_ns && p.pid == pid)
        .or_else(|| processes.iter().find(|p| p.host_pid == pid))
}

impl Region {
    /// The host PID recorded for this process's slot (0 while unknown).
    pub fn slot_host_pid(&self, slot: SlotId) -> i32 {
        self.slot(slot.index).host_pid.load(Ordering::SeqCst).max(0)
    }

    /// Records the host PID of a slot's owner (host daemon).
    pub fn set_host_pid(&self, slot: usize, host_pid: i32) {
        if slot < MAX_SLOTS {
            self.slot(slot).host_pid.store(host_pid, Ordering::SeqCst);
        }
    }

    /// Frees the slots of processes that are certainly gone (see [`judge`]: a `/proc`
    /// that cannot be read, or a namespace we cannot see into, is never "gone"), by
    /// compare-and-swap. Returns how many were freed.
    pub fn reclaim_dead(&self) -> usize {
        let my_ns = process::pid_namespace_in(Path::new("/proc"), "self").unwrap_or(0);
        dead_slots(self, my_ns)
            .into_iter()
            .filter(|&(index, owner)| self.free_slot(index, owner))
            .count()
    }

    /// The cheap half of [`Region::reclaim_dead`], for every `cuMemGetInfo`: frees the
    /// slots of our PID namespace `my_ns` (but `mine`) whose PID no longer exists, one
    /// `kill(pid, 0)` each. A reused PID or an unreaped zombie waits for the full check,
    /// which runs before any refusal.
    pub fn reclaim_gone(&self, mine: SlotId, my_ns: u64) -> usize {
        let mut freed = 0;
        for index in 0..self.scan_end() {
            if index == mine.index {
                continue;
            }
            let slot = self.slot(index);
            let owner = slot.owner.load(Ordering::SeqCst);
            if state_of(owner) == STATE_LIVE
                && slot.pid_ns.load(Ordering::SeqCst) == my_ns
                && process::pid_is_gone(pid_of(owner))
                && self.free_slot(index, owner)
            {
                freed += 1;
            }
        }
        freed
    }
}

/// The live slots of owners in another PID namespace that have no host PID yet.
pub(crate) fn wanting_host_pids(bytes: &impl RegionBytes) -> Vec<WantedHostPid> {
    (0..bytes.scan_end())
        .filter_map(|index| {
            let slot = bytes.slot(index);
            let owner = slot.owner.load(Ordering::SeqCst);
            let pid_ns = slot.pid_ns.load(Ordering::SeqCst);
            let unknown =
                state_of(owner) == STATE_LIVE && slot.host_pid.load(Ordering::SeqCst) == 0;
            (unknown && pid_ns != 0 && pid_ns != process::INIT_PID_NS).then(|| {
                (
                    index,
                    pid_of(owner),
                    pid_ns,
                    slot.start_time.load(Ordering::SeqCst),
                )
            })
        })
        .collect()
}

/// A live slot whose owner runs in another PID namespace and has no host PID yet: its
/// index, PID (in its own namespace), PID namespace and start time.
pub type WantedHostPid = (usize, i32, u64, u64);

/// The host PIDs of `wanted` slots: a process in `proc_root` (the host's `/proc`) whose
/// PID namespace is the slot's, whose innermost `NSpid` is the slot's PID and whose
/// start time is the slot's. Returns (slot index, host PID) pairs; no scan at all when
/// nothing is wanted.
pub fn find_host_pids(wanted: &[WantedHostPid], proc_root: &Path) -> Vec<(usize, i32)> {
    let mut found = Vec::new();
    if wanted.is_empty() {
        return found;
    }
    let Ok(entries) = std::fs::read_dir(proc_root) else {
        return found;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(host_pid) = name.to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let Some(ns) = process::pid_namespace_in(proc_root, &host_pid.to_string()) else {
            continue;
        };
        if !wanted.iter().any(|&(_, _, slot_ns, _)| slot_ns == ns) {
            continue;
        }
        let inner =
            process::ns_pids_in(proc_root, host_pid).and_then(|levels| levels.last().copied());
        let started = process::start_time_in(proc_root, host_pid);
        for &(slot_index, pid, slot_ns, slot_start) in wanted {
            if slot_ns == ns && inner == Some(pid) && started == Some(slot_start) {
                found.push((slot_index, host_pid));
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::Identity;
    use crate::region::test_devices as devices;

    #[test]
    fn gone_pids_are_freed_cheaply_and_ours_never() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (region, _) = Region::open(&dir.path().join("r"), &devices()).expect("open");
        let me = process::current();
        let mine = region.attach(&me).expect("attach");
        region.add_used(mine, 0, 1);
        // SAFETY: fork in a test; the child exits at once and is reaped below.
        let child = unsafe { libc::fork() };
        if child == 0 {
            // SAFETY: leaving the forked child.
            unsafe { libc::_exit(0) };
        }
        // SAFETY: reaping our own child.
        unsafe { libc::waitpid(child, std::ptr::null_mut(), 0) };
        let gone = region
            .attach(&Identity { pid: child, ..me })
            .expect("attach");
        region.add_used(gone, 0, 100);
        let elsewhere = region
            .attach(&Identity {
                pid: child,
                pid_ns: me.pid_ns + 1,
                ..me
            })
            .expect("attach");
        region.add_used(elsewhere, 0, 1000);
        assert_eq!(region.reclaim_gone(mine, me.pid_ns), 1);
        assert_eq!(
            region.device_used(0),
            1001,
            "ours and the other namespace's stay"
        );
    }

    #[test]
    fn nvml_entries_match_by_namespace_pid_first_then_host_pid() {
        let usage = |slot, pid, host_pid, pid_ns| ProcessUsage {
            slot,
            pid,
            host_pid,
            start_time: 1,
            pid_ns,
            used: vec![],
            context: vec![],
            busy_ns: vec![],
            launches: vec![],
        };
        let ours = 4026532999;
        let list = [
            usage(0, 7, 3100, ours),
            usage(1, 9, 0, ours),
            usage(2, 7, 3200, 1234),
        ];
        // Driver 580 in our namespace: PID 7 is our slot 0, not the other namespace's 7.
        assert_eq!(nvml_match(&list, 7, ours).map(|p| p.slot), Some(0));
        assert_eq!(nvml_match(&list, 9, ours).map(|p| p.slot), Some(1));
        // An older driver's host PIDs.
        assert_eq!(nvml_match(&list, 3100, ours).map(|p| p.slot), Some(0));
        assert_eq!(nvml_match(&list, 3200, ours).map(|p| p.slot), Some(2));
        assert_eq!(nvml_match(&list, 4000, ours), None);
        assert_eq!(nvml_match(&list, 0, ours), None, "PID 0 is nobody");
        // The same list read from the initial namespace: only host PIDs match.
        assert_eq!(nvml_match(&list, 7, process::INIT_PID_NS), None);
    }

    #[test]
    fn dead_slots_are_reclaimed_and_reused_pids_are_not_trusted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (region, _) = Region::open(&dir.path().join("r"), &devices()).expect("open");
        let me = process::current();
        // A "previous holder" of our PID: same PID, other start time.
        let ghost = Identity {
            start_time: me.start_time + 12345,
            ..me
        };
        let ghost_slot = region.attach(&ghost).expect("attach ghost");
        region.add_used(ghost_slot, 0, 100);
        let mine = region.attach(&me).expect("attach");
        assert_ne!(mine, ghost_slot);
        region.add_used(mine, 0, 7);
        assert_eq!(region.device_used(0), 107);
        assert_eq!(region.reclaim_dead(), 1);
        assert_eq!(region.device_used(0), 7);
        assert_eq!(region.processes().len(), 1);
    }

    #[test]
    fn host_pids_are_found_through_nspid_and_the_pid_namespace() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (region, _) = Region::open(&dir.path().join("r"), &devices()).expect("open");
        // A process of a container: PID 7 in PID namespace 4026532999, started at 4242.
        let inside = Identity {
            pid: 7,
            start_time: 4242,
            pid_ns: 4026532999,
        };
        let slot = region.attach(&inside).expect("attach");
        // A fake host /proc: host PID 3100 is that process; 3101 is PID 7 of another
        // namespace; 3102 is in the right namespace but started at another time.
        let proc_root = dir.path().join("proc");
        let fake = |host: i32, ns: u64, inner: i32, start: u64| {
            let at = proc_root.join(host.to_string());
            std::fs::create_dir_all(at.join("ns")).expect("mkdir");
            std::os::unix::fs::symlink(format!("pid:[{ns}]"), at.join("ns/pid")).expect("link");
            std::fs::write(
                at.join("status"),
                format!("Name:\tpython3\nNSpid:\t{host}\t{inner}\n"),
            )
            .expect("status");
            let stat =
                format!("{host} (python3) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {start} 0 0");
            std::fs::write(at.join("stat"), stat).expect("stat");
        };
        fake(3101, 4026533000, 7, 4242);
        fake(3102, 4026532999, 7, 9999);
        fake(3100, 4026532999, 7, 4242);
        // The host reads a private copy and writes the PID with pwrite.
        let path = dir.path().join("r");
        let copy = crate::snapshot::RegionSnapshot::read(&path).expect("copy");
        assert_eq!(copy.processes()[0].host_pid, 0);
        assert_eq!(copy.fill_host_pids(&proc_root), 1);
        assert_eq!(
            region.processes()[0].host_pid,
            3100,
            "the mapping sees the write"
        );
        let copy = crate::snapshot::RegionSnapshot::read(&path).expect("copy");
        assert_eq!(
            copy.fill_host_pids(&proc_root),
            0,
            "nothing left to fill: no scan"
        );
        region.detach(slot);
    }
}
