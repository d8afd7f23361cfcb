//! `cuCtxSetLimit` and `cuCtxGetLimit` of the current context (as in the shim's
//! `hooks/limits.rs`); what each limit reserves is modelled in `cuda::limits`.

use super::support::{cuda, out, require_current};
use crate::cuda::errors::*;
use crate::cuda::with_registry;

cuda! {
    fn cuCtxSetLimit(limit: u32, value: usize) {
        let ctx = require_current()?;
        with_registry(|registry| registry.set_limit(ctx, limit, value as u64))
    }

    fn cuCtxGetLimit(value: *mut usize, limit: u32) {
        if value.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let ctx = require_current()?;
        let current = with_registry(|registry| registry.get_limit(ctx, limit))?;
        out(value, current as usize)
    }
}
