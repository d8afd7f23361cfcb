//! Physical VMM memory, counted from `cuMemCreate` (the reservation) until the VMM
//! table (`super::vmm`) says its last mapping and last reference are gone, whatever the
//! order of `cuMemRelease` and `cuMemUnmap`. Each hook's real call has succeeded
//! before it reaches here.

use vgpu_shimgen::runtime;

use super::vmm::{Freed, VmmTable};
use super::{Ledger, Ticket};

impl Ledger<'_> {
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
        let freed: Vec<Freed> = change(&mut runtime::lock(&self.vmm)).into_iter().collect();
        self.credit(freed);
    }
}

#[cfg(test)]
mod tests {
    use crate::ledger::tests::{DEVICE_0, MIB, fixture};

    #[test]
    fn vmm_memory_is_released_at_its_last_unmap_or_release() {
        let f = fixture();
        let (ledger, driver) = f.ledger();
        let ticket = ledger.reserve(DEVICE_0, 300 * MIB, &driver).expect("fits");
        ledger.vmm_created(1, ticket);
        ledger.vmm_mapped(0x1000_0000, 300 * MIB, 1);
        ledger.vmm_released(1);
        assert_eq!(ledger.used(0), 300 * MIB, "released but mapped: still held");
        ledger.vmm_unmapped(0x1000_0000, 300 * MIB);
        assert_eq!(ledger.used(0), 0);
    }
}
