//! The fork epoch: the one `pthread_atfork` registration of the shim, and the one
//! counter of forks that every per-process cache is checked against.
//!
//! A forked child has one thread, a copy of the parent's memory, and any lock a parent
//! thread held at the fork still held forever. So the child handler does stores only
//! (async-signal-safe, no allocation, no lock): it empties the fixed tables whose
//! entries name the parent's contexts and captures ([`crate::current`],
//! [`crate::hooks::capture`]) and the limiter's word for the parent's device
//! (`crate::limiter::clear_sole_device`), then bumps the epoch. Everything built per process (the
//! process state and its ledger, `crate::process`; the compute limiter) remembers the
//! epoch it was built in and is built anew, by the first call in the child that needs
//! it, when [`generation`] has moved on.
//!
//! Cost: [`generation`] is one acquire load; [`register`] one `Once` check after the
//! first call.

use std::sync::Once;
use std::sync::atomic::{AtomicU64, Ordering};

/// Forks this process is removed from its first image by (0 in the process that
/// loaded the shim).
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// The fork generation of the calling process.
#[inline]
pub fn generation() -> u64 {
    GENERATION.load(Ordering::Acquire)
}

/// Registers the child handler (once; when the shim loads, and again cheaply wherever
/// a cache is first filled, in case a hook ran before the load-time constructor).
#[inline]
pub fn register() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: registering a plain extern "C" handler that only stores to atomics
        // (see `in_child`); the shim is linked with -z nodelete, so it stays mapped.
        unsafe { libc::pthread_atfork(None, None, Some(in_child)) };
    });
}

/// In a forked child: empties the per-process tables, then starts a new generation.
/// Stores only: no lock, no allocation, no panic.
extern "C" fn in_child() {
    crate::current::forget_in_child();
    crate::hooks::capture::forget_in_child();
    crate::limiter::clear_sole_device();
    GENERATION.fetch_add(1, Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fork_moves_the_child_one_generation_on_however_often_it_was_registered() {
        register();
        register();
        let before = generation();
        // SAFETY: fork in a test; the child only loads an atomic and leaves with _exit.
        let child = unsafe { libc::fork() };
        if child == 0 {
            let status = if generation() == before + 1 { 0 } else { 1 };
            // SAFETY: leaving the forked child without running the parent's exit handlers.
            unsafe { libc::_exit(status) };
        }
        assert!(child > 0, "fork failed");
        let mut status = 0;
        // SAFETY: reaping our own child into a local.
        unsafe { libc::waitpid(child, &mut status, 0) };
        assert!(libc::WIFEXITED(status), "the child ended by a signal");
        assert_eq!(libc::WEXITSTATUS(status), 0, "one handler, one step");
        assert_eq!(generation(), before, "the parent's generation stays");
    }
}
