//! Stream-ordered allocation and memory pools. A pool keeps freed memory reserved (up to
//! its release threshold, and past it until a synchronisation), so the quota counts what
//! each pool this process uses has *reserved*, as the driver reports it, not what callers
//! hold: an allocation reserves the most its pool can grow by first, then the pool is
//! settled at the driver's figure (`crate::allocating`'s `pool_begin` -> the real call
//! -> `pool_finish`, over `crate::ledger::pool_counting`); frees credit nothing;
//! synchronisation points, trims, attribute changes and pool destruction settle again.
//! Before refusing any allocation the shim trims this process's pools if that makes room.

use std::ffi::c_void;

use crate::allocating::RealPools;
use crate::cuda::*;
use crate::devices::{LandsOn, Visible};
use crate::ffi::{read_descriptor, read_out};
use crate::hooks::memory::{current_context, pointer_freed, synchronized};
use crate::ledger::pool_counting::PoolFinish;
use crate::state::{after_success, enforce};
use crate::{hook, real};

/// The pool `cuMemAllocAsync` takes from on `device`: its current pool.
fn current_pool(device: &Visible) -> Option<usize> {
    let get = real!(cuDeviceGetMemPool as fn(*mut CUmemoryPool, CUdevice) -> CUresult);
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    // SAFETY: our own out-pointer and a real device handle, to the real cuDeviceGetMemPool.
    (unsafe { get(&mut pool, device.handle) } == CUDA_SUCCESS && !pool.is_null())
        .then_some(pool as usize)
}

/// An allocation from `pool` (`None`: the current device's current pool) of `bytes`:
/// `Enforcer::pool_begin`, `allocate`, `Enforcer::pool_finish`; should the pool have
/// grown past the quota, `free` undoes the allocation before `Enforcer::pool_undone`.
fn pooled(
    pool: Option<CUmemoryPool>,
    bytes: usize,
    pointer: *mut CUdeviceptr,
    allocate: impl FnOnce() -> CUresult + Copy,
    free: impl FnOnce(u64),
) -> CUresult {
    enforce(allocate, |enforcer| {
        let device = match pool.and_then(|pool| enforcer.pool_device(pool as usize)) {
            Some(device) => device,
            None => match enforcer.device_for(&LandsOn::Current) {
                Ok(device) => device,
                Err(CUDA_ERROR_INVALID_DEVICE) => return CUDA_ERROR_INVALID_DEVICE,
                // No context: the driver gives its own error.
                Err(_) => return allocate(),
            },
        };
        let Some(pool) = pool.map(|p| p as usize).or_else(|| current_pool(device)) else {
            return allocate();
        };
        let bytes = bytes as u64;
        let held = match enforcer.pool_begin(device, pool, bytes) {
            Ok(held) => held,
            Err(error) => return error,
        };
        let context = current_context();
        let result = allocate();
        let allocated = if result == CUDA_SUCCESS {
            read_out(pointer).unwrap_or(0)
        } else {
            0
        };
        match enforcer.pool_finish(held, device, bytes, (result, allocated, context)) {
            PoolFinish::Done(result) => result,
            PoolFinish::Over(over) => {
                free(over.pointer);
                enforcer.pool_undone(over)
            }
        }
    })
}

/// `cuMemAllocAsync`-style: `allocate` from `pool` (`None`: the device's current pool),
/// undone (should the pool pass the quota) by a free on `stream` and a wait for it.
fn stream_ordered(
    pool: Option<CUmemoryPool>,
    bytes: usize,
    pointer: *mut CUdeviceptr,
    stream: CUstream,
    per_thread: bool,
    allocate: impl FnOnce() -> CUresult + Copy,
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
        // SAFETY: freeing the allocation the real call just made, on the caller's stream
        // it was made on, and waiting for that stream, with the real functions.
        unsafe {
            free(p, stream);
            sync(stream);
        }
    })
}

hook! {
    fn cuMemAllocAsync(pointer: *mut CUdeviceptr, bytes: usize, stream: CUstream) -> CUresult |forward| {
        stream_ordered(None, bytes, pointer, stream, false, forward)
    }
}

hook! {
    fn cuMemAllocAsync_ptsz(pointer: *mut CUdeviceptr, bytes: usize, stream: CUstream) -> CUresult |forward| {
        stream_ordered(None, bytes, pointer, stream, true, forward)
    }
}

hook! {
    fn cuMemAllocFromPoolAsync(pointer: *mut CUdeviceptr, bytes: usize, pool: CUmemoryPool, stream: CUstream) -> CUresult |forward| {
        stream_ordered(Some(pool), bytes, pointer, stream, false, forward)
    }
}

hook! {
    fn cuMemAllocFromPoolAsync_ptsz(pointer: *mut CUdeviceptr, bytes: usize, pool: CUmemoryPool, stream: CUstream) -> CUresult |forward| {
        stream_ordered(Some(pool), bytes, pointer, stream, true, forward)
    }
}

hook! {
    fn cuMemFreeAsync(pointer: CUdeviceptr, stream: CUstream) -> CUresult |forward| {
        pointer_freed(pointer, forward())
    }
}

hook! {
    fn cuMemFreeAsync_ptsz(pointer: CUdeviceptr, stream: CUstream) -> CUresult |forward| {
        pointer_freed(pointer, forward())
    }
}

// --- the pools themselves -----------------------------------------------------------

/// Learns which device a looked-up pool belongs to.
fn looked_up(result: CUresult, pool: *mut CUmemoryPool, device: CUdevice) -> CUresult {
    after_success(result, |enforcer| {
        if let Some(visible) = enforcer.visible(device) {
            enforcer.ledger().pool_known(
                read_out(pool.cast::<usize>()).unwrap_or(0),
                visible.region_index,
            );
        }
    })
}

hook! {
    fn cuDeviceGetDefaultMemPool(pool: *mut CUmemoryPool, device: CUdevice) -> CUresult |forward| {
        looked_up(forward(), pool, device)
    }
}

hook! {
    fn cuDeviceGetMemPool(pool: *mut CUmemoryPool, device: CUdevice) -> CUresult |forward| {
        looked_up(forward(), pool, device)
    }
}

hook! {
    fn cuMemPoolCreate(pool: *mut CUmemoryPool, props: *const CUmemPoolProps) -> CUresult |forward| {
        let result = forward();
        match read_descriptor(props) {
            Some(p) if p.location_type == CU_MEM_LOCATION_TYPE_DEVICE => looked_up(result, pool, p.location_id),
            // Host pools take no device memory.
            _ => result,
        }
    }
}

hook! {
    fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult |forward| {
        after_success(forward(), |enforcer| enforcer.ledger().pool_destroyed(pool as usize))
    }
}

hook! {
    fn cuMemPoolTrimTo(pool: CUmemoryPool, keep: usize) -> CUresult |forward| {
        after_success(forward(), |enforcer| enforcer.ledger().pool_settle(pool as usize, &RealPools))
    }
}

hook! {
    fn cuMemPoolSetAttribute(pool: CUmemoryPool, attribute: i32, value: *mut c_void) -> CUresult |forward| {
        after_success(forward(), |enforcer| enforcer.ledger().pool_settle(pool as usize, &RealPools))
    }
}

// --- where the driver may release pool memory -------------------------------------

hook! {
    fn cuStreamSynchronize(stream: CUstream) -> CUresult |forward| {
        synchronized(forward())
    }
}

hook! {
    fn cuStreamSynchronize_ptsz(stream: CUstream) -> CUresult |forward| {
        synchronized(forward())
    }
}

hook! {
    fn cuEventSynchronize(event: CUevent) -> CUresult |forward| {
        synchronized(forward())
    }
}

hook! {
    fn cuCtxSynchronize() -> CUresult |forward| {
        synchronized(forward())
    }
}

hook! {
    fn cuCtxSynchronize_v2(context: CUcontext) -> CUresult |forward| {
        synchronized(forward())
    }
}
