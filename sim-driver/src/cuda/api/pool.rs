//! Stream-ordered allocation and memory pools (as in the shim's `hooks/pool.rs`; the
//! synchronisation points where pools release memory are in `context` and `streams`).

use std::ffi::c_void;

use super::support::{Res, cuda, device, out};
use super::vmm::{CU_MEM_ALLOCATION_TYPE_PINNED, CU_MEM_LOCATION_TYPE_DEVICE};
use crate::cuda::errors::*;
use crate::cuda::registry::*;
use crate::cuda::{current_context, with_registry};
use crate::ffi::read_in;

/// `CUmemPoolProps`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemPoolProps {
    pub alloc_type: i32,
    pub handle_types: i32,
    pub location_type: i32,
    pub location_id: i32,
    pub win32_security_attributes: *mut c_void,
    pub max_size: usize,
    pub usage: u16,
    pub reserved: [u8; 54],
}
const _: () = assert!(std::mem::size_of::<MemPoolProps>() == 88);

fn alloc_async(
    dptr: *mut u64,
    size: usize,
    pool: Option<u64>,
    stream: u64,
    per_thread: bool,
) -> Res {
    if dptr.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let current = current_context();
    let ptr = with_registry(|registry| {
        let (key, ctx) = registry.stream_key(stream, per_thread, current)?;
        let device = registry.context(ctx)?.device;
        let pool = match pool {
            Some(pool) => {
                if !registry.pools.contains_key(&pool) {
                    return Err(CUDA_ERROR_INVALID_VALUE);
                }
                pool
            }
            None => registry.current_pools[device],
        };
        let ptr = registry.pool_allocate(pool, ctx, size as u64)?;
        registry.enqueue(key, 0);
        Ok(ptr)
    })?;
    out(dptr, ptr)
}

fn free_async(dptr: u64, stream: u64, per_thread: bool) -> Res {
    let current = current_context();
    with_registry(|registry| {
        let (key, _) = registry.stream_key(stream, per_thread, current)?;
        match registry.allocations.get(&dptr) {
            Some(a) if matches!(a.kind, AllocKind::Pool(_)) => {}
            Some(_) => {}
            None => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        registry.free(dptr)?;
        registry.enqueue(key, 0);
        Ok(())
    })
}

const CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES: i32 = 1;
const CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: i32 = 3;
const CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: i32 = 4;
const CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: i32 = 5;
const CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: i32 = 6;
const CU_MEMPOOL_ATTR_USED_MEM_CURRENT: i32 = 7;
const CU_MEMPOOL_ATTR_USED_MEM_HIGH: i32 = 8;

cuda! {
    fn cuDeviceGetDefaultMemPool(pool: *mut u64, dev: i32) {
        let (index, _) = device(dev)?;
        let handle = with_registry(|registry| Ok(registry.default_pools[index]))?;
        out(pool, handle)
    }

    fn cuDeviceGetMemPool(pool: *mut u64, dev: i32) {
        let (index, _) = device(dev)?;
        let handle = with_registry(|registry| Ok(registry.current_pools[index]))?;
        out(pool, handle)
    }

    fn cuDeviceSetMemPool(dev: i32, pool: u64) {
        let (index, _) = device(dev)?;
        with_registry(|registry| {
            match registry.pools.get(&pool) {
                Some(p) if p.device == index => {}
                _ => return Err(CUDA_ERROR_INVALID_VALUE),
            }
            registry.current_pools[index] = pool;
            Ok(())
        })
    }

    fn cuMemPoolCreate(pool: *mut u64, props: *const MemPoolProps) {
        let p = read_in(props).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if pool.is_null() || p.alloc_type != CU_MEM_ALLOCATION_TYPE_PINNED || p.location_type != CU_MEM_LOCATION_TYPE_DEVICE {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (index, _) = device(p.location_id)?;
        let handle = with_registry(|registry| {
            let handle = registry.handle(TAG_POOL);
            let mut created = Pool::new(index, false);
            created.max_size = p.max_size as u64;
            registry.pools.insert(handle, created);
            Ok(handle)
        })?;
        out(pool, handle)
    }

    /// Destroying a pool frees what is still allocated from it and returns its reservation.
    fn cuMemPoolDestroy(pool: u64) {
        with_registry(|registry| {
            match registry.pools.get(&pool) {
                Some(p) if !p.is_default => {}
                _ => return Err(CUDA_ERROR_INVALID_VALUE),
            }
            let owned: Vec<u64> = registry.allocations.iter().filter(|(_, a)| a.kind == AllocKind::Pool(pool)).map(|(p, _)| *p).collect();
            for ptr in owned {
                let _ = registry.free(ptr);
            }
            registry.pool_trim(pool, 0);
            if let Some(removed) = registry.pools.remove(&pool)
                && registry.current_pools[removed.device] == pool {
                    registry.current_pools[removed.device] = registry.default_pools[removed.device];
                }
            Ok(())
        })
    }

    fn cuMemPoolTrimTo(pool: u64, min_bytes_to_keep: usize) {
        with_registry(|registry| {
            if !registry.pools.contains_key(&pool) {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            registry.pool_trim(pool, min_bytes_to_keep as u64);
            Ok(())
        })
    }

    fn cuMemPoolSetAttribute(pool: u64, attribute: i32, value: *mut c_void) {
        if value.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        with_registry(|registry| {
            let p = registry.pools.get_mut(&pool).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            match attribute {
                CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES..=CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
                    p.reuse[(attribute - 1) as usize] = read_in(value.cast::<i32>()).ok_or(CUDA_ERROR_INVALID_VALUE)?;
                }
                CU_MEMPOOL_ATTR_RELEASE_THRESHOLD => p.release_threshold = read_in(value.cast::<u64>()).ok_or(CUDA_ERROR_INVALID_VALUE)?,
                CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH | CU_MEMPOOL_ATTR_USED_MEM_HIGH => {
                    // Only a reset to zero is allowed; it sets the mark to the current value.
                    if read_in(value.cast::<u64>()) != Some(0) {
                        return Err(CUDA_ERROR_INVALID_VALUE);
                    }
                    if attribute == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH {
                        p.reserved_high = p.reserved;
                    } else {
                        p.used_high = p.used;
                    }
                }
                _ => return Err(CUDA_ERROR_INVALID_VALUE),
            }
            Ok(())
        })
    }

    fn cuMemPoolGetAttribute(pool: u64, attribute: i32, value: *mut c_void) {
        let (int_value, u64_value) = with_registry(|registry| {
            let p = registry.pools.get(&pool).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            Ok(match attribute {
                CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES..=CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES => (Some(p.reuse[(attribute - 1) as usize]), None),
                CU_MEMPOOL_ATTR_RELEASE_THRESHOLD => (None, Some(p.release_threshold)),
                CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT => (None, Some(p.reserved)),
                CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH => (None, Some(p.reserved_high)),
                CU_MEMPOOL_ATTR_USED_MEM_CURRENT => (None, Some(p.used)),
                CU_MEMPOOL_ATTR_USED_MEM_HIGH => (None, Some(p.used_high)),
                _ => return Err(CUDA_ERROR_INVALID_VALUE),
            })
        })?;
        match (int_value, u64_value) {
            (Some(v), _) => out(value.cast::<i32>(), v),
            (_, Some(v)) => out(value.cast::<u64>(), v),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }

    fn cuMemAllocAsync(dptr: *mut u64, size: usize, stream: u64) { alloc_async(dptr, size, None, stream, false) }
    fn cuMemAllocAsync_ptsz(dptr: *mut u64, size: usize, stream: u64) { alloc_async(dptr, size, None, stream, true) }
    fn cuMemAllocFromPoolAsync(dptr: *mut u64, size: usize, pool: u64, stream: u64) { alloc_async(dptr, size, Some(pool), stream, false) }
    fn cuMemAllocFromPoolAsync_ptsz(dptr: *mut u64, size: usize, pool: u64, stream: u64) { alloc_async(dptr, size, Some(pool), stream, true) }
    fn cuMemFreeAsync(dptr: u64, stream: u64) { free_async(dptr, stream, false) }
    fn cuMemFreeAsync_ptsz(dptr: u64, stream: u64) { free_async(dptr, stream, true) }
}
