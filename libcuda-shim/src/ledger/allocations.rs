//! Single allocations (`cuMemAlloc*`, pitched, managed, arrays, modules' and libraries'
//! static data, what a context's limits back, and what pools hand out): once a
//! reservation ([`Ledger::reserve`]) is followed by a successful real call, the
//! allocation path records its ticket under the allocation's key; a free credits back
//! exactly what was recorded, and a destroyed context everything recorded in it.
//!
//! Sizes are charged as the driver spends memory ([`charged_size`]), not as asked.

use vgpu_contract::region::SlotId;
use vgpu_shimgen::runtime;

use super::pools::PoolDriver;
use super::{Ledger, Place, Ticket};

/// What an allocation is keyed by: a device pointer or an array.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AllocKey {
    /// A device pointer (a pitched allocation's surcharge is keyed by
    /// [`AllocKey::pitch_surcharge`]).
    Pointer(u64),
    /// A `CUarray` or `CUmipmappedArray` handle.
    Array(usize),
    /// A module's static data (`CUmodule`).
    Module(usize),
    /// A library's static data (`CUlibrary`).
    Library(usize),
    /// What a context's limit (`CUlimit`) makes the driver reserve beyond its default.
    Limit {
        /// The context.
        context: usize,
        /// The `CUlimit`.
        limit: u32,
    },
}

/// The bit flipped in a pointer to key what a pitched allocation's pitch added
/// (device pointers never have it set, so the key never meets a real pointer's).
const PITCH_SURCHARGE_BIT: u64 = 1 << 63;

impl AllocKey {
    /// The key of the surcharge that the pitch of the pitched allocation at `pointer`
    /// added beyond its width (recorded and freed beside the pointer's own key).
    pub fn pitch_surcharge(pointer: u64) -> AllocKey {
        AllocKey::Pointer(pointer ^ PITCH_SURCHARGE_BIT)
    }
}

/// One recorded allocation.
pub struct Allocation {
    pub(super) ticket: Ticket,
    pub(super) context: usize,
    /// The pool it came from (its memory is counted as the pool's reservation).
    pub(super) pool: Option<usize>,
}

/// Rounds an allocation the way the driver's allocator spends memory: large blocks in
/// 2 MiB pages, small ones in 512-byte units.
pub fn charged_size(bytes: u64) -> u64 {
    const PAGE: u64 = 2 << 20;
    if bytes >= (1 << 20) {
        bytes.div_ceil(PAGE).saturating_mul(PAGE)
    } else {
        bytes.div_ceil(512) * 512
    }
}

impl Ledger<'_> {
    /// Remembers a successful allocation in `context` so that its free credits it back.
    pub fn record(&self, key: AllocKey, ticket: Ticket, context: usize) {
        self.remember(
            key,
            Allocation {
                ticket,
                context,
                pool: None,
            },
        );
    }

    pub(super) fn remember(&self, key: AllocKey, allocation: Allocation) {
        let previous = runtime::lock(&self.allocations).insert(key, allocation);
        if let Some(previous) = previous {
            // The driver reused a key we still held: the old one was freed behind our back.
            self.credit_allocation(previous);
        }
    }

    fn credit_allocation(&self, allocation: Allocation) {
        self.region.release(
            allocation.ticket.slot,
            allocation.ticket.region_index,
            allocation.ticket.bytes,
        );
        if let Some(pool) = allocation.pool {
            let mut pools = self.pools();
            if let Some(change) = pools.freed(pool) {
                self.apply(allocation.ticket.slot, [change]);
            }
        }
    }

    /// The bytes counted under `key` (0 when nothing is).
    pub fn charge_of(&self, key: AllocKey) -> u64 {
        runtime::lock(&self.allocations)
            .get(&key)
            .map_or(0, |allocation| allocation.ticket.bytes)
    }

    /// Credits back the allocation under `key`, if we counted it. A pool allocation
    /// credits nothing: its memory stays reserved in the pool (see `settle_pools`).
    pub fn forget(&self, key: AllocKey) {
        let removed = runtime::lock(&self.allocations).remove(&key);
        if let Some(allocation) = removed {
            self.credit_allocation(allocation);
        }
    }

    /// Credits back everything allocated in `context` (its destruction frees it all),
    /// and settles the pools (asking `driver`), whose allocations went with it.
    pub fn forget_context(&self, context: usize, driver: &dyn PoolDriver) {
        let removed: Vec<Allocation> = {
            let mut allocations = runtime::lock(&self.allocations);
            let keys: Vec<AllocKey> = allocations
                .iter()
                .filter(|(_, a)| a.context == context)
                .map(|(key, _)| *key)
                .collect();
            keys.iter()
                .filter_map(|key| allocations.remove(key))
                .collect()
        };
        for allocation in removed {
            self.credit_allocation(allocation);
        }
        self.settle_pools(None, driver);
    }

    /// The record under `key` (in `context`) becomes `to` bytes at `place`, the slot
    /// holding `from` for it now (a limit's memory following its value up or down).
    pub fn resize(&self, key: AllocKey, context: usize, place: Place, from: u64, to: u64) {
        let Some(slot) = self.slot else { return };
        let _ = runtime::lock(&self.allocations).remove(&key);
        let index = place.region_index;
        if to < from {
            self.region.release(slot, index, from - to);
        } else if to > from {
            self.region.add_used(slot, index, to - from);
        }
        if to > 0 {
            self.record(key, ticket(slot, index, to), context);
        }
    }
}

/// A ticket for `bytes` already counted in `slot` on the device of region index `index`.
fn ticket(slot: SlotId, index: usize, bytes: u64) -> Ticket {
    Ticket {
        slot,
        region_index: index,
        bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::tests::{DEVICE_0, MIB, fixture};

    #[test]
    fn allocations_are_charged_as_the_driver_spends_them() {
        assert_eq!(charged_size(0), 0);
        assert_eq!(charged_size(1), 512);
        assert_eq!(charged_size(512), 512);
        assert_eq!(charged_size(513), 1024);
        assert_eq!(charged_size(MIB - 1), MIB);
        assert_eq!(charged_size(MIB), 2 * MIB, "from 1 MiB up: 2 MiB pages");
        assert_eq!(charged_size(2 * MIB + 1), 4 * MIB);
        assert_eq!(charged_size(3 * MIB), 4 * MIB);
        assert_eq!(charged_size(300 * MIB), 300 * MIB);
        assert_eq!(
            charged_size(u64::MAX),
            u64::MAX,
            "a size past the last page saturates: it is refused, never wrapped to 0"
        );
    }

    #[test]
    fn a_free_releases_exactly_what_was_recorded_and_only_once() {
        let f = fixture();
        let (ledger, driver) = f.ledger();
        let a = ledger.reserve(DEVICE_0, 300 * MIB, &driver).expect("fits");
        let b = ledger.reserve(DEVICE_0, 100 * MIB, &driver).expect("fits");
        ledger.record(AllocKey::Pointer(0xa000), a, 7);
        ledger.record(AllocKey::Array(0xb), b, 7);
        assert_eq!(ledger.charge_of(AllocKey::Pointer(0xa000)), 300 * MIB);
        ledger.forget(AllocKey::Pointer(0xa000));
        assert_eq!(ledger.used(0), 100 * MIB);
        ledger.forget(AllocKey::Pointer(0xa000));
        ledger.forget(AllocKey::Pointer(0xdead));
        assert_eq!(
            ledger.used(0),
            100 * MIB,
            "a second or unknown free credits nothing"
        );
        // The driver hands out a key we still hold: the old record was freed behind
        // our back, and is credited as the new one is recorded.
        let c = ledger.reserve(DEVICE_0, 20 * MIB, &driver).expect("fits");
        ledger.record(AllocKey::Array(0xb), c, 7);
        assert_eq!(ledger.used(0), 20 * MIB);
    }

    #[test]
    fn a_destroyed_context_credits_everything_recorded_in_it() {
        let f = fixture();
        let (ledger, driver) = f.ledger();
        for (pointer, context) in [(1, 10), (2, 10), (3, 11)] {
            let ticket = ledger.reserve(DEVICE_0, 64 * MIB, &driver).expect("fits");
            ledger.record(AllocKey::Pointer(pointer), ticket, context);
        }
        ledger.forget_context(10, &driver);
        assert_eq!(ledger.used(0), 64 * MIB, "context 11's allocation stays");
        assert_eq!(ledger.charge_of(AllocKey::Pointer(3)), 64 * MIB);
    }

    #[test]
    fn a_resized_record_follows_its_value_up_and_down() {
        let f = fixture();
        let (ledger, driver) = f.ledger();
        let key = AllocKey::Limit {
            context: 5,
            limit: 0,
        };
        let grown = ledger.reserve(DEVICE_0, 256 * MIB, &driver).expect("fits");
        // The region holds the reserved growth; the record becomes it.
        ledger.resize(key, 5, DEVICE_0, grown.bytes, 256 * MIB);
        assert_eq!(ledger.charge_of(key), 256 * MIB);
        assert_eq!(ledger.used(0), 256 * MIB);
        ledger.resize(key, 5, DEVICE_0, 256 * MIB, 64 * MIB);
        assert_eq!(
            (ledger.charge_of(key), ledger.used(0)),
            (64 * MIB, 64 * MIB)
        );
        ledger.resize(key, 5, DEVICE_0, 64 * MIB, 0);
        assert_eq!((ledger.charge_of(key), ledger.used(0)), (0, 0));
    }
}
