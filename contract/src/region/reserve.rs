//! Reservations: what a process adds to and takes from its own slot's counts. To
//! reserve, a process adds to its own slot and then sums every slot: the sequentially
//! consistent add-then-sum means that of two racing reservations the later one always
//! sees both, so the quota is never passed. The launch and allocation paths of the
//! shim call these; each is a few atomic operations on the mapping.

use std::sync::atomic::{AtomicU64, Ordering};

use super::Region;
use super::read::{RegionBytes, count};
use super::slots::SlotId;
use crate::config::MAX_DEVICES;

impl Region {
    /// Adds `bytes` to this process's usage on `device` if the total stays within `limit`.
    /// Returns false, having changed nothing, when it would not.
    pub fn try_reserve(&self, slot: SlotId, device: usize, bytes: u64, limit: u64) -> bool {
        if device >= MAX_DEVICES {
            return false;
        }
        let counter = &self.slot(slot.index).used[device];
        // Two reservations racing at the edge of the quota can both see the other's
        // add and both back off, though one would have fitted. After backing off, try
        // again (a few times) while what the others hold leaves room.
        for _ in 0..4 {
            counter.fetch_add(bytes, Ordering::SeqCst);
            let total = self.device_used(device);
            if total <= limit {
                return true;
            }
            Region::saturating_sub(counter, bytes);
            if total.saturating_sub(bytes) > limit.saturating_sub(bytes) {
                // Others alone hold more than leaves room: a true refusal.
                return false;
            }
            std::hint::spin_loop();
        }
        false
    }

    /// Adds `bytes` to this process's usage without a limit check (no quota, or
    /// memory that the driver already handed out).
    pub fn add_used(&self, slot: SlotId, device: usize, bytes: u64) {
        if device < MAX_DEVICES {
            self.slot(slot.index).used[device].fetch_add(bytes, Ordering::SeqCst);
        }
    }

    /// Bytes one slot holds on `device` (clamped).
    pub fn slot_used(&self, slot: SlotId, device: usize) -> u64 {
        if device < MAX_DEVICES {
            count(&self.slot(slot.index).used[device])
        } else {
            0
        }
    }

    /// Credits `bytes` back on `device`.
    pub fn release(&self, slot: SlotId, device: usize, bytes: u64) {
        if device < MAX_DEVICES {
            Region::saturating_sub(&self.slot(slot.index).used[device], bytes);
        }
    }

    /// Records context overhead (already part of `used` through `add_used`/`try_reserve`).
    pub fn set_context(&self, slot: SlotId, device: usize, bytes: u64) {
        if device < MAX_DEVICES {
            self.slot(slot.index).context[device].store(bytes, Ordering::SeqCst);
        }
    }

    /// Adds measured GPU busy time and launches (compute limiter, utilization readers).
    pub fn add_busy(&self, slot: SlotId, device: usize, busy_ns: u64, launches: u64) {
        if device < MAX_DEVICES {
            let slot = self.slot(slot.index);
            slot.busy_ns[device].fetch_add(busy_ns, Ordering::Relaxed);
            slot.launches[device].fetch_add(launches, Ordering::Relaxed);
        }
    }

    fn saturating_sub(counter: &AtomicU64, bytes: u64) {
        let _ = counter.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |value| {
            Some(value.saturating_sub(bytes))
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::{self, Identity};
    use crate::region::{OpenOutcome, test_devices as devices};

    #[test]
    fn create_attach_and_reserve() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("r");
        let (region, outcome) = Region::open(&path, &devices()).expect("open");
        assert_eq!(outcome, OpenOutcome::Created);
        let me = process::current();
        let slot = region.attach(&me).expect("attach");
        assert!(region.try_reserve(slot, 0, 768 << 20, 1 << 30));
        assert!(!region.try_reserve(slot, 0, 512 << 20, 1 << 30));
        assert_eq!(region.device_used(0), 768 << 20);
        region.release(slot, 0, 768 << 20);
        assert_eq!(region.device_used(0), 0);
        let (again, outcome) = Region::open(&path, &devices()).expect("reopen");
        assert_eq!(outcome, OpenOutcome::Attached);
        assert_eq!(again.devices(), devices());
    }

    #[test]
    fn threads_never_pass_the_limit_together() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (region, _) = Region::open(&dir.path().join("r"), &devices()).expect("open");
        let region = std::sync::Arc::new(region);
        let limit = 1000u64;
        // What the threads hold after a successful reservation: never above the limit.
        // (The region's own sum may pass it for an instant while a racing reservation
        // that is about to back off is counted; that is conservative, never a grant.)
        let committed = std::sync::Arc::new(AtomicU64::new(0));
        let handles: Vec<_> = (0..8)
            .map(|t| {
                let region = region.clone();
                let committed = committed.clone();
                std::thread::spawn(move || {
                    let me = Identity {
                        start_time: 1_000_000 + t,
                        ..process::current()
                    };
                    let slot = region.attach(&me).expect("attach");
                    let mut held = 0u64;
                    for i in 0..20_000u64 {
                        let size = 1 + (i * 7 + t) % 97;
                        if region.try_reserve(slot, 0, size, limit) {
                            held += size;
                            let now = committed.fetch_add(size, Ordering::SeqCst) + size;
                            assert!(now <= limit, "{now} bytes held under a limit of {limit}");
                        }
                        if i % 3 == 0 && held > 0 {
                            committed.fetch_sub(held, Ordering::SeqCst);
                            region.release(slot, 0, held);
                            held = 0;
                        }
                    }
                    committed.fetch_sub(held, Ordering::SeqCst);
                    region.release(slot, 0, held);
                })
            })
            .collect();
        for handle in handles {
            handle.join().expect("thread");
        }
        assert_eq!(region.device_used(0), 0);
    }
}
