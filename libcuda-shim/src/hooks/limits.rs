//! `cuCtxSetLimit` (and so `cudaDeviceSetLimit`): the stack size is backed for every
//! thread the card can hold at once (SMs × max threads per SM), the malloc heap by its
//! size; the printf FIFO and the device runtime's limits are settled from the driver's
//! figure right after the call (`ledger::reserved::limit_bytes` says what was
//! measured). A value whose memory passes the quota is refused (or set back) with
//! CUDA_ERROR_OUT_OF_MEMORY, as the driver answers when the card itself is short
//! (`crate::allocating`'s `limit_begin` -> the call -> `limit_finish`).

use crate::allocating::{Priced, Settled};
use crate::cuda::*;
use crate::devices::Visible;
use crate::hooks::memory::current_context;
use crate::state::{Enforcer, enforce};
use crate::{hook, real};

/// The current context's value of `limit`, from the real driver.
pub(crate) fn current_limit(limit: CUlimit) -> Option<u64> {
    let get = real!(cuCtxGetLimit as fn(*mut usize, CUlimit) -> CUresult);
    let mut value = 0usize;
    // SAFETY: our own out-pointer, to the real cuCtxGetLimit.
    (unsafe { get(&mut value, limit) } == CUDA_SUCCESS).then_some(value as u64)
}

/// The threads a card holds at once: SMs × max threads per SM (0 if unknown).
pub(crate) fn resident_threads(device: CUdevice) -> u64 {
    let attribute = real!(cuDeviceGetAttribute as fn(*mut i32, i32, CUdevice) -> CUresult);
    let read = |which| {
        let mut value = 0i32;
        // SAFETY: our own out-pointer, to the real cuDeviceGetAttribute.
        let result = unsafe { attribute(&mut value, which, device) };
        if result == CUDA_SUCCESS {
            value.max(0) as u64
        } else {
            0
        }
    };
    read(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .saturating_mul(read(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR))
}

/// `cuCtxSetLimit(limit, new)` on `device` through `set` (the real function), the
/// limit being `old`, counted: `Enforcer::limit_begin`, the call, `Enforcer::limit_finish`;
/// set back to `old` (`Enforcer::limit_undone`) if the driver's figure then passes the
/// quota.
fn set_counted(
    enforcer: &'static Enforcer,
    device: &Visible,
    limit: CUlimit,
    (old, new): (u64, u64),
    set: unsafe extern "C" fn(CUlimit, usize) -> CUresult,
) -> CUresult {
    // SAFETY: the real cuCtxSetLimit with the caller's limit and a value (the caller's,
    // or the one it replaced when setting it back).
    let set = |value: u64| unsafe { set(limit, value as usize) };
    let threads = resident_threads(device.handle);
    let priced = match enforcer.limit_begin(device, current_context(), limit, (old, new), threads) {
        Priced::Refused(error) => return error,
        priced => priced,
    };
    let result = set(new);
    match enforcer.limit_finish(priced, device, result) {
        Settled::Kept(result) => result,
        Settled::Over(over) => {
            let _ = set(old);
            enforcer.limit_undone(over, device)
        }
    }
}

/// Before the first launch of `function`: a kernel whose local memory per thread
/// (`CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES`) passes the stack limit makes the driver grow
/// the local memory it backs for every resident thread at that launch, where nothing
/// is hooked. The stack limit is raised to the kernel's need here instead, through the
/// same counting as `cuCtxSetLimit` (refused, or set back, with
/// CUDA_ERROR_OUT_OF_MEMORY when it passes the quota), so the launch needs nothing more.
pub(crate) fn back_local_memory(local_bytes: Option<u64>) -> CUresult {
    let Some(local) = local_bytes.filter(|bytes| *bytes > 0) else {
        return CUDA_SUCCESS;
    };
    let set = real!(cuCtxSetLimit as fn(CUlimit, usize) -> CUresult);
    let passthrough = || CUDA_SUCCESS;
    enforce(passthrough, |enforcer| {
        let (Ok(device), Some(stack)) = (enforcer.current(), current_limit(CU_LIMIT_STACK_SIZE))
        else {
            return CUDA_SUCCESS;
        };
        if local <= stack {
            return CUDA_SUCCESS;
        }
        set_counted(enforcer, device, CU_LIMIT_STACK_SIZE, (stack, local), set)
    })
}

hook! {
    fn cuCtxSetLimit(limit: CUlimit, value: usize) -> CUresult |forward, real| {
        enforce(forward, |enforcer| {
            let (Ok(device), Some(old)) = (enforcer.current(), current_limit(limit)) else {
                // No context (or a limit the driver does not know): its own answer.
                return forward();
            };
            set_counted(enforcer, device, limit, (old, value as u64), real)
        })
    }
}
