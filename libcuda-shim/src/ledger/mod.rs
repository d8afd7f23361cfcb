//! The ledger: this process's memory account on the card, the one owner of what is
//! counted against the container's quota. A [`Ledger`] is owned by the process state
//! (`crate::process`, one per fork generation) and writes to this process's slot of the
//! usage region; nothing else adds to or takes from that slot's memory counts.
//!
//! Its rules, each a method here or in a module below, and each tested apart from the
//! driver (no FFI: the driver's figures come in as values, a pool's attributes through
//! [`pools::PoolDriver`]):
//! - a byte enters the count by a reservation ([`Ledger::reserve`], checked against the
//!   quota; refused, it leaves nothing counted) that is then recorded or given back
//!   ([`allocations`]); a free credits back exactly what was recorded;
//! - the driver's own per-process figure settles the count up or down
//!   ([`Ledger::settle_with_figure`]): what it holds beyond the records (module code,
//!   what could not be priced) is counted once, never twice;
//! - [`contexts`]: the overhead each context costs, credited with everything allocated
//!   in it when it is destroyed;
//! - [`vmm_counting`] over [`vmm`]: physical VMM memory, alive until its last unmap and
//!   release;
//! - [`pool_counting`] over [`pools`]: memory pools, counted by what they keep
//!   reserved, and trimmed before a refusal when that makes room;
//! - [`reserved`]: the prices of what the driver reserves on its own (module and
//!   library static data, the stack, heap and printf FIFO a context's limits back).
//!
//! The ledger never calls the driver's allocators nor back into a hook: an allocation
//! path (`crate::allocating`) asks it to reserve, makes the real call itself, then hands
//! it the result to record, settle or give back.

pub mod allocations;
pub mod contexts;
pub mod pool_counting;
pub mod pools;
pub mod reserved;
pub mod vmm;
pub mod vmm_counting;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use vgpu_contract::config::MAX_DEVICES;
use vgpu_contract::region::{Region, SlotId};
use vgpu_shimgen::runtime;

use allocations::{AllocKey, Allocation};
use contexts::ContextCharge;
use pools::{Change, PoolDriver, PoolTable};
use vmm::{Freed, VmmTable};

/// This process's memory account (see the module's header).
pub struct Ledger<'r> {
    region: &'r Region,
    /// This process's slot in the region; `None`: every reservation is refused.
    slot: Option<SlotId>,
    /// Single allocations, by pointer, array, module, library or (context, limit).
    allocations: Mutex<HashMap<AllocKey, Allocation>>,
    /// The overhead charged for each context.
    contexts: Mutex<Vec<ContextCharge>>,
    /// Physical allocations (`cuMemCreate`), their references and mappings.
    vmm: Mutex<VmmTable>,
    /// The memory pools this process uses and what each has reserved.
    pools: Mutex<PoolTable>,
    /// Whether some pool holds counted memory (the synchronisation hooks settle only
    /// then, so they cost one load otherwise).
    pools_hold_memory: AtomicBool,
    /// Per device: what the driver holds for this process beyond its records, as its
    /// last figure said (module code loaded later, and the like).
    driver_extra: [AtomicU64; MAX_DEVICES],
}

/// Where a reservation is counted and the quota it is checked against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    /// The device's index in the usage region.
    pub region_index: usize,
    /// The container's quota there (`u64::MAX` when oversubscription is allowed).
    pub limit: u64,
}

/// A reservation in the usage region.
#[derive(Clone, Copy, Debug)]
pub struct Ticket {
    slot: SlotId,
    region_index: usize,
    /// The bytes reserved.
    pub bytes: u64,
}

/// A reservation the quota cannot take (or this process has no slot): nothing was
/// counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refused;

impl<'r> Ledger<'r> {
    /// An empty account in `slot` of `region` (`None`: allocations are refused).
    pub fn new(region: &'r Region, slot: Option<SlotId>) -> Ledger<'r> {
        Ledger {
            region,
            slot,
            allocations: Mutex::new(HashMap::new()),
            contexts: Mutex::new(Vec::new()),
            vmm: Mutex::new(VmmTable::default()),
            pools: Mutex::new(PoolTable::default()),
            pools_hold_memory: AtomicBool::new(false),
            driver_extra: [const { AtomicU64::new(0) }; MAX_DEVICES],
        }
    }

    /// This process's slot, when it has one.
    #[inline]
    pub fn slot(&self) -> Option<SlotId> {
        self.slot
    }

    /// Bytes the whole container holds on the device of region index `index`.
    pub fn used(&self, index: usize) -> u64 {
        self.region.device_used(index)
    }

    /// Bytes this process's slot holds on the device of region index `index`; `None`
    /// when the process has no slot.
    pub fn counted_on(&self, index: usize) -> Option<u64> {
        Some(self.region.slot_used(self.slot?, index))
    }

    /// Reserves `bytes` at `place`, or refuses, having counted nothing. Before refusing
    /// it credits back what dead processes held, settles this process's pools (asking
    /// `driver`) and trims them if what they keep unused makes room.
    pub fn reserve(
        &self,
        place: Place,
        bytes: u64,
        driver: &dyn PoolDriver,
    ) -> Result<Ticket, Refused> {
        let slot = self.slot.ok_or(Refused)?;
        let ticket = Ticket {
            slot,
            region_index: place.region_index,
            bytes,
        };
        if self
            .region
            .try_reserve(slot, place.region_index, bytes, place.limit)
            || self.reserve_making_room(slot, place, bytes, &mut self.pools(), driver)
        {
            Ok(ticket)
        } else {
            Err(Refused)
        }
    }

    /// Gives back a reservation whose allocation failed.
    pub fn unreserve(&self, ticket: Ticket) {
        self.region
            .release(ticket.slot, ticket.region_index, ticket.bytes);
    }

    /// Counts `bytes` the driver already handed out on the device of region index
    /// `index` (an allocation whose device was not known before its call), without a
    /// quota check; the ticket to record, `None` without a slot.
    pub fn count_handed_out(&self, index: usize, bytes: u64) -> Option<Ticket> {
        let slot = self.slot?;
        self.region.add_used(slot, index, bytes);
        Some(Ticket {
            slot,
            region_index: index,
            bytes,
        })
    }

    /// Settles the count on the device of region index `index` with the driver's own
    /// figure for this process, `own`: what the driver holds beyond the records is
    /// counted (once: the previous such figure is replaced, up or down), and the slot's
    /// context figure becomes the contexts' overhead plus it. Returns (before, after),
    /// the figure beyond the records; `None` without a slot.
    pub fn settle_with_figure(&self, index: usize, own: u64) -> Option<(u64, u64)> {
        let slot = self.slot?;
        let extra = self.driver_extra.get(index)?;
        let before = extra.load(Ordering::Acquire);
        let after = beyond_counted(own, self.region.slot_used(slot, index), before);
        if after > before {
            self.region.add_used(slot, index, after - before);
        } else {
            self.region.release(slot, index, before - after);
        }
        extra.store(after, Ordering::Release);
        let contexts = self.context_overhead(index);
        self.region.set_context(slot, index, contexts + after);
        Some((before, after))
    }

    /// The pool table (waiting for it; a poisoned lock is recovered).
    fn pools(&self) -> MutexGuard<'_, PoolTable> {
        runtime::lock(&self.pools)
    }

    /// Records whether some pool of `pools` still holds counted memory.
    fn pools_changed(&self, pools: &PoolTable) {
        self.pools_hold_memory
            .store(pools.holds_memory(), Ordering::Relaxed);
    }

    /// Applies the pool table's changes to this process's slot.
    fn apply(&self, slot: SlotId, changes: impl IntoIterator<Item = Change>) {
        for change in changes {
            let bytes = change.delta.unsigned_abs().min(u64::MAX as u128) as u64;
            if change.delta > 0 {
                self.region.add_used(slot, change.region_index, bytes);
            } else {
                self.region.release(slot, change.region_index, bytes);
            }
        }
    }

    /// Credits what the VMM table freed.
    fn credit(&self, freed: impl IntoIterator<Item = Freed>) {
        if let Some(slot) = self.slot {
            for freed in freed {
                self.region.release(slot, freed.region_index, freed.bytes);
            }
        }
    }
}

/// What the driver holds beyond this process's records: its figure `own` less what
/// the slot counts (`slot_used`) without the previous such figure (`before`).
fn beyond_counted(own: u64, slot_used: u64, before: u64) -> u64 {
    own.saturating_sub(slot_used.saturating_sub(before))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::ledger::pools::tests::FakePools;
    use vgpu_contract::region::RegionDevice;

    pub const MIB: u64 = 1 << 20;

    /// A fresh usage region of two devices in a temporary folder, this process
    /// attached to a slot of its own.
    pub struct Fixture {
        _dir: tempfile::TempDir,
        pub region: Region,
        pub slot: SlotId,
    }

    pub fn fixture() -> Fixture {
        let dir = tempfile::tempdir().expect("temporary folder");
        let devices = [
            RegionDevice {
                id: "GPU-ledger-0".into(),
                memory_limit: 1024 * MIB,
                ..RegionDevice::default()
            },
            RegionDevice {
                id: "GPU-ledger-1".into(),
                memory_limit: 1024 * MIB,
                ..RegionDevice::default()
            },
        ];
        let (region, _) =
            Region::open(&dir.path().join("usage.region"), &devices).expect("open the region");
        let slot = region
            .attach(&vgpu_contract::process::current())
            .expect("a slot");
        Fixture {
            _dir: dir,
            region,
            slot,
        }
    }

    impl Fixture {
        /// A ledger in this fixture's slot, and a pool driver that knows no pool yet.
        pub fn ledger(&self) -> (Ledger<'_>, FakePools) {
            (
                Ledger::new(&self.region, Some(self.slot)),
                FakePools::default(),
            )
        }
    }

    pub const DEVICE_0: Place = Place {
        region_index: 0,
        limit: 1024 * MIB,
    };

    #[test]
    fn a_reservation_over_the_quota_is_refused_leaving_nothing_counted() {
        let f = fixture();
        let (ledger, driver) = f.ledger();
        let first = ledger.reserve(DEVICE_0, 900 * MIB, &driver).expect("fits");
        assert_eq!(first.bytes, 900 * MIB);
        assert_eq!(
            ledger.reserve(DEVICE_0, 200 * MIB, &driver).err(),
            Some(Refused)
        );
        assert_eq!(
            ledger.used(0),
            900 * MIB,
            "the refused 200 MiB left no trace"
        );
        assert_eq!(ledger.counted_on(0), Some(900 * MIB));
        ledger.unreserve(first);
        assert_eq!(
            ledger.used(0),
            0,
            "a failed allocation gives its reservation back"
        );
        assert!(
            ledger.reserve(DEVICE_0, 1024 * MIB, &driver).is_ok(),
            "to the byte"
        );
    }

    #[test]
    fn a_process_without_a_slot_is_refused_everything() {
        let f = fixture();
        let ledger = Ledger::new(&f.region, None);
        let driver = FakePools::default();
        assert_eq!(ledger.reserve(DEVICE_0, 1, &driver).err(), Some(Refused));
        assert_eq!(ledger.count_handed_out(0, MIB).map(|t| t.bytes), None);
        assert_eq!(ledger.settle_with_figure(0, 100 * MIB), None);
        assert_eq!(ledger.counted_on(0), None);
        assert_eq!(ledger.used(0), 0);
    }

    #[test]
    fn the_drivers_figure_settles_the_count_up_and_down_once() {
        let f = fixture();
        let (ledger, driver) = f.ledger();
        let ticket = ledger.reserve(DEVICE_0, 600 * MIB, &driver).expect("fits");
        ledger.record(AllocKey::Pointer(0x1000), ticket, 1);
        // The driver holds 650 MiB for us: 50 MiB of module code beyond the records.
        assert_eq!(ledger.settle_with_figure(0, 650 * MIB), Some((0, 50 * MIB)));
        assert_eq!(ledger.used(0), 650 * MIB);
        // The same figure again counts nothing more.
        assert_eq!(
            ledger.settle_with_figure(0, 650 * MIB),
            Some((50 * MIB, 50 * MIB))
        );
        assert_eq!(ledger.used(0), 650 * MIB);
        // The module went: the driver says 600 again, and the count comes down.
        assert_eq!(ledger.settle_with_figure(0, 600 * MIB), Some((50 * MIB, 0)));
        assert_eq!(ledger.used(0), 600 * MIB);
        // A figure below the records (a free the driver has not seen yet) takes
        // nothing from them.
        assert_eq!(ledger.settle_with_figure(0, 100 * MIB), Some((0, 0)));
        assert_eq!(ledger.used(0), 600 * MIB);
        assert_eq!(
            ledger.settle_with_figure(MAX_DEVICES, 1),
            None,
            "no such device"
        );
    }

    #[test]
    fn what_the_driver_handed_out_unasked_is_counted_past_the_quota() {
        let f = fixture();
        let (ledger, _) = f.ledger();
        let ticket = ledger.count_handed_out(1, 2000 * MIB).expect("a slot");
        assert_eq!(
            ledger.used(1),
            2000 * MIB,
            "already the driver's: counted as it is"
        );
        ledger.record(AllocKey::Pointer(0x2000), ticket, 0);
        ledger.forget(AllocKey::Pointer(0x2000));
        assert_eq!(ledger.used(1), 0);
    }

    #[test]
    fn what_nvml_sees_beyond_our_counts_is_counted_once() {
        // We count 600 MiB (no extra yet); NVML says 650: 50 MiB of module code.
        assert_eq!(beyond_counted(650 * MIB, 600 * MIB, 0), 50 * MIB);
        // Next time the slot holds those 50 as well: still 50, not 100.
        assert_eq!(beyond_counted(650 * MIB, 650 * MIB, 50 * MIB), 50 * MIB);
        // The module was unloaded: NVML says 600 again.
        assert_eq!(beyond_counted(600 * MIB, 650 * MIB, 50 * MIB), 0);
        // NVML below our counts (a free it has not seen yet): nothing extra.
        assert_eq!(beyond_counted(100 * MIB, 600 * MIB, 0), 0);
    }
}
