//! The host's memory backstop: each tick the coordinator compares what the card itself
//! says each container's processes hold (NVML's per-process figures, by host PID) with
//! the container's quota. The shims count at every call, but what a process gets past
//! them (a driver reservation nobody could price, a `dlopen` of the real driver) still
//! shows on the card.
//!
//! A container over its quota is reported: one [`OverQuota`] per container and card in
//! the tick's report (the callers log it and count it in their metrics) and in the
//! record file [`RECORD_FILE`] beside the card views (YAML, replaced by rename each tick
//! while any container is over, removed once none is), which is what a Kubernetes
//! Event is made from. With the container's explicit `over_quota: kill`, its newest
//! process is killed (SIGKILL) once it has been over for [`KILL_AFTER_NS`], as the
//! kernel's OOM killer does; a figure over for less (a load the shim is undoing) is only
//! reported.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use vgpu_contract::config::OverQuota as Policy;

/// The record of the containers over their quota, in the coordinator's folder.
pub const RECORD_FILE: &str = "over-quota.yaml";
/// How long a container must have been over its quota before `kill` acts.
pub const KILL_AFTER_NS: u64 = 1_000_000_000;

/// One process of a container as the card lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessFigure {
    /// Its PID on the host.
    pub host_pid: u32,
    /// Its start time (clock ticks after boot, `/proc/PID/stat` field 22).
    pub start_time: u64,
    /// Device memory the card says it holds, bytes.
    pub used_bytes: u64,
}

/// What was done about a container over its quota.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Reported only (the default policy, or `kill` within its grace time).
    Reported,
    /// Its newest process was sent SIGKILL.
    Killed,
}

/// A container whose processes hold more than its quota on a card.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OverQuota {
    /// The container (`container_id`).
    pub container: String,
    /// The card.
    pub uuid: String,
    /// What its processes hold together, as the card says, bytes.
    pub used_bytes: u64,
    /// Its quota on the card, bytes.
    pub limit_bytes: u64,
    /// Its processes the card lists, newest last.
    pub processes: Vec<ProcessFigure>,
    /// Its policy.
    pub policy: Policy,
    /// What was done this tick.
    pub action: Action,
    /// The process killed, with `Action::Killed`.
    pub killed_pid: Option<u32>,
    /// How long it has been over its quota, ns.
    pub over_for_ns: u64,
}

impl OverQuota {
    /// One log line.
    pub fn render(&self) -> String {
        let mib = |bytes: u64| bytes as f64 / (1u64 << 20) as f64;
        let pids: Vec<String> = self
            .processes
            .iter()
            .map(|p| format!("{}:{:.0}MiB", p.host_pid, mib(p.used_bytes)))
            .collect();
        let action = match (self.action, self.killed_pid) {
            (Action::Killed, Some(pid)) => format!("killed its newest process {pid}"),
            _ => "reported".to_string(),
        };
        format!(
            "container {} holds {:.0} MiB on card {}, over its quota of {:.0} MiB (the card's figures, processes {}); {action}",
            self.container,
            mib(self.used_bytes),
            self.uuid,
            mib(self.limit_bytes),
            pids.join(" "),
        )
    }
}

/// The record file's contents.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Milliseconds since the Unix epoch at which it was written.
    pub written_unix_ms: u64,
    /// The containers over their quota at that tick.
    pub over_quota: Vec<OverQuota>,
}

impl Record {
    /// The record at `dir/over-quota.yaml`; `None` when there is none (no container is
    /// over its quota) or it cannot be read.
    pub fn read(dir: &Path) -> Option<Record> {
        let text = std::fs::read_to_string(dir.join(RECORD_FILE)).ok()?;
        serde_saphyr::from_str(&text).ok()
    }

    /// Writes the record into `dir` (by rename), or removes it when nobody is over.
    pub fn write(&self, dir: &Path) -> std::io::Result<()> {
        let path = dir.join(RECORD_FILE);
        if self.over_quota.is_empty() {
            return match std::fs::remove_file(&path) {
                Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(error),
                _ => Ok(()),
            };
        }
        let staging: PathBuf = dir.join(format!(".{RECORD_FILE}.{}.tmp", std::process::id()));
        let text = serde_saphyr::to_string(self).map_err(std::io::Error::other)?;
        std::fs::write(&staging, text)?;
        std::fs::rename(&staging, &path)
    }
}

/// What the card says a container's processes (`ours`: host PID and start time) hold
/// together, from the card's list (`card`: host PID and bytes); the processes listed,
/// oldest first.
pub fn container_figure(ours: &[(u32, u64)], card: &[(u32, u64)]) -> (u64, Vec<ProcessFigure>) {
    let mut listed: Vec<ProcessFigure> = ours
        .iter()
        .filter_map(|&(host_pid, start_time)| {
            let used: u64 = card
                .iter()
                .filter(|(pid, _)| *pid == host_pid)
                .map(|(_, bytes)| *bytes)
                .fold(0, u64::saturating_add);
            card.iter()
                .any(|(pid, _)| *pid == host_pid)
                .then_some(ProcessFigure {
                    host_pid,
                    start_time,
                    used_bytes: used,
                })
        })
        .collect();
    listed.sort_by_key(|p| (p.start_time, p.host_pid));
    listed.dedup_by_key(|p| p.host_pid);
    let total = listed
        .iter()
        .map(|p| p.used_bytes)
        .fold(0, u64::saturating_add);
    (total, listed)
}

/// Whether `policy` kills now, the container having been over for `over_for_ns`.
pub fn kills(policy: Policy, over_for_ns: u64) -> bool {
    policy == Policy::Kill && over_for_ns >= KILL_AFTER_NS
}

/// Sends SIGKILL to `process` if the host PID is still the process that started at its
/// start time (under `proc_root`, the host's `/proc`); whether it was sent.
pub fn kill(proc_root: &Path, process: &ProcessFigure) -> bool {
    let Ok(pid) = i32::try_from(process.host_pid) else {
        return false;
    };
    if pid <= 1 || vgpu_contract::process::start_time_in(proc_root, pid) != Some(process.start_time)
    {
        return false;
    }
    // SAFETY: kill(2) with a PID just checked to be the process the card listed; no
    // memory is involved.
    unsafe { libc::kill(pid, libc::SIGKILL) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_container_is_what_the_card_lists_under_its_processes() {
        // Ours: 100 (started at 50) and 200 (started at 10); 300 is a neighbour's.
        let ours = [(100, 50), (200, 10), (400, 60)];
        let card = [(100, 700 * MIB), (300, 5000 * MIB), (200, 600 * MIB)];
        let (total, listed) = container_figure(&ours, &card);
        assert_eq!(total, 1300 * MIB);
        let pids: Vec<u32> = listed.iter().map(|p| p.host_pid).collect();
        assert_eq!(
            pids,
            [200, 100],
            "oldest first; 400 holds nothing on the card"
        );
        assert_eq!(container_figure(&[], &card).0, 0);
    }

    #[test]
    fn kill_is_opt_in_and_waits_out_its_grace_time() {
        assert!(!kills(Policy::Report, u64::MAX), "the default only reports");
        assert!(!kills(Policy::Kill, KILL_AFTER_NS - 1));
        assert!(kills(Policy::Kill, KILL_AFTER_NS));
    }

    #[test]
    fn a_reused_pid_is_not_killed() {
        let me = vgpu_contract::process::current();
        let stranger = ProcessFigure {
            host_pid: me.pid as u32,
            start_time: me.start_time + 1,
            used_bytes: 0,
        };
        assert!(!kill(Path::new("/proc"), &stranger), "another start time");
        let init = ProcessFigure {
            host_pid: 1,
            start_time: 0,
            used_bytes: 0,
        };
        assert!(!kill(Path::new("/proc"), &init));
    }

    #[test]
    fn the_record_is_written_while_someone_is_over_and_removed_after() {
        let dir = tempfile::tempdir().expect("tempdir");
        let over = OverQuota {
            container: "alloc-1".into(),
            uuid: "GPU-1".into(),
            used_bytes: 1500 * MIB,
            limit_bytes: 1024 * MIB,
            processes: vec![ProcessFigure {
                host_pid: 42,
                start_time: 7,
                used_bytes: 1500 * MIB,
            }],
            policy: Policy::Report,
            action: Action::Reported,
            killed_pid: None,
            over_for_ns: 0,
        };
        assert!(over.render().contains(
            "container alloc-1 holds 1500 MiB on card GPU-1, over its quota of 1024 MiB"
        ));
        let record = Record {
            written_unix_ms: 1,
            over_quota: vec![over],
        };
        record.write(dir.path()).expect("write");
        assert_eq!(Record::read(dir.path()), Some(record));
        Record::default().write(dir.path()).expect("remove");
        assert_eq!(Record::read(dir.path()), None);
        Record::default()
            .write(dir.path())
            .expect("nothing to remove");
    }
}
