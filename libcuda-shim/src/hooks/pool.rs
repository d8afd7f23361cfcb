//! Stream-ordered allocation and memory pools. A pool keeps freed memory reserved (up to
//! its release threshold, and past it until a synchronisation), so the quota counts what
//! each pool this process uses has *reserved*, as the driver reports it, not what callers
//! hold: an allocation reserves the most its pool can grow by first, then the pool is
//! settled at the driver's figure (`Enforcer::pool_allocate`); frees credit nothing;
//! synchronisation points, trims, attribute changes and pool destruction settle again.
//! Before refusing any allocation the shim trims this process's pools if that makes room.

use std::ffi::c_void;

use crate::cuda::*;
use crate::hook;
use crate::hooks::memory::{
    Target, current_context, descriptor, pointer_freed, read, resolve, synchronized,
};
use crate::state::{Enforcer, Visible, enforcer, real};

/// The pool `cuMemAllocAsync` takes from on `device`: its current pool.
fn current_pool(device: &Visible) -> Option<usize> {
    let get = real!(cuDeviceGetMemPool as fn(*mut CUmemoryPool, CUdevice) -> CUresult);
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    // SAFETY: valid out-pointer, a real device handle.
    (unsafe { get(&mut pool, device.real) } == CUDA_SUCCESS && !pool.is_null())
        .then_some(pool as usize)
}

/// An allocation from `pool` (`None`: the current device's current pool) of `bytes`.
fn pooled(
    pool: Option<CUmemoryPool>,
    bytes: usize,
    pointer: *mut CUdeviceptr,
    allocate: impl FnOnce() -> CUresult,
    undo: impl FnOnce(u64),
) -> CUresult {
    let enforcer = match enforcer() {
        Err(error) => return error,
        Ok(None) => return allocate(),
        Ok(Some(enforcer)) => enforcer,
    };
    let device = match pool.and_then(|pool| enforcer.pool_device(pool as usize)) {
        Some(device) => device,
        None => match resolve(enforcer, &Target::Current) {
            Ok(device) => device,
            Err(CUDA_ERROR_INVALID_DEVICE) => return CUDA_ERROR_INVALID_DEVICE,
            // No context: the driver gives its own error.
            Err(_) => return allocate(),
        },
    };
    let Some(pool) = pool.map(|p| p as usize).or_else(|| current_pool(device)) else {
        return allocate();
    };
    enforcer.pool_allocate(
        device,
        pool,
        bytes as u64,
        current_context(),
        allocate,
        || read(pointer),
        undo,
    )
}

/// `cuMemAllocAsync`-style: `allocate` from `pool` (`None`: the device's current pool),
/// undone (should the pool pass the quota) by a free on `stream` and a wait for it.
fn stream_ordered(
    pool: Option<CUmemoryPool>,
    bytes: usize,
    pointer: *mut CUdeviceptr,
    stream: CUstream,
    per_thread: bool,
    allocate: impl FnOnce() -> CUresult,
) -> CUresult {
    let (free, sync) = if per_thread {
        (
            real!(cuMemFreeAsync_ptsz as fn(CUdeviceptr, CUstream) -> CUresult),
            real!(cuStreamSynchronize_ptsz as fn(CUstream) -> CUresult),
        )
    } else {
        (
            real!(cuMemFreeAsync as fn(CUdeviceptr, CUstream) -> CUresult),
            real!(cuStreamSynchronize as fn(CUstream) -> CUresult),
        )
    };
    pooled(pool, bytes, pointer, allocate, |p| {
        // SAFETY: freeing the allocation just made, on its own stream, and waiting.
        unsafe {
            free(p, stream);
            sync(stream);
        }
    })
}

hook! {
    fn cuMemAllocAsync(pointer: *mut CUdeviceptr, bytes: usize, stream: CUstream) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function.
        stream_ordered(None, bytes, pointer, stream, false, || unsafe { real(pointer, bytes, stream) })
    }
}

hook! {
    fn cuMemAllocAsync_ptsz(pointer: *mut CUdeviceptr, bytes: usize, stream: CUstream) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function.
        stream_ordered(None, bytes, pointer, stream, true, || unsafe { real(pointer, bytes, stream) })
    }
}

hook! {
    fn cuMemAllocFromPoolAsync(pointer: *mut CUdeviceptr, bytes: usize, pool: CUmemoryPool, stream: CUstream) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function.
        stream_ordered(Some(pool), bytes, pointer, stream, false, || unsafe { real(pointer, bytes, pool, stream) })
    }
}

hook! {
    fn cuMemAllocFromPoolAsync_ptsz(pointer: *mut CUdeviceptr, bytes: usize, pool: CUmemoryPool, stream: CUstream) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function.
        stream_ordered(Some(pool), bytes, pointer, stream, true, || unsafe { real(pointer, bytes, pool, stream) })
    }
}

hook! {
    fn cuMemFreeAsync(pointer: CUdeviceptr, stream: CUstream) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function.
        pointer_freed(pointer, unsafe { real(pointer, stream) })
    }
}

hook! {
    fn cuMemFreeAsync_ptsz(pointer: CUdeviceptr, stream: CUstream) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function.
        pointer_freed(pointer, unsafe { real(pointer, stream) })
    }
}

// --- the pools themselves -----------------------------------------------------------

/// Runs `then` when the real call succeeded and the quota applies.
fn after(result: CUresult, then: impl FnOnce(&Enforcer)) -> CUresult {
    if result == CUDA_SUCCESS
        && let Ok(Some(enforcer)) = enforcer()
    {
        then(enforcer);
    }
    result
}

/// Learns which device a looked-up pool belongs to.
fn looked_up(result: CUresult, pool: *mut CUmemoryPool, device: CUdevice) -> CUresult {
    after(result, |enforcer| {
        if let Some(visible) = enforcer.visible(device) {
            enforcer.pool_known(read(pool as *const usize), visible);
        }
    })
}

hook! {
    fn cuDeviceGetDefaultMemPool(pool: *mut CUmemoryPool, device: CUdevice) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function.
        looked_up(unsafe { real(pool, device) }, pool, device)
    }
}

hook! {
    fn cuDeviceGetMemPool(pool: *mut CUmemoryPool, device: CUdevice) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function.
        looked_up(unsafe { real(pool, device) }, pool, device)
    }
}

hook! {
    fn cuMemPoolCreate(pool: *mut CUmemoryPool, props: *const CUmemPoolProps) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function.
        let result = unsafe { real(pool, props) };
        match descriptor(props) {
            Some(p) if p.location_type == CU_MEM_LOCATION_TYPE_DEVICE => looked_up(result, pool, p.location_id),
            // Host pools take no device memory.
            _ => result,
        }
    }
}

hook! {
    fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function.
        after(unsafe { real(pool) }, |enforcer| enforcer.pool_destroyed(pool as usize))
    }
}

hook! {
    fn cuMemPoolTrimTo(pool: CUmemoryPool, keep: usize) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function.
        after(unsafe { real(pool, keep) }, |enforcer| enforcer.pool_settle(pool as usize))
    }
}

hook! {
    fn cuMemPoolSetAttribute(pool: CUmemoryPool, attribute: i32, value: *mut c_void) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function.
        after(unsafe { real(pool, attribute, value) }, |enforcer| enforcer.pool_settle(pool as usize))
    }
}

// --- where the driver may release pool memory -------------------------------------

hook! {
    fn cuStreamSynchronize(stream: CUstream) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function.
        synchronized(unsafe { real(stream) })
    }
}

hook! {
    fn cuStreamSynchronize_ptsz(stream: CUstream) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function.
        synchronized(unsafe { real(stream) })
    }
}

hook! {
    fn cuEventSynchronize(event: CUevent) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function.
        synchronized(unsafe { real(event) })
    }
}

hook! {
    fn cuCtxSynchronize() -> CUresult |real| {
        // SAFETY: forwarding to the real function.
        synchronized(unsafe { real() })
    }
}

hook! {
    fn cuCtxSynchronize_v2(context: CUcontext) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function.
        synchronized(unsafe { real(context) })
    }
}
