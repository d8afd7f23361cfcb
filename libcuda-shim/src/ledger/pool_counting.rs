//! Memory pools, counted by what they keep reserved (the table is `super::pools`). An
//! allocation from a pool goes: [`Ledger::pool_begin`] reserves the most the pool can
//! grow by (making room first, or refusing unless the pool has the room unused) and
//! holds the pool table; the allocation path makes the real call; [`Ledger::pool_finish`]
//! settles the pool at the driver's figure and gives the reservation back. Should the
//! pool have grown past the quota anyway, it says so ([`PoolFinish::Over`]): the path
//! frees the allocation and [`Ledger::pool_undone`] trims and settles the pool. Frees
//! credit nothing; synchronisation points, trims, attribute changes and pool
//! destruction settle again. Before refusing any reservation, this process's pools are
//! trimmed if that makes room.

use std::sync::MutexGuard;
use std::sync::atomic::Ordering;

use vgpu_contract::region::SlotId;
use vgpu_shimgen::runtime;

use super::allocations::{AllocKey, Allocation};
use super::pools::{PoolDriver, PoolTable};
use super::{Ledger, Place, Ticket};
use crate::cuda::{CUDA_SUCCESS, CUresult};
use crate::debug;

/// An allocation from a pool between its reservation and its real call's result: the
/// pool table stays held (so the pool's growth is this allocation's alone) until
/// [`Ledger::pool_finish`].
#[must_use = "a pool reservation is finished after the real call"]
pub struct PoolHeld<'l> {
    pools: MutexGuard<'l, PoolTable>,
    slot: SlotId,
    place: Place,
    pool: usize,
    /// Bytes reserved in the region for the call (0 when the pool had the room unused).
    held: u64,
}

/// What [`Ledger::pool_finish`] found.
#[must_use = "an allocation that passed the quota is freed, then `pool_undone`"]
pub enum PoolFinish<'l> {
    /// Settled: answer this result.
    Done(CUresult),
    /// The pool grew past the quota: free the allocation at `pointer`, then
    /// [`Ledger::pool_undone`] (the table stays held until then).
    Over(PoolOver<'l>),
}

/// A pool allocation to undo (see [`PoolFinish::Over`]).
#[must_use = "an allocation that passed the quota is freed, then `pool_undone`"]
pub struct PoolOver<'l> {
    pools: MutexGuard<'l, PoolTable>,
    slot: SlotId,
    pool: usize,
    /// The allocation to free.
    pub pointer: u64,
    /// How much the pool grew for it.
    pub grew: i128,
}

impl Ledger<'_> {
    /// A pool of the device of region index `index` became known (created, or looked
    /// up as a device's pool).
    pub fn pool_known(&self, pool: usize, index: usize) {
        self.pools().know(pool, index);
    }

    /// The region index of a known pool's device.
    pub fn pool_device(&self, pool: usize) -> Option<usize> {
        self.pools().device_of(pool)
    }

    /// Re-reads what `pool` has reserved (after a trim or an attribute change).
    pub fn pool_settle(&self, pool: usize, driver: &dyn PoolDriver) {
        let Some(slot) = self.slot else { return };
        let mut pools = self.pools();
        self.apply(slot, pools.settle(pool, driver));
        self.pools_changed(&pools);
    }

    /// `cuMemPoolDestroy` succeeded.
    pub fn pool_destroyed(&self, pool: usize) {
        let Some(slot) = self.slot else { return };
        let mut pools = self.pools();
        self.apply(slot, pools.destroyed(pool));
        self.pools_changed(&pools);
    }

    /// Settles every pool (of the device of region index `index`, or all), unless none
    /// holds counted memory or another thread holds the table: one load when no pool
    /// holds counted memory; never waits for a thread that is allocating.
    #[inline]
    pub fn settle_pools(&self, index: Option<usize>, driver: &dyn PoolDriver) {
        if !self.pools_hold_memory.load(Ordering::Relaxed) {
            return;
        }
        let Some(slot) = self.slot else { return };
        let Some(mut pools) = runtime::try_lock(&self.pools) else {
            return;
        };
        self.apply(slot, pools.settle_all(index, driver));
        self.pools_changed(&pools);
    }

    /// The slow path of a reservation that did not fit: reclaim dead processes' slots,
    /// settle this process's pools, trim them if that makes room; true once `bytes` are
    /// reserved.
    pub(super) fn reserve_making_room(
        &self,
        slot: SlotId,
        place: Place,
        bytes: u64,
        pools: &mut PoolTable,
        driver: &dyn PoolDriver,
    ) -> bool {
        let Place {
            region_index: index,
            limit,
        } = place;
        self.region.reclaim_dead();
        self.apply(slot, pools.settle_all(Some(index), driver));
        if self.region.try_reserve(slot, index, bytes, limit) {
            return true;
        }
        let shortfall = self
            .region
            .device_used(index)
            .saturating_add(bytes)
            .saturating_sub(limit);
        if shortfall > 0 && pools.trimmable(index, driver) >= shortfall {
            debug!("trimming this process's pools on device {index} for {bytes} bytes");
            self.apply(slot, pools.trim_all(index, driver));
            return self.region.try_reserve(slot, index, bytes, limit);
        }
        false
    }

    /// Before `bytes` are allocated from `pool` at `place`: reserves the most the pool
    /// can grow by for it (after making room if need be), or nothing when the pool has
    /// the room unused; `None`, having counted nothing, when neither (the real call
    /// must not run). The pool table stays held until [`Ledger::pool_finish`].
    pub fn pool_begin(
        &self,
        place: Place,
        pool: usize,
        bytes: u64,
        driver: &dyn PoolDriver,
    ) -> Option<PoolHeld<'_>> {
        let slot = self.slot?;
        let mut pools = self.pools();
        let Place {
            region_index: index,
            limit,
        } = place;
        if pools.know(pool, index) {
            // A pool seen for the first time may hold memory already.
            self.apply(slot, pools.settle(pool, driver));
        }
        let bound = pool_growth_bound(bytes);
        let held = if self.region.try_reserve(slot, index, bound, limit)
            || self.reserve_making_room(slot, place, bound, &mut pools, driver)
        {
            bound
        } else if pools.has_room(pool, bytes, driver) {
            0
        } else {
            return None;
        };
        Some(PoolHeld {
            pools,
            slot,
            place,
            pool,
            held,
        })
    }

    /// After the real call returned `result` (and, on success, the allocation at
    /// `pointer` in `context`): the pool settled at the driver's figure, the
    /// reservation given back, the allocation recorded (its free credits nothing: the
    /// pool keeps the memory). [`PoolFinish::Over`] when the pool grew past the quota.
    pub fn pool_finish<'l>(
        &'l self,
        held: PoolHeld<'l>,
        result: CUresult,
        pointer: u64,
        context: usize,
        driver: &dyn PoolDriver,
    ) -> PoolFinish<'l> {
        let PoolHeld {
            mut pools,
            slot,
            place,
            pool,
            held,
        } = held;
        let index = place.region_index;
        let change = pools.settle(pool, driver);
        let grew = change.map_or(0, |c| c.delta);
        self.apply(slot, change);
        self.region.release(slot, index, held);
        if result != CUDA_SUCCESS {
            self.pools_changed(&pools);
            return PoolFinish::Done(result);
        }
        if grew > held as i128 && self.region.device_used(index) > place.limit {
            return PoolFinish::Over(PoolOver {
                pools,
                slot,
                pool,
                pointer,
                grew,
            });
        }
        pools.allocated(pool);
        self.pools_changed(&pools);
        drop(pools);
        self.remember(
            AllocKey::Pointer(pointer),
            Allocation {
                ticket: Ticket {
                    slot,
                    region_index: index,
                    bytes: 0,
                },
                context,
                pool: Some(pool),
            },
        );
        PoolFinish::Done(CUDA_SUCCESS)
    }

    /// The allocation [`PoolFinish::Over`] named was freed: trims the pool and settles
    /// it, so that what it grew by is given back.
    pub fn pool_undone(&self, over: PoolOver<'_>, driver: &dyn PoolDriver) {
        let PoolOver {
            mut pools,
            slot,
            pool,
            ..
        } = over;
        driver.trim(pool);
        self.apply(slot, pools.settle(pool, driver));
        self.pools_changed(&pools);
    }
}

/// The most a pool's reservation grows for one allocation of `bytes`: the allocation in
/// 2 MiB steps, and at least 32 MiB (on the H200 with driver 580, a 5 MiB
/// `cuMemAllocAsync` reserves 32 MiB). Should a driver grow more, the allocation is
/// settled (and undone past the quota) by what the pool then reports.
pub fn pool_growth_bound(bytes: u64) -> u64 {
    const STEP: u64 = 2 << 20;
    const CHUNK: u64 = 32 << 20;
    bytes.div_ceil(STEP).saturating_mul(STEP).max(CHUNK)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::{CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, CUDA_ERROR_OUT_OF_MEMORY};
    use crate::ledger::tests::{DEVICE_0, MIB, fixture};

    #[test]
    fn a_pool_grows_by_its_chunk_at_least() {
        assert_eq!(pool_growth_bound(0), 32 * MIB);
        assert_eq!(
            pool_growth_bound(5 * MIB),
            32 * MIB,
            "a pool grows by 32 MiB at least"
        );
        assert_eq!(pool_growth_bound(32 * MIB + 1), 34 * MIB);
        assert_eq!(pool_growth_bound(301 * MIB), 302 * MIB);
        assert_eq!(pool_growth_bound(u64::MAX), u64::MAX);
    }

    #[test]
    fn a_pool_is_counted_by_what_it_keeps_and_an_allocation_that_grows_it_past_the_quota_is_undone()
    {
        let f = fixture();
        let (ledger, driver) = f.ledger();
        // A 100 MiB allocation: the pool grows by 100 MiB, keeps it after the free.
        let held = ledger
            .pool_begin(DEVICE_0, 9, 100 * MIB, &driver)
            .expect("fits");
        assert_eq!(
            ledger.used(0),
            100 * MIB,
            "the growth bound is held for the call"
        );
        driver.0.borrow_mut().insert(9, (100 * MIB, 100 * MIB));
        assert!(matches!(
            ledger.pool_finish(held, CUDA_SUCCESS, 0x9000, 1, &driver),
            PoolFinish::Done(CUDA_SUCCESS)
        ));
        assert_eq!(ledger.used(0), 100 * MIB, "the pool's reservation");
        ledger.forget(AllocKey::Pointer(0x9000));
        driver.0.borrow_mut().insert(9, (100 * MIB, 0));
        ledger.settle_pools(None, &driver);
        assert_eq!(ledger.used(0), 100 * MIB, "freed, but the pool keeps it");
        // Another 1000 MiB would pass the quota; trimming the kept 100 MiB makes room.
        let held = ledger
            .pool_begin(DEVICE_0, 9, 1000 * MIB, &driver)
            .expect("trimmed");
        assert_eq!(
            driver.attribute(9, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT),
            Some(0)
        );
        assert_eq!(ledger.used(0), 1000 * MIB);
        // The driver grew the pool by 1040 MiB (more than the bound): past the quota.
        driver.0.borrow_mut().insert(9, (1040 * MIB, 1000 * MIB));
        let PoolFinish::Over(over) = ledger.pool_finish(held, CUDA_SUCCESS, 0x9100, 1, &driver)
        else {
            panic!("a pool past the quota is undone");
        };
        assert_eq!((over.pointer, over.grew), (0x9100, 1040 * MIB as i128));
        driver.0.borrow_mut().insert(9, (1040 * MIB, 0));
        ledger.pool_undone(over, &driver);
        assert_eq!(ledger.used(0), 0, "freed and trimmed: nothing kept");
        assert_eq!(ledger.charge_of(AllocKey::Pointer(0x9100)), 0);
    }

    #[test]
    fn a_pool_allocation_that_cannot_fit_is_refused_leaving_nothing_counted() {
        let f = fixture();
        let (ledger, driver) = f.ledger();
        let other = ledger.reserve(DEVICE_0, 1000 * MIB, &driver).expect("fits");
        assert!(ledger.pool_begin(DEVICE_0, 4, 64 * MIB, &driver).is_none());
        assert_eq!(ledger.used(0), 1000 * MIB);
        ledger.unreserve(other);
        // The pool keeps 4 MiB reserved and unused: counted, and a 2 MiB allocation
        // takes it without growing the pool, though the quota is full.
        driver.0.borrow_mut().insert(4, (4 * MIB, 0));
        ledger.pool_settle(4, &driver);
        assert_eq!(ledger.used(0), 4 * MIB);
        let other = ledger.reserve(DEVICE_0, 1020 * MIB, &driver).expect("fits");
        let held = ledger
            .pool_begin(DEVICE_0, 4, 2 * MIB, &driver)
            .expect("room kept");
        driver.0.borrow_mut().insert(4, (4 * MIB, 2 * MIB));
        assert!(matches!(
            ledger.pool_finish(held, CUDA_SUCCESS, 0x4000, 1, &driver),
            PoolFinish::Done(CUDA_SUCCESS)
        ));
        assert_eq!(ledger.used(0), 1024 * MIB);
        ledger.unreserve(other);
        // A failed call gives its reservation back and keeps what the pool holds.
        let held = ledger
            .pool_begin(DEVICE_0, 4, 32 * MIB, &driver)
            .expect("fits");
        assert_eq!(ledger.used(0), 36 * MIB);
        assert!(matches!(
            ledger.pool_finish(held, CUDA_ERROR_OUT_OF_MEMORY, 0, 1, &driver),
            PoolFinish::Done(CUDA_ERROR_OUT_OF_MEMORY)
        ));
        assert_eq!(ledger.used(0), 4 * MIB);
    }
}
