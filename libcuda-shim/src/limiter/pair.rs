//! Samples of two launches: what a short kernel costs the card when it is launched
//! behind its stream's own queued work, which a sample of one launch cannot show.
//!
//! A sample's start event makes the kernel after it wait until the event has fired,
//! and only then is the kernel set up; launched behind queued work, a kernel is set up
//! while the one before it runs. So a sample of one short kernel times its set-up too
//! (on an H100, BENCHMARKS run 14: 4.46 us for launches 2.2 us apart), and a loop of
//! them charged that per launch is held below what it is due. Every other sample of a
//! short kernel therefore brackets two launches: the start event, the sampled launch,
//! the same thread's next launch on the same stream, then the end event. Against the
//! two kernels' single estimates, the pair shows the second's set-up
//! (`duty::pair_setup`), and the median of the recent ones (`duty::setup_from`) is
//! what launches placed behind queued work are not charged (`duty::behind_cost`).
//!
//! A pair opens only from a sample placed behind its stream's queued work, of a kernel
//! whose single samples are steady (`duty::Steadiness`). Only a pair whose second
//! launch was placed behind the first teaches (it was set up
//! while the first ran); a second launch that found the stream idle shows no set-up,
//! and a pair that timed a neighbour's slice shows less, so errors lean towards
//! charging more. While a pair waits for its second launch, launches that find a sample
//! slot open take the slow path (`DeviceLimiter::pair_open`), where the thread whose
//! pair it is closes it; a launch of that thread on another stream, of an unknown
//! kernel, or after another launch went on the stream between (its projection moved),
//! drops it, and so does any launch after `PATIENCE_NS`.

use std::sync::atomic::Ordering;

use vgpu_contract::clock::monotonic_ns;

use super::sample::Sample;
use super::trace::{self, Counter, Part};
use super::{DeviceLimiter, Slow, Target, duty};
use crate::cuda::*;
use crate::state::real;

/// The env var that turns samples of two launches off (`off`): every sample brackets
/// one launch, and no set-up is learned.
pub const PAIRS_ENV: &str = "VGPU_LIMITER_PAIRS";

/// Whether `VGPU_LIMITER_PAIRS` leaves pairs on (anything but `off`).
pub(super) fn allowed() -> bool {
    std::env::var_os(PAIRS_ENV).is_none_or(|value| value != "off")
}

/// How many recent pairs the set-up is the median of (`duty::setup_from` takes at
/// most `duty::SETUPS_MOST`).
pub(super) const RECENT: usize = 9;
const _: () = assert!(RECENT <= duty::SETUPS_MOST);
/// A pair whose second launch has not come within this long is dropped.
const PATIENCE_NS: u64 = 200_000;

/// A sample of two launches whose first has gone out: its end event is recorded after
/// the same thread's next launch on the same stream.
pub(super) struct OpenPair {
    thread: u64,
    stream_key: u64,
    /// The first launch's sample, its end event not recorded yet.
    sample: Sample,
    /// When the next sample is due once the pair closes (the first launch's gap).
    next_sample_ns: u64,
    /// The stream's projected end after the first launch: a launch that finds it moved
    /// is not the stream's next (another went between, on this thread or another).
    stream_end_ns: u64,
}

/// What a settled sample of two launches needs to know besides its events.
#[derive(Clone, Copy, Debug)]
pub(super) struct PairTail {
    /// The first launch's estimate, as it was charged.
    pub(super) first_ns: u64,
    /// The second launch's kernel.
    pub(super) second_key: u64,
    /// Whether the second launch was placed behind the first (only then can the pair
    /// show a set-up).
    pub(super) second_behind: bool,
    /// Host time when the second launch call returned.
    pub(super) second_returned_ns: u64,
}

impl DeviceLimiter {
    /// The set-up launches behind queued work are not charged now.
    #[inline]
    pub(super) fn setup_ns(&self) -> u64 {
        self.setup_ns.load(Ordering::Relaxed)
    }

    /// Whether this sample of the short kernel `key` should open a pair: every other
    /// one of a steady kernel (only pairs of steady kernels teach; the samples of the
    /// rest keep teaching their estimates), and never while a pair is open.
    pub(super) fn pair_turn(&self, slow: &mut Slow, key: u64) -> bool {
        if !self.pairs || slow.pair.is_some() || !is_steady(slow, key) {
            return false;
        }
        slow.pair_next = !slow.pair_next;
        slow.pair_next
    }

    /// Keeps the sample of a launch that just went out as the first of a pair: its end
    /// event waits for the calling thread's next launch on the same stream.
    pub(super) fn open_pair(&self, slow: &mut Slow, target: Target, sample: Sample) {
        let Some(thread) = crate::current::try_thread_tag() else {
            self.drop_sample(slow, sample);
            return;
        };
        slow.pair = Some(OpenPair {
            thread,
            stream_key: target.key(),
            sample,
            next_sample_ns: self.next_sample_ns.load(Ordering::Relaxed),
            stream_end_ns: self.streams.busy_until(target.key()),
        });
        // Launches that find a sample slot open come to the slow path until it closes.
        self.next_sample_ns.store(0, Ordering::Relaxed);
        self.pair_open.store(true, Ordering::Release);
    }

    /// The calling thread's open pair, if this launch on `target` (of a `known` kernel)
    /// is its second; drops a pair that this launch shows will not get one.
    fn take_pair(&self, target: Target, known: bool, now_ns: u64) -> Option<OpenPair> {
        if !self.pair_open.load(Ordering::Acquire) {
            return None;
        }
        let mut slow = self.lock();
        let open = slow.pair.as_ref()?;
        let mine = crate::current::try_thread_tag() == Some(open.thread);
        let second = mine
            && known
            && open.stream_key == target.key()
            && self.streams.busy_until(open.stream_key) == open.stream_end_ns;
        let late = now_ns.saturating_sub(open.sample.returned_ns) > PATIENCE_NS;
        if !(second || mine || late) {
            return None;
        }
        let open = slow.pair.take()?;
        self.pair_open.store(false, Ordering::Release);
        self.next_sample_ns
            .store(open.next_sample_ns, Ordering::Relaxed);
        if second {
            return Some(open);
        }
        trace::count(Counter::PairsDropped);
        self.drop_sample(&mut slow, open.sample);
        None
    }

    /// Puts a sample's events back in its context's pool, under the `Slow` lock held.
    fn drop_sample(&self, slow: &mut Slow, sample: Sample) {
        slow.pools
            .entry(sample.context)
            .or_default()
            .extend([sample.start, sample.end]);
    }

    /// Runs `launch` as the second launch of the calling thread's open pair, if this
    /// launch is one (`Ok`: the real launch's result), charged as any launch behind
    /// queued work, and records the pair's end event after it.
    pub(super) fn second_of_pair<F: FnOnce() -> CUresult>(
        &self,
        key: u64,
        target: Target,
        known: Option<duty::Estimate>,
        launch: F,
    ) -> Result<CUresult, F> {
        let Some(open) = self.take_pair(target, known.is_some(), monotonic_ns()) else {
            return Err(launch);
        };
        let cost = known.map(|known| known.cost_ns).unwrap_or(0);
        self.wait_turn(false, Some((target, cost)));
        let now = monotonic_ns();
        let rate = self.rate();
        let result = launch();
        let second_returned_ns = monotonic_ns();
        let mut sample = open.sample;
        if result != CUDA_SUCCESS {
            self.give_back(sample.context, &[sample.start, sample.end]);
            return Ok(result);
        }
        let setup = self.setup_ns();
        let (start, _) = self.charge(key, target, cost, setup, now, rate);
        let charged = duty::placed_cost(start, now, cost, setup);
        let record = real!(cuEventRecord as fn(CUevent, CUstream) -> CUresult);
        let events_started = trace::ticks();
        // SAFETY: the pair's end event, of the current context (the first launch's, on
        // the same thread and stream), recorded on the caller's stream.
        let recorded = unsafe { record(sample.end, target.stream()) } == CUDA_SUCCESS;
        trace::part(Part::Events, events_started);
        if !recorded {
            self.give_back(sample.context, &[sample.start, sample.end]);
            return Ok(result);
        }
        let first_ns = sample.projected_ns;
        // Projected as one launch from the first's start to the second's end.
        sample.projected_ns = start
            .saturating_add(charged)
            .saturating_sub(sample.projected_start);
        sample.pair = Some(PairTail {
            first_ns,
            second_key: key,
            second_behind: start > now,
            second_returned_ns,
        });
        let returned = monotonic_ns();
        sample.end_recorded_ns = returned;
        let mut slow = self.lock();
        slow.pending.push_back(sample);
        self.settle(&mut slow, returned, false);
        Ok(result)
    }

    /// Notes how far a single sample of `key` (`measured_ns`) lay from its estimate.
    pub(super) fn note_steadiness(
        &self,
        slow: &mut Slow,
        key: u64,
        measured_ns: u64,
        estimate_ns: u64,
    ) {
        let seen = slow.seen_mut(key);
        seen.steadiness = seen.steadiness.fold(measured_ns, estimate_ns);
    }

    /// What a settled pair of `first_key` and the tail's second (`kernels_ns` between its
    /// events, the idle gap before its first launch taken off) teaches: the second
    /// launch's set-up, when it was placed behind the first and both kernels are known
    /// and steady.
    pub(super) fn learn_setup(
        &self,
        slow: &mut Slow,
        first_key: u64,
        tail: PairTail,
        kernels_ns: u64,
    ) {
        trace::count(Counter::Paired);
        if !tail.second_behind || !is_steady(slow, first_key) || !is_steady(slow, tail.second_key) {
            return;
        }
        let Some(second) = self.estimates.get(tail.second_key) else {
            return;
        };
        let Some(setup) = duty::pair_setup(tail.first_ns, second.cost_ns, kernels_ns) else {
            return;
        };
        trace::count(Counter::PairsTaught);
        if slow.setups.len() >= RECENT {
            slow.setups.pop_front();
        }
        slow.setups.push_back(setup);
        let setup = duty::setup_from(slow.setups.make_contiguous());
        self.setup_ns.store(setup, Ordering::Relaxed);
    }
}

/// Whether `key`'s single samples say its cost is steady (`duty::Steadiness`).
fn is_steady(slow: &Slow, key: u64) -> bool {
    slow.seen
        .get(&key)
        .is_some_and(|seen| seen.steadiness.is_steady())
}
