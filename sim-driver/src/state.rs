//! The cross-process truth of the simulated machine: one file-backed shared mapping
//! (`VGPU_SIM_STATE`, default `/tmp/vgpu-sim-<uid>/state`) that every process using the
//! sim maps, as every process on a real host shares the real cards.
//!
//! It holds, per process slot (owner PID + start time + PID namespace), the device bytes
//! held and contexts open on each GPU, kernel launches and busy time; and per GPU the
//! busy timeline that NVML utilization is read from. Everything is an atomic, so a process
//! that dies at any instruction leaves no lock held: a GPU's used memory is the sum over
//! live slots, and a dead process's slot is found by PID and start time and zeroed.
//! The only lock is an `flock` taken while the file is created or rebuilt; the kernel
//! drops it with its holder.
//!
//! Busy time is kept in rings of 100 ms buckets (12.8 s of history and look-ahead),
//! each bucket one atomic word packing its bucket number (high 32 bits) and busy
//! nanoseconds (low 32 bits).

use std::fs::OpenOptions;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use vgpu_contract::process;

use crate::config::MAX_GPUS;

/// Process slots in one state file.
pub const MAX_SLOTS: usize = 128;
/// Nanoseconds per utilization bucket.
pub const BUCKET_NS: u64 = 100_000_000;
/// Buckets per ring.
pub const BUCKETS: usize = 128;
const MAGIC: u64 = u64::from_le_bytes(*b"VGPUSIM\0");
const VERSION: u64 = 1;
const HEADER_LEN: usize = 4096;

const STATE_FREE: u64 = 0;
const STATE_CLAIMING: u64 = 1;
const STATE_LIVE: u64 = 2;
const STATE_RECLAIMING: u64 = 3;

#[repr(C)]
struct Header {
    magic: AtomicU64,
    version: AtomicU64,
    layout: AtomicU64,
    /// One more than the highest slot ever claimed.
    high_water: AtomicU64,
}

#[repr(C)]
struct GpuRecord {
    /// The end of the last busy interval counted (monotonic ns): intervals are counted as a union.
    busy_until: AtomicU64,
    busy_total_ns: AtomicU64,
    launches: AtomicU64,
    buckets: [AtomicU64; BUCKETS],
}

#[repr(C, align(64))]
struct Slot {
    /// `pid << 32 | state`.
    owner: AtomicU64,
    start_time: AtomicU64,
    pid_ns: AtomicU64,
    used: [AtomicU64; MAX_GPUS],
    contexts: [AtomicU64; MAX_GPUS],
    launches: [AtomicU64; MAX_GPUS],
    busy_total_ns: [AtomicU64; MAX_GPUS],
    busy_until: [AtomicU64; MAX_GPUS],
    /// Where the process's current turn on each card began (`cuda::schedule`).
    run_start: [AtomicU64; MAX_GPUS],
    buckets: [[AtomicU64; BUCKETS]; MAX_GPUS],
}

const GPUS_OFFSET: usize = HEADER_LEN;
const SLOTS_OFFSET: usize = GPUS_OFFSET + MAX_GPUS * std::mem::size_of::<GpuRecord>();
const SLOTS_OFFSET_ALIGNED: usize = SLOTS_OFFSET.div_ceil(64) * 64;
/// Bytes of a state file.
pub const STATE_LEN: usize = SLOTS_OFFSET_ALIGNED + MAX_SLOTS * std::mem::size_of::<Slot>();

const fn layout_fingerprint() -> u64 {
    let parts = [
        VERSION,
        MAX_SLOTS as u64,
        MAX_GPUS as u64,
        BUCKETS as u64,
        BUCKET_NS,
        STATE_LEN as u64,
    ];
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    let mut i = 0;
    while i < parts.len() {
        hash ^= parts[i];
        hash = hash.wrapping_mul(0x0100_0000_01b3);
        i += 1;
    }
    hash
}

/// One process as the state file records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessRecord {
    pub pid: u32,
    pub used: u64,
    pub contexts: u64,
    pub launches: u64,
    pub busy_total_ns: u64,
    /// Busy nanoseconds in the last second.
    pub busy_recent_ns: u64,
    /// Monotonic ns at which its last counted kernel ends.
    pub busy_until: u64,
    /// Busy ns in each of the last `HISTORY_BUCKETS` completed 100 ms buckets, oldest
    /// first (the last one ends where the current bucket starts): what NVML's sparse
    /// per-process samples are taken from.
    pub history: [u64; HISTORY_BUCKETS],
}

/// Completed buckets a [`ProcessRecord`] carries: four seconds, more than the window any
/// reader asks for.
pub const HISTORY_BUCKETS: usize = 40;

/// The mapped state file.
pub struct SharedState {
    base: *mut u8,
}

// SAFETY: the mapping is only accessed through atomics and lives for the process's lifetime.
unsafe impl Send for SharedState {}
// SAFETY: as above; every shared field is an atomic.
unsafe impl Sync for SharedState {}

/// A slot index held by this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotIndex(pub usize);

fn pack(bucket: u64, ns: u64) -> u64 {
    (bucket << 32) | ns.min(u32::MAX as u64)
}

fn unpack(word: u64) -> (u64, u64) {
    (word >> 32, word & 0xffff_ffff)
}

/// Adds busy nanoseconds of bucket `bucket` (an absolute bucket number) to a ring.
fn ring_add(ring: &[AtomicU64; BUCKETS], bucket: u64, ns: u64) {
    let cell = &ring[(bucket % BUCKETS as u64) as usize];
    let tag = bucket & 0xffff_ffff;
    let mut current = cell.load(Ordering::Acquire);
    loop {
        let (held, value) = unpack(current);
        let next = if held == tag {
            pack(tag, (value + ns).min(BUCKET_NS))
        } else if held < tag {
            pack(tag, ns.min(BUCKET_NS))
        } else {
            return; // the cell already holds a later bucket: this interval is too old to count
        };
        match cell.compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return,
            Err(actual) => current = actual,
        }
    }
}

/// Busy ns a ring holds for bucket `bucket`.
fn ring_get(ring: &[AtomicU64; BUCKETS], bucket: u64) -> u64 {
    let (held, value) = unpack(ring[(bucket % BUCKETS as u64) as usize].load(Ordering::Acquire));
    if held == bucket & 0xffff_ffff {
        value
    } else {
        0
    }
}

/// Spreads `[start, end)` over the ring's buckets; work more than the ring's reach ahead
/// of `now` is not counted.
fn ring_add_interval(ring: &[AtomicU64; BUCKETS], start: u64, end: u64, now: u64) {
    let horizon = now + (BUCKETS as u64 - 2) * BUCKET_NS;
    let end = end.min(horizon);
    let mut cursor = start;
    while cursor < end {
        let bucket = cursor / BUCKET_NS;
        let bucket_end = ((bucket + 1) * BUCKET_NS).min(end);
        ring_add(ring, bucket, bucket_end - cursor);
        cursor = bucket_end;
    }
}

/// Busy ns in the second before `now` (work scheduled for later in the current bucket is
/// clipped to the time elapsed in it).
fn ring_recent(ring: &[AtomicU64; BUCKETS], now: u64) -> u64 {
    let current = now / BUCKET_NS;
    let into_current = now - current * BUCKET_NS;
    let full_buckets = 1_000_000_000 / BUCKET_NS; // 10
    let mut total = ring_get(ring, current).min(into_current);
    for back in 1..full_buckets {
        if back > current {
            break;
        }
        total += ring_get(ring, current - back);
    }
    // The oldest bucket counts for the part of it inside the window.
    if current >= full_buckets {
        let oldest = ring_get(ring, current - full_buckets);
        total += oldest * (BUCKET_NS - into_current) / BUCKET_NS;
    }
    total.min(1_000_000_000)
}

/// Adds `[start, end)` to a busy record whose counted intervals end at `until`, counting
/// only the part not counted yet (concurrent streams overlap: the card is busy once).
/// Returns the nanoseconds newly counted and the first of them.
fn union_add(until: &AtomicU64, start: u64, end: u64) -> Option<(u64, u64)> {
    let mut current = until.load(Ordering::Acquire);
    loop {
        let from = start.max(current);
        if end <= from {
            return None;
        }
        match until.compare_exchange_weak(current, end, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Some((from, end - from)),
            Err(actual) => current = actual,
        }
    }
}

impl SharedState {
    /// Maps the state file at `path`, creating or rebuilding it when absent, short or foreign.
    pub fn open(path: &Path) -> io::Result<SharedState> {
        if let Some(parent) = path
            .parent()
            .filter(|parent| !parent.as_os_str().is_empty())
        {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)?;
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)?;
        let fd = file.as_raw_fd();
        // SAFETY: fd is an open file; flock blocks only while another process initialises.
        if unsafe { libc::flock(fd, libc::LOCK_EX) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let result = Self::map_locked(&file);
        // SAFETY: fd is still open; unlocking our own lock.
        unsafe { libc::flock(fd, libc::LOCK_UN) };
        result
    }

    fn map_locked(file: &std::fs::File) -> io::Result<SharedState> {
        let len = file.metadata()?.len();
        let mut fresh = false;
        if len != STATE_LEN as u64 {
            file.set_len(0)?;
            file.set_len(STATE_LEN as u64)?;
            fresh = true;
        }
        // SAFETY: mapping STATE_LEN bytes of a file we just sized to STATE_LEN, shared.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                STATE_LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let state = SharedState { base: base.cast() };
        let header = state.header();
        let valid = header.magic.load(Ordering::Acquire) == MAGIC
            && header.version.load(Ordering::Acquire) == VERSION
            && header.layout.load(Ordering::Acquire) == layout_fingerprint();
        if !valid && !fresh {
            // A foreign or older layout: zero it under the flock and start over.
            // SAFETY: base spans STATE_LEN writable bytes; we hold the file lock, and a
            // layout we do not recognise is not in use by any process of this version.
            unsafe { std::ptr::write_bytes(state.base, 0, STATE_LEN) };
        }
        if !valid {
            header.high_water.store(0, Ordering::Release);
            header.layout.store(layout_fingerprint(), Ordering::Release);
            header.version.store(VERSION, Ordering::Release);
            header.magic.store(MAGIC, Ordering::Release);
        }
        Ok(state)
    }

    fn header(&self) -> &Header {
        // SAFETY: the header sits at offset 0 of a live mapping of STATE_LEN bytes, and
        // zeroed memory is a valid Header (atomics of 0).
        unsafe { &*(self.base as *const Header) }
    }

    fn gpu(&self, gpu: usize) -> &GpuRecord {
        let index = gpu.min(MAX_GPUS - 1);
        // SAFETY: GPUS_OFFSET + index * size lies inside the mapping; records are atomics.
        unsafe {
            &*(self
                .base
                .add(GPUS_OFFSET + index * std::mem::size_of::<GpuRecord>())
                as *const GpuRecord)
        }
    }

    fn slot(&self, slot: usize) -> &Slot {
        let index = slot.min(MAX_SLOTS - 1);
        // SAFETY: the slot array lies inside the mapping, 64-byte aligned; slots are atomics.
        unsafe {
            &*(self
                .base
                .add(SLOTS_OFFSET_ALIGNED + index * std::mem::size_of::<Slot>())
                as *const Slot)
        }
    }

    fn high_water(&self) -> usize {
        (self.header().high_water.load(Ordering::Acquire) as usize).min(MAX_SLOTS)
    }

    /// Claims a slot for the calling process (`pid`, `start_time`, `pid_ns`), reclaiming
    /// dead processes' slots when none is free. None when all are held by live processes.
    pub fn claim(&self, pid: i32, start_time: u64, pid_ns: u64) -> Option<SlotIndex> {
        for attempt in 0..2 {
            for index in 0..MAX_SLOTS {
                let slot = self.slot(index);
                let claiming = ((pid as u32 as u64) << 32) | STATE_CLAIMING;
                if slot
                    .owner
                    .compare_exchange(STATE_FREE, claiming, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    slot.start_time.store(start_time, Ordering::Release);
                    slot.pid_ns.store(pid_ns, Ordering::Release);
                    for gpu in 0..MAX_GPUS {
                        slot.used[gpu].store(0, Ordering::Release);
                        slot.contexts[gpu].store(0, Ordering::Release);
                        slot.launches[gpu].store(0, Ordering::Release);
                        slot.busy_total_ns[gpu].store(0, Ordering::Release);
                        slot.busy_until[gpu].store(0, Ordering::Release);
                        slot.run_start[gpu].store(0, Ordering::Release);
                        for bucket in &slot.buckets[gpu] {
                            bucket.store(0, Ordering::Release);
                        }
                    }
                    slot.owner
                        .store(((pid as u32 as u64) << 32) | STATE_LIVE, Ordering::Release);
                    self.header()
                        .high_water
                        .fetch_max(index as u64 + 1, Ordering::AcqRel);
                    return Some(SlotIndex(index));
                }
            }
            if attempt == 0 && self.reclaim_dead() == 0 {
                return None;
            }
        }
        None
    }

    /// Gives a slot back (its usage with it).
    pub fn release_slot(&self, slot: SlotIndex) {
        let record = self.slot(slot.0);
        for gpu in 0..MAX_GPUS {
            record.used[gpu].store(0, Ordering::Release);
            record.contexts[gpu].store(0, Ordering::Release);
        }
        record.owner.store(STATE_FREE, Ordering::Release);
    }

    /// Zeroes the slots of processes that died (judged only for slots of our PID
    /// namespace, where PIDs mean what they say). Returns how many were reclaimed.
    pub fn reclaim_dead(&self) -> usize {
        let my_ns = crate::hostpid::my_pid_ns();
        let mut reclaimed = 0;
        for index in 0..self.high_water() {
            let slot = self.slot(index);
            let owner = slot.owner.load(Ordering::Acquire);
            let (pid, state) = ((owner >> 32) as i32, owner & 0xffff_ffff);
            if state != STATE_LIVE && state != STATE_CLAIMING {
                continue;
            }
            let ns = slot.pid_ns.load(Ordering::Acquire);
            if ns != 0 && my_ns != 0 && ns != my_ns {
                continue;
            }
            let alive = if state == STATE_LIVE {
                process::is_alive(pid, slot.start_time.load(Ordering::Acquire))
            } else {
                // SAFETY: kill with signal 0 only checks for existence.
                unsafe { libc::kill(pid, 0) == 0 || *libc::__errno_location() != libc::ESRCH }
            };
            if alive {
                continue;
            }
            let reclaiming = ((pid as u32 as u64) << 32) | STATE_RECLAIMING;
            if slot
                .owner
                .compare_exchange(owner, reclaiming, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                for gpu in 0..MAX_GPUS {
                    slot.used[gpu].store(0, Ordering::Release);
                    slot.contexts[gpu].store(0, Ordering::Release);
                }
                slot.owner.store(STATE_FREE, Ordering::Release);
                reclaimed += 1;
            }
        }
        reclaimed
    }

    fn live(&self, index: usize) -> Option<(&Slot, u32)> {
        let slot = self.slot(index);
        let owner = slot.owner.load(Ordering::Acquire);
        (owner & 0xffff_ffff == STATE_LIVE).then_some((slot, (owner >> 32) as u32))
    }

    /// Device bytes held on `gpu` by all live processes.
    pub fn gpu_used(&self, gpu: usize) -> u64 {
        (0..self.high_water())
            .filter_map(|index| self.live(index))
            .map(|(slot, _)| slot.used[gpu].load(Ordering::SeqCst))
            .sum()
    }

    /// Reserves `bytes` on `gpu` for `slot` when the card has room, so that two racing
    /// reservations can never together pass `capacity` (add, then sum all slots).
    pub fn try_reserve(&self, slot: SlotIndex, gpu: usize, bytes: u64, capacity: u64) -> bool {
        if bytes == 0 {
            return true;
        }
        let mine = &self.slot(slot.0).used[gpu];
        let mut reclaimed = false;
        for _ in 0..8 {
            mine.fetch_add(bytes, Ordering::SeqCst);
            let total = self.gpu_used(gpu);
            if total <= capacity {
                return true;
            }
            mine.fetch_sub(bytes, Ordering::SeqCst);
            // Retry only when a racing reservation (since undone) may explain the excess.
            if self.gpu_used(gpu).saturating_add(bytes) <= capacity {
                std::thread::yield_now();
                continue;
            }
            if reclaimed || self.reclaim_dead() == 0 {
                return false;
            }
            reclaimed = true;
        }
        false
    }

    /// Returns `bytes` of `slot`'s usage on `gpu`.
    pub fn release(&self, slot: SlotIndex, gpu: usize, bytes: u64) {
        let mine = &self.slot(slot.0).used[gpu];
        let mut current = mine.load(Ordering::Acquire);
        loop {
            let next = current.saturating_sub(bytes);
            match mine.compare_exchange_weak(current, next, Ordering::SeqCst, Ordering::Acquire) {
                Ok(_) => return,
                Err(actual) => current = actual,
            }
        }
    }

    /// Counts a context opened (+1) or closed (-1) by `slot` on `gpu`.
    pub fn count_context(&self, slot: SlotIndex, gpu: usize, opened: bool) {
        let counter = &self.slot(slot.0).contexts[gpu];
        if opened {
            counter.fetch_add(1, Ordering::AcqRel);
        } else {
            let _ = counter.fetch_update(Ordering::AcqRel, Ordering::Acquire, |value| {
                Some(value.saturating_sub(1))
            });
        }
    }

    /// Records a kernel of `slot` occupying `gpu` over `[start, end)` (monotonic ns).
    pub fn record_busy(&self, slot: SlotIndex, gpu: usize, start: u64, end: u64, now: u64) {
        let record = self.gpu(gpu);
        record.launches.fetch_add(1, Ordering::AcqRel);
        if let Some((from, ns)) = union_add(&record.busy_until, start, end) {
            record.busy_total_ns.fetch_add(ns, Ordering::AcqRel);
            ring_add_interval(&record.buckets, from, end, now);
        }
        let mine = self.slot(slot.0);
        mine.launches[gpu].fetch_add(1, Ordering::AcqRel);
        if let Some((from, ns)) = union_add(&mine.busy_until[gpu], start, end) {
            mine.busy_total_ns[gpu].fetch_add(ns, Ordering::AcqRel);
            ring_add_interval(&mine.buckets[gpu], from, end, now);
        }
    }

    /// Every other live process's current turn on `gpu` that still holds work after
    /// `after_ns`: (where it began, where its queued kernels end), monotonic ns
    /// (`cuda::schedule` time-slices the card by them). A turn that ended by then cannot
    /// hold the card for anything queued now; leaving it out matters because a slot
    /// stays live until it is reclaimed (a killed process's stays until slots run out),
    /// and a stale turn would put a process that has the card to itself on the shared
    /// path.
    pub fn others_turns(&self, slot: SlotIndex, gpu: usize, after_ns: u64) -> Vec<(u64, u64)> {
        (0..self.high_water())
            .filter(|index| *index != slot.0)
            .filter_map(|index| self.live(index))
            .map(|(other, _)| {
                (
                    other.run_start[gpu].load(Ordering::Acquire),
                    other.busy_until[gpu].load(Ordering::Acquire),
                )
            })
            .filter(|&(_, until)| until > after_ns)
            .collect()
    }

    /// `slot`'s current turn on `gpu`: (where it began, where its queued kernels end).
    pub fn own_turn(&self, slot: SlotIndex, gpu: usize) -> (u64, u64) {
        let mine = self.slot(slot.0);
        (
            mine.run_start[gpu].load(Ordering::Acquire),
            mine.busy_until[gpu].load(Ordering::Acquire),
        )
    }

    /// Starts a new turn of `slot` on `gpu` at `start_ns`.
    pub fn begin_turn(&self, slot: SlotIndex, gpu: usize, start_ns: u64) {
        self.slot(slot.0).run_start[gpu].store(start_ns, Ordering::Release);
    }

    /// The fraction (0..=1 as ns per second) of the last second `gpu` was busy.
    pub fn gpu_busy_recent_ns(&self, gpu: usize, now: u64) -> u64 {
        ring_recent(&self.gpu(gpu).buckets, now)
    }

    /// Kernel launches on `gpu` by all processes since the state file was made.
    pub fn gpu_launches(&self, gpu: usize) -> u64 {
        self.gpu(gpu).launches.load(Ordering::Acquire)
    }

    /// Live processes holding memory or a context on `gpu`, under their PIDs as the
    /// caller's PID namespace sees them, as driver 580's NVML answers: a process of the
    /// caller's namespace under its own PID; from the initial namespace, a process of a
    /// child namespace under its host PID; a process the caller cannot see is left out.
    pub fn processes(&self, gpu: usize, now: u64) -> Vec<ProcessRecord> {
        (0..self.high_water())
            .filter_map(|index| self.live(index))
            .filter_map(|(slot, pid)| {
                let used = slot.used[gpu].load(Ordering::Acquire);
                let contexts = slot.contexts[gpu].load(Ordering::Acquire);
                if used == 0 && contexts == 0 {
                    return None;
                }
                let pid = crate::hostpid::visible_pid(
                    pid,
                    slot.pid_ns.load(Ordering::Acquire),
                    slot.start_time.load(Ordering::Acquire),
                )?;
                Some(ProcessRecord {
                    pid,
                    used,
                    contexts,
                    launches: slot.launches[gpu].load(Ordering::Acquire),
                    busy_total_ns: slot.busy_total_ns[gpu].load(Ordering::Acquire),
                    busy_recent_ns: ring_recent(&slot.buckets[gpu], now),
                    busy_until: slot.busy_until[gpu].load(Ordering::Acquire),
                    history: std::array::from_fn(|back| {
                        let current = now / BUCKET_NS;
                        let bucket = (current + back as u64).checked_sub(HISTORY_BUCKETS as u64);
                        bucket.map_or(0, |bucket| ring_get(&slot.buckets[gpu], bucket))
                    }),
                })
            })
            .collect()
    }

    /// Bytes `slot` holds on `gpu`.
    pub fn slot_used(&self, slot: SlotIndex, gpu: usize) -> u64 {
        self.slot(slot.0).used[gpu].load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open_temp() -> (tempfile::TempDir, SharedState) {
        let dir = tempfile::tempdir().unwrap();
        let state = SharedState::open(&dir.path().join("sub/state")).unwrap();
        (dir, state)
    }

    #[test]
    fn reserve_respects_capacity_and_release() {
        let (_dir, state) = open_temp();
        let me = process::current();
        let slot = state.claim(me.pid, me.start_time, me.pid_ns).unwrap();
        assert!(state.try_reserve(slot, 1, 600, 1000));
        assert!(!state.try_reserve(slot, 1, 401, 1000));
        assert!(state.try_reserve(slot, 1, 400, 1000));
        assert_eq!(state.gpu_used(1), 1000);
        assert_eq!(state.gpu_used(0), 0);
        state.release(slot, 1, 600);
        assert_eq!(state.gpu_used(1), 400);
        let listed = state.processes(1, 0);
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].pid, me.pid as u32);
        assert_eq!(listed[0].used, 400);
    }

    #[test]
    fn dead_slot_is_reclaimed() {
        let (_dir, state) = open_temp();
        let me = process::current();
        // A slot owned by our PID with a start time that is not ours: a dead process.
        let ghost = state
            .claim(me.pid, me.start_time + 12345, me.pid_ns)
            .unwrap();
        assert!(state.try_reserve(ghost, 0, 500, 1000));
        assert_eq!(state.gpu_used(0), 500);
        assert_eq!(state.reclaim_dead(), 1);
        assert_eq!(state.gpu_used(0), 0);
    }

    /// A slot stays live until it is reclaimed, so a killed process's last turn stays in
    /// the file: only turns with work after the asked time are another process's hold on
    /// the card.
    #[test]
    fn only_turns_with_work_left_hold_the_card() {
        let (_dir, state) = open_temp();
        let me = process::current();
        let [mine, gone, busy] =
            [0u64, 1, 2].map(|n| state.claim(me.pid, me.start_time, me.pid_ns + n).unwrap());
        state.begin_turn(gone, 0, 1_000);
        state.record_busy(gone, 0, 1_000, 2_000, 1_000);
        state.begin_turn(busy, 0, 5_000);
        state.record_busy(busy, 0, 5_000, 9_000, 5_000);
        assert_eq!(state.others_turns(mine, 0, 500).len(), 2);
        assert_eq!(state.others_turns(mine, 0, 6_000), [(5_000, 9_000)]);
        assert!(state.others_turns(mine, 0, 9_000).is_empty());
        assert_eq!(state.others_turns(busy, 0, 1_500), [(1_000, 2_000)]);
    }

    #[test]
    fn busy_is_a_union_and_recent_window_is_one_second() {
        let (_dir, state) = open_temp();
        let me = process::current();
        let slot = state.claim(me.pid, me.start_time, me.pid_ns).unwrap();
        let base = 50 * BUCKET_NS;
        // Two overlapping kernels: [0, 300ms) and [100ms, 400ms) count as 400 ms once.
        state.record_busy(slot, 0, base, base + 300_000_000, base);
        state.record_busy(slot, 0, base + 100_000_000, base + 400_000_000, base);
        let now = base + 1_000_000_000;
        assert_eq!(state.gpu_busy_recent_ns(0, now), 400_000_000);
        assert_eq!(state.gpu_busy_recent_ns(0, base + 3_000_000_000), 0);
        assert_eq!(state.gpu_launches(0), 2);
        assert_eq!(
            state.processes(0, now).len(),
            0,
            "no memory or context: not listed"
        );
    }
}
