//! Measuring a launch: the two events that bracket a sampled launch (`Sample`, read
//! back when the end event has fired: `Sample::read`, through `elapsed_ns`) and the
//! relaxed stream-capture mode the limiter's own event calls run in (`RelaxedCapture`).
//! Where event times fall on the host's clock is `super::clock`'s; what a settled sample
//! does to the bucket is `super::settle`'s; this file only measures.

use super::clock::Reference;
use super::duty;
use super::pair::PairTail;
use crate::cuda::*;
use crate::state::real;

/// A bracketed launch whose end event has not been read yet.
pub(super) struct Sample {
    pub(super) key: u64,
    pub(super) stream_key: u64,
    pub(super) context: usize,
    pub(super) start: CUevent,
    pub(super) end: CUevent,
    /// What its launch was charged, which decides what its settling pays.
    pub(super) charged: Charged,
    /// Its projection (start, and the cost it was projected with), and the union's
    /// horizon before it.
    pub(super) projected_start: u64,
    pub(super) projected_ns: u64,
    pub(super) horizon_before: u64,
    /// Host times: just after the start event was recorded, and when the launch call
    /// returned (by then the kernel was submitted).
    pub(super) recorded_ns: u64,
    pub(super) returned_ns: u64,
    /// Host time just after its end event was recorded (behind the pair's second launch
    /// where it is a pair): how late that was is `end_record_delay`'s.
    pub(super) end_recorded_ns: u64,
    /// Whether the projection had the stream idle at the launch.
    pub(super) projected_idle: bool,
    /// Set when the events bracket two launches (`super::pair`); the fields above are
    /// the first's.
    pub(super) pair: Option<PairTail>,
}

/// What a sampled launch was charged when it went out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Charged {
    /// Its kernel's estimate (`Sample::projected_ns`): it pays only for running past
    /// its projection (`duty::settled_overrun`).
    Estimate,
    /// A seed from its function's nearest known class of grid (`duty::seed_cost`, in
    /// `Sample::projected_ns`): its kernel's first measurement, which pays the new part
    /// of its seed rescaled to its run, less that part (`duty::seed_correction`); or,
    /// where no part of the seed was new (it hid in other streams' queued work), what an
    /// estimate would pay for running past everything queued.
    Seed,
    /// Nothing: an unknown kernel's first measurement, which pays what its run added.
    Nothing,
}

impl Sample {
    /// Whether it was charged its kernel's estimate (a known kernel's sample).
    pub(super) fn known(&self) -> bool {
        self.charged == Charged::Estimate
    }

    /// Whether it is a first measurement that other unknown launches wait for
    /// (`DeviceLimiter::wait_turn`): an unknown kernel's, charged nothing.
    pub(super) fn holds_unknowns_back(&self) -> bool {
        self.charged == Charged::Nothing
    }

    /// The host time from the start event to the kernel's submission that the GPU spent
    /// idle on this stream, which must not be charged: on a stream with nothing queued
    /// the start event fires at once, and the kernel only runs once the launch call has
    /// submitted it, and the card spends the same fetch latency on the kernel after the
    /// launch returned as on the event after its record. `start_ns` is when the start
    /// event would have been recorded had it fired at once (`Reference::as_if_recorded`:
    /// on an idle stream, at its record call, so the gap is the whole launch call); where
    /// that is unknown, the projection's guess stands in. A stream with work queued fires
    /// the start event when that work ends, after the launch returned: no gap.
    ///
    /// The GPU's own timestamp, not the projection, must decide: a projection that ran
    /// behind the card would make every backlogged sample look idle and cut its cost,
    /// shortening the projection further (and the other way round), until the estimates
    /// stand at a quarter of the truth or include every launch's host time.
    pub(super) fn idle_gap_ns(&self, start_ns: Option<u64>) -> u64 {
        let most = self.returned_ns.saturating_sub(self.recorded_ns);
        match start_ns {
            Some(start) => self.returned_ns.saturating_sub(start).min(most),
            None if self.projected_idle => most,
            None => 0,
        }
    }

    /// The arguments of `duty::is_doubtful` for its end: how long after its last launch returned its
    /// end event fired (at `end_fired_ns` on the host's clock where that is known; else
    /// what of `measured_ns`, its `kernel_ns`, came after that return, which is no later
    /// than the event fired), and how long after that return the event was recorded.
    pub(super) fn end_record_delay(
        &self,
        measured_ns: u64,
        end_fired_ns: Option<u64>,
    ) -> (u64, u64) {
        let last_returned_ns = self
            .pair
            .map_or(self.returned_ns, |tail| tail.second_returned_ns);
        let after_last = match end_fired_ns {
            Some(fired_ns) => fired_ns.saturating_sub(last_returned_ns),
            None => measured_ns.saturating_sub(last_returned_ns.saturating_sub(self.returned_ns)),
        };
        (
            after_last,
            self.end_recorded_ns.saturating_sub(last_returned_ns),
        )
    }

    /// The kernel's own GPU time from the events' elapsed time and the idle gap.
    pub(super) fn kernel_ns(elapsed_ns: u64, idle_gap_ns: u64) -> u64 {
        elapsed_ns
            .saturating_sub(idle_gap_ns)
            .max(duty::measured_floor_ns(elapsed_ns))
    }
}

/// What a pending sample's events say when its settle asks (`Sample::read`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Reading {
    /// Its end event has not fired.
    Running,
    /// Its events are no good (a failed launch, a destroyed context).
    Failed,
    /// Both fired.
    Timed(Timed),
}

/// A finished sample's times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Timed {
    /// The GPU time between its events, ns.
    pub(super) elapsed_ns: u64,
    /// From its context's reference event (`super::clock`), where one stands: the GPU
    /// time from the reference to its start event and to its end event, ns.
    pub(super) since_reference: Option<(i64, i64)>,
}

impl Sample {
    /// Asks the driver about this sample's events: with a `reference`, two elapsed
    /// times (reference to end, then reference to start), which also say whether the end
    /// has fired and give the time between the events as their difference; without one,
    /// or where the reference's calls fail otherwise, one elapsed time between the events.
    ///
    /// A settle asked a query, the elapsed time between the events and both times from
    /// the reference before: four calls, each 2.8-4.0 us on an H100 in a launch loop
    /// (`costs.c`'s cold parts, BENCHMARKS run 23), 11 us a settle.
    pub(super) fn read(&self, reference: Option<Reference>) -> Reading {
        let between = || elapsed_ns(self.start, self.end).map(|ns| ns.max(0) as u64);
        match reference {
            Some(reference) => reading(
                Some((reference.since(self.end), || reference.since(self.start))),
                between,
            ),
            None => reading(None::<(_, fn() -> _)>, between),
        }
    }
}

/// The GPU time from the event `from` to the event `to` (both of the current context),
/// ns; the driver's error where it has none (`CUDA_ERROR_NOT_READY`: one has not fired
/// yet), and `CUDA_ERROR_INVALID_VALUE` for a time that is not a number.
pub(super) fn elapsed_ns(from: CUevent, to: CUevent) -> Result<i64, CUresult> {
    let elapsed = real!(cuEventElapsedTime as fn(*mut f32, CUevent, CUevent) -> CUresult);
    let mut ms = 0f32;
    // SAFETY: valid out-pointer; the events are the limiter's own, created and recorded
    // in one context.
    match unsafe { elapsed(&mut ms, from, to) } {
        CUDA_SUCCESS if ms.is_finite() => Ok((ms as f64 * 1e6) as i64),
        CUDA_SUCCESS => Err(CUDA_ERROR_INVALID_VALUE),
        error => Err(error),
    }
}

/// `Sample::read`'s judgement from the driver's answers: `from_reference`, the time from
/// the reference to the end event and the call for the time to the start event (made
/// only once the end has fired); `between`, the call for the time between the events
/// (made only where the reference does not say).
fn reading(
    from_reference: Option<(
        Result<i64, CUresult>,
        impl FnOnce() -> Result<i64, CUresult>,
    )>,
    between: impl FnOnce() -> Result<u64, CUresult>,
) -> Reading {
    if let Some((to_end, to_start)) = from_reference {
        match to_end {
            Err(CUDA_ERROR_NOT_READY) => return Reading::Running,
            Ok(end) => {
                if let Ok(start) = to_start() {
                    return Reading::Timed(Timed {
                        elapsed_ns: end.saturating_sub(start).max(0) as u64,
                        since_reference: Some((start, end)),
                    });
                }
            }
            // The reference's own trouble: the events between them say.
            Err(_) => {}
        }
    }
    match between() {
        Ok(elapsed_ns) => Reading::Timed(Timed {
            elapsed_ns,
            since_reference: None,
        }),
        Err(CUDA_ERROR_NOT_READY) => Reading::Running,
        Err(_) => Reading::Failed,
    }
}

pub(super) fn destroy_events(events: &[CUevent]) {
    let destroy = real!(cuEventDestroy_v2 as fn(CUevent) -> CUresult);
    for event in events {
        // SAFETY: an event we created; destroying a stale handle only returns an error.
        unsafe { destroy(*event) };
    }
}

/// Puts the calling thread in relaxed stream-capture mode for the guard's lifetime, so
/// the limiter's event calls neither fail nor invalidate a global-mode capture on another
/// thread. Always, not only while a capture is known: another thread may begin one
/// between that check and the calls (a sampled launch's settle then invalidated a
/// capture beside it, seen once in a fresh machine's test run). Two driver calls, made
/// where samples are read or events made, never on the fast path.
pub(super) struct RelaxedCapture(Option<u32>);

impl RelaxedCapture {
    pub(super) fn enter() -> RelaxedCapture {
        let exchange = real!(cuThreadExchangeStreamCaptureMode as fn(*mut u32) -> CUresult);
        let mut mode = CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: valid in/out pointer.
        let ok = unsafe { exchange(&mut mode) } == CUDA_SUCCESS;
        RelaxedCapture(ok.then_some(mode))
    }
}

impl Drop for RelaxedCapture {
    fn drop(&mut self) {
        if let Some(mut previous) = self.0 {
            let exchange = real!(cuThreadExchangeStreamCaptureMode as fn(*mut u32) -> CUresult);
            // SAFETY: valid in/out pointer; restores the thread's own mode.
            unsafe { exchange(&mut previous) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sample whose start event was recorded at 1000 and whose launch returned at
    /// 7000 (host ns), as the projection saw it.
    fn sample(projected_idle: bool) -> Sample {
        Sample {
            key: 1,
            stream_key: 2,
            context: 0,
            start: std::ptr::null_mut(),
            end: std::ptr::null_mut(),
            charged: Charged::Estimate,
            projected_start: 0,
            projected_ns: 0,
            horizon_before: 0,
            recorded_ns: 1_000,
            returned_ns: 7_000,
            end_recorded_ns: 8_000,
            projected_idle,
            pair: None,
        }
    }

    #[test]
    fn an_end_record_is_late_from_the_last_launch_its_sample_brackets() {
        let mut late = sample(true);
        late.end_recorded_ns = 600_000;
        // Its kernel measured 593 us from the return (7 us), its end recorded 593 us
        // after it.
        assert_eq!(late.end_record_delay(593_000, None), (593_000, 593_000));
        // Where the reference event places the end's firing, that decides.
        assert_eq!(
            late.end_record_delay(593_000, Some(900_000)),
            (893_000, 593_000)
        );
        // A pair's end is late from its second launch's return (100 us).
        late.pair = Some(PairTail {
            first_ns: 20_000,
            second_key: 3,
            second_behind: true,
            second_returned_ns: 100_000,
        });
        assert_eq!(late.end_record_delay(593_000, None), (500_000, 500_000));
    }

    #[test]
    fn idle_gap_comes_from_the_gpus_timestamps_not_the_projection() {
        // The start event fired at once (an idle stream): the host's 6 us until the
        // kernel was submitted are not the kernel's, whatever the projection thought.
        assert_eq!(sample(false).idle_gap_ns(Some(1_000)), 6_000);
        // It fired after the launch returned (work queued before it): no gap, even
        // where the projection had the stream idle.
        assert_eq!(sample(true).idle_gap_ns(Some(9_000)), 0);
        // Fired during the launch call: the part before the return.
        assert_eq!(sample(true).idle_gap_ns(Some(5_000)), 2_000);
        // No reference event in the context: the projection's guess.
        assert_eq!(sample(true).idle_gap_ns(None), 6_000);
        assert_eq!(sample(false).idle_gap_ns(None), 0);
    }

    #[test]
    fn idle_gap_is_not_charged_but_never_makes_a_kernel_free() {
        assert_eq!(
            Sample::kernel_ns(20_000, 0),
            20_000,
            "a backlogged stream: the events bracket the kernel alone"
        );
        assert_eq!(
            Sample::kernel_ns(20_000, 6_000),
            14_000,
            "an idle stream: the host gap before submission is not GPU time"
        );
        assert_eq!(
            Sample::kernel_ns(20_000, 1_000_000),
            5_000,
            "a descheduled thread's gap is capped"
        );
    }

    #[test]
    fn a_sample_is_read_from_its_reference_in_two_calls_when_one_stands() {
        let never = || -> Result<u64, CUresult> { panic!("the events between were asked") };
        // Fired: the time between the events is the difference of the two from the
        // reference, and the direct call is never made.
        assert_eq!(
            reading(Some((Ok(9_000), || Ok(4_000))), never),
            Reading::Timed(Timed {
                elapsed_ns: 5_000,
                since_reference: Some((4_000, 9_000)),
            })
        );
        // Rounding never makes it negative.
        assert!(matches!(
            reading(Some((Ok(4_000), || Ok(4_001))), never),
            Reading::Timed(Timed { elapsed_ns: 0, .. })
        ));
        // Not fired: running, and the start is not asked.
        let unasked = || -> Result<i64, CUresult> { panic!("the start was asked") };
        assert_eq!(
            reading(Some((Err(CUDA_ERROR_NOT_READY), unasked)), never),
            Reading::Running
        );
    }

    #[test]
    fn a_sample_the_reference_cannot_time_is_read_between_its_events() {
        let timed = |elapsed_ns| {
            Reading::Timed(Timed {
                elapsed_ns,
                since_reference: None,
            })
        };
        // No reference in the context.
        assert_eq!(reading(None::<(_, fn() -> _)>, || Ok(7_000)), timed(7_000));
        assert_eq!(
            reading(None::<(_, fn() -> _)>, || Err(CUDA_ERROR_NOT_READY)),
            Reading::Running
        );
        assert_eq!(
            reading(None::<(_, fn() -> _)>, || Err(CUDA_ERROR_INVALID_HANDLE)),
            Reading::Failed
        );
        // The reference's calls fail for their own reasons: the events say.
        assert_eq!(
            reading(Some((Err(CUDA_ERROR_INVALID_HANDLE), || Ok(1))), || Ok(
                7_000
            )),
            timed(7_000)
        );
        assert_eq!(
            reading(Some((Ok(9_000), || Err(CUDA_ERROR_INVALID_VALUE))), || Ok(
                7_000
            )),
            timed(7_000)
        );
        assert_eq!(
            reading(Some((Err(CUDA_ERROR_INVALID_HANDLE), || Ok(1))), || Err(
                CUDA_ERROR_INVALID_HANDLE
            )),
            Reading::Failed
        );
    }
}
