//! The container's compute budget on one device, shared by all its processes: the token
//! bucket, the union horizon and the rate in force, in the container-wide limiter words
//! of its usage region (`vgpu_contract::limiter_words::container`). Every update is one
//! atomic (a compare-and-swap loop or a fetch-max), so threads and processes spend one
//! budget without a lock, and a process that dies mid-update leaves a valid number.
//!
//! The words are written only by the container's own processes, but the region is a
//! file they can all scribble on: values that cannot be right (a bucket paid further
//! ahead than the most debt allows, a horizon a minute in the future, a rate outside
//! 1-100%) are reset rather than obeyed, so a bad word can neither stall nor free the
//! container for long.

use std::sync::atomic::{AtomicU64, Ordering};

use vgpu_contract::limiter_words::container::{HELD_UNTIL_NS, HORIZON_NS, PAID_UNTIL_NS, RATE_PPM};
use vgpu_contract::region::CONTAINER_LIMITER_WORDS;

use super::duty::{self, FULL_PPM, MAX_DEBT_NS};

/// A horizon further ahead than this is garbage, not queued work.
const HORIZON_SANE_NS: u64 = 60 * duty::SECOND_NS;

/// The shared words of one device, with the bucket's window.
#[derive(Clone, Copy)]
pub struct Shared<'a> {
    words: &'a [AtomicU64; CONTAINER_LIMITER_WORDS],
    window_ns: u64,
}

impl<'a> Shared<'a> {
    pub fn new(words: &'a [AtomicU64; CONTAINER_LIMITER_WORDS], window_ns: u64) -> Shared<'a> {
        Shared { words, window_ns }
    }

    /// Starts loading the line of the container's words (`tables::prefetch`).
    #[inline]
    pub fn prefetch(&self) {
        super::tables::prefetch(&self.words[PAID_UNTIL_NS]);
    }

    /// The rate in force, parts per million: the word if it holds a sane rate, else
    /// `fallback` (the limit).
    pub fn rate_ppm(&self, fallback: u64) -> u64 {
        let rate = self.words[RATE_PPM].load(Ordering::Relaxed);
        if (duty::percent_ppm(1)..=FULL_PPM).contains(&rate) {
            rate
        } else {
            fallback
        }
    }

    /// Sets the rate (soft mode following contention), keeping what was saved or owed.
    /// Several processes setting the same rate change it once.
    pub fn set_rate(&self, new_ppm: u64, now_ns: u64, fallback: u64) {
        let word = &self.words[RATE_PPM];
        let stored = word.load(Ordering::Acquire);
        let old_ppm = self.rate_ppm(fallback);
        if stored == new_ppm
            || word
                .compare_exchange(stored, new_ppm, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
        {
            return;
        }
        let paid = &self.words[PAID_UNTIL_NS];
        let _ = paid.fetch_update(Ordering::AcqRel, Ordering::Acquire, |current| {
            Some(duty::rescale(
                current,
                now_ns,
                old_ppm,
                new_ppm,
                self.window_ns,
            ))
        });
    }

    /// How long a launch must wait now at `rate_ppm`. A bucket paid further ahead than
    /// the most debt allows is reset.
    pub fn delay(&self, now_ns: u64, rate_ppm: u64) -> u64 {
        let paid = self.words[PAID_UNTIL_NS].load(Ordering::Acquire);
        let wait = duty::delay(paid, now_ns);
        // Not in debt (every fast-path launch): no division for the sanity bound.
        if wait > 0 && wait > self.most_wait(rate_ppm) {
            let _ = self.words[PAID_UNTIL_NS].compare_exchange(
                paid,
                now_ns,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
            return 0;
        }
        wait
    }

    /// How long a launch must wait now at `rate_ppm`: while launches are held (see
    /// `HELD_UNTIL_NS`), until they are released; else not at all unless the bucket is
    /// in debt, which holds every launch until the bucket has refilled `refill_ns()` of
    /// wall time beyond the debt (at most the window; asked only then).
    pub fn hold(&self, now_ns: u64, rate_ppm: u64, refill_ns: impl FnOnce() -> u64) -> u64 {
        let held = &self.words[HELD_UNTIL_NS];
        let until = held.load(Ordering::Acquire);
        if until > now_ns {
            if until - now_ns <= self.most_wait(rate_ppm) + self.window_ns {
                return until - now_ns;
            }
            // Garbage: release.
            let _ = held.compare_exchange(until, 0, Ordering::AcqRel, Ordering::Acquire);
        }
        let owed = self.delay(now_ns, rate_ppm);
        if owed == 0 {
            return 0;
        }
        let release = now_ns + owed + refill_ns().min(self.window_ns);
        held.fetch_max(release, Ordering::AcqRel).max(release) - now_ns
    }

    fn most_wait(&self, rate_ppm: u64) -> u64 {
        (MAX_DEBT_NS as u128 * FULL_PPM as u128 / rate_ppm.max(1) as u128) as u64 + self.window_ns
    }

    /// Spends `cost_ns` of GPU time (negative gives back).
    pub fn charge(&self, cost_ns: i64, now_ns: u64, rate_ppm: u64) {
        if cost_ns == 0 {
            return;
        }
        let _ = self.words[PAID_UNTIL_NS].fetch_update(
            Ordering::AcqRel,
            Ordering::Acquire,
            |current| {
                Some(duty::charge(
                    current,
                    now_ns,
                    cost_ns,
                    rate_ppm,
                    self.window_ns,
                ))
            },
        );
    }

    /// Spends `cost_ns` of GPU time ahead, if the bucket holds it without going into
    /// debt (a thread's tab, `super::tab`); whether it did.
    pub fn borrow(&self, cost_ns: i64, now_ns: u64, rate_ppm: u64) -> bool {
        self.words[PAID_UNTIL_NS]
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |current| {
                let paid = duty::charge(current, now_ns, cost_ns, rate_ppm, self.window_ns);
                (duty::delay(paid, now_ns) == 0).then_some(paid)
            })
            .is_ok()
    }

    /// The latest projected end of the container's queued work (a garbage word reads 0).
    pub fn horizon(&self, now_ns: u64) -> u64 {
        let horizon = self.words[HORIZON_NS].load(Ordering::Acquire);
        if horizon > now_ns.saturating_add(HORIZON_SANE_NS) {
            0
        } else {
            horizon
        }
    }

    /// Adds work projected over `[start, end)` to the union; returns what it added and
    /// the horizon before it.
    pub fn extend(&self, start: u64, end: u64, now_ns: u64) -> (u64, u64) {
        let word = &self.words[HORIZON_NS];
        let seen = word.load(Ordering::Acquire);
        if end <= seen && seen <= now_ns.saturating_add(HORIZON_SANE_NS) {
            // Within the queued work: nothing to add, nothing to write.
            return (0, seen);
        }
        let mut before = word.fetch_max(end, Ordering::AcqRel);
        if before > now_ns.saturating_add(HORIZON_SANE_NS) {
            // Garbage from a broken write: start over from this launch.
            let _ = word.compare_exchange(before, end, Ordering::AcqRel, Ordering::Acquire);
            before = 0;
        }
        (duty::union_increment(start, end, before), before)
    }
}

impl Shared<'_> {
    /// Moves the horizon back from `from` to `to` if nothing has moved it since it was
    /// set to `from` (the work that defined it ended early); whether it did.
    pub fn pull_back(&self, from: u64, to: u64) -> bool {
        to < from
            && self.words[HORIZON_NS]
                .compare_exchange(from, to, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn words() -> [AtomicU64; CONTAINER_LIMITER_WORDS] {
        std::array::from_fn(|_| AtomicU64::new(0))
    }

    /// Words whose bucket is full at `now` (idle for a window or more): a container's
    /// region starts empty instead (`duty::charge`).
    fn words_full_at(now: u64, window_ns: u64) -> [AtomicU64; CONTAINER_LIMITER_WORDS] {
        let words = words();
        words[PAID_UNTIL_NS].store(now - window_ns, Ordering::Relaxed);
        words
    }

    #[test]
    fn one_budget_for_every_thread_and_the_union_of_their_work() {
        let now = 100 * duty::SECOND_NS;
        let words = words_full_at(now, 10 * MS);
        let shared = Shared::new(&words, 10 * MS);
        let rate = shared.rate_ppm(duty::percent_ppm(30));
        assert_eq!(rate, 300_000, "an unset rate is the limit");
        // Four threads queue a 1 ms kernel each at once: charged once.
        let added: u64 = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    scope.spawn(|| {
                        let (added, _) = shared.extend(now, now + MS, now);
                        shared.charge(added as i64, now, rate);
                        added
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("thread")).sum()
        });
        assert_eq!(added, MS);
        // 1 ms of a 3 ms burst: no wait yet; 5 ms more puts it 3 ms in debt (10 ms wall).
        assert_eq!(shared.delay(now, rate), 0);
        shared.charge(5 * MS as i64, now, rate);
        assert!(
            shared.delay(now, rate).abs_diff(10 * MS) < 10,
            "(ns rounding)"
        );
        // Soft mode doubles the rate: the debt is paid twice as fast.
        shared.set_rate(600_000, now, rate);
        assert_eq!(shared.rate_ppm(rate), 600_000);
        assert!(shared.delay(now, 600_000).abs_diff(5 * MS) < 10);
    }

    #[test]
    fn a_tab_borrows_only_what_the_bucket_holds_and_gets_back_what_it_did_not_use() {
        let now = 100 * duty::SECOND_NS;
        let words = words_full_at(now, 10 * MS);
        let shared = Shared::new(&words, 10 * MS);
        let rate = duty::percent_ppm(50);
        // A full bucket at 50 % of a 10 ms window holds 5 ms of GPU time.
        assert!(shared.borrow(4 * MS as i64, now, rate));
        assert!(!shared.borrow(2 * MS as i64, now, rate), "1 ms left");
        assert_eq!(
            shared.delay(now, rate),
            0,
            "a refused borrow spends nothing"
        );
        assert!(shared.borrow(MS as i64, now, rate));
        assert_eq!(
            shared.delay(now, rate),
            0,
            "borrowed to the last ns, not beyond"
        );
        // Giving back 3 ms unused leaves 3 ms to borrow again.
        shared.charge(-3 * MS as i64, now, rate);
        assert!(shared.borrow(3 * MS as i64, now, rate));
        assert!(!shared.borrow(1_000, now, rate), "empty again");
    }

    #[test]
    fn a_bucket_in_debt_holds_every_launch_until_it_has_refilled() {
        let now = 100 * duty::SECOND_NS;
        let words = words_full_at(now, 10 * MS);
        let shared = Shared::new(&words, 10 * MS);
        let rate = duty::percent_ppm(50);
        assert_eq!(shared.hold(now, rate, || 5 * MS), 0);
        // 10 ms spent of a 5 ms burst: 10 ms of wall time owed, then 5 ms to refill.
        shared.charge(10 * MS as i64, now, rate);
        assert_eq!(shared.hold(now, rate, || 5 * MS), 15 * MS);
        // Once the debt is paid, launches are still held until the refill is done...
        assert_eq!(shared.hold(now + 11 * MS, rate, || 5 * MS), 4 * MS);
        // ...and then all go, with the refilled budget to spend together.
        assert_eq!(shared.hold(now + 15 * MS, rate, || 5 * MS), 0);
        assert_eq!(shared.delay(now + 15 * MS, rate), 0);
    }

    #[test]
    fn without_a_refill_a_launch_waits_for_the_debt_alone() {
        // One stream's kernels (no refill asked): 10 ms owed, 10 ms held, not 15.
        let now = 100 * duty::SECOND_NS;
        let words = words_full_at(now, 10 * MS);
        let shared = Shared::new(&words, 10 * MS);
        let rate = duty::percent_ppm(50);
        shared.charge(10 * MS as i64, now, rate);
        assert_eq!(shared.hold(now, rate, || 0), 10 * MS);
        assert_eq!(shared.hold(now + 10 * MS, rate, || 0), 0);
        // A refill larger than the window is cut to the window.
        shared.charge(10 * MS as i64, now + 10 * MS, rate);
        let owed = shared.delay(now + 10 * MS, rate);
        assert!(owed > 0);
        assert_eq!(shared.hold(now + 10 * MS, rate, || 60 * MS), owed + 10 * MS);
    }

    #[test]
    fn two_processes_of_a_container_keep_one_union_and_one_bucket() {
        // A kernel's interval on a time-sliced card spans the slices another context
        // took meanwhile (H200, BENCHMARKS run 12: two processes of one container summed
        // each other's intervals and got 18.8 % for 30); the union counts the wall time
        // the container held work on the card once.
        let words = words();
        let a = Shared::new(&words, 10 * MS);
        let b = Shared::new(&words, 10 * MS);
        let now = 100 * duty::SECOND_NS;
        assert_eq!(a.extend(now, now + 2 * MS, now).0, 2 * MS);
        // Another stream or another process over the same 2 ms: counted once.
        assert_eq!(a.extend(now, now + 2 * MS, now).0, 0);
        assert_eq!(b.extend(now, now + 2 * MS, now).0, 0);
        // Beyond it: only what lies past the union.
        assert_eq!(b.extend(now + MS, now + 3 * MS, now).0, MS);
        let rate = duty::percent_ppm(50);
        a.charge(8 * MS as i64, now, rate);
        assert_eq!(a.delay(now, rate), b.delay(now, rate));
        assert!(b.delay(now, rate) > 0);
    }

    #[test]
    fn the_horizon_moves_back_only_if_nothing_was_queued_after() {
        let words = words();
        let shared = Shared::new(&words, 10 * MS);
        let now = 100 * duty::SECOND_NS;
        shared.extend(now, now + 2 * MS, now);
        assert!(shared.pull_back(now + 2 * MS, now + MS));
        assert_eq!(shared.horizon(now), now + MS);
        shared.extend(now + MS, now + 3 * MS, now);
        assert!(
            !shared.pull_back(now + 2 * MS, now + MS),
            "later work keeps it"
        );
        assert_eq!(shared.horizon(now), now + 3 * MS);
    }

    #[test]
    fn garbage_words_are_reset_not_obeyed() {
        let words = words();
        let shared = Shared::new(&words, 10 * MS);
        let now = 100 * duty::SECOND_NS;
        words[PAID_UNTIL_NS].store(u64::MAX, Ordering::SeqCst);
        words[HORIZON_NS].store(u64::MAX, Ordering::SeqCst);
        words[RATE_PPM].store(7, Ordering::SeqCst);
        words[HELD_UNTIL_NS].store(u64::MAX, Ordering::SeqCst);
        let rate = shared.rate_ppm(300_000);
        assert_eq!(rate, 300_000);
        assert_eq!(shared.delay(now, rate), 0, "no endless wait");
        assert_eq!(shared.hold(now, rate, || MS), 0, "no endless hold");
        assert_eq!(shared.horizon(now), 0);
        let (added, _) = shared.extend(now, now + MS, now);
        assert_eq!(added, MS, "no free work behind a garbage horizon");
        assert_eq!(shared.horizon(now), now + MS);
    }
}
