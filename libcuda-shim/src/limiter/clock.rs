//! The GPU clock: maps one context's CUDA event times to the host's monotonic clock
//! through a reference event recorded on a stream of our own, so a sampled kernel is
//! placed where it really ran on the card, not where its stream's projection said.
//! Used only when samples settle (`super::settle`), never on a launch.

use vgpu_contract::clock::monotonic_ns;

use crate::cuda::*;
use crate::state::real;

/// How long a reference event serves before a fresh one replaces it (the GPU's timer
/// and the host's clock drift apart by microseconds per second at most).
pub(super) const CLOCK_REFRESH_NS: u64 = 1_000_000_000;

/// Maps one context's event times to the host clock: an event recorded on a stream of
/// our own, which never has work queued, fires within microseconds of its record, so
/// the host time of that record plus `cuEventElapsedTime(reference, e)` is when `e`
/// fired. That places a measured kernel where it really ran, not where its stream's
/// projection said it would start.
pub(super) struct GpuClock {
    stream: CUstream,
    /// The reference in use: (event, host time of its record).
    current: Option<(CUevent, u64)>,
    /// A newer one, used once it has fired.
    next: Option<(CUevent, u64)>,
}

impl GpuClock {
    pub(super) fn new() -> Option<GpuClock> {
        let create = real!(cuStreamCreate as fn(*mut CUstream, u32) -> CUresult);
        let mut stream = std::ptr::null_mut();
        // SAFETY: valid out-pointer; a context is current (we are settling its samples).
        (unsafe { create(&mut stream, CU_STREAM_NON_BLOCKING) } == CUDA_SUCCESS).then_some(
            GpuClock {
                stream,
                current: None,
                next: None,
            },
        )
    }

    /// The reference usable now, recording a fresh one when it is due.
    pub(super) fn reference(
        &mut self,
        slow_pool: &mut Vec<CUevent>,
        now_ns: u64,
    ) -> Option<(CUevent, u64)> {
        let query = real!(cuEventQuery as fn(CUevent) -> CUresult);
        if let Some((event, host_ns)) = self.next
            // SAFETY: an event we recorded.
            && unsafe { query(event) } == CUDA_SUCCESS
        {
            if let Some((old, _)) = self.current.replace((event, host_ns)) {
                slow_pool.push(old);
            }
            self.next = None;
        }
        let stale = self
            .current
            .is_none_or(|(_, host_ns)| now_ns.saturating_sub(host_ns) > CLOCK_REFRESH_NS);
        if stale && self.next.is_none() {
            let event = slow_pool.pop().or_else(|| {
                let create = real!(cuEventCreate as fn(*mut CUevent, u32) -> CUresult);
                let mut event = std::ptr::null_mut();
                // SAFETY: valid out-pointer; default flags (timing on).
                (unsafe { create(&mut event, 0) } == CUDA_SUCCESS).then_some(event)
            })?;
            let record = real!(cuEventRecord as fn(CUevent, CUstream) -> CUresult);
            let before = monotonic_ns();
            // SAFETY: our own event on our own (idle) stream.
            if unsafe { record(event, self.stream) } == CUDA_SUCCESS {
                self.next = Some((event, before / 2 + monotonic_ns() / 2));
            } else {
                slow_pool.push(event);
            }
        }
        self.current
    }

    /// When `event` fired, on the host clock.
    pub(super) fn host_time(reference: (CUevent, u64), event: CUevent) -> Option<u64> {
        let elapsed = real!(cuEventElapsedTime as fn(*mut f32, CUevent, CUevent) -> CUresult);
        let mut ms = 0f32;
        // SAFETY: valid out-pointer; two events of one context, both complete.
        if unsafe { elapsed(&mut ms, reference.0, event) } != CUDA_SUCCESS || !ms.is_finite() {
            return None;
        }
        let offset = (ms as f64 * 1e6) as i64;
        Some(reference.1.saturating_add_signed(offset))
    }
}
