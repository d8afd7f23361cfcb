//! Settling samples: reading the end events of sampled launches once they have fired,
//! teaching each kernel's cost to `tables::Estimates`, and correcting the bucket and the
//! projections by where the kernel really ran on the card (placed on the host's clock by
//! `super::clock`). Runs under the `Slow` lock, from the slow path and the publish tick.

use std::sync::atomic::Ordering;

use super::clock::{GpuClock, Reference, believable};
use super::sample::{Charged, Reading, RelaxedCapture, Sample, Timed, destroy_events};
use super::trace::{self, Counter, Part};
use super::{DeviceLimiter, SETTLE_EVERY_NS, Slow, duty};
use vgpu_contract::clock::monotonic_ns;

impl DeviceLimiter {
    /// Reads finished samples: learns their cost and corrects the bucket by what their
    /// measured run adds to the union beyond what was charged. Rate-limited unless
    /// `force`. Events of one stream complete in order, so only the oldest pending
    /// sample of each stream is asked about: with the GPU far behind the host, one call
    /// per stream, not one per pending sample.
    pub(super) fn settle(&self, slow: &mut Slow, now_ns: u64, force: bool) {
        if slow.pending.is_empty()
            || (!force && now_ns.saturating_sub(slow.last_settle_ns) < SETTLE_EVERY_NS)
        {
            return;
        }
        slow.last_settle_ns = now_ns;
        let started = trace::ticks();
        self.settle_finished(slow, now_ns);
        trace::part(Part::Settle, started);
        trace::count(Counter::Settles);
    }

    /// `settle`'s work: every stream's oldest pending sample asked about, in relaxed
    /// capture mode, and each finished one settled.
    fn settle_finished(&self, slow: &mut Slow, now_ns: u64) {
        let _relaxed = RelaxedCapture::enter();
        let rate = self.rate();
        // Streams whose oldest pending sample is still running.
        let mut running: Vec<u64> = Vec::new();
        let mut index = 0;
        while index < slow.pending.len() {
            let stream_key = slow.pending[index].stream_key;
            if running.contains(&stream_key) {
                index += 1;
                continue;
            }
            let reference = reference(slow, slow.pending[index].context, now_ns);
            let timed = match slow.pending[index].read(reference) {
                Reading::Running => {
                    running.push(stream_key);
                    index += 1;
                    continue;
                }
                Reading::Failed => None,
                // Seen finished now, perhaps well after `now_ns`.
                Reading::Timed(timed) => Some((timed, monotonic_ns())),
            };
            let Some(sample) = slow.pending.remove(index) else {
                break;
            };
            if sample.holds_unknowns_back() {
                self.unknown_in_flight.fetch_sub(1, Ordering::AcqRel);
            }
            self.settle_one(slow, sample, timed, reference, now_ns, rate);
        }
    }

    /// Learns from one finished sample (`timed`: what its events said and when it was
    /// seen finished; `None`: they are no good) and corrects the bucket and the
    /// projections by where it really ran (placed by its context's `reference` where one
    /// stands).
    pub(super) fn settle_one(
        &self,
        slow: &mut Slow,
        sample: Sample,
        timed: Option<(Timed, u64)>,
        reference: Option<Reference>,
        now_ns: u64,
        rate: u64,
    ) {
        let Some((timed, seen_ns)) = timed else {
            // A destroyed context or a failed launch: the events are no good.
            trace::count(Counter::Dropped);
            slow.pools.remove(&sample.context);
            slow.clocks.remove(&sample.context);
            destroy_events(&[sample.start, sample.end]);
            return;
        };
        trace::count(Counter::Settled);
        let elapsed_ns = timed.elapsed_ns;
        // When its events fired on the host's clock, by the context's reference event
        // (where it says something believable: `clock::believable`; seen finished at
        // `seen_ns`, perhaps well after `now_ns`).
        let placed = reference.zip(timed.since_reference);
        let end_fired = placed
            .map(|(reference, (_, end))| reference.fired(end))
            .and_then(|at| believable(at, seen_ns, now_ns));
        let start_as_if_recorded = placed
            .map(|(reference, (start, _))| reference.as_if_recorded(start))
            .and_then(|at| believable(at, seen_ns, now_ns));
        if end_fired.is_none() {
            trace::count(Counter::PlacedByProjection);
        }
        let gap = sample.idle_gap_ns(start_as_if_recorded);
        // An end event recorded late may have fired at its record, after the kernel
        // ended: then the sample timed the thread's delay (`duty::is_doubtful`).
        let measured = Sample::kernel_ns(elapsed_ns, gap);
        let (after_last, delay) = sample.end_record_delay(measured, end_fired);
        let late = duty::is_doubtful(after_last, delay);
        // A pair teaches the set-up, not a kernel's cost; it is corrected as one known
        // launch over its projection's span.
        let ns = match sample.pair {
            Some(_) if late => {
                trace::count(Counter::DoubtfulSamples);
                measured.min(sample.projected_ns)
            }
            Some(tail) => {
                self.learn_setup(slow, sample.key, tail, measured);
                measured
            }
            None => self.learn(slow, &sample, (elapsed_ns, gap, late), now_ns),
        };
        // Where it really ended, else where its projection put it (also where the end
        // event fired late: its time is the thread's, not the kernel's).
        let end = end_fired
            .filter(|_| !late)
            .unwrap_or(sample.projected_start.saturating_add(ns));
        let start = end.saturating_sub(ns);
        // A kernel measured for the first time was charged nothing: it pays what its run
        // adds to the union as it stood when it went out; one charged a seed pays the
        // difference between its run and its seed (`duty::seed_correction`). A known one
        // pays only for running past everything queued since (counted once however many
        // samples find the same overrun), and in a process whose kernels have not
        // overlapped lately only for running longer than projected
        // (`duty::settled_overrun`).
        let (beyond_now, _) = self.shared.extend(start, end, now_ns);
        let projected_end = sample.projected_start.saturating_add(sample.projected_ns);
        let overrun = duty::settled_overrun(
            beyond_now,
            ns,
            sample.projected_ns,
            self.overlapped_lately(now_ns),
        ) as i64;
        let mut correction = match sample.charged {
            Charged::Estimate => overrun,
            // A seed projected wholly inside other streams' queued work was charged
            // nothing, and rescaling nothing says nothing of a run that went on past
            // them: it pays as an estimate would, for running past everything queued.
            Charged::Seed => match duty::union_increment(
                sample.projected_start,
                projected_end,
                sample.horizon_before,
            ) {
                0 => overrun,
                charged => duty::seed_correction(sample.projected_ns, charged, ns),
            },
            Charged::Nothing => duty::union_increment(start, end, sample.horizon_before) as i64,
        };
        // A kernel charged from an estimate or a seed that ended before its projection,
        // with nothing of the process queued after it: the projections move back, for
        // the settling of any other to extend again if it ran later. For an estimate the
        // overshoot was charged for nothing (kernels that wait for SMs behind the
        // container's own are projected with the wait, and the last ones of a round do
        // not wait) and is given back; a seed's was already paid back above.
        if sample.charged != Charged::Nothing && self.shared.pull_back(projected_end, end) {
            if sample.known() {
                correction -= (projected_end - end) as i64;
            }
            self.streams
                .pull_back(sample.stream_key, projected_end, end);
        }
        self.shared.charge(self.scaled(correction), now_ns, rate);
        if trace::on() {
            self.traced.charge(&self.estimates, sample.key, correction);
        }
        self.streams.extend(sample.stream_key, end);
        if correction > 0 {
            trace::add(Counter::CorrectedUpNs, correction as u64);
            self.add_unpublished(correction as u64, 0);
        } else if correction < 0 {
            trace::add(Counter::CorrectedDownNs, correction.unsigned_abs());
            self.given_back
                .fetch_add(correction.unsigned_abs(), Ordering::Relaxed);
        }
        slow.pools
            .entry(sample.context)
            .or_default()
            .extend([sample.start, sample.end]);
    }

    /// The kernel's own run from a settled sample that took `elapsed_ns` between its
    /// events with `gap_ns` of it idle before submission, taught to the kernel's
    /// estimate; unless the run may include another context's slice
    /// (`duty::idle_sample_may_time_a_neighbour`): then it teaches only a run near the
    /// estimate (`duty::set_aside_sample_teaches`) and counts as no longer than
    /// projected (a shorter run still gives back what it did not use); or where it
    /// measured its launch call rather than the kernel (`duty::is_doubtful`), or its
    /// thread's delay before the end event's record (`ended_late`, by the same rule):
    /// then it teaches nothing (`duty::sample_teaches`) and a known kernel's counts as
    /// no longer than projected.
    fn learn(
        &self,
        slow: &mut Slow,
        sample: &Sample,
        (elapsed_ns, gap_ns, ended_late): (u64, u64, bool),
        now_ns: u64,
    ) -> u64 {
        // Idle by the GPU's timestamps, or by the projection where the sample started
        // inside the launch call's own time (inflated estimates project a stream busy
        // that the card had finished).
        let started_idle = gap_ns > 0 || sample.projected_idle;
        trace::count(if started_idle {
            Counter::SettledIdle
        } else {
            Counter::SettledBacklogged
        });
        if !started_idle {
            slow.seen_mut(sample.key).set_aside_since_backlogged = Some(0);
        }
        let ns = Sample::kernel_ns(elapsed_ns, gap_ns);
        let measured_backlogged = slow
            .seen
            .get(&sample.key)
            .is_some_and(|seen| seen.set_aside_since_backlogged.is_some());
        if duty::idle_sample_may_time_a_neighbour(
            started_idle,
            sample.known(),
            self.overlapped_lately(now_ns),
            self.neighbours_active.load(Ordering::Relaxed),
            measured_backlogged,
        ) {
            trace::count(Counter::SettledIdleDiscounted);
            self.note_agreement(false, now_ns);
            let set_aside = slow
                .seen
                .get_mut(&sample.key)
                .and_then(|seen| seen.set_aside_since_backlogged.as_mut())
                .map(|since| {
                    *since = since.saturating_add(1);
                    *since
                })
                .unwrap_or(0);
            if self
                .estimates
                .get(sample.key)
                .is_some_and(|known| duty::set_aside_sample_teaches(ns, known.cost_ns, set_aside))
            {
                self.estimates.record(sample.key, ns);
            }
            return ns.min(sample.projected_ns);
        }
        let known = self.estimates.get(sample.key);
        if known.is_none() {
            trace::remember_name(sample.key);
        }
        let doubtful = ended_late || duty::is_doubtful(elapsed_ns, gap_ns);
        let seen = slow.seen_mut(sample.key);
        seen.doubtful_in_a_row = if doubtful {
            seen.doubtful_in_a_row.saturating_add(1)
        } else {
            0
        };
        if !duty::sample_teaches(doubtful, known.is_some(), seen.doubtful_in_a_row) {
            // Its run cannot be told from its launch call's: a known kernel's counts as
            // no longer than projected; an unknown one's pays what the events saw.
            trace::count(Counter::DoubtfulSamples);
            self.note_agreement(false, now_ns);
            return match known {
                Some(_) => ns.min(sample.projected_ns),
                None => ns,
            };
        }
        if let Some(known) = known {
            self.note_steadiness(slow, sample.key, ns, known.cost_ns);
        }
        self.note_agreement(
            known.is_some_and(|known| duty::agrees(ns, known.cost_ns)),
            now_ns,
        );
        self.estimates.record(sample.key, ns);
        ns
    }

    /// Counts a settled single sample that agreed with its kernel's estimate
    /// (`duty::agrees`), or starts the count again (`duty::sample_gap_ns`) at `now_ns`:
    /// where the device's samples were quiet, the next sample then comes at most
    /// `duty::SETTLED_SAMPLE_GAP_NS` from now, not at the end of the quiet gap its own
    /// sample started (settled after its gap was chosen).
    fn note_agreement(&self, agreed: bool, now_ns: u64) {
        let agreeing = &self.agreeing_samples;
        if agreed {
            agreeing.store(
                agreeing.load(Ordering::Relaxed).saturating_add(1),
                Ordering::Relaxed,
            );
        } else if agreeing.swap(0, Ordering::Relaxed) >= duty::QUIET_SAMPLES {
            self.next_sample_ns.fetch_min(
                now_ns.saturating_add(duty::SETTLED_SAMPLE_GAP_NS),
                Ordering::Relaxed,
            );
        }
    }
}

/// The reference event usable now in `context` (`GpuClock::reference`), its clock made
/// where there is none yet and the context is the calling thread's (its stream must be
/// made in the sample's own context).
fn reference(slow: &mut Slow, context: usize, now_ns: u64) -> Option<Reference> {
    let clock = match slow.clocks.entry(context) {
        std::collections::hash_map::Entry::Occupied(entry) => Some(entry.into_mut()),
        std::collections::hash_map::Entry::Vacant(entry)
            if crate::current::current().is_some_and(|(current, _)| current == context) =>
        {
            GpuClock::new().map(|clock| entry.insert(clock))
        }
        std::collections::hash_map::Entry::Vacant(_) => None,
    }?;
    clock.reference(slow.pools.entry(context).or_default(), now_ns)
}
