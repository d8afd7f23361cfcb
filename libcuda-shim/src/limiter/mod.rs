//! The compute (SM) limiter: throttles kernel launches so that the GPU time a
//! container's work takes on a card, divided by wall time, stays at its `core_limit`.
//!
//! Busy time is the union of the container's kernels on the card, not their sum: each
//! stream keeps a projected "busy until" (a launch on stream `s` at host time `t` with
//! cost `c` runs over `[max(t, busy_until_s), +c)`), the container keeps the latest
//! projected end of any of its streams (the horizon), and a launch is charged only what
//! it adds beyond the horizon (`duty::union_increment`). Four streams of kernels that
//! overlap on the card pay once, as the card spends it.
//!
//! Costs are measured, not guessed from NVML: a sampled launch is bracketed by two CUDA
//! events on its own stream, and once the end event completes `cuEventElapsedTime` says
//! what it took (resource waits behind the container's own kernels included, which is
//! what makes the union of projections match the card when kernels do not all fit).
//! That teaches a per-kernel cost (`tables::Estimates`) from which every other launch is
//! charged; a settled sample corrects the bucket by what its measured run adds to the
//! union beyond what its estimate did.
//!
//! The bucket, the horizon and the rate live in the container's usage region
//! (`shared::Shared`), so all processes of a container spend one budget. A launch that
//! is not sampled takes no lock and makes no driver call: a few atomics, one clock read
//! (the current device comes from `crate::current`, captures from
//! `hooks::capture::possible`). Sampled launches, waits and the publish tick (every
//! `PUBLISH_NS`: activity for the host's coordinator, and in soft mode the card's view)
//! take the slow path.
//!
//! Safety rails: nothing is throttled or timed while the launch's stream captures a
//! graph, in a forked child until it rebuilds, or once the process is exiting; our own
//! event calls run in relaxed capture mode while any capture is under way. No thread is
//! started and nothing sleeps with a lock held.

pub mod duty;
mod sample;
mod shared;
mod tables;
mod trace;

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use vgpu_contract::CoreMode;
use vgpu_contract::cardview::{self, CardView};
use vgpu_contract::clock::monotonic_ns;
use vgpu_contract::limiter_words::slot as slot_words;
use vgpu_contract::region::{Region, SLOT_LIMITER_WORDS, SlotId};

use crate::cuda::*;
use crate::current::PER_THREAD_KEY_BIT;
use crate::debug;
use crate::hooks::capture;
use crate::state::{Enforcer, Visible, enforcer, real};
use sample::{CLOCK_REFRESH_NS, GpuClock, RelaxedCapture, Sample, destroy_events};
use shared::Shared;
use tables::{Estimates, Streams};
use trace::Counter;

/// Bucket window: the burst a limited container may take at once is `limit` of this,
/// so no 100 ms stretch exceeds the limit by more than a fifth of it. Long enough that a
/// burst holds several rounds of kernels on concurrent streams (each round's ragged
/// edge costs a little overlap), short enough for a 100 ms window to see the limit.
const WINDOW_NS: u64 = 20_000_000;
/// A launch held back by the limit waits until the bucket has refilled this much wall
/// time's worth, so that all the container's streams resume together and overlap: with
/// a trickle of budget, only one of them would get through at a time. Less than the
/// window, so that oversleeping by up to a quarter of it loses nothing.
const REFILL_NS: u64 = WINDOW_NS * 3 / 4;
/// How often a process publishes its activity and, in soft mode, reads the card view.
const PUBLISH_NS: u64 = 20_000_000;
/// The longest single sleep: rate changes and exit are noticed within this.
const SLEEP_SLICE_NS: u64 = 20_000_000;
/// The shortest sleep: shorter ones cost more in wake-up latency than they throttle;
/// oversleeping is no loss, the bucket keeps what accrues meanwhile (up to its burst).
const MIN_SLEEP_NS: u64 = 500_000;
/// How long a launch waits for the first measurement of an unknown kernel before it
/// goes ahead unmeasured.
const FIRST_MEASURE_PATIENCE_NS: u64 = 2_000_000_000;
/// Samples of short kernels on a device are at least this far apart (a long kernel is
/// sampled every launch): with launches of a few microseconds, one in eight would cost
/// more in event calls than the launch itself.
const MIN_SAMPLE_GAP_NS: u64 = 200_000;
/// Finished samples are read at most this often.
const SETTLE_EVERY_NS: u64 = 200_000;
/// The activity word is written at most this often.
const ACTIVE_STAMP_NS: u64 = 1_000_000;
/// Unsettled samples kept at most; beyond it launches are charged from estimates only.
const MAX_PENDING: usize = 256;
/// Unsettled samples of known kernels kept at most: the rest is room for the first
/// measurements of unknown ones, which are charged nothing until they settle.
const MAX_PENDING_KNOWN: usize = MAX_PENDING * 3 / 4;
/// Events kept ready per context.
const POOL_TARGET: usize = 32;
const ESTIMATE_SLOTS: usize = 4096;
const STREAM_SLOTS: usize = 256;
/// The stream key of the legacy default stream.
const LEGACY_KEY: u64 = 1;
/// Bits of busy ns in `DeviceLimiter::unpublished` (4.9 hours; it is emptied every
/// publish tick).
const BUSY_BITS: u32 = 44;

/// What one launch is, for costing: a kernel (its function handle) or a graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Work {
    Kernel(usize),
    Graph(usize),
}

impl Work {
    /// A nonzero key per kernel or graph.
    fn key(self) -> u64 {
        match self {
            Work::Kernel(0) => 1 << 61,
            Work::Kernel(function) => function as u64,
            Work::Graph(exec) => exec as u64 | (1 << 63),
        }
    }
}

/// The stream a launch goes to; `per_thread` for the `_ptsz` entry points, where a null
/// stream means the calling thread's default stream.
#[derive(Clone, Copy, Debug)]
pub struct Target {
    pub stream: CUstream,
    pub per_thread: bool,
}

impl Target {
    fn stream(self) -> CUstream {
        if self.per_thread && self.stream.is_null() {
            CU_STREAM_PER_THREAD as CUstream
        } else {
            self.stream
        }
    }

    fn is_per_thread(self) -> bool {
        self.stream() as usize == CU_STREAM_PER_THREAD
    }

    fn is_legacy(self) -> bool {
        matches!(self.stream() as usize, 0 | CU_STREAM_LEGACY)
    }

    /// The key of its projection: the legacy stream, the calling thread's per-thread
    /// stream, or the stream handle.
    fn key(self) -> u64 {
        if self.is_legacy() {
            LEGACY_KEY
        } else if self.is_per_thread() {
            PER_THREAD_KEY_BIT | crate::current::thread_tag()
        } else {
            self.stream as u64
        }
    }

    /// Whether the stream waits for the legacy stream (and it for the stream).
    fn is_blocking(self) -> bool {
        if self.is_legacy() || self.is_per_thread() {
            return true;
        }
        let get_flags = real!(cuStreamGetFlags as fn(CUstream, *mut u32) -> CUresult);
        let mut flags = 0u32;
        // SAFETY: valid out-pointer; the caller's stream.
        let known = unsafe { get_flags(self.stream, &mut flags) } == CUDA_SUCCESS;
        known && flags & CU_STREAM_NON_BLOCKING == 0
    }
}

const LIMITS_UNKNOWN: u8 = 0;
const LIMITS_NONE: u8 = 1;
const LIMITS_SOME: u8 = 2;
/// Whether any visible device has a compute limit: the launch hooks' fast path is one
/// load of this and a branch.
static LIMITS: AtomicU8 = AtomicU8::new(LIMITS_UNKNOWN);
static EXITING: AtomicBool = AtomicBool::new(false);
static LIMITER: AtomicPtr<Limiter> = AtomicPtr::new(std::ptr::null_mut());

/// Runs `launch` (the real launch) for `work` on `target`, throttled and measured when
/// the current device has a compute limit; returns what the real launch returned.
#[inline]
pub fn launch(work: Work, target: Target, launch: impl FnOnce() -> CUresult) -> CUresult {
    if LIMITS.load(Ordering::Relaxed) == LIMITS_NONE {
        return launch();
    }
    limited_launch(work, target, launch)
}

/// Throttles only (no measurement): for launches that span devices or streams in a way
/// events cannot bracket (cuLaunchCooperativeKernelMultiDevice).
pub fn throttle_only(launch: impl FnOnce() -> CUresult) -> CUresult {
    if LIMITS.load(Ordering::Relaxed) == LIMITS_NONE {
        return launch();
    }
    if let Some(device) = current_limited() {
        device.wait_turn(false, None);
    }
    launch()
}

#[inline(never)]
fn limited_launch(work: Work, target: Target, launch: impl FnOnce() -> CUresult) -> CUresult {
    let Some(device) = current_limited() else {
        trace::count(Counter::NoDevice);
        return launch();
    };
    if capture::possible() && is_capturing(target) {
        trace::count(Counter::Captured);
        return launch();
    }
    trace::count(Counter::Launches);
    let now = monotonic_ns();
    let rate = device.rate();
    let sample_open = now >= device.next_sample_ns.load(Ordering::Relaxed);
    let estimate = device
        .estimates
        .count_launch(work.key(), sample_open, duty::sample_every(now));
    if let Some((known, false)) = estimate
        && (device.shared.hold(now, rate, REFILL_NS) == 0
            || device.rides_along(target, known.cost_ns, now))
        && now < device.next_publish_ns.load(Ordering::Relaxed)
    {
        let result = launch();
        if result == CUDA_SUCCESS {
            trace::count(Counter::FastPath);
            device.charge(target, known.cost_ns, now, rate);
        }
        return result;
    }
    device.slow_launch(work, target, estimate, launch)
}

/// The limiter of the calling thread's current device, when it has a compute limit and
/// throttling is allowed now.
fn current_limited() -> Option<&'static DeviceLimiter> {
    if EXITING.load(Ordering::Relaxed) {
        return None;
    }
    let Ok(Some(enforcer)) = enforcer() else {
        LIMITS.store(LIMITS_NONE, Ordering::Relaxed);
        return None;
    };
    let limiter = limiter(enforcer)?;
    if limiter.only_device {
        return limiter.devices.first();
    }
    let (_, device) = crate::current::for_launch()?;
    limiter
        .devices
        .iter()
        .find(|limited| limited.visible.handle == device)
}

/// Whether `target`'s stream is capturing (or capture forbids asking): then the launch
/// is recorded into a graph, not run, and must be neither delayed nor bracketed.
fn is_capturing(target: Target) -> bool {
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

/// All limited devices of this process.
struct Limiter {
    generation: u64,
    devices: Vec<DeviceLimiter>,
    /// The container sees one device, and it is limited: every launch goes to it.
    only_device: bool,
}

/// One limited device.
struct DeviceLimiter {
    visible: Visible,
    limit_ppm: u64,
    ceiling: u32,
    soft: bool,
    region: &'static Region,
    shared: Shared<'static>,
    slot: Option<SlotId>,
    /// This process's limiter words in its region slot.
    mine: Option<&'static [AtomicU64; SLOT_LIMITER_WORDS]>,
    estimates: Estimates,
    streams: Streams,
    next_publish_ns: AtomicU64,
    next_sample_ns: AtomicU64,
    /// Busy time and launches not yet added to the region (one atomic per launch on
    /// this process's own memory; the region gets them at each publish tick): busy ns
    /// in the low `BUSY_BITS`, launches above. Busy time is as measured (the host's
    /// coordinator compares it with what the card says), not scaled.
    unpublished: AtomicU64,
    /// Busy ns that settled samples gave back, taken off the next publish.
    given_back: AtomicU64,
    /// The host's correction of this container's charges on this card, per mille: what
    /// the card measured of the container's work against what the container measured
    /// itself (`cardview::charge_permille`); 1000 without a fresh view.
    charge_permille: AtomicU64,
    /// Pending samples of kernels that had no estimate yet.
    unknown_in_flight: AtomicUsize,
    /// Where the host's card views are, and who this container is in them.
    card_dir: Option<PathBuf>,
    container_id: Option<String>,
    slow: Mutex<Slow>,
}

/// What only sampled launches and settling touch.
struct Slow {
    pending: VecDeque<Sample>,
    /// Spare events per context.
    pools: HashMap<usize, Vec<CUevent>>,
    /// Per context: how event times map to the host clock.
    clocks: HashMap<usize, GpuClock>,
    last_settle_ns: u64,
}

// SAFETY: the raw event and context handles are plain driver handles, valid from any thread.
unsafe impl Send for Slow {}

/// The limiter, built on first use (and again in a forked child); `None` when no
/// visible device has a compute limit.
fn limiter(enforcer: &'static Enforcer) -> Option<&'static Limiter> {
    let generation = crate::fork_epoch::generation();
    let current = LIMITER.load(Ordering::Acquire);
    // SAFETY: LIMITER only holds leaked, never-freed Limiter boxes.
    if let Some(limiter) = unsafe { current.as_ref() }
        && limiter.generation == generation
    {
        return (!limiter.devices.is_empty()).then_some(limiter);
    }
    // Before cuInit the devices are unknown: decide nothing yet.
    let visible = enforcer.devices()?;
    let devices = build_devices(enforcer, visible);
    let fresh = Box::into_raw(Box::new(Limiter {
        generation,
        only_device: visible.len() == 1 && devices.len() == 1,
        devices,
    }));
    register_handlers();
    let winner = match LIMITER.compare_exchange(current, fresh, Ordering::AcqRel, Ordering::Acquire)
    {
        Ok(_) => fresh,
        Err(other) => {
            // SAFETY: `fresh` is ours alone and was never shared.
            drop(unsafe { Box::from_raw(fresh) });
            other
        }
    };
    // SAFETY: as above, `winner` is a leaked, never-freed Limiter.
    let limiter = unsafe { &*winner };
    LIMITS.store(
        if limiter.devices.is_empty() {
            LIMITS_NONE
        } else {
            LIMITS_SOME
        },
        Ordering::Relaxed,
    );
    (!limiter.devices.is_empty()).then_some(limiter)
}

fn build_devices(enforcer: &'static Enforcer, devices: &[Visible]) -> Vec<DeviceLimiter> {
    let now = monotonic_ns();
    let slot = enforcer.slot();
    devices
        .iter()
        .filter_map(|visible| {
            let limit = visible.core_limit?;
            let soft = visible.core_mode == CoreMode::Soft;
            debug!(
                "compute limit {limit}% ({:?}) on {}",
                visible.core_mode, visible.uuid
            );
            let device = DeviceLimiter {
                visible: visible.clone(),
                limit_ppm: duty::percent_ppm(limit),
                ceiling: if soft {
                    visible.core_ceiling.unwrap_or(100).max(limit)
                } else {
                    limit
                },
                soft,
                region: &enforcer.region,
                shared: Shared::new(
                    enforcer.region.container_limiter(visible.region_index),
                    WINDOW_NS,
                ),
                slot,
                mine: slot.map(|slot| enforcer.region.slot_limiter(slot, visible.region_index)),
                estimates: Estimates::new(ESTIMATE_SLOTS),
                streams: Streams::new(STREAM_SLOTS),
                next_publish_ns: AtomicU64::new(0),
                next_sample_ns: AtomicU64::new(0),
                unpublished: AtomicU64::new(0),
                given_back: AtomicU64::new(0),
                charge_permille: AtomicU64::new(cardview::CHARGE_UNIT),
                unknown_in_flight: AtomicUsize::new(0),
                card_dir: enforcer.config.card_state_dir.clone(),
                container_id: enforcer.config.container_id.clone(),
                slow: Mutex::new(Slow {
                    pending: VecDeque::new(),
                    pools: HashMap::new(),
                    clocks: HashMap::new(),
                    last_settle_ns: 0,
                }),
            };
            device.publish(now);
            Some(device)
        })
        .collect()
}

fn register_handlers() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        trace::init();
        // SAFETY: registering a plain extern "C" exit handler (an atomic store, then the
        // trace under a panic guard); the shim is linked with -z nodelete.
        unsafe { libc::atexit(at_exit) };
        crate::fork_epoch::register();
    });
}

extern "C" fn at_exit() {
    EXITING.store(true, Ordering::SeqCst);
    // The trace formats and writes a file: a panic there must not unwind into libc.
    vgpu_shimgen::runtime::guard((), write_trace);
}

/// Writes `VGPU_LIMITER_TRACE` at exit, when it is on.
fn write_trace() {
    if !trace::on() {
        return;
    }
    // SAFETY: LIMITER only holds leaked, never-freed Limiter boxes.
    let lines: Vec<String> = unsafe { LIMITER.load(Ordering::Acquire).as_ref() }
        .map(|limiter| {
            limiter
                .devices
                .iter()
                .map(DeviceLimiter::describe)
                .collect()
        })
        .unwrap_or_default();
    trace::write(&lines);
}

impl DeviceLimiter {
    /// One line for the trace: the device, its limit and rate, the host's factor, and
    /// what its tables and queue hold (without waiting for the lock).
    fn describe(&self) -> String {
        let pending = self
            .slow
            .try_lock()
            .map(|slow| slow.pending.len().to_string())
            .unwrap_or_else(|_| "busy".into());
        format!(
            "device {} limit_ppm {} rate_ppm {} charge_permille {} soft {} pending {pending} unknown_in_flight {}",
            self.visible.uuid,
            self.limit_ppm,
            self.rate(),
            self.charge_permille.load(Ordering::Relaxed),
            self.soft as u8,
            self.unknown_in_flight.load(Ordering::Relaxed),
        )
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slow> {
        // A panic while the lock was held leaves consistent-enough numbers behind.
        self.slow
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The rate in force: the limit in hard mode; in soft mode what the container's
    /// processes last read from the card view, within `[limit, ceiling]`.
    fn rate(&self) -> u64 {
        if !self.soft {
            return self.limit_ppm;
        }
        self.shared
            .rate_ppm(self.limit_ppm)
            .clamp(self.limit_ppm, duty::percent_ppm(self.ceiling))
    }

    /// Projects a launch of `cost_ns` on `target` at `now_ns` and charges what it adds
    /// to the container's union; returns its projected start and the horizon before it.
    fn charge(&self, target: Target, cost_ns: u64, now_ns: u64, rate: u64) -> (u64, u64) {
        let placed = self.streams.place(
            target.key(),
            now_ns,
            cost_ns,
            self.floor(target, now_ns),
            self.shared.horizon(now_ns),
            || target.is_blocking(),
        );
        let (added, before) = self.shared.extend(placed.start, placed.end, now_ns);
        let scaled = self.scaled(added as i64);
        self.shared.charge(scaled, now_ns, rate);
        trace::add(Counter::ChargedNs, added);
        trace::add(Counter::ChargedScaledNs, scaled as u64);
        self.unpublished.fetch_add(
            added.min((1 << BUSY_BITS) - 1) + (1 << BUSY_BITS),
            Ordering::Relaxed,
        );
        self.stamp_active(now_ns);
        (placed.start, before)
    }

    /// `ns` of measured busy time as the bucket is charged it: scaled by the host's
    /// correction factor.
    fn scaled(&self, ns: i64) -> i64 {
        let permille = self.charge_permille.load(Ordering::Relaxed);
        if permille == cardview::CHARGE_UNIT || ns == 0 {
            return ns;
        }
        (ns as i128 * permille as i128 / cardview::CHARGE_UNIT as i128) as i64
    }

    /// What a stream of `target`'s kind waits for before its work starts at `now_ns`:
    /// the legacy stream for all of its context's blocking streams (the container's
    /// horizon stands in; other processes' work does not overlap a context's on a card
    /// without MPS anyway); a blocking stream for the legacy one.
    fn floor(&self, target: Target, now_ns: u64) -> impl Fn(bool) -> u64 + '_ {
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

    /// Whether a launch of `cost_ns` on `target` would run almost entirely within work
    /// the container has queued already (its union increment at most a quarter of its
    /// cost): such a launch goes even while launches are held, since it takes next to
    /// nothing more of the card. Without it a hold could fall between the streams of one
    /// round of concurrent kernels and leave them unbalanced, each lagging stream then
    /// paying in full for what would have overlapped.
    fn rides_along(&self, target: Target, cost_ns: u64, now_ns: u64) -> bool {
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
        added.saturating_mul(4) <= cost_ns
    }

    fn stamp_active(&self, now_ns: u64) {
        if let Some(words) = self.mine {
            let word = &words[slot_words::ACTIVE_NS];
            if now_ns >= word.load(Ordering::Relaxed).saturating_add(ACTIVE_STAMP_NS) {
                word.store(now_ns, Ordering::Relaxed);
            }
        }
    }

    /// The slow path: waits its turn, measures the launch if it should be, charges it.
    fn slow_launch(
        &self,
        work: Work,
        target: Target,
        estimate: Option<(duty::Estimate, bool)>,
        launch: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let key = work.key();
        let mut unknown = estimate.is_none();
        if unknown {
            trace::count(Counter::Unknown);
        }
        self.wait_turn(unknown, estimate.map(|(known, _)| (target, known.cost_ns)));
        // Another thread's sample may have taught the cost meanwhile.
        let known = match estimate {
            Some((known, _)) => Some(known),
            None => self.estimates.get(key),
        };
        unknown &= known.is_none();
        let due = unknown || estimate.is_some_and(|(_, due)| due);
        let now = monotonic_ns();
        if due && !unknown && known.is_some_and(|k| k.cost_ns < duty::ALWAYS_SAMPLE_NS) {
            self.next_sample_ns
                .store(now + MIN_SAMPLE_GAP_NS, Ordering::Relaxed);
        }
        let rate = self.rate();
        let cost = known.map(|k| k.cost_ns).unwrap_or(0);
        let bracket = if due {
            self.begin_sample(target, !unknown)
        } else {
            None
        };
        if unknown && bracket.is_none() {
            trace::count(Counter::UnknownUnmeasured);
        }
        let result = launch();
        let returned = monotonic_ns();
        if result != CUDA_SUCCESS {
            if let Some((context, start, end, _)) = bracket {
                self.give_back(context, &[start, end]);
            }
            return result;
        }
        let (projected_start, horizon_before) = self.charge(target, cost, now, rate);
        let Some((context, start, end, recorded_ns)) = bracket else {
            return result;
        };
        let record = real!(cuEventRecord as fn(CUevent, CUstream) -> CUresult);
        // SAFETY: an event of the current context, recorded on the caller's stream.
        if unsafe { record(end, target.stream()) } != CUDA_SUCCESS {
            self.give_back(context, &[start, end]);
            return result;
        }
        trace::count(Counter::Sampled);
        let sample = Sample {
            key,
            stream_key: target.key(),
            context,
            start,
            end,
            known: !unknown,
            projected_start,
            projected_ns: cost,
            horizon_before,
            recorded_ns,
            returned_ns: returned,
            // The projection's guess, used only where the GPU's own timestamps cannot
            // say (no reference event in this context).
            projected_idle: projected_start == now,
        };
        if unknown {
            self.unknown_in_flight.fetch_add(1, Ordering::AcqRel);
        }
        let mut slow = self.lock();
        slow.pending.push_back(sample);
        self.settle(&mut slow, returned, false);
        result
    }

    /// Waits until the container may launch again: not at all while the bucket is not in
    /// debt; once it is, until it has refilled `REFILL_NS`. An unknown kernel also waits
    /// (at most `FIRST_MEASURE_PATIENCE_NS`) for the measurement under way of another
    /// unknown one, so a queue of long kernels cannot slip past before anything is known.
    fn wait_turn(&self, unknown: bool, ride: Option<(Target, u64)>) {
        let started = monotonic_ns();
        loop {
            let now = monotonic_ns();
            self.maintain(now);
            let mut delay = self.shared.hold(now, self.rate(), REFILL_NS);
            if delay > 0
                && let Some((target, cost)) = ride
                && self.rides_along(target, cost, now)
            {
                delay = 0;
            }
            let sleep = if delay > 0 {
                delay.clamp(MIN_SLEEP_NS, SLEEP_SLICE_NS)
            } else if unknown
                && self.unknown_in_flight.load(Ordering::Acquire) > 0
                && now.saturating_sub(started) < FIRST_MEASURE_PATIENCE_NS
            {
                100_000
            } else {
                0
            };
            if sleep == 0 || EXITING.load(Ordering::Relaxed) {
                return;
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
            std::thread::sleep(Duration::from_nanos(sleep));
        }
    }

    /// The publish tick (one thread at a time) and reading finished samples.
    fn maintain(&self, now_ns: u64) {
        let due = self.next_publish_ns.load(Ordering::Acquire);
        if now_ns >= due
            && self
                .next_publish_ns
                .compare_exchange(
                    due,
                    now_ns + PUBLISH_NS,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
        {
            self.publish(now_ns);
        }
        if let Ok(mut slow) = self.slow.try_lock() {
            self.settle(&mut slow, now_ns, false);
        }
    }

    /// Stamps this process's heartbeat, adds its busy time (as measured, net of what
    /// settled samples gave back) and launches to the region, and reads the card's view:
    /// the host's correction factor for this container's charges (1 without a fresh view
    /// that names it), and in soft mode the rate it grants (the limit without one).
    fn publish(&self, now_ns: u64) {
        if let Some(words) = self.mine {
            words[slot_words::HEARTBEAT_NS].store(now_ns, Ordering::Relaxed);
        }
        let unpublished = self.unpublished.swap(0, Ordering::AcqRel);
        let busy = unpublished & ((1 << BUSY_BITS) - 1);
        let back = self.given_back.swap(0, Ordering::AcqRel);
        let net = busy.saturating_sub(back);
        if back > busy {
            // More given back than measured since: the rest comes off the next publish.
            self.given_back.fetch_add(back - busy, Ordering::AcqRel);
        }
        if (net != 0 || unpublished >> BUSY_BITS != 0)
            && let Some(slot) = self.slot
        {
            self.region.add_busy(
                slot,
                self.visible.region_index,
                net,
                unpublished >> BUSY_BITS,
            );
        }
        let Some(dir) = self.card_dir.as_deref() else {
            return;
        };
        let view = CardView::read(dir, &self.visible.uuid)
            .map_err(|error| debug!("{error}; assuming the card is contended"))
            .ok();
        let id = self.container_id.as_deref();
        let factor = cardview::charge_permille(view.as_ref(), id, now_ns);
        let before = self.charge_permille.swap(factor, Ordering::Relaxed);
        if factor != before {
            debug!(
                "charge factor on {}: {before} -> {factor} per mille",
                self.visible.uuid
            );
        }
        if !self.soft {
            return;
        }
        let allowed = cardview::allowed_percent(
            view.as_ref(),
            id,
            now_ns,
            (self.limit_ppm / 10_000) as u32,
            self.ceiling,
        );
        let wanted = duty::percent_ppm(allowed);
        let before = self.rate();
        if wanted != before {
            debug!(
                "soft limit on {}: {}% -> {allowed}%",
                self.visible.uuid,
                before / 10_000
            );
            self.shared.set_rate(wanted, now_ns, self.limit_ppm);
        }
    }

    /// Records the start event of a sampled launch (of a `known` kernel, or the first
    /// measurement of an unknown one): (context, start, end, when). The context is asked
    /// of the driver (one call, on sampled launches only): events must be the context's
    /// that is really current, whatever made it current.
    fn begin_sample(&self, target: Target, known: bool) -> Option<(usize, CUevent, CUevent, u64)> {
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

    /// Reads finished samples: learns their cost and corrects the bucket by what their
    /// measured run adds to the union beyond what was charged. Rate-limited unless
    /// `force`. Events of one stream complete in order, so only the oldest pending
    /// sample of each stream is asked about: with the GPU far behind the host, one query
    /// per stream, not one per pending sample.
    fn settle(&self, slow: &mut Slow, now_ns: u64, force: bool) {
        if slow.pending.is_empty()
            || (!force && now_ns.saturating_sub(slow.last_settle_ns) < SETTLE_EVERY_NS)
        {
            return;
        }
        slow.last_settle_ns = now_ns;
        let query = real!(cuEventQuery as fn(CUevent) -> CUresult);
        let _relaxed = RelaxedCapture::enter_if_needed();
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
            // SAFETY: an event we created and recorded.
            let state = unsafe { query(slow.pending[index].end) };
            if state == CUDA_ERROR_NOT_READY {
                running.push(stream_key);
                index += 1;
                continue;
            }
            let Some(sample) = slow.pending.remove(index) else {
                break;
            };
            if !sample.known {
                self.unknown_in_flight.fetch_sub(1, Ordering::AcqRel);
            }
            self.settle_one(slow, sample, state == CUDA_SUCCESS, now_ns, rate);
        }
    }

    /// Learns from one finished sample (`completed`: its end event fired; else it failed)
    /// and corrects the bucket and the projections by where it really ran.
    fn settle_one(&self, slow: &mut Slow, sample: Sample, completed: bool, now_ns: u64, rate: u64) {
        let elapsed = real!(cuEventElapsedTime as fn(*mut f32, CUevent, CUevent) -> CUresult);
        let mut ms = 0f32;
        // SAFETY: valid out-pointer; both events recorded on one stream.
        let measured = completed
            && unsafe { elapsed(&mut ms, sample.start, sample.end) } == CUDA_SUCCESS
            && ms.is_finite();
        if !measured {
            // A destroyed context or a failed launch: the events are no good.
            trace::count(Counter::Dropped);
            slow.pools.remove(&sample.context);
            slow.clocks.remove(&sample.context);
            destroy_events(&[sample.start, sample.end]);
            return;
        }
        trace::count(Counter::Settled);
        let elapsed_ns = (ms.max(0.0) as f64 * 1e6) as u64;
        // When its events fired on the host's clock: by the context's reference event
        // when there is one (and it says something sane).
        let clock = match slow.clocks.entry(sample.context) {
            std::collections::hash_map::Entry::Occupied(entry) => Some(entry.into_mut()),
            // Its stream must be made in the sample's own context.
            std::collections::hash_map::Entry::Vacant(entry)
                if crate::current::current()
                    .is_some_and(|(context, _)| context == sample.context) =>
            {
                GpuClock::new().map(|c| entry.insert(c))
            }
            std::collections::hash_map::Entry::Vacant(_) => None,
        };
        let pool = slow.pools.entry(sample.context).or_default();
        let reference = clock.and_then(|clock| clock.reference(pool, now_ns));
        let sane = |at: &u64| *at <= now_ns && at.saturating_add(CLOCK_REFRESH_NS * 4) >= now_ns;
        let fired = |event| {
            reference
                .and_then(|reference| GpuClock::host_time(reference, event))
                .filter(sane)
        };
        let (start_fired, end_fired) = (fired(sample.start), fired(sample.end));
        let gap = sample.idle_gap_ns(start_fired);
        trace::count(if gap > 0 {
            Counter::SettledIdle
        } else {
            Counter::SettledBacklogged
        });
        let ns = Sample::kernel_ns(elapsed_ns, gap);
        self.estimates.record(sample.key, ns);
        // Where it really ended, else where its projection put it.
        let end = end_fired.unwrap_or(sample.projected_start.saturating_add(ns));
        let start = end.saturating_sub(ns);
        // A kernel measured for the first time was charged nothing: it pays what its run
        // adds to the union as it stood when it went out. A known one pays only for
        // running past everything queued since (counted once however many samples find
        // the same overrun).
        let (beyond_now, _) = self.shared.extend(start, end, now_ns);
        let mut correction = if sample.known {
            beyond_now as i64
        } else {
            duty::union_increment(start, end, sample.horizon_before) as i64
        };
        // A known kernel that ended before its projection, with nothing of the
        // container queued after it: the overshoot was charged for nothing (kernels that
        // wait for SMs behind the container's own are projected with the wait, and the
        // last ones of a round do not wait). Given back, and the horizon moves back, for
        // the settling of any other to extend again if it ran later.
        let projected_end = sample.projected_start.saturating_add(sample.projected_ns);
        if sample.known && self.shared.pull_back(projected_end, end) {
            correction -= (projected_end - end) as i64;
            self.streams
                .pull_back(sample.stream_key, projected_end, end);
        }
        self.shared.charge(self.scaled(correction), now_ns, rate);
        self.streams.extend(sample.stream_key, end);
        if correction > 0 {
            trace::add(Counter::CorrectedUpNs, correction as u64);
            self.unpublished.fetch_add(
                (correction as u64).min((1 << BUSY_BITS) - 1),
                Ordering::Relaxed,
            );
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

    fn give_back(&self, context: usize, events: &[CUevent]) {
        self.lock()
            .pools
            .entry(context)
            .or_default()
            .extend_from_slice(events);
    }
}

fn take_event(slow: &mut Slow, context: usize) -> Option<CUevent> {
    let pool = slow.pools.entry(context).or_default();
    if let Some(event) = pool.pop() {
        return Some(event);
    }
    let create = real!(cuEventCreate as fn(*mut CUevent, u32) -> CUresult);
    let _relaxed = RelaxedCapture::enter_if_needed();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_keys_tell_the_default_streams_apart() {
        let legacy = Target {
            stream: std::ptr::null_mut(),
            per_thread: false,
        };
        let per_thread = Target {
            stream: std::ptr::null_mut(),
            per_thread: true,
        };
        let owned = Target {
            stream: 0x7000 as CUstream,
            per_thread: true,
        };
        assert_eq!(legacy.key(), LEGACY_KEY);
        assert!(legacy.is_legacy() && legacy.is_blocking());
        assert_eq!(per_thread.key() & PER_THREAD_KEY_BIT, PER_THREAD_KEY_BIT);
        let elsewhere = std::thread::spawn(|| {
            Target {
                stream: std::ptr::null_mut(),
                per_thread: true,
            }
            .key()
        })
        .join()
        .expect("thread");
        assert_ne!(
            elsewhere,
            per_thread.key(),
            "each thread has its own default stream"
        );
        assert_eq!(owned.key(), 0x7000);
        assert_ne!(Work::Kernel(0).key(), 0);
        assert_ne!(Work::Graph(0x7000).key(), Work::Kernel(0x7000).key());
    }
}
