//! The ledger: what this process holds on the card, counted in its slot of the usage
//! region so that the container's quota sees it.
//!
//! - here: a reservation ([`Ticket`]) and the region updates every part shares;
//! - [`allocations`]: single allocations (`cuMemAlloc*`, pitched, managed, arrays):
//!   reserve, call the driver, record or give back; credit on free; and the figure
//!   `cuMemGetInfo` answers from;
//! - [`contexts`]: the overhead each context costs;
//! - [`vmm_counting`] over [`vmm`]: physical VMM memory, alive until its last unmap and
//!   release;
//! - [`pool_counting`] over [`pools`]: memory pools, counted by what they have reserved;
//! - [`reserved`]: what the driver reserves on its own (module and library static data,
//!   the stack, heap and printf FIFO a context's limits back), counted at the call.
//!
//! `vmm` and `pools` are pure data structures, unit-tested there; the `_counting`
//! modules feed them from the hooks and apply what they return to the region.

pub mod allocations;
pub mod contexts;
pub mod pool_counting;
pub mod pools;
pub mod reserved;
pub mod vmm;
pub mod vmm_counting;

use vgpu_contract::region::SlotId;

use crate::devices::Visible;
use crate::state::Enforcer;
use pools::Change;
use vmm::Freed;

/// A reservation in the usage region.
#[derive(Clone, Copy, Debug)]
pub struct Ticket {
    slot: SlotId,
    region_index: usize,
    /// The bytes reserved.
    pub bytes: u64,
}

impl Enforcer {
    /// The quota that reservations on `device` are checked against.
    fn limit(&self, device: &Visible) -> u64 {
        if self.config.memory_oversubscribe {
            u64::MAX
        } else {
            device.memory_limit
        }
    }

    /// A ticket for bytes already added to the region.
    pub fn ticket(&self, slot: SlotId, device: &Visible, bytes: u64) -> Ticket {
        Ticket {
            slot,
            region_index: device.region_index,
            bytes,
        }
    }

    /// Gives back a reservation whose allocation failed.
    pub fn unreserve(&self, ticket: Ticket) {
        self.region
            .release(ticket.slot, ticket.region_index, ticket.bytes);
    }

    /// Applies the pool ledger's changes to this process's slot.
    fn apply(&self, slot: SlotId, changes: impl IntoIterator<Item = Change>) {
        for change in changes {
            let bytes = change.delta.unsigned_abs().min(u64::MAX as u128) as u64;
            if change.delta > 0 {
                self.region.add_used(slot, change.region_index, bytes);
            } else {
                self.region.release(slot, change.region_index, bytes);
            }
        }
    }

    /// Credits what the VMM ledger freed.
    fn credit(&self, slot: Option<SlotId>, freed: impl IntoIterator<Item = Freed>) {
        if let Some(slot) = slot {
            for freed in freed {
                self.region.release(slot, freed.region_index, freed.bytes);
            }
        }
    }
}
