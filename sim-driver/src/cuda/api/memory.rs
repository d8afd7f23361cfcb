//! Device memory: `cuMemAlloc*`, `cuMemFree*`, `cuMemGetInfo*`, address ranges and pointer
//! attributes (as in the shim's `hooks/memory.rs`; arrays, which the shim hooks there
//! too, are in `arrays`, copies and sets in `copies`).

use std::ffi::c_void;

use super::support::{Res, cuda, out, require_current};
use crate::cuda::errors::*;
use crate::cuda::registry::*;
use crate::cuda::with_registry;

fn allocate_current(size: u64, kind: AllocKind) -> Result<u64, CUresult> {
    let ctx = require_current()?;
    with_registry(|registry| registry.allocate(ctx, size, kind))
}

fn mem_info() -> Result<(u64, u64), CUresult> {
    let ctx = require_current()?;
    with_registry(|registry| {
        let device = registry.context(ctx)?.device;
        registry.sim.state.reclaim_dead();
        let total = registry.capacity(device);
        Ok((
            total.saturating_sub(registry.sim.state.gpu_used(device)),
            total,
        ))
    })
}

fn address_range(ptr: u64) -> Result<(u64, u64), CUresult> {
    with_registry(|registry| {
        registry
            .find(ptr)
            .map(|(base, a)| (base, a.size))
            .ok_or(CUDA_ERROR_NOT_FOUND)
    })
}

const CU_MEMORYTYPE_DEVICE: u32 = 2;

fn pointer_attribute(data: *mut c_void, attribute: i32, ptr: u64) -> Res {
    if data.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (base, allocation, access) = with_registry(|registry| {
        let (base, allocation) = registry.find(ptr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let access = match allocation.kind {
            AllocKind::Mapped { .. } => 3u32,
            _ => 3,
        };
        Ok((base, allocation, access))
    })?;
    let ctx = match allocation.kind {
        AllocKind::Mapped { .. } | AllocKind::Pool(_) => 0,
        _ => allocation.ctx,
    };
    match attribute {
        1 => out(data.cast::<u64>(), ctx),
        2 => out(data.cast::<u32>(), CU_MEMORYTYPE_DEVICE),
        3 => out(data.cast::<u64>(), ptr),
        4 => Err(CUDA_ERROR_INVALID_VALUE),
        6 => out(data.cast::<u8>(), 0),
        7 => out(data.cast::<u64>(), allocation.buffer_id),
        8 => out(
            data.cast::<u8>(),
            u8::from(allocation.kind == AllocKind::Managed),
        ),
        9 => out(data.cast::<i32>(), allocation.device as i32),
        10 => out(
            data.cast::<u8>(),
            u8::from(matches!(
                allocation.kind,
                AllocKind::Device | AllocKind::Low
            )),
        ),
        11 => out(data.cast::<u64>(), base),
        12 => out(data.cast::<usize>(), allocation.size as usize),
        13 => out(data.cast::<u8>(), 1),
        14 => out(data.cast::<u64>(), 0),
        15 => out(data.cast::<u8>(), 1),
        16 => out(data.cast::<u32>(), access),
        17 => out(
            data.cast::<u64>(),
            match allocation.kind {
                AllocKind::Pool(pool) => pool,
                _ => 0,
            },
        ),
        18 => out(data.cast::<usize>(), allocation.size as usize),
        19 => out(data.cast::<u64>(), base),
        20 => out(data.cast::<u64>(), allocation.buffer_id),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

cuda! {
    fn cuMemAlloc(dptr: *mut u32, bytesize: u32) {
        if dptr.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let ptr = allocate_current(bytesize as u64, AllocKind::Low)?;
        out(dptr, ptr as u32)
    }

    fn cuMemAlloc_v2(dptr: *mut u64, bytesize: usize) {
        if dptr.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let ptr = allocate_current(bytesize as u64, AllocKind::Device)?;
        out(dptr, ptr)
    }

    fn cuMemAllocManaged(dptr: *mut u64, bytesize: usize, flags: u32) {
        // CU_MEM_ATTACH_GLOBAL = 1, CU_MEM_ATTACH_HOST = 2: exactly one.
        if dptr.is_null() || !(flags == 1 || flags == 2) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let ptr = allocate_current(bytesize as u64, AllocKind::Managed)?;
        out(dptr, ptr)
    }

    fn cuMemAllocPitch(dptr: *mut u32, pitch: *mut u32, width: u32, height: u32, element_size: u32) {
        if dptr.is_null() || pitch.is_null() || !matches!(element_size, 4 | 8 | 16) || width == 0 || height == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let row = round_up(width as u64, 512).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let size = row.checked_mul(height as u64).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        let ptr = allocate_current(size, AllocKind::Low)?;
        out(dptr, ptr as u32)?;
        out(pitch, row as u32)
    }

    fn cuMemAllocPitch_v2(dptr: *mut u64, pitch: *mut usize, width: usize, height: usize, element_size: u32) {
        if dptr.is_null() || pitch.is_null() || !matches!(element_size, 4 | 8 | 16) || width == 0 || height == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let row = round_up(width as u64, 512).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let size = row.checked_mul(height as u64).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        let ptr = allocate_current(size, AllocKind::Device)?;
        out(dptr, ptr)?;
        out(pitch, row as usize)
    }

    fn cuMemFree(dptr: u32) {
        if dptr == 0 {
            return Ok(());
        }
        require_current()?;
        with_registry(|registry| registry.free(dptr as u64))
    }

    fn cuMemFree_v2(dptr: u64) {
        if dptr == 0 {
            return Ok(());
        }
        require_current()?;
        with_registry(|registry| registry.free(dptr))
    }

    fn cuMemGetInfo(free: *mut u32, total: *mut u32) {
        let (f, t) = mem_info()?;
        out(free, f.min(u32::MAX as u64) as u32)?;
        out(total, t.min(u32::MAX as u64) as u32)
    }

    fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) {
        let (f, t) = mem_info()?;
        out(free, f as usize)?;
        out(total, t as usize)
    }

    fn cuMemGetAddressRange(base: *mut u32, size: *mut u32, dptr: u32) {
        let (b, s) = address_range(dptr as u64)?;
        if !base.is_null() {
            out(base, b as u32)?;
        }
        if !size.is_null() {
            out(size, s as u32)?;
        }
        Ok(())
    }

    fn cuMemGetAddressRange_v2(base: *mut u64, size: *mut usize, dptr: u64) {
        let (b, s) = address_range(dptr)?;
        if !base.is_null() {
            out(base, b)?;
        }
        if !size.is_null() {
            out(size, s as usize)?;
        }
        Ok(())
    }

    fn cuPointerGetAttribute(data: *mut c_void, attribute: i32, ptr: u64) { pointer_attribute(data, attribute, ptr) }
}
