//! The exit service: the shim's one `atexit` registration, as `crate::fork_epoch` is
//! its one `pthread_atfork` registration. At exit, in this order:
//! 1. the compute limiter stands down (nothing is throttled any more, and
//!    `VGPU_LIMITER_TRACE` is written): `crate::limiter::stand_down`;
//! 2. this process gives its slot in the usage region back: `crate::process::give_back`.
//!
//! It is registered when the shim loads (and again, cheaply, where the limiter is first
//! built, in case a hook ran before the load-time constructor), so it runs after the
//! exit handlers the application registers later: the slot is given back after they
//! have freed what they free. Each step is panic-guarded (no unwind into libc) and
//! takes no lock that another thread may hold at exit: atomics, and `try_lock` where a
//! table is read.
//!
//! Cost: [`register`] is one `Once` check after the first call; nothing on any hook's
//! path.

use std::sync::Once;

use vgpu_shimgen::runtime;

/// Registers the exit handler (once).
#[inline]
pub fn register() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: registering a plain extern "C" handler whose steps are panic-guarded;
        // the shim is linked with -z nodelete, so it stays mapped.
        unsafe { libc::atexit(at_exit) };
    });
}

extern "C" fn at_exit() {
    runtime::guard((), crate::limiter::stand_down);
    runtime::guard((), crate::process::give_back);
}
