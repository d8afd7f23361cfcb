//! Memory pools, counted by what they have reserved (the table is `super::pools`): an
//! allocation reserves the most its pool can grow by first, then the pool is settled at
//! the driver's figure (`Enforcer::pool_allocate`); frees credit nothing;
//! synchronisation points, trims, attribute changes and pool destruction settle again.
//! Before refusing any allocation, this process's pools are trimmed if that makes room.

use std::ffi::c_void;
use std::sync::atomic::Ordering;

use vgpu_contract::region::SlotId;

use super::Ticket;
use super::allocations::{AllocKey, Allocation};
use super::pools::{PoolDriver, PoolTable};
use crate::cuda::*;
use crate::devices::Visible;
use crate::process::{ProcessState, process_state};
use crate::state::Enforcer;
use crate::{debug, real};

impl Enforcer {
    /// A pool of `device` became known (created, or looked up as a device's pool).
    pub fn pool_known(&self, pool: usize, device: &Visible) {
        process_state(self).pools().know(pool, device.region_index);
    }

    /// The visible device a known pool belongs to.
    pub fn pool_device(&self, pool: usize) -> Option<&Visible> {
        let index = process_state(self).pools().device_of(pool)?;
        self.devices()?.iter().find(|d| d.region_index == index)
    }

    /// Re-reads what `pool` has reserved (after a trim or an attribute change).
    pub fn pool_settle(&self, pool: usize) {
        let process = process_state(self);
        let Some(slot) = process.slot else { return };
        let mut pools = process.pools();
        self.apply(slot, pools.settle(pool, &RealPools));
        process.pools_changed(&pools);
    }

    /// `cuMemPoolDestroy` succeeded.
    pub fn pool_destroyed(&self, pool: usize) {
        let process = process_state(self);
        let Some(slot) = process.slot else { return };
        let mut pools = process.pools();
        self.apply(slot, pools.destroyed(pool));
        process.pools_changed(&pools);
    }

    /// A synchronisation point passed (the driver may have released pool memory
    /// beyond the release thresholds): settle the pools. One load when no pool holds
    /// counted memory; never waits for a thread that is allocating.
    #[inline]
    pub fn synchronized(&self) {
        let process = process_state(self);
        if let Some(slot) = process.slot {
            self.settle_pools(process, slot, None);
        }
    }

    /// Settles every pool (of the device of region index `index`, or all), unless none
    /// holds counted memory or another thread holds the table.
    #[inline]
    pub(super) fn settle_pools(&self, process: &ProcessState, slot: SlotId, index: Option<usize>) {
        if !process.pools_hold_memory.load(Ordering::Relaxed) {
            return;
        }
        let Some(mut pools) = process.try_pools() else {
            return;
        };
        self.apply(slot, pools.settle_all(index, &RealPools));
        process.pools_changed(&pools);
    }

    /// The slow path of a reservation that did not fit: reclaim dead processes' slots,
    /// settle this process's pools, trim them if that makes room; true once `bytes` are
    /// reserved.
    pub(super) fn reserve_making_room(
        &self,
        slot: SlotId,
        device: &Visible,
        bytes: u64,
        pools: &mut PoolTable,
    ) -> bool {
        let (index, limit) = (device.region_index, self.limit(device));
        self.region.reclaim_dead();
        self.apply(slot, pools.settle_all(Some(index), &RealPools));
        if self.region.try_reserve(slot, index, bytes, limit) {
            return true;
        }
        let shortfall = self
            .region
            .device_used(index)
            .saturating_add(bytes)
            .saturating_sub(limit);
        if shortfall > 0 && pools.trimmable(index, &RealPools) >= shortfall {
            debug!(
                "trimming this process's pools on {} for {bytes} bytes",
                device.uuid
            );
            self.apply(slot, pools.trim_all(index, &RealPools));
            return self.region.try_reserve(slot, index, bytes, limit);
        }
        false
    }

    /// Allocates `bytes` from `pool` on `device` with the pool counted by what it has
    /// reserved: reserves the most the pool can grow by for it first (refusing, after
    /// making room, when even that does not fit, unless the pool has the room unused),
    /// runs `allocate`, then settles the pool at the driver's figure. Should the pool
    /// have grown past the quota anyway, `undo` frees the allocation (freed and
    /// synchronised) and the pool is trimmed: CUDA_ERROR_OUT_OF_MEMORY.
    #[allow(clippy::too_many_arguments)]
    pub fn pool_allocate(
        &self,
        device: &Visible,
        pool: usize,
        bytes: u64,
        context: usize,
        allocate: impl FnOnce() -> CUresult,
        pointer: impl FnOnce() -> u64,
        undo: impl FnOnce(u64),
    ) -> CUresult {
        let process = process_state(self);
        let Some(slot) = process.slot else {
            return CUDA_ERROR_OUT_OF_MEMORY;
        };
        self.sync_with_driver(process, slot, device);
        let mut pools = process.pools();
        let (index, limit) = (device.region_index, self.limit(device));
        if pools.know(pool, index) {
            // A pool seen for the first time may hold memory already.
            self.apply(slot, pools.settle(pool, &RealPools));
        }
        let bound = pool_growth_bound(bytes);
        let held = if self.region.try_reserve(slot, index, bound, limit)
            || self.reserve_making_room(slot, device, bound, &mut pools)
        {
            bound
        } else if pool_has_room(pool, bytes) {
            0
        } else {
            debug!("refusing {bytes} bytes from pool {pool:#x}");
            self.refused(device, bytes, limit);
            return CUDA_ERROR_OUT_OF_MEMORY;
        };
        let result = allocate();
        let change = pools.settle(pool, &RealPools);
        let grew = change.map_or(0, |c| c.delta);
        self.apply(slot, change);
        self.region.release(slot, index, held);
        if result != CUDA_SUCCESS {
            process.pools_changed(&pools);
            return result;
        }
        let ptr = pointer();
        if grew > held as i128 && self.region.device_used(index) > limit {
            debug!("pool {pool:#x} grew by {grew} bytes for {bytes}, past the quota: undone");
            self.refused(device, bytes, limit);
            undo(ptr);
            RealPools.trim(pool);
            self.apply(slot, pools.settle(pool, &RealPools));
            process.pools_changed(&pools);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        pools.allocated(pool);
        process.pools_changed(&pools);
        drop(pools);
        self.remember(
            AllocKey::Pointer(ptr),
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
        CUDA_SUCCESS
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

/// Whether `pool` has `bytes` (in 2 MiB steps) reserved and unused.
fn pool_has_room(pool: usize, bytes: u64) -> bool {
    let reserved = RealPools.attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
    let used = RealPools.attribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
    match (reserved, used) {
        (Some(reserved), Some(used)) => {
            reserved.saturating_sub(used) >= bytes.div_ceil(2 << 20).saturating_mul(2 << 20)
        }
        _ => false,
    }
}

/// The real driver's pool attributes, for the pool ledger.
struct RealPools;

impl PoolDriver for RealPools {
    fn attribute(&self, pool: usize, attribute: i32) -> Option<u64> {
        let get = real!(cuMemPoolGetAttribute as fn(CUmemoryPool, i32, *mut c_void) -> CUresult);
        let mut value = 0u64;
        // SAFETY: the reserved/used attributes are cuuint64_t, written to our own u64.
        let result = unsafe {
            get(
                pool as CUmemoryPool,
                attribute,
                (&mut value as *mut u64).cast(),
            )
        };
        (result == CUDA_SUCCESS).then_some(value)
    }

    fn trim(&self, pool: usize) {
        let trim = real!(cuMemPoolTrimTo as fn(CUmemoryPool, usize) -> CUresult);
        // SAFETY: trimming a pool handle this process allocated from; it releases only
        // memory that no allocation uses.
        unsafe { trim(pool as CUmemoryPool, 0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

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
}
