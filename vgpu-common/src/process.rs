//! Process identity: a PID plus the kernel's start time, so that a reused PID is never
//! mistaken for the process that held a slot before it; and the PID namespace, so that a
//! process only judges the liveness of PIDs it can see.

use std::path::Path;

/// Who a process is, as seen from its own PID namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Identity {
    pub pid: i32,
    /// Field 22 of `/proc/PID/stat`: clock ticks after boot at which the process started.
    pub start_time: u64,
    /// Inode of `/proc/self/ns/pid`, 0 when unreadable.
    pub pid_ns: u64,
}

/// The inode of the initial PID namespace (`PROC_PID_INIT_INO` in the kernel).
pub const INIT_PID_NS: u64 = 0xEFFF_FFFC;

/// Reads the start time of `pid` from `proc_root` (normally `/proc`).
pub fn start_time_in(proc_root: &Path, pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")).ok()?;
    parse_start_time(&stat)
}

/// Field 22 of a `/proc/PID/stat` line; the comm field may hold spaces and parentheses.
pub fn parse_start_time(stat: &str) -> Option<u64> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    // After the comm come field 3 (state) onwards: field 22 is the 20th of those.
    after_comm.split_ascii_whitespace().nth(19)?.parse().ok()
}

/// The PID namespace inode of `/proc/PID/ns/pid` under `proc_root`.
pub fn pid_namespace_in(proc_root: &Path, pid: &str) -> Option<u64> {
    let link = std::fs::read_link(proc_root.join(pid).join("ns/pid")).ok()?;
    let text = link.to_str()?;
    text.strip_prefix("pid:[")?.strip_suffix(']')?.parse().ok()
}

/// This process.
pub fn current() -> Identity {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let proc_root = Path::new("/proc");
    Identity {
        pid,
        start_time: start_time_in(proc_root, pid).unwrap_or(0),
        pid_ns: pid_namespace_in(proc_root, "self").unwrap_or(0),
    }
}

/// Whether the process that was `pid` with `start_time` still runs (seen from our namespace).
pub fn is_alive(pid: i32, start_time: u64) -> bool {
    if pid <= 0 {
        return false;
    }
    match start_time_in(Path::new("/proc"), pid) {
        Some(now) => now == start_time,
        None => false,
    }
}

/// Host PIDs for each PID level of `pid`: the `NSpid` line of `/proc/PID/status`.
pub fn ns_pids_in(proc_root: &Path, pid: i32) -> Option<Vec<i32>> {
    let status = std::fs::read_to_string(proc_root.join(pid.to_string()).join("status")).ok()?;
    let line = status.lines().find(|line| line.starts_with("NSpid:"))?;
    line["NSpid:".len()..]
        .split_ascii_whitespace()
        .map(|field| field.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_odd_comm() {
        let stat =
            "1234 (a b) c)) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_start_time(stat), Some(987654));
        assert_eq!(parse_start_time("garbage"), None);
    }

    #[test]
    fn current_process_is_alive() {
        let me = current();
        assert!(me.start_time > 0);
        assert!(is_alive(me.pid, me.start_time));
        assert!(!is_alive(me.pid, me.start_time + 1));
        assert!(!is_alive(0, 0));
    }

    #[test]
    fn own_nspid_ends_with_own_pid() {
        let me = current();
        let levels = ns_pids_in(Path::new("/proc"), me.pid).expect("NSpid");
        assert_eq!(levels.last().copied(), Some(me.pid));
    }
}
