//! The prices of what the driver reserves on its own, at the call that causes it: a
//! module's or library's static data (`__device__` variables, priced from the image
//! before the load by `vgpu_abi::image`), and what a context's limits back (the stack
//! for every thread the card can hold, the device malloc heap; the rest settled after
//! the call).
//!
//! Each such call (`crate::allocating`: `load_begin`/`limit_begin`, the real call,
//! `load_finish`/`limit_finish`) reserves the price in the ledger (refused:
//! CUDA_ERROR_OUT_OF_MEMORY, the driver untouched), records it under the module,
//! library or (context, limit), then settles with the driver's own per-process figure
//! at once, which counts what could not be priced (code, compressed images, the device
//! runtime's limits). When that settled figure passes the quota the call is undone by
//! the hook (the module unloaded, the limit set back) and answers
//! CUDA_ERROR_OUT_OF_MEMORY.

use crate::cuda::*;

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
