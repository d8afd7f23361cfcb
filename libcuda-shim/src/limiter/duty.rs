//! The compute limiter's arithmetic, with no FFI and no clock of its own (every method
//! takes `now` in nanoseconds), so it is tested with a fake clock:
//!
//! - `DutyCycle`: a token bucket of GPU time. It fills at `percent` of wall time, holds
//!   at most `percent` of one window (the burst), and each launch spends what it costs.
//!   A launch waits while the bucket is in debt, so busy time / wall time converges on
//!   the limit, and a kernel longer than the window is paid for after it ran (its cost
//!   puts the bucket in debt; the next launch waits the debt off).
//! - `Estimates`: what one launch of a kernel (or a graph) costs, learned from sampled
//!   measurements, so most launches need no measurement of their own.
//! - `RecentBusy`: the busy and demand fractions over the last publish interval.
//! - `effective_percent`: what soft and hard mode allow, given contention.

use std::collections::HashMap;

use vgpu_common::CoreMode;

/// Nanoseconds per second.
pub const SECOND_NS: u64 = 1_000_000_000;
/// The most debt the bucket carries: a pathological kernel can never cause a wait
/// longer than this divided by the rate.
pub const MAX_DEBT_NS: i64 = 4 * SECOND_NS as i64;

/// A token bucket of GPU time.
#[derive(Clone, Debug)]
pub struct DutyCycle {
    /// Fill rate, parts per million of wall time.
    rate_ppm: u64,
    window_ns: u64,
    /// GPU nanoseconds that may still be spent; negative is debt.
    tokens_ns: i64,
    last_ns: u64,
}

impl DutyCycle {
    /// A full bucket for `percent` (1-100) of the card over windows of `window_ns`.
    pub fn new(percent: u32, window_ns: u64, now_ns: u64) -> DutyCycle {
        let mut bucket = DutyCycle {
            rate_ppm: 0,
            window_ns: window_ns.max(1),
            tokens_ns: 0,
            last_ns: now_ns,
        };
        bucket.rate_ppm = percent_ppm(percent);
        bucket.tokens_ns = bucket.capacity();
        bucket
    }

    fn capacity(&self) -> i64 {
        (self.window_ns as u128 * self.rate_ppm as u128 / 1_000_000) as i64
    }

    /// The current rate, percent.
    pub fn percent(&self) -> u32 {
        (self.rate_ppm / 10_000) as u32
    }

    /// Changes the rate (soft mode moving between its ceiling and its share); what was
    /// earned so far is kept, the burst shrinks to the new capacity.
    pub fn set_percent(&mut self, percent: u32, now_ns: u64) {
        self.refill(now_ns);
        self.rate_ppm = percent_ppm(percent);
        self.tokens_ns = self.tokens_ns.min(self.capacity());
    }

    fn refill(&mut self, now_ns: u64) {
        let elapsed = now_ns.saturating_sub(self.last_ns);
        self.last_ns = self.last_ns.max(now_ns);
        let earned =
            (elapsed as u128 * self.rate_ppm as u128 / 1_000_000).min(i64::MAX as u128) as i64;
        self.tokens_ns = self.tokens_ns.saturating_add(earned).min(self.capacity());
    }

    /// Spends `cost_ns` of GPU time (a launch, or the correction once a measurement
    /// settles; negative gives back an over-estimate).
    pub fn charge(&mut self, cost_ns: i64, now_ns: u64) {
        self.refill(now_ns);
        self.tokens_ns = self
            .tokens_ns
            .saturating_sub(cost_ns)
            .clamp(-MAX_DEBT_NS, self.capacity());
    }

    /// How long the next launch must wait: 0 when the bucket is not in debt.
    pub fn delay(&mut self, now_ns: u64) -> u64 {
        self.refill(now_ns);
        if self.tokens_ns >= 0 || self.rate_ppm == 0 {
            return 0;
        }
        ((-self.tokens_ns) as u128 * 1_000_000).div_ceil(self.rate_ppm as u128) as u64
    }

    /// GPU time that may still be spent now (negative is debt).
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn tokens(&mut self, now_ns: u64) -> i64 {
        self.refill(now_ns);
        self.tokens_ns
    }
}

fn percent_ppm(percent: u32) -> u64 {
    percent.clamp(1, 100) as u64 * 10_000
}

/// What soft and hard mode allow: hard always `limit`; soft `ceiling` (default 100) while
/// no other container on the card is busy, `limit` as soon as one is.
pub fn effective_percent(mode: CoreMode, limit: u32, ceiling: Option<u32>, contended: bool) -> u32 {
    match mode {
        CoreMode::Hard => limit,
        CoreMode::Soft if contended => limit,
        CoreMode::Soft => ceiling.unwrap_or(100).max(limit),
    }
}

/// A learned cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Estimate {
    pub cost_ns: u64,
    pub samples: u32,
    /// Launches since the last sample was taken.
    pub since_sample: u32,
}

/// Per-kernel (or per-graph) costs learned from sampled measurements: an exponential
/// average that follows a change of input size within a few samples.
#[derive(Debug, Default)]
pub struct Estimates {
    by_key: HashMap<u64, Estimate>,
}

/// One process's part of its container's `percent` when `processes` of the container
/// are active on the card: an even split, at least 1%.
pub fn share_of(percent: u32, processes: u32) -> u32 {
    (percent / processes.max(1)).max(1)
}

/// Launches between two samples of a short kernel.
pub const SAMPLE_EVERY: u32 = 8;
/// Kernels at least this long are measured every launch (the events cost nothing next to them).
pub const ALWAYS_SAMPLE_NS: u64 = 1_000_000;
/// The most keys remembered (a program that makes kernels forever must not grow us).
const MAX_KEYS: usize = 4096;

impl Estimates {
    pub fn get(&self, key: u64) -> Option<Estimate> {
        self.by_key.get(&key).copied()
    }

    /// Whether this launch of `key` should be measured, and counts the launch.
    pub fn should_sample(&mut self, key: u64) -> bool {
        match self.by_key.get_mut(&key) {
            None => true,
            Some(estimate) => {
                estimate.since_sample += 1;
                estimate.since_sample >= SAMPLE_EVERY || estimate.cost_ns >= ALWAYS_SAMPLE_NS
            }
        }
    }

    /// Folds in one measurement of `key`.
    pub fn record(&mut self, key: u64, measured_ns: u64) {
        if self.by_key.len() >= MAX_KEYS && !self.by_key.contains_key(&key) {
            self.by_key.clear();
        }
        let estimate = self.by_key.entry(key).or_insert(Estimate {
            cost_ns: measured_ns,
            samples: 0,
            since_sample: 0,
        });
        estimate.cost_ns = if estimate.samples == 0 {
            measured_ns
        } else {
            (estimate.cost_ns * 3 + measured_ns) / 4
        };
        estimate.samples = estimate.samples.saturating_add(1);
        estimate.since_sample = 0;
    }
}

/// Busy and demand over the current publish interval.
#[derive(Clone, Debug)]
pub struct RecentBusy {
    started_ns: u64,
    busy_ns: u64,
    waited_ns: u64,
    launches: u64,
}

/// One closed interval's figures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Interval {
    pub busy_permille: u32,
    pub demand_permille: u32,
    pub launches: u64,
}

impl RecentBusy {
    pub fn new(now_ns: u64) -> RecentBusy {
        RecentBusy {
            started_ns: now_ns,
            busy_ns: 0,
            waited_ns: 0,
            launches: 0,
        }
    }

    pub fn add_busy(&mut self, busy_ns: u64) {
        self.busy_ns = self.busy_ns.saturating_add(busy_ns);
    }

    pub fn add_wait(&mut self, waited_ns: u64) {
        self.waited_ns = self.waited_ns.saturating_add(waited_ns);
    }

    pub fn add_launch(&mut self) {
        self.launches += 1;
    }

    /// Closes the interval if it is at least `length_ns` old.
    pub fn close(&mut self, now_ns: u64, length_ns: u64) -> Option<Interval> {
        let elapsed = now_ns.saturating_sub(self.started_ns);
        if elapsed < length_ns || elapsed == 0 {
            return None;
        }
        let permille = |ns: u64| (ns.saturating_mul(1000) / elapsed).min(1000) as u32;
        let interval = Interval {
            busy_permille: permille(self.busy_ns),
            demand_permille: permille(self.busy_ns.saturating_add(self.waited_ns)),
            launches: self.launches,
        };
        *self = RecentBusy::new(now_ns);
        Some(interval)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// A GPU with one stream and a program that launches `kernel_ns` kernels back to back
    /// as fast as the limiter lets it, with the cost charged at launch (what the shim does
    /// once a kernel's cost is learned). Returns each kernel's [start, end) on the GPU.
    fn run(percent: u32, kernel_ns: u64, wall_ns: u64) -> Vec<(u64, u64)> {
        let mut bucket = DutyCycle::new(percent, 10 * MS, 0);
        let (mut host, mut gpu_free) = (0u64, 0u64);
        let mut kernels = Vec::new();
        while host < wall_ns {
            host += bucket.delay(host);
            // The host may not run ahead of the GPU by more than a small queue.
            let start = host.max(gpu_free);
            gpu_free = start + kernel_ns;
            kernels.push((start, gpu_free));
            bucket.charge(kernel_ns as i64, host);
            host += 5_000; // launch overhead
            if gpu_free > host + 2 * kernel_ns {
                host = gpu_free - 2 * kernel_ns;
            }
        }
        kernels
    }

    fn busy_in(kernels: &[(u64, u64)], from: u64, to: u64) -> u64 {
        kernels
            .iter()
            .map(|&(s, e)| e.min(to).saturating_sub(s.max(from)))
            .sum()
    }

    #[test]
    fn converges_on_the_limit_for_short_and_long_kernels() {
        for percent in [10, 30, 50, 70] {
            for kernel in [100_000, MS, 10 * MS] {
                let kernels = run(percent, kernel, 2 * SECOND_NS);
                let fraction =
                    busy_in(&kernels, 0, 2 * SECOND_NS) as f64 / (2 * SECOND_NS) as f64 * 100.0;
                assert!(
                    (fraction - percent as f64).abs() <= 2.0,
                    "{percent}% with {kernel} ns kernels gave {fraction:.1}%"
                );
            }
        }
    }

    #[test]
    fn hard_limit_holds_in_every_100ms_window() {
        for percent in [10, 30, 70] {
            for kernel in [100_000, MS, 10 * MS] {
                let kernels = run(percent, kernel, 2 * SECOND_NS);
                let worst = (0..19)
                    .map(|i| {
                        busy_in(&kernels, i * 100 * MS, (i + 1) * 100 * MS) as f64
                            / (100 * MS) as f64
                            * 100.0
                    })
                    .fold(0.0f64, f64::max);
                assert!(
                    worst <= percent as f64 + 10.0,
                    "{percent}% with {kernel} ns kernels: worst window {worst:.1}%"
                );
            }
        }
    }

    #[test]
    fn a_kernel_longer_than_the_window_is_paid_after() {
        let mut bucket = DutyCycle::new(30, 20 * MS, 0);
        assert_eq!(bucket.delay(0), 0);
        bucket.charge((50 * MS) as i64, 0);
        // 50 ms against a 6 ms burst at 30%: (50 - 6) / 0.3 ms of waiting.
        let wait = bucket.delay(0);
        assert!(
            (wait as i64 - (44 * MS * 10 / 3) as i64).abs() < 1_000,
            "{wait}"
        );
        assert_eq!(bucket.delay(wait), 0);
    }

    #[test]
    fn debt_is_bounded_and_idle_time_does_not_bank_beyond_the_burst() {
        let mut bucket = DutyCycle::new(10, 20 * MS, 0);
        bucket.charge(100 * SECOND_NS as i64, 0);
        assert_eq!(bucket.tokens(0), -MAX_DEBT_NS);
        assert_eq!(bucket.delay(0), MAX_DEBT_NS as u64 * 10);
        // A long idle spell refills only the burst: 10% of 20 ms.
        assert_eq!(bucket.tokens(1000 * SECOND_NS), 2 * MS as i64);
    }

    #[test]
    fn rate_changes_keep_the_debt_and_shrink_the_burst() {
        let mut bucket = DutyCycle::new(100, 20 * MS, 0);
        assert_eq!(bucket.tokens(0), 20 * MS as i64);
        bucket.set_percent(25, 0);
        assert_eq!(bucket.tokens(0), 5 * MS as i64);
        bucket.charge((15 * MS) as i64, 0);
        assert_eq!(bucket.delay(0), 40 * MS);
        assert_eq!(bucket.percent(), 25);
    }

    #[test]
    fn soft_mode_uses_its_ceiling_only_while_uncontended() {
        assert_eq!(effective_percent(CoreMode::Hard, 30, None, false), 30);
        assert_eq!(effective_percent(CoreMode::Soft, 30, None, false), 100);
        assert_eq!(effective_percent(CoreMode::Soft, 30, Some(50), false), 50);
        assert_eq!(effective_percent(CoreMode::Soft, 30, Some(50), true), 30);
    }

    #[test]
    fn estimates_sample_new_short_and_long_kernels_as_designed() {
        let mut estimates = Estimates::default();
        assert!(estimates.should_sample(1), "an unknown kernel is measured");
        estimates.record(1, 100_000);
        let sampled = (0..SAMPLE_EVERY * 4).filter(|_| {
            let sample = estimates.should_sample(1);
            if sample {
                estimates.record(1, 100_000);
            }
            sample
        });
        assert_eq!(
            sampled.count(),
            4,
            "one short launch in {SAMPLE_EVERY} is measured"
        );
        estimates.record(2, 10 * MS);
        assert!(
            estimates.should_sample(2) && estimates.should_sample(2),
            "long kernels are measured every launch"
        );
        // The average follows a change of size.
        for _ in 0..12 {
            estimates.record(1, 300_000);
        }
        let cost = estimates.get(1).map(|e| e.cost_ns).unwrap_or(0);
        assert!((290_000..=300_000).contains(&cost), "{cost}");
    }

    #[test]
    fn a_containers_limit_is_split_among_its_active_processes() {
        assert_eq!(share_of(60, 1), 60);
        assert_eq!(share_of(60, 2), 30);
        assert_eq!(share_of(10, 3), 3);
        assert_eq!(share_of(2, 8), 1, "never zero");
        assert_eq!(share_of(30, 0), 30);
    }

    #[test]
    fn recent_busy_reports_fractions_per_interval() {
        let mut recent = RecentBusy::new(0);
        recent.add_busy(6 * MS);
        recent.add_wait(10 * MS);
        recent.add_launch();
        assert_eq!(recent.close(10 * MS, 20 * MS), None);
        let interval = recent.close(20 * MS, 20 * MS).expect("closed");
        assert_eq!(
            interval,
            Interval {
                busy_permille: 300,
                demand_permille: 800,
                launches: 1
            }
        );
        assert_eq!(
            recent.close(40 * MS, 20 * MS).map(|i| i.busy_permille),
            Some(0)
        );
    }
}
