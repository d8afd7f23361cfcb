//! The fast path: what every launch under a compute limit does when it is not sampled
//! and the bucket is not in debt. It takes no lock and makes no syscall or driver call:
//! one load of `SWITCHES.limits` and a branch for an unlimited process; under a limit, the
//! device (`lifecycle::sole_device`, a word of the same line where the process has one
//! limited device and no capture may be under way; else `crate::current` and a capture
//! check, `hooks::capture::possible`), one clock read (`super::fast_clock`: the
//! time-stamp counter where the kernel keeps time with it, else the vDSO), the kernel's
//! estimate (one fetch-add in `tables::Estimates`), the bucket's hold check (two
//! loads), then after the real launch the stream's projection (one compare-and-swap in `tables::Streams`), the container's union (one
//! fetch-max on the region's horizon when the launch extends it), the bucket (one
//! compare-and-swap on the region) and this process's unpublished busy time (one
//! fetch-add). Anything else (a sample due, a hold, the publish tick, an unknown kernel)
//! goes to `super::slow`.
//!
//! Before all that, a launch the calling thread's tab covers (`super::tab`: the same
//! short kernel on the same stream, on busy time borrowed from the bucket) reads one
//! line of the tab and the clock and runs; the device and the capture check come after
//! the real launch, and it is projected on the tab alone: no read-modify-write and no line
//! of the tables or the region. A launch the tab does not cover pays it first; a
//! fast-path launch that repeats the thread's last and finds the bucket with credit to
//! lend opens the next. Placed behind its stream's queued work, a launch is projected
//! without the set-up its samples timed (`super::pair`).
//!
//! What it costs, measured over the simulated driver (not a GPU figure): about 475
//! instructions in the shim per limited launch (`tests/bench/launch_cost.sh` with
//! callgrind; the hook's forwarding is 75 of them), five read-modify-writes and one clock
//! read; 53-55 ns of wall time in one `--cores 99` process against the driver's own
//! `cuLaunchKernel` in alternating blocks (`streams launch-ab` of the GPU suite; 5-7 ns
//! with a memory quota only). On the H200 the same instructions took +353-398 ns (run
//! 12): the real driver's launch evicts the shim's lines between launches, so what
//! counts there is lines touched, and each structure on this path is laid out for that
//! (docs/compute-limiter.md, "What a launch costs"); [`DeviceLimiter::prefetch`] asks for
//! the lines after the device's first at once. `VGPU_LIMITER_TRACE` reports the path's
//! own time (`fast_path_own_ns`, the real launch left out), and the slow path's
//! (`slow_path_own_ns`, its sleeps left out too). Sampling adds two `cuEventRecord`s
//! and two elapsed times (`Sample::read`) to one launch of a short kernel per
//! `duty::sample_gap_ns`: 200 us apart while the kernel is learned or the process's
//! kernels overlap, else 1 ms once it has 32 samples (on the H200, run 12, the 200 us gap
//! sampled one launch in 40 of a 4 us loop, the 1 ms gap one in 205), and 4 ms while the
//! device's samples agree with their estimates.
use std::sync::atomic::Ordering;

use vgpu_contract::cardview;
use vgpu_contract::limiter_words::slot as slot_words;

use super::lifecycle::{LIMITS_NONE, SWITCHES, sole_device};
use super::trace::{self, Counter};
use super::{
    ACTIVE_STAMP_NS, CONCURRENT_LATELY_NS, DeviceLimiter, LEGACY_KEY, REFILL_NS, Target, Work,
    current_limited, duty,
};
use super::{tab, tables};
use crate::cuda::*;
use crate::hooks::capture;
use crate::state::real;

/// Runs `launch` (the real launch) for `work` on `target`, throttled and measured when
/// the current device has a compute limit; returns what the real launch returned.
#[inline]
pub fn launch(work: Work, target: Target, launch: impl FnOnce() -> CUresult) -> CUresult {
    if SWITCHES.limits.load(Ordering::Relaxed) == LIMITS_NONE {
        return launch();
    }
    limited_launch(work, target, launch)
}

/// Throttles only (no measurement): for launches that span devices or streams in a way
/// events cannot bracket (cuLaunchCooperativeKernelMultiDevice).
pub fn throttle_only(launch: impl FnOnce() -> CUresult) -> CUresult {
    if SWITCHES.limits.load(Ordering::Relaxed) == LIMITS_NONE {
        return launch();
    }
    if let Some(device) = current_limited() {
        device.wait_turn(false, None);
    }
    launch()
}

/// A launch under a limit: on the thread's tab when it covers the launch (`super::tab`,
/// kept apart from the rest so that its few instructions stay together), else
/// [`per_launch`].
#[inline(never)]
pub(super) fn limited_launch(
    work: Work,
    target: Target,
    launch: impl FnOnce() -> CUresult,
) -> CUresult {
    let started = trace::ticks();
    let (key, stream) = (work.key(), target.key());
    match tab::run(key, target, stream, started, launch) {
        Ok(result) => result,
        Err(launch) => per_launch(work, target, (key, stream), started, launch),
    }
}

/// A launch the thread's tab does not cover: the fast path, else `super::slow`.
#[inline(never)]
fn per_launch(
    work: Work,
    target: Target,
    (key, stream): (u64, u64),
    started: u64,
    launch: impl FnOnce() -> CUresult,
) -> CUresult {
    let device = match sole_device() {
        Some(device) => device,
        None => {
            let Some(device) = current_limited() else {
                trace::count(Counter::NoDevice);
                return launch();
            };
            if capture::possible() && is_capturing(target) {
                trace::count(Counter::Captured);
                return launch();
            }
            device
        }
    };
    device.prefetch(key, stream);
    trace::count(Counter::Launches);
    let now = SWITCHES.clock.now_ns();
    let rate = device.rate();
    let sample_open = now >= device.next_sample_ns.load(Ordering::Relaxed);
    let estimate = device
        .estimates
        .count_launch(key, sample_open, duty::sample_every(now));
    if trace::on() {
        device.traced.count(&device.estimates, key, 1);
    }
    // A sample of two launches waiting for its second keeps the sample slot open.
    let pair_open = sample_open && device.pair_open.load(Ordering::Relaxed);
    // Whether the bucket's hold is what sends this launch the slow way (for the trace).
    let mut held = false;
    if let Some((known, false)) = estimate
        && !pair_open
        && {
            held = device.shared.hold(now, rate, || device.refill_ns(now)) != 0
                && !device.rides_along(target, known.cost_ns, now, rate);
            !held
        }
        && now < device.next_publish_ns.load(Ordering::Relaxed)
    {
        let launching = trace::ticks();
        let result = launch();
        let launched = trace::ticks();
        if result == CUDA_SUCCESS {
            trace::count(Counter::FastPath);
            let charged = device.charge(key, target, known.cost_ns, device.setup_ns(), now, rate);
            device.open_tab(key, stream, known.cost_ns, charged, now, rate);
            trace::own(started, launching, launched);
        }
        return result;
    }
    if held {
        trace::count(Counter::Held);
    }
    // The slow path's own time, its real launch left out (`trace::slow`; the readings
    // are 0 and nothing is added when tracing is off).
    let mut real_launch = 0;
    let result = device.slow_launch(work, target, estimate, || {
        let launching = trace::ticks();
        let result = launch();
        real_launch = trace::ticks().wrapping_sub(launching);
        result
    });
    trace::slow(started, real_launch);
    result
}

/// Whether `target`'s stream is capturing (or capture forbids asking): then the launch
/// is recorded into a graph, not run, and must be neither delayed nor bracketed.
pub(super) fn is_capturing(target: Target) -> bool {
    let is_capturing = real!(cuStreamIsCapturing as fn(CUstream, *mut u32) -> CUresult);
    let mut status = CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: valid out-pointer; the stream is the caller's.
    match unsafe { is_capturing(target.stream(), &mut status) } {
        CUDA_SUCCESS => status != CU_STREAM_CAPTURE_STATUS_NONE,
        // A capture error: a capture is going on around this call.
        CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED..=CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD => true,
        _ => false,
    }
}

impl DeviceLimiter {
    /// Starts loading the lines an unsampled launch of the kernel `key` on the stream
    /// `stream` (their table keys) touches beyond the limiter's first: their slots, the
    /// container's words and the limiter's written line. The real driver's launch evicts
    /// them between launches; asked for together, their misses overlap.
    #[inline]
    fn prefetch(&self, key: u64, stream: u64) {
        self.estimates.prefetch(key);
        self.streams.prefetch(stream);
        self.shared.prefetch();
        tables::prefetch(&self.unpublished);
    }

    /// Projects a launch of the kernel `key` (its cost-table key, for the trace) of
    /// `cost_ns` on `target` at `now_ns` and charges what it adds to the container's
    /// union; returns its projected start and the horizon before it. Placed behind queued
    /// work, it is projected without `setup_ns` (`super::pair`).
    pub(super) fn charge(
        &self,
        key: u64,
        target: Target,
        cost_ns: u64,
        setup_ns: u64,
        now_ns: u64,
        rate: u64,
    ) -> (u64, u64) {
        let placed = self.streams.place(
            target.key(),
            now_ns,
            (cost_ns, setup_ns),
            self.floor(target, now_ns),
            self.shared.horizon(now_ns),
            || target.is_blocking(),
        );
        let (added, before) = self.shared.extend(placed.start, placed.end, now_ns);
        if before > placed.start {
            self.note_concurrent(now_ns);
        }
        let scaled = self.scaled(added as i64);
        self.shared.charge(scaled, now_ns, rate);
        trace::add(Counter::ChargedNs, added);
        trace::add(Counter::ChargedScaledNs, scaled as u64);
        if trace::on() {
            self.traced.charge(&self.estimates, key, added as i64);
        }
        self.add_unpublished(added, 1);
        self.stamp_active(now_ns);
        (placed.start, before)
    }

    /// `ns` of measured busy time as the bucket is charged it: scaled by the host's
    /// correction factor (`duty::scale_permille`: no 128-bit division).
    pub(super) fn scaled(&self, ns: i64) -> i64 {
        let permille = self.charge_permille.load(Ordering::Relaxed);
        if permille == cardview::CHARGE_UNIT || ns == 0 {
            return ns;
        }
        duty::scale_permille(ns, permille)
    }

    /// What a stream of `target`'s kind waits for before its work starts at `now_ns`:
    /// the legacy stream for all of its context's blocking streams (the process's
    /// horizon stands in); a blocking stream for the legacy one.
    pub(super) fn floor(&self, target: Target, now_ns: u64) -> impl Fn(bool) -> u64 + '_ {
        let legacy = target.is_legacy();
        move |blocking: bool| {
            if legacy {
                self.shared.horizon(now_ns)
            } else if blocking {
                self.streams.busy_until(LEGACY_KEY)
            } else {
                0
            }
        }
    }

    /// Whether a launch of `cost_ns` on `target` at `now_ns` may go although launches
    /// are held (`duty::rides_along`): it would run almost entirely within work the
    /// container has queued already, and the bucket owes little. Without it a hold could
    /// fall between the streams of one round of concurrent kernels and leave them
    /// unbalanced, each lagging stream then paying in full for what would have
    /// overlapped; the debt bound keeps riding to that round.
    pub(super) fn rides_along(&self, target: Target, cost_ns: u64, now_ns: u64, rate: u64) -> bool {
        if cost_ns == 0 {
            return false;
        }
        let start = self
            .streams
            .would_start(target.key(), now_ns, self.floor(target, now_ns));
        let added = duty::union_increment(
            start,
            start.saturating_add(cost_ns),
            self.shared.horizon(now_ns),
        );
        duty::rides_along(added, cost_ns, self.shared.delay(now_ns, rate), rate)
    }

    /// A launch at `now_ns` overlapped other queued work of this process: held launches
    /// wait for the refill for `CONCURRENT_LATELY_NS` (written at most twice a second).
    fn note_concurrent(&self, now_ns: u64) {
        let until = &self.concurrent_until_ns;
        if now_ns.saturating_add(CONCURRENT_LATELY_NS / 2) > until.load(Ordering::Relaxed) {
            until.store(
                now_ns.saturating_add(CONCURRENT_LATELY_NS),
                Ordering::Relaxed,
            );
        }
    }

    /// Whether this process's kernels have overlapped each other lately (a launch
    /// started while other work of the process was still queued).
    pub(super) fn overlapped_lately(&self, now_ns: u64) -> bool {
        now_ns < self.concurrent_until_ns.load(Ordering::Relaxed)
    }

    /// How much refill a held launch waits for beyond the debt at `now_ns`: `REFILL_NS`
    /// while this process's work has overlapped lately, else none.
    pub(super) fn refill_ns(&self, now_ns: u64) -> u64 {
        if self.overlapped_lately(now_ns) {
            REFILL_NS
        } else {
            0
        }
    }

    /// Writes this process's activity word at most every `ACTIVE_STAMP_NS`; the
    /// launches in between read only `next_stamp_ns`, on the limiter's own line, not
    /// the region's.
    pub(super) fn stamp_active(&self, now_ns: u64) {
        if now_ns < self.next_stamp_ns.load(Ordering::Relaxed) {
            return;
        }
        self.next_stamp_ns
            .store(now_ns.saturating_add(ACTIVE_STAMP_NS), Ordering::Relaxed);
        if let Some(words) = self.mine {
            words[slot_words::ACTIVE_NS].store(now_ns, Ordering::Relaxed);
        }
    }
}
