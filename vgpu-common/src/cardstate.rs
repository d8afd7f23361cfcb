//! Per-card compute state shared by every container on one physical GPU: a small
//! file-backed shared mapping at `<card_state_dir>/<uuid>.card`, written by the compute
//! limiter inside each CUDA process (libcuda-shim) and read by the others and by the
//! host daemon.
//!
//! Layout (version 1), little-endian, fixed size: a 256-byte header (magic, version,
//! layout fingerprint, length, the card's UUID and a checksum over those immutable
//! fields) and `MAX_ENTRIES` cache-line-aligned entries, one per process that limits
//! compute on the card. An entry holds its owner (PID, state, start time, PID
//! namespace), the container it belongs to, a heartbeat, the last time it had work, and
//! its recent busy fraction, demand and limit.
//!
//! Like the usage region it is lock-free after creation: every field is an atomic, a
//! process that dies mid-write leaves nothing locked, and an entry whose heartbeat is
//! older than `EXPIRY_NS` (or whose owner is gone) is ignored by readers and may be taken
//! over. A file with a wrong magic, version, fingerprint, length, UUID or checksum is
//! rebuilt, never trusted.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

pub use crate::mapped::fnv1a;
use crate::mapped::{FNV_OFFSET, MappedFile};
use crate::process::{self, Identity};

/// Entries per card (processes that limit compute on it at once).
pub const MAX_ENTRIES: usize = 128;
/// Layout version; bump on any change of the structs below.
pub const VERSION: u32 = 1;
/// An entry whose heartbeat is older than this is dead to readers and may be reused.
pub const EXPIRY_NS: u64 = 3_000_000_000;
const MAGIC: [u8; 8] = *b"VGPUCARD";
const HEADER_LEN: usize = 256;
const UUID_LEN: usize = 96;

const STATE_FREE: u64 = 0;
const STATE_CLAIMING: u64 = 1;
const STATE_LIVE: u64 = 2;

#[repr(C)]
struct Header {
    magic: [u8; 8],
    version: u32,
    entry_count: u32,
    layout: u64,
    total_len: u64,
    uuid: [u8; UUID_LEN],
    checksum: u64,
}

#[repr(C, align(64))]
struct Entry {
    /// `pid << 32 | state`.
    owner: AtomicU64,
    start_time: AtomicU64,
    pid_ns: AtomicU64,
    /// Which container (a hash of its usage region path) the process belongs to.
    container: AtomicU64,
    /// CLOCK_MONOTONIC nanoseconds of the last publish.
    heartbeat_ns: AtomicU64,
    /// CLOCK_MONOTONIC nanoseconds of the last publish that saw GPU work or demand.
    active_ns: AtomicU64,
    /// Measured busy fraction of the card over the last publish interval, per mille.
    busy_permille: AtomicU32,
    /// Busy plus throttled time over the last interval, per mille: what it would use.
    demand_permille: AtomicU32,
    /// The share it is entitled to, percent.
    limit_percent: AtomicU32,
    /// 0 hard, 1 soft.
    mode: AtomicU32,
}

const ENTRIES_OFFSET: usize = HEADER_LEN;
/// Bytes of a card state file.
pub const CARD_LEN: usize = ENTRIES_OFFSET + MAX_ENTRIES * std::mem::size_of::<Entry>();
const _: () = assert!(std::mem::size_of::<Header>() <= HEADER_LEN);

const fn layout_fingerprint() -> u64 {
    let parts = [
        VERSION as u64,
        MAX_ENTRIES as u64,
        std::mem::size_of::<Header>() as u64,
        std::mem::size_of::<Entry>() as u64,
        0x4341_5244, // "CARD"
    ];
    let mut hash = FNV_OFFSET;
    let mut i = 0;
    while i < parts.len() {
        hash ^= parts[i];
        hash = hash.wrapping_mul(0x0100_0000_01b3);
        i += 1;
    }
    hash
}

/// A container id for a usage region path (every process of a container shares it).
pub fn container_id(region_path: &Path) -> u64 {
    fnv1a(region_path.as_os_str().as_encoded_bytes(), FNV_OFFSET).max(1)
}

/// CLOCK_MONOTONIC nanoseconds: one clock for every process of the host, whatever its
/// namespaces.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Why a card state file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum CardStateError {
    #[error("card state {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("card state {path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error("card state: `{0}` is not a usable card UUID for a file name")]
    BadUuid(String),
    #[error("card state {0}: all {MAX_ENTRIES} entries are held by live processes")]
    Full(PathBuf),
}

pub use crate::mapped::OpenOutcome;

/// An entry this process holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryId(usize);

impl EntryId {
    pub fn index(self) -> usize {
        self.0
    }
}

/// What a process publishes about itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub now_ns: u64,
    pub busy_permille: u32,
    pub demand_permille: u32,
    /// Whether it had GPU work (or wanted to) during the interval.
    pub active: bool,
    pub limit_percent: u32,
    pub soft: bool,
}

/// One live entry, for readers (the host daemon, `vgpu smi`, tests).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CardEntry {
    pub index: usize,
    pub pid: i32,
    pub container: u64,
    pub heartbeat_ns: u64,
    pub active_ns: u64,
    pub busy_permille: u32,
    pub demand_permille: u32,
    pub limit_percent: u32,
    pub soft: bool,
}

/// An open card state file. The mapping lives as long as the value.
pub struct CardState {
    map: MappedFile,
}

fn valid_uuid(uuid: &str) -> bool {
    !uuid.is_empty()
        && uuid.len() < UUID_LEN
        && !uuid.starts_with('.')
        && uuid
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b':' | b'.'))
}

impl CardState {
    /// `<dir>/<uuid>.card`.
    pub fn path_for(dir: &Path, uuid: &str) -> Result<PathBuf, CardStateError> {
        if !valid_uuid(uuid) {
            return Err(CardStateError::BadUuid(uuid.to_string()));
        }
        Ok(dir.join(format!("{uuid}.card")))
    }

    /// Opens (creating the folder and file, or rebuilding a bad file) the state of card `uuid`.
    pub fn open(dir: &Path, uuid: &str) -> Result<(CardState, OpenOutcome), CardStateError> {
        let path = CardState::path_for(dir, uuid)?;
        let io_err = |source| CardStateError::Io {
            path: path.clone(),
            source,
        };
        if !dir.is_dir() {
            std::fs::create_dir_all(dir).map_err(io_err)?;
            // Best effort: processes of every container user must be able to join.
            let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o1777));
        }
        let (map, found, lock) = MappedFile::open_or_create(&path, CARD_LEN).map_err(io_err)?;
        let state = CardState { map };
        let outcome = found.settle(
            &state.map,
            || state.initialise(uuid),
            || state.check().and_then(|()| state.check_uuid(uuid)),
        );
        drop(lock);
        Ok((state, outcome))
    }

    /// Opens an existing file without changing it (readers).
    pub fn open_existing(path: &Path) -> Result<CardState, CardStateError> {
        let map = MappedFile::open_existing(path, CARD_LEN).map_err(|error| match error {
            Ok(len) => CardStateError::Invalid {
                path: path.to_path_buf(),
                reason: format!("length {len}, expected {CARD_LEN}"),
            },
            Err(source) => CardStateError::Io {
                path: path.to_path_buf(),
                source,
            },
        })?;
        let state = CardState { map };
        state.check().map_err(|reason| CardStateError::Invalid {
            path: path.to_path_buf(),
            reason,
        })?;
        Ok(state)
    }

    pub fn path(&self) -> &Path {
        self.map.path()
    }

    fn header(&self) -> &Header {
        // SAFETY: the mapping is CARD_LEN bytes, page aligned; Header fits the first bytes.
        unsafe { &*(self.map.base() as *const Header) }
    }

    fn entry(&self, index: usize) -> &Entry {
        debug_assert!(index < MAX_ENTRIES);
        // SAFETY: entries follow the header; index < MAX_ENTRIES stays in the mapping;
        // Entry is made of atomics, valid for any bit pattern.
        unsafe { &*(self.map.base().add(ENTRIES_OFFSET) as *const Entry).add(index) }
    }

    fn checksum(header: &Header) -> u64 {
        let mut hash = fnv1a(&header.magic, FNV_OFFSET);
        hash = fnv1a(&header.version.to_le_bytes(), hash);
        hash = fnv1a(&header.entry_count.to_le_bytes(), hash);
        hash = fnv1a(&header.layout.to_le_bytes(), hash);
        hash = fnv1a(&header.total_len.to_le_bytes(), hash);
        fnv1a(&header.uuid, hash)
    }

    fn initialise(&self, uuid: &str) {
        let header = self.map.base() as *mut Header;
        // SAFETY: under the init lock nobody else writes the header; raw writes avoid a
        // &mut aliasing readers' shared references.
        unsafe {
            let bytes = uuid.as_bytes();
            let n = bytes.len().min(UUID_LEN - 1);
            let mut id = [0u8; UUID_LEN];
            id[..n].copy_from_slice(&bytes[..n]);
            (*header).uuid = id;
            (*header).version = VERSION;
            (*header).entry_count = MAX_ENTRIES as u32;
            (*header).layout = layout_fingerprint();
            (*header).total_len = CARD_LEN as u64;
            (*header).magic = MAGIC;
            (*header).checksum = CardState::checksum(&*header);
        }
        std::sync::atomic::fence(Ordering::SeqCst);
    }

    fn check(&self) -> Result<(), String> {
        let header = self.header();
        if header.magic != MAGIC {
            return Err("bad magic (not a vgpu card state file)".into());
        }
        if header.version != VERSION {
            return Err(format!(
                "version {} (this build reads {VERSION})",
                header.version
            ));
        }
        if header.layout != layout_fingerprint() || header.entry_count as usize != MAX_ENTRIES {
            return Err("layout fingerprint differs".into());
        }
        if header.total_len != CARD_LEN as u64 {
            return Err(format!("recorded length {}", header.total_len));
        }
        if header.checksum != CardState::checksum(header) {
            return Err("header checksum mismatch".into());
        }
        Ok(())
    }

    fn check_uuid(&self, uuid: &str) -> Result<(), String> {
        if self.uuid() == uuid {
            Ok(())
        } else {
            Err(format!("written for card {}", self.uuid()))
        }
    }

    /// The card this file describes.
    pub fn uuid(&self) -> String {
        let raw = &self.header().uuid;
        let end = raw.iter().position(|b| *b == 0).unwrap_or(UUID_LEN);
        String::from_utf8_lossy(&raw[..end]).into_owned()
    }

    /// Whether the entry's owner is gone or silent for longer than `EXPIRY_NS`.
    fn is_stale(&self, entry: &Entry, owner: u64, now_ns: u64) -> bool {
        let heartbeat = entry.heartbeat_ns.load(Ordering::SeqCst);
        if now_ns.saturating_sub(heartbeat) > EXPIRY_NS {
            return true;
        }
        let my_ns = process::pid_namespace_in(Path::new("/proc"), "self").unwrap_or(0);
        owner & 0xff == STATE_LIVE
            && entry.pid_ns.load(Ordering::SeqCst) == my_ns
            && !process::is_alive(
                (owner >> 32) as i32,
                entry.start_time.load(Ordering::SeqCst),
            )
    }

    /// Takes an entry for `me` in `container`: a free one, else one whose owner is gone.
    pub fn join(
        &self,
        me: &Identity,
        container: u64,
        now_ns: u64,
    ) -> Result<EntryId, CardStateError> {
        let claiming = ((me.pid as u32 as u64) << 32) | STATE_CLAIMING;
        for pass in 0..2 {
            for index in 0..MAX_ENTRIES {
                let entry = self.entry(index);
                let owner = entry.owner.load(Ordering::SeqCst);
                let takeable = match owner & 0xff {
                    STATE_FREE => true,
                    _ => pass == 1 && self.is_stale(entry, owner, now_ns),
                };
                if takeable
                    && entry
                        .owner
                        .compare_exchange(owner, claiming, Ordering::SeqCst, Ordering::SeqCst)
                        .is_ok()
                {
                    entry.start_time.store(me.start_time, Ordering::SeqCst);
                    entry.pid_ns.store(me.pid_ns, Ordering::SeqCst);
                    entry.container.store(container, Ordering::SeqCst);
                    entry.heartbeat_ns.store(now_ns, Ordering::SeqCst);
                    entry.active_ns.store(0, Ordering::SeqCst);
                    entry.busy_permille.store(0, Ordering::SeqCst);
                    entry.demand_permille.store(0, Ordering::SeqCst);
                    entry.owner.store(
                        ((me.pid as u32 as u64) << 32) | STATE_LIVE,
                        Ordering::SeqCst,
                    );
                    return Ok(EntryId(index));
                }
            }
        }
        Err(CardStateError::Full(self.map.path().to_path_buf()))
    }

    /// Publishes this process's recent figures and heartbeat.
    pub fn publish(&self, id: EntryId, report: &Report) {
        let entry = self.entry(id.0);
        entry
            .busy_permille
            .store(report.busy_permille.min(1000), Ordering::Relaxed);
        entry
            .demand_permille
            .store(report.demand_permille.min(1000), Ordering::Relaxed);
        entry
            .limit_percent
            .store(report.limit_percent, Ordering::Relaxed);
        entry.mode.store(report.soft as u32, Ordering::Relaxed);
        if report.active {
            entry.active_ns.store(report.now_ns, Ordering::SeqCst);
        }
        entry.heartbeat_ns.store(report.now_ns, Ordering::SeqCst);
    }

    /// Gives the entry back (clean exit).
    pub fn leave(&self, id: EntryId) {
        let entry = self.entry(id.0);
        entry.active_ns.store(0, Ordering::SeqCst);
        entry.owner.store(STATE_FREE, Ordering::SeqCst);
    }

    /// Whether a process of another container had work within `within_ns` of `now_ns`.
    pub fn others_active(&self, container: u64, now_ns: u64, within_ns: u64) -> bool {
        (0..MAX_ENTRIES).any(|index| {
            let entry = self.entry(index);
            entry.owner.load(Ordering::SeqCst) & 0xff == STATE_LIVE
                && entry.container.load(Ordering::SeqCst) != container
                && now_ns.saturating_sub(entry.active_ns.load(Ordering::SeqCst)) <= within_ns
                && now_ns.saturating_sub(entry.heartbeat_ns.load(Ordering::SeqCst)) <= EXPIRY_NS
        })
    }

    /// Every live, fresh entry.
    pub fn entries(&self, now_ns: u64) -> Vec<CardEntry> {
        (0..MAX_ENTRIES)
            .filter_map(|index| {
                let entry = self.entry(index);
                let owner = entry.owner.load(Ordering::SeqCst);
                let heartbeat = entry.heartbeat_ns.load(Ordering::SeqCst);
                (owner & 0xff == STATE_LIVE && now_ns.saturating_sub(heartbeat) <= EXPIRY_NS).then(
                    || CardEntry {
                        index,
                        pid: (owner >> 32) as i32,
                        container: entry.container.load(Ordering::SeqCst),
                        heartbeat_ns: heartbeat,
                        active_ns: entry.active_ns.load(Ordering::SeqCst),
                        busy_permille: entry.busy_permille.load(Ordering::Relaxed),
                        demand_permille: entry.demand_permille.load(Ordering::Relaxed),
                        limit_percent: entry.limit_percent.load(Ordering::Relaxed),
                        soft: entry.mode.load(Ordering::Relaxed) == 1,
                    },
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UUID: &str = "GPU-5e0f0c5a-1111-2222-3333-444455556666";

    fn someone(pid: i32) -> Identity {
        Identity {
            pid,
            start_time: 1,
            pid_ns: 42,
        }
    }

    #[test]
    fn create_join_publish_and_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (card, outcome) = CardState::open(dir.path(), UUID).expect("open");
        assert_eq!(outcome, OpenOutcome::Created);
        assert_eq!(card.path(), dir.path().join(format!("{UUID}.card")));
        let now = 10_000_000_000;
        let a = card.join(&someone(100), 1, now).expect("join a");
        let b = card.join(&someone(200), 2, now).expect("join b");
        assert_ne!(a, b);
        card.publish(
            a,
            &Report {
                now_ns: now,
                busy_permille: 300,
                demand_permille: 900,
                active: true,
                limit_percent: 30,
                soft: true,
            },
        );
        card.publish(
            b,
            &Report {
                now_ns: now,
                busy_permille: 0,
                demand_permille: 0,
                active: false,
                limit_percent: 60,
                soft: false,
            },
        );
        let entries = card.entries(now);
        assert_eq!(entries.len(), 2);
        let first = entries.iter().find(|e| e.container == 1).expect("entry a");
        assert_eq!(
            (
                first.pid,
                first.busy_permille,
                first.demand_permille,
                first.limit_percent,
                first.soft
            ),
            (100, 300, 900, 30, true)
        );
        // Container 2 sees container 1 active; container 1 sees nobody else active.
        assert!(card.others_active(2, now + 100_000_000, 200_000_000));
        assert!(!card.others_active(1, now + 100_000_000, 200_000_000));
        // Activity older than the window does not count.
        assert!(!card.others_active(2, now + 300_000_000, 200_000_000));
        let (again, outcome) = CardState::open(dir.path(), UUID).expect("reopen");
        assert_eq!(outcome, OpenOutcome::Attached);
        assert_eq!(again.entries(now).len(), 2);
        card.leave(a);
        assert_eq!(again.entries(now).len(), 1);
        assert!(!again.others_active(2, now, 200_000_000));
    }

    #[test]
    fn silent_entries_expire_and_are_taken_over() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (card, _) = CardState::open(dir.path(), UUID).expect("open");
        let now = 10_000_000_000;
        for pid in 0..MAX_ENTRIES as i32 {
            card.join(&someone(1000 + pid), 7, now).expect("join");
        }
        assert!(matches!(
            card.join(&someone(5), 8, now),
            Err(CardStateError::Full(_))
        ));
        let later = now + EXPIRY_NS + 1;
        assert!(card.entries(later).is_empty(), "every heartbeat expired");
        let taken = card
            .join(&someone(5), 8, later)
            .expect("takes over a silent entry");
        card.publish(
            taken,
            &Report {
                now_ns: later,
                active: true,
                ..Report::default()
            },
        );
        let entries = card.entries(later);
        assert_eq!(entries.len(), 1);
        assert_eq!((entries[0].pid, entries[0].container), (5, 8));
    }

    #[test]
    fn corrupt_or_foreign_files_are_rebuilt() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = CardState::path_for(dir.path(), UUID).expect("path");
        std::fs::write(&path, b"garbage").expect("write");
        let (_, outcome) = CardState::open(dir.path(), UUID).expect("open");
        assert!(
            matches!(outcome, OpenOutcome::Rebuilt(ref why) if why.contains("length")),
            "{outcome:?}"
        );
        let mut bytes = std::fs::read(&path).expect("read");
        bytes[0] ^= 0xff;
        std::fs::write(&path, &bytes).expect("write");
        assert!(CardState::open_existing(&path).is_err());
        let (_, outcome) = CardState::open(dir.path(), UUID).expect("open");
        assert!(
            matches!(outcome, OpenOutcome::Rebuilt(ref why) if why.contains("magic")),
            "{outcome:?}"
        );
        // The same file opened for another card is rebuilt for it.
        std::fs::copy(&path, dir.path().join("GPU-other.card")).expect("copy");
        let (other, outcome) = CardState::open(dir.path(), "GPU-other").expect("open other");
        assert!(
            matches!(outcome, OpenOutcome::Rebuilt(ref why) if why.contains(UUID)),
            "{outcome:?}"
        );
        assert_eq!(other.uuid(), "GPU-other");
        assert!(CardState::open_existing(&path).is_ok());
    }

    #[test]
    fn bad_uuids_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        for uuid in ["", "../etc/passwd", "a/b", ".hidden", "GPU 1"] {
            assert!(
                matches!(
                    CardState::open(dir.path(), uuid),
                    Err(CardStateError::BadUuid(_))
                ),
                "{uuid:?}"
            );
        }
    }

    #[test]
    fn container_ids_differ_by_region() {
        assert_ne!(
            container_id(Path::new("/a/usage.region")),
            container_id(Path::new("/b/usage.region"))
        );
        assert_ne!(container_id(Path::new("")), 0);
    }
}
