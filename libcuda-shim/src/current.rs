//! The calling thread's current context and its device, cached so that a kernel launch
//! needs no driver round trip to learn where it goes.
//!
//! The context hooks keep it true: `cuCtxSetCurrent` and `cuCtxPushCurrent(_v2)` tell it
//! the new context ([`became_current`]); `cuCtxPopCurrent(_v2)` and `cuCtxCreate*`
//! (which pushes) drop the thread's entry ([`changed`]), so the next use asks the driver
//! once; destroying, resetting or releasing a context anywhere, and a fork, bump a
//! global epoch ([`contexts_gone`]) that every thread's entry is checked against, since
//! a context destroyed on one thread may be current on another. The device of a context
//! is remembered from creation and retain ([`remember`]) in a small lock-free map, so
//! setting a context current costs no driver call either.
//!
//! A stale entry can only misdirect a launch to another visible device's limiter (the
//! launch itself goes wherever the driver sends it); with one visible device the
//! limiter does not ask at all. A launch never believes a cached "no context"
//! ([`for_launch`]), and a measured launch checks the cache against the driver
//! ([`refresh`]): its events must belong to the context really current.

use std::cell::Cell;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

use crate::cuda::*;
use crate::state::real;

/// A thread's cached answer.
#[derive(Clone, Copy)]
struct Entry {
    /// The epoch it was taken in; 0 means "ask the driver".
    epoch: u64,
    context: usize,
    device: CUdevice,
}

const EMPTY: Entry = Entry {
    epoch: 0,
    context: 0,
    device: 0,
};

static NEXT_THREAD_TAG: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static ENTRY: Cell<Entry> = const { Cell::new(EMPTY) };
    static THREAD_TAG: Cell<u64> = const { Cell::new(0) };
    static STALE: Cell<bool> = const { Cell::new(false) };
}

/// The bit that marks a stream key as a thread's per-thread default stream
/// (`PER_THREAD_KEY_BIT | thread_tag()`), never a stream handle: handles are user-space
/// addresses, far below it. The limiter's stream table and the capture table key by it.
pub const PER_THREAD_KEY_BIT: u64 = 1 << 62;

/// A small nonzero number naming the calling thread (its per-thread default stream).
pub fn thread_tag() -> u64 {
    THREAD_TAG.with(tag_of)
}

/// [`thread_tag`], or `None` while the thread's storage is being torn down.
pub fn try_thread_tag() -> Option<u64> {
    THREAD_TAG.try_with(tag_of).ok()
}

/// The tag in `cell`, drawn on first use.
fn tag_of(cell: &Cell<u64>) -> u64 {
    if cell.get() == 0 {
        cell.set(NEXT_THREAD_TAG.fetch_add(1, Ordering::Relaxed));
    }
    cell.get()
}

/// Bumped whenever a context may have gone away anywhere in the process.
static CONTEXT_EPOCH: AtomicU64 = AtomicU64::new(1);

/// Contexts and their devices, as creation and retain saw them.
const KNOWN: usize = 64;
static KNOWN_CONTEXTS: [AtomicU64; KNOWN] = [const { AtomicU64::new(0) }; KNOWN];
static KNOWN_DEVICES: [AtomicI32; KNOWN] = [const { AtomicI32::new(0) }; KNOWN];

/// The calling thread's current context and its device; `None` when no context is
/// current (or the driver cannot say).
pub fn current() -> Option<(usize, CUdevice)> {
    crate::fork_epoch::register();
    let epoch = CONTEXT_EPOCH.load(Ordering::Acquire);
    let entry = ENTRY.with(Cell::get);
    if entry.epoch == epoch {
        return (entry.context != 0).then_some((entry.context, entry.device));
    }
    let fresh = ask_driver(epoch);
    ENTRY.with(|cell| cell.set(fresh));
    (fresh.context != 0).then_some((fresh.context, fresh.device))
}

/// [`current`] for a kernel launch: a launch always has a context, so a cached "none"
/// (taken before the thread's context was made current by a call the hooks do not see,
/// as the runtimes may make it) is asked about again rather than believed.
pub fn for_launch() -> Option<(usize, CUdevice)> {
    current().or_else(refresh)
}

/// Asks the driver now and caches the answer; whether the cache held something else
/// (for the limiter's trace) comes with it through [`refresh_was_stale`].
pub fn refresh() -> Option<(usize, CUdevice)> {
    crate::fork_epoch::register();
    let before = ENTRY.with(Cell::get);
    let fresh = ask_driver(CONTEXT_EPOCH.load(Ordering::Acquire));
    ENTRY.with(|cell| cell.set(fresh));
    STALE.with(|stale| {
        stale.set(before.epoch != 0 && fresh.epoch != 0 && before.context != fresh.context)
    });
    (fresh.context != 0).then_some((fresh.context, fresh.device))
}

/// Whether the last [`refresh`] on this thread found the cache stale.
pub fn refresh_was_stale() -> bool {
    STALE.with(Cell::get)
}

fn ask_driver(epoch: u64) -> Entry {
    let get_current = real!(cuCtxGetCurrent as fn(*mut CUcontext) -> CUresult);
    let mut context: CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    if unsafe { get_current(&mut context) } != CUDA_SUCCESS {
        return EMPTY;
    }
    if context.is_null() {
        return Entry { epoch, ..EMPTY };
    }
    let device = match known_device(context as usize) {
        Some(device) => device,
        None => {
            let get_device = real!(cuCtxGetDevice as fn(*mut CUdevice) -> CUresult);
            let mut device = 0;
            // SAFETY: valid out-pointer; a context is current.
            if unsafe { get_device(&mut device) } != CUDA_SUCCESS {
                return EMPTY;
            }
            remember(context as usize, device);
            device
        }
    };
    Entry {
        epoch,
        context: context as usize,
        device,
    }
}

/// After `cuCtxSetCurrent(context)` or `cuCtxPushCurrent(context)` succeeded.
pub fn became_current(context: CUcontext) {
    let epoch = CONTEXT_EPOCH.load(Ordering::Acquire);
    let entry = if context.is_null() {
        Entry { epoch, ..EMPTY }
    } else {
        match known_device(context as usize) {
            Some(device) => Entry {
                epoch,
                context: context as usize,
                device,
            },
            None => EMPTY,
        }
    };
    ENTRY.with(|cell| cell.set(entry));
}

/// After a context was created (`primary`: retained, which makes nothing current) on
/// `device`: remembered, and current on this thread unless primary.
pub fn created(context: CUcontext, device: CUdevice, primary: bool) {
    remember(context as usize, device);
    if !primary {
        became_current(context);
    }
}

/// After a call that changed the calling thread's context stack in a way the hook does
/// not follow (a pop, a creation): the next use asks the driver.
pub fn changed() {
    ENTRY.with(|cell| cell.set(EMPTY));
}

/// After a context was destroyed, reset or released anywhere: every thread asks again.
pub fn contexts_gone() {
    CONTEXT_EPOCH.fetch_add(1, Ordering::AcqRel);
}

/// Remembers which device `context` is on (creation, retain).
pub fn remember(context: usize, device: CUdevice) {
    crate::fork_epoch::register();
    if context == 0 || known_device(context) == Some(device) {
        return;
    }
    let slot = (context.wrapping_mul(0x9e37_79b9) >> 4) % KNOWN;
    for step in 0..KNOWN {
        let index = (slot + step) % KNOWN;
        let held = KNOWN_CONTEXTS[index].load(Ordering::Acquire);
        if (held == 0 || held == context as u64)
            && KNOWN_CONTEXTS[index]
                .compare_exchange(held, 0, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            KNOWN_DEVICES[index].store(device, Ordering::Release);
            KNOWN_CONTEXTS[index].store(context as u64, Ordering::Release);
            return;
        }
    }
    // Full: evict the home slot (its context is then asked about again when used).
    KNOWN_CONTEXTS[slot].store(0, Ordering::Release);
    KNOWN_DEVICES[slot].store(device, Ordering::Release);
    KNOWN_CONTEXTS[slot].store(context as u64, Ordering::Release);
}

/// Forgets a destroyed context (its handle may be reused for another).
pub fn forget(context: usize) {
    for known in &KNOWN_CONTEXTS {
        let _ = known.compare_exchange(context as u64, 0, Ordering::AcqRel, Ordering::Acquire);
    }
    contexts_gone();
}

fn known_device(context: usize) -> Option<CUdevice> {
    KNOWN_CONTEXTS
        .iter()
        .position(|known| known.load(Ordering::Acquire) == context as u64)
        .map(|index| KNOWN_DEVICES[index].load(Ordering::Acquire))
}

/// In a forked child (async-signal-safe: stores only; called by [`crate::fork_epoch`]):
/// no context survives a fork.
pub(crate) fn forget_in_child() {
    for known in &KNOWN_CONTEXTS {
        known.store(0, Ordering::Relaxed);
    }
    CONTEXT_EPOCH.fetch_add(1, Ordering::AcqRel);
}
