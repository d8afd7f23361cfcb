//! Physical VMM memory, counted from `cuMemCreate` (the reservation) until the VMM
//! table (`super::vmm`) says its last mapping and last reference are gone, whatever the
//! order of `cuMemRelease` and `cuMemUnmap`. Each hook's real call has succeeded
//! before it reaches here.

use vgpu_shimgen::runtime;

use super::Ticket;
use super::vmm::{Freed, VmmTable};
use crate::process::process_state;
use crate::state::Enforcer;

impl Enforcer {
    /// `cuMemCreate` succeeded with the bytes `ticket` reserved.
    pub fn vmm_created(&self, handle: u64, ticket: Ticket) {
        self.with_vmm(|vmm| vmm.created(handle, ticket.region_index, ticket.bytes));
    }

    /// `cuMemRelease` succeeded.
    pub fn vmm_released(&self, handle: u64) {
        self.with_vmm(|vmm| vmm.released(handle));
    }

    /// `cuMemRetainAllocationHandle` succeeded.
    pub fn vmm_retained(&self, handle: u64) {
        self.with_vmm(|vmm| {
            vmm.retained(handle);
            None
        });
    }

    /// `cuMemMap` succeeded.
    pub fn vmm_mapped(&self, start: u64, len: u64, handle: u64) {
        self.with_vmm(|vmm| vmm.mapped(start, len, handle));
    }

    /// `cuMemUnmap` succeeded.
    pub fn vmm_unmapped(&self, start: u64, len: u64) {
        self.with_vmm(|vmm| vmm.unmapped(start, len));
    }

    /// Runs `change` on the table and credits what it freed.
    fn with_vmm<F: IntoIterator<Item = Freed>>(&self, change: impl FnOnce(&mut VmmTable) -> F) {
        let process = process_state(self);
        let freed: Vec<Freed> = change(&mut runtime::lock(&process.vmm))
            .into_iter()
            .collect();
        self.credit(process.slot, freed);
    }
}
