//! Virtual memory management: physical memory is created by `cuMemCreate` (counted
//! there: PyTorch's expandable segments and NCCL allocate this way) and lives until its
//! last mapping is gone and its last reference is released, whatever the order:
//! `cuMemRelease` of a still-mapped handle credits nothing, the last `cuMemUnmap` does.
//! The hooks feed the ledger (`crate::ledger::vmm`) after each real call succeeds.

use std::ffi::c_void;

use crate::cuda::*;
use crate::hook;
use crate::hooks::memory::{Target, charged, descriptor, read};
use crate::state::{charged_size, enforcer};

/// Runs `after` with the enforcer when the real call succeeded and the quota applies.
fn after(result: CUresult, then: impl FnOnce(&crate::state::Enforcer)) -> CUresult {
    if result == CUDA_SUCCESS
        && let Ok(Some(enforcer)) = enforcer()
    {
        then(enforcer);
    }
    result
}

hook! {
    fn cuMemCreate(handle: *mut CUmemGenericAllocationHandle, bytes: usize, prop: *const CUmemAllocationProp, flags: u64) -> CUresult |real| {
        let target = match descriptor(prop) {
            Some(p) if p.location_type == CU_MEM_LOCATION_TYPE_DEVICE => Target::Device(p.location_id),
            // Host-located (or unknown) allocations do not take device memory.
            // SAFETY: forwarding the caller's own arguments to the real function.
            _ => return unsafe { real(handle, bytes, prop, flags) },
        };
        charged(
            charged_size(bytes as u64),
            target,
            // SAFETY: forwarding the caller's own arguments to the real function.
            || unsafe { real(handle, bytes, prop, flags) },
            |enforcer, ticket| enforcer.vmm_created(read(handle), ticket),
        )
    }
}

hook! {
    fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function.
        after(unsafe { real(handle) }, |enforcer| enforcer.vmm_released(handle))
    }
}

hook! {
    fn cuMemRetainAllocationHandle(handle: *mut CUmemGenericAllocationHandle, address: *mut c_void) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function.
        after(unsafe { real(handle, address) }, |enforcer| enforcer.vmm_retained(read(handle)))
    }
}

hook! {
    fn cuMemMap(address: CUdeviceptr, bytes: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: u64) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function.
        after(unsafe { real(address, bytes, offset, handle, flags) }, |enforcer| {
            enforcer.vmm_mapped(address, bytes as u64, handle)
        })
    }
}

hook! {
    fn cuMemUnmap(address: CUdeviceptr, bytes: usize) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function.
        after(unsafe { real(address, bytes) }, |enforcer| enforcer.vmm_unmapped(address, bytes as u64))
    }
}
