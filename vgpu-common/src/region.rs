//! The cross-process usage region: one file-backed shared mapping per container,
//! written by every CUDA process of the container (through libcuda-shim) and read by
//! the NVML shim and the host daemon.
//!
//! Layout (version 1), all little-endian, fixed size:
//! - a 4 KiB header: magic, version, a layout fingerprint, the length, the devices and
//!   their limits, a checksum over those immutable fields, and per device a block of
//!   `CONTAINER_LIMITER_WORDS` atomics that the compute limiter shares between the
//!   container's processes (their meaning: `vgpu_common::limiter_words`);
//! - `MAX_SLOTS` process slots, one cache-line-aligned record each, holding the owner
//!   (PID, state), its start time and PID namespace, per-device counters, and per device
//!   `SLOT_LIMITER_WORDS` atomics the compute limiter publishes for its process.
//!
//! Accounting is lock-free, so a process that dies at any instruction can never leave a
//! lock held. To reserve, a process adds to its own slot and then sums every slot: the
//! sequentially consistent add-then-sum means that of two racing reservations, the later
//! one always sees both, so the quota can never be passed. A dead process's slot is found
//! by PID and start time (PID reuse is no trap) and zeroed, which credits its usage back
//! exactly. A region whose magic, version, fingerprint, length or checksum is wrong is
//! rebuilt, never trusted.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};

use crate::config::MAX_DEVICES;
use crate::mapped::{FNV_OFFSET, MappedFile, fnv1a};
use crate::process::{self, Identity};

/// Process slots per container.
pub const MAX_SLOTS: usize = 256;
/// Layout version; bump on any change of the structs below.
pub const VERSION: u32 = 2;
/// Atomics per device in the container-wide compute limiter block.
pub const CONTAINER_LIMITER_WORDS: usize = 16;
/// Atomics per device in each slot's compute limiter block.
pub const SLOT_LIMITER_WORDS: usize = 4;
const MAGIC: [u8; 8] = *b"VGPUREG\0";
const HEADER_LEN: usize = 4096;
const UUID_LEN: usize = 96;

const STATE_FREE: u64 = 0;
const STATE_CLAIMING: u64 = 1;
const STATE_LIVE: u64 = 2;
const STATE_RECLAIMING: u64 = 3;

/// One device as the region's creator saw it.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct RegionDevice {
    /// UUID (or `index:N` when the config selects by index).
    pub id: String,
    /// 0 means no memory limit.
    pub memory_limit: u64,
    /// 0 means no compute limit.
    pub core_limit: u32,
    /// 0 hard, 1 soft.
    pub core_mode: u32,
}

#[repr(C)]
struct DeviceRecord {
    id: [u8; UUID_LEN],
    memory_limit: u64,
    core_limit: u32,
    core_mode: u32,
}

#[repr(C)]
pub(crate) struct Header {
    magic: [u8; 8],
    version: u32,
    device_count: u32,
    layout: u64,
    total_len: u64,
    checksum: u64,
    /// One more than the highest slot index ever claimed: scans stop there.
    high_water: AtomicU32,
    _reserved: u32,
    devices: [DeviceRecord; MAX_DEVICES],
    /// The compute limiter's container-wide words, per device (not in the checksum).
    limiter: [[AtomicU64; CONTAINER_LIMITER_WORDS]; MAX_DEVICES],
}

/// Per-process counters, one set per device.
#[repr(C, align(64))]
pub(crate) struct Slot {
    /// `pid << 32 | state`, so a claimer's PID is visible the instant it claims.
    owner: AtomicU64,
    start_time: AtomicU64,
    pid_ns: AtomicU64,
    /// The owner's PID in the host namespace, 0 while unknown (the host daemon fills it).
    host_pid: AtomicI32,
    _pad: u32,
    /// Device bytes held, context overhead included.
    used: [AtomicU64; MAX_DEVICES],
    /// Of `used`, what context creation took.
    context: [AtomicU64; MAX_DEVICES],
    /// GPU busy time the compute limiter measured, nanoseconds.
    busy_ns: [AtomicU64; MAX_DEVICES],
    /// Kernel launches seen.
    launches: [AtomicU64; MAX_DEVICES],
    /// The compute limiter's words for this process, per device.
    limiter: [[AtomicU64; SLOT_LIMITER_WORDS]; MAX_DEVICES],
}

const SLOTS_OFFSET: usize = HEADER_LEN;

/// Byte offset of slot `index`'s host PID in the file (for `pwrite` by the host).
pub(crate) fn host_pid_offset(index: usize) -> usize {
    SLOTS_OFFSET + index * std::mem::size_of::<Slot>() + std::mem::offset_of!(Slot, host_pid)
}
/// Bytes of a region file.
pub const REGION_LEN: usize = SLOTS_OFFSET + MAX_SLOTS * std::mem::size_of::<Slot>();
const _: () = assert!(std::mem::size_of::<Header>() <= HEADER_LEN);

const fn layout_fingerprint() -> u64 {
    let parts = [
        VERSION as u64,
        MAX_SLOTS as u64,
        MAX_DEVICES as u64,
        std::mem::size_of::<Header>() as u64,
        std::mem::size_of::<Slot>() as u64,
        std::mem::size_of::<DeviceRecord>() as u64,
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

/// Why a region could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum RegionError {
    #[error("usage region {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("usage region {path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error("usage region: {0} devices, at most {MAX_DEVICES}")]
    TooManyDevices(usize),
    #[error("usage region {0}: all {MAX_SLOTS} process slots are held by live processes")]
    Full(PathBuf),
}

pub use crate::mapped::OpenOutcome;

/// One process's usage, for readers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessUsage {
    pub slot: usize,
    pub pid: i32,
    pub host_pid: i32,
    pub start_time: u64,
    pub pid_ns: u64,
    pub used: Vec<u64>,
    pub context: Vec<u64>,
    pub busy_ns: Vec<u64>,
    pub launches: Vec<u64>,
}

/// A claimed slot of this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotId(usize);

impl SlotId {
    pub fn index(self) -> usize {
        self.0
    }
}

/// An open usage region. The mapping lives as long as the value.
pub struct Region {
    map: MappedFile,
}

impl Region {
    /// Opens (creating or rebuilding as needed) the region at `path` for `devices`.
    pub fn open(
        path: &Path,
        devices: &[RegionDevice],
    ) -> Result<(Region, OpenOutcome), RegionError> {
        if devices.len() > MAX_DEVICES {
            return Err(RegionError::TooManyDevices(devices.len()));
        }
        let (map, found, lock) =
            MappedFile::open_or_create(path, REGION_LEN).map_err(|source| RegionError::Io {
                path: path.to_path_buf(),
                source,
            })?;
        let region = Region { map };
        let outcome = found.settle(
            &region.map,
            || region.initialise(devices),
            || RegionBytes::check(&region).and_then(|()| region.check_devices(devices)),
        );
        drop(lock);
        Ok((region, outcome))
    }

    /// Opens an existing region without changing it (host daemon, NVML readers).
    pub fn open_existing(path: &Path) -> Result<Region, RegionError> {
        let map = MappedFile::open_existing(path, REGION_LEN).map_err(|error| match error {
            Ok(len) => RegionError::Invalid {
                path: path.to_path_buf(),
                reason: format!("length {len}, expected {REGION_LEN}"),
            },
            Err(source) => RegionError::Io {
                path: path.to_path_buf(),
                source,
            },
        })?;
        let region = Region { map };
        RegionBytes::check(&region).map_err(|reason| RegionError::Invalid {
            path: path.to_path_buf(),
            reason,
        })?;
        Ok(region)
    }

    pub fn path(&self) -> &Path {
        self.map.path()
    }

    fn header_mut(&self) -> *mut Header {
        self.map.base() as *mut Header
    }

    fn immutable_checksum(header: &Header) -> u64 {
        let mut hash = fnv1a(&header.magic, FNV_OFFSET);
        hash = fnv1a(&header.version.to_le_bytes(), hash);
        hash = fnv1a(&header.device_count.to_le_bytes(), hash);
        hash = fnv1a(&header.layout.to_le_bytes(), hash);
        hash = fnv1a(&header.total_len.to_le_bytes(), hash);
        for device in &header.devices {
            hash = fnv1a(&device.id, hash);
            hash = fnv1a(&device.memory_limit.to_le_bytes(), hash);
            hash = fnv1a(&device.core_limit.to_le_bytes(), hash);
            hash = fnv1a(&device.core_mode.to_le_bytes(), hash);
        }
        hash
    }

    /// Writes a fresh header; called under the file lock on a zeroed mapping.
    fn initialise(&self, devices: &[RegionDevice]) {
        let header = self.header_mut();
        // SAFETY: under the file lock nobody else writes the header; raw writes avoid
        // forming a &mut that would alias readers' shared references.
        unsafe {
            for (record, device) in (*header).devices.iter_mut().zip(devices) {
                let bytes = device.id.as_bytes();
                let n = bytes.len().min(UUID_LEN - 1);
                record.id = [0; UUID_LEN];
                record.id[..n].copy_from_slice(&bytes[..n]);
                record.memory_limit = device.memory_limit;
                record.core_limit = device.core_limit;
                record.core_mode = device.core_mode;
            }
            (*header).version = VERSION;
            (*header).device_count = devices.len() as u32;
            (*header).layout = layout_fingerprint();
            (*header).total_len = REGION_LEN as u64;
            (*header).magic = MAGIC;
            (*header).checksum = Region::immutable_checksum(&*header);
        }
        std::sync::atomic::fence(Ordering::SeqCst);
    }

    fn check_devices(&self, devices: &[RegionDevice]) -> Result<(), String> {
        if self.devices() == devices {
            Ok(())
        } else {
            Err("devices or limits differ from the config".into())
        }
    }

    /// Claims a slot for `me`, resetting one left by an earlier image of the same process
    /// (after `exec` the PID and start time stay, the device memory does not).
    pub fn attach(&self, me: &Identity) -> Result<SlotId, RegionError> {
        for index in 0..self.scan_end() {
            let slot = self.slot(index);
            let owner = slot.owner.load(Ordering::SeqCst);
            if owner & 0xff == STATE_LIVE
                && (owner >> 32) as i32 == me.pid
                && slot.start_time.load(Ordering::SeqCst) == me.start_time
                && slot.pid_ns.load(Ordering::SeqCst) == me.pid_ns
            {
                Region::clear_counters(slot);
                return Ok(SlotId(index));
            }
        }
        for attempt in 0..2 {
            if let Some(slot) = self.claim_free(me) {
                return Ok(slot);
            }
            if attempt == 0 {
                self.reclaim_dead();
            }
        }
        Err(RegionError::Full(self.map.path().to_path_buf()))
    }

    fn claim_free(&self, me: &Identity) -> Option<SlotId> {
        let claiming = ((me.pid as u32 as u64) << 32) | STATE_CLAIMING;
        for index in 0..MAX_SLOTS {
            let slot = self.slot(index);
            if slot
                .owner
                .compare_exchange(STATE_FREE, claiming, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                Region::clear_counters(slot);
                slot.start_time.store(me.start_time, Ordering::SeqCst);
                slot.pid_ns.store(me.pid_ns, Ordering::SeqCst);
                let host_pid = if me.pid_ns == process::INIT_PID_NS {
                    me.pid
                } else {
                    0
                };
                slot.host_pid.store(host_pid, Ordering::SeqCst);
                self.header()
                    .high_water
                    .fetch_max(index as u32 + 1, Ordering::SeqCst);
                slot.owner.store(
                    ((me.pid as u32 as u64) << 32) | STATE_LIVE,
                    Ordering::SeqCst,
                );
                return Some(SlotId(index));
            }
        }
        None
    }

    fn clear_counters(slot: &Slot) {
        for device in 0..MAX_DEVICES {
            slot.used[device].store(0, Ordering::SeqCst);
            slot.context[device].store(0, Ordering::SeqCst);
            slot.busy_ns[device].store(0, Ordering::SeqCst);
            slot.launches[device].store(0, Ordering::SeqCst);
            for word in &slot.limiter[device] {
                word.store(0, Ordering::SeqCst);
            }
        }
    }

    /// Gives a slot back (clean exit).
    pub fn detach(&self, slot: SlotId) {
        let slot = self.slot(slot.0);
        Region::clear_counters(slot);
        slot.owner.store(STATE_FREE, Ordering::SeqCst);
    }

    /// Adds `bytes` to this process's usage on `device` if the total stays within `limit`.
    /// Returns false, having changed nothing, when it would not.
    pub fn try_reserve(&self, slot: SlotId, device: usize, bytes: u64, limit: u64) -> bool {
        if device >= MAX_DEVICES {
            return false;
        }
        let counter = &self.slot(slot.0).used[device];
        // Two reservations racing at the edge of the quota can both see the other's
        // add and both back off, though one would have fitted. After backing off, try
        // again (a few times) while what the others hold leaves room.
        for _ in 0..4 {
            counter.fetch_add(bytes, Ordering::SeqCst);
            let total = self.device_used(device);
            if total <= limit {
                return true;
            }
            Region::saturating_sub(counter, bytes);
            if total.saturating_sub(bytes) > limit.saturating_sub(bytes) {
                // Others alone hold more than leaves room: a true refusal.
                return false;
            }
            std::hint::spin_loop();
        }
        false
    }

    /// Adds `bytes` to this process's usage without a limit check (no quota, or
    /// memory that the driver already handed out).
    pub fn add_used(&self, slot: SlotId, device: usize, bytes: u64) {
        if device < MAX_DEVICES {
            self.slot(slot.0).used[device].fetch_add(bytes, Ordering::SeqCst);
        }
    }

    /// Bytes one slot holds on `device`.
    pub fn slot_used(&self, slot: SlotId, device: usize) -> u64 {
        if device < MAX_DEVICES {
            self.slot(slot.0).used[device].load(Ordering::SeqCst)
        } else {
            0
        }
    }

    /// Credits `bytes` back on `device`.
    pub fn release(&self, slot: SlotId, device: usize, bytes: u64) {
        if device < MAX_DEVICES {
            Region::saturating_sub(&self.slot(slot.0).used[device], bytes);
        }
    }

    /// Records context overhead (already part of `used` through `add_used`/`try_reserve`).
    pub fn set_context(&self, slot: SlotId, device: usize, bytes: u64) {
        if device < MAX_DEVICES {
            self.slot(slot.0).context[device].store(bytes, Ordering::SeqCst);
        }
    }

    /// Adds measured GPU busy time and launches (compute limiter, utilization readers).
    pub fn add_busy(&self, slot: SlotId, device: usize, busy_ns: u64, launches: u64) {
        if device < MAX_DEVICES {
            let slot = self.slot(slot.0);
            slot.busy_ns[device].fetch_add(busy_ns, Ordering::Relaxed);
            slot.launches[device].fetch_add(launches, Ordering::Relaxed);
        }
    }

    /// The compute limiter's container-wide words for `device` (an index past the
    /// devices gets the last device's block, which no limiter uses).
    pub fn container_limiter(&self, device: usize) -> &[AtomicU64; CONTAINER_LIMITER_WORDS] {
        &self.header().limiter[device.min(MAX_DEVICES - 1)]
    }

    /// The compute limiter's words of one slot for `device`.
    pub fn slot_limiter(&self, slot: SlotId, device: usize) -> &[AtomicU64; SLOT_LIMITER_WORDS] {
        &self.slot(slot.0).limiter[device.min(MAX_DEVICES - 1)]
    }

    /// Records the host PID of a slot's owner (host daemon).
    pub fn set_host_pid(&self, slot: usize, host_pid: i32) {
        if slot < MAX_SLOTS {
            self.slot(slot).host_pid.store(host_pid, Ordering::SeqCst);
        }
    }

    fn saturating_sub(counter: &AtomicU64, bytes: u64) {
        let _ = counter.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |value| {
            Some(value.saturating_sub(bytes))
        });
    }

    /// Frees the slots of processes that are gone. Only slots whose owner lives in our
    /// PID namespace are judged by PID; others are judged by their host PID when we are
    /// in the initial namespace, else left alone. Returns how many were freed.
    pub fn reclaim_dead(&self) -> usize {
        let my_ns = process::pid_namespace_in(Path::new("/proc"), "self").unwrap_or(0);
        let mut freed = 0;
        for index in 0..self.scan_end() {
            let slot = self.slot(index);
            let owner = slot.owner.load(Ordering::SeqCst);
            let state = owner & 0xff;
            if state != STATE_LIVE && state != STATE_CLAIMING {
                continue;
            }
            let pid = (owner >> 32) as i32;
            let start = slot.start_time.load(Ordering::SeqCst);
            let slot_ns = slot.pid_ns.load(Ordering::SeqCst);
            let alive = if slot_ns == my_ns {
                if state == STATE_CLAIMING {
                    // Start time may not be written yet: judge by the PID alone.
                    Path::new("/proc").join(pid.to_string()).exists()
                } else {
                    process::is_alive(pid, start)
                }
            } else if my_ns == process::INIT_PID_NS {
                let host_pid = slot.host_pid.load(Ordering::SeqCst);
                host_pid == 0 || Path::new("/proc").join(host_pid.to_string()).exists()
            } else {
                true
            };
            if alive {
                continue;
            }
            let reclaiming = (owner & !0xff) | STATE_RECLAIMING;
            if slot
                .owner
                .compare_exchange(owner, reclaiming, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                Region::clear_counters(slot);
                slot.owner.store(STATE_FREE, Ordering::SeqCst);
                freed += 1;
            }
        }
        freed
    }

    /// Fills the host PID of live slots whose owner runs in another PID namespace, for
    /// readers that see host PIDs (NVML inside a container reports them): a process in
    /// `proc_root` (the host's `/proc`) whose PID namespace is the slot's, whose innermost
    /// `NSpid` is the slot's PID and whose start time is the slot's. Returns how many it
    /// filled. Cheap when there is nothing to fill: no scan at all.
    pub fn fill_host_pids(&self, proc_root: &Path) -> usize {
        let wanted: Vec<(usize, i32, u64, u64)> = (0..self.scan_end())
            .filter_map(|index| {
                let slot = self.slot(index);
                let owner = slot.owner.load(Ordering::SeqCst);
                let pid_ns = slot.pid_ns.load(Ordering::SeqCst);
                let unknown =
                    owner & 0xff == STATE_LIVE && slot.host_pid.load(Ordering::SeqCst) == 0;
                (unknown && pid_ns != 0 && pid_ns != process::INIT_PID_NS).then(|| {
                    (
                        index,
                        (owner >> 32) as i32,
                        pid_ns,
                        slot.start_time.load(Ordering::SeqCst),
                    )
                })
            })
            .collect();
        if wanted.is_empty() {
            return 0;
        }
        let Ok(entries) = std::fs::read_dir(proc_root) else {
            return 0;
        };
        let mut filled = 0;
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
            for &(slot_index, pid, slot_ns, slot_start) in &wanted {
                if slot_ns == ns && inner == Some(pid) && started == Some(slot_start) {
                    self.set_host_pid(slot_index, host_pid);
                    filled += 1;
                }
            }
        }
        filled
    }
}

/// Read access to the bytes of a region, whether a live shared mapping ([`Region`]) or a
/// private copy ([`crate::snapshot::RegionSnapshot`]): one set of readers for both, so
/// the host side parses a copy exactly as the shims read the mapping.
pub(crate) trait RegionBytes {
    /// The first byte: `REGION_LEN` bytes, 64-byte aligned at least.
    fn base(&self) -> *const u8;

    fn header(&self) -> &Header {
        // SAFETY: `base` points at REGION_LEN bytes, aligned for Header (page-aligned
        // mapping, or the 64-byte aligned copy), and Header fits the first page; every
        // field is plain data or an atomic, valid for any bit pattern.
        unsafe { &*(self.base() as *const Header) }
    }

    fn slot(&self, index: usize) -> &Slot {
        let index = index.min(MAX_SLOTS - 1);
        // SAFETY: slots follow the header and `index` is clamped below MAX_SLOTS, so the
        // record lies inside the REGION_LEN bytes; Slot is made of atomics, valid for any
        // bit pattern, and 64-byte aligned like the base.
        unsafe { &*(self.base().add(SLOTS_OFFSET) as *const Slot).add(index) }
    }

    /// Validates the header; the reason when it is not a region of ours.
    fn check(&self) -> Result<(), String> {
        let header = self.header();
        if header.magic != MAGIC {
            return Err("bad magic (not a vgpu usage region)".into());
        }
        if header.version != VERSION {
            return Err(format!(
                "version {} (this build reads {VERSION})",
                header.version
            ));
        }
        if header.layout != layout_fingerprint() {
            return Err("layout fingerprint differs".into());
        }
        if header.total_len != REGION_LEN as u64 {
            return Err(format!("recorded length {}", header.total_len));
        }
        if header.device_count as usize > MAX_DEVICES {
            return Err(format!("{} devices", header.device_count));
        }
        if header.checksum != Region::immutable_checksum(header) {
            return Err("header checksum mismatch".into());
        }
        if header.high_water.load(Ordering::Acquire) as usize > MAX_SLOTS {
            return Err("slot high-water mark out of range".into());
        }
        Ok(())
    }

    /// The devices recorded at creation.
    fn devices(&self) -> Vec<RegionDevice> {
        let header = self.header();
        header.devices[..header.device_count as usize]
            .iter()
            .map(|record| {
                let end = record.id.iter().position(|b| *b == 0).unwrap_or(UUID_LEN);
                RegionDevice {
                    id: String::from_utf8_lossy(&record.id[..end]).into_owned(),
                    memory_limit: record.memory_limit,
                    core_limit: record.core_limit,
                    core_mode: record.core_mode,
                }
            })
            .collect()
    }

    fn scan_end(&self) -> usize {
        (self.header().high_water.load(Ordering::SeqCst) as usize).min(MAX_SLOTS)
    }

    /// Bytes held on `device` by all processes.
    fn device_used(&self, device: usize) -> u64 {
        if device >= MAX_DEVICES {
            return 0;
        }
        (0..self.scan_end())
            .map(|index| self.slot(index).used[device].load(Ordering::SeqCst))
            .fold(0u64, u64::saturating_add)
    }

    /// A copy of the compute limiter's container-wide words for `device`.
    fn container_limiter_words(&self, device: usize) -> [u64; CONTAINER_LIMITER_WORDS] {
        let block = &self.header().limiter[device.min(MAX_DEVICES - 1)];
        std::array::from_fn(|word| block[word].load(Ordering::SeqCst))
    }

    /// A copy of the compute limiter's words of slot `index` for `device`.
    fn slot_limiter_words(&self, index: usize, device: usize) -> [u64; SLOT_LIMITER_WORDS] {
        let block = &self.slot(index).limiter[device.min(MAX_DEVICES - 1)];
        std::array::from_fn(|word| block[word].load(Ordering::SeqCst))
    }

    /// Every live process and its counters.
    fn processes(&self) -> Vec<ProcessUsage> {
        let device_count = self.header().device_count as usize;
        let read = |counters: &[AtomicU64; MAX_DEVICES]| -> Vec<u64> {
            counters[..device_count]
                .iter()
                .map(|c| c.load(Ordering::SeqCst))
                .collect()
        };
        (0..self.scan_end())
            .filter_map(|index| {
                let slot = self.slot(index);
                let owner = slot.owner.load(Ordering::SeqCst);
                (owner & 0xff == STATE_LIVE).then(|| ProcessUsage {
                    slot: index,
                    pid: (owner >> 32) as i32,
                    host_pid: slot.host_pid.load(Ordering::SeqCst),
                    start_time: slot.start_time.load(Ordering::SeqCst),
                    pid_ns: slot.pid_ns.load(Ordering::SeqCst),
                    used: read(&slot.used),
                    context: read(&slot.context),
                    busy_ns: read(&slot.busy_ns),
                    launches: read(&slot.launches),
                })
            })
            .collect()
    }
}

impl RegionBytes for Region {
    fn base(&self) -> *const u8 {
        self.map.base()
    }
}

impl Region {
    /// The devices recorded at creation.
    pub fn devices(&self) -> Vec<RegionDevice> {
        RegionBytes::devices(self)
    }

    /// Bytes held on `device` by all processes.
    pub fn device_used(&self, device: usize) -> u64 {
        RegionBytes::device_used(self, device)
    }

    /// Every live process and its counters.
    pub fn processes(&self) -> Vec<ProcessUsage> {
        RegionBytes::processes(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn devices() -> Vec<RegionDevice> {
        vec![RegionDevice {
            id: "GPU-test".into(),
            memory_limit: 1 << 30,
            core_limit: 30,
            core_mode: 0,
        }]
    }

    #[test]
    fn create_attach_and_reserve() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("r");
        let (region, outcome) = Region::open(&path, &devices()).expect("open");
        assert_eq!(outcome, OpenOutcome::Created);
        let me = process::current();
        let slot = region.attach(&me).expect("attach");
        assert!(region.try_reserve(slot, 0, 768 << 20, 1 << 30));
        assert!(!region.try_reserve(slot, 0, 512 << 20, 1 << 30));
        assert_eq!(region.device_used(0), 768 << 20);
        region.release(slot, 0, 768 << 20);
        assert_eq!(region.device_used(0), 0);
        let (again, outcome) = Region::open(&path, &devices()).expect("reopen");
        assert_eq!(outcome, OpenOutcome::Attached);
        assert_eq!(again.devices(), devices());
    }

    #[test]
    fn corrupt_and_foreign_regions_are_rebuilt() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("r");
        drop(Region::open(&path, &devices()).expect("open"));
        let mut bytes = std::fs::read(&path).expect("read");
        bytes[200] ^= 0xff; // inside the device table
        std::fs::write(&path, &bytes).expect("write");
        let (_, outcome) = Region::open(&path, &devices()).expect("reopen");
        assert!(
            matches!(outcome, OpenOutcome::Rebuilt(ref why) if why.contains("checksum")),
            "{outcome:?}"
        );
        std::fs::write(&path, b"not a region").expect("write");
        let (_, outcome) = Region::open(&path, &devices()).expect("reopen");
        assert!(matches!(outcome, OpenOutcome::Rebuilt(_)));
        assert!(Region::open_existing(&path).is_ok());
        std::fs::write(&path, vec![7u8; REGION_LEN]).expect("write");
        assert!(Region::open_existing(&path).is_err());
        let mut other = devices();
        other[0].memory_limit = 2 << 30;
        let (_, outcome) = Region::open(&path, &other).expect("reopen");
        assert!(matches!(outcome, OpenOutcome::Rebuilt(_)));
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
        assert_eq!(region.processes()[0].host_pid, 0);
        assert_eq!(region.fill_host_pids(&proc_root), 1);
        assert_eq!(region.processes()[0].host_pid, 3100);
        assert_eq!(
            region.fill_host_pids(&proc_root),
            0,
            "nothing left to fill: no scan"
        );
        region.detach(slot);
    }

    #[test]
    fn threads_never_pass_the_limit_together() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (region, _) = Region::open(&dir.path().join("r"), &devices()).expect("open");
        let region = std::sync::Arc::new(region);
        let limit = 1000u64;
        // What the threads hold after a successful reservation: never above the limit.
        // (The region's own sum may pass it for an instant while a racing reservation
        // that is about to back off is counted; that is conservative, never a grant.)
        let committed = std::sync::Arc::new(AtomicU64::new(0));
        let handles: Vec<_> = (0..8)
            .map(|t| {
                let region = region.clone();
                let committed = committed.clone();
                std::thread::spawn(move || {
                    let me = Identity {
                        start_time: 1_000_000 + t,
                        ..process::current()
                    };
                    let slot = region.attach(&me).expect("attach");
                    let mut held = 0u64;
                    for i in 0..20_000u64 {
                        let size = 1 + (i * 7 + t) % 97;
                        if region.try_reserve(slot, 0, size, limit) {
                            held += size;
                            let now = committed.fetch_add(size, Ordering::SeqCst) + size;
                            assert!(now <= limit, "{now} bytes held under a limit of {limit}");
                        }
                        if i % 3 == 0 && held > 0 {
                            committed.fetch_sub(held, Ordering::SeqCst);
                            region.release(slot, 0, held);
                            held = 0;
                        }
                    }
                    committed.fetch_sub(held, Ordering::SeqCst);
                    region.release(slot, 0, held);
                })
            })
            .collect();
        for handle in handles {
            handle.join().expect("thread");
        }
        assert_eq!(region.device_used(0), 0);
    }
}
