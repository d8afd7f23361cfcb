//! The single-allocation paths (`cuMemAlloc*`, pitched, managed, arrays), counted
//! against the container's quota in the shared usage region, every free credited back
//! exactly, and what `cuMemGetInfo` tells the container. VMM handles are in `vmm`, pools
//! and stream-ordered allocation in `pool`.
//!
//! The order is always: reserve in the region (refusing with CUDA_ERROR_OUT_OF_MEMORY
//! and allocating nothing when the quota would be passed), call the real allocator,
//! then record the allocation, or give the reservation back if the driver failed.

use std::ffi::c_void;

use crate::cuda::*;
use crate::hook;
use crate::state::{AllocKey, Enforcer, Ticket, Visible, charged_size, enforcer, real};

/// Which device an allocation lands on.
pub(crate) enum Target {
    /// The calling thread's current context.
    Current,
    /// A device named by the call (VMM location).
    Device(CUdevice),
}

pub(crate) fn current_context() -> usize {
    let get_current = real!(cuCtxGetCurrent as fn(*mut CUcontext) -> CUresult);
    let mut context: CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    unsafe { get_current(&mut context) };
    context as usize
}

pub(crate) fn resolve<'a>(
    enforcer: &'a Enforcer,
    target: &Target,
) -> Result<&'a Visible, CUresult> {
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

/// Reserve `bytes` (as charged), run `allocate`, and on success record the allocation
/// under the key that `key` reads back from the call's out-parameter.
fn counted(
    bytes: u64,
    target: Target,
    allocate: impl FnOnce() -> CUresult,
    key: impl FnOnce() -> AllocKey,
) -> CUresult {
    charged(charged_size(bytes), target, allocate, |enforcer, ticket| {
        enforcer.record(key(), ticket, current_context())
    })
}

/// Reserve `charge` bytes, run `allocate`, and on success hand the reservation to
/// `commit` (which remembers what will credit it back).
pub(crate) fn charged(
    charge: u64,
    target: Target,
    allocate: impl FnOnce() -> CUresult,
    commit: impl FnOnce(&Enforcer, Ticket),
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
                enforcer.region.add_used(slot, device.region_index, charge);
                commit(enforcer, enforcer.ticket(slot, device, charge));
            }
            return result;
        }
    };
    let ticket = match enforcer.reserve(device, charge) {
        Ok(ticket) => ticket,
        Err(error) => return error,
    };
    let result = allocate();
    if result == CUDA_SUCCESS {
        commit(enforcer, ticket);
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
pub(crate) fn read<T: Copy + Default>(out: *const T) -> T {
    if out.is_null() {
        T::default()
    } else {
        // SAFETY: only called after the driver succeeded, so it wrote `out`.
        unsafe { *out }
    }
}

/// After a call that synchronises (a synchronous free, a stream, event or context
/// synchronisation), the driver may have released pool memory: settle the pools.
pub(crate) fn synchronized(result: CUresult) -> CUresult {
    if result == CUDA_SUCCESS
        && let Ok(Some(enforcer)) = enforcer()
    {
        enforcer.synchronized();
    }
    result
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

/// Credits a pointer and the pitch surcharge that may ride along with it. (A pointer
/// from a pool credits nothing: the pool keeps the memory reserved.)
pub(crate) fn pointer_freed(pointer: u64, result: CUresult) -> CUresult {
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
        let result = pointer_freed(pointer, unsafe { real(pointer) });
        synchronized(result)
    }
}

hook! {
    fn cuMemFree(pointer: u32) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function (or
        // writing through out-pointers the real call has just validated).
        let result = pointer_freed(pointer as u64, unsafe { real(pointer) });
        synchronized(result)
    }
}

// --- arrays ----------------------------------------------------------------------

/// What an array takes, charged as the driver spends it (2 MiB units): its texels as
/// `cuda.h`'s formats store them, over every mip level (layers and cubemap faces kept at
/// each level). An unknown format is charged as four 4-byte channels per texel, the
/// largest basic element, so a format newer than the table is never under-counted by
/// much.
pub(crate) fn array_charge(
    format: u32,
    channels: u32,
    extent: [u64; 3],
    flags: u32,
    levels: u32,
) -> u64 {
    let texels = array_bytes(format, channels, extent, flags, levels).unwrap_or_else(|| {
        array_bytes(array_format::FLOAT, 4, extent, flags, levels).unwrap_or(u64::MAX)
    });
    texels
        .div_ceil(ARRAY_CHARGE_GRANULARITY)
        .saturating_mul(ARRAY_CHARGE_GRANULARITY)
}

/// Reserve what an array takes, run `allocate`, and key it by the handle it returns.
fn array_counted(
    charge: u64,
    allocate: impl FnOnce() -> CUresult,
    handle: *const usize,
) -> CUresult {
    charged(charge, Target::Current, allocate, |enforcer, ticket| {
        enforcer.record(AllocKey::Array(read(handle)), ticket, current_context())
    })
}

/// Reads a descriptor the caller passed, or `None` for a null pointer.
pub(crate) fn descriptor<T>(pointer: *const T) -> Option<&'static T> {
    // SAFETY: a non-null descriptor pointer is the caller's valid input, read before the
    // real call as the driver itself does.
    unsafe { pointer.as_ref() }
}

hook! {
    fn cuArrayCreate_v2(handle: *mut CUarray, desc: *const CudaArrayDescriptor) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function.
        let Some(d) = descriptor(desc) else { return unsafe { real(handle, desc) } };
        let charge = array_charge(d.format, d.num_channels, [d.width as u64, d.height as u64, 0], 0, 1);
        // SAFETY: forwarding the caller's own arguments to the real function.
        array_counted(charge, || unsafe { real(handle, desc) }, handle.cast())
    }
}

hook! {
    fn cuArrayCreate(handle: *mut CUarray, desc: *const c_void) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function.
        let Some(d) = descriptor(desc as *const CudaArrayDescriptorV1) else { return unsafe { real(handle, desc) } };
        let charge = array_charge(d.format, d.num_channels, [d.width as u64, d.height as u64, 0], 0, 1);
        // SAFETY: forwarding the caller's own arguments to the real function.
        array_counted(charge, || unsafe { real(handle, desc) }, handle.cast())
    }
}

hook! {
    fn cuArray3DCreate_v2(handle: *mut CUarray, desc: *const CudaArray3dDescriptor) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function.
        let Some(d) = descriptor(desc) else { return unsafe { real(handle, desc) } };
        let charge = array_charge(d.format, d.num_channels, [d.width as u64, d.height as u64, d.depth as u64], d.flags, 1);
        // SAFETY: forwarding the caller's own arguments to the real function.
        array_counted(charge, || unsafe { real(handle, desc) }, handle.cast())
    }
}

hook! {
    fn cuArray3DCreate(handle: *mut CUarray, desc: *const c_void) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function.
        let Some(d) = descriptor(desc as *const CudaArray3dDescriptorV1) else { return unsafe { real(handle, desc) } };
        let charge = array_charge(d.format, d.num_channels, [d.width as u64, d.height as u64, d.depth as u64], d.flags, 1);
        // SAFETY: forwarding the caller's own arguments to the real function.
        array_counted(charge, || unsafe { real(handle, desc) }, handle.cast())
    }
}

hook! {
    fn cuArrayDestroy(handle: CUarray) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function.
        freed(AllocKey::Array(handle as usize), unsafe { real(handle) })
    }
}

hook! {
    fn cuMipmappedArrayCreate(handle: *mut CUmipmappedArray, desc: *const CudaArray3dDescriptor, levels: u32) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function.
        let Some(d) = descriptor(desc) else { return unsafe { real(handle, desc, levels) } };
        let charge = array_charge(d.format, d.num_channels, [d.width as u64, d.height as u64, d.depth as u64], d.flags, levels);
        // SAFETY: forwarding the caller's own arguments to the real function.
        array_counted(charge, || unsafe { real(handle, desc, levels) }, handle.cast())
    }
}

hook! {
    fn cuMipmappedArrayDestroy(handle: CUmipmappedArray) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function.
        freed(AllocKey::Array(handle as usize), unsafe { real(handle) })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::pool_growth_bound;

    const MIB: u64 = 1 << 20;

    #[test]
    fn allocations_are_charged_as_the_driver_spends_them() {
        assert_eq!(charged_size(1), 512);
        assert_eq!(charged_size(513), 1024);
        assert_eq!(charged_size(MIB - 1), MIB);
        assert_eq!(charged_size(MIB), 2 * MIB, "from 1 MiB up: 2 MiB pages");
        assert_eq!(charged_size(3 * MIB), 4 * MIB);
        assert_eq!(charged_size(300 * MIB), 300 * MIB);
        assert_eq!(
            pool_growth_bound(5 * MIB),
            32 * MIB,
            "a pool grows by 32 MiB at least"
        );
        assert_eq!(pool_growth_bound(301 * MIB), 302 * MIB);
    }

    #[test]
    fn arrays_are_charged_in_2_mib_units_over_every_level() {
        use vgpu_abi::cuda::array_format::*;
        // 64×64 FLOAT×4 is 64 KiB of texels: 2 MiB, as measured on the H200.
        assert_eq!(array_charge(FLOAT, 4, [64, 64, 0], 0, 1), 2 * MIB);
        // 1024×1024×64 FLOAT, 3 levels: a layered array keeps its 64 layers per level
        // (336 MiB); a 3D one halves its depth (4 MiB × (64 + 8 + 1) / ... rounded).
        assert_eq!(
            array_charge(FLOAT, 1, [1024, 1024, 64], CUDA_ARRAY3D_LAYERED, 3),
            336 * MIB
        );
        let volume = ((1024 * 1024 * 64) + (512 * 512 * 32) + (256 * 256 * 16)) * 4;
        assert_eq!(
            array_charge(FLOAT, 1, [1024, 1024, 64], 0, 3),
            (volume as u64).div_ceil(2 * MIB) * 2 * MIB
        );
        // A cubemap: six faces at every level.
        assert_eq!(
            array_charge(UNSIGNED_INT8, 4, [1024, 1024, 6], CUDA_ARRAY3D_CUBEMAP, 2),
            30 * MIB
        );
        // 0x50 is UNORM_INT_101010_2 (4 bytes a texel whatever the channels), not 1 byte.
        assert_eq!(
            array_charge(UNORM_INT_101010_2, 1, [1024, 1024, 0], 0, 1),
            4 * MIB
        );
        // Block-compressed BC1: 8 bytes per 4×4 block.
        assert_eq!(array_charge(BC1_UNORM, 4, [4096, 4096, 0], 0, 1), 8 * MIB);
        // An unknown format: as FLOAT×4, never less.
        assert_eq!(array_charge(0x51, 1, [1024, 1024, 0], 0, 1), 16 * MIB);
        assert_eq!(
            array_charge(0x51, 1, [u64::MAX, 2, 0], 0, 1),
            u64::MAX,
            "an overflow refuses"
        );
    }
}
