//! Virtual memory management: physical handles, address reservations, mappings and
//! access (as in the shim's `hooks/vmm.rs`).

use std::ffi::c_void;

use super::support::{cuda, device, out};
use crate::cuda::errors::*;
use crate::cuda::registry::*;
use crate::cuda::with_registry;
use crate::ffi::{read_at, read_in};

/// `CUmemAllocationProp`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemAllocationProp {
    pub kind: i32,
    pub requested_handle_types: i32,
    pub location_type: i32,
    pub location_id: i32,
    pub win32_metadata: *mut c_void,
    pub alloc_flags: [u8; 8],
}
const _: () = assert!(std::mem::size_of::<MemAllocationProp>() == 32);

/// `CUmemAccessDesc`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemAccessDesc {
    pub location_type: i32,
    pub location_id: i32,
    pub flags: i32,
}
const _: () = assert!(std::mem::size_of::<MemAccessDesc>() == 12);

pub(super) const CU_MEM_ALLOCATION_TYPE_PINNED: i32 = 1;
pub(super) const CU_MEM_LOCATION_TYPE_DEVICE: i32 = 1;

fn check_prop(prop: *const MemAllocationProp) -> Result<(MemAllocationProp, usize), CUresult> {
    let p = read_in(prop).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if p.kind != CU_MEM_ALLOCATION_TYPE_PINNED || p.location_type != CU_MEM_LOCATION_TYPE_DEVICE {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (index, _) = device(p.location_id).map_err(|code| {
        if code == CUDA_ERROR_INVALID_DEVICE {
            CUDA_ERROR_INVALID_DEVICE
        } else {
            code
        }
    })?;
    Ok((p, index))
}

fn prop_bytes(p: &MemAllocationProp) -> [u8; 32] {
    let mut bytes = [0u8; 32];
    bytes[0..4].copy_from_slice(&p.kind.to_le_bytes());
    bytes[4..8].copy_from_slice(&p.requested_handle_types.to_le_bytes());
    bytes[8..12].copy_from_slice(&p.location_type.to_le_bytes());
    bytes[12..16].copy_from_slice(&p.location_id.to_le_bytes());
    bytes[24..32].copy_from_slice(&p.alloc_flags);
    bytes
}

/// Drops a VMM handle's memory once it is released and unmapped everywhere.
fn maybe_free_vmm(registry: &mut Registry, handle: u64) {
    if let Some(entry) = registry.vmm.get(&handle)
        && entry.refs == 0
        && entry.mappings == 0
    {
        let (device, size) = (entry.device, entry.size);
        registry.vmm.remove(&handle);
        registry.uncharge(device, size);
    }
}

cuda! {
    fn cuMemGetAllocationGranularity(granularity: *mut usize, prop: *const MemAllocationProp, option: i32) {
        check_prop(prop)?;
        if !(option == 0 || option == 1) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(granularity, GRANULARITY as usize)
    }

    fn cuMemCreate(handle_out: *mut u64, size: usize, prop: *const MemAllocationProp, flags: u64) {
        let (p, index) = check_prop(prop)?;
        let size = size as u64;
        if handle_out.is_null() || flags != 0 || size == 0 || !size.is_multiple_of(GRANULARITY) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let handle = with_registry(|registry| {
            if size > registry.capacity(index) {
                return Err(CUDA_ERROR_OUT_OF_MEMORY);
            }
            registry.charge(index, size)?;
            let handle = registry.handle(TAG_VMM);
            registry.vmm.insert(handle, VmmHandle { device: index, size, refs: 1, mappings: 0, prop: prop_bytes(&p) });
            Ok(handle)
        })?;
        out(handle_out, handle)
    }

    fn cuMemRelease(handle: u64) {
        with_registry(|registry| {
            let entry = registry.vmm.get_mut(&handle).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            if entry.refs == 0 {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            entry.refs -= 1;
            maybe_free_vmm(registry, handle);
            Ok(())
        })
    }

    fn cuMemGetAllocationPropertiesFromHandle(prop: *mut MemAllocationProp, handle: u64) {
        let bytes = with_registry(|registry| registry.vmm.get(&handle).map(|h| h.prop).ok_or(CUDA_ERROR_INVALID_VALUE))?;
        let field = |at: usize| i32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
        let mut alloc_flags = [0u8; 8];
        alloc_flags.copy_from_slice(&bytes[24..32]);
        out(prop, MemAllocationProp { kind: field(0), requested_handle_types: field(4), location_type: field(8), location_id: field(12), win32_metadata: std::ptr::null_mut(), alloc_flags })
    }

    fn cuMemAddressReserve(ptr: *mut u64, size: usize, alignment: usize, addr: u64, flags: u64) {
        let (size, alignment) = (size as u64, alignment as u64);
        if ptr.is_null() || flags != 0 || size == 0 || size % GRANULARITY != 0 || (alignment != 0 && !alignment.is_power_of_two()) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let align = alignment.max(GRANULARITY);
        let base = with_registry(|registry| {
            let base = registry.place_reservation(size, align, addr).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
            registry.reservations.insert(base, size);
            Ok(base)
        })?;
        out(ptr, base)
    }

    fn cuMemAddressFree(ptr: u64, size: usize) {
        with_registry(|registry| {
            match registry.reservations.get(&ptr) {
                Some(&len) if len == size as u64 => {}
                _ => return Err(CUDA_ERROR_INVALID_VALUE),
            }
            let end = ptr + size as u64;
            if registry.allocations.range(ptr..end).next().is_some() {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            registry.reservations.remove(&ptr);
            Ok(())
        })
    }

    fn cuMemMap(ptr: u64, size: usize, offset: usize, handle: u64, flags: u64) {
        let (size, offset) = (size as u64, offset as u64);
        if flags != 0 || size == 0 || !ptr.is_multiple_of(GRANULARITY) || size % GRANULARITY != 0 || offset % GRANULARITY != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        with_registry(|registry| {
            let entry = registry.vmm.get(&handle).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
            if entry.refs == 0 || offset.checked_add(size).is_none_or(|end| end > entry.size) {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            let device = entry.device;
            let end = ptr.checked_add(size).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            let inside = registry.reservations.range(..=ptr).next_back().is_some_and(|(&base, &len)| end <= base + len);
            if !inside {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            let overlaps = registry.allocations.range(..end).next_back().is_some_and(|(&base, a)| base + a.size > ptr);
            if overlaps {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            let buffer_id = registry.next_buffer_id();
            registry.allocations.insert(ptr, Allocation { size, charged: 0, device, ctx: 0, kind: AllocKind::Mapped { handle, offset }, buffer_id });
            if let Some(entry) = registry.vmm.get_mut(&handle) {
                entry.mappings += 1;
            }
            Ok(())
        })
    }

    fn cuMemUnmap(ptr: u64, size: usize) {
        let end = ptr.checked_add(size as u64).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        with_registry(|registry| {
            if registry.find(ptr).is_some_and(|(base, _)| base < ptr) {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            let inside: Vec<(u64, Allocation)> = registry.allocations.range(ptr..end).map(|(b, a)| (*b, *a)).collect();
            if inside.is_empty() || inside.iter().any(|(base, a)| base + a.size > end || !matches!(a.kind, AllocKind::Mapped { .. })) {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            for (base, allocation) in inside {
                registry.allocations.remove(&base);
                if let AllocKind::Mapped { handle, .. } = allocation.kind {
                    if let Some(entry) = registry.vmm.get_mut(&handle) {
                        entry.mappings = entry.mappings.saturating_sub(1);
                    }
                    maybe_free_vmm(registry, handle);
                }
            }
            Ok(())
        })
    }

    fn cuMemSetAccess(ptr: u64, size: usize, descriptors: *const MemAccessDesc, count: usize) {
        if descriptors.is_null() || count == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let devices = with_registry(|registry| Ok(registry.device_count()))?;
        for index in 0..count {
            let d = read_at(descriptors, index).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            if d.location_type != CU_MEM_LOCATION_TYPE_DEVICE || usize::try_from(d.location_id).map_or(true, |id| id >= devices) || !(0..=3).contains(&d.flags) {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
        }
        let end = ptr.checked_add(size as u64).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        with_registry(|registry| {
            // Every byte of the range must be mapped.
            let mut cursor = ptr;
            while cursor < end {
                match registry.find(cursor) {
                    Some((base, a)) if matches!(a.kind, AllocKind::Mapped { .. }) => cursor = base + a.size,
                    _ => return Err(CUDA_ERROR_INVALID_VALUE),
                }
            }
            Ok(())
        })
    }

    fn cuMemRetainAllocationHandle(handle_out: *mut u64, addr: *mut c_void) {
        let handle = with_registry(|registry| {
            let (_, allocation) = registry.find(addr as u64).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            let AllocKind::Mapped { handle, .. } = allocation.kind else { return Err(CUDA_ERROR_INVALID_VALUE) };
            let entry = registry.vmm.get_mut(&handle).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            entry.refs += 1;
            Ok(handle)
        })?;
        out(handle_out, handle)
    }
}
