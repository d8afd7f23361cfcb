//! The fast path's clock: CLOCK_MONOTONIC nanoseconds read from the CPU's time-stamp
//! counter, on the line of switches every launch reads anyway, instead of through the
//! vDSO (a library call, an ordered counter read and the kernel's time page, which a
//! real driver's launch pushes out of the cache between two launches).
//!
//! The reading is `anchor_ns + (ticks - anchor_ticks) * scale >> 32`. Only where the
//! kernel keeps time with the same counter (clocksource `tsc`: it has checked that the
//! counter is invariant and the same on every CPU) and only on x86_64; anywhere else,
//! before the first calibration, while the publish tick rewrites the anchor, or when the
//! anchor is older than `MAX_AGE_NS`, it is the vDSO.
//!
//! The publish tick (`PUBLISH_NS`, slow path) [`FastClock::steer`]s it against the vDSO:
//! the scale is the counter's rate over the last interval, less what removes the error
//! found at this tick over the next `STEER_NS`, and the new anchor is where the clock
//! stood (no step: the clock stays continuous and monotonic). Only an error over
//! `RESET_ERROR_NS` (a suspended VM, a counter reset) steps it to the vDSO. So its
//! readings stay within about a hundred ns of the vDSO's, which every other reader of the
//! container's words uses: far below anything the limiter compares (µs kernels, a 10 ms
//! bucket window). `VGPU_LIMITER_CLOCK=vdso` keeps the vDSO everywhere.

use std::sync::atomic::{AtomicU64, Ordering, fence};

use vgpu_contract::clock::monotonic_ns;

/// The env var that turns the counter off (`vdso`).
pub const CLOCK_ENV: &str = "VGPU_LIMITER_CLOCK";

/// An anchor older than this is not trusted: the vDSO answers until the next steer.
const MAX_AGE_NS: u64 = 100_000_000;
/// The error found at a steer is removed over this long.
const STEER_NS: u64 = 40_000_000;
/// An interval shorter than this does not measure the counter's rate.
const MIN_INTERVAL_NS: u64 = 5_000_000;
/// An error larger than this is a jump, not drift: the clock steps to the vDSO.
const RESET_ERROR_NS: u64 = 1_000_000;
/// The most a steer bends the scale, parts per million.
const MOST_STEER_PPM: u64 = 1_000;
/// Counter rates the clock believes, in ns per tick as 32.32 fixed point: 0.05-10 ns a
/// tick (20 GHz to 100 MHz).
const SANE_SCALE: std::ops::RangeInclusive<u64> = (1 << 32) / 20..=10 << 32;

/// The counter's reading.
#[cfg(target_arch = "x86_64")]
#[inline]
pub fn ticks() -> u64 {
    // SAFETY: rdtsc reads the time-stamp counter; it touches no memory.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// No counter here: the clock's ticks are its nanoseconds (and the fast clock stays off).
#[cfg(not(target_arch = "x86_64"))]
#[inline]
pub fn ticks() -> u64 {
    monotonic_ns()
}

/// Whether this process may read the counter (`PR_GET_TSC` says `PR_TSC_ENABLE`).
fn counter_readable() -> bool {
    let mut mode: libc::c_int = 0;
    // SAFETY: PR_GET_TSC writes one int through the pointer, which is ours.
    let status = unsafe { libc::prctl(libc::PR_GET_TSC, &mut mode as *mut libc::c_int) };
    status == 0 && mode == libc::PR_TSC_ENABLE
}

/// The clock's state: five words of the switches' line (`lifecycle::Switches`).
pub struct FastClock {
    /// Even while the words below are stable, odd while a steer rewrites them.
    sequence: AtomicU64,
    anchor_ticks: AtomicU64,
    anchor_ns: AtomicU64,
    /// ns per tick as 32.32 fixed point; 0 while the vDSO answers.
    scale: AtomicU64,
    /// Ticks after the anchor past which it is too old.
    max_ticks: AtomicU64,
}

/// The steer's own memory: the last (ticks, vDSO ns) it saw, and whether the counter may
/// be used at all (decided once, when the limiter is built).
static LAST_TICKS: AtomicU64 = AtomicU64::new(0);
static LAST_NS: AtomicU64 = AtomicU64::new(0);
static ALLOWED: AtomicU64 = AtomicU64::new(0);

impl FastClock {
    pub const fn new() -> FastClock {
        FastClock {
            sequence: AtomicU64::new(0),
            anchor_ticks: AtomicU64::new(0),
            anchor_ns: AtomicU64::new(0),
            scale: AtomicU64::new(0),
            max_ticks: AtomicU64::new(0),
        }
    }

    /// CLOCK_MONOTONIC nanoseconds: from the counter once steered, else the vDSO (after
    /// one load: where the counter is not used, it is not read either).
    #[inline]
    pub fn now_ns(&self) -> u64 {
        if self.scale.load(Ordering::Relaxed) == 0 {
            return monotonic_ns();
        }
        self.reading(ticks()).unwrap_or_else(monotonic_ns)
    }

    /// The clock at `now_ticks`, or `None` where the vDSO must answer (a steer is
    /// rewriting the anchor, or did while it was read).
    #[inline]
    fn reading(&self, now_ticks: u64) -> Option<u64> {
        let sequence = self.sequence.load(Ordering::Acquire);
        if sequence & 1 == 1 {
            return None;
        }
        let read = self.reading_unlocked(now_ticks);
        fence(Ordering::Acquire);
        if self.sequence.load(Ordering::Relaxed) != sequence {
            return None;
        }
        read
    }

    /// Whether readings come from the counter now (steered, and allowed).
    pub fn reads_the_counter(&self) -> bool {
        self.scale.load(Ordering::Relaxed) != 0
    }

    /// Decides once, when the limiter is built, whether the counter may be used: on
    /// x86_64, where the kernel's clocksource is `tsc` and the process may read the
    /// counter (a process can make `rdtsc` fault with `PR_SET_TSC`, as record-and-replay
    /// debuggers do), unless `VGPU_LIMITER_CLOCK=vdso`.
    pub fn allow_where_the_kernel_keeps_time_with_it() {
        let kernel = std::fs::read_to_string(
            "/sys/devices/system/clocksource/clocksource0/current_clocksource",
        )
        .unwrap_or_default();
        let vdso_asked = std::env::var(CLOCK_ENV).is_ok_and(|value| value == "vdso");
        let allowed = cfg!(target_arch = "x86_64")
            && kernel.trim() == "tsc"
            && counter_readable()
            && !vdso_asked;
        ALLOWED.store(allowed as u64, Ordering::Relaxed);
    }

    /// The publish tick: measures the counter against the vDSO and steers the clock (one
    /// thread at a time; a steer that finds another under way does nothing).
    pub fn steer(&self) {
        if ALLOWED.load(Ordering::Relaxed) == 0 {
            return;
        }
        // The vDSO read between two counter reads: its time stands for their middle.
        let before = ticks();
        let vdso_ns = monotonic_ns();
        let after = ticks();
        self.steer_at(before + (after.wrapping_sub(before)) / 2, vdso_ns);
    }

    /// Runs `update` with the sequence odd, so that no reader uses a half-written anchor;
    /// nothing when another thread is rewriting.
    fn rewrite(&self, update: impl FnOnce()) {
        let sequence = self.sequence.load(Ordering::Acquire);
        if sequence & 1 == 1
            || self
                .sequence
                .compare_exchange(sequence, sequence + 1, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
        {
            return;
        }
        update();
        self.sequence.store(sequence + 2, Ordering::Release);
    }

    /// [`FastClock::steer`] with the counter at `now_ticks` when the vDSO said `vdso_ns`.
    fn steer_at(&self, now_ticks: u64, vdso_ns: u64) {
        self.rewrite(|| self.steer_unlocked(now_ticks, vdso_ns));
    }

    fn steer_unlocked(&self, now_ticks: u64, vdso_ns: u64) {
        let (last_ticks, last_ns) = (
            LAST_TICKS.load(Ordering::Relaxed),
            LAST_NS.load(Ordering::Relaxed),
        );
        let interval_ns = vdso_ns.wrapping_sub(last_ns);
        if last_ns != 0 && vdso_ns > last_ns && interval_ns < MIN_INTERVAL_NS {
            // Too short to measure a rate (another device's tick came just before):
            // everything stays, and the next steer measures from the last point.
            return;
        }
        LAST_TICKS.store(now_ticks, Ordering::Relaxed);
        LAST_NS.store(vdso_ns, Ordering::Relaxed);
        let interval_ticks = now_ticks.wrapping_sub(last_ticks);
        let rate = (last_ns != 0 && vdso_ns > last_ns && now_ticks > last_ticks)
            .then(|| ((interval_ns as u128) << 32) / interval_ticks as u128)
            .and_then(|rate| u64::try_from(rate).ok())
            .filter(|rate| SANE_SCALE.contains(rate));
        let Some(rate) = rate else {
            // No rate (the first steer, or a counter that went back): the vDSO answers.
            self.scale.store(0, Ordering::Relaxed);
            return;
        };
        match self.reading_unlocked(now_ticks) {
            Some(clock_ns) if clock_ns.abs_diff(vdso_ns) <= RESET_ERROR_NS => {
                // Continue from where the clock stands; remove its error over STEER_NS.
                let error = clock_ns as i128 - vdso_ns as i128;
                let bend = (error * 1_000_000 / STEER_NS as i128)
                    .clamp(-(MOST_STEER_PPM as i128), MOST_STEER_PPM as i128);
                let scale = (rate as i128 - rate as i128 * bend / 1_000_000) as u64;
                self.set(now_ticks, clock_ns, scale);
            }
            // The first rate, an anchor too old (the vDSO answered meanwhile), or a
            // jump: start from the vDSO.
            _ => self.set(now_ticks, vdso_ns, rate),
        }
    }

    /// The clock at `now_ticks` from the anchor as it stands (no sequence check: the
    /// writer's own view, and the reader's between its two sequence loads).
    #[inline]
    fn reading_unlocked(&self, now_ticks: u64) -> Option<u64> {
        let scale = self.scale.load(Ordering::Relaxed);
        let since = now_ticks.checked_sub(self.anchor_ticks.load(Ordering::Relaxed))?;
        (scale != 0 && since <= self.max_ticks.load(Ordering::Relaxed)).then(|| {
            self.anchor_ns.load(Ordering::Relaxed) + ((since as u128 * scale as u128) >> 32) as u64
        })
    }

    fn set(&self, anchor_ticks: u64, anchor_ns: u64, scale: u64) {
        self.anchor_ticks.store(anchor_ticks, Ordering::Relaxed);
        self.anchor_ns.store(anchor_ns, Ordering::Relaxed);
        self.max_ticks.store(
            ((MAX_AGE_NS as u128) << 32)
                .checked_div(scale as u128)
                .unwrap_or(0) as u64,
            Ordering::Relaxed,
        );
        self.scale.store(scale, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// One test at a time (the steer's memory is process-wide).
    fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
        static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
        ONE.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A machine whose counter runs at `ghz` from 0 when its vDSO said `base_ns`.
    struct Machine {
        ghz: f64,
        base_ns: u64,
    }

    impl Machine {
        fn ticks(&self, ns: u64) -> u64 {
            ((ns - self.base_ns) as f64 * self.ghz) as u64
        }
    }

    /// The steer's memory is process-wide: one test at a time, with the counter allowed
    /// and the memory empty.
    fn allowed() -> std::sync::MutexGuard<'static, ()> {
        let one = one_at_a_time();
        ALLOWED.store(1, Ordering::Relaxed);
        LAST_TICKS.store(0, Ordering::Relaxed);
        LAST_NS.store(0, Ordering::Relaxed);
        one
    }

    #[test]
    fn reads_the_vdso_until_steered_then_the_counter_within_a_few_ns() {
        let _one = allowed();
        let clock = FastClock::new();
        let machine = Machine {
            ghz: 2.6,
            base_ns: 1_000 * MS,
        };
        assert_eq!(
            clock.reading(machine.ticks(1_001 * MS)),
            None,
            "not steered"
        );
        clock.steer_at(machine.ticks(1_001 * MS), 1_001 * MS);
        assert_eq!(
            clock.reading(machine.ticks(1_002 * MS)),
            None,
            "no rate yet"
        );
        clock.steer_at(machine.ticks(1_021 * MS), 1_021 * MS);
        for at in [1_021 * MS, 1_030 * MS + 123, 1_100 * MS] {
            let read = clock.reading(machine.ticks(at)).expect("steered");
            assert!(read.abs_diff(at) <= 2, "{read} for {at}");
        }
        assert_eq!(
            clock.reading(machine.ticks(1_200 * MS)),
            None,
            "an anchor over 100 ms old is not trusted"
        );
        assert_eq!(
            clock.reading(machine.ticks(1_020 * MS)),
            None,
            "a counter behind its anchor is not trusted"
        );
    }

    #[test]
    fn steering_follows_a_drifting_vdso_without_ever_going_back() {
        let _one = allowed();
        let clock = FastClock::new();
        // The counter at 3 GHz; the vDSO's time runs 100 ppm faster than it for 2 s (the
        // kernel slews it), then 100 ppm slower.
        let ghz = 3.0;
        let vdso = |ticks: u64| -> u64 {
            let ns = ticks as f64 / ghz;
            let first = ns.min(2e9);
            let then = (ns - 2e9).max(0.0);
            (5e9 + first * 1.0001 + then * 0.9999) as u64
        };
        let (mut last, mut worst, mut settled) = (0, 0, 0);
        let step = (20.0 * MS as f64 * ghz) as u64;
        for tick in 0..200u64 {
            let at = tick * step + 1;
            clock.steer_at(at, vdso(at));
            for part in 0..20u64 {
                let inside = at + part * step / 20;
                let read = clock.reading(inside).unwrap_or_else(|| vdso(inside));
                assert!(
                    read >= last,
                    "backwards: {read} after {last} at tick {tick}"
                );
                last = read;
                let error = read.abs_diff(vdso(inside));
                if tick > 3 {
                    worst = worst.max(error);
                }
                // From a few ticks after the change on, steered back close.
                if tick > 110 {
                    settled = settled.max(error);
                }
            }
        }
        assert!(worst < 5_000, "{worst} ns from the vDSO at worst");
        assert!(settled < 200, "{settled} ns from the vDSO once steered");
    }

    #[test]
    fn a_second_device_s_tick_right_after_the_first_changes_nothing() {
        let _one = allowed();
        let clock = FastClock::new();
        clock.steer_at(1_000, 10 * MS);
        clock.steer_at(1_000 + 20 * MS, 30 * MS);
        let read = clock.reading(1_000 + 25 * MS).expect("steered");
        // 1 000 ticks later, the vDSO read 20 µs late (the thread was preempted between
        // its reads): far too short an interval to measure a rate (that one would say
        // 20 ns a tick), so nothing changes.
        clock.steer_at(1_000 + 20 * MS + 1_000, 30 * MS + 20_000);
        assert_eq!(clock.reading(1_000 + 25 * MS), Some(read));
        // The next tick measures over the whole 20 ms.
        clock.steer_at(1_000 + 40 * MS, 50 * MS);
        assert_eq!(clock.reading(1_000 + 40 * MS), Some(50 * MS));
    }

    #[test]
    fn a_jump_steps_to_the_vdso_and_garbage_turns_the_counter_off() {
        let _one = allowed();
        let clock = FastClock::new();
        clock.steer_at(1_000, 10 * MS);
        clock.steer_at(1_000 + 60 * MS, 30 * MS);
        assert!(clock.reading(1_000 + 70 * MS).is_some());
        // The vDSO moved 50 ms more than the counter said (a suspended VM): a step.
        clock.steer_at(1_000 + 120 * MS, 100 * MS);
        let read = clock.reading(1_000 + 120 * MS).expect("steered");
        assert_eq!(read, 100 * MS);
        // A counter that went backwards: no rate, the vDSO answers.
        clock.steer_at(500, 120 * MS);
        assert_eq!(clock.reading(600), None);
    }

    #[test]
    fn without_leave_it_never_reads_the_counter() {
        let _one = one_at_a_time();
        ALLOWED.store(0, Ordering::Relaxed);
        let clock = FastClock::new();
        clock.steer();
        std::thread::sleep(std::time::Duration::from_millis(6));
        clock.steer();
        assert_eq!(clock.reading(ticks()), None);
        let before = monotonic_ns();
        let read = clock.now_ns();
        assert!(read >= before && read <= monotonic_ns());
    }

    #[test]
    fn a_process_that_may_not_read_the_counter_keeps_the_vdso() {
        let _one = one_at_a_time();
        assert!(counter_readable(), "a test process may read it");
        // A child that turns rdtsc into a fault, as a record-and-replay debugger does.
        // SAFETY: fork in a test; the child only calls prctl and _exit.
        match unsafe { libc::fork() } {
            0 => {
                // SAFETY: PR_SET_TSC with a valid mode.
                let set = unsafe { libc::prctl(libc::PR_SET_TSC, libc::PR_TSC_SIGSEGV) };
                let code = if set == 0 && !counter_readable() {
                    0
                } else {
                    1
                };
                // SAFETY: ends the child without running the parent's exit handlers.
                unsafe { libc::_exit(code) }
            }
            child if child > 0 => {
                let mut status = 0;
                // SAFETY: waits for our own child.
                unsafe { libc::waitpid(child, &mut status, 0) };
                assert!(
                    libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                    "status {status}"
                );
            }
            _ => panic!("fork failed"),
        }
    }

    #[test]
    fn readers_beside_a_rewriting_thread_never_see_a_torn_anchor() {
        let clock = FastClock::new();
        // Two consistent anchors far apart: a reading mixing their words is neither's.
        let anchors = [(0u64, 0u64), (1u64 << 40, 1u64 << 50)];
        let at = 1u64 << 41;
        let expected = anchors.map(|(ticks, ns)| ns + (at - ticks));
        let set = |(ticks, ns): (u64, u64)| {
            clock.anchor_ticks.store(ticks, Ordering::Relaxed);
            clock.anchor_ns.store(ns, Ordering::Relaxed);
            clock.max_ticks.store(u64::MAX, Ordering::Relaxed);
            clock.scale.store(1 << 32, Ordering::Relaxed);
        };
        clock.rewrite(|| set(anchors[0]));
        let seen = std::thread::scope(|scope| {
            scope.spawn(|| {
                for turn in 0..200_000usize {
                    clock.rewrite(|| set(anchors[turn % 2]));
                }
            });
            let readers: Vec<_> = (0..3)
                .map(|_| {
                    scope.spawn(|| {
                        let mut seen = 0;
                        for _ in 0..200_000 {
                            if let Some(read) = clock.reading(at) {
                                assert!(expected.contains(&read), "{read}: a torn anchor");
                                seen += 1;
                            }
                        }
                        seen
                    })
                })
                .collect();
            readers
                .into_iter()
                .map(|reader| reader.join().expect("reader"))
                .sum::<u64>()
        });
        // How many reads fell between two rewrites depends on the machine's scheduling;
        // once the writer is done, every read does.
        eprintln!("{seen} readings beside the writer");
        assert_eq!(clock.reading(at), Some(expected[1]));
    }
}
