//! The single-allocation hooks (`cuMemAlloc*`, pitched, managed, arrays) and what
//! `cuMemGetInfo` tells the container. Each allocation goes `Enforcer::begin` (the
//! reservation), the real call, `Enforcer::finish` (recorded in the ledger, or given
//! back); each free credits back exactly what was recorded. VMM handles are in `vmm`, pools and
//! stream-ordered allocation in `pool`.

use std::ffi::c_void;

use crate::allocating::{RealPools, Reservation};
use crate::cuda::*;
use crate::devices::LandsOn;
use crate::ffi::{read_descriptor, read_out, write_out};
use crate::ledger::Ticket;
use crate::ledger::allocations::{AllocKey, charged_size};
use crate::state::{Enforcer, after_success, enforce, enforcing};
use crate::{hook, real};

/// The calling thread's current context, as the driver says.
pub(crate) fn current_context() -> usize {
    let get_current = real!(cuCtxGetCurrent as fn(*mut CUcontext) -> CUresult);
    let mut context: CUcontext = std::ptr::null_mut();
    // SAFETY: our own out-pointer, to the real cuCtxGetCurrent.
    unsafe { get_current(&mut context) };
    context as usize
}

/// Reserve `bytes` (as charged), run `allocate`, and on success record the allocation
/// under the key that `key` reads back from the call's out-parameter.
fn counted(
    bytes: u64,
    lands_on: LandsOn,
    allocate: impl FnOnce() -> CUresult + Copy,
    key: impl FnOnce() -> AllocKey,
) -> CUresult {
    charged(
        charged_size(bytes),
        lands_on,
        allocate,
        |enforcer, ticket| enforcer.ledger().record(key(), ticket, current_context()),
    )
}

/// Under the quota, reserve `charge` bytes (the ledger's [`Enforcer::begin`]), run
/// `allocate`, and on success hand the ticket the ledger returns to `commit` (which
/// remembers what will credit it back); otherwise just `allocate` (or fail closed).
pub(crate) fn charged(
    charge: u64,
    lands_on: LandsOn,
    allocate: impl FnOnce() -> CUresult + Copy,
    commit: impl FnOnce(&'static Enforcer, Ticket),
) -> CUresult {
    enforce(allocate, |enforcer| {
        let reservation = match enforcer.begin(&lands_on, charge) {
            Reservation::Refused(error) => return error,
            reservation => reservation,
        };
        let result = allocate();
        if let Some(ticket) = enforcer.finish(reservation, &lands_on, result) {
            commit(enforcer, ticket);
        }
        result
    })
}

/// Credits the allocation under `key` once the real free succeeded.
fn freed(key: AllocKey, result: CUresult) -> CUresult {
    after_success(result, |enforcer| enforcer.ledger().forget(key))
}

/// After a call that synchronises (a synchronous free, a stream, event or context
/// synchronisation), the driver may have released pool memory: settle the pools.
pub(crate) fn synchronized(result: CUresult) -> CUresult {
    after_success(result, |enforcer| {
        enforcer.ledger().settle_pools(None, &RealPools)
    })
}

/// The device pointer a successful allocation wrote (0 for a null out-pointer).
fn allocated(pointer: *const CUdeviceptr) -> u64 {
    read_out(pointer).unwrap_or(0)
}

hook! {
    fn cuMemAlloc_v2(pointer: *mut CUdeviceptr, bytes: usize) -> CUresult |forward| {
        counted(bytes as u64, LandsOn::Current, forward, || AllocKey::Pointer(allocated(pointer)))
    }
}

hook! {
    /// The pre-3.2 ABI (32-bit pointers and sizes).
    fn cuMemAlloc(pointer: *mut u32, bytes: u32) -> CUresult |forward| {
        counted(bytes as u64, LandsOn::Current, forward, || AllocKey::Pointer(read_out(pointer).unwrap_or(0) as u64))
    }
}

hook! {
    fn cuMemAllocManaged(pointer: *mut CUdeviceptr, bytes: usize, flags: u32) -> CUresult |forward| {
        counted(bytes as u64, LandsOn::Current, forward, || AllocKey::Pointer(allocated(pointer)))
    }
}

/// Pitched allocations: the pitch is only known afterwards, so reserve the smallest
/// possible footprint, then settle the difference (freeing if the quota cannot take it).
fn pitched(
    width: u64,
    height: u64,
    allocate: impl FnOnce() -> CUresult + Copy,
    result_of: impl Fn() -> (u64, u64),
    free: impl FnOnce(u64),
) -> CUresult {
    let result = counted(
        width.saturating_mul(height),
        LandsOn::Current,
        allocate,
        || AllocKey::Pointer(result_of().0),
    );
    if result != CUDA_SUCCESS {
        return result;
    }
    let Some(enforcer) = enforcing() else {
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
            enforcer.ledger().record(
                AllocKey::pitch_surcharge(pointer),
                ticket,
                current_context(),
            );
            result
        }
        Err(error) => {
            free(pointer);
            enforcer.ledger().forget(AllocKey::Pointer(pointer));
            error
        }
    }
}

hook! {
    fn cuMemAllocPitch_v2(pointer: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, element_bytes: u32) -> CUresult |forward| {
        let free = real!(cuMemFree_v2 as fn(CUdeviceptr) -> CUresult);
        pitched(
            width as u64,
            height as u64,
            forward,
            || (allocated(pointer), read_out(pitch).unwrap_or(0) as u64),
            // SAFETY: freeing the allocation the real call just made (the quota cannot
            // take its pitch), with the real cuMemFree_v2.
            |p| unsafe { free(p); },
        )
    }
}

hook! {
    fn cuMemAllocPitch(pointer: *mut u32, pitch: *mut u32, width: u32, height: u32, element_bytes: u32) -> CUresult |forward| {
        let free = real!(cuMemFree as fn(u32) -> CUresult);
        pitched(
            width as u64,
            height as u64,
            forward,
            || (read_out(pointer).unwrap_or(0) as u64, read_out(pitch).unwrap_or(0) as u64),
            // SAFETY: freeing the allocation the real call just made (a 32-bit pointer,
            // as it was handed out), with the real cuMemFree.
            |p| unsafe { free(p as u32); },
        )
    }
}

/// Credits a pointer and the pitch surcharge that may ride along with it. (A pointer
/// from a pool credits nothing: the pool keeps the memory reserved.)
pub(crate) fn pointer_freed(pointer: u64, result: CUresult) -> CUresult {
    after_success(result, |enforcer| {
        let ledger = enforcer.ledger();
        ledger.forget(AllocKey::Pointer(pointer));
        ledger.forget(AllocKey::pitch_surcharge(pointer));
    })
}

hook! {
    fn cuMemFree_v2(pointer: CUdeviceptr) -> CUresult |forward| {
        synchronized(pointer_freed(pointer, forward()))
    }
}

hook! {
    fn cuMemFree(pointer: u32) -> CUresult |forward| {
        synchronized(pointer_freed(pointer as u64, forward()))
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
    allocate: impl FnOnce() -> CUresult + Copy,
    handle: *const usize,
) -> CUresult {
    charged(charge, LandsOn::Current, allocate, |enforcer, ticket| {
        enforcer.ledger().record(
            AllocKey::Array(read_out(handle).unwrap_or(0)),
            ticket,
            current_context(),
        )
    })
}

hook! {
    fn cuArrayCreate_v2(handle: *mut CUarray, desc: *const CudaArrayDescriptor) -> CUresult |forward| {
        let Some(d) = read_descriptor(desc) else { return forward() };
        let charge = array_charge(d.format, d.num_channels, [d.width as u64, d.height as u64, 0], 0, 1);
        array_counted(charge, forward, handle.cast())
    }
}

hook! {
    fn cuArrayCreate(handle: *mut CUarray, desc: *const c_void) -> CUresult |forward| {
        let Some(d) = read_descriptor(desc.cast::<CudaArrayDescriptorV1>()) else { return forward() };
        let charge = array_charge(d.format, d.num_channels, [d.width as u64, d.height as u64, 0], 0, 1);
        array_counted(charge, forward, handle.cast())
    }
}

hook! {
    fn cuArray3DCreate_v2(handle: *mut CUarray, desc: *const CudaArray3dDescriptor) -> CUresult |forward| {
        let Some(d) = read_descriptor(desc) else { return forward() };
        let charge = array_charge(d.format, d.num_channels, [d.width as u64, d.height as u64, d.depth as u64], d.flags, 1);
        array_counted(charge, forward, handle.cast())
    }
}

hook! {
    fn cuArray3DCreate(handle: *mut CUarray, desc: *const c_void) -> CUresult |forward| {
        let Some(d) = read_descriptor(desc.cast::<CudaArray3dDescriptorV1>()) else { return forward() };
        let charge = array_charge(d.format, d.num_channels, [d.width as u64, d.height as u64, d.depth as u64], d.flags, 1);
        array_counted(charge, forward, handle.cast())
    }
}

hook! {
    fn cuArrayDestroy(handle: CUarray) -> CUresult |forward| {
        freed(AllocKey::Array(handle as usize), forward())
    }
}

hook! {
    fn cuMipmappedArrayCreate(handle: *mut CUmipmappedArray, desc: *const CudaArray3dDescriptor, levels: u32) -> CUresult |forward| {
        let Some(d) = read_descriptor(desc) else { return forward() };
        let charge = array_charge(d.format, d.num_channels, [d.width as u64, d.height as u64, d.depth as u64], d.flags, levels);
        array_counted(charge, forward, handle.cast())
    }
}

hook! {
    fn cuMipmappedArrayDestroy(handle: CUmipmappedArray) -> CUresult |forward| {
        freed(AllocKey::Array(handle as usize), forward())
    }
}

// --- what the container is told ----------------------------------------------------

/// free = quota − used (never more than the card really has free), total = quota;
/// `driver_info` is the real call's (free, total).
fn memory_info(
    driver_info: impl FnOnce() -> Result<(u64, u64), CUresult>,
) -> Result<(u64, u64), CUresult> {
    let (card_free, card_total) = driver_info()?;
    enforce(
        || Ok((card_free, card_total)),
        |enforcer| {
            let device = enforcer.current()?;
            let free = device
                .memory_limit
                .saturating_sub(enforcer.used(device))
                .min(card_free);
            Ok((free, device.memory_limit))
        },
    )
}

hook! {
    fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult |forward, real| {
        if free.is_null() || total.is_null() {
            return forward();
        }
        let answer = memory_info(|| {
            let (mut card_free, mut card_total) = (0usize, 0usize);
            // SAFETY: our own out-pointers, to the real cuMemGetInfo_v2.
            match unsafe { real(&mut card_free, &mut card_total) } {
                CUDA_SUCCESS => Ok((card_free as u64, card_total as u64)),
                error => Err(error),
            }
        });
        match answer {
            Ok((f, t)) => {
                write_out(free, f as usize);
                write_out(total, t as usize);
                CUDA_SUCCESS
            }
            Err(error) => error,
        }
    }
}

hook! {
    fn cuMemGetInfo(free: *mut u32, total: *mut u32) -> CUresult |forward, real| {
        if free.is_null() || total.is_null() {
            return forward();
        }
        let answer = memory_info(|| {
            let (mut card_free, mut card_total) = (0u32, 0u32);
            // SAFETY: our own out-pointers, to the real cuMemGetInfo.
            match unsafe { real(&mut card_free, &mut card_total) } {
                CUDA_SUCCESS => Ok((card_free as u64, card_total as u64)),
                error => Err(error),
            }
        });
        match answer {
            Ok((f, t)) => {
                write_out(free, f.min(u32::MAX as u64) as u32);
                write_out(total, t.min(u32::MAX as u64) as u32);
                CUDA_SUCCESS
            }
            Err(error) => error,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

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
