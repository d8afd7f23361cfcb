//! Context overhead: what each context of this process costs on its card (measured by
//! `crate::meter::ContextMeter` when it is created), counted once per context and
//! credited back, with everything allocated in it, when it is destroyed. The region
//! keeps each slot's context total per device, for the host's process listings.

use vgpu_shimgen::runtime;

use crate::debug;
use crate::devices::Visible;
use crate::process::{ProcessState, process_state};
use crate::state::Enforcer;

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

impl Enforcer {
    /// The bytes this process's counted usage holds on `device` now (what the context
    /// meter measures a new context against); `None` when the process has no slot, and
    /// so nothing to charge a context to.
    pub fn counted_on(&self, device: &Visible) -> Option<u64> {
        let slot = process_state(self).slot?;
        Some(self.region.slot_used(slot, device.region_index))
    }

    /// Records `bytes` as the overhead of a new context (once per context), as the
    /// context meter measured it against [`Enforcer::counted_on`].
    pub fn charge_context(&self, device: &Visible, context: usize, primary: bool, bytes: u64) {
        let process = process_state(self);
        let Some(slot) = process.slot else { return };
        let mut charges = runtime::lock(&process.contexts);
        if charges.iter().any(|charge| charge.context == context) {
            return;
        }
        charges.push(ContextCharge {
            context,
            region_index: device.region_index,
            bytes,
            primary,
        });
        self.region.add_used(slot, device.region_index, bytes);
        let total = total_on(&charges, device.region_index);
        self.region.set_context(slot, device.region_index, total);
        debug!(
            "context {context:#x} on {} costs {bytes} bytes",
            device.uuid
        );
    }

    /// Whether this process already charged `context`.
    pub fn context_charged(&self, context: usize) -> bool {
        runtime::lock(&process_state(self).contexts)
            .iter()
            .any(|c| c.context == context)
    }

    /// The primary context charged on a device, if any.
    pub fn primary_context(&self, device: &Visible) -> Option<usize> {
        runtime::lock(&process_state(self).contexts)
            .iter()
            .find(|c| c.primary && c.region_index == device.region_index)
            .map(|c| c.context)
    }

    /// Credits back a destroyed context: its allocations and its overhead.
    pub fn context_destroyed(&self, context: usize) {
        self.forget_context(context);
        let process = process_state(self);
        let Some(slot) = process.slot else { return };
        let mut charges = runtime::lock(&process.contexts);
        let Some(position) = charges.iter().position(|c| c.context == context) else {
            return;
        };
        let charge = charges.remove(position);
        self.region.release(slot, charge.region_index, charge.bytes);
        let total = total_on(&charges, charge.region_index);
        self.region.set_context(slot, charge.region_index, total);
    }

    /// This process's context overhead on the device of region index `index`.
    pub(crate) fn context_overhead(&self, process: &ProcessState, index: usize) -> u64 {
        total_on(&runtime::lock(&process.contexts), index)
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
}
