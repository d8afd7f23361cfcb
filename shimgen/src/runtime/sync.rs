//! The one rule for a lock whose holder panicked, in both shims: recover the data and go
//! on. Every lock in the shims guards plain tables and counters (allocations, context
//! charges, pools, VMM handles, NVML handles, the limiter's slow path), each left
//! consistent at every step a panic could interrupt; a panic is caught by the hook's
//! guard, so refusing the lock afterwards would only stop every later hook from
//! counting (frees no longer credited back, the quota leaking away).

use std::sync::{Mutex, MutexGuard, PoisonError, TryLockError};

/// Locks `mutex`, waiting for it, whether or not a holder panicked.
#[inline]
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Takes `mutex` if it is free now, whether or not a holder panicked; `None` when
/// another thread holds it (for best-effort work that must never wait, nor deadlock in a
/// forked child on a lock a parent's thread held at the fork).
#[inline]
pub fn try_lock<T>(mutex: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    match mutex.try_lock() {
        Ok(guard) => Some(guard),
        Err(TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn poisoned() -> Mutex<u32> {
        let mutex = Mutex::new(1);
        let _ = std::panic::catch_unwind(|| {
            let mut guard = mutex.lock().unwrap();
            *guard = 2;
            panic!("a hook panicked while holding the lock");
        });
        assert!(mutex.is_poisoned());
        mutex
    }

    #[test]
    fn a_poisoned_lock_still_hands_out_its_data() {
        let mutex = poisoned();
        *lock(&mutex) += 1;
        assert_eq!(*lock(&mutex), 3);
        assert_eq!(try_lock(&mutex).map(|guard| *guard), Some(3));
    }

    #[test]
    fn try_lock_never_waits_for_a_holder() {
        let mutex = Mutex::new(0);
        let held = lock(&mutex);
        assert!(try_lock(&mutex).is_none());
        drop(held);
        assert!(try_lock(&mutex).is_some());
    }
}
