//! A virtual-time model of the limiter's launch policy against a card, for tests: the
//! real bucket and union (`shared::Shared`), the real stream projections
//! (`tables::Streams`) and the real ride-along rule (`duty::rides_along`), driven by one
//! thread that launches round-robin on several streams (at most `DEPTH` queued on each,
//! as a program reading its results does) onto a card that runs `fit` kernels at once.
//! Time is the model's own, so the judgement does not depend on the machine running it.

use std::collections::VecDeque;
use std::sync::atomic::AtomicU64;

use vgpu_contract::region::CONTAINER_LIMITER_WORDS;

use super::shared::Shared;
use super::tables::Streams;
use super::{MIN_SLEEP_NS, REFILL_NS, SLEEP_SLICE_NS, WINDOW_NS, duty};

/// Kernels queued per stream before the thread waits for the oldest.
const DEPTH: usize = 4;

/// One modelled run.
pub struct Run {
    pub streams: usize,
    /// The kernel's run time on the card.
    pub kernel_ns: u64,
    /// What the limiter has learned a launch costs (a sample includes the wait for SMs
    /// behind the container's own kernels, so more than `kernel_ns` when they queue).
    pub estimate_ns: u64,
    /// Kernels the card runs at once.
    pub fit: usize,
    /// Host time one launch call takes.
    pub call_ns: u64,
    /// A call takes up to this many times `call_ns` more, drawn per call.
    pub jitter: u64,
    pub limit_percent: u32,
    pub run_ns: u64,
}

/// What the card did: its busy fraction (the union of kernel runs) per `window_ns`
/// window, in percent.
pub fn card_busy_percent(run: &Run, window_ns: u64) -> Vec<f64> {
    let words: [AtomicU64; CONTAINER_LIMITER_WORDS] = std::array::from_fn(|_| AtomicU64::new(0));
    let shared = Shared::new(&words, WINDOW_NS);
    let streams = Streams::new(64);
    let rate = duty::percent_ppm(run.limit_percent);
    // Start far from zero, as the monotonic clock does.
    let t0 = 1_000 * duty::SECOND_NS;
    let mut now = t0;
    let mut slots = vec![t0; run.fit];
    let mut queued: Vec<VecDeque<u64>> = vec![VecDeque::new(); run.streams];
    let mut runs: Vec<(u64, u64)> = Vec::new();
    let mut next = 0usize;
    let mut jitter = 0x2545_f491_4f6c_dd1du64;
    let not_blocking = |_: bool| 0u64;
    while now < t0 + run.run_ns {
        let lane = next % run.streams;
        next += 1;
        let key = lane as u64 + 1;
        if queued[lane].len() == DEPTH
            && let Some(oldest) = queued[lane].pop_front()
        {
            now = now.max(oldest);
        }
        // The fast path's check, then the slow path's wait (which re-checks the ride).
        loop {
            let held = shared.hold(now, rate, || REFILL_NS);
            if held == 0 {
                break;
            }
            let start = streams.would_start(key, now, not_blocking);
            let added = duty::union_increment(
                start,
                start.saturating_add(run.estimate_ns),
                shared.horizon(now),
            );
            if duty::rides_along(added, run.estimate_ns, shared.delay(now, rate), rate) {
                break;
            }
            now += held.clamp(MIN_SLEEP_NS, SLEEP_SLICE_NS);
        }
        // The card: first come, first served on the earliest free SMs.
        let (slot, free) = slots
            .iter()
            .copied()
            .enumerate()
            .min_by_key(|&(_, free)| free)
            .unwrap_or((0, now));
        let begins = now.max(free);
        let ends = begins + run.kernel_ns;
        slots[slot] = ends;
        queued[lane].push_back(ends);
        runs.push((begins, ends));
        // The limiter's charge.
        let placed = streams.place(key, now, (run.estimate_ns, 0), not_blocking, 0, || false);
        let (added, _) = shared.extend(placed.start, placed.end, now);
        shared.charge(added as i64, now, rate);
        // A launch call's time varies (an LCG: the model stays deterministic).
        jitter = jitter
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        now += run.call_ns + (jitter >> 33) % (run.call_ns * run.jitter + 1);
    }
    busy_per_window(&runs, t0, run.run_ns, window_ns)
}

/// The union of `runs` (sorted by start) in each window of `[t0, t0 + run_ns)`.
fn busy_per_window(runs: &[(u64, u64)], t0: u64, run_ns: u64, window_ns: u64) -> Vec<f64> {
    let windows = (run_ns / window_ns) as usize;
    let mut busy = vec![0u64; windows];
    let mut covered_to = t0;
    for &(begins, ends) in runs {
        let (from, to) = (begins.max(covered_to), ends.min(t0 + run_ns));
        covered_to = covered_to.max(ends);
        let mut at = from;
        while at < to {
            let window = ((at - t0) / window_ns) as usize;
            let window_end = t0 + (window as u64 + 1) * window_ns;
            let piece = to.min(window_end) - at;
            busy[window] += piece;
            at += piece;
        }
    }
    busy.iter()
        .map(|&ns| ns as f64 * 100.0 / window_ns as f64)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: u64 = 1_000;
    const MS: u64 = 1_000_000;

    /// CI of cea03dc: one thread on 8 streams of quarter-card 100 us kernels at 30 ran
    /// the card at 100 % for 0.7 s. Paced by the saturated card, with launch calls slow
    /// enough (a debug build on a busy machine), each launch added no more than a quarter
    /// of its learned cost (which includes the wait for SMs) to the union, so every
    /// launch "rode along" and the bucket's debt grew without a hold. Under that rule
    /// the model runs the card at 93-100 % in 9 of these 36 cases; the ride is now
    /// bounded by the debt. Estimates are what samples learn here: a kernel's run and
    /// its wait behind the container's others (`streams / fit` kernels' time).
    #[test]
    fn a_round_robin_paced_by_a_full_card_cannot_ride_past_its_debt() {
        let mut wrong = Vec::new();
        for streams in [4, 8, 16] {
            for call_us in [2, 10, 20, 30] {
                for jitter in [0, 1, 3] {
                    let run = Run {
                        streams,
                        kernel_ns: 100 * US,
                        estimate_ns: 100 * US * streams as u64 / 4,
                        fit: 4,
                        call_ns: call_us * US,
                        jitter,
                        limit_percent: 30,
                        run_ns: 2_000 * MS,
                    };
                    let windows = card_busy_percent(&run, 100 * MS);
                    let worst = windows.iter().copied().fold(0.0, f64::max);
                    let mean = windows.iter().sum::<f64>() / windows.len() as f64;
                    if worst > 36.0 || !(27.0..=31.5).contains(&mean) {
                        wrong.push(format!(
                            "{streams} streams, calls of {call_us} us (jitter {jitter}): mean {mean:.1}%, windows {windows:.1?}"
                        ));
                    }
                }
            }
        }
        assert!(wrong.is_empty(), "{wrong:#?}");
    }

    /// The model can fail: without a limit's holds (a limit of 100) the same thread
    /// fills the card (after its first window: the estimate, twice the kernel, is
    /// charged from an empty bucket until the first samples settle).
    #[test]
    fn the_model_fills_the_card_without_a_limit() {
        let run = Run {
            streams: 8,
            kernel_ns: 100 * US,
            estimate_ns: 200 * US,
            fit: 4,
            call_ns: 2 * US,
            jitter: 4,
            limit_percent: 100,
            run_ns: 500 * MS,
        };
        let windows = card_busy_percent(&run, 100 * MS);
        assert!(windows[1..].iter().all(|&w| w > 95.0), "{windows:.1?}");
    }
}
