//! The pool ledger: what the stream-ordered memory pools this process uses hold on the
//! card. A pool keeps freed memory reserved (up to its release threshold, and past it
//! until a synchronisation), so the quota counts what a pool has *reserved*, as the
//! driver reports it (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`), never what callers freed.
//!
//! Every known pool has a counted figure; settling a pool sets it to the driver's and
//! returns the difference for the usage region. A destroyed pool with allocations still
//! outstanding keeps its memory until the last of them is freed, as the driver does.

use vgpu_abi::cuda::{CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, CU_MEMPOOL_ATTR_USED_MEM_CURRENT};

/// What the ledger asks of the driver about a pool (the real driver in the shim, a fake
/// in tests).
pub trait PoolDriver {
    /// A `u64` attribute of `pool`, `None` when the driver refuses.
    fn attribute(&self, pool: usize, attribute: i32) -> Option<u64>;
    /// `cuMemPoolTrimTo(pool, 0)`: gives back what no allocation uses.
    fn trim(&self, pool: usize);
}

/// A change of the bytes counted on a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Change {
    pub region_index: usize,
    /// Positive: count more; negative: credit back.
    pub delta: i128,
}

#[derive(Debug)]
struct Entry {
    pool: usize,
    region_index: usize,
    counted: u64,
    /// Allocations from it not freed yet.
    outstanding: u64,
    destroyed: bool,
}

/// Every pool this process allocated from (or created, or looked up).
#[derive(Debug, Default)]
pub struct PoolTable {
    entries: Vec<Entry>,
}

impl PoolTable {
    /// Whether any pool holds counted memory (the synchronisation hooks settle only then).
    pub fn holds_memory(&self) -> bool {
        self.entries.iter().any(|e| e.counted > 0)
    }

    /// The device a known pool belongs to.
    pub fn device_of(&self, pool: usize) -> Option<usize> {
        self.entry(pool).map(|e| e.region_index)
    }

    fn entry(&self, pool: usize) -> Option<&Entry> {
        self.entries.iter().find(|e| e.pool == pool && !e.destroyed)
    }

    fn entry_mut(&mut self, pool: usize) -> Option<&mut Entry> {
        self.entries
            .iter_mut()
            .find(|e| e.pool == pool && !e.destroyed)
    }

    /// Makes `pool` (of device `region_index`) known, with nothing counted yet; true if
    /// it was not known before.
    pub fn know(&mut self, pool: usize, region_index: usize) -> bool {
        if self.entry(pool).is_some() {
            return false;
        }
        self.entries.push(Entry {
            pool,
            region_index,
            counted: 0,
            outstanding: 0,
            destroyed: false,
        });
        true
    }

    /// Sets `pool`'s counted bytes to what the driver says it has reserved; the
    /// difference, if any. A pool the driver will not answer for keeps its count.
    pub fn settle(&mut self, pool: usize, driver: &dyn PoolDriver) -> Option<Change> {
        let entry = self.entry_mut(pool)?;
        let reserved = driver.attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?;
        let delta = reserved as i128 - entry.counted as i128;
        entry.counted = reserved;
        (delta != 0).then_some(Change {
            region_index: entry.region_index,
            delta,
        })
    }

    /// Settles every live pool of `region_index` (or of every device).
    pub fn settle_all(
        &mut self,
        region_index: Option<usize>,
        driver: &dyn PoolDriver,
    ) -> Vec<Change> {
        let pools: Vec<usize> = self
            .entries
            .iter()
            .filter(|e| !e.destroyed && region_index.is_none_or(|index| e.region_index == index))
            .map(|e| e.pool)
            .collect();
        pools
            .into_iter()
            .filter_map(|pool| self.settle(pool, driver))
            .collect()
    }

    /// Reserved bytes no allocation uses in the pools of `region_index`: what trimming
    /// them could give back at most.
    pub fn trimmable(&self, region_index: usize, driver: &dyn PoolDriver) -> u64 {
        self.entries
            .iter()
            .filter(|e| !e.destroyed && e.region_index == region_index)
            .map(|e| {
                let reserved = driver
                    .attribute(e.pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)
                    .unwrap_or(0);
                let used = driver
                    .attribute(e.pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
                    .unwrap_or(reserved);
                reserved.saturating_sub(used)
            })
            .sum()
    }

    /// Whether `pool` has `bytes` (in 2 MiB steps) reserved and unused.
    pub fn has_room(&self, pool: usize, bytes: u64, driver: &dyn PoolDriver) -> bool {
        let reserved = driver.attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
        let used = driver.attribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
        match (reserved, used) {
            (Some(reserved), Some(used)) => {
                reserved.saturating_sub(used) >= bytes.div_ceil(2 << 20).saturating_mul(2 << 20)
            }
            _ => false,
        }
    }

    /// Trims every live pool of `region_index` and settles them.
    pub fn trim_all(&mut self, region_index: usize, driver: &dyn PoolDriver) -> Vec<Change> {
        for entry in &self.entries {
            if !entry.destroyed && entry.region_index == region_index {
                driver.trim(entry.pool);
            }
        }
        self.settle_all(Some(region_index), driver)
    }

    /// An allocation from `pool` succeeded.
    pub fn allocated(&mut self, pool: usize) {
        if let Some(entry) = self.entry_mut(pool) {
            entry.outstanding += 1;
        }
    }

    /// An allocation from `pool` was freed: a destroyed pool whose last allocation this
    /// was gives its memory back.
    pub fn freed(&mut self, pool: usize) -> Option<Change> {
        let position = self.entries.iter().position(|e| e.pool == pool)?;
        let entry = &mut self.entries[position];
        entry.outstanding = entry.outstanding.saturating_sub(1);
        if entry.destroyed && entry.outstanding == 0 {
            let entry = self.entries.remove(position);
            return Some(Change {
                region_index: entry.region_index,
                delta: -(entry.counted as i128),
            });
        }
        None
    }

    /// `cuMemPoolDestroy(pool)` succeeded: its memory goes now, or with its last
    /// outstanding allocation.
    pub fn destroyed(&mut self, pool: usize) -> Option<Change> {
        let position = self
            .entries
            .iter()
            .position(|e| e.pool == pool && !e.destroyed)?;
        if self.entries[position].outstanding > 0 {
            self.entries[position].destroyed = true;
            return None;
        }
        let entry = self.entries.remove(position);
        (entry.counted > 0).then_some(Change {
            region_index: entry.region_index,
            delta: -(entry.counted as i128),
        })
    }

    /// Bytes counted for `pool` (0 when unknown).
    #[cfg(test)]
    pub fn counted(&self, pool: usize) -> u64 {
        self.entry(pool).map_or(0, |e| e.counted)
    }
}

#[cfg(test)]
pub mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::HashMap;

    const MIB: u64 = 1 << 20;

    /// A pool driver that keeps (reserved, used) per pool.
    #[derive(Default)]
    pub struct FakePools(pub RefCell<HashMap<usize, (u64, u64)>>);

    impl PoolDriver for FakePools {
        fn attribute(&self, pool: usize, attribute: i32) -> Option<u64> {
            let (reserved, used) = *self.0.borrow().get(&pool)?;
            match attribute {
                CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT => Some(reserved),
                CU_MEMPOOL_ATTR_USED_MEM_CURRENT => Some(used),
                _ => None,
            }
        }
        fn trim(&self, pool: usize) {
            if let Some((reserved, used)) = self.0.borrow_mut().get_mut(&pool) {
                *reserved = (*used).div_ceil(2 * MIB) * 2 * MIB;
            }
        }
    }

    fn change(delta: i128) -> Change {
        Change {
            region_index: 0,
            delta,
        }
    }

    #[test]
    fn a_pool_is_counted_by_what_it_reserved_not_by_what_was_freed() {
        let driver = FakePools::default();
        let mut table = PoolTable::default();
        table.know(10, 0);
        driver.0.borrow_mut().insert(10, (300 * MIB, 300 * MIB));
        assert_eq!(table.settle(10, &driver), Some(change(300 * MIB as i128)));
        // Freed, but a threshold of UINT64_MAX keeps it reserved: nothing changes.
        driver.0.borrow_mut().insert(10, (300 * MIB, 0));
        assert_eq!(table.settle(10, &driver), None);
        assert!(table.holds_memory());
        assert_eq!(table.trimmable(0, &driver), 300 * MIB);
        assert_eq!(
            table.trim_all(0, &driver),
            vec![change(-(300 * MIB as i128))]
        );
        assert!(!table.holds_memory());
    }

    #[test]
    fn a_destroyed_pool_keeps_its_memory_until_its_last_allocation_is_freed() {
        let driver = FakePools::default();
        let mut table = PoolTable::default();
        table.know(3, 1);
        driver.0.borrow_mut().insert(3, (64 * MIB, 10 * MIB));
        table.settle(3, &driver);
        table.allocated(3);
        assert_eq!(table.destroyed(3), None, "one allocation outstanding");
        assert_eq!(
            table.device_of(3),
            None,
            "no longer a pool to allocate from"
        );
        assert_eq!(
            table.freed(3),
            Some(Change {
                region_index: 1,
                delta: -(64 * MIB as i128)
            })
        );
        table.know(4, 0);
        assert_eq!(
            table.destroyed(4),
            None,
            "nothing counted, nothing to credit"
        );
    }

    #[test]
    fn a_pool_the_driver_cannot_answer_for_keeps_its_count() {
        let driver = FakePools::default();
        let mut table = PoolTable::default();
        table.know(1, 0);
        driver.0.borrow_mut().insert(1, (32 * MIB, 0));
        table.settle(1, &driver);
        driver.0.borrow_mut().clear();
        assert!(table.settle_all(None, &driver).is_empty());
        assert_eq!(table.counted(1), 32 * MIB);
    }
}
