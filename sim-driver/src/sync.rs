//! The one lock of the process-local CUDA bookkeeping: a spin lock (with yield and sleep
//! back-off) that `pthread_atfork` takes before `fork` and releases on both sides, so a
//! child is never born with the lock held by a thread that does not exist in it.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// A value guarded by a spin lock that fork handlers can take and release by hand.
pub struct SpinLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: access to `value` is serialised by `locked`.
unsafe impl<T: Send> Sync for SpinLock<T> {}

/// Access to the guarded value; unlocks on drop.
pub struct SpinGuard<'a, T> {
    lock: &'a SpinLock<T>,
}

impl<T> SpinLock<T> {
    pub const fn new(value: T) -> SpinLock<T> {
        SpinLock {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    /// Takes the lock by hand (fork's prepare handler).
    pub fn raw_lock(&self) {
        let mut spins = 0u32;
        while self
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else if spins < 256 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
    }

    /// Releases a lock taken with `raw_lock` (fork's parent and child handlers).
    pub fn raw_unlock(&self) {
        self.locked.store(false, Ordering::Release);
    }

    /// A guard for a lock the caller already holds (taken with `raw_lock`). Dropping the
    /// guard releases it.
    pub fn assume_locked(&self) -> SpinGuard<'_, T> {
        SpinGuard { lock: self }
    }

    pub fn lock(&self) -> SpinGuard<'_, T> {
        self.raw_lock();
        SpinGuard { lock: self }
    }
}

impl<T> std::ops::Deref for SpinGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: we hold the lock.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> std::ops::DerefMut for SpinGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: we hold the lock exclusively.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    fn drop(&mut self) {
        self.lock.raw_unlock();
    }
}
