//! `cuCtxSetLimit` (and so `cudaDeviceSetLimit`): the stack size is backed for every
//! thread the card can hold at once (SMs × max threads per SM), the malloc heap and the
//! printf FIFO by their size; the device runtime's sync depth and pending-launch count
//! take memory the driver does not document, settled from its figure right after the
//! call. A value whose memory passes the quota is refused (or set back) with
//! CUDA_ERROR_OUT_OF_MEMORY, as the driver answers when the card itself is short
//! (`ledger::reserved`).

use crate::cuda::*;
use crate::hooks::memory::current_context;
use crate::state::enforce;
use crate::{hook, real};

/// The current context's value of `limit`, from the real driver.
fn current_limit(limit: CUlimit) -> Option<u64> {
    let get = real!(cuCtxGetLimit as fn(*mut usize, CUlimit) -> CUresult);
    let mut value = 0usize;
    // SAFETY: our own out-pointer, to the real cuCtxGetLimit.
    (unsafe { get(&mut value, limit) } == CUDA_SUCCESS).then_some(value as u64)
}

/// The threads a card holds at once: SMs × max threads per SM (0 if unknown).
fn resident_threads(device: CUdevice) -> u64 {
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

hook! {
    fn cuCtxSetLimit(limit: CUlimit, value: usize) -> CUresult |forward, real| {
        enforce(forward, |enforcer| {
            let (Ok(device), Some(old)) = (enforcer.current(), current_limit(limit)) else {
                // No context (or a limit the driver does not know): its own answer.
                return forward();
            };
            let threads = resident_threads(device.real);
            enforcer.limit_counted(
                device,
                current_context(),
                limit,
                (old, value as u64),
                threads,
                // SAFETY: the real cuCtxSetLimit with the caller's limit and a value
                // (the caller's, or the one it replaced when setting it back).
                |value| unsafe { real(limit, value as usize) },
            )
        })
    }
}
