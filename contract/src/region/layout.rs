//! The region's layout: the fixed-size records a container's processes share (header,
//! device table, slots, the word blocks placed for others), their offsets in the file,
//! the layout fingerprint and checksum, and the writing of a fresh header. Version 3:
//! an 8 KiB header, then `MAX_SLOTS` cache-line-aligned process slots. Nothing here
//! reads a tenant's file; the checks of what was read live in [`super::read`].

use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};

use crate::config::MAX_DEVICES;
use crate::mapped::{FNV_OFFSET, fnv1a};

/// Process slots per container.
pub const MAX_SLOTS: usize = 256;
/// Layout version; bump on any change of the structs below.
pub const VERSION: u32 = 3;
/// Words of the limiter's container-wide block, per device.
pub const CONTAINER_LIMITER_WORDS: usize = 16;
/// Words of the limiter's per-process block, per device.
pub const SLOT_LIMITER_WORDS: usize = 4;
/// Words of the container-wide counter block, per device (see [`counter`](super::counter)).
pub const COUNTER_WORDS: usize = 8;

pub(super) const MAGIC: [u8; 8] = *b"VGPUREG\0";
pub(super) const HEADER_LEN: usize = 8192;
pub(super) const UUID_LEN: usize = 96;

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
pub(super) struct DeviceRecord {
    pub(super) id: [u8; UUID_LEN],
    pub(super) memory_limit: u64,
    pub(super) core_limit: u32,
    pub(super) core_mode: u32,
}

#[repr(C)]
pub(crate) struct Header {
    pub(super) magic: [u8; 8],
    pub(super) version: u32,
    pub(super) device_count: u32,
    pub(super) layout: u64,
    pub(super) total_len: u64,
    pub(super) checksum: u64,
    /// One more than the highest slot index ever claimed: scans stop there.
    pub(super) high_water: AtomicU32,
    pub(super) _reserved: u32,
    pub(super) devices: [DeviceRecord; MAX_DEVICES],
    /// Reserved for the compute limiter: its container-wide words, per device.
    pub(super) limiter: LimiterBlock,
    /// The container-wide counters ([`counter`](super::counter)), per device.
    pub(super) counters: CounterBlock,
}

/// The header's counter words, cache-line aligned.
#[repr(C, align(64))]
pub(super) struct CounterBlock(pub(super) [[AtomicU64; COUNTER_WORDS]; MAX_DEVICES]);

/// The header's limiter words, cache-line aligned.
#[repr(C, align(64))]
pub(super) struct LimiterBlock(pub(super) [[AtomicU64; CONTAINER_LIMITER_WORDS]; MAX_DEVICES]);

/// Per-process counters, one set per device.
#[repr(C, align(64))]
pub(crate) struct Slot {
    /// `pid << 32 | nonce << 8 | state`, so a claimer's PID is visible the instant it
    /// claims, and a compare-and-swap never acts on a slot that changed hands.
    pub(super) owner: AtomicU64,
    pub(super) start_time: AtomicU64,
    pub(super) pid_ns: AtomicU64,
    /// The owner's PID in the host namespace, 0 while unknown (the host daemon fills it).
    pub(super) host_pid: AtomicI32,
    pub(super) _pad: u32,
    /// Device bytes held, context overhead included.
    pub(super) used: [AtomicU64; MAX_DEVICES],
    /// Of `used`, what context creation took.
    pub(super) context: [AtomicU64; MAX_DEVICES],
    /// GPU busy time the compute limiter measured, nanoseconds.
    pub(super) busy_ns: [AtomicU64; MAX_DEVICES],
    /// Kernel launches seen.
    pub(super) launches: [AtomicU64; MAX_DEVICES],
    /// Reserved for the compute limiter: this process's words, per device.
    pub(super) limiter: [[AtomicU64; SLOT_LIMITER_WORDS]; MAX_DEVICES],
}

pub(super) const SLOTS_OFFSET: usize = HEADER_LEN;

/// Byte offset of slot `index` in the file.
pub(super) fn slot_offset(index: usize) -> u64 {
    (SLOTS_OFFSET + index * std::mem::size_of::<Slot>()) as u64
}

/// Byte offset of slot `index`'s host PID in the file (for `pwrite` by the host).
pub(crate) fn host_pid_offset(index: usize) -> usize {
    slot_offset(index) as usize + std::mem::offset_of!(Slot, host_pid)
}

/// Bytes of a region file.
pub const REGION_LEN: usize = SLOTS_OFFSET + MAX_SLOTS * std::mem::size_of::<Slot>();
const _: () = assert!(std::mem::size_of::<Header>() <= HEADER_LEN);

pub(super) const fn layout_fingerprint() -> u64 {
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

/// Writes a fresh header for `devices` at `base` (a zeroed or valid header: the slot
/// high-water mark and the limiter's words are left as they are).
///
/// # Safety
/// `base` points at `HEADER_LEN` writable bytes, 64-byte aligned, that no other thread
/// writes meanwhile (the init lock, or a private buffer).
pub(super) unsafe fn write_header(base: *mut u8, devices: &[RegionDevice]) {
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
pub(super) unsafe fn write_devices(base: *mut u8, devices: &[RegionDevice]) {
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

pub(super) fn checksum(header: &Header) -> u64 {
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
pub(super) fn device_ranges() -> [std::ops::Range<usize>; 3] {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
