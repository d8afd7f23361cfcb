//! Contexts: primary contexts, `cuCtxCreate*`/`cuCtxDestroy*`, synchronisation and the
//! queries of a context (as in the shim's `hooks/context.rs`; the thread's current
//! context is in `context_current`).

use std::ffi::c_void;

use super::support::{Res, cuda, device, out, require_current};
use crate::clock::sleep_until;
use crate::cuda::errors::*;
use crate::cuda::registry::*;
use crate::cuda::{with_registry, with_stack};

const CTX_FLAGS_MASK: u32 = 0xff;

fn create_context(pctx: *mut u64, flags: u32, dev: i32) -> Res {
    if pctx.is_null() || flags & !CTX_FLAGS_MASK != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (index, _) = device(dev)?;
    let ctx = with_registry(|registry| {
        let ctx = registry.handle(TAG_CONTEXT);
        registry
            .contexts
            .insert(ctx, Context::new(index, flags, false));
        if let Err(code) = registry.activate(ctx) {
            registry.contexts.remove(&ctx);
            return Err(code);
        }
        Ok(ctx)
    })?;
    with_stack(|stack| stack.push(ctx));
    out(pctx, ctx)
}

fn destroy_context(ctx: u64) -> Res {
    if ctx == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    with_registry(|registry| {
        match registry.contexts.get(&ctx) {
            Some(context) if !context.primary => {}
            _ => return Err(CUDA_ERROR_INVALID_CONTEXT),
        }
        registry.deactivate(ctx);
        registry.contexts.remove(&ctx);
        Ok(())
    })?;
    with_stack(|stack| stack.retain(|held| *held != ctx));
    Ok(())
}

fn primary_release(dev: i32) -> Res {
    let (index, _) = device(dev)?;
    with_registry(|registry| {
        let primary = &mut registry.primaries[index];
        if primary.refs == 0 {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        primary.refs -= 1;
        if primary.refs == 0 {
            let ctx = primary.ctx;
            registry.deactivate(ctx);
        }
        Ok(())
    })
}

fn primary_reset(dev: i32) -> Res {
    let (index, _) = device(dev)?;
    with_registry(|registry| {
        let primary = &mut registry.primaries[index];
        primary.refs = 0;
        primary.flags = 0;
        let ctx = primary.ctx;
        registry.deactivate(ctx);
        Ok(())
    })
}

fn primary_set_flags(dev: i32, flags: u32, refuse_when_active: bool) -> Res {
    let (index, _) = device(dev)?;
    if flags & !CTX_FLAGS_MASK != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    with_registry(|registry| {
        let primary = &mut registry.primaries[index];
        if refuse_when_active && primary.refs > 0 {
            return Err(CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE);
        }
        primary.flags = flags;
        let ctx = primary.ctx;
        if let Some(context) = registry.contexts.get_mut(&ctx) {
            context.flags = flags;
        }
        Ok(())
    })
}

/// Sleeps until `ctx` is idle, then lets its device's pools release memory.
fn synchronize_context(ctx: u64) -> Res {
    let deadline = with_registry(|registry| {
        registry.check_unsafe_call(None)?;
        registry.context(ctx).map(|_| registry.ctx_idle_at(ctx))
    })?;
    sleep_until(deadline);
    with_registry(|registry| {
        let device = registry.context(ctx)?.device;
        registry.release_pools_at_sync(device);
        Ok(())
    })
}

cuda! {
    fn cuDevicePrimaryCtxRetain(pctx: *mut u64, dev: i32) {
        if pctx.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (index, _) = device(dev)?;
        let ctx = with_registry(|registry| {
            let (ctx, refs) = (registry.primaries[index].ctx, registry.primaries[index].refs);
            if refs == 0 {
                registry.activate(ctx)?;
                let flags = registry.primaries[index].flags;
                if let Some(context) = registry.contexts.get_mut(&ctx) {
                    context.flags = flags;
                }
            }
            registry.primaries[index].refs += 1;
            Ok(ctx)
        })?;
        out(pctx, ctx)
    }

    fn cuDevicePrimaryCtxRelease(dev: i32) { primary_release(dev) }
    fn cuDevicePrimaryCtxRelease_v2(dev: i32) { primary_release(dev) }
    fn cuDevicePrimaryCtxReset(dev: i32) { primary_reset(dev) }
    fn cuDevicePrimaryCtxReset_v2(dev: i32) { primary_reset(dev) }
    fn cuDevicePrimaryCtxSetFlags(dev: i32, flags: u32) { primary_set_flags(dev, flags, true) }
    fn cuDevicePrimaryCtxSetFlags_v2(dev: i32, flags: u32) { primary_set_flags(dev, flags, false) }

    fn cuDevicePrimaryCtxGetState(dev: i32, flags: *mut u32, active: *mut i32) {
        let (index, _) = device(dev)?;
        let (f, refs) = with_registry(|registry| Ok((registry.primaries[index].flags, registry.primaries[index].refs)))?;
        out(flags, f)?;
        out(active, i32::from(refs > 0))
    }

    fn cuCtxCreate(pctx: *mut u64, flags: u32, dev: i32) { create_context(pctx, flags, dev) }
    fn cuCtxCreate_v2(pctx: *mut u64, flags: u32, dev: i32) { create_context(pctx, flags, dev) }

    /// Execution-affinity parameters are accepted and not enforced.
    fn cuCtxCreate_v3(pctx: *mut u64, params: *const c_void, num_params: i32, flags: u32, dev: i32) {
        if num_params < 0 || (num_params > 0 && params.is_null()) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        create_context(pctx, flags, dev)
    }

    /// `CUctxCreateParams` (affinity, CIG) is accepted and not enforced.
    fn cuCtxCreate_v4(pctx: *mut u64, params: *const c_void, flags: u32, dev: i32) {
        let _ = params;
        create_context(pctx, flags, dev)
    }

    fn cuCtxDestroy(ctx: u64) { destroy_context(ctx) }
    fn cuCtxDestroy_v2(ctx: u64) { destroy_context(ctx) }

    fn cuCtxGetDevice(dev: *mut i32) {
        let ctx = require_current()?;
        let index = with_registry(|registry| registry.context(ctx).map(|c| c.device))?;
        out(dev, index as i32)
    }

    fn cuCtxGetDevice_v2(dev: *mut i32, ctx: u64) {
        let ctx = if ctx == 0 { require_current()? } else { ctx };
        let index = with_registry(|registry| registry.context(ctx).map(|c| c.device))?;
        out(dev, index as i32)
    }

    fn cuCtxSynchronize() {
        let ctx = require_current()?;
        synchronize_context(ctx)
    }

    fn cuCtxSynchronize_v2(ctx: u64) {
        let ctx = if ctx == 0 { require_current()? } else { ctx };
        synchronize_context(ctx)
    }

    fn cuCtxGetApiVersion(ctx: u64, version: *mut u32) {
        let ctx = if ctx == 0 { require_current()? } else { ctx };
        with_registry(|registry| registry.context(ctx).map(|_| ()))?;
        out(version, 3020)
    }

    fn cuCtxGetFlags(flags: *mut u32) {
        let ctx = require_current()?;
        let f = with_registry(|registry| registry.context(ctx).map(|c| c.flags))?;
        out(flags, f)
    }

    fn cuCtxGetStreamPriorityRange(least: *mut i32, greatest: *mut i32) {
        with_registry(|_| Ok(()))?;
        if !least.is_null() {
            out(least, 0)?;
        }
        if !greatest.is_null() {
            out(greatest, -5)?;
        }
        Ok(())
    }
}
