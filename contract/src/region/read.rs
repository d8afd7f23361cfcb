//! Reading a region, whether the live shared mapping or the host's private copy: the
//! header's checks (magic, version, layout fingerprint, length, device count, checksum,
//! slot high-water mark) and the readers of devices, usage and processes. The file is
//! tenant-writable, so every count a reader takes is clamped to [`MAX_COUNT`] and every
//! index is bounded before use.

use std::sync::atomic::{AtomicU64, Ordering};

use super::Region;
use super::layout::{
    CONTAINER_LIMITER_WORDS, Header, MAGIC, MAX_SLOTS, REGION_LEN, RegionDevice,
    SLOT_LIMITER_WORDS, SLOTS_OFFSET, Slot, UUID_LEN, VERSION, checksum, layout_fingerprint,
};
use super::slots::{STATE_CLAIMING, STATE_LIVE, pid_of, state_of};
use super::words::{QuotaCounters, counter};
use crate::config::MAX_DEVICES;

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

/// The largest count any reader takes from a region (1 PiB, or 2^50 ns or launches):
/// a tenant can write anything into its file, and sums of clamped counts never wrap.
pub const MAX_COUNT: u64 = 1 << 50;

pub(super) fn count(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::SeqCst).min(MAX_COUNT)
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::{self, Identity};
    use crate::region::test_devices as devices;

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
}
