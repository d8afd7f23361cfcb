//! Context creation and destruction: a hidden device gets no context, a new context's
//! overhead is measured from the real driver and counted, and a destroyed context
//! credits back everything that was allocated in it. Each also keeps the per-thread
//! current-context cache true (`crate::current`).

use std::ffi::c_void;

use crate::cuda::*;
use crate::hook;
use crate::state::{ContextMeter, enforcer, real};

/// Runs `create` for `device` with the visibility gate and the overhead meter.
fn create_context(
    device: CUdevice,
    context: *mut CUcontext,
    primary: bool,
    create: impl FnOnce() -> CUresult,
) -> CUresult {
    let enforcer = match enforcer() {
        Err(error) => return error,
        Ok(None) => return create(),
        Ok(Some(enforcer)) => enforcer,
    };
    if enforcer.devices().is_none() {
        // Before cuInit: the real call fails with the right error.
        return create();
    }
    let Some(visible) = enforcer.visible(device).cloned() else {
        return CUDA_ERROR_INVALID_DEVICE;
    };
    let existing_primary = primary && primary_is_active(device);
    let meter = (!existing_primary).then(|| ContextMeter::start(enforcer, &visible.uuid));
    let result = create();
    if result == CUDA_SUCCESS && !context.is_null() {
        // SAFETY: the real call succeeded and wrote the context.
        crate::current::created(unsafe { *context }, device, primary);
    }
    if result == CUDA_SUCCESS
        && let Some(meter) = meter
        && !context.is_null()
    {
        // SAFETY: the real call succeeded and wrote the context.
        let created = unsafe { *context } as usize;
        if !enforcer.context_charged(created) {
            enforcer.charge_context(&visible, created, primary, |tracked| meter.finish(tracked));
        }
    }
    result
}

fn primary_is_active(device: CUdevice) -> bool {
    let get_state =
        real!(cuDevicePrimaryCtxGetState as fn(CUdevice, *mut u32, *mut i32) -> CUresult);
    let (mut flags, mut active) = (0u32, 0i32);
    // SAFETY: valid out-pointers.
    unsafe { get_state(device, &mut flags, &mut active) == CUDA_SUCCESS && active != 0 }
}

/// After a primary context release or reset: if it is gone, credit it back.
fn primary_maybe_gone(device: CUdevice, result: CUresult) -> CUresult {
    if result == CUDA_SUCCESS {
        crate::current::contexts_gone();
    }
    if result == CUDA_SUCCESS
        && let Ok(Some(enforcer)) = enforcer()
        && let Some(visible) = enforcer.visible(device)
        && !primary_is_active(device)
        && let Some(context) = enforcer.primary_context(visible)
    {
        enforcer.context_destroyed(context);
    }
    result
}

fn destroyed(context: CUcontext, result: CUresult) -> CUresult {
    if result == CUDA_SUCCESS {
        crate::current::forget(context as usize);
        crate::hooks::capture::forget_finished();
    }
    if result == CUDA_SUCCESS
        && let Ok(Some(enforcer)) = enforcer()
    {
        enforcer.context_destroyed(context as usize);
    }
    result
}

hook! {
    fn cuDevicePrimaryCtxRetain(context: *mut CUcontext, device: CUdevice) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        create_context(device, context, true, || unsafe { real(context, device) })
    }
}

hook! {
    fn cuCtxCreate(context: *mut CUcontext, flags: u32, device: CUdevice) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        create_context(device, context, false, || unsafe { real(context, flags, device) })
    }
}

hook! {
    fn cuCtxCreate_v2(context: *mut CUcontext, flags: u32, device: CUdevice) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        create_context(device, context, false, || unsafe { real(context, flags, device) })
    }
}

hook! {
    fn cuCtxCreate_v3(context: *mut CUcontext, affinity: *mut c_void, affinity_count: i32, flags: u32, device: CUdevice) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        create_context(device, context, false, || unsafe { real(context, affinity, affinity_count, flags, device) })
    }
}

hook! {
    fn cuCtxCreate_v4(context: *mut CUcontext, params: *mut c_void, flags: u32, device: CUdevice) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        create_context(device, context, false, || unsafe { real(context, params, flags, device) })
    }
}

hook! {
    fn cuCtxDestroy(context: CUcontext) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        destroyed(context, unsafe { real(context) })
    }
}

hook! {
    fn cuCtxDestroy_v2(context: CUcontext) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        destroyed(context, unsafe { real(context) })
    }
}

hook! {
    fn cuDevicePrimaryCtxRelease(device: CUdevice) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        primary_maybe_gone(device, unsafe { real(device) })
    }
}

hook! {
    fn cuDevicePrimaryCtxRelease_v2(device: CUdevice) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        primary_maybe_gone(device, unsafe { real(device) })
    }
}

hook! {
    fn cuDevicePrimaryCtxReset(device: CUdevice) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        primary_maybe_gone(device, unsafe { real(device) })
    }
}

hook! {
    fn cuDevicePrimaryCtxReset_v2(device: CUdevice) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        primary_maybe_gone(device, unsafe { real(device) })
    }
}
