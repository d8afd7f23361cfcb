//! Process identity: a PID plus the kernel's start time, so that a reused PID is never
//! mistaken for the process that held a slot before it; and the PID namespace, so that a
//! process only judges the liveness of PIDs it can see.
//!
//! Liveness has three answers: a process is dead only when the kernel says so (no such
//! PID, another process under that PID, or a zombie, which holds no device memory any
//! more); a `/proc` that cannot be read (hidepid, permissions) is "unknown", never
//! "dead".
//!
//! And one thing the process may do: mount (`holds_cap_sys_admin`), which root in an
//! unprivileged container may not.

use std::path::Path;

/// Who a process is, as seen from its own PID namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Identity {
    /// Its PID in its own namespace.
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
    parse_state_and_start(stat).map(|(_, start)| start)
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

/// What can be said about a process that was `pid` with some start time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Liveness {
    /// It runs.
    Alive,
    /// It is gone: no such PID, another process under it, or a zombie.
    Dead,
    /// It exists but cannot be inspected (hidepid, permissions): treat as alive.
    Unknown,
}

/// The state (field 3) and start time (field 22) of a `/proc/PID/stat` line.
pub fn parse_state_and_start(stat: &str) -> Option<(char, u64)> {
    // After the comm come field 3 (state) onwards: field 22 is the 20th of those.
    let after_comm = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_comm.split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    Some((state, fields.nth(18)?.parse().ok()?))
}

/// Whether `pid` exists, by `kill(pid, 0)`: `Some(false)` only for ESRCH.
fn pid_exists(pid: i32) -> Option<bool> {
    // SAFETY: signal 0 performs the existence and permission checks only.
    if unsafe { libc::kill(pid, 0) } == 0 {
        return Some(true);
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::ESRCH) => Some(false),
        Some(libc::EPERM) => Some(true),
        _ => None,
    }
}

/// The liveness of the process that was `pid` with `start_time`, in `proc_root` (our
/// PID namespace's `/proc`; `kill` checks in the caller's namespace).
pub fn liveness_in(proc_root: &Path, pid: i32, start_time: u64) -> Liveness {
    if pid <= 0 {
        return Liveness::Dead;
    }
    match std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")) {
        Ok(stat) => match parse_state_and_start(&stat) {
            Some(('Z' | 'X' | 'x', _)) => Liveness::Dead,
            Some((_, now)) if now == start_time => Liveness::Alive,
            Some(_) => Liveness::Dead,
            None => Liveness::Unknown,
        },
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => match pid_exists(pid) {
            // hidepid=invisible hides other users' processes as ENOENT: ask the kernel.
            Some(false) => Liveness::Dead,
            _ => Liveness::Unknown,
        },
        Err(_) => Liveness::Unknown,
    }
}

/// [`liveness_in`] under `/proc`.
pub fn liveness(pid: i32, start_time: u64) -> Liveness {
    liveness_in(Path::new("/proc"), pid, start_time)
}

/// Whether `pid` is certainly gone (for a slot whose start time may not be written
/// yet): only ESRCH counts.
pub fn pid_is_gone(pid: i32) -> bool {
    pid <= 0 || pid_exists(pid) == Some(false)
}

/// Whether the process that was `pid` with `start_time` still runs (seen from our
/// namespace); an unreadable `/proc` entry counts as running.
pub fn is_alive(pid: i32, start_time: u64) -> bool {
    liveness(pid, start_time) != Liveness::Dead
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

/// `CAP_SYS_ADMIN`'s bit in a capability set (`linux/capability.h`).
const CAP_SYS_ADMIN: u32 = 21;

/// Whether this process may make mount namespaces and mounts: its effective capability
/// set holds `CAP_SYS_ADMIN` (root on a host does; root in an unprivileged container, a
/// rootless sandbox or any other user does not). False where `/proc/self/status` cannot
/// be read.
pub fn holds_cap_sys_admin() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .is_ok_and(|status| holds_capability(&status, CAP_SYS_ADMIN))
}

/// Whether the effective set (`CapEff:`) of a `/proc/<pid>/status` text holds `bit`.
pub fn holds_capability(status: &str, bit: u32) -> bool {
    status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|set| bit < 64 && set >> bit & 1 == 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_sys_admin_is_read_from_the_effective_set() {
        let status = |cap_eff: &str| format!("Name:\tvgpu\nUid:\t0\t0\t0\t0\nCapEff:\t{cap_eff}\n");
        // Root on a host (every capability) and CAP_SYS_ADMIN alone.
        assert!(holds_capability(&status("000001fffeffffff"), CAP_SYS_ADMIN));
        assert!(holds_capability(&status("0000000000200000"), CAP_SYS_ADMIN));
        // Root in an unprivileged podman container, and no capability at all.
        assert!(!holds_capability(
            &status("00000000a80425fb"),
            CAP_SYS_ADMIN
        ));
        assert!(!holds_capability(
            &status("0000000000000000"),
            CAP_SYS_ADMIN
        ));
        // No such line, a broken one, a bit past the set.
        assert!(!holds_capability("Name:\tx\n", CAP_SYS_ADMIN));
        assert!(!holds_capability("CapEff:\tzz\n", CAP_SYS_ADMIN));
        assert!(!holds_capability(&status("ffffffffffffffff"), 64));
    }

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
    fn zombies_and_reused_pids_are_dead_and_unreadable_proc_is_unknown() {
        let me = current();
        assert_eq!(liveness(me.pid, me.start_time), Liveness::Alive);
        assert_eq!(liveness(me.pid, me.start_time + 1), Liveness::Dead);
        // A zombie: a child that exited and is not reaped yet.
        // SAFETY: fork in a test; the child only calls _exit.
        let child = unsafe { libc::fork() };
        if child == 0 {
            // SAFETY: leaving the forked child at once.
            unsafe { libc::_exit(0) };
        }
        let started = {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            loop {
                let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).expect("stat");
                let (state, start) = parse_state_and_start(&stat).expect("parse");
                if state == 'Z' || std::time::Instant::now() > deadline {
                    break start;
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        };
        assert_eq!(
            liveness(child, started),
            Liveness::Dead,
            "a zombie holds nothing"
        );
        // SAFETY: reaping our own child.
        unsafe { libc::waitpid(child, std::ptr::null_mut(), 0) };
        assert_eq!(liveness(child, started), Liveness::Dead);
        // A /proc that hides the entry while the PID exists: unknown, not dead.
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(
            liveness_in(dir.path(), me.pid, me.start_time),
            Liveness::Unknown
        );
        std::fs::create_dir_all(dir.path().join(me.pid.to_string())).expect("mkdir");
        assert_eq!(
            liveness_in(dir.path(), me.pid, me.start_time),
            Liveness::Unknown,
            "stat unreadable"
        );
        assert!(pid_is_gone(child));
        assert!(!pid_is_gone(me.pid));
    }

    #[test]
    fn own_nspid_ends_with_own_pid() {
        let me = current();
        let levels = ns_pids_in(Path::new("/proc"), me.pid).expect("NSpid");
        assert_eq!(levels.last().copied(), Some(me.pid));
    }
}
