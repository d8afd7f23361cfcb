//! Virtual memory management: physical memory is created by `cuMemCreate` (counted
//! there: PyTorch's expandable segments and NCCL allocate this way) and lives until its
//! last mapping is gone and its last reference is released, whatever the order:
//! `cuMemRelease` of a still-mapped handle credits nothing, the last `cuMemUnmap` does.
//! The hooks feed the ledger (`crate::ledger::vmm_counting`) after each real call
//! succeeds.

use std::ffi::c_void;

use crate::cuda::*;
use crate::devices::LandsOn;
use crate::ffi::{read_descriptor, read_out};
use crate::hook;
use crate::hooks::memory::charged;
use crate::ledger::allocations::charged_size;
use crate::state::after_success;

hook! {
    fn cuMemCreate(handle: *mut CUmemGenericAllocationHandle, bytes: usize, prop: *const CUmemAllocationProp, flags: u64) -> CUresult |forward| {
        let lands_on = match read_descriptor(prop) {
            Some(p) if p.location_type == CU_MEM_LOCATION_TYPE_DEVICE => LandsOn::Device(p.location_id),
            // Host-located (or unknown) allocations do not take device memory.
            _ => return forward(),
        };
        charged(
            charged_size(bytes as u64),
            lands_on,
            forward,
            |enforcer, ticket| enforcer.ledger().vmm_created(read_out(handle).unwrap_or(0), ticket),
        )
    }
}

hook! {
    fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult |forward| {
        after_success(forward(), |enforcer| enforcer.ledger().vmm_released(handle))
    }
}

hook! {
    fn cuMemRetainAllocationHandle(handle: *mut CUmemGenericAllocationHandle, address: *mut c_void) -> CUresult |forward| {
        after_success(forward(), |enforcer| enforcer.ledger().vmm_retained(read_out(handle).unwrap_or(0)))
    }
}

hook! {
    fn cuMemMap(address: CUdeviceptr, bytes: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: u64) -> CUresult |forward| {
        after_success(forward(), |enforcer| enforcer.ledger().vmm_mapped(address, bytes as u64, handle))
    }
}

hook! {
    fn cuMemUnmap(address: CUdeviceptr, bytes: usize) -> CUresult |forward| {
        after_success(forward(), |enforcer| enforcer.ledger().vmm_unmapped(address, bytes as u64))
    }
}
