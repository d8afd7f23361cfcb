//! Running totals of each container's counters (kernel launches, GPU busy time), so the
//! metrics built on them only ever go up.
//!
//! A usage region holds one slot per live CUDA process, and a slot's counters are that
//! process's alone: when the process exits its slot is cleared, and a new process may
//! take it. Summing the live slots would make a container's total drop at every exit.
//! So the plugin follows each process instance (slot, PID, start time) from one
//! snapshot to the next: while it lives its latest figures count; once it is gone they
//! move into the container's retired total. The book is kept in
//! `<state_dir>/usage-totals.json` (written atomically, at most every
//! [`SAVE_EVERY`]), so a plugin restart loses nothing either. What a process did after
//! the last snapshot before its exit is missed: the daemon takes one a second.
//!
//! Figures a tenant writes are its own business: a counter that goes backwards is taken
//! as a new process, so a total never decreases. That rule holds only if copies are
//! folded in the order they were taken: an older copy folded after a newer one would
//! read as counters going back, and count the process again. So a region is copied and
//! folded under the book's one lock ([`UsageTotals::observe_region`]), whoever asks (the
//! 1 s loop, any number of parallel scrapes).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use vgpu_contract::region::ProcessUsage;
use vgpu_contract::snapshot::RegionSnapshot;

use vgpu_node_agent::persist::write_atomically;

/// The book's file name in the state folder.
pub const TOTALS_FILE: &str = "usage-totals.json";
/// How often a changed book is written at most.
pub const SAVE_EVERY: Duration = Duration::from_secs(10);

/// One device's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// Kernel launches.
    pub launches: u64,
    /// GPU busy time, nanoseconds.
    pub busy_ns: u64,
}

impl Counters {
    fn add(self, other: Counters) -> Counters {
        Counters {
            launches: self.launches.saturating_add(other.launches),
            busy_ns: self.busy_ns.saturating_add(other.busy_ns),
        }
    }

    fn below(self, other: Counters) -> bool {
        self.launches < other.launches || self.busy_ns < other.busy_ns
    }
}

/// A process instance last seen live, and its figures then.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Seen {
    slot: usize,
    pid: i32,
    start_time: u64,
    counters: Counters,
}

/// One device of one allocation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct DeviceBook {
    /// What processes that are gone did.
    retired: Counters,
    /// The live processes, as last seen.
    live: Vec<Seen>,
}

impl DeviceBook {
    fn total(&self) -> Counters {
        self.live
            .iter()
            .fold(self.retired, |sum, seen| sum.add(seen.counters))
    }

    /// Folds in the processes live now; true when anything changed.
    fn observe(&mut self, now: Vec<Seen>) -> bool {
        let mut changed = false;
        for before in std::mem::take(&mut self.live) {
            let same = now.iter().find(|seen| {
                seen.slot == before.slot
                    && seen.pid == before.pid
                    && seen.start_time == before.start_time
            });
            match same {
                Some(seen) if !seen.counters.below(before.counters) => {}
                // Gone, or its counters went back: what it had counted is kept.
                _ => {
                    self.retired = self.retired.add(before.counters);
                    changed = true;
                }
            }
        }
        changed |= self.live != now;
        self.live = now;
        changed
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Book {
    /// Allocation ID -> per device position.
    allocations: BTreeMap<String, Vec<DeviceBook>>,
}

/// The running totals of every allocation.
pub struct UsageTotals {
    path: PathBuf,
    book: Mutex<(Book, bool, Option<Instant>)>,
}

impl UsageTotals {
    /// Loads the book from `<state_dir>/usage-totals.json`; a missing or unreadable one
    /// starts empty (with a warning for the latter: totals then restart from the live
    /// figures, which Prometheus reads as a counter reset).
    pub fn load(state_dir: &Path) -> UsageTotals {
        let path = state_dir.join(TOTALS_FILE);
        let book = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|err| {
                tracing::warn!(file = %path.display(), error = %err, "usage totals unreadable; starting again");
                Book::default()
            }),
            Err(_) => Book::default(),
        };
        UsageTotals {
            path,
            book: Mutex::new((book, false, None)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (Book, bool, Option<Instant>)> {
        self.book
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Copies the usage region of allocation `id` at `region` and folds its live
    /// processes into the totals (`devices` positions), under one lock: the copy, its
    /// live processes and the totals per position after it; `None` when the region
    /// cannot be read (the totals then stay as they were: [`UsageTotals::totals`]).
    pub fn observe_region(
        &self,
        id: &str,
        region: &Path,
        devices: usize,
    ) -> Option<(RegionSnapshot, Vec<ProcessUsage>, Vec<Counters>)> {
        self.observe_with(id, devices, || RegionSnapshot::read(region).ok())
    }

    /// [`UsageTotals::observe_region`] with the copy taken by `read`, called under the
    /// book's one lock: a scrape's `read` copies the region once for both books, folding
    /// it into the quota totals under their lock too
    /// ([`vgpu_node_agent::quota_watch::QuotaTotals::observe_with`]; the one lock order:
    /// this book's, then theirs). `read` must not take this lock. `None` when `read`
    /// gives no copy.
    pub fn observe_with(
        &self,
        id: &str,
        devices: usize,
        read: impl FnOnce() -> Option<RegionSnapshot>,
    ) -> Option<(RegionSnapshot, Vec<ProcessUsage>, Vec<Counters>)> {
        let mut guard = self.lock();
        let snapshot = read()?;
        let processes = snapshot.processes();
        let totals = Self::fold(&mut guard, id, &processes, devices);
        Some((snapshot, processes, totals))
    }

    /// Folds the live processes of allocation `id` (from a copy of its region taken
    /// after every copy folded before, `devices` positions) into its totals; returns the
    /// totals per position.
    pub fn observe(&self, id: &str, processes: &[ProcessUsage], devices: usize) -> Vec<Counters> {
        Self::fold(&mut self.lock(), id, processes, devices)
    }

    fn fold(
        guard: &mut (Book, bool, Option<Instant>),
        id: &str,
        processes: &[ProcessUsage],
        devices: usize,
    ) -> Vec<Counters> {
        let (book, dirty, _) = guard;
        let books = book.allocations.entry(id.to_string()).or_default();
        if books.len() < devices {
            books.resize_with(devices, DeviceBook::default);
        }
        let mut totals = Vec::with_capacity(books.len());
        for (position, device) in books.iter_mut().enumerate() {
            let now: Vec<Seen> = processes
                .iter()
                .map(|process| Seen {
                    slot: process.slot,
                    pid: process.pid,
                    start_time: process.start_time,
                    counters: Counters {
                        launches: process.launches.get(position).copied().unwrap_or(0),
                        busy_ns: process.busy_ns.get(position).copied().unwrap_or(0),
                    },
                })
                .collect();
            *dirty |= device.observe(now);
            totals.push(device.total());
        }
        totals
    }

    /// The totals of allocation `id` as last observed (its region unreadable now).
    pub fn totals(&self, id: &str) -> Vec<Counters> {
        self.lock()
            .0
            .allocations
            .get(id)
            .map(|devices| devices.iter().map(DeviceBook::total).collect())
            .unwrap_or_default()
    }

    /// Forgets allocations that are gone.
    pub fn retain(&self, known: &[String]) {
        let mut guard = self.lock();
        let (book, dirty, _) = &mut *guard;
        let before = book.allocations.len();
        book.allocations.retain(|id, _| known.contains(id));
        *dirty |= book.allocations.len() != before;
    }

    /// Writes the book when it changed and the last write is older than [`SAVE_EVERY`]
    /// (always when `now_or_never`). The file is written after the lock is released.
    pub fn save(&self, now_or_never: bool) -> anyhow::Result<()> {
        let bytes = {
            let mut guard = self.lock();
            let (book, dirty, saved) = &mut *guard;
            let due = now_or_never || saved.is_none_or(|at| at.elapsed() >= SAVE_EVERY);
            if !*dirty || !due {
                return Ok(());
            }
            *dirty = false;
            *saved = Some(Instant::now());
            serde_json::to_vec(book)?
        };
        write_atomically(&self.path, &bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn process(slot: usize, pid: i32, launches: u64, busy_ns: u64) -> ProcessUsage {
        ProcessUsage {
            slot,
            pid,
            host_pid: 0,
            start_time: 1000 + pid as u64,
            pid_ns: 0,
            used: vec![0],
            context: vec![0],
            busy_ns: vec![busy_ns],
            launches: vec![launches],
        }
    }

    #[test]
    fn totals_never_drop_when_processes_exit_and_slots_are_reused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let totals = UsageTotals::load(dir.path());
        let seen = |processes: &[ProcessUsage]| totals.observe("a1", processes, 1)[0];
        assert_eq!(seen(&[process(0, 10, 5, 500)]).launches, 5);
        let both = seen(&[process(0, 10, 7, 700), process(1, 11, 3, 300)]);
        assert_eq!(
            both,
            Counters {
                launches: 10,
                busy_ns: 1000
            }
        );
        // Process 10 exits: its slot is cleared, its 7 launches stay counted.
        let after_exit = seen(&[process(1, 11, 4, 400)]);
        assert_eq!(
            after_exit,
            Counters {
                launches: 11,
                busy_ns: 1100
            }
        );
        // A new process takes slot 0 and starts from zero.
        let reused = seen(&[process(0, 12, 1, 100), process(1, 11, 4, 400)]);
        assert_eq!(
            reused,
            Counters {
                launches: 12,
                busy_ns: 1200
            }
        );
        // A tenant writing a smaller figure into a live slot cannot lower the total.
        let lowered = seen(&[process(0, 12, 0, 0), process(1, 11, 4, 400)]);
        assert_eq!(
            lowered,
            Counters {
                launches: 12,
                busy_ns: 1200
            }
        );
        // Everyone gone.
        assert_eq!(
            seen(&[]),
            Counters {
                launches: 12,
                busy_ns: 1200
            }
        );
        assert_eq!(
            totals.totals("a1"),
            vec![Counters {
                launches: 12,
                busy_ns: 1200
            }]
        );
    }

    #[test]
    fn the_book_survives_a_restart_and_forgets_collected_allocations() {
        let dir = tempfile::tempdir().expect("tempdir");
        let totals = UsageTotals::load(dir.path());
        totals.observe("a1", &[process(0, 10, 5, 500)], 1);
        totals.observe("a1", &[process(1, 11, 2, 200)], 1);
        totals.observe("a2", &[process(0, 20, 9, 900)], 1);
        totals.save(false).expect("save");
        // The restarted plugin finds process 11 still live and counts it once.
        let restarted = UsageTotals::load(dir.path());
        assert_eq!(
            restarted.observe("a1", &[process(1, 11, 3, 300)], 1),
            vec![Counters {
                launches: 8,
                busy_ns: 800
            }]
        );
        restarted.retain(&["a1".to_string()]);
        assert!(restarted.totals("a2").is_empty());
        // Nothing changed since the last write and it is recent: no write.
        restarted.save(true).expect("save");
        let modified = std::fs::metadata(dir.path().join(TOTALS_FILE))
            .and_then(|meta| meta.modified())
            .expect("written");
        restarted.save(false).expect("no-op");
        assert_eq!(
            std::fs::metadata(dir.path().join(TOTALS_FILE))
                .and_then(|meta| meta.modified())
                .expect("still there"),
            modified
        );
        std::fs::write(dir.path().join(TOTALS_FILE), b"{ corrupt").expect("corrupt");
        assert!(UsageTotals::load(dir.path()).totals("a1").is_empty());
    }
}
