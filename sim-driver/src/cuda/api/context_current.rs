//! The calling thread's current context: `cuCtxGetCurrent`, `cuCtxSetCurrent` and the
//! context stack's push and pop (as in the shim's `hooks/context_current.rs`).

use super::support::{Res, cuda, out};
use crate::cuda::errors::*;
use crate::cuda::{current_context, with_registry, with_stack};

fn ctx_push(ctx: u64) -> Res {
    with_registry(|registry| registry.context(ctx).map(|_| ()))?;
    with_stack(|stack| stack.push(ctx));
    Ok(())
}

fn ctx_pop(pctx: *mut u64) -> Res {
    let popped = with_stack(|stack| stack.pop()).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
    if !pctx.is_null() {
        out(pctx, popped)?;
    }
    Ok(())
}

cuda! {
    fn cuCtxGetCurrent(pctx: *mut u64) {
        with_registry(|_| Ok(()))?;
        out(pctx, current_context().unwrap_or(0))
    }

    fn cuCtxSetCurrent(ctx: u64) {
        if ctx != 0 {
            with_registry(|registry| registry.context(ctx).map(|_| ()))?;
        } else {
            with_registry(|_| Ok(()))?;
        }
        with_stack(|stack| {
            stack.pop();
            if ctx != 0 {
                stack.push(ctx);
            }
        });
        Ok(())
    }

    fn cuCtxPushCurrent(ctx: u64) { ctx_push(ctx) }
    fn cuCtxPushCurrent_v2(ctx: u64) { ctx_push(ctx) }
    fn cuCtxPopCurrent(pctx: *mut u64) { ctx_pop(pctx) }
    fn cuCtxPopCurrent_v2(pctx: *mut u64) { ctx_pop(pctx) }
}
