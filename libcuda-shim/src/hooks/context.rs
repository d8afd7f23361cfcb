//! Context creation and destruction: a hidden device gets no context, a new context's
//! overhead is measured from the real driver and counted, and a destroyed context
//! credits back everything that was allocated in it. Each also keeps the per-thread
//! current-context cache true (`crate::current`).

use std::ffi::c_void;

use crate::allocating::RealPools;
use crate::cuda::*;
use crate::ffi::read_out;
use crate::meter::ContextMeter;
use crate::state::{after_success, enforce};
use crate::{debug, hook, real};

/// Runs `create` for `device` with the visibility gate and the overhead meter.
fn create_context(
    device: CUdevice,
    context: *mut CUcontext,
    primary: bool,
    create: impl FnOnce() -> CUresult + Copy,
) -> CUresult {
    enforce(create, |enforcer| {
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
        let created = if result == CUDA_SUCCESS {
            read_out(context)
        } else {
            None
        };
        if let Some(created) = created {
            crate::current::created(created, device, primary);
        }
        if let Some(meter) = meter
            && let Some(created) = created
        {
            let created = created as usize;
            let ledger = enforcer.ledger();
            if !ledger.context_charged(created)
                && let Some(counted) = ledger.counted_on(visible.region_index)
            {
                let bytes = meter.finish(counted);
                if ledger.charge_context(visible.region_index, created, primary, bytes) {
                    debug!(
                        "context {created:#x} on {} costs {bytes} bytes",
                        visible.uuid
                    );
                }
            }
        }
        result
    })
}

fn primary_is_active(device: CUdevice) -> bool {
    let get_state =
        real!(cuDevicePrimaryCtxGetState as fn(CUdevice, *mut u32, *mut i32) -> CUresult);
    let (mut flags, mut active) = (0u32, 0i32);
    // SAFETY: our own out-pointers, to the real cuDevicePrimaryCtxGetState.
    unsafe { get_state(device, &mut flags, &mut active) == CUDA_SUCCESS && active != 0 }
}

/// After a primary context release or reset: if it is gone, credit it back.
fn primary_maybe_gone(device: CUdevice, result: CUresult) -> CUresult {
    if result == CUDA_SUCCESS {
        crate::current::contexts_gone();
    }
    after_success(result, |enforcer| {
        if let Some(visible) = enforcer.visible(device)
            && !primary_is_active(device)
            && let Some(context) = enforcer.ledger().primary_context(visible.region_index)
        {
            enforcer.ledger().context_destroyed(context, &RealPools);
        }
    })
}

fn destroyed(context: CUcontext, result: CUresult) -> CUresult {
    if result == CUDA_SUCCESS {
        crate::current::forget(context as usize);
        crate::hooks::capture::forget_finished();
    }
    after_success(result, |enforcer| {
        enforcer
            .ledger()
            .context_destroyed(context as usize, &RealPools)
    })
}

hook! {
    fn cuDevicePrimaryCtxRetain(context: *mut CUcontext, device: CUdevice) -> CUresult |forward| {
        create_context(device, context, true, forward)
    }
}

hook! {
    fn cuCtxCreate(context: *mut CUcontext, flags: u32, device: CUdevice) -> CUresult |forward| {
        create_context(device, context, false, forward)
    }
}

hook! {
    fn cuCtxCreate_v2(context: *mut CUcontext, flags: u32, device: CUdevice) -> CUresult |forward| {
        create_context(device, context, false, forward)
    }
}

hook! {
    fn cuCtxCreate_v3(context: *mut CUcontext, affinity: *mut c_void, affinity_count: i32, flags: u32, device: CUdevice) -> CUresult |forward| {
        create_context(device, context, false, forward)
    }
}

hook! {
    fn cuCtxCreate_v4(context: *mut CUcontext, params: *mut c_void, flags: u32, device: CUdevice) -> CUresult |forward| {
        create_context(device, context, false, forward)
    }
}

hook! {
    fn cuCtxDestroy(context: CUcontext) -> CUresult |forward| {
        destroyed(context, forward())
    }
}

hook! {
    fn cuCtxDestroy_v2(context: CUcontext) -> CUresult |forward| {
        destroyed(context, forward())
    }
}

hook! {
    fn cuDevicePrimaryCtxRelease(device: CUdevice) -> CUresult |forward| {
        primary_maybe_gone(device, forward())
    }
}

hook! {
    fn cuDevicePrimaryCtxRelease_v2(device: CUdevice) -> CUresult |forward| {
        primary_maybe_gone(device, forward())
    }
}

hook! {
    fn cuDevicePrimaryCtxReset(device: CUdevice) -> CUresult |forward| {
        primary_maybe_gone(device, forward())
    }
}

hook! {
    fn cuDevicePrimaryCtxReset_v2(device: CUdevice) -> CUresult |forward| {
        primary_maybe_gone(device, forward())
    }
}
