//! The limiter's own account of what it did, for an operator who has to explain a
//! workload that is not held to its limit (or held below it): `VGPU_LIMITER_TRACE=FILE`
//! makes the process write a few counters to FILE when it exits (one `name value` line
//! each, then one line per limited device). Off by default: without the variable no
//! counter is touched, so the launch path pays loads of a flag on the line of switches
//! it reads anyway (`lifecycle::SWITCHES`).
//!
//! The counters say which way launches went (fast path, slow path, held by the bucket,
//! measured, skipped for a capture, or without a limiter for their device), what was
//! charged (as measured, and after the host's correction factor), what the bucket made
//! the process wait, and how samples fared (settled, dropped, never taken and why), and
//! what the fast path itself cost: `fast_path_own_ns`, the wall time of the shim's own
//! work in fast-path launches with the real launch left out, read from the CPU's
//! time-stamp counter (two reads per launch, only while tracing; the trace's own
//! counting is in it), and whether the fast path's clock read the time-stamp counter
//! (`fast_clock_counter 1`) or the vDSO (`0`).
//! `slow_path_own_ns` is the same for the launches that went the slow way (samples'
//! events, settles, publish ticks), with their real launches and sleeps left out: the
//! two together are all the limiter's own time on the launching threads. Three parts of
//! the slow path's are given apart: `publish_own_ns` (over `publishes` ticks),
//! `settle_own_ns` (over `settles`) and `sample_events_own_ns` (over `sampled`).
//! Each device's line is followed by a `kernel COST SAMPLES LAUNCHES CHARGED CLASS NAME`
//! line per learned kernel: its cost, its samples (saturating at 255), its launches and
//! the busy ns charged for them while tracing (with its samples' corrections; a seed
//! charged before the kernel's first measurement is left out), its class of grid and its
//! function's name, asked of the driver when it was first measured (`remember_name`; at
//! exit the driver may no longer say).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use vgpu_contract::clock::monotonic_ns;

use super::fast_clock::ticks as read_ticks;
use super::lifecycle::SWITCHES;
use super::{NULL_KERNEL_KEY, kernel_of_key};
use crate::cuda::*;
use crate::state::real;

/// The env var naming the file.
pub const TRACE_ENV: &str = "VGPU_LIMITER_TRACE";

/// Time-stamp ticks of the shim's own work in fast-path launches (see [`ticks`]).
static OWN_TICKS: AtomicU64 = AtomicU64::new(0);
/// Ticks of slow-path launches with their real launches left out, and of the sleeps in
/// them (`slow`, `slept`).
static SLOW_TICKS: AtomicU64 = AtomicU64::new(0);
static SLEPT_TICKS: AtomicU64 = AtomicU64::new(0);
/// When tracing began, on both clocks, to turn ticks into ns.
static BEGAN_NS: AtomicU64 = AtomicU64::new(0);
static BEGAN_TICKS: AtomicU64 = AtomicU64::new(0);

/// One counter of [`COUNTERS`].
#[derive(Clone, Copy)]
pub enum Counter {
    /// Launches that reached the limiter of a limited device.
    Launches,
    /// Of those, how many took the fast path (no lock, no driver call).
    FastPath,
    /// Of the fast path's, how many went on a thread's tab (`super::tab`), and how many
    /// tabs were opened.
    Tabbed,
    TabsOpened,
    /// Launches that found no limiter for their thread's device (no current context, or
    /// a device without a limit).
    NoDevice,
    /// Launches recorded into a capture (neither delayed nor measured).
    Captured,
    /// Launches of a kernel whose cost was not known yet.
    Unknown,
    /// Unknown kernels launched without a measurement (no event could be had).
    UnknownUnmeasured,
    /// Unknown kernels charged a seed from their function's nearest known class of
    /// grid (no wait for another first measurement).
    Seeded,
    /// Launches bracketed by events.
    Sampled,
    /// Of them, those after which the device's next sample waits
    /// `duty::QUIET_SAMPLE_GAP_NS` (its samples agreed with their estimates lately).
    QuietGaps,
    /// Samples wanted but not taken: too many pending.
    SkippedPending,
    /// Samples wanted but not taken: no current context, or an event call failed.
    SkippedNoEvents,
    /// Samples read back, and samples dropped (a failed measurement).
    Settled,
    Dropped,
    /// Of the settled samples, how many started behind queued work and how many on an
    /// idle stream: as the GPU's own timestamps told (an idle gap), or where they did not
    /// show one, as the launch's projection had it.
    SettledBacklogged,
    SettledIdle,
    /// Samples of two launches (`super::pair`) that settled, those of them that taught
    /// a set-up (the second behind the first, both kernels steady), and those whose
    /// second launch did not come (another stream, an unknown kernel, or too late).
    Paired,
    PairsTaught,
    PairsDropped,
    /// Of the idle ones, how many were taken to have timed another context's slice:
    /// they taught nothing and were charged no more than projected
    /// (`duty::idle_sample_may_time_a_neighbour`).
    SettledIdleDiscounted,
    /// Samples that measured their launch call rather than the kernel, and taught
    /// nothing (`duty::is_doubtful`: the call loaded the kernel's code or lost its
    /// thread).
    DoubtfulSamples,
    /// Busy ns charged as measured (the union increments and corrections), and what the
    /// bucket was charged after the host's correction factor.
    ChargedNs,
    ChargedScaledNs,
    /// Corrections of settled samples: added, and given back.
    CorrectedUpNs,
    CorrectedDownNs,
    /// Launch waits on the bucket or a first measurement: how many sleeps, how long;
    /// and of the sleeps, those of an unknown kernel for another one's first
    /// measurement.
    Waits,
    WaitedNs,
    FirstMeasurementWaits,
    /// The per-thread context cache found stale by a sampled launch.
    StaleContext,
    /// GPU clock references seen to fire at once (taken), and not in time (dropped:
    /// the context waited for its slice on a time-sliced card).
    ClockTaken,
    ClockLate,
    /// The longest a launch waited on the bucket, ns (one launch's sleeps together).
    LongestWaitNs,
    /// Publish ticks run from the slow path, and settles that looked at pending
    /// samples: what [`Part::Publish`] and [`Part::Settle`] are divided by.
    Publishes,
    Settles,
    /// Launches of a known kernel that went the slow way because the bucket held them
    /// (in debt, and not riding along with queued work): what a limit that binds costs
    /// in slow-path launches, apart from the samples and the publish ticks.
    Held,
    /// Settled samples placed by their projection, not by the GPU's clock: no believed
    /// reference (events waiting for the context's slice) or a firing time not to be
    /// believed (`super::clock::believable`).
    PlacedByProjection,
    /// Of a launch's wait ([`Counter::LongestWaitNs`]), the longest part spent on
    /// another kernel's first measurement, ns: a wait the bucket did not decide.
    LongestFirstMeasurementWaitNs,
}

const COUNTER_NAMES: [&str; COUNTERS_LEN] = [
    "launches",
    "fast_path",
    "tabbed",
    "tabs_opened",
    "no_device",
    "captured",
    "unknown",
    "unknown_unmeasured",
    "seeded",
    "sampled",
    "quiet_gaps",
    "skipped_pending",
    "skipped_no_events",
    "settled",
    "dropped",
    "settled_backlogged",
    "settled_idle",
    "paired",
    "pairs_taught",
    "pairs_dropped",
    "settled_idle_discounted",
    "doubtful_samples",
    "charged_ns",
    "charged_scaled_ns",
    "corrected_up_ns",
    "corrected_down_ns",
    "waits",
    "waited_ns",
    "first_measurement_waits",
    "stale_context",
    "clock_taken",
    "clock_late",
    "longest_wait_ns",
    "publishes",
    "settles",
    "held",
    "placed_by_projection",
    "longest_first_measurement_wait_ns",
];

const COUNTERS_LEN: usize = Counter::LongestFirstMeasurementWaitNs as usize + 1;

/// The parts of the slow path's own time the trace gives apart (`part`), so that what a
/// limited launch costs beyond the fast path is measured where it goes.
#[derive(Clone, Copy)]
pub enum Part {
    /// Publish ticks (`super::publish`): the region's words, the card's view, the fast
    /// clock's steering.
    Publish,
    /// Settles (`super::settle`): finished samples read back (two elapsed times each,
    /// `Sample::read`) and learned from, in relaxed capture mode (two driver calls).
    Settle,
    /// A sampled launch's own events: the context asked of the driver, the events
    /// taken from the pool, and the two records.
    Events,
}

const PARTS_LEN: usize = Part::Events as usize + 1;
const PART_NAMES: [&str; PARTS_LEN] = ["publish_own_ns", "settle_own_ns", "sample_events_own_ns"];
static PART_TICKS: [AtomicU64; PARTS_LEN] = [const { AtomicU64::new(0) }; PARTS_LEN];
static COUNTERS: [AtomicU64; COUNTERS_LEN] = [const { AtomicU64::new(0) }; COUNTERS_LEN];

/// Turns tracing on when `VGPU_LIMITER_TRACE` names a file (read once, when the
/// limiter is built).
pub fn init() {
    if std::env::var_os(TRACE_ENV).is_some_and(|path| !path.is_empty()) {
        BEGAN_NS.store(monotonic_ns(), Ordering::Relaxed);
        BEGAN_TICKS.store(read_ticks(), Ordering::Relaxed);
        SWITCHES.tracing.store(true, Ordering::Relaxed);
    }
}

/// A time-stamp counter reading while tracing is on, else 0: the fast path reads it
/// around its own work (`own`).
#[inline]
pub fn ticks() -> u64 {
    if on() { read_ticks() } else { 0 }
}

/// Adds the shim's own work of one fast-path launch: from `started` to `launching`
/// (before the real launch) and from `launched` to now (after it). Nothing when
/// tracing is off (the readings are 0).
#[inline]
pub fn own(started: u64, launching: u64, launched: u64) {
    if started != 0 {
        let spent = launching
            .wrapping_sub(started)
            .wrapping_add(read_ticks().wrapping_sub(launched));
        OWN_TICKS.fetch_add(spent, Ordering::Relaxed);
    }
}

/// Adds one slow-path launch that began at `started` (0: tracing is off, nothing
/// added), of which `real_launch` ticks were the real launch.
pub fn slow(started: u64, real_launch: u64) {
    if started != 0 {
        let spent = read_ticks()
            .wrapping_sub(started)
            .saturating_sub(real_launch);
        SLOW_TICKS.fetch_add(spent, Ordering::Relaxed);
    }
}

/// Adds the time since `started` (a [`ticks`] reading; 0 adds nothing) to `part`.
pub fn part(part: Part, started: u64) {
    if started != 0 {
        PART_TICKS[part as usize].fetch_add(read_ticks().wrapping_sub(started), Ordering::Relaxed);
    }
}

/// Adds a sleep that began at `started` (a [`ticks`] reading; 0 adds nothing).
pub fn slept(started: u64) {
    if started != 0 {
        SLEPT_TICKS.fetch_add(read_ticks().wrapping_sub(started), Ordering::Relaxed);
    }
}

/// `ticks` in ns, at the rate the ticks went since tracing began.
fn ticks_ns(ticks: u64) -> u64 {
    let began = BEGAN_TICKS.load(Ordering::Relaxed);
    let elapsed_ticks = read_ticks().wrapping_sub(began);
    let elapsed_ns = monotonic_ns().saturating_sub(BEGAN_NS.load(Ordering::Relaxed));
    if began == 0 || elapsed_ticks == 0 {
        return 0;
    }
    (ticks as u128 * elapsed_ns as u128 / elapsed_ticks as u128) as u64
}

/// The fast path's own time, ns.
fn own_ns() -> u64 {
    ticks_ns(OWN_TICKS.load(Ordering::Relaxed))
}

/// The slow path's own time, ns: its launches' time less their real launches and
/// sleeps (a sleep of `throttle_only`, outside the slow path, is subtracted too).
fn slow_own_ns() -> u64 {
    let slow = SLOW_TICKS.load(Ordering::Relaxed);
    ticks_ns(slow.saturating_sub(SLEPT_TICKS.load(Ordering::Relaxed)))
}

/// Whether tracing is on.
#[inline]
pub fn on() -> bool {
    SWITCHES.tracing.load(Ordering::Relaxed)
}

/// Adds `by` to `counter` (nothing when tracing is off).
#[inline]
pub fn add(counter: Counter, by: u64) {
    if on() {
        COUNTERS[counter as usize].fetch_add(by, Ordering::Relaxed);
    }
}

/// Raises `counter` to `value` if it is lower (nothing when tracing is off).
#[inline]
pub fn most(counter: Counter, value: u64) {
    if on() {
        COUNTERS[counter as usize].fetch_max(value, Ordering::Relaxed);
    }
}

/// Counts one event.
#[inline]
pub fn count(counter: Counter) {
    add(counter, 1);
}

/// The trace's text: every counter, then `device_lines` (one per limited device).
pub fn render(device_lines: &[String]) -> String {
    let mut text = String::from("vgpu-limiter-trace 1\n");
    for (name, value) in COUNTER_NAMES.iter().zip(&COUNTERS) {
        let _ = writeln!(text, "{name} {}", value.load(Ordering::Relaxed));
    }
    let _ = writeln!(text, "fast_path_own_ns {}", own_ns());
    let _ = writeln!(text, "slow_path_own_ns {}", slow_own_ns());
    for (name, ticks) in PART_NAMES.iter().zip(&PART_TICKS) {
        let _ = writeln!(text, "{name} {}", ticks_ns(ticks.load(Ordering::Relaxed)));
    }
    let _ = writeln!(
        text,
        "fast_clock_counter {}",
        SWITCHES.clock.reads_the_counter() as u8
    );
    for line in device_lines {
        let _ = writeln!(text, "{line}");
    }
    text
}

/// Function names of learned kernels, by key, noted while tracing (`remember_name`).
static NAMES: Mutex<Option<HashMap<u64, String>>> = Mutex::new(None);

/// Notes the name of `key`'s function, once, while tracing: called where a kernel is
/// first measured (a settle, in its context), when the driver still names it.
pub fn remember_name(key: u64) {
    if !on() {
        return;
    }
    // Never waits (a fork may have left the lock held in a child): a name missed is
    // asked again at exit.
    let Ok(mut names) = NAMES.try_lock() else {
        return;
    };
    let Some((_, function)) = kernel_of_key(key) else {
        return;
    };
    let names = names.get_or_insert_with(HashMap::new);
    names
        .entry(key)
        .or_insert_with(|| function_name(function).unwrap_or_default());
}

/// A learned kernel for its trace line: its class of grid (`duty::grid_class`) and its
/// function's name (noted when it was first measured, else asked now), else its handle.
pub fn kernel_label(key: u64) -> String {
    let Some((class, function)) = kernel_of_key(key) else {
        return if key == NULL_KERNEL_KEY {
            "- null"
        } else {
            "- graph"
        }
        .into();
    };
    // Never waits: a fork may have left the lock held in a child.
    let noted = NAMES
        .try_lock()
        .ok()
        .and_then(|names| names.as_ref()?.get(&key).cloned())
        .filter(|name| !name.is_empty());
    match noted.or_else(|| function_name(function)) {
        Some(name) => format!("{class} {name}"),
        None => format!("{class} {function:#x}"),
    }
}

/// The driver's (mangled) name of `function`: `cuFuncGetName`, or `cuKernelGetName` for
/// a library's kernel handle, which the runtime (cudart 12 and later, so PyTorch's
/// kernels) launches in its place and `cuFuncGetName` refuses.
fn function_name(function: u64) -> Option<String> {
    use std::ffi::{c_char, c_void};
    let by_function = real!(cuFuncGetName as fn(*mut *const c_char, *mut c_void) -> CUresult);
    let by_kernel = real!(cuKernelGetName as fn(*mut *const c_char, *mut c_void) -> CUresult);
    [by_function, by_kernel].into_iter().find_map(|get_name| {
        let mut name = std::ptr::null();
        // SAFETY: valid out-pointer; a handle the process launched (a stale one, or one
        // of the other kind, only returns an error).
        if unsafe { get_name(&mut name, function as *mut c_void) } != CUDA_SUCCESS || name.is_null()
        {
            return None;
        }
        // SAFETY: the driver returned a NUL-terminated name it owns.
        let name = unsafe { std::ffi::CStr::from_ptr(name) }.to_string_lossy();
        Some(name.into_owned())
    })
}

/// Writes the trace to the file `VGPU_LIMITER_TRACE` names (at exit), with the process
/// id in the name when the path ends in `.%p`, so every process of a container leaves
/// its own. Failure to write is ignored: the trace is a diagnostic.
pub fn write(device_lines: &[String]) {
    if !on() {
        return;
    }
    let Some(path) = std::env::var_os(TRACE_ENV) else {
        return;
    };
    let path = path.to_string_lossy().into_owned();
    let path = match path.strip_suffix(".%p") {
        Some(stem) => format!("{stem}.{}", std::process::id()),
        None => path,
    };
    let _ = std::fs::write(path, render(device_lines));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_count_only_when_on_and_render_by_name() {
        count(Counter::Launches);
        assert!(render(&[]).contains("launches 0\n"), "off: nothing counted");
        SWITCHES.tracing.store(true, Ordering::Relaxed);
        count(Counter::Launches);
        add(Counter::WaitedNs, 5_000);
        let text = render(&["device GPU-1 limit 30".to_string()]);
        SWITCHES.tracing.store(false, Ordering::Relaxed);
        assert!(text.starts_with("vgpu-limiter-trace 1\n"), "{text}");
        assert!(text.contains("launches 1\n"), "{text}");
        assert!(text.contains("waited_ns 5000\n"), "{text}");
        assert!(text.contains("stale_context 0\n"), "{text}");
        assert!(text.contains("fast_path_own_ns "), "{text}");
        assert!(text.contains("slow_path_own_ns "), "{text}");
        assert!(text.contains("fast_clock_counter "), "{text}");
        assert!(text.ends_with("device GPU-1 limit 30\n"), "{text}");
    }

    /// Sets where the conversion of ticks to ns begins, as `init` does.
    fn start_the_tick_rate() {
        BEGAN_NS.store(monotonic_ns(), Ordering::Relaxed);
        BEGAN_TICKS.store(read_ticks(), Ordering::Relaxed);
    }

    /// Keeps the thread busy for `ns`.
    fn spin(ns: u64) {
        let until = monotonic_ns() + ns;
        while monotonic_ns() < until {}
    }

    #[test]
    fn the_fast_path_own_time_leaves_the_real_launch_out_and_is_told_in_ns() {
        start_the_tick_rate();
        // 2 ms of "own work" around 50 ms of "real launch".
        let started = read_ticks();
        spin(1_000_000);
        let launching = read_ticks();
        spin(50_000_000);
        let launched = read_ticks();
        spin(1_000_000);
        own(started, launching, launched);
        let ns = own_ns();
        // At least the 2 ms spun; a preempted thread only adds, and not the 50 ms.
        assert!((2_000_000..50_000_000).contains(&ns), "{ns} ns");
        // Readings of 0 (tracing off) add nothing.
        let before = OWN_TICKS.load(Ordering::Relaxed);
        own(0, 5, 7);
        assert_eq!(OWN_TICKS.load(Ordering::Relaxed), before);
    }

    #[test]
    fn the_slow_path_own_time_leaves_its_real_launch_and_its_sleeps_out() {
        start_the_tick_rate();
        let before = slow_own_ns();
        // 2 ms of own work around a 40 ms sleep and a 40 ms "real launch".
        let started = read_ticks();
        spin(1_000_000);
        let sleeping = read_ticks();
        std::thread::sleep(std::time::Duration::from_millis(40));
        slept(sleeping);
        let launching = read_ticks();
        spin(40_000_000);
        let real_launch = read_ticks().wrapping_sub(launching);
        spin(1_000_000);
        slow(started, real_launch);
        let ns = slow_own_ns() - before;
        // At least the 2 ms spun; a preempted thread only adds, and not the 40 ms of
        // either.
        assert!((2_000_000..40_000_000).contains(&ns), "{ns} ns");
        // Readings of 0 (tracing off) add nothing.
        let (slow_before, slept_before) = (
            SLOW_TICKS.load(Ordering::Relaxed),
            SLEPT_TICKS.load(Ordering::Relaxed),
        );
        slow(0, 5);
        slept(0);
        assert_eq!(SLOW_TICKS.load(Ordering::Relaxed), slow_before);
        assert_eq!(SLEPT_TICKS.load(Ordering::Relaxed), slept_before);
    }

    #[test]
    fn a_part_of_the_slow_path_gets_the_time_from_its_start_and_nothing_while_off() {
        start_the_tick_rate();
        let ticks = |part: Part| PART_TICKS[part as usize].load(Ordering::Relaxed);
        let before = (ticks(Part::Settle), ticks(Part::Publish));
        let started = read_ticks();
        spin(2_000_000);
        part(Part::Settle, started);
        let settled = ticks_ns(ticks(Part::Settle) - before.0);
        // At least the 2 ms spun (a preempted thread only adds), and only to its part.
        assert!(settled >= 1_900_000, "{settled} ns");
        assert_eq!(ticks(Part::Publish), before.1);
        part(Part::Publish, 0);
        assert_eq!(
            ticks(Part::Publish),
            before.1,
            "a reading of 0 adds nothing"
        );
        let text = render(&[]);
        for name in PART_NAMES {
            assert!(text.contains(&format!("\n{name} ")), "{text}");
        }
    }
}
