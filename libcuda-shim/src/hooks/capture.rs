//! Stream capture: `cuStreamBeginCapture` (`_ptsz`, `_v2`, `_v2_ptsz`),
//! `cuStreamBeginCaptureToGraph(_ptsz)` and `cuStreamEndCapture(_ptsz)`, hooked only to
//! count the captures under way in this process. The runtime's `cudaStreamBeginCapture`
//! reaches the same driver calls (through `cuGetProcAddress`, which hands out these
//! hooks), and so does every framework's graph capture.
//!
//! While no capture is under way, a limited launch needs no capture check at all;
//! while one is, the limiter asks the driver whether the launch's stream is capturing
//! (a captured launch is recorded into a graph, not run, so it is neither delayed nor
//! timed). The limiter's own event calls run in relaxed capture mode whether or not a
//! capture is known (`limiter::sample::RelaxedCapture`): one may begin on another
//! thread between a check and the calls. A capture this table
//! cannot follow (more than it holds) makes the check permanent, never absent.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use crate::cuda::*;
use crate::current::PER_THREAD_KEY_BIT;
use crate::hook;
use crate::state::real;

/// Captures this table follows at once.
const SLOTS: usize = 64;
static CAPTURING: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];
static ACTIVE: AtomicUsize = AtomicUsize::new(0);
static LOST_TRACK: AtomicBool = AtomicBool::new(false);

/// Whether a capture may be under way anywhere in the process.
#[inline]
pub fn possible() -> bool {
    ACTIVE.load(Ordering::Relaxed) != 0 || LOST_TRACK.load(Ordering::Relaxed)
}

/// The key of a capture: the stream handle, or the calling thread for its per-thread
/// default stream.
fn key(stream: CUstream, per_thread: bool) -> u64 {
    let value = stream as usize;
    if (per_thread && value == 0) || value == CU_STREAM_PER_THREAD {
        PER_THREAD_KEY_BIT | crate::current::thread_tag()
    } else {
        value as u64
    }
}

fn began(stream: CUstream, per_thread: bool, result: CUresult) -> CUresult {
    crate::fork_epoch::register();
    if result != CUDA_SUCCESS {
        return result;
    }
    let key = key(stream, per_thread);
    let claimed = CAPTURING.iter().any(|slot| {
        slot.compare_exchange(0, key, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    });
    if claimed {
        ACTIVE.fetch_add(1, Ordering::AcqRel);
    } else {
        LOST_TRACK.store(true, Ordering::Release);
    }
    // Launches ask about captures again (after the count: see
    // `limiter::clear_sole_device`).
    crate::limiter::clear_sole_device();
    result
}

/// After `cuStreamEndCapture`: the capture is over unless the stream still captures
/// (the call failed before ending it).
fn ended(stream: CUstream, per_thread: bool, result: CUresult) -> CUresult {
    let key = key(stream, per_thread);
    if result != CUDA_SUCCESS && still_capturing(stream, per_thread) {
        return result;
    }
    if let Some(slot) = CAPTURING
        .iter()
        .find(|slot| slot.load(Ordering::Acquire) == key)
        && slot
            .compare_exchange(key, 0, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    {
        ACTIVE.fetch_sub(1, Ordering::AcqRel);
        crate::limiter::refresh_sole_device();
    }
    result
}

fn still_capturing(stream: CUstream, per_thread: bool) -> bool {
    let stream = if per_thread && stream.is_null() {
        CU_STREAM_PER_THREAD as CUstream
    } else {
        stream
    };
    let is_capturing = real!(cuStreamIsCapturing as fn(CUstream, *mut u32) -> CUresult);
    let mut status = CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: valid out-pointer; the caller's stream.
    let result = unsafe { is_capturing(stream, &mut status) };
    result == CUDA_SUCCESS && status != CU_STREAM_CAPTURE_STATUS_NONE
}

/// After a context went away: captures of streams that no longer capture (destroyed
/// with their context) are forgotten. Per-thread streams are only the owner's to ask.
pub fn forget_finished() {
    for slot in &CAPTURING {
        let key = slot.load(Ordering::Acquire);
        if key == 0 || key & PER_THREAD_KEY_BIT != 0 {
            continue;
        }
        if !still_capturing(key as usize as CUstream, false)
            && slot
                .compare_exchange(key, 0, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            ACTIVE.fetch_sub(1, Ordering::AcqRel);
            crate::limiter::refresh_sole_device();
        }
    }
}

/// In a forked child: no capture survives a fork (stores only; called by
/// [`crate::fork_epoch`]).
pub(crate) fn forget_in_child() {
    for slot in &CAPTURING {
        slot.store(0, Ordering::Relaxed);
    }
    ACTIVE.store(0, Ordering::Relaxed);
}

pub type CUgraph = *mut c_void;

hook! {
    fn cuStreamBeginCapture(stream: CUstream) -> CUresult |forward| {
        began(stream, false, forward())
    }
}

hook! {
    fn cuStreamBeginCapture_ptsz(stream: CUstream) -> CUresult |forward| {
        began(stream, true, forward())
    }
}

hook! {
    fn cuStreamBeginCapture_v2(stream: CUstream, mode: u32) -> CUresult |forward| {
        began(stream, false, forward())
    }
}

hook! {
    fn cuStreamBeginCapture_v2_ptsz(stream: CUstream, mode: u32) -> CUresult |forward| {
        began(stream, true, forward())
    }
}

hook! {
    fn cuStreamBeginCaptureToGraph(stream: CUstream, graph: CUgraph, dependencies: *const c_void, data: *const c_void, count: usize, mode: u32) -> CUresult |forward| {
        began(stream, false, forward())
    }
}

hook! {
    fn cuStreamBeginCaptureToGraph_ptsz(stream: CUstream, graph: CUgraph, dependencies: *const c_void, data: *const c_void, count: usize, mode: u32) -> CUresult |forward| {
        began(stream, true, forward())
    }
}

hook! {
    fn cuStreamEndCapture(stream: CUstream, graph: *mut CUgraph) -> CUresult |forward| {
        ended(stream, false, forward())
    }
}

hook! {
    fn cuStreamEndCapture_ptsz(stream: CUstream, graph: *mut CUgraph) -> CUresult |forward| {
        ended(stream, true, forward())
    }
}
