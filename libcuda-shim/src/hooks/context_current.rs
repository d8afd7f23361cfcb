//! The calls that change which context is current on the calling thread, hooked only to
//! keep the per-thread cache of the current context and device true (`crate::current`):
//! `cuCtxSetCurrent`, `cuCtxPushCurrent(_v2)` (the new context), `cuCtxPopCurrent(_v2)`
//! (whatever is below: asked once, at the next use), and `cuCtxDetach` and
//! `cuGreenCtxDestroy` (which may destroy a context that is current somewhere).
//! Creation, destruction and the primary context calls are in `context.rs`.

use std::ffi::c_void;

use crate::cuda::*;
use crate::current;
use crate::hook;

fn set(context: CUcontext, result: CUresult) -> CUresult {
    if result == CUDA_SUCCESS {
        current::became_current(context);
    }
    result
}

fn popped(result: CUresult) -> CUresult {
    current::changed();
    result
}

fn maybe_gone(result: CUresult) -> CUresult {
    if result == CUDA_SUCCESS {
        current::contexts_gone();
        crate::hooks::capture::forget_finished();
    }
    result
}

hook! {
    fn cuCtxSetCurrent(context: CUcontext) -> CUresult |forward| {
        set(context, forward())
    }
}

hook! {
    fn cuCtxPushCurrent(context: CUcontext) -> CUresult |forward| {
        set(context, forward())
    }
}

hook! {
    fn cuCtxPushCurrent_v2(context: CUcontext) -> CUresult |forward| {
        set(context, forward())
    }
}

hook! {
    fn cuCtxPopCurrent(context: *mut CUcontext) -> CUresult |forward| {
        popped(forward())
    }
}

hook! {
    fn cuCtxPopCurrent_v2(context: *mut CUcontext) -> CUresult |forward| {
        popped(forward())
    }
}

hook! {
    fn cuCtxDetach(context: CUcontext) -> CUresult |forward| {
        maybe_gone(forward())
    }
}

hook! {
    fn cuGreenCtxDestroy(green: *mut c_void) -> CUresult |forward| {
        maybe_gone(forward())
    }
}
