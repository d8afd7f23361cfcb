//! The word blocks the region places for others: the container-wide quota counters
//! (what the quota did to the container; this module defines their meaning, bumps them
//! and reads them for the host) and the compute limiter's words (the limiter defines
//! theirs; this module only hands them out).

use std::sync::atomic::{AtomicU64, Ordering};

use super::Region;
use super::layout::{CONTAINER_LIMITER_WORDS, COUNTER_WORDS, Header, SLOT_LIMITER_WORDS};
use super::read::RegionBytes;
use super::slots::SlotId;
use crate::config::MAX_DEVICES;

/// What the words of the container-wide counter block mean, per device
/// ([`Region::count_refusal`], [`Region::add_throttled`], [`Region::count_over_quota`];
/// readers: [`QuotaCounters`]). Each is bumped with one relaxed atomic add by whichever
/// process of the container saw the event, so they count for the container, survive
/// the exit of the process that bumped them, and are zero only in a new region. A
/// tenant can write anything into them: readers clamp every word to [`MAX_COUNT`](super::MAX_COUNT) and
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

/// A container's counters on one device, as read from its region's counter block
/// ([`counter`]); every word clamped to [`MAX_COUNT`](super::MAX_COUNT).
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

impl Region {
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
    use crate::process;
    use crate::region::{MAX_COUNT, OpenOutcome, test_devices as devices};

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
}
