//! The slow path: a launch that must wait its turn (the bucket is in debt), that is
//! sampled (bracketed by two events on its stream), or whose kernel is not known yet.
//! It may take the `Slow` lock (never across a sleep or the launch) and call the driver
//! for events; waits sleep in slices so that rate changes and exit are seen.

use std::sync::atomic::Ordering;
use std::time::Duration;

use vgpu_contract::clock::monotonic_ns;
use vgpu_contract::limiter_words::slot as slot_words;

use super::lifecycle::SWITCHES;
use super::sample::{Charged, RelaxedCapture, Sample, destroy_events};
use super::trace::{self, Counter, Part};
use super::{
    DeviceLimiter, FIRST_MEASURE_PATIENCE_NS, MAX_PENDING, MAX_PENDING_KNOWN, MIN_SLEEP_NS,
    POOL_TARGET, SLEEP_SLICE_NS, Slow, Target, Work, duty, kernel_key,
};
use crate::cuda::*;
use crate::state::real;

impl DeviceLimiter {
    /// The slow path: waits its turn, measures the launch if it should be, charges it.
    pub(super) fn slow_launch(
        &self,
        work: Work,
        target: Target,
        estimate: Option<(duty::Estimate, bool)>,
        launch: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let key = work.key();
        let launch =
            match self.second_of_pair(key, target, estimate.map(|(known, _)| known), launch) {
                Ok(result) => return result,
                Err(launch) => launch,
            };
        let mut unknown = estimate.is_none();
        // An unknown kernel whose function is known with a grid of a nearby class goes
        // out charged a seed from it, without waiting for other first measurements.
        let seed = if unknown { self.seed(work) } else { None };
        if unknown {
            trace::count(Counter::Unknown);
        }
        let ride = estimate.map(|(known, _)| known.cost_ns).or(seed);
        self.wait_turn(unknown && seed.is_none(), ride.map(|cost| (target, cost)));
        // Another thread's sample may have taught the cost meanwhile.
        let known = match estimate {
            Some((known, _)) => Some(known),
            None => self.estimates.get(key),
        };
        unknown &= known.is_none();
        let seed = seed.filter(|_| unknown);
        if seed.is_some() {
            trace::count(Counter::Seeded);
        }
        let due = unknown || estimate.is_some_and(|(_, due)| due);
        let now = monotonic_ns();
        let gap_started =
            due && !unknown && known.is_some_and(|k| k.cost_ns < duty::ALWAYS_SAMPLE_NS);
        if gap_started && let Some(known) = known {
            let gap = duty::sample_gap_ns(
                known.samples,
                self.overlapped_lately(now),
                self.agreeing_samples.load(Ordering::Relaxed),
            );
            if gap == duty::QUIET_SAMPLE_GAP_NS {
                trace::count(Counter::QuietGaps);
            }
            self.next_sample_ns.store(now + gap, Ordering::Relaxed);
        }
        let rate = self.rate();
        let cost = known.map(|k| k.cost_ns).or(seed).unwrap_or(0);
        let events_started = trace::ticks();
        let bracket = if due {
            self.begin_sample(target, !unknown)
        } else {
            None
        };
        trace::part(Part::Events, events_started);
        if unknown && bracket.is_none() {
            trace::count(Counter::UnknownUnmeasured);
        }
        let result = launch();
        let returned = monotonic_ns();
        if result != CUDA_SUCCESS {
            if let Some((context, start, end, _)) = bracket {
                self.give_back(context, &[start, end]);
            }
            // A refused launch measured nothing: the gap it started is reopened, or a
            // program whose refused launches come first after each wait (a probe
            // before every real launch) would give every due sample to one of them:
            // 6 samples in a second of 3,700 real launches, the estimate left at its
            // first sample's 81-87 us of a 100 us kernel and the container at 34-37 % of
            // the card at 30.
            if gap_started {
                self.next_sample_ns.store(now, Ordering::Relaxed);
            }
            return result;
        }
        // A bracketed kernel is set up behind its start event: its whole estimate.
        let setup = if bracket.is_some() {
            0
        } else {
            self.setup_ns()
        };
        let (projected_start, horizon_before) = self.charge(key, target, cost, setup, now, rate);
        let Some((context, start, end, recorded_ns)) = bracket else {
            return result;
        };
        trace::count(Counter::Sampled);
        let mut sample = Sample {
            key,
            stream_key: target.key(),
            context,
            start,
            end,
            charged: match (unknown, seed) {
                (false, _) => Charged::Estimate,
                (true, Some(_)) => Charged::Seed,
                (true, None) => Charged::Nothing,
            },
            projected_start,
            projected_ns: cost,
            horizon_before,
            recorded_ns,
            returned_ns: returned,
            end_recorded_ns: returned,
            // The projection's guess, used only where the GPU's own timestamps cannot
            // say (no reference event in this context).
            projected_idle: projected_start == now,
            pair: None,
        };
        // A pair teaches only where the launches queue behind each other: on a stream
        // the projection finds busy (on an idle one, H100 run 17: a host-bound decode
        // loop's pairs taught nothing, and it ran at 0.70x of bare against 0.95x).
        if gap_started && projected_start > now {
            let mut slow = self.lock();
            if self.pair_turn(&mut slow, key) {
                self.open_pair(&mut slow, target, sample);
                return result;
            }
        }
        let record = real!(cuEventRecord as fn(CUevent, CUstream) -> CUresult);
        let events_started = trace::ticks();
        // SAFETY: an event of the current context, recorded on the caller's stream.
        let recorded = unsafe { record(end, target.stream()) } == CUDA_SUCCESS;
        trace::part(Part::Events, events_started);
        if !recorded {
            self.give_back(context, &[start, end]);
            return result;
        }
        sample.end_recorded_ns = monotonic_ns();
        if sample.holds_unknowns_back() {
            self.unknown_in_flight.fetch_add(1, Ordering::AcqRel);
        }
        let mut slow = self.lock();
        slow.pending.push_back(sample);
        self.settle(&mut slow, returned, false);
        result
    }

    /// A seed for the first launch of `work`, a kernel with a grid whose class is not
    /// learned yet: from the nearest class of the same function that is
    /// (`duty::seed_classes`, `duty::seed_cost`). A graph, or a function not learned
    /// within an octave of grids, has none.
    fn seed(&self, work: Work) -> Option<u64> {
        let Work::Kernel { function, blocks } = work else {
            return None;
        };
        if function == 0 {
            return None;
        }
        duty::seed_classes(duty::grid_class(blocks)).find_map(|class| {
            self.estimates
                .get(kernel_key(function, class))
                .map(|known| duty::seed_cost(known.cost_ns, class, blocks))
                // A seed of nothing would be corrected by nothing (its rescaling is of
                // nothing): such a kernel is measured first, as an unknown one is.
                .filter(|&seed| seed > 0)
        })
    }

    /// Waits until the container may launch again: not at all while the bucket is not in
    /// debt; once it is, until the debt is paid and the bucket has refilled what
    /// `refill_ns` says. An unknown kernel also waits (at most
    /// `FIRST_MEASURE_PATIENCE_NS`) for the measurement under way of another unknown one,
    /// so a queue of long kernels cannot slip past before anything is known.
    pub(super) fn wait_turn(&self, unknown: bool, ride: Option<(Target, u64)>) {
        let started = monotonic_ns();
        // All this launch's sleeps, and those of them for another's first measurement.
        let (mut waited, mut waited_for_measurement) = (0, 0);
        loop {
            let now = monotonic_ns();
            self.maintain(now);
            let rate = self.rate();
            let mut delay = self.shared.hold(now, rate, || self.refill_ns(now));
            if delay > 0
                && let Some((target, cost)) = ride
                && self.rides_along(target, cost, now, rate)
            {
                delay = 0;
            }
            let (sleep, for_measurement) = if delay > 0 {
                (delay.clamp(MIN_SLEEP_NS, SLEEP_SLICE_NS), false)
            } else if unknown
                && self.unknown_in_flight.load(Ordering::Acquire) > 0
                && now.saturating_sub(started) < FIRST_MEASURE_PATIENCE_NS
            {
                trace::count(Counter::FirstMeasurementWaits);
                (100_000, true)
            } else {
                (0, false)
            };
            if sleep == 0 || SWITCHES.exiting.load(Ordering::Relaxed) {
                trace::most(Counter::LongestWaitNs, waited);
                trace::most(
                    Counter::LongestFirstMeasurementWaitNs,
                    waited_for_measurement,
                );
                return;
            }
            waited += sleep;
            if for_measurement {
                waited_for_measurement += sleep;
            }
            if let Some(words) = self.mine {
                words[slot_words::WAITED_NS].fetch_add(sleep, Ordering::Relaxed);
            }
            // The container's own total (the region's counter block), which outlives
            // this process: one relaxed add, beside a sleep of at least MIN_SLEEP_NS.
            self.region.add_throttled(self.visible.region_index, sleep);
            trace::count(Counter::Waits);
            trace::add(Counter::WaitedNs, sleep);
            self.stamp_active(now);
            let sleeping = trace::ticks();
            std::thread::sleep(Duration::from_nanos(sleep));
            trace::slept(sleeping);
        }
    }

    /// Records the start event of a sampled launch (of a `known` kernel, or the first
    /// measurement of an unknown one): (context, start, end, when). The context is asked
    /// of the driver (one call, on sampled launches only): events must be the context's
    /// that is really current, whatever made it current.
    pub(super) fn begin_sample(
        &self,
        target: Target,
        known: bool,
    ) -> Option<(usize, CUevent, CUevent, u64)> {
        let Some((context, _)) = crate::current::refresh() else {
            trace::count(Counter::SkippedNoEvents);
            return None;
        };
        if crate::current::refresh_was_stale() {
            trace::count(Counter::StaleContext);
        }
        let (start, end) = {
            let mut slow = self.lock();
            let room = if known {
                MAX_PENDING_KNOWN
            } else {
                MAX_PENDING
            };
            if slow.pending.len() >= room {
                trace::count(Counter::SkippedPending);
                return None;
            }
            let events = take_event(&mut slow, context).and_then(|start| {
                match take_event(&mut slow, context) {
                    Some(end) => Some((start, end)),
                    None => {
                        slow.pools.entry(context).or_default().push(start);
                        None
                    }
                }
            });
            let Some(events) = events else {
                trace::count(Counter::SkippedNoEvents);
                return None;
            };
            events
        };
        let record = real!(cuEventRecord as fn(CUevent, CUstream) -> CUresult);
        // SAFETY: events of the current context, recorded on the caller's stream.
        if unsafe { record(start, target.stream()) } != CUDA_SUCCESS {
            trace::count(Counter::SkippedNoEvents);
            destroy_events(&[start, end]);
            return None;
        }
        Some((context, start, end, monotonic_ns()))
    }

    pub(super) fn give_back(&self, context: usize, events: &[CUevent]) {
        self.lock()
            .pools
            .entry(context)
            .or_default()
            .extend_from_slice(events);
    }
}

pub(super) fn take_event(slow: &mut Slow, context: usize) -> Option<CUevent> {
    let pool = slow.pools.entry(context).or_default();
    if let Some(event) = pool.pop() {
        return Some(event);
    }
    let create = real!(cuEventCreate as fn(*mut CUevent, u32) -> CUresult);
    let _relaxed = RelaxedCapture::enter();
    while pool.len() < POOL_TARGET / 2 {
        let mut event = std::ptr::null_mut();
        // SAFETY: valid out-pointer; default flags (timing on).
        if unsafe { create(&mut event, 0) } != CUDA_SUCCESS || event.is_null() {
            break;
        }
        pool.push(event);
    }
    pool.pop()
}
