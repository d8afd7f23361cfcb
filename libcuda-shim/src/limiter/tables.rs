//! The two lock-free tables a launch touches, so an unsampled launch takes no lock:
//!
//! - `Estimates`: per kernel (or graph) key, its learned cost and sample counter, one
//!   word (`duty::Estimate`);
//! - `Streams`: per stream of this process, the projected time its queued work ends
//!   ("busy until"), and whether it is a blocking stream (one that waits for the legacy
//!   default stream, which waits for it).
//!
//! Beside them, `Traced` counts each estimate's launches for the trace, only while it is
//! on, slot for slot with `Estimates` and apart from it (a launch touches it only then).
//!
//! Both are fixed arrays of atomics with open addressing: a key is claimed with a
//! compare-and-swap, a lookup probes a few slots, and a full neighbourhood evicts its
//! first slot (a forgotten estimate is learned again; a forgotten stream is projected as
//! idle). Nothing allocates after creation, nothing blocks, and a thread that dies
//! anywhere leaves nothing inconsistent that matters.
//!
//! A slot keeps its key beside its value, aligned so that it never straddles a cache
//! line, and the lengths are powers of two (a mask, not a division, finds a slot): a
//! launch that finds its kernel and its stream where it hashed them reads two lines of
//! these tables. The real driver's launch path evicts the shim's lines between launches,
//! so every line the fast path touches is a likely cache miss (see `super::fast`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::duty::{self, Estimate, SINCE_SHIFT};

/// How many slots a lookup probes.
const PROBE: usize = 16;

/// `len` is a power of two (`slots_for`).
fn home(key: u64, len: usize) -> usize {
    // Fibonacci hashing: handles are aligned pointers, so their low bits are poor.
    (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as usize & (len - 1)
}

/// The slots a lookup of `key` probes, in order (`len` a power of two).
fn probes(key: u64, len: usize) -> impl Iterator<Item = usize> {
    let start = home(key, len);
    (0..PROBE.min(len)).map(move |step| (start + step) & (len - 1))
}

/// A table length for at least `asked` slots: the next power of two.
fn slots_for(asked: usize) -> usize {
    asked.max(1).next_power_of_two()
}

/// Asks the CPU to start loading `value`'s cache line: the fast path names the lines it
/// is about to touch before it touches the first, so their misses overlap instead of
/// following one another. A hint only (a no-op off x86_64).
#[inline(always)]
pub fn prefetch<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults and changes nothing a program can observe; the
    // address is a live reference besides.
    unsafe {
        use core::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>((value as *const T).cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}

/// One learned cost: its key and its `duty::Estimate` word, on one cache line.
#[repr(C, align(16))]
struct EstimateSlot {
    key: AtomicU64,
    value: AtomicU64,
}

/// One stream's projection: its key, its "busy until" and whether it is blocking, on
/// one cache line.
#[repr(C, align(32))]
struct StreamSlot {
    key: AtomicU64,
    busy_until: AtomicU64,
    blocking: AtomicBool,
}

/// Learned costs by key (a nonzero u64).
pub struct Estimates {
    slots: Box<[EstimateSlot]>,
}

/// Launches of each key of an [`Estimates`] and the busy ns charged for them, counted
/// only while the trace is on, in tables of their own so that the launch path's lines
/// stay as they are: slot for slot with the estimates (a key's counts follow its slot; a
/// slot taken over by another key carries the old counts, which only a table of 4096
/// kernels full to its probes does).
pub struct Traced {
    launches: Box<[AtomicU64]>,
    /// Signed, as two's complement (a settled sample's correction may give back).
    charged_ns: Box<[AtomicU64]>,
}

impl Traced {
    /// Counters for an [`Estimates`] made with `slots`.
    pub fn new(slots: usize) -> Traced {
        let zeros = || (0..slots_for(slots)).map(|_| AtomicU64::new(0)).collect();
        Traced {
            launches: zeros(),
            charged_ns: zeros(),
        }
    }

    /// Counts `launches` of `key` in `estimates`.
    pub fn count(&self, estimates: &Estimates, key: u64, launches: u64) {
        add_at(&self.launches, estimates, key, launches);
    }

    /// Adds `ns` (negative: given back) to what `key` in `estimates` was charged.
    pub fn charge(&self, estimates: &Estimates, key: u64, ns: i64) {
        // Two's complement: adding a negative wraps to the difference.
        add_at(&self.charged_ns, estimates, key, ns as u64);
    }
}

/// Adds `value` to `column`'s counter at `key`'s slot in `estimates` (nothing for a key
/// not in the table).
fn add_at(column: &[AtomicU64], estimates: &Estimates, key: u64, value: u64) {
    if let Some(counter) = estimates.find(key).and_then(|index| column.get(index)) {
        counter.fetch_add(value, Ordering::Relaxed);
    }
}

/// A learned estimate for the trace: its key, the estimate, and the launches counted and
/// the busy ns charged for it while tracing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Known {
    pub key: u64,
    pub estimate: Estimate,
    pub launches: u64,
    pub charged_ns: i64,
}

impl Estimates {
    /// A table of at least `slots` slots (rounded up to a power of two).
    pub fn new(slots: usize) -> Estimates {
        Estimates {
            slots: (0..slots_for(slots))
                .map(|_| EstimateSlot {
                    key: AtomicU64::new(0),
                    value: AtomicU64::new(0),
                })
                .collect(),
        }
    }

    fn find(&self, key: u64) -> Option<usize> {
        probes(key, self.slots.len())
            .find(|&index| self.slots[index].key.load(Ordering::Acquire) == key)
    }

    /// Starts loading the line of `key`'s home slot (where a lookup finds it first).
    #[inline]
    pub fn prefetch(&self, key: u64) {
        prefetch(&self.slots[home(key, self.slots.len())]);
    }

    /// The estimate of `key`, counting this launch; and whether to measure it (see
    /// `Estimate::count_launch`; `sample_allowed` says whether a short kernel's sample
    /// slot is open, `every` after how many launches). `None` when the key is unknown.
    pub fn count_launch(
        &self,
        key: u64,
        sample_allowed: bool,
        every: u32,
    ) -> Option<(Estimate, bool)> {
        let index = self.find(key)?;
        let value = &self.slots[index].value;
        // One add counts the launch (the counter is the word's top bits, so it can only
        // wrap around to zero, which is harmless); only a launch that finds a sample due
        // tries to claim it, so concurrent launches take it once.
        let before = value.fetch_add(1 << SINCE_SHIFT, Ordering::AcqRel);
        let estimate = Estimate::unpack(before);
        if estimate.samples == 0 {
            // Claimed and not measured yet: unknown.
            return None;
        }
        let (counted, due) = estimate.count_launch(sample_allowed, every);
        if !due {
            return Some((counted, false));
        }
        let claimed = Estimate::unpack(before.wrapping_add(1 << SINCE_SHIFT));
        let reset = Estimate {
            since_sample: 0,
            ..claimed
        };
        // The key may have been evicted meanwhile; the answer is still one that key had
        // a moment ago, which is all an estimate is.
        let won = value
            .compare_exchange(
                before.wrapping_add(1 << SINCE_SHIFT),
                reset.pack(),
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok();
        Some((counted, won))
    }

    /// Adds `launches` made on a thread's tab (`super::tab`) to `key`'s launches since
    /// its last sample (saturating), as if each had been counted.
    pub fn count_launches(&self, key: u64, launches: u64) {
        let Some(index) = self.find(key) else {
            return;
        };
        let _ = self.slots[index]
            .value
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |word| {
                let estimate = Estimate::unpack(word);
                let since = (estimate.since_sample as u64).saturating_add(launches);
                Some(
                    Estimate {
                        since_sample: since.min(u32::MAX as u64) as u32,
                        ..estimate
                    }
                    .pack(),
                )
            });
    }

    /// Up to `most` learned estimates, those with the most samples first, with the
    /// launches `traced` counted for them (for the trace: what the limiter believes its
    /// busiest kernels cost).
    pub fn best_known(&self, most: usize, traced: &Traced) -> Vec<Known> {
        let mut known: Vec<Known> = self
            .slots
            .iter()
            .zip(traced.launches.iter().zip(traced.charged_ns.iter()))
            .map(|(slot, (launches, charged))| Known {
                key: slot.key.load(Ordering::Relaxed),
                estimate: Estimate::unpack(slot.value.load(Ordering::Relaxed)),
                launches: launches.load(Ordering::Relaxed),
                charged_ns: charged.load(Ordering::Relaxed) as i64,
            })
            .filter(|known| known.key != 0 && known.estimate.samples > 0)
            .collect();
        known.sort_by(|a, b| {
            b.estimate
                .samples
                .cmp(&a.estimate.samples)
                .then(b.estimate.cost_ns.cmp(&a.estimate.cost_ns))
        });
        known.truncate(most);
        known
    }

    /// The estimate of `key` without counting a launch.
    pub fn get(&self, key: u64) -> Option<Estimate> {
        let index = self.find(key)?;
        let estimate = Estimate::unpack(self.slots[index].value.load(Ordering::Acquire));
        (estimate.samples > 0).then_some(estimate)
    }

    /// Folds a measurement of `key` in (adding the key if it is new).
    pub fn record(&self, key: u64, measured_ns: u64) {
        let index = match self.find(key) {
            Some(index) => index,
            None => self.claim(key),
        };
        let value = &self.slots[index].value;
        let mut current = value.load(Ordering::Relaxed);
        loop {
            let estimate = Estimate::unpack(current);
            let next = if estimate.samples == 0 {
                Estimate::first(measured_ns)
            } else {
                estimate.record(measured_ns)
            };
            match value.compare_exchange_weak(
                current,
                next.pack(),
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(actual) => current = actual,
            }
        }
    }

    /// A slot for a new key: an empty one near its home, else its home (evicted). Its
    /// value reads as "no samples" (zero), so `record` starts it afresh.
    fn claim(&self, key: u64) -> usize {
        for index in probes(key, self.slots.len()) {
            match self.slots[index].key.compare_exchange(
                0,
                key,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return index,
                Err(existing) if existing == key => return index,
                Err(_) => {}
            }
        }
        let start = home(key, self.slots.len());
        self.slots[start].value.store(0, Ordering::Release);
        self.slots[start].key.store(key, Ordering::Release);
        start
    }
}

/// What a stream's projection said when a launch was placed on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placed {
    pub start: u64,
    pub end: u64,
    /// Whether the stream had nothing queued (as projected) when the launch came.
    pub was_idle: bool,
}

/// The streams of this process on one device, by key (see `StreamKey`).
pub struct Streams {
    slots: Box<[StreamSlot]>,
}

/// A stream nobody queued on for this long may give its slot to another.
const STALE_NS: u64 = 1_000_000_000;

impl Streams {
    /// A table of at least `slots` slots (rounded up to a power of two).
    pub fn new(slots: usize) -> Streams {
        Streams {
            slots: (0..slots_for(slots))
                .map(|_| StreamSlot {
                    key: AtomicU64::new(0),
                    busy_until: AtomicU64::new(0),
                    blocking: AtomicBool::new(false),
                })
                .collect(),
        }
    }

    /// The slot of `key`, claiming one (and asking `is_blocking` once) if it is new;
    /// `None` when its whole neighbourhood is busy with live streams.
    fn slot(&self, key: u64, now_ns: u64, is_blocking: impl FnOnce() -> bool) -> Option<usize> {
        if let Some(index) = self.find(key) {
            return Some(index);
        }
        for index in probes(key, self.slots.len()) {
            let slot = &self.slots[index];
            let held = slot.key.load(Ordering::Acquire);
            let stale = held != 0
                && slot
                    .busy_until
                    .load(Ordering::Acquire)
                    .saturating_add(STALE_NS)
                    < now_ns;
            if (held == 0 || stale)
                && slot
                    .key
                    .compare_exchange(held, key, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                slot.busy_until.store(0, Ordering::Release);
                slot.blocking.store(is_blocking(), Ordering::Release);
                return Some(index);
            }
        }
        None
    }

    /// Starts loading the line of `key`'s home slot (where a lookup finds it first).
    #[inline]
    pub fn prefetch(&self, key: u64) {
        prefetch(&self.slots[home(key, self.slots.len())]);
    }

    /// Places `cost_ns` of work queued on `key` at `now_ns`: it starts when the stream's
    /// queued work ends, and not before `floor_of(blocking)` (what a stream that waits on
    /// others waits for). Placed behind queued work, it runs without the set-up
    /// `setup_ns` its samples timed (`duty::placed_cost`), which the card hides there.
    /// A stream without a slot is projected from `fallback_ns` (the container's horizon:
    /// after everything, so it is charged in full).
    pub fn place(
        &self,
        key: u64,
        now_ns: u64,
        (cost_ns, setup_ns): (u64, u64),
        floor_of: impl Fn(bool) -> u64,
        fallback_ns: u64,
        is_blocking: impl FnOnce() -> bool,
    ) -> Placed {
        let Some(index) = self.slot(key, now_ns, is_blocking) else {
            let start = now_ns.max(floor_of(true)).max(fallback_ns);
            return Placed {
                start,
                end: start.saturating_add(cost_ns),
                was_idle: false,
            };
        };
        let slot = &self.slots[index];
        let floor_ns = floor_of(slot.blocking.load(Ordering::Acquire));
        let busy = &slot.busy_until;
        let mut current = busy.load(Ordering::Acquire);
        loop {
            let start = now_ns.max(current).max(floor_ns);
            let end = start.saturating_add(duty::placed_cost(start, now_ns, cost_ns, setup_ns));
            match busy.compare_exchange_weak(current, end, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    return Placed {
                        start,
                        end,
                        was_idle: current <= now_ns,
                    };
                }
                Err(actual) => current = actual,
            }
        }
    }

    /// Where `cost_ns` of work queued on `key` at `now_ns` would start, without placing
    /// it (`floor_of` as for `place`).
    pub fn would_start(&self, key: u64, now_ns: u64, floor_of: impl Fn(bool) -> u64) -> u64 {
        match self.find(key) {
            Some(index) => {
                let slot = &self.slots[index];
                now_ns
                    .max(slot.busy_until.load(Ordering::Acquire))
                    .max(floor_of(slot.blocking.load(Ordering::Acquire)))
            }
            None => now_ns.max(floor_of(true)),
        }
    }

    /// Moves `key`'s projected end to at least `end_ns` (a measurement found its work
    /// ran longer than projected).
    pub fn extend(&self, key: u64, end_ns: u64) {
        if let Some(index) = self.find(key) {
            self.slots[index]
                .busy_until
                .fetch_max(end_ns, Ordering::AcqRel);
        }
    }

    /// Moves `key`'s projected end back from `from` to `to` if nothing was queued on it
    /// since.
    pub fn pull_back(&self, key: u64, from: u64, to: u64) {
        if let Some(index) = self.find(key) {
            let _ = self.slots[index].busy_until.compare_exchange(
                from,
                to,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
    }

    /// The projected end of `key`'s queued work (0 if unknown).
    pub fn busy_until(&self, key: u64) -> u64 {
        self.find(key)
            .map(|index| self.slots[index].busy_until.load(Ordering::Acquire))
            .unwrap_or(0)
    }

    fn find(&self, key: u64) -> Option<usize> {
        probes(key, self.slots.len())
            .find(|&index| self.slots[index].key.load(Ordering::Acquire) == key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_never_straddles_a_cache_line_and_tables_are_powers_of_two() {
        for (size, align) in [
            (size_of::<EstimateSlot>(), align_of::<EstimateSlot>()),
            (size_of::<StreamSlot>(), align_of::<StreamSlot>()),
        ] {
            assert!(size <= align && 64 % align == 0, "{size} bytes at {align}");
        }
        assert_eq!(Estimates::new(3000).slots.len(), 4096);
        assert_eq!(Streams::new(256).slots.len(), 256);
        assert_eq!(Streams::new(0).slots.len(), 1);
        // Every probe stays inside a table of any length.
        for len in [1, 2, 64, 4096] {
            for key in [1u64, u64::MAX, 0x7f00_dead_beef] {
                assert!(probes(key, len).all(|index| index < len));
                assert_eq!(probes(key, len).count(), PROBE.min(len));
            }
        }
    }

    #[test]
    fn launches_made_on_a_tab_count_towards_the_next_sample() {
        let table = Estimates::new(64);
        table.count_launches(7, 5);
        assert_eq!(table.get(7), None, "an unknown key stays unknown");
        table.record(7, 4_000);
        table.count_launches(7, 5);
        // Five counted already: the sixth launch is due when samples come every 6.
        let (counted, due) = table.count_launch(7, true, 6).expect("known");
        assert_eq!((counted.since_sample, due), (0, true));
        // Far more than the counter holds saturates; it does not wrap to a fresh count.
        table.count_launches(7, 1 << 40);
        assert_eq!(table.get(7).map(|e| e.since_sample), Some(0xffff));
        assert_eq!(
            table.get(7).map(|e| e.cost_ns),
            Some(4_000),
            "the cost is kept"
        );
    }

    #[test]
    fn estimates_are_learned_counted_and_evicted_without_locks() {
        let table = Estimates::new(64);
        assert_eq!(table.count_launch(7, true, 8), None, "unknown");
        table.record(7, 100_000);
        let (estimate, due) = table.count_launch(7, true, 8).expect("known");
        assert_eq!(
            (estimate.cost_ns, estimate.samples, due),
            (100_000, 1, false)
        );
        table.record(7, 200_000);
        assert_eq!(table.get(7).map(|e| e.cost_ns), Some(125_000));
        // Many more keys than slots: the table never grows, new keys always fit.
        for key in 1000..2000u64 {
            table.record(key, key);
            assert_eq!(table.get(key).map(|e| e.cost_ns), Some(key));
        }
    }

    #[test]
    fn the_trace_gets_the_most_sampled_estimates_first() {
        let table = Estimates::new(64);
        for (key, samples, cost) in [(1u64, 3, 100), (2, 9, 1_000), (3, 1, 50), (4, 9, 2_000)] {
            for _ in 0..samples {
                table.record(key, cost);
            }
        }
        let traced = Traced::new(64);
        traced.count(&table, 2, 40);
        traced.count(&table, 99, 1);
        // Charged 40 us, and a settled sample gave 500 ns back.
        traced.charge(&table, 2, 40_000);
        traced.charge(&table, 2, -500);
        traced.charge(&table, 99, 1_000);
        let costs: Vec<(u64, u64, u32, u64, i64)> = table
            .best_known(3, &traced)
            .iter()
            .map(|known| {
                (
                    known.key,
                    known.estimate.cost_ns,
                    known.estimate.samples,
                    known.launches,
                    known.charged_ns,
                )
            })
            .collect();
        assert_eq!(
            costs,
            [
                (4, 2_000, 9, 0, 0),
                (2, 1_000, 9, 40, 39_500),
                (1, 100, 3, 0, 0)
            ]
        );
        let empty = Estimates::new(8);
        assert!(empty.best_known(3, &Traced::new(8)).is_empty());
    }

    #[test]
    fn threads_count_and_record_together() {
        let table = std::sync::Arc::new(Estimates::new(256));
        table.record(42, 50_000);
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let table = table.clone();
                std::thread::spawn(move || {
                    let mut due = 0;
                    for _ in 0..8000 {
                        if table.count_launch(42, true, 8).expect("known").1 {
                            due += 1;
                            table.record(42, 50_000);
                        }
                    }
                    due
                })
            })
            .collect();
        let due: u32 = handles.into_iter().map(|h| h.join().expect("thread")).sum();
        // One launch in eight is due, whichever thread makes it (a due launch that
        // loses the claim to another thread's count is not measured: a few fewer).
        assert!(
            (6000..=9000).contains(&due),
            "{due} samples of 64000 launches"
        );
        assert_eq!(table.get(42).map(|e| e.cost_ns), Some(50_000));
    }

    #[test]
    fn a_launch_behind_its_streams_work_is_placed_without_its_set_up() {
        let streams = Streams::new(32);
        let now = 10_000_000_000;
        // On an idle stream a 30 us kernel runs its whole estimate (set-up and all).
        let first = streams.place(1, now, (30_000, 10_000), |_| 0, 0, || false);
        assert_eq!((first.start, first.end), (now, now + 30_000));
        // Queued behind it, its set-up runs beside the first: 20 us.
        let second = streams.place(1, now + 5_000, (30_000, 10_000), |_| 0, 0, || false);
        assert_eq!((second.start, second.end), (now + 30_000, now + 50_000));
        // Behind a floor (the legacy stream's work) as well.
        let floored = streams.place(2, now, (30_000, 10_000), |_| now + 1_000, 0, || true);
        assert_eq!(floored.end, now + 21_000);
        // Once the stream has run dry, the next is set up on an idle card again.
        let later = streams.place(1, now + 60_000, (30_000, 10_000), |_| 0, 0, || false);
        assert_eq!(later.end, now + 90_000);
    }

    #[test]
    fn streams_queue_their_own_work_and_forget_idle_ones() {
        let streams = Streams::new(32);
        let now = 10_000_000_000;
        let first = streams.place(1, now, (100, 0), |_| 0, 0, || true);
        assert_eq!(
            first,
            Placed {
                start: now,
                end: now + 100,
                was_idle: true
            }
        );
        let second = streams.place(1, now + 10, (100, 0), |_| 0, 0, || unreachable!());
        assert_eq!(
            second,
            Placed {
                start: now + 100,
                end: now + 200,
                was_idle: false
            }
        );
        let other = streams.place(2, now + 10, (100, 0), |_| 0, 0, || false);
        assert_eq!(other.start, now + 10, "another stream runs beside it");
        // A blocking stream waits for the floor (the legacy stream's work); a
        // non-blocking one does not.
        let legacy = |blocking: bool| if blocking { now + 500 } else { 0 };
        assert_eq!(
            streams
                .place(1, now + 20, (50, 0), legacy, 0, || false)
                .start,
            now + 500
        );
        assert_eq!(
            streams
                .place(2, now + 20, (50, 0), legacy, 0, || false)
                .start,
            now + 110
        );
        streams.extend(1, now + 1_000);
        assert_eq!(streams.busy_until(1), now + 1_000);
        // Fill the table; stale streams give their slots up.
        for key in 100..200u64 {
            streams.place(key, now, (1, 0), |_| 0, 0, || false);
        }
        let later = now + 2 * STALE_NS;
        for key in 200..230u64 {
            let placed = streams.place(key, later, (1, 0), |_| 0, 0, || false);
            assert_eq!(placed.start, later);
        }
        // A stream that finds no slot is placed after the fallback horizon.
        let crowded = Streams::new(1);
        crowded.place(1, now, (100, 0), |_| 0, 0, || false);
        assert_eq!(
            crowded
                .place(2, now, (100, 0), |_| 0, now + 700, || false)
                .start,
            now + 700
        );
    }
}
