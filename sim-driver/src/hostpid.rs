//! The PID under which the simulated NVML lists a process, as the caller's PID namespace
//! sees it (driver 580's NVML: its own PID in the caller's namespace; from the initial
//! namespace, a child namespace's process under its host PID; else not at all).
//!
//! Finding a host PID takes a scan of `/proc` (each entry's namespace link, then the
//! match's `NSpid` and start time), and NVML is asked about every process of the card
//! several times a tick by the host's coordinator (`nvmlDeviceGetComputeRunningProcesses`
//! twice: the count, then the list). A process's identity (namespace, PID in it, start
//! time) never changes and no other process ever has it, so its host PID is found once
//! and then only checked: three small reads of that PID's own files instead of a scan
//! whose cost grows with every process on the host. A check that fails (the process
//! gone, its PID reused) scans again, so the answer is always the scan's. The caller's
//! own namespace is read once per process too.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

use vgpu_contract::process;

/// (PID namespace, PID in it, start time).
type Identity = (u64, u32, u64);

/// Host PIDs found by scans, with the caller's own namespace.
#[derive(Debug, Default)]
pub struct HostPids {
    found: HashMap<Identity, u32>,
    /// This process's (PID, PID namespace): a forked child in a new namespace asks again.
    mine: Option<(u32, u64)>,
    /// Scans of the `/proc` folder made (what the cache saves; read by tests).
    pub scans: u64,
}

/// The process's cache (NVML is asked from any thread).
static CACHE: Mutex<Option<HostPids>> = Mutex::new(None);

/// Runs `ask` on the process's cache; where it is busy (another thread's call, or a
/// lock a forked child inherited from a thread that no longer exists), on a fresh one:
/// the same answer, found the slow way, and never a wait.
fn with_cache<T>(ask: impl FnOnce(&mut HostPids) -> T) -> T {
    match CACHE.try_lock() {
        Ok(mut cache) => ask(cache.get_or_insert_with(HostPids::default)),
        Err(std::sync::TryLockError::Poisoned(poisoned)) => {
            ask(poisoned.into_inner().get_or_insert_with(HostPids::default))
        }
        Err(std::sync::TryLockError::WouldBlock) => ask(&mut HostPids::default()),
    }
}

/// This process's PID namespace (`/proc/self/ns/pid`), read once per process.
pub fn my_pid_ns() -> u64 {
    with_cache(|cache| cache.my_ns(Path::new("/proc")))
}

/// [`HostPids::visible_pid`] under `/proc`, with the process's cache.
pub fn visible_pid(pid: u32, pid_ns: u64, start_time: u64) -> Option<u32> {
    with_cache(|cache| cache.visible_pid(Path::new("/proc"), pid, pid_ns, start_time))
}

impl HostPids {
    /// The PID the process `pid` of namespace `pid_ns`, started at `start_time`, has in
    /// this process's namespace (see the module's header), `None` where it cannot be
    /// seen; `proc_root` is `/proc` (a test's stand-in).
    pub fn visible_pid(
        &mut self,
        proc_root: &Path,
        pid: u32,
        pid_ns: u64,
        start_time: u64,
    ) -> Option<u32> {
        let my_ns = self.my_ns(proc_root);
        if pid_ns == my_ns || pid_ns == 0 || my_ns == 0 {
            return Some(pid);
        }
        if my_ns != process::INIT_PID_NS {
            return None;
        }
        let identity = (pid_ns, pid, start_time);
        if let Some(&host) = self.found.get(&identity) {
            if is(proc_root, host as i32, identity) {
                return Some(host);
            }
            self.found.remove(&identity);
        }
        self.scans += 1;
        let host = std::fs::read_dir(proc_root)
            .ok()?
            .flatten()
            .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
            .find(|&host| is(proc_root, host, identity))?;
        let host = u32::try_from(host).ok()?;
        // Identities of dead processes are never asked about again: keep the map small.
        if self.found.len() >= 4096 {
            self.found.clear();
        }
        self.found.insert(identity, host);
        Some(host)
    }

    /// This process's PID namespace, read again only in a new process (after a fork).
    fn my_ns(&mut self, proc_root: &Path) -> u64 {
        // SAFETY: getpid has no preconditions.
        let me = unsafe { libc::getpid() } as u32;
        match self.mine {
            Some((pid, ns)) if pid == me => ns,
            _ => {
                let ns = process::pid_namespace_in(proc_root, "self").unwrap_or(0);
                self.mine = Some((me, ns));
                ns
            }
        }
    }
}

/// Whether host PID `host` is the process `identity`: its namespace, its innermost
/// `NSpid` and its start time.
fn is(proc_root: &Path, host: i32, (pid_ns, pid, start_time): Identity) -> bool {
    process::pid_namespace_in(proc_root, &host.to_string()) == Some(pid_ns)
        && process::ns_pids_in(proc_root, host).and_then(|levels| levels.last().copied())
            == Some(pid as i32)
        && process::start_time_in(proc_root, host) == Some(start_time)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// A stand-in `/proc` entry: its namespace link, `NSpid` and start time.
    fn entry(root: &Path, host: i32, pid_ns: u64, inner: i32, start_time: u64) {
        let dir = root.join(host.to_string());
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("ns")).expect("entry");
        std::os::unix::fs::symlink(format!("pid:[{pid_ns}]"), dir.join("ns/pid")).expect("ns");
        std::fs::write(
            dir.join("status"),
            format!("Name:\tx\nNSpid:\t{host}\t{inner}\n"),
        )
        .expect("status");
        let fields = (4..=21)
            .map(|f| f.to_string())
            .collect::<Vec<_>>()
            .join(" ");
        std::fs::write(
            dir.join("stat"),
            format!("{host} (x y) S {fields} {start_time} 0\n"),
        )
        .expect("stat");
    }

    /// A host of 200 processes in the initial namespace, and ours (host PID 4242, PID 7
    /// in namespace 4026532000, started at 555).
    fn host() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().to_path_buf();
        std::fs::create_dir_all(root.join("self/ns")).expect("self");
        std::os::unix::fs::symlink(
            format!("pid:[{}]", process::INIT_PID_NS),
            root.join("self/ns/pid"),
        )
        .expect("self ns");
        for host in 1000..1200 {
            entry(&root, host, process::INIT_PID_NS, host, 1);
        }
        entry(&root, 4242, 4_026_532_000, 7, 555);
        (dir, root)
    }

    #[test]
    fn a_host_pid_is_found_by_one_scan_and_then_only_checked() {
        let (_dir, root) = host();
        let mut pids = HostPids::default();
        for _ in 0..100 {
            assert_eq!(pids.visible_pid(&root, 7, 4_026_532_000, 555), Some(4242));
        }
        assert_eq!(
            pids.scans, 1,
            "a tick's NVML calls do not scan /proc again for a known process"
        );
        // Processes of our own namespace are their own PID: no scan at all.
        assert_eq!(
            pids.visible_pid(&root, 1005, process::INIT_PID_NS, 1),
            Some(1005)
        );
        assert_eq!(pids.scans, 1);
    }

    #[test]
    fn a_checked_answer_is_the_scans_when_the_process_is_gone_or_replaced() {
        let (_dir, root) = host();
        let mut pids = HostPids::default();
        assert_eq!(pids.visible_pid(&root, 7, 4_026_532_000, 555), Some(4242));
        // Host PID 4242 now holds another process (another start time): not ours, and
        // ours is nowhere, as a fresh scan says.
        entry(&root, 4242, 4_026_532_000, 7, 556);
        assert_eq!(pids.visible_pid(&root, 7, 4_026_532_000, 555), None);
        assert_eq!(
            HostPids::default().visible_pid(&root, 7, 4_026_532_000, 555),
            None
        );
        assert_eq!(pids.scans, 2, "a failed check scans again");
        // Ours reappears under another host PID (a stand-in's trick, not the kernel's):
        // the scan finds it there.
        entry(&root, 4343, 4_026_532_000, 7, 555);
        assert_eq!(pids.visible_pid(&root, 7, 4_026_532_000, 555), Some(4343));
        // A process of a namespace we cannot see from a child namespace: none.
        std::fs::remove_file(root.join("self/ns/pid")).expect("unlink");
        std::os::unix::fs::symlink("pid:[4026532999]", root.join("self/ns/pid")).expect("ns");
        let mut inside = HostPids::default();
        assert_eq!(inside.visible_pid(&root, 7, 4_026_532_000, 555), None);
    }
}
