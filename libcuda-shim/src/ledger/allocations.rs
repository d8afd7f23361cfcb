//! Single allocations (`cuMemAlloc*`, pitched, managed, arrays, and what VMM and pools
//! reserve through the same door): the order is always reserve in the region
//! ([`Enforcer::begin`], refusing with CUDA_ERROR_OUT_OF_MEMORY, allocating nothing,
//! when the quota would be passed), the hook calls the real allocator, then
//! [`Enforcer::finish`] hands back the ticket to record, or gives the reservation back
//! if the driver failed. The ledger never calls back into the hook. A free credits
//! back exactly what was recorded.
//!
//! Sizes are charged as the driver spends memory (`charged_size`), not as asked.

use vgpu_shimgen::runtime;

use super::Ticket;
use crate::cuda::*;
use crate::debug;
use crate::devices::{LandsOn, Visible};
use crate::process::{ProcessState, process_state};
use crate::state::Enforcer;

/// What an allocation is keyed by: a device pointer or an array.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AllocKey {
    /// A device pointer (a pitched allocation's surcharge is keyed by
    /// [`AllocKey::pitch_surcharge`]).
    Pointer(u64),
    /// A `CUarray` or `CUmipmappedArray` handle.
    Array(usize),
    /// A module's static data (`CUmodule`).
    Module(usize),
    /// A library's static data (`CUlibrary`).
    Library(usize),
    /// What a context's limit (`CUlimit`) makes the driver reserve beyond its default.
    Limit {
        /// The context.
        context: usize,
        /// The `CUlimit`.
        limit: u32,
    },
}

/// The bit flipped in a pointer to key what a pitched allocation's pitch added
/// (device pointers never have it set, so the key never meets a real pointer's).
const PITCH_SURCHARGE_BIT: u64 = 1 << 63;

impl AllocKey {
    /// The key of the surcharge that the pitch of the pitched allocation at `pointer`
    /// added beyond its width (recorded and freed beside the pointer's own key).
    pub fn pitch_surcharge(pointer: u64) -> AllocKey {
        AllocKey::Pointer(pointer ^ PITCH_SURCHARGE_BIT)
    }
}

/// One recorded allocation.
pub struct Allocation {
    pub(super) ticket: Ticket,
    pub(super) context: usize,
    /// The pool it came from (its memory is counted as the pool's reservation).
    pub(super) pool: Option<usize>,
}

/// What [`Enforcer::begin`] decided before an allocation's real call.
#[must_use = "a reservation is finished (recorded or given back) after the real call"]
pub enum Reservation {
    /// Reserved in the region: run the real call, then [`Enforcer::finish`].
    Reserved(Ticket),
    /// The device is not known before the call (no current context, or before
    /// `cuInit`): the driver answers with its own error; should it succeed anyway,
    /// [`Enforcer::finish`] counts these bytes after the fact.
    Unplaced(u64),
    /// Refused: the real call must not run; the hook answers this error.
    Refused(CUresult),
}

/// Rounds an allocation the way the driver's allocator spends memory: large blocks in
/// 2 MiB pages, small ones in 512-byte units.
pub fn charged_size(bytes: u64) -> u64 {
    const PAGE: u64 = 2 << 20;
    if bytes >= (1 << 20) {
        bytes.div_ceil(PAGE).saturating_mul(PAGE)
    } else {
        bytes.div_ceil(512) * 512
    }
}

/// Bytes as MiB with one decimal, for the warning line.
fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1u32 << 20))
}

/// Whether this process may write another refusal warning: at most one a second (one
/// atomic load, and a compare-and-swap when due).
fn warning_due() -> bool {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST_NS: AtomicU64 = AtomicU64::new(0);
    let now = vgpu_contract::clock::monotonic_ns().max(1);
    let last = LAST_NS.load(Ordering::Relaxed);
    (last == 0 || now.saturating_sub(last) >= 1_000_000_000)
        && LAST_NS
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
}

impl Enforcer {
    /// The first half of an allocation, before the real call: reserves `charge` bytes
    /// on the device `lands_on` names. A hidden device is CUDA_ERROR_INVALID_DEVICE, and
    /// a quota that cannot take it CUDA_ERROR_OUT_OF_MEMORY ([`Reservation::Refused`]:
    /// the real call must not run); no current context (or no cuInit) leaves the error
    /// to the driver ([`Reservation::Unplaced`]). The caller runs the real call, then
    /// hands its result to [`Enforcer::finish`]; nothing here calls back into a hook.
    pub fn begin(&self, lands_on: &LandsOn, charge: u64) -> Reservation {
        match self.device_for(lands_on) {
            Ok(device) => match self.reserve(device, charge) {
                Ok(ticket) => Reservation::Reserved(ticket),
                Err(error) => Reservation::Refused(error),
            },
            Err(CUDA_ERROR_INVALID_DEVICE) => Reservation::Refused(CUDA_ERROR_INVALID_DEVICE),
            Err(_) => Reservation::Unplaced(charge),
        }
    }

    /// The second half, after the real call returned `result`: on success the ticket to
    /// record (what will credit it back), for an unplaced allocation what the driver
    /// handed out counted now; on failure the reservation is given back and `None`.
    pub fn finish(
        &self,
        reservation: Reservation,
        lands_on: &LandsOn,
        result: CUresult,
    ) -> Option<Ticket> {
        match reservation {
            Reservation::Reserved(ticket) if result == CUDA_SUCCESS => Some(ticket),
            Reservation::Reserved(ticket) => {
                self.unreserve(ticket);
                None
            }
            Reservation::Unplaced(charge) if result == CUDA_SUCCESS => {
                let device = self.device_for(lands_on).ok()?;
                let slot = self.slot()?;
                self.region.add_used(slot, device.region_index, charge);
                Some(self.ticket(slot, device, charge))
            }
            Reservation::Unplaced(_) | Reservation::Refused(_) => None,
        }
    }

    /// Reserves `bytes` on `device` for this process, or says why not. Before saying no,
    /// it credits back what dead processes held, settles this process's pools, and
    /// trims them if what they hold unused makes room.
    pub fn reserve(&self, device: &Visible, bytes: u64) -> Result<Ticket, CUresult> {
        let process = process_state(self);
        let Some(slot) = process.slot else {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        };
        self.sync_with_driver(process, slot, device);
        let limit = self.limit(device);
        let index = device.region_index;
        let ticket = Ticket {
            slot,
            region_index: index,
            bytes,
        };
        if self.region.try_reserve(slot, index, bytes, limit) {
            return Ok(ticket);
        }
        if self.reserve_making_room(slot, device, bytes, &mut process.pools()) {
            return Ok(ticket);
        }
        self.refused(device, bytes, limit);
        Err(CUDA_ERROR_OUT_OF_MEMORY)
    }

    /// Says that an allocation of `asked` bytes on `device` was refused at `limit`: the
    /// container's counters in the region (read by the host: metrics, Events), a debug
    /// line, and, when the config asks for it (`warn_on_refusal`), one warning line on
    /// stderr at most every second per process. Only on the refusal path.
    pub(crate) fn refused(&self, device: &Visible, asked: u64, limit: u64) {
        let held = self.region.device_used(device.region_index);
        self.region.count_refusal(device.region_index, asked, held);
        debug!(
            "refused {asked} bytes on {}: {held} used of {limit}",
            device.uuid
        );
        if self.config.warn_on_refusal && warning_due() {
            runtime::notice(
                "cuda",
                format_args!(
                    "CUDA_ERROR_OUT_OF_MEMORY: refused {} on {} by the container's memory quota of {} (it holds {}; the card may have room, the quota has not)",
                    mib(asked),
                    device.uuid,
                    mib(limit),
                    mib(held)
                ),
            );
        }
    }

    /// Remembers a successful allocation so that its free credits it back.
    pub fn record(&self, key: AllocKey, ticket: Ticket, context: usize) {
        self.remember(
            key,
            Allocation {
                ticket,
                context,
                pool: None,
            },
        );
    }

    pub(super) fn remember(&self, key: AllocKey, allocation: Allocation) {
        let process = process_state(self);
        let previous = runtime::lock(&process.allocations).insert(key, allocation);
        if let Some(previous) = previous {
            // The driver reused a key we still held: the old one was freed behind our back.
            self.credit_allocation(process, previous);
        }
    }

    fn credit_allocation(&self, process: &ProcessState, allocation: Allocation) {
        self.region.release(
            allocation.ticket.slot,
            allocation.ticket.region_index,
            allocation.ticket.bytes,
        );
        if let Some(pool) = allocation.pool
            && let Some(change) = process.pools().freed(pool)
        {
            self.apply(allocation.ticket.slot, [change]);
        }
    }

    /// The bytes counted under `key` (0 when nothing is).
    pub fn charge_of(&self, key: AllocKey) -> u64 {
        runtime::lock(&process_state(self).allocations)
            .get(&key)
            .map_or(0, |allocation| allocation.ticket.bytes)
    }

    /// Removes the record under `key` without crediting it (its bytes stay counted: the
    /// caller records them again under a new size).
    pub fn take(&self, key: AllocKey) -> Option<Allocation> {
        runtime::lock(&process_state(self).allocations).remove(&key)
    }

    /// Credits back the allocation under `key`, if we counted it. A pool allocation
    /// credits nothing: its memory stays reserved in the pool (see `settle_pools`).
    pub fn forget(&self, key: AllocKey) {
        let process = process_state(self);
        let removed = runtime::lock(&process.allocations).remove(&key);
        if let Some(allocation) = removed {
            self.credit_allocation(process, allocation);
        }
    }

    /// Credits back everything allocated in `context` (its destruction frees it all),
    /// and settles the pools, whose allocations went with it.
    pub fn forget_context(&self, context: usize) {
        let process = process_state(self);
        let removed: Vec<Allocation> = {
            let mut allocations = runtime::lock(&process.allocations);
            let keys: Vec<AllocKey> = allocations
                .iter()
                .filter(|(_, a)| a.context == context)
                .map(|(key, _)| *key)
                .collect();
            keys.iter()
                .filter_map(|key| allocations.remove(key))
                .collect()
        };
        for allocation in removed {
            self.credit_allocation(process, allocation);
        }
        if let Some(slot) = process.slot {
            self.settle_pools(process, slot, None);
        }
    }

    /// Bytes the container holds on a device, after crediting back what processes that
    /// are gone held (one `kill(pid, 0)` per other process), settling this process's
    /// pools and reconciling with NVML (what `cuMemGetInfo` answers from).
    pub fn used(&self, device: &Visible) -> u64 {
        let process = process_state(self);
        let Some(slot) = process.slot else {
            return if self.refused {
                device.memory_limit
            } else {
                self.region.device_used(device.region_index)
            };
        };
        self.region.reclaim_gone(slot, process.pid_ns);
        self.settle_pools(process, slot, Some(device.region_index));
        self.sync_with_driver(process, slot, device);
        self.region.device_used(device.region_index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn allocations_are_charged_as_the_driver_spends_them() {
        assert_eq!(charged_size(0), 0);
        assert_eq!(charged_size(1), 512);
        assert_eq!(charged_size(512), 512);
        assert_eq!(charged_size(513), 1024);
        assert_eq!(charged_size(MIB - 1), MIB);
        assert_eq!(charged_size(MIB), 2 * MIB, "from 1 MiB up: 2 MiB pages");
        assert_eq!(charged_size(2 * MIB + 1), 4 * MIB);
        assert_eq!(charged_size(3 * MIB), 4 * MIB);
        assert_eq!(charged_size(300 * MIB), 300 * MIB);
        assert_eq!(
            charged_size(u64::MAX),
            u64::MAX,
            "a size past the last page saturates: it is refused, never wrapped to 0"
        );
    }
}
