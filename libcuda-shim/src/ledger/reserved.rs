//! What the driver reserves on its own, at the call that causes it: a module's or
//! library's static data (`__device__` variables, priced from the image before the
//! load), and what a context's limits back (the stack for every thread the card can
//! hold, the device malloc heap; the rest settled after the call).
//!
//! Each such call goes: price it ([`limit_bytes`], `vgpu_abi::image`), reserve that in
//! the region (refused: CUDA_ERROR_OUT_OF_MEMORY, the driver untouched), make the call,
//! record the reservation under the module, library or (context, limit), then settle
//! with the driver's own per-process figure at once (`Enforcer::settle_with_driver`),
//! which counts what could not be priced (code, compressed images, the device runtime's
//! limits). When that settled figure passes the quota the call is undone (the module
//! unloaded, the limit set back) and answers CUDA_ERROR_OUT_OF_MEMORY.

use vgpu_contract::region::SlotId;

use super::allocations::{AllocKey, charged_size};
use crate::cuda::*;
use crate::debug;
use crate::devices::Visible;
use crate::process::process_state;
use crate::state::Enforcer;

/// Bytes of device memory the driver backs for `limit` at `value`, on a card holding
/// `resident_threads` threads at once (SMs × max threads per SM); 0 for limits that take
/// no device memory or that are not priced before the call, which are settled from
/// NVML right after it: the printf FIFO (on the H200 with driver 580 a 1.5 GiB FIFO
/// added nothing to the process's device memory, before or after a printf), the device
/// runtime's pending launches (nothing either) and sync depth (unsupported there).
/// Measured there: the stack exactly as priced (32 KiB: +8184 MiB over the 1 KiB
/// default; 2 KiB: +264 MiB), the heap at the first launch of a kernel that calls
/// `malloc` (1.5 GiB: +1678 MiB, of which 150 MiB any such kernel takes, which the
/// settling counts).
pub fn limit_bytes(limit: CUlimit, value: u64, resident_threads: u64) -> u64 {
    match limit {
        // Local memory: every resident thread gets its own stack.
        CU_LIMIT_STACK_SIZE => value.saturating_mul(resident_threads),
        CU_LIMIT_MALLOC_HEAP_SIZE => value,
        _ => 0,
    }
}

/// What a limit's record becomes when it goes from `old` to `new`: the bytes counted
/// so far (`counted`) plus the change, never below 0.
pub fn limit_charge(counted: u64, old_bytes: u64, new_bytes: u64) -> u64 {
    counted.saturating_add(new_bytes).saturating_sub(old_bytes)
}

impl Enforcer {
    /// Whether, settled with the driver's figure now, the container holds more than
    /// its quota on `device` and more than the `before` it held before the call.
    fn over_after_settling(&self, slot: SlotId, device: &Visible, before: u64) -> bool {
        let process = process_state(self);
        self.settle_with_driver(process, slot, device);
        let used = self.region.device_used(device.region_index);
        used > self.limit(device) && used > before
    }

    /// A load that makes the driver take memory: reserve `static_bytes` (as charged) on
    /// `device`, run `load`, record the reservation under the key `loaded` reads back
    /// (in `context`, 0 for none), settle; undone with `unload` (and
    /// CUDA_ERROR_OUT_OF_MEMORY) if that passed the quota.
    pub fn load_counted(
        &self,
        device: &Visible,
        context: usize,
        static_bytes: u64,
        load: impl FnOnce() -> CUresult,
        loaded: impl FnOnce() -> Option<AllocKey>,
        unload: impl FnOnce(AllocKey),
    ) -> CUresult {
        let process = process_state(self);
        let charge = charged_size(static_bytes);
        let Some(slot) = process.slot else {
            // This process's allocations are refused (no slot): so is static data.
            return if charge > 0 {
                CUDA_ERROR_OUT_OF_MEMORY
            } else {
                load()
            };
        };
        let ticket = if charge > 0 {
            match self.reserve(device, charge) {
                Ok(ticket) => Some(ticket),
                Err(error) => {
                    debug!("refused a module of {static_bytes} bytes of static data");
                    return error;
                }
            }
        } else {
            None
        };
        let before = self.region.device_used(device.region_index);
        let result = load();
        if result != CUDA_SUCCESS {
            if let Some(ticket) = ticket {
                self.unreserve(ticket);
            }
            return result;
        }
        let key = loaded();
        match (key, ticket) {
            (Some(key), Some(ticket)) => self.record(key, ticket, context),
            (None, Some(ticket)) => self.unreserve(ticket),
            _ => {}
        }
        if self.over_after_settling(slot, device, before) {
            if let Some(key) = key {
                unload(key);
                self.forget(key);
            }
            self.settle_with_driver(process, slot, device);
            debug!("unloaded a module whose memory passed the quota");
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        result
    }

    /// `cuCtxSetLimit(limit, new)` in `context` on `device`, the limit being `old`:
    /// reserves what the new value backs beyond the old, runs `set` (the real call with
    /// a value), keeps the (context, limit) record at its new size, settles; sets the
    /// old value back (and answers CUDA_ERROR_OUT_OF_MEMORY) if that passed the quota.
    pub fn limit_counted(
        &self,
        device: &Visible,
        context: usize,
        limit: CUlimit,
        (old, new): (u64, u64),
        resident_threads: u64,
        set: impl Fn(u64) -> CUresult,
    ) -> CUresult {
        let process = process_state(self);
        let Some(slot) = process.slot else {
            // This process's allocations are refused (no slot): so is more memory.
            let grows = limit_bytes(limit, new, resident_threads)
                > limit_bytes(limit, old, resident_threads);
            return if grows {
                CUDA_ERROR_OUT_OF_MEMORY
            } else {
                set(new)
            };
        };
        let key = AllocKey::Limit { context, limit };
        let counted = self.charge_of(key);
        let total = charged_size(limit_charge(
            counted,
            limit_bytes(limit, old, resident_threads),
            limit_bytes(limit, new, resident_threads),
        ));
        let ticket = if total > counted {
            match self.reserve(device, total - counted) {
                Ok(ticket) => Some(ticket),
                Err(error) => {
                    debug!(
                        "refused limit {limit} = {new}: {} bytes more",
                        total - counted
                    );
                    return error;
                }
            }
        } else {
            None
        };
        let before = self.region.device_used(device.region_index);
        let result = set(new);
        if result != CUDA_SUCCESS {
            if let Some(ticket) = ticket {
                self.unreserve(ticket);
            }
            return result;
        }
        // The region holds the old count, and the growth reserved above.
        self.resize_limit(slot, device, key, counted.max(total), total);
        if self.over_after_settling(slot, device, before) {
            // Set back: the driver gives back what the new value took.
            let _ = set(old);
            self.resize_limit(slot, device, key, total, counted);
            self.settle_with_driver(process, slot, device);
            debug!("set limit {limit} back to {old}: {new} passed the quota");
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        result
    }

    /// The (context, limit) record becomes `to` bytes, the region holding `from` for it.
    fn resize_limit(&self, slot: SlotId, device: &Visible, key: AllocKey, from: u64, to: u64) {
        let AllocKey::Limit { context, .. } = key else {
            return;
        };
        let _ = self.take(key);
        if to < from {
            self.region.release(slot, device.region_index, from - to);
        } else if to > from {
            self.region.add_used(slot, device.region_index, to - from);
        }
        if to > 0 {
            self.record(key, self.ticket(slot, device, to), context);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB: u64 = 1 << 10;
    const MIB: u64 = 1 << 20;

    #[test]
    fn the_stack_is_backed_for_every_resident_thread() {
        // An H200: 132 SMs × 2048 threads. 32 KiB each is 8448 MiB.
        let threads = 132 * 2048;
        assert_eq!(
            limit_bytes(CU_LIMIT_STACK_SIZE, 32 * KIB, threads),
            8448 * MIB
        );
        assert_eq!(
            limit_bytes(CU_LIMIT_MALLOC_HEAP_SIZE, 1536 * MIB, threads),
            1536 * MIB
        );
        // Measured on the H200: 32 KiB is 8184 MiB more than the default 1 KiB.
        assert_eq!(
            limit_bytes(CU_LIMIT_STACK_SIZE, 32 * KIB, threads)
                - limit_bytes(CU_LIMIT_STACK_SIZE, KIB, threads),
            8184 * MIB
        );
        for unpriced in [
            CU_LIMIT_PRINTF_FIFO_SIZE,
            CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH,
            CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT,
            CU_LIMIT_MAX_L2_FETCH_GRANULARITY,
            CU_LIMIT_PERSISTING_L2_CACHE_SIZE,
            0x99,
        ] {
            assert_eq!(limit_bytes(unpriced, 1 << 40, threads), 0);
        }
        assert_eq!(
            limit_bytes(CU_LIMIT_STACK_SIZE, u64::MAX, threads),
            u64::MAX,
            "saturates: refused, never wrapped"
        );
    }

    #[test]
    fn a_limit_record_follows_the_value_up_and_down() {
        // Default stack 1 KiB (in the context's overhead), set to 32 KiB, then to 8 KiB.
        let threads = 1000;
        let (default, big, small) = (KIB * threads, 32 * KIB * threads, 8 * KIB * threads);
        let counted = limit_charge(0, default, big);
        assert_eq!(counted, 31 * KIB * threads);
        assert_eq!(limit_charge(counted, big, small), 7 * KIB * threads);
        assert_eq!(
            limit_charge(7 * KIB * threads, small, KIB / 2 * threads),
            0,
            "below the default: nothing counted, never negative"
        );
    }
}
