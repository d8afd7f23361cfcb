//! The GPU clock: maps one context's CUDA event times to the host's monotonic clock
//! through a reference event recorded on a stream of our own, so a sampled kernel is
//! placed where it really ran on the card, not where its stream's projection said.
//! Used only when samples settle (`super::settle`), never on a launch.

use vgpu_contract::clock::monotonic_ns;

use super::sample::elapsed_ns;
use super::trace::{self, Counter};
use crate::cuda::*;
use crate::state::real;

/// How long a reference event serves before a fresh one replaces it (the GPU's timer
/// and the host's clock drift apart by microseconds per second at most).
pub(super) const CLOCK_REFRESH_NS: u64 = 1_000_000_000;
/// A reference is believed only when it is seen to have fired within this long of its
/// record: the host time it stands for is then known within half of it.
const FIRED_WITHIN_NS: u64 = 20_000;
/// So a believed reference places an event's firing within this much of the truth.
pub(super) const PLACED_WITHIN_NS: u64 = FIRED_WITHIN_NS / 2;
/// After a reference that did not fire in time, the next try waits this long (the
/// context's slice comes round within a few of them on a time-sliced card).
const RETRY_NS: u64 = 10_000_000;

/// The host time a reference event stands for, if it is to be believed: the record call
/// began at `recorded_ns` and a query first found the event fired at `seen_ns`. It fired
/// in between, so the midpoint is off by at most half the gap; a gap over
/// [`FIRED_WITHIN_NS`] says the event waited (on a card time-sliced with another
/// process, for this context's slice) and its time says nothing of the record's.
fn believed_at(recorded_ns: u64, seen_ns: u64) -> Option<u64> {
    let gap = seen_ns.checked_sub(recorded_ns)?;
    (gap <= FIRED_WITHIN_NS).then_some(recorded_ns + gap / 2)
}

/// An event's firing time `at` on the host's clock, as a believed reference placed it, if
/// it is to be believed for a sample seen finished at `seen_ns` and settled in a slow path
/// that read its clock at `now_ns` (before the sighting). A firing after `now_ns` is no
/// wonder: the sample may have finished between that read and the query that found it
/// done. One up to [`PLACED_WITHIN_NS`] past the sighting is the reference's own error
/// and stands for the sighting; later, or [`CLOCK_REFRESH_NS`] four times before
/// `now_ns`, it says something is wrong (a reference of another context's clock, say)
/// and the sample is placed by its projection.
pub(super) fn believable(at: u64, seen_ns: u64, now_ns: u64) -> Option<u64> {
    let seen_ns = seen_ns.max(now_ns);
    (at <= seen_ns.saturating_add(PLACED_WITHIN_NS)
        && at.saturating_add(CLOCK_REFRESH_NS * 4) >= now_ns)
        .then_some(at.min(seen_ns))
}

/// A believed reference event of one context (`GpuClock`).
#[derive(Clone, Copy, Debug)]
pub(super) struct Reference {
    event: CUevent,
    /// When its record call began, on the host's clock.
    recorded_ns: u64,
    /// When it is believed to have fired (`believed_at`).
    fired_ns: u64,
}

impl Reference {
    /// When an event that fired `since_ns` after the reference (`Reference::since`)
    /// fired, on the host's clock.
    pub(super) fn fired(self, since_ns: i64) -> u64 {
        self.fired_ns.saturating_add_signed(since_ns)
    }

    /// When an event that fired `since_ns` after the reference would have been recorded
    /// had it fired as soon after its record call as the reference did after its own, on
    /// the host's clock. An event recorded on an idle stream comes out at its record call
    /// (the card's fetch of it, the latency from the record to the firing, is the
    /// reference's too and cancels), whatever the reference's query loop made of the
    /// moment it fired; an event that waited for work queued before it comes out that
    /// latency before the work ended.
    ///
    /// This, not [`Reference::fired`], says how long a sampled kernel's stream stood idle
    /// before the kernel was submitted (`Sample::idle_gap_ns`). Measured by the firing
    /// time, the gap leaves out the latency, and every sample on an idle stream was
    /// charged the card's fetch of its kernel besides the kernel: on an H100 an empty
    /// kernel's samples came to 3.76 us for launches 3.05 us apart, and a `--cores 99`
    /// launch loop ran at 1.13-1.23x of bare (BENCHMARKS run 17).
    pub(super) fn as_if_recorded(self, since_ns: i64) -> u64 {
        as_if_recorded(self.recorded_ns, since_ns)
    }

    /// GPU time from the reference to `event`, ns; the driver's error where it has none
    /// (`CUDA_ERROR_NOT_READY`: `event` has not fired yet).
    pub(super) fn since(self, event: CUevent) -> Result<i64, CUresult> {
        elapsed_ns(self.event, event)
    }
}

/// `Reference::as_if_recorded` for a reference whose record call began at
/// `reference_recorded_ns`, of an event that fired `since_reference_ns` after it.
fn as_if_recorded(reference_recorded_ns: u64, since_reference_ns: i64) -> u64 {
    reference_recorded_ns.saturating_add_signed(since_reference_ns)
}

/// Maps one context's event times to the host clock: an event recorded on a stream of
/// our own, which never has work queued, and seen to fire within [`FIRED_WITHIN_NS`] of
/// its record, so the host time of that record plus `cuEventElapsedTime(reference, e)`
/// is when `e` fired. That places a measured kernel where it really ran, not where its
/// stream's projection said it would start.
///
/// On a card time-sliced with another process, an event of this context waits for the
/// context's slice, idle stream or not (on the H200, BENCHMARKS run 11: a reference
/// taken as fired at its record placed every later event early by up to a slice, and a
/// hard container paced one kernel at a time was given back time it had used). So a
/// reference is taken only when seen to fire at once; while none is, samples are placed
/// by their projections.
pub(super) struct GpuClock {
    stream: CUstream,
    /// The reference in use.
    current: Option<Reference>,
    /// No new reference is tried before this host time.
    retry_at_ns: u64,
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
                retry_at_ns: 0,
            },
        )
    }

    /// The reference usable now, trying a fresh one when it is due. A try costs the
    /// caller (a settle, under the `Slow` lock) one record and at most
    /// [`FIRED_WITHIN_NS`] of queries, once a second, or every [`RETRY_NS`] while the
    /// context's events wait for its slice.
    pub(super) fn reference(
        &mut self,
        slow_pool: &mut Vec<CUevent>,
        now_ns: u64,
    ) -> Option<Reference> {
        let stale = self
            .current
            .is_none_or(|current| now_ns.saturating_sub(current.fired_ns) > CLOCK_REFRESH_NS);
        if stale && now_ns >= self.retry_at_ns {
            self.retry_at_ns = now_ns.saturating_add(RETRY_NS);
            if let Some(fresh) = self.try_reference(slow_pool) {
                if let Some(old) = self.current.replace(fresh) {
                    slow_pool.push(old.event);
                }
                trace::count(Counter::ClockTaken);
            } else {
                trace::count(Counter::ClockLate);
            }
        }
        self.current
    }

    /// Records a reference on the clock's own stream and watches it fire; `None` when
    /// it did not within [`FIRED_WITHIN_NS`] (the event goes back to the pool: a later
    /// record of it supersedes this one).
    fn try_reference(&self, slow_pool: &mut Vec<CUevent>) -> Option<Reference> {
        let event = slow_pool.pop().or_else(|| {
            let create = real!(cuEventCreate as fn(*mut CUevent, u32) -> CUresult);
            let mut event = std::ptr::null_mut();
            // SAFETY: valid out-pointer; default flags (timing on).
            (unsafe { create(&mut event, 0) } == CUDA_SUCCESS).then_some(event)
        })?;
        let record = real!(cuEventRecord as fn(CUevent, CUstream) -> CUresult);
        let query = real!(cuEventQuery as fn(CUevent) -> CUresult);
        let recorded_ns = monotonic_ns();
        // SAFETY: our own event on our own (idle) stream.
        if unsafe { record(event, self.stream) } != CUDA_SUCCESS {
            slow_pool.push(event);
            return None;
        }
        loop {
            // SAFETY: an event we recorded.
            let fired = unsafe { query(event) } == CUDA_SUCCESS;
            let seen_ns = monotonic_ns();
            if fired && let Some(fired_ns) = believed_at(recorded_ns, seen_ns) {
                return Some(Reference {
                    event,
                    recorded_ns,
                    fired_ns,
                });
            }
            if fired || seen_ns.saturating_sub(recorded_ns) > FIRED_WITHIN_NS {
                slow_pool.push(event);
                return None;
            }
            std::hint::spin_loop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reference_seen_to_fire_at_once_stands_for_the_middle_of_its_wait() {
        assert_eq!(believed_at(1_000, 1_000), Some(1_000));
        assert_eq!(believed_at(1_000, 9_000), Some(5_000));
        assert_eq!(believed_at(1_000, 1_000 + FIRED_WITHIN_NS), Some(11_000));
    }

    #[test]
    fn an_event_on_an_idle_stream_maps_to_its_record_whatever_the_references_query_saw() {
        // The card fetches an event `latency` after its record call begins; the
        // reference's query loop first sees it fired `poll` after that.
        for (latency, poll) in [(1_500, 300), (2_500, 4_000), (900, 12_000)] {
            let reference_recorded = 1_000_000;
            let reference_fired = reference_recorded + latency;
            let believed = believed_at(reference_recorded, reference_fired + poll).unwrap();
            // A start event recorded 5 ms later on an idle stream.
            let recorded = reference_recorded + 5_000_000;
            let since = (recorded + latency - reference_fired) as i64;
            assert_eq!(as_if_recorded(reference_recorded, since), recorded);
            // Its firing time on the host's clock is off by the query's guess instead.
            let fired = believed as i64 + since;
            assert_ne!(fired, (recorded + latency) as i64, "{latency} {poll}");
        }
        // One that waited for work queued before it, ending 40 us after its record:
        // the reference's latency before the work ended.
        let (reference_recorded, latency) = (1_000_000, 1_500);
        let work_ended = reference_recorded + 5_000_000 + 40_000;
        let since = (work_ended - (reference_recorded + latency)) as i64;
        assert_eq!(
            as_if_recorded(reference_recorded, since),
            work_ended - latency
        );
    }

    #[test]
    fn a_sample_that_finished_after_the_slow_path_read_its_clock_is_placed_where_it_fired() {
        let (now, seen) = (10_000_000_000, 10_000_030_000);
        // Fired 10 us after the slow path's clock read, seen 20 us later: believed.
        assert_eq!(believable(now + 10_000, seen, now), Some(now + 10_000));
        assert_eq!(believable(now - 5_000, seen, now), Some(now - 5_000));
        // Placed a little past the sighting: the reference's own error, the sighting.
        assert_eq!(believable(seen + PLACED_WITHIN_NS, seen, now), Some(seen));
        // Further past it, or seconds old: not believed.
        assert_eq!(believable(seen + PLACED_WITHIN_NS + 1, seen, now), None);
        assert_eq!(believable(now - CLOCK_REFRESH_NS * 4 - 1, seen, now), None);
        // A sighting read before the slow path's clock (cannot happen) counts as then.
        assert_eq!(believable(now, now - 1, now), Some(now));
    }

    #[test]
    fn a_reference_that_waited_for_its_slice_is_not_believed() {
        // Two milliseconds behind another context's slice: its time is the slice's end.
        assert_eq!(believed_at(1_000, 2_001_000), None);
        assert_eq!(believed_at(1_000, 1_001 + FIRED_WITHIN_NS), None);
        // A clock read before the record (cannot happen; never a wrap to a huge gap).
        assert_eq!(believed_at(5_000, 4_000), None);
    }
}
