//! The slot protocol: how a process claims a slot, gives it back and how a slot is freed
//! for a dead owner. A slot changes owner only by compare-and-swap on its owner word,
//! `pid << 32 | nonce << 8 | state`, whose nonce changes with every claim, so no swap
//! ever acts on a slot that changed hands since it was read.

use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;

use super::layout::{MAX_SLOTS, Slot, host_pid_offset, slot_offset};
use super::read::RegionBytes;
use super::{Region, RegionError};
use crate::config::MAX_DEVICES;
use crate::process::{self, Identity};

pub(super) const STATE_FREE: u64 = 0;
pub(super) const STATE_CLAIMING: u64 = 1;
pub(super) const STATE_LIVE: u64 = 2;
pub(super) const STATE_RECLAIMING: u64 = 3;

/// The owner word: `pid << 32 | nonce << 8 | state`. The nonce changes with every claim,
/// so a compare-and-swap on the word can never act on a slot that changed hands since.
pub(super) fn owner_word(pid: i32, nonce: u64, state: u64) -> u64 {
    ((pid as u32 as u64) << 32) | ((nonce & 0x00ff_ffff) << 8) | state
}

pub(super) fn state_of(owner: u64) -> u64 {
    owner & 0xff
}

pub(super) fn pid_of(owner: u64) -> i32 {
    (owner >> 32) as i32
}

pub(super) fn nonce_of(owner: u64) -> u64 {
    (owner >> 8) & 0x00ff_ffff
}

/// The owner word of the same claim in another state.
pub(super) fn with_state(owner: u64, state: u64) -> u64 {
    (owner & !0xff) | state
}

/// A claimed slot of this process: its index and the owner word of the claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotId {
    pub(super) index: usize,
    pub(super) owner: u64,
}

impl SlotId {
    /// The slot's index in the region.
    pub fn index(self) -> usize {
        self.index
    }
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

impl Region {
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
    pub(super) fn free_slot(&self, index: usize, owner: u64) -> bool {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::region::test_devices as devices;

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
}
