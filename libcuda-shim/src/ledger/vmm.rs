//! The VMM ledger: the physical allocations (`cuMemCreate` handles) this process holds,
//! and for how long. The driver keeps a handle's memory until its last mapping is gone
//! *and* its last reference is released (`cuMemCreate` and every
//! `cuMemRetainAllocationHandle` take one, every `cuMemRelease` gives one back), so the
//! ledger credits a handle only then. A `cuMemUnmap` may cover several mappings, or part
//! of one (what stays mapped keeps the handle alive).
//!
//! Pure bookkeeping: `super::vmm_counting` calls it after each hook's real call
//! succeeded, and credits what it returns.

use std::collections::{BTreeMap, HashMap};

/// Memory to credit back: a handle whose last mapping and reference are gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Freed {
    pub region_index: usize,
    pub bytes: u64,
}

#[derive(Debug)]
struct Physical {
    region_index: usize,
    bytes: u64,
    references: u32,
    /// Mapped pieces of address space that name this handle.
    mappings: u32,
}

/// One mapped piece of address space: `[start, end)` backed by `handle`.
#[derive(Clone, Copy, Debug)]
struct Piece {
    end: u64,
    handle: u64,
}

/// Every counted handle and every mapping of one.
#[derive(Debug, Default)]
pub struct VmmTable {
    handles: HashMap<u64, Physical>,
    /// Mapped pieces by start address; they never overlap.
    pieces: BTreeMap<u64, Piece>,
}

impl VmmTable {
    /// `cuMemCreate` made `handle` (one reference, no mapping), counted as `bytes` on
    /// `region_index`. A handle value we still held (freed behind our back) is returned
    /// for crediting.
    pub fn created(&mut self, handle: u64, region_index: usize, bytes: u64) -> Option<Freed> {
        let previous = self.handles.insert(
            handle,
            Physical {
                region_index,
                bytes,
                references: 1,
                mappings: 0,
            },
        );
        if previous.is_some() {
            self.pieces.retain(|_, piece| piece.handle != handle);
        }
        previous.map(|old| Freed {
            region_index: old.region_index,
            bytes: old.bytes,
        })
    }

    /// `cuMemRetainAllocationHandle` handed out another reference to `handle`.
    pub fn retained(&mut self, handle: u64) {
        if let Some(physical) = self.handles.get_mut(&handle) {
            physical.references = physical.references.saturating_add(1);
        }
    }

    /// `cuMemRelease(handle)` succeeded.
    pub fn released(&mut self, handle: u64) -> Option<Freed> {
        let physical = self.handles.get_mut(&handle)?;
        physical.references = physical.references.saturating_sub(1);
        self.free_if_unused(handle)
    }

    /// `cuMemMap(start, len, _, handle, _)` succeeded. Handles we did not count (imported
    /// from another process, or host memory) are not tracked.
    pub fn mapped(&mut self, start: u64, len: u64, handle: u64) -> Vec<Freed> {
        // The driver refuses to map over a mapping; one we still list was unmapped
        // behind our back, so drop it first.
        let freed = self.unmapped(start, len);
        if len > 0
            && let Some(physical) = self.handles.get_mut(&handle)
        {
            physical.mappings += 1;
            self.pieces.insert(
                start,
                Piece {
                    end: start.saturating_add(len),
                    handle,
                },
            );
        }
        freed
    }

    /// `cuMemUnmap(start, len)` succeeded: every mapped piece inside the range goes, a
    /// piece that straddles its edge is cut (what lies outside stays mapped).
    pub fn unmapped(&mut self, start: u64, len: u64) -> Vec<Freed> {
        let end = start.saturating_add(len);
        let overlapping: Vec<(u64, Piece)> = self
            .pieces
            .range(..end)
            .rev()
            .take_while(|(_, piece)| piece.end > start)
            .map(|(at, piece)| (*at, *piece))
            .collect();
        let mut touched = Vec::new();
        for (at, piece) in overlapping {
            self.pieces.remove(&at);
            let mut left = 0;
            if at < start {
                self.pieces.insert(
                    at,
                    Piece {
                        end: start,
                        handle: piece.handle,
                    },
                );
                left += 1;
            }
            if piece.end > end {
                self.pieces.insert(
                    end,
                    Piece {
                        end: piece.end,
                        handle: piece.handle,
                    },
                );
                left += 1;
            }
            if let Some(physical) = self.handles.get_mut(&piece.handle) {
                physical.mappings = (physical.mappings + left).saturating_sub(1);
            }
            touched.push(piece.handle);
        }
        touched.sort_unstable();
        touched.dedup();
        touched
            .into_iter()
            .filter_map(|handle| self.free_if_unused(handle))
            .collect()
    }

    fn free_if_unused(&mut self, handle: u64) -> Option<Freed> {
        let physical = self.handles.get(&handle)?;
        if physical.references > 0 || physical.mappings > 0 {
            return None;
        }
        let physical = self.handles.remove(&handle)?;
        Some(Freed {
            region_index: physical.region_index,
            bytes: physical.bytes,
        })
    }

    /// Bytes the ledger counts on `region_index`.
    #[cfg(test)]
    pub fn held(&self, region_index: usize) -> u64 {
        self.handles
            .values()
            .filter(|p| p.region_index == region_index)
            .map(|p| p.bytes)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn freed(bytes: u64) -> Freed {
        Freed {
            region_index: 0,
            bytes,
        }
    }

    #[test]
    fn a_released_handle_lives_until_its_last_unmap() {
        let mut table = VmmTable::default();
        assert_eq!(table.created(1, 0, 300 * MIB), None);
        assert!(table.mapped(0x1000_0000, 300 * MIB, 1).is_empty());
        assert_eq!(table.released(1), None, "still mapped: still held");
        assert_eq!(table.held(0), 300 * MIB);
        assert_eq!(
            table.unmapped(0x1000_0000, 300 * MIB),
            vec![freed(300 * MIB)]
        );
        assert_eq!(table.held(0), 0);
    }

    #[test]
    fn an_unmapped_handle_lives_until_its_last_release() {
        let mut table = VmmTable::default();
        table.created(7, 0, 2 * MIB);
        table.mapped(0x2000_0000, 2 * MIB, 7);
        table.retained(7);
        assert!(
            table.unmapped(0x2000_0000, 2 * MIB).is_empty(),
            "two references"
        );
        assert_eq!(table.released(7), None, "one reference left");
        assert_eq!(table.released(7), Some(freed(2 * MIB)));
        assert_eq!(table.released(7), None, "already gone");
    }

    #[test]
    fn one_unmap_covers_several_mappings_and_cuts_straddling_ones() {
        let mut table = VmmTable::default();
        let base = 0x4000_0000;
        table.created(1, 0, 4 * MIB);
        table.created(2, 0, 4 * MIB);
        table.mapped(base, 4 * MIB, 1);
        table.mapped(base + 4 * MIB, 4 * MIB, 2);
        table.released(1);
        table.released(2);
        // The middle 4 MiB: the end of handle 1's mapping, the start of handle 2's.
        assert!(table.unmapped(base + 2 * MIB, 4 * MIB).is_empty());
        assert_eq!(table.held(0), 8 * MIB, "both still partly mapped");
        assert_eq!(table.unmapped(base, 2 * MIB), vec![freed(4 * MIB)]);
        // A handle mapped twice, unmapped in one call that covers both and a gap.
        table.created(3, 1, 2 * MIB);
        table.mapped(base + 16 * MIB, 2 * MIB, 3);
        table.mapped(base + 20 * MIB, 2 * MIB, 3);
        table.released(3);
        let all = table.unmapped(base, 64 * MIB);
        assert_eq!(all.len(), 2, "{all:?}");
        assert_eq!(table.held(0) + table.held(1), 0);
    }

    #[test]
    fn a_cut_in_the_middle_keeps_both_ends_mapped() {
        let mut table = VmmTable::default();
        table.created(1, 0, 6 * MIB);
        table.mapped(0, 6 * MIB, 1);
        table.released(1);
        assert!(table.unmapped(2 * MIB, 2 * MIB).is_empty());
        assert!(
            table.unmapped(0, 2 * MIB).is_empty(),
            "the top piece remains"
        );
        assert_eq!(table.unmapped(4 * MIB, 2 * MIB), vec![freed(6 * MIB)]);
    }

    #[test]
    fn untracked_handles_and_reused_values() {
        let mut table = VmmTable::default();
        // Imported (never created here): not tracked, nothing credited.
        assert!(table.mapped(0, 2 * MIB, 99).is_empty());
        assert!(table.unmapped(0, 2 * MIB).is_empty());
        assert_eq!(table.released(99), None);
        // A handle value the driver hands out again while we still list it.
        table.created(5, 0, 2 * MIB);
        table.mapped(0, 2 * MIB, 5);
        assert_eq!(table.created(5, 0, 4 * MIB), Some(freed(2 * MIB)));
        assert_eq!(table.held(0), 4 * MIB);
        assert_eq!(
            table.released(5),
            Some(freed(4 * MIB)),
            "the old mapping went with it"
        );
    }
}
