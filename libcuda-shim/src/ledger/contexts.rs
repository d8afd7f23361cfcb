//! Context overhead: what each context of this process costs on its card (measured by
//! `crate::meter::ContextMeter` when it is created), counted once per context and
//! credited back, with everything allocated in it, when it is destroyed. The region
//! keeps each slot's context total per device, for the host's process listings.

use vgpu_shimgen::runtime;

use super::Ledger;
use super::pools::PoolDriver;

/// The overhead charged for one context of this process.
pub struct ContextCharge {
    context: usize,
    region_index: usize,
    bytes: u64,
    primary: bool,
}

/// The overhead charged on the device of region index `index`, over every context.
fn total_on(charges: &[ContextCharge], index: usize) -> u64 {
    charges
        .iter()
        .filter(|c| c.region_index == index)
        .map(|c| c.bytes)
        .sum()
}

impl Ledger<'_> {
    /// Counts `bytes` as the overhead of a new context on the device of region index
    /// `index` (once per context), as the context meter measured it against
    /// [`Ledger::counted_on`]. True when it was counted now.
    pub fn charge_context(&self, index: usize, context: usize, primary: bool, bytes: u64) -> bool {
        let Some(slot) = self.slot else { return false };
        let mut charges = runtime::lock(&self.contexts);
        if charges.iter().any(|charge| charge.context == context) {
            return false;
        }
        charges.push(ContextCharge {
            context,
            region_index: index,
            bytes,
            primary,
        });
        self.region.add_used(slot, index, bytes);
        let total = total_on(&charges, index);
        self.region.set_context(slot, index, total);
        true
    }

    /// Whether this process already charged `context`.
    pub fn context_charged(&self, context: usize) -> bool {
        runtime::lock(&self.contexts)
            .iter()
            .any(|c| c.context == context)
    }

    /// The primary context charged on the device of region index `index`, if any.
    pub fn primary_context(&self, index: usize) -> Option<usize> {
        runtime::lock(&self.contexts)
            .iter()
            .find(|c| c.primary && c.region_index == index)
            .map(|c| c.context)
    }

    /// Credits back a destroyed context: its allocations (settling the pools through
    /// `driver`) and its overhead.
    pub fn context_destroyed(&self, context: usize, driver: &dyn PoolDriver) {
        self.forget_context(context, driver);
        let Some(slot) = self.slot else { return };
        let mut charges = runtime::lock(&self.contexts);
        let Some(position) = charges.iter().position(|c| c.context == context) else {
            return;
        };
        let charge = charges.remove(position);
        self.region.release(slot, charge.region_index, charge.bytes);
        let total = total_on(&charges, charge.region_index);
        self.region.set_context(slot, charge.region_index, total);
    }

    /// This process's context overhead on the device of region index `index`.
    pub(super) fn context_overhead(&self, index: usize) -> u64 {
        total_on(&runtime::lock(&self.contexts), index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_are_per_device() {
        let charges = [
            ContextCharge {
                context: 1,
                region_index: 0,
                bytes: 500,
                primary: true,
            },
            ContextCharge {
                context: 2,
                region_index: 1,
                bytes: 300,
                primary: false,
            },
            ContextCharge {
                context: 3,
                region_index: 0,
                bytes: 20,
                primary: false,
            },
        ];
        assert_eq!(total_on(&charges, 0), 520);
        assert_eq!(total_on(&charges, 1), 300);
        assert_eq!(total_on(&charges, 2), 0);
    }

    #[test]
    fn a_context_is_charged_once_and_credited_with_its_allocations() {
        use crate::ledger::allocations::AllocKey;
        use crate::ledger::tests::{DEVICE_0, MIB, fixture};
        let f = fixture();
        let (ledger, driver) = f.ledger();
        assert!(ledger.charge_context(0, 0xc0, true, 500 * MIB));
        assert!(
            !ledger.charge_context(0, 0xc0, true, 500 * MIB),
            "once per context"
        );
        assert!(ledger.context_charged(0xc0));
        assert_eq!(ledger.primary_context(0), Some(0xc0));
        assert_eq!(ledger.primary_context(1), None);
        let ticket = ledger.reserve(DEVICE_0, 100 * MIB, &driver).expect("fits");
        ledger.record(AllocKey::Pointer(0x10), ticket, 0xc0);
        assert_eq!(ledger.used(0), 600 * MIB);
        ledger.context_destroyed(0xc0, &driver);
        assert_eq!(ledger.used(0), 0);
        assert!(!ledger.context_charged(0xc0));
    }
}
