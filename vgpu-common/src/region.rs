//! The cross-process usage region: one file-backed shared mapping per container,
//! written by every CUDA process of the container (through libcuda-shim) and read by
//! the NVML shim and the host daemon.
//!
//! Layout (version 3), all little-endian, fixed size:
//! - an 8 KiB header: magic, version, a layout fingerprint, the length, the devices and
//!   their limits, a checksum over those fields, per device a block of 16 words
//!   reserved for the compute limiter's container-wide state
//!   ([`Region::container_limiter`]), and per device a block of 8 container-wide
//!   counters of what the quota did to the container ([`counter`]: refusals, bytes
//!   refused, time launches waited, times over quota), which outlive the processes that
//!   bump them;
//! - `MAX_SLOTS` process slots, one cache-line-aligned record each, holding the owner
//!   (PID, state), its start time and PID namespace, per-device counters, and per device
//!   4 words reserved for the limiter's per-process state ([`Region::slot_limiter`]).
//!   The limiter defines what its words mean; this module only places them.
//!
//! Accounting is lock-free, so a process that dies at any instruction can never leave a
//! lock held. To reserve, a process adds to its own slot and then sums every slot: the
//! sequentially consistent add-then-sum means that of two racing reservations, the later
//! one always sees both, so the quota can never be passed. A dead process's slot is found
//! by PID and start time (PID reuse is no trap) and zeroed, which credits its usage back
//! exactly; slots change owner only by compare-and-swap on an owner word that carries a
//! per-claim nonce.
//!
//! Live usage is never erased: a region whose magic, version, fingerprint, length or
//! checksum is wrong, or that records other devices, is rebuilt only when no live process
//! holds it (each holder keeps a shared lock on the file, see [`crate::mapped`]); while
//! one does, it is refused and left as it is. A new quota for the same devices is written
//! into the header in place, under the init lock, keeping every slot. Every count a
//! reader takes from the file is clamped to [`MAX_COUNT`].

use std::io;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use crate::config::MAX_DEVICES;
use crate::mapped::{self, Access, FNV_OFFSET, InitLock, MappedFile, fnv1a};
use crate::process::{self, Identity, Liveness};
use crate::snapshot::RegionSnapshot;

/// Process slots per container.
pub const MAX_SLOTS: usize = 256;
/// Layout version; bump on any change of the structs below.
pub const VERSION: u32 = 3;
/// Words of the limiter's container-wide block, per device.
pub const CONTAINER_LIMITER_WORDS: usize = 16;
/// Words of the limiter's per-process block, per device.
pub const SLOT_LIMITER_WORDS: usize = 4;
/// Words of the container-wide counter block, per device (see [`counter`]).
pub const COUNTER_WORDS: usize = 8;

/// What the words of the container-wide counter block mean, per device
/// ([`Region::count_refusal`], [`Region::add_throttled`], [`Region::count_over_quota`];
/// readers: [`QuotaCounters`]). Each is bumped with one relaxed atomic add by whichever
/// process of the container saw the event, so they count for the container, survive
/// the exit of the process that bumped them, and are zero only in a new region. A
/// tenant can write anything into them: readers clamp every word to [`MAX_COUNT`] and
/// the host's running totals never step back ([`QuotaCounters::fold`]).
pub mod counter {
    /// Allocations refused at the memory quota.
    pub const REFUSALS: usize = 0;
    /// Bytes those refusals asked for, in all.
    pub const REFUSED_BYTES: usize = 1;
    /// Nanoseconds the container's launches waited for the compute limit, in all.
    pub const THROTTLED_NS: usize = 2;
    /// Times the container was found holding more than its quota: what the driver
    /// reserved on its own (module data, heap, stack) or a reconciliation with NVML's
    /// figure put it over, though no hooked allocation passed it.
    pub const OVER_QUOTA: usize = 3;
    /// The size of the latest refused allocation, bytes.
    pub const LAST_ASKED: usize = 4;
    /// What the container held on the device at the latest refusal, bytes.
    pub const LAST_HELD: usize = 5;
    /// Times the host (the coordinator's NVML reconciliation) found the container over
    /// its quota. Written by the host alone, with file I/O
    /// ([`crate::snapshot::count_over_quota_by_io`]): one writer, so its
    /// read-modify-write loses nothing. Readers add it to [`OVER_QUOTA`].
    pub const HOST_OVER_QUOTA: usize = 6;
}

/// Byte offset of counter `word` of `device` in the file (for `pread`/`pwrite` by the
/// host); `None` out of range.
pub(crate) fn counter_offset(device: usize, word: usize) -> Option<u64> {
    (device < MAX_DEVICES && word < COUNTER_WORDS).then(|| {
        (std::mem::offset_of!(Header, counters)
            + (device * COUNTER_WORDS + word) * std::mem::size_of::<u64>()) as u64
    })
}
const MAGIC: [u8; 8] = *b"VGPUREG\0";
const HEADER_LEN: usize = 8192;
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
    /// Reserved for the compute limiter: its container-wide words, per device.
    limiter: LimiterBlock,
    /// The container-wide counters ([`counter`]), per device.
    counters: CounterBlock,
}

/// The header's counter words, cache-line aligned.
#[repr(C, align(64))]
struct CounterBlock([[AtomicU64; COUNTER_WORDS]; MAX_DEVICES]);

/// The header's limiter words, cache-line aligned.
#[repr(C, align(64))]
struct LimiterBlock([[AtomicU64; CONTAINER_LIMITER_WORDS]; MAX_DEVICES]);

/// Per-process counters, one set per device.
#[repr(C, align(64))]
pub(crate) struct Slot {
    /// `pid << 32 | nonce << 8 | state`, so a claimer's PID is visible the instant it
    /// claims, and a compare-and-swap never acts on a slot that changed hands.
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
    /// Reserved for the compute limiter: this process's words, per device.
    limiter: [[AtomicU64; SLOT_LIMITER_WORDS]; MAX_DEVICES],
}

const SLOTS_OFFSET: usize = HEADER_LEN;

/// Byte offset of slot `index` in the file.
fn slot_offset(index: usize) -> u64 {
    (SLOTS_OFFSET + index * std::mem::size_of::<Slot>()) as u64
}

/// Byte offset of slot `index`'s host PID in the file (for `pwrite` by the host).
pub(crate) fn host_pid_offset(index: usize) -> usize {
    slot_offset(index) as usize + std::mem::offset_of!(Slot, host_pid)
}

/// Frees slot `index` of an open region file with `pread`/`pwrite` if its owner word is
/// still `owner`: marks it reclaiming, zeroes its counters (crediting its usage back),
/// clears its host PID, marks it free with the claim's nonce kept. Not atomic against a
/// concurrent reclaimer of the same slot: only for a caller that is the one judge of
/// the slot (the init of a PID namespace whose processes are all gone).
pub(crate) fn free_slot_by_io(file: &std::fs::File, index: usize, owner: u64) -> io::Result<bool> {
    if index >= MAX_SLOTS {
        return Ok(false);
    }
    let base = slot_offset(index);
    let owner_at = base + std::mem::offset_of!(Slot, owner) as u64;
    let mut now = [0u8; 8];
    file.read_exact_at(&mut now, owner_at)?;
    if u64::from_le_bytes(now) != owner {
        return Ok(false);
    }
    file.write_all_at(&with_state(owner, STATE_RECLAIMING).to_le_bytes(), owner_at)?;
    let counters = std::mem::offset_of!(Slot, used);
    let zeros = vec![0u8; std::mem::size_of::<Slot>() - counters];
    file.write_all_at(&zeros, base + counters as u64)?;
    file.write_all_at(&0i32.to_le_bytes(), host_pid_offset(index) as u64)?;
    let free = owner_word(0, nonce_of(owner), STATE_FREE);
    file.write_all_at(&free.to_le_bytes(), owner_at)?;
    Ok(true)
}

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
        std::mem::offset_of!(Header, limiter) as u64,
        std::mem::offset_of!(Slot, limiter) as u64,
        CONTAINER_LIMITER_WORDS as u64,
        SLOT_LIMITER_WORDS as u64,
        std::mem::offset_of!(Header, counters) as u64,
        COUNTER_WORDS as u64,
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
    /// The file could not be opened, sized or mapped.
    #[error("usage region {path}: {source}")]
    Io {
        /// The region file.
        path: PathBuf,
        /// What the system said.
        source: io::Error,
    },
    /// The file is no usable region (and could not be rebuilt).
    #[error("usage region {path}: {reason}")]
    Invalid {
        /// The region file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The region fails its checks (or belongs to other devices) while live processes
    /// hold it: rebuilding it would erase their usage, so it is left as it is.
    #[error("usage region {path}: {reason}, and live processes still hold it; it is left as it is")]
    Held {
        /// The region file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// More devices than a region records.
    #[error("usage region: {0} devices, at most {MAX_DEVICES}")]
    TooManyDevices(usize),
    /// No process slot is free.
    #[error("usage region {0}: all {MAX_SLOTS} process slots are held by live processes")]
    Full(PathBuf),
}

/// How an open (or the host's creation) treated the file it found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpenOutcome {
    /// The file was new or empty and was initialised.
    Created,
    /// A valid region for these devices and limits, used as it was.
    Attached,
    /// A valid region for these devices whose limits were rewritten in place (a new
    /// quota for a running container); every process's usage is kept.
    LimitsUpdated,
    /// The file was corrupt, foreign, of another length or for other devices, and no
    /// live process held it, so it was rebuilt; the reason.
    Rebuilt(String),
}

/// One process's usage, for readers. Every count is clamped to [`MAX_COUNT`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessUsage {
    /// Its slot in the region.
    pub slot: usize,
    /// Its PID in its own namespace.
    pub pid: i32,
    /// Its PID on the host, as the host filled it in (0 until then).
    pub host_pid: i32,
    /// When it started (clock ticks after boot), to tell a reused PID apart.
    pub start_time: u64,
    /// Its PID namespace's inode.
    pub pid_ns: u64,
    /// Bytes it holds, per device.
    pub used: Vec<u64>,
    /// Of those, its contexts' overhead, per device.
    pub context: Vec<u64>,
    /// GPU time its kernels took, per device, in ns.
    pub busy_ns: Vec<u64>,
    /// Kernel launches, per device.
    pub launches: Vec<u64>,
}

/// A container's counters on one device, as read from its region's counter block
/// ([`counter`]); every word clamped to [`MAX_COUNT`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QuotaCounters {
    /// Allocations refused at the memory quota.
    pub refusals: u64,
    /// Bytes those refusals asked for.
    pub refused_bytes: u64,
    /// Nanoseconds launches waited for the compute limit.
    pub throttled_ns: u64,
    /// Times the container was found over its memory quota (by its shims, and by the
    /// host).
    pub over_quota: u64,
    /// The size of the latest refused allocation.
    pub last_asked: u64,
    /// What the container held at the latest refusal.
    pub last_held: u64,
}

impl QuotaCounters {
    /// The four running totals (refusals, bytes refused, throttled time, over quota).
    fn totals(self) -> [u64; 4] {
        [
            self.refusals,
            self.refused_bytes,
            self.throttled_ns,
            self.over_quota,
        ]
    }

    /// Folds a new reading `now` into running totals kept by a reader (`self`, with
    /// `last` the reading it saw before): a word that went back (a rebuilt region, or a
    /// tenant writing its file) starts counting again from its new value, so a total
    /// never decreases. The `last_*` figures are taken from `now`.
    pub fn fold(self, last: QuotaCounters, now: QuotaCounters) -> QuotaCounters {
        let mut totals = self.totals();
        for ((total, before), after) in totals.iter_mut().zip(last.totals()).zip(now.totals()) {
            let grew = if after >= before {
                after - before
            } else {
                after
            };
            *total = total.saturating_add(grew);
        }
        QuotaCounters {
            refusals: totals[0],
            refused_bytes: totals[1],
            throttled_ns: totals[2],
            over_quota: totals[3],
            last_asked: now.last_asked,
            last_held: now.last_held,
        }
    }
}

/// The largest count any reader takes from a region (1 PiB, or 2^50 ns or launches):
/// a tenant can write anything into its file, and sums of clamped counts never wrap.
pub const MAX_COUNT: u64 = 1 << 50;

fn count(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::SeqCst).min(MAX_COUNT)
}

/// The owner word: `pid << 32 | nonce << 8 | state`. The nonce changes with every claim,
/// so a compare-and-swap on the word can never act on a slot that changed hands since.
fn owner_word(pid: i32, nonce: u64, state: u64) -> u64 {
    ((pid as u32 as u64) << 32) | ((nonce & 0x00ff_ffff) << 8) | state
}

fn state_of(owner: u64) -> u64 {
    owner & 0xff
}

fn pid_of(owner: u64) -> i32 {
    (owner >> 32) as i32
}

fn nonce_of(owner: u64) -> u64 {
    (owner >> 8) & 0x00ff_ffff
}

/// The owner word of the same claim in another state.
fn with_state(owner: u64, state: u64) -> u64 {
    (owner & !0xff) | state
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

/// A claimed slot of this process: its index and the owner word of the claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotId {
    index: usize,
    owner: u64,
}

impl SlotId {
    /// The slot's index in the region.
    pub fn index(self) -> usize {
        self.index
    }
}

/// How the devices a region records compare with the ones a caller wants.
#[derive(Debug, PartialEq, Eq)]
enum Fit {
    Same,
    /// The same devices in the same order; only limits differ.
    Limits,
    Devices,
}

fn fit(found: &[RegionDevice], wanted: &[RegionDevice]) -> Fit {
    if found == wanted {
        Fit::Same
    } else if found.len() == wanted.len() && found.iter().zip(wanted).all(|(a, b)| a.id == b.id) {
        Fit::Limits
    } else {
        Fit::Devices
    }
}

/// What a found region needs, given what it holds and whether anyone holds it.
fn verdict(
    check: Result<Fit, String>,
    unheld: bool,
    path: &Path,
) -> Result<Option<OpenOutcome>, RegionError> {
    match check {
        Ok(Fit::Same) => Ok(Some(OpenOutcome::Attached)),
        Ok(Fit::Limits) => Ok(Some(OpenOutcome::LimitsUpdated)),
        Ok(Fit::Devices) if unheld => Ok(None),
        Ok(Fit::Devices) => Err(RegionError::Held {
            path: path.to_path_buf(),
            reason: "it records other devices than the config".into(),
        }),
        Err(_) if unheld => Ok(None),
        Err(reason) => Err(RegionError::Held {
            path: path.to_path_buf(),
            reason,
        }),
    }
}

/// Writes a fresh header for `devices` at `base` (a zeroed or valid header: the slot
/// high-water mark and the limiter's words are left as they are).
///
/// # Safety
/// `base` points at `HEADER_LEN` writable bytes, 64-byte aligned, that no other thread
/// writes meanwhile (the init lock, or a private buffer).
unsafe fn write_header(base: *mut u8, devices: &[RegionDevice]) {
    let header = base as *mut Header;
    // SAFETY: per the function's contract; raw writes avoid forming a &mut that would
    // alias other processes' shared references.
    unsafe {
        (*header).version = VERSION;
        (*header).layout = layout_fingerprint();
        (*header).total_len = REGION_LEN as u64;
        (*header).magic = MAGIC;
        write_devices(base, devices);
    }
}

/// Rewrites the device table and the checksum at `base`; the same contract as
/// [`write_header`].
unsafe fn write_devices(base: *mut u8, devices: &[RegionDevice]) {
    let header = base as *mut Header;
    // SAFETY: per the function's contract.
    unsafe {
        for (position, record) in (*header).devices.iter_mut().enumerate() {
            let device = devices.get(position).cloned().unwrap_or_default();
            let bytes = device.id.as_bytes();
            let n = bytes.len().min(UUID_LEN - 1);
            record.id = [0; UUID_LEN];
            record.id[..n].copy_from_slice(&bytes[..n]);
            record.memory_limit = device.memory_limit;
            record.core_limit = device.core_limit;
            record.core_mode = device.core_mode;
        }
        (*header).device_count = devices.len().min(MAX_DEVICES) as u32;
        (*header).checksum = checksum(&*header);
    }
    std::sync::atomic::fence(Ordering::SeqCst);
}

fn checksum(header: &Header) -> u64 {
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

/// The byte ranges of the header that a limit update rewrites: the device count, the
/// checksum and the device table.
fn device_ranges() -> [std::ops::Range<usize>; 3] {
    let at = |offset: usize, len: usize| offset..offset + len;
    [
        at(std::mem::offset_of!(Header, device_count), 4),
        at(std::mem::offset_of!(Header, checksum), 8),
        at(
            std::mem::offset_of!(Header, devices),
            std::mem::size_of::<[DeviceRecord; MAX_DEVICES]>(),
        ),
    ]
}

/// One 64-byte-aligned block of a private copy (the region's records are 64-byte aligned).
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub(crate) struct Block(pub(crate) [u8; 64]);

const _: () = assert!(REGION_LEN.is_multiple_of(64) && HEADER_LEN.is_multiple_of(64));

/// `len` zeroed bytes (a multiple of 64), 64-byte aligned.
pub(crate) fn aligned_zeroed(len: usize) -> Box<[Block]> {
    vec![Block([0; 64]); len / 64].into_boxed_slice()
}

/// The bytes of an aligned buffer.
pub(crate) fn bytes_of(blocks: &mut [Block]) -> &mut [u8] {
    let len = blocks.len() * 64;
    // SAFETY: the blocks are `len` initialised bytes borrowed exclusively; u8 has no
    // invalid values.
    unsafe { std::slice::from_raw_parts_mut(blocks.as_mut_ptr().cast::<u8>(), len) }
}

fn io_error(path: &Path) -> impl Fn(io::Error) -> RegionError + '_ {
    move |source| {
        if source.kind() == io::ErrorKind::InvalidInput {
            RegionError::Invalid {
                path: path.to_path_buf(),
                reason: source.to_string(),
            }
        } else {
            RegionError::Io {
                path: path.to_path_buf(),
                source,
            }
        }
    }
}

/// A region file as an open or a creation found it: under its init lock, with its
/// length and whether any other process holds it (see [`crate::mapped`]).
struct Found {
    file: std::fs::File,
    lock: Option<InitLock>,
    len: u64,
    /// No other holder: we hold the holder lock exclusively.
    unheld: bool,
}

impl Found {
    fn open(
        path: &Path,
        devices: &[RegionDevice],
        follow_links: bool,
        patience: Duration,
    ) -> Result<Found, RegionError> {
        if devices.len() > MAX_DEVICES {
            return Err(RegionError::TooManyDevices(devices.len()));
        }
        let error = io_error(path);
        let access = Access {
            write: true,
            create: true,
            follow_links,
        };
        let file = mapped::open_regular(path, access).map_err(&error)?;
        let lock = InitLock::acquire(&file, patience);
        let len = file.metadata().map_err(&error)?.len();
        let unheld = mapped::hold_exclusive_if_unheld(&file);
        Ok(Found {
            file,
            lock,
            len,
            unheld,
        })
    }

    /// Empties the file into a zeroed one of the region's length (mode 0666, so every
    /// container user can write it) when nobody holds it; else refuses, extending a
    /// short file first so the holders' mappings stay backed (a truncated mapping is
    /// SIGBUS).
    fn reset(&self, path: &Path) -> Result<OpenOutcome, RegionError> {
        let error = io_error(path);
        let reason = format!("length {}, expected {REGION_LEN}", self.len);
        if !self.unheld {
            if self.len < REGION_LEN as u64 {
                let _ = self.file.set_len(REGION_LEN as u64);
            }
            return Err(RegionError::Held {
                path: path.to_path_buf(),
                reason,
            });
        }
        self.file.set_len(0).map_err(&error)?;
        self.file.set_len(REGION_LEN as u64).map_err(&error)?;
        // Best effort: the file may belong to another user.
        let _ = self
            .file
            .set_permissions(std::fs::Permissions::from_mode(0o666));
        Ok(if self.len == 0 {
            OpenOutcome::Created
        } else {
            OpenOutcome::Rebuilt(reason)
        })
    }
}

/// How long a process waits for another's init lock or exclusive check.
const PATIENCE: Duration = Duration::from_secs(2);

/// An open usage region. The mapping lives as long as the value, and so does this
/// process's hold on the file (see [`crate::mapped`]).
pub struct Region {
    map: MappedFile,
}

impl Region {
    /// Opens the region at `path` for `devices` (the shims): creates a missing or empty
    /// file; attaches to a valid one, rewriting its limits in place when only they
    /// differ; rebuilds a corrupt, foreign or resized one, or one for other devices,
    /// only when no live process holds it, and otherwise refuses ([`RegionError::Held`])
    /// and leaves it untouched, so live usage is never erased. The caller then holds the
    /// file until the value is dropped. A FIFO or other special file is refused without
    /// blocking.
    pub fn open(
        path: &Path,
        devices: &[RegionDevice],
    ) -> Result<(Region, OpenOutcome), RegionError> {
        let found = Found::open(path, devices, true, PATIENCE)?;
        let error = io_error(path);
        let Found {
            file,
            lock,
            len,
            unheld,
        } = found;
        let outcome = if len == REGION_LEN as u64 {
            let region = Region {
                map: MappedFile::map(file, path, REGION_LEN).map_err(&error)?,
            };
            let check = RegionBytes::check(&region).map(|()| fit(&region.devices(), devices));
            let reason = check.as_ref().err().cloned();
            let outcome = match verdict(check, unheld, path)? {
                Some(OpenOutcome::LimitsUpdated) => {
                    // SAFETY: under the init lock; the header is the mapping's first page.
                    unsafe { write_devices(region.map.base(), devices) };
                    OpenOutcome::LimitsUpdated
                }
                Some(outcome) => outcome,
                None => {
                    region.map.zero();
                    // SAFETY: under the init lock, with no other holder (checked).
                    unsafe { write_header(region.map.base(), devices) };
                    OpenOutcome::Rebuilt(
                        reason.unwrap_or_else(|| "devices differ from the config".into()),
                    )
                }
            };
            (region, outcome)
        } else {
            let found = Found {
                file,
                lock: None,
                len,
                unheld,
            };
            let outcome = found.reset(path)?;
            let region = Region {
                map: MappedFile::map(found.file, path, REGION_LEN).map_err(&error)?,
            };
            // SAFETY: under the init lock on a freshly zeroed file nobody else holds.
            unsafe { write_header(region.map.base(), devices) };
            (region, outcome)
        };
        // Converts our exclusive check (if it succeeded) into a shared hold.
        mapped::hold_shared(outcome.0.map.file(), PATIENCE);
        drop(lock);
        Ok(outcome)
    }

    /// Creates or updates the region at `path` for `devices` with file I/O only (the
    /// host: the device plugin at PreStart, the DRA driver, `vgpu run`), never mapping
    /// the tenant-writable file and never following a link. The same rules as
    /// [`Region::open`]: a valid region keeps every process's usage (its limits are
    /// rewritten in place if they differ), a damaged one is rebuilt only when no live
    /// process holds it.
    pub fn create_file(path: &Path, devices: &[RegionDevice]) -> Result<OpenOutcome, RegionError> {
        let found = Found::open(path, devices, false, Duration::from_millis(500))?;
        let error = io_error(path);
        let mut image = aligned_zeroed(HEADER_LEN);
        // SAFETY: a private HEADER_LEN buffer, 64-byte aligned.
        unsafe { write_header(image.as_mut_ptr().cast(), devices) };
        let image = bytes_of(&mut image);
        let result = (|| {
            let mut reason = None;
            if found.len == REGION_LEN as u64 {
                let copy = RegionSnapshot::read_file(&found.file, path)?;
                let check = RegionBytes::check(&copy).map(|()| fit(&copy.devices(), devices));
                reason = check.as_ref().err().cloned();
                match verdict(check, found.unheld, path)? {
                    Some(OpenOutcome::LimitsUpdated) => {
                        for range in device_ranges() {
                            found
                                .file
                                .write_all_at(&image[range.clone()], range.start as u64)
                                .map_err(&error)?;
                        }
                        return Ok(OpenOutcome::LimitsUpdated);
                    }
                    Some(outcome) => return Ok(outcome),
                    None => {}
                }
            }
            let outcome = found.reset(path)?;
            found.file.write_all_at(image, 0).map_err(&error)?;
            Ok(match (outcome, reason) {
                (OpenOutcome::Rebuilt(_), Some(reason)) => OpenOutcome::Rebuilt(reason),
                (outcome, _) => outcome,
            })
        })();
        mapped::release_hold(&found.file);
        result
    }

    /// Opens an existing region without changing it (host daemon, NVML readers).
    pub fn open_existing(path: &Path) -> Result<Region, RegionError> {
        let map = MappedFile::open_existing(path, REGION_LEN).map_err(|error| match error {
            Ok(len) => RegionError::Invalid {
                path: path.to_path_buf(),
                reason: format!("length {len}, expected {REGION_LEN}"),
            },
            Err(source) => io_error(path)(source),
        })?;
        let region = Region { map };
        RegionBytes::check(&region).map_err(|reason| RegionError::Invalid {
            path: path.to_path_buf(),
            reason,
        })?;
        Ok(region)
    }

    /// The region's file.
    pub fn path(&self) -> &Path {
        self.map.path()
    }

    /// Claims a slot for `me`, taking back one left by an earlier image of the same
    /// process (after `exec` the PID and start time stay, the device memory does not).
    /// Every change of owner is a compare-and-swap on the slot's owner word.
    pub fn attach(&self, me: &Identity) -> Result<SlotId, RegionError> {
        for index in 0..self.scan_end() {
            let slot = self.slot(index);
            let owner = slot.owner.load(Ordering::SeqCst);
            if state_of(owner) == STATE_LIVE
                && pid_of(owner) == me.pid
                && slot.start_time.load(Ordering::SeqCst) == me.start_time
                && slot.pid_ns.load(Ordering::SeqCst) == me.pid_ns
                && let Some(claimed) = self.claim(index, owner, me)
            {
                return Ok(claimed);
            }
        }
        for attempt in 0..2 {
            for index in 0..MAX_SLOTS {
                let owner = self.slot(index).owner.load(Ordering::SeqCst);
                if state_of(owner) == STATE_FREE
                    && let Some(claimed) = self.claim(index, owner, me)
                {
                    return Ok(claimed);
                }
            }
            if attempt == 0 {
                self.reclaim_dead();
            }
        }
        Err(RegionError::Full(self.map.path().to_path_buf()))
    }

    /// Takes slot `index` from owner word `seen` for `me`, if it still is `seen`.
    fn claim(&self, index: usize, seen: u64, me: &Identity) -> Option<SlotId> {
        let slot = self.slot(index);
        let nonce = nonce_of(seen) + 1;
        let claiming = owner_word(me.pid, nonce, STATE_CLAIMING);
        slot.owner
            .compare_exchange(seen, claiming, Ordering::SeqCst, Ordering::SeqCst)
            .ok()?;
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
        let live = owner_word(me.pid, nonce, STATE_LIVE);
        // Only a reclaimer that judged our PID gone could have moved it meanwhile.
        slot.owner
            .compare_exchange(claiming, live, Ordering::SeqCst, Ordering::SeqCst)
            .ok()?;
        Some(SlotId { index, owner: live })
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

    /// Frees slot `index` held under owner word `owner`, if it still is: zeroes it
    /// (crediting its usage back) and marks it free. False when it changed hands.
    fn free_slot(&self, index: usize, owner: u64) -> bool {
        let slot = self.slot(index);
        if slot
            .owner
            .compare_exchange(
                owner,
                with_state(owner, STATE_RECLAIMING),
                Ordering::SeqCst,
                Ordering::SeqCst,
            )
            .is_err()
        {
            return false;
        }
        Region::clear_counters(slot);
        slot.host_pid.store(0, Ordering::SeqCst);
        // Keep the nonce, so the next claim gets a new owner word.
        slot.owner
            .store(owner_word(0, nonce_of(owner), STATE_FREE), Ordering::SeqCst);
        true
    }

    /// Gives a slot back (clean exit); nothing if it is no longer ours.
    pub fn detach(&self, slot: SlotId) {
        self.free_slot(slot.index, slot.owner);
    }

    /// Adds `bytes` to this process's usage on `device` if the total stays within `limit`.
    /// Returns false, having changed nothing, when it would not.
    pub fn try_reserve(&self, slot: SlotId, device: usize, bytes: u64, limit: u64) -> bool {
        if device >= MAX_DEVICES {
            return false;
        }
        let counter = &self.slot(slot.index).used[device];
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
            self.slot(slot.index).used[device].fetch_add(bytes, Ordering::SeqCst);
        }
    }

    /// Bytes one slot holds on `device` (clamped).
    pub fn slot_used(&self, slot: SlotId, device: usize) -> u64 {
        if device < MAX_DEVICES {
            count(&self.slot(slot.index).used[device])
        } else {
            0
        }
    }

    /// Credits `bytes` back on `device`.
    pub fn release(&self, slot: SlotId, device: usize, bytes: u64) {
        if device < MAX_DEVICES {
            Region::saturating_sub(&self.slot(slot.index).used[device], bytes);
        }
    }

    /// Records context overhead (already part of `used` through `add_used`/`try_reserve`).
    pub fn set_context(&self, slot: SlotId, device: usize, bytes: u64) {
        if device < MAX_DEVICES {
            self.slot(slot.index).context[device].store(bytes, Ordering::SeqCst);
        }
    }

    /// Adds measured GPU busy time and launches (compute limiter, utilization readers).
    pub fn add_busy(&self, slot: SlotId, device: usize, busy_ns: u64, launches: u64) {
        if device < MAX_DEVICES {
            let slot = self.slot(slot.index);
            slot.busy_ns[device].fetch_add(busy_ns, Ordering::Relaxed);
            slot.launches[device].fetch_add(launches, Ordering::Relaxed);
        }
    }

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

    fn saturating_sub(counter: &AtomicU64, bytes: u64) {
        let _ = counter.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |value| {
            Some(value.saturating_sub(bytes))
        });
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

/// A live slot whose owner runs in another PID namespace and has no host PID yet: its
/// index, PID (in its own namespace), PID namespace and start time.
pub(crate) type WantedHostPid = (usize, i32, u64, u64);

/// The host PIDs of `wanted` slots: a process in `proc_root` (the host's `/proc`) whose
/// PID namespace is the slot's, whose innermost `NSpid` is the slot's PID and whose
/// start time is the slot's. Returns (slot index, host PID) pairs; no scan at all when
/// nothing is wanted.
pub(crate) fn find_host_pids(wanted: &[WantedHostPid], proc_root: &Path) -> Vec<(usize, i32)> {
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

    /// The live slots of owners in another PID namespace that have no host PID yet.
    fn wanting_host_pids(&self) -> Vec<WantedHostPid> {
        (0..self.scan_end())
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
            .collect()
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
        if header.checksum != checksum(header) {
            return Err("header checksum mismatch".into());
        }
        if header.high_water.load(Ordering::Acquire) as usize > MAX_SLOTS {
            return Err("slot high-water mark out of range".into());
        }
        Ok(())
    }

    /// The number of devices recorded (clamped).
    fn device_count(&self) -> usize {
        (self.header().device_count as usize).min(MAX_DEVICES)
    }

    /// The devices recorded at creation (or at the last limit update).
    fn devices(&self) -> Vec<RegionDevice> {
        let header = self.header();
        header.devices[..self.device_count()]
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

    /// Bytes held on `device` by all processes (slots being claimed or live; each count
    /// clamped).
    fn device_used(&self, device: usize) -> u64 {
        if device >= MAX_DEVICES {
            return 0;
        }
        (0..self.scan_end())
            .filter(|&index| {
                let state = state_of(self.slot(index).owner.load(Ordering::SeqCst));
                state == STATE_LIVE || state == STATE_CLAIMING
            })
            .map(|index| count(&self.slot(index).used[device]))
            .fold(0u64, u64::saturating_add)
    }

    /// The container's counters on `device` (zeros out of range), each word clamped.
    fn counters(&self, device: usize) -> QuotaCounters {
        let Some(block) = self.header().counters.0.get(device) else {
            return QuotaCounters::default();
        };
        QuotaCounters {
            refusals: count(&block[counter::REFUSALS]),
            refused_bytes: count(&block[counter::REFUSED_BYTES]),
            throttled_ns: count(&block[counter::THROTTLED_NS]),
            over_quota: count(&block[counter::OVER_QUOTA])
                .saturating_add(count(&block[counter::HOST_OVER_QUOTA])),
            last_asked: count(&block[counter::LAST_ASKED]),
            last_held: count(&block[counter::LAST_HELD]),
        }
    }

    /// A copy of the limiter's container-wide words for `device` (zeros out of range).
    fn container_limiter_words(&self, device: usize) -> [u64; CONTAINER_LIMITER_WORDS] {
        let mut words = [0; CONTAINER_LIMITER_WORDS];
        if let Some(block) = self.header().limiter.0.get(device) {
            for (word, atomic) in words.iter_mut().zip(block) {
                *word = atomic.load(Ordering::Acquire);
            }
        }
        words
    }

    /// A copy of the limiter's words of slot `index` for `device` (zeros out of range).
    fn slot_limiter_words(&self, index: usize, device: usize) -> [u64; SLOT_LIMITER_WORDS] {
        let mut words = [0; SLOT_LIMITER_WORDS];
        if index < MAX_SLOTS
            && let Some(block) = self.slot(index).limiter.get(device)
        {
            for (word, atomic) in words.iter_mut().zip(block) {
                *word = atomic.load(Ordering::Acquire);
            }
        }
        words
    }

    /// Every live process and its counters.
    fn processes(&self) -> Vec<ProcessUsage> {
        let device_count = self.device_count();
        let read = |counters: &[AtomicU64; MAX_DEVICES]| -> Vec<u64> {
            counters[..device_count].iter().map(count).collect()
        };
        (0..self.scan_end())
            .filter_map(|index| {
                let slot = self.slot(index);
                let owner = slot.owner.load(Ordering::SeqCst);
                (state_of(owner) == STATE_LIVE && pid_of(owner) > 0).then(|| ProcessUsage {
                    slot: index,
                    pid: pid_of(owner),
                    host_pid: slot.host_pid.load(Ordering::SeqCst).max(0),
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

    /// The container's counters on `device`.
    pub fn counters(&self, device: usize) -> QuotaCounters {
        RegionBytes::counters(self, device)
    }

    fn counter_block(&self, device: usize) -> Option<&[AtomicU64; COUNTER_WORDS]> {
        self.header().counters.0.get(device)
    }

    /// Counts an allocation of `asked` bytes refused at the quota on `device`, while the
    /// container held `held`: four relaxed atomic operations on the header (the refusal
    /// path only).
    pub fn count_refusal(&self, device: usize, asked: u64, held: u64) {
        if let Some(block) = self.counter_block(device) {
            block[counter::REFUSALS].fetch_add(1, Ordering::Relaxed);
            block[counter::REFUSED_BYTES].fetch_add(asked, Ordering::Relaxed);
            block[counter::LAST_ASKED].store(asked, Ordering::Relaxed);
            block[counter::LAST_HELD].store(held, Ordering::Relaxed);
        }
    }

    /// Adds `waited_ns` that a launch waited for the compute limit on `device` (one
    /// relaxed atomic add; the limiter calls it only after it has slept).
    pub fn add_throttled(&self, device: usize, waited_ns: u64) {
        if let Some(block) = self.counter_block(device) {
            block[counter::THROTTLED_NS].fetch_add(waited_ns, Ordering::Relaxed);
        }
    }

    /// Counts one finding that the container holds more than its quota on `device`
    /// (driver reservations, or NVML's figure reconciled past it).
    pub fn count_over_quota(&self, device: usize) {
        if let Some(block) = self.counter_block(device) {
            block[counter::OVER_QUOTA].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The compute limiter's container-wide words for `device` (its own meaning; zero in
    /// a new region). A `device` of `MAX_DEVICES` or more gets a process-local block of
    /// zeros that no other process sees.
    pub fn container_limiter(&self, device: usize) -> &[AtomicU64; CONTAINER_LIMITER_WORDS] {
        match self.header().limiter.0.get(device) {
            Some(block) => block,
            None => &OUT_OF_RANGE_CONTAINER,
        }
    }

    /// The compute limiter's words of this process's `slot` for `device` (zeroed when the
    /// slot is claimed). Out-of-range devices get a process-local block, as above.
    pub fn slot_limiter(&self, slot: SlotId, device: usize) -> &[AtomicU64; SLOT_LIMITER_WORDS] {
        match self.slot(slot.index).limiter.get(device) {
            Some(block) => block,
            None => &OUT_OF_RANGE_SLOT,
        }
    }
}

static OUT_OF_RANGE_CONTAINER: [AtomicU64; CONTAINER_LIMITER_WORDS] =
    [const { AtomicU64::new(0) }; CONTAINER_LIMITER_WORDS];
static OUT_OF_RANGE_SLOT: [AtomicU64; SLOT_LIMITER_WORDS] =
    [const { AtomicU64::new(0) }; SLOT_LIMITER_WORDS];

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
    fn corrupt_and_foreign_regions_are_rebuilt_when_nobody_holds_them() {
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
        let (_, outcome) = Region::open(&path, &devices()).expect("reopen");
        assert!(matches!(outcome, OpenOutcome::Rebuilt(_)));
        let other = vec![RegionDevice {
            id: "GPU-other".into(),
            ..devices()[0].clone()
        }];
        let (_, outcome) = Region::open(&path, &other).expect("reopen");
        assert!(matches!(outcome, OpenOutcome::Rebuilt(_)), "{outcome:?}");
    }

    /// A process holding 600 MiB, its mapping kept, and the path of its region.
    fn holder(dir: &Path) -> (Region, SlotId, PathBuf) {
        let path = dir.join("r");
        let (region, _) = Region::open(&path, &devices()).expect("open");
        let slot = region.attach(&process::current()).expect("attach");
        assert!(region.try_reserve(slot, 0, 600 << 20, 1 << 30));
        (region, slot, path)
    }

    #[test]
    fn a_damaged_region_under_a_live_holder_is_refused_and_never_zeroed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (region, _slot, path) = holder(dir.path());
        // Damage the checksum through a second descriptor (the holder keeps running).
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open");
        file.write_all_at(&[0xff; 8], std::mem::offset_of!(Header, checksum) as u64)
            .expect("pwrite");
        let error = Region::open(&path, &devices()).err().expect("refused");
        assert!(
            matches!(error, RegionError::Held { ref reason, .. } if reason.contains("checksum")),
            "{error}"
        );
        assert!(
            error.to_string().contains("live processes still hold it"),
            "{error}"
        );
        assert_eq!(
            region.device_used(0),
            600 << 20,
            "the holder's usage is intact"
        );
        assert!(matches!(
            Region::create_file(&path, &devices()),
            Err(RegionError::Held { .. })
        ));
        // A resize (truncation) under the holder: the length is restored, never zeroed
        // further, and the region is still refused.
        file.set_len(4096).expect("truncate");
        assert!(matches!(
            Region::open(&path, &devices()),
            Err(RegionError::Held { .. })
        ));
        assert_eq!(
            std::fs::metadata(&path).expect("stat").len(),
            REGION_LEN as u64
        );
        drop(region);
        // Nobody holds it now: rebuilt.
        let (_, outcome) = Region::open(&path, &devices()).expect("reopen");
        assert!(matches!(outcome, OpenOutcome::Rebuilt(_)), "{outcome:?}");
    }

    #[test]
    fn other_devices_under_a_live_holder_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (region, _slot, path) = holder(dir.path());
        let other = vec![RegionDevice {
            id: "GPU-other".into(),
            ..devices()[0].clone()
        }];
        let error = Region::open(&path, &other).err().expect("refused");
        assert!(matches!(error, RegionError::Held { .. }), "{error}");
        assert_eq!(region.device_used(0), 600 << 20);
    }

    #[test]
    fn a_new_quota_for_a_running_container_keeps_its_usage() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (region, slot, path) = holder(dir.path());
        let mut bigger = devices();
        bigger[0].memory_limit = 2 << 30;
        let (second, outcome) = Region::open(&path, &bigger).expect("reopen");
        assert_eq!(outcome, OpenOutcome::LimitsUpdated);
        assert_eq!(second.devices(), bigger);
        assert_eq!(region.devices(), bigger, "the holder's mapping sees it");
        assert_eq!(second.device_used(0), 600 << 20, "usage kept");
        assert_eq!(region.processes()[0].slot, slot.index());
        // The host's file-I/O creator does the same, and says when nothing changed.
        let mut smaller = devices();
        smaller[0].memory_limit = 512 << 20;
        assert_eq!(
            Region::create_file(&path, &smaller).expect("update"),
            OpenOutcome::LimitsUpdated
        );
        assert_eq!(region.devices(), smaller);
        assert_eq!(region.device_used(0), 600 << 20);
        assert_eq!(
            Region::create_file(&path, &smaller).expect("again"),
            OpenOutcome::Attached
        );
        assert!(
            crate::snapshot::RegionSnapshot::read(&path).is_ok(),
            "checksum right"
        );
    }

    #[test]
    fn the_host_creates_regions_by_file_io_and_refuses_links_and_fifos() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("r");
        assert_eq!(
            Region::create_file(&path, &devices()).expect("create"),
            OpenOutcome::Created
        );
        let mode = std::fs::metadata(&path).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode, 0o666, "every container user can write it");
        let (region, outcome) = Region::open(&path, &devices()).expect("shim attaches");
        assert_eq!(outcome, OpenOutcome::Attached);
        assert_eq!(region.devices(), devices());
        drop(region);
        std::fs::File::create(&path).expect("empty it, as the plugin's Allocate does");
        assert_eq!(
            Region::create_file(&path, &devices()).expect("create"),
            OpenOutcome::Created
        );
        std::fs::write(&path, b"junk").expect("junk");
        assert!(matches!(
            Region::create_file(&path, &devices()).expect("rebuild"),
            OpenOutcome::Rebuilt(_)
        ));
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&path, &link).expect("symlink");
        assert!(
            Region::create_file(&link, &devices()).is_err(),
            "no link followed"
        );
        let fifo = dir.path().join("fifo");
        let name = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: mkfifo on a NUL-terminated path we own.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
        assert!(matches!(
            Region::create_file(&fifo, &devices()),
            Err(RegionError::Invalid { .. })
        ));
        assert!(matches!(
            Region::open(&fifo, &devices()),
            Err(RegionError::Invalid { .. })
        ));
    }

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
    fn slots_change_owner_only_by_compare_and_swap() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (region, _) = Region::open(&dir.path().join("r"), &devices()).expect("open");
        let me = process::current();
        let ghost = Identity {
            start_time: me.start_time + 1,
            ..me
        };
        let stale = region.attach(&ghost).expect("attach");
        // Judged dead (another start time under our PID) and reclaimed, then claimed anew.
        assert_eq!(region.reclaim_dead(), 1);
        let fresh = region.attach(&me).expect("attach");
        assert_eq!(fresh.index(), stale.index(), "the same slot, a new claim");
        assert_ne!(fresh, stale);
        region.add_used(fresh, 0, 4096);
        // The old owner's late detach must not free the new owner's slot.
        region.detach(stale);
        assert_eq!(region.device_used(0), 4096);
        assert_eq!(region.processes().len(), 1);
        region.detach(fresh);
        assert_eq!(region.device_used(0), 0);
        assert!(region.processes().is_empty());
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
    fn counts_are_clamped_on_every_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (region, _) = Region::open(&dir.path().join("r"), &devices()).expect("open");
        let a = region.attach(&process::current()).expect("attach");
        let b = region
            .attach(&Identity {
                start_time: 1,
                pid_ns: 1,
                ..process::current()
            })
            .expect("attach");
        region.add_used(a, 0, u64::MAX - 5);
        region.add_used(b, 0, u64::MAX - 5);
        assert_eq!(region.slot_used(a, 0), MAX_COUNT);
        assert_eq!(region.device_used(0), 2 * MAX_COUNT, "no wrap");
        assert!(region.processes().iter().all(|p| p.used[0] == MAX_COUNT));
        assert!(
            !region.try_reserve(a, 0, 1, 1 << 40),
            "a garbage count refuses, never wraps"
        );
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

    #[test]
    fn limiter_words_are_shared_per_container_and_cleared_per_slot() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("r");
        let (region, _) = Region::open(&path, &devices()).expect("open");
        let (other, _) = Region::open(&path, &devices()).expect("second mapping");
        let me = process::current();
        let slot = region.attach(&me).expect("attach");
        region.container_limiter(0)[15].store(77, Ordering::SeqCst);
        region.slot_limiter(slot, 0)[3].store(5, Ordering::SeqCst);
        assert_eq!(other.container_limiter(0)[15].load(Ordering::SeqCst), 77);
        assert_eq!(other.slot_limiter(slot, 0)[3].load(Ordering::SeqCst), 5);
        assert_eq!(other.container_limiter(1)[15].load(Ordering::SeqCst), 0);
        // Out of range: a private block, never another device's words.
        region.container_limiter(MAX_DEVICES)[0].store(9, Ordering::SeqCst);
        assert_eq!(
            region.container_limiter(MAX_DEVICES - 1)[0].load(Ordering::SeqCst),
            0
        );
        // A slot is handed out with its limiter words zeroed.
        region.detach(slot);
        let again = region.attach(&me).expect("attach again");
        assert_eq!(region.slot_limiter(again, 0)[3].load(Ordering::SeqCst), 0);
        assert_eq!(region.container_limiter(0)[15].load(Ordering::SeqCst), 77);
    }

    #[test]
    fn counters_outlive_the_process_and_survive_a_new_quota() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("r");
        let (region, _) = Region::open(&path, &devices()).expect("open");
        let slot = region.attach(&process::current()).expect("attach");
        region.count_refusal(0, 512 << 20, 900 << 20);
        region.count_refusal(0, 256 << 20, 1000 << 20);
        region.add_throttled(0, 1_500_000);
        region.count_over_quota(0);
        // Out of range: nothing, and no panic.
        region.count_refusal(MAX_DEVICES, 1, 1);
        region.add_throttled(MAX_DEVICES + 3, 1);
        region.detach(slot);
        let expected = QuotaCounters {
            refusals: 2,
            refused_bytes: 768 << 20,
            throttled_ns: 1_500_000,
            over_quota: 1,
            last_asked: 256 << 20,
            last_held: 1000 << 20,
        };
        assert_eq!(region.counters(0), expected, "kept after the process left");
        let copy = crate::snapshot::RegionSnapshot::read(&path).expect("copy");
        assert_eq!(copy.counters(0), expected, "the host reads the same");
        assert_eq!(copy.counters(1), QuotaCounters::default());
        assert_eq!(copy.counters(MAX_DEVICES), QuotaCounters::default());
        let mut bigger = devices();
        bigger[0].memory_limit = 2 << 30;
        assert_eq!(
            Region::create_file(&path, &bigger).expect("new quota"),
            OpenOutcome::LimitsUpdated
        );
        assert_eq!(region.counters(0), expected, "a new quota keeps them");
    }

    #[test]
    fn hostile_counters_are_clamped_and_running_totals_never_step_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("r");
        let (region, _) = Region::open(&path, &devices()).expect("open");
        for word in region.header().counters.0[0].iter() {
            word.store(u64::MAX, Ordering::SeqCst);
        }
        let read = region.counters(0);
        assert_eq!(read.refusals, MAX_COUNT);
        assert_eq!(read.last_held, MAX_COUNT);
        let reading = |refusals, bytes| QuotaCounters {
            refusals,
            refused_bytes: bytes,
            ..QuotaCounters::default()
        };
        let mut total = QuotaCounters::default();
        let mut last = QuotaCounters::default();
        for now in [
            reading(3, 300),
            reading(5, 500),
            reading(1, 100),
            reading(2, 250),
        ] {
            total = total.fold(last, now);
            last = now;
        }
        // 3, +2, reset to 1 (+1), +1: 7 refusals; 300 +200 +100 +150 bytes.
        assert_eq!(total.refusals, 7);
        assert_eq!(total.refused_bytes, 750);
        let huge = reading(MAX_COUNT, MAX_COUNT);
        let mut saturated = QuotaCounters {
            refusals: u64::MAX - 1,
            ..QuotaCounters::default()
        };
        saturated = saturated.fold(QuotaCounters::default(), huge);
        assert_eq!(saturated.refusals, u64::MAX, "saturates, never wraps");
    }

    #[test]
    fn layout_version_3_sizes() {
        assert_eq!(VERSION, 3);
        assert_eq!(std::mem::size_of::<Slot>() % 64, 0);
        assert_eq!(std::mem::offset_of!(Header, limiter) % 64, 0);
        assert_eq!(std::mem::offset_of!(Header, counters) % 64, 0);
        assert_eq!(
            REGION_LEN,
            HEADER_LEN + MAX_SLOTS * std::mem::size_of::<Slot>()
        );
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
