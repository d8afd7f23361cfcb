//! Every device-memory allocation path, counted against the container's quota in the
//! shared usage region, and every free credited back exactly.
//!
//! The order is always: reserve in the region (refusing with CUDA_ERROR_OUT_OF_MEMORY
//! and allocating nothing when the quota would be passed), call the real allocator,
//! then record the allocation, or give the reservation back if the driver failed.

use std::ffi::c_void;

use crate::cuda::*;
use crate::hook;
use crate::state::{AllocKey, Enforcer, Visible, charged_size, enforcer, real};

/// Which device an allocation lands on.
enum Target {
    /// The calling thread's current context.
    Current,
    /// A device named by the call (VMM location).
    Device(CUdevice),
}

fn current_context() -> usize {
    let get_current = real!(cuCtxGetCurrent as fn(*mut CUcontext) -> CUresult);
    let mut context: CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    unsafe { get_current(&mut context) };
    context as usize
}

fn resolve<'a>(enforcer: &'a Enforcer, target: &Target) -> Result<&'a Visible, CUresult> {
    match target {
        Target::Current => enforcer.current(),
        Target::Device(handle) => {
            if enforcer.devices().is_none() {
                return Err(CUDA_ERROR_NOT_INITIALIZED);
            }
            enforcer.visible(*handle).ok_or(CUDA_ERROR_INVALID_DEVICE)
        }
    }
}

/// Reserve `bytes`, run `allocate`, and on success record the allocation under the key
/// that `key` reads back from the call's out-parameter.
fn counted(
    bytes: u64,
    target: Target,
    allocate: impl FnOnce() -> CUresult,
    key: impl FnOnce() -> AllocKey,
) -> CUresult {
    let enforcer = match enforcer() {
        Err(error) => return error,
        Ok(None) => return allocate(),
        Ok(Some(enforcer)) => enforcer,
    };
    let device = match resolve(enforcer, &target) {
        Ok(device) => device,
        Err(CUDA_ERROR_INVALID_DEVICE) => return CUDA_ERROR_INVALID_DEVICE,
        Err(_) => {
            // No current context (or the driver is not initialised): the driver gives
            // its own error. Should it succeed anyway, count what it handed out.
            let result = allocate();
            if result == CUDA_SUCCESS
                && let Ok(device) = resolve(enforcer, &target)
                && let Some(slot) = enforcer.slot()
            {
                let charged = charged_size(bytes);
                enforcer.region.add_used(slot, device.region_index, charged);
                enforcer.record(
                    key(),
                    enforcer.ticket(slot, device, charged),
                    current_context(),
                );
            }
            return result;
        }
    };
    let ticket = match enforcer.reserve(device, charged_size(bytes)) {
        Ok(ticket) => ticket,
        Err(error) => return error,
    };
    let result = allocate();
    if result == CUDA_SUCCESS {
        enforcer.record(key(), ticket, current_context());
    } else {
        enforcer.unreserve(ticket);
    }
    result
}

fn freed(key: AllocKey, result: CUresult) -> CUresult {
    if result == CUDA_SUCCESS
        && let Ok(Some(enforcer)) = enforcer()
    {
        enforcer.forget(key);
    }
    result
}

/// Reads a pointer out-parameter after a successful call.
fn read<T: Copy + Default>(out: *const T) -> T {
    if out.is_null() {
        T::default()
    } else {
        // SAFETY: only called after the driver succeeded, so it wrote `out`.
        unsafe { *out }
    }
}

hook! {
    fn cuMemAlloc_v2(pointer: *mut CUdeviceptr, bytes: usize) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function (or
        // writing through out-pointers the real call has just validated).
        counted(bytes as u64, Target::Current, || unsafe { real(pointer, bytes) }, || AllocKey::Pointer(read(pointer)))
    }
}

hook! {
    /// The pre-3.2 ABI (32-bit pointers and sizes).
    fn cuMemAlloc(pointer: *mut u32, bytes: u32) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function (or
        // writing through out-pointers the real call has just validated).
        counted(bytes as u64, Target::Current, || unsafe { real(pointer, bytes) }, || AllocKey::Pointer(read(pointer) as u64))
    }
}

hook! {
    fn cuMemAllocManaged(pointer: *mut CUdeviceptr, bytes: usize, flags: u32) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function (or
        // writing through out-pointers the real call has just validated).
        counted(bytes as u64, Target::Current, || unsafe { real(pointer, bytes, flags) }, || AllocKey::Pointer(read(pointer)))
    }
}

/// Pitched allocations: the pitch is only known afterwards, so reserve the smallest
/// possible footprint, then settle the difference (freeing if the quota cannot take it).
fn pitched(
    width: u64,
    height: u64,
    allocate: impl FnOnce() -> CUresult,
    result_of: impl Fn() -> (u64, u64),
    free: impl FnOnce(u64),
) -> CUresult {
    let result = counted(
        width.saturating_mul(height),
        Target::Current,
        allocate,
        || AllocKey::Pointer(result_of().0),
    );
    if result != CUDA_SUCCESS {
        return result;
    }
    let Ok(Some(enforcer)) = enforcer() else {
        return result;
    };
    let (pointer, pitch) = result_of();
    let extra = charged_size(pitch.saturating_mul(height))
        .saturating_sub(charged_size(width.saturating_mul(height)));
    if extra == 0 {
        return result;
    }
    match enforcer
        .current()
        .and_then(|device| enforcer.reserve(device, extra))
    {
        Ok(ticket) => {
            enforcer.record(
                AllocKey::Pointer(pointer ^ (1 << 63)),
                ticket,
                current_context(),
            );
            result
        }
        Err(error) => {
            free(pointer);
            enforcer.forget(AllocKey::Pointer(pointer));
            error
        }
    }
}

hook! {
    fn cuMemAllocPitch_v2(pointer: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, element_bytes: u32) -> CUresult |real| {
        let free = real!(cuMemFree_v2 as fn(CUdeviceptr) -> CUresult);
        pitched(
            width as u64,
            height as u64,
            // SAFETY: forwarding the caller's own arguments to the real function (or
            // writing through out-pointers the real call has just validated).
            || unsafe { real(pointer, pitch, width, height, element_bytes) },
            || (read(pointer), read(pitch) as u64),
            // SAFETY: forwarding the caller's own arguments to the real function (or
            // writing through out-pointers the real call has just validated).
            |p| unsafe { free(p); },
        )
    }
}

hook! {
    fn cuMemAllocPitch(pointer: *mut u32, pitch: *mut u32, width: u32, height: u32, element_bytes: u32) -> CUresult |real| {
        let free = real!(cuMemFree as fn(u32) -> CUresult);
        pitched(
            width as u64,
            height as u64,
            // SAFETY: forwarding the caller's own arguments to the real function (or
            // writing through out-pointers the real call has just validated).
            || unsafe { real(pointer, pitch, width, height, element_bytes) },
            || (read(pointer) as u64, read(pitch) as u64),
            // SAFETY: forwarding the caller's own arguments to the real function (or
            // writing through out-pointers the real call has just validated).
            |p| unsafe { free(p as u32); },
        )
    }
}

/// Credits a pointer and the pitch surcharge that may ride along with it.
fn pointer_freed(pointer: u64, result: CUresult) -> CUresult {
    let result = freed(AllocKey::Pointer(pointer), result);
    if result == CUDA_SUCCESS
        && let Ok(Some(enforcer)) = enforcer()
    {
        enforcer.forget(AllocKey::Pointer(pointer ^ (1 << 63)));
    }
    result
}

hook! {
    fn cuMemFree_v2(pointer: CUdeviceptr) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function (or
        // writing through out-pointers the real call has just validated).
        pointer_freed(pointer, unsafe { real(pointer) })
    }
}

hook! {
    fn cuMemFree(pointer: u32) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function (or
        // writing through out-pointers the real call has just validated).
        pointer_freed(pointer as u64, unsafe { real(pointer) })
    }
}

// --- stream-ordered allocation ---------------------------------------------------

hook! {
    fn cuMemAllocAsync(pointer: *mut CUdeviceptr, bytes: usize, stream: CUstream) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function (or
        // writing through out-pointers the real call has just validated).
        counted(bytes as u64, Target::Current, || unsafe { real(pointer, bytes, stream) }, || AllocKey::Pointer(read(pointer)))
    }
}

hook! {
    fn cuMemAllocAsync_ptsz(pointer: *mut CUdeviceptr, bytes: usize, stream: CUstream) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function (or
        // writing through out-pointers the real call has just validated).
        counted(bytes as u64, Target::Current, || unsafe { real(pointer, bytes, stream) }, || AllocKey::Pointer(read(pointer)))
    }
}

hook! {
    fn cuMemAllocFromPoolAsync(pointer: *mut CUdeviceptr, bytes: usize, pool: CUmemoryPool, stream: CUstream) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function (or
        // writing through out-pointers the real call has just validated).
        counted(bytes as u64, Target::Current, || unsafe { real(pointer, bytes, pool, stream) }, || AllocKey::Pointer(read(pointer)))
    }
}

hook! {
    fn cuMemAllocFromPoolAsync_ptsz(pointer: *mut CUdeviceptr, bytes: usize, pool: CUmemoryPool, stream: CUstream) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function (or
        // writing through out-pointers the real call has just validated).
        counted(bytes as u64, Target::Current, || unsafe { real(pointer, bytes, pool, stream) }, || AllocKey::Pointer(read(pointer)))
    }
}

hook! {
    fn cuMemFreeAsync(pointer: CUdeviceptr, stream: CUstream) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function (or
        // writing through out-pointers the real call has just validated).
        pointer_freed(pointer, unsafe { real(pointer, stream) })
    }
}

hook! {
    fn cuMemFreeAsync_ptsz(pointer: CUdeviceptr, stream: CUstream) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function (or
        // writing through out-pointers the real call has just validated).
        pointer_freed(pointer, unsafe { real(pointer, stream) })
    }
}

// --- arrays ----------------------------------------------------------------------

/// Bytes of an array level as `cuda.h`'s formats store it; an unknown format is
/// charged as four 4-byte channels per texel, the largest basic element, so a format
/// newer than this table is never under-counted by much.
fn array_bytes(format: u32, channels: u32, extent: [u64; 3]) -> u64 {
    let [width, height, depth] = extent;
    array_level_bytes(format, channels, width, height, depth).unwrap_or_else(|| {
        [width, height, depth]
            .iter()
            .fold(16u64, |bytes, &side| bytes.saturating_mul(side.max(1)))
    })
}

/// Reads a descriptor the caller passed, or `None` for a null pointer.
fn descriptor<T>(pointer: *const T) -> Option<&'static T> {
    // SAFETY: a non-null descriptor pointer is the caller's valid input, read before the
    // real call as the driver itself does.
    unsafe { pointer.as_ref() }
}

fn array_key(handle: *const CUarray) -> AllocKey {
    AllocKey::Array(read(handle as *const usize))
}

hook! {
    fn cuArrayCreate_v2(handle: *mut CUarray, desc: *const CudaArrayDescriptor) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function (or
        // writing through out-pointers the real call has just validated).
        let Some(d) = descriptor(desc) else { return unsafe { real(handle, desc) } };
        let bytes = array_bytes(d.format, d.num_channels, [d.width as u64, d.height as u64, 1]);
        // SAFETY: forwarding the caller's own arguments to the real function (or
        // writing through out-pointers the real call has just validated).
        counted(bytes, Target::Current, || unsafe { real(handle, desc) }, || array_key(handle))
    }
}

hook! {
    fn cuArrayCreate(handle: *mut CUarray, desc: *const c_void) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function (or
        // writing through out-pointers the real call has just validated).
        let Some(d) = descriptor(desc as *const CudaArrayDescriptorV1) else { return unsafe { real(handle, desc) } };
        let bytes = array_bytes(d.format, d.num_channels, [d.width as u64, d.height as u64, 1]);
        // SAFETY: forwarding the caller's own arguments to the real function (or
        // writing through out-pointers the real call has just validated).
        counted(bytes, Target::Current, || unsafe { real(handle, desc) }, || array_key(handle))
    }
}

hook! {
    fn cuArray3DCreate_v2(handle: *mut CUarray, desc: *const CudaArray3dDescriptor) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function (or
        // writing through out-pointers the real call has just validated).
        let Some(d) = descriptor(desc) else { return unsafe { real(handle, desc) } };
        let bytes = array_bytes(d.format, d.num_channels, [d.width as u64, d.height as u64, d.depth as u64]);
        // SAFETY: forwarding the caller's own arguments to the real function (or
        // writing through out-pointers the real call has just validated).
        counted(bytes, Target::Current, || unsafe { real(handle, desc) }, || array_key(handle))
    }
}

hook! {
    fn cuArray3DCreate(handle: *mut CUarray, desc: *const c_void) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function (or
        // writing through out-pointers the real call has just validated).
        let Some(d) = descriptor(desc as *const CudaArray3dDescriptorV1) else { return unsafe { real(handle, desc) } };
        let bytes = array_bytes(d.format, d.num_channels, [d.width as u64, d.height as u64, d.depth as u64]);
        // SAFETY: forwarding the caller's own arguments to the real function (or
        // writing through out-pointers the real call has just validated).
        counted(bytes, Target::Current, || unsafe { real(handle, desc) }, || array_key(handle))
    }
}

hook! {
    fn cuArrayDestroy(handle: CUarray) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function (or
        // writing through out-pointers the real call has just validated).
        freed(AllocKey::Array(handle as usize), unsafe { real(handle) })
    }
}

hook! {
    fn cuMipmappedArrayCreate(handle: *mut CUmipmappedArray, desc: *const CudaArray3dDescriptor, levels: u32) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function (or
        // writing through out-pointers the real call has just validated).
        let Some(d) = descriptor(desc) else { return unsafe { real(handle, desc, levels) } };
        let bytes = (0..levels.clamp(1, 64)).fold(0u64, |sum, level| {
            let side = |n: usize| ((n as u64) >> level).max(1);
            let depth = if d.depth == 0 { 1 } else { side(d.depth) };
            sum.saturating_add(array_bytes(d.format, d.num_channels, [side(d.width), if d.height == 0 { 1 } else { side(d.height) }, depth]))
        });
        // SAFETY: forwarding the caller's own arguments to the real function (or
        // writing through out-pointers the real call has just validated).
        counted(bytes, Target::Current, || unsafe { real(handle, desc, levels) }, || AllocKey::Array(read(handle as *const usize)))
    }
}

hook! {
    fn cuMipmappedArrayDestroy(handle: CUmipmappedArray) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function (or
        // writing through out-pointers the real call has just validated).
        freed(AllocKey::Array(handle as usize), unsafe { real(handle) })
    }
}

// --- virtual memory management ---------------------------------------------------

hook! {
    /// Physical memory is created here (cuMemMap only maps it), so this is where
    /// PyTorch's expandable segments and NCCL are counted.
    fn cuMemCreate(handle: *mut CUmemGenericAllocationHandle, bytes: usize, prop: *const CUmemAllocationProp, flags: u64) -> CUresult |real| {
        let target = match descriptor(prop) {
            Some(p) if p.location_type == CU_MEM_LOCATION_TYPE_DEVICE => Target::Device(p.location_id),
            // Host-located (or unknown) allocations do not take device memory.
            // SAFETY: forwarding the caller's own arguments to the real function (or
            // writing through out-pointers the real call has just validated).
            _ => return unsafe { real(handle, bytes, prop, flags) },
        };
        // SAFETY: forwarding the caller's own arguments to the real function (or
        // writing through out-pointers the real call has just validated).
        counted(bytes as u64, target, || unsafe { real(handle, bytes, prop, flags) }, || AllocKey::Physical(read(handle)))
    }
}

hook! {
    fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function (or
        // writing through out-pointers the real call has just validated).
        freed(AllocKey::Physical(handle), unsafe { real(handle) })
    }
}

// --- what the container is told ----------------------------------------------------

/// free = quota − used (never more than the card really has free), total = quota.
fn memory_info(
    real_info: impl FnOnce(&mut u64, &mut u64) -> CUresult,
) -> Result<(u64, u64), CUresult> {
    let (mut real_free, mut real_total) = (0u64, 0u64);
    let result = real_info(&mut real_free, &mut real_total);
    if result != CUDA_SUCCESS {
        return Err(result);
    }
    match enforcer()? {
        None => Ok((real_free, real_total)),
        Some(enforcer) => {
            let device = enforcer.current()?;
            let free = device
                .memory_limit
                .saturating_sub(enforcer.used(device))
                .min(real_free);
            Ok((free, device.memory_limit))
        }
    }
}

hook! {
    fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult |real| {
        if free.is_null() || total.is_null() {
            // SAFETY: forwarding the caller's own arguments to the real function (or
            // writing through out-pointers the real call has just validated).
            return unsafe { real(free, total) };
        }
        let answer = memory_info(|f, t| {
            let (mut rf, mut rt) = (0usize, 0usize);
            // SAFETY: forwarding the caller's own arguments to the real function (or
            // writing through out-pointers the real call has just validated).
            let result = unsafe { real(&mut rf, &mut rt) };
            (*f, *t) = (rf as u64, rt as u64);
            result
        });
        match answer {
            Ok((f, t)) => {
                // SAFETY: both checked non-null above.
                unsafe { (*free, *total) = (f as usize, t as usize) };
                CUDA_SUCCESS
            }
            Err(error) => error,
        }
    }
}

hook! {
    fn cuMemGetInfo(free: *mut u32, total: *mut u32) -> CUresult |real| {
        if free.is_null() || total.is_null() {
            // SAFETY: forwarding the caller's own arguments to the real function (or
            // writing through out-pointers the real call has just validated).
            return unsafe { real(free, total) };
        }
        let answer = memory_info(|f, t| {
            let (mut rf, mut rt) = (0u32, 0u32);
            // SAFETY: forwarding the caller's own arguments to the real function (or
            // writing through out-pointers the real call has just validated).
            let result = unsafe { real(&mut rf, &mut rt) };
            (*f, *t) = (rf as u64, rt as u64);
            result
        });
        match answer {
            Ok((f, t)) => {
                // SAFETY: both checked non-null above.
                unsafe { (*free, *total) = (f.min(u32::MAX as u64) as u32, t.min(u32::MAX as u64) as u32) };
                CUDA_SUCCESS
            }
            Err(error) => error,
        }
    }
}
