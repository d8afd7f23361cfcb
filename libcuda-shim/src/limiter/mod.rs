//! The compute (SM) limiter: throttles kernel launches so that the GPU time this
//! process's work takes, divided by wall time, stays at the container's `core_limit`.
//!
//! It measures the work itself, not NVML samples: a sampled launch is bracketed by two
//! CUDA events recorded on its own stream (the real `cuEventRecord`), and once the end
//! event completes `cuEventElapsedTime` gives what the kernel (or graph) really took.
//! That teaches a per-kernel cost (`duty::Estimates`), so most launches are charged at
//! launch from the estimate, with no events at all; each later sample corrects the
//! bucket by measured minus charged. A `duty::DutyCycle` bucket over 10 ms windows then
//! makes each launch wait while the process is in debt. Nothing sleeps with a lock held.
//!
//! Around it: soft mode reads the per-card state (`vgpu_common::cardstate`) to learn
//! whether another container is busy, every process publishes its busy fraction there,
//! and measured busy time goes into the usage region (`Region::add_busy`).
//!
//! Safety rails: no throttling (and no events) while the stream captures a graph, in a
//! forked child until it rebuilds, or once the process is exiting; a capture in global
//! mode on another thread is respected by switching this thread to relaxed capture
//! mode around our own event queries. No thread is started, so none can fail to start.

pub mod duty;

use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use vgpu_common::CoreMode;
use vgpu_common::cardstate::{self, CardState, EntryId, Report};
use vgpu_shimgen::runtime;

use crate::cuda::*;
use crate::debug;
use crate::state::{Enforcer, Visible, enforcer, real};
use duty::{DutyCycle, Estimates, RecentBusy};

pub type CUevent = *mut c_void;

/// Bucket window: the burst a limited process may take at once is `limit` of this, so
/// no 100 ms stretch exceeds the limit by more than a tenth of it.
const WINDOW_NS: u64 = 10_000_000;
/// How often a process publishes to the card state and re-reads contention.
const PUBLISH_NS: u64 = 20_000_000;
/// Another container counts as busy when it had work this recently.
const CONTENDED_WITHIN_NS: u64 = 200_000_000;
/// The longest single sleep: rate changes and exit are noticed within this.
const SLEEP_SLICE_NS: u64 = 20_000_000;
/// The shortest sleep: shorter ones cost more in wake-up latency than they throttle;
/// oversleeping is no loss, the bucket keeps what accrues meanwhile (up to its burst).
const MIN_SLEEP_NS: u64 = 500_000;
/// How long a launch waits for the first measurement of an unknown kernel before it
/// goes ahead unmeasured.
const FIRST_MEASURE_PATIENCE_NS: u64 = 2_000_000_000;
/// Unsettled samples kept at most; beyond it launches are charged from estimates only.
const MAX_PENDING: usize = 256;
/// Events kept ready per context.
const POOL_TARGET: usize = 32;

const CU_STREAM_PER_THREAD: usize = 0x2;
const CUDA_ERROR_NOT_READY: CUresult = 600;
const CU_STREAM_CAPTURE_STATUS_NONE: u32 = 0;
const CU_STREAM_CAPTURE_MODE_RELAXED: u32 = 2;

/// What one launch is, for costing: a kernel (its function handle) or a graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Work {
    Kernel(usize),
    Graph(usize),
}

impl Work {
    fn key(self) -> u64 {
        match self {
            Work::Kernel(function) => function as u64,
            Work::Graph(exec) => exec as u64 ^ (1 << 63),
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
}

const LIMITS_UNKNOWN: u8 = 0;
const LIMITS_NONE: u8 = 1;
const LIMITS_SOME: u8 = 2;
/// Whether any visible device has a compute limit: the launch hooks' fast path is one
/// load of this and a branch.
static LIMITS: AtomicU8 = AtomicU8::new(LIMITS_UNKNOWN);
static EXITING: AtomicBool = AtomicBool::new(false);
static FORK_GENERATION: AtomicU64 = AtomicU64::new(0);
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
        device.wait_turn(None);
    }
    launch()
}

#[cold]
fn limited_launch(work: Work, target: Target, launch: impl FnOnce() -> CUresult) -> CUresult {
    let Some(device) = current_limited() else {
        return launch();
    };
    if is_capturing(target) {
        return launch();
    }
    let unknown = device.wait_turn(Some(work));
    let sample = device.begin_sample(work, target, unknown);
    let result = launch();
    device.finish_launch(target, sample, result == CUDA_SUCCESS);
    result
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
    let visible = enforcer.current().ok()?;
    limiter
        .devices
        .iter()
        .find(|device| device.visible.real == visible.real)
}

/// Whether `target`'s stream is capturing (or capture forbids asking): then the launch
/// is recorded into a graph, not run, and must be neither delayed nor bracketed.
fn is_capturing(target: Target) -> bool {
    let is_capturing = real!(cuStreamIsCapturing as fn(CUstream, *mut u32) -> CUresult);
    let mut status = CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: valid out-pointer; the stream is the caller's.
    match unsafe { is_capturing(target.stream(), &mut status) } {
        CUDA_SUCCESS => status != CU_STREAM_CAPTURE_STATUS_NONE,
        // CUDA_ERROR_STREAM_CAPTURE_*: a capture is going on around this call.
        900..=909 => true,
        _ => false,
    }
}

/// All limited devices of this process.
struct Limiter {
    generation: u64,
    devices: Vec<DeviceLimiter>,
}

/// One limited device.
struct DeviceLimiter {
    visible: Visible,
    limit: u32,
    card: Option<(CardState, EntryId)>,
    container: u64,
    inner: Mutex<Inner>,
}

struct Inner {
    bucket: DutyCycle,
    estimates: Estimates,
    pending: VecDeque<Sample>,
    /// Spare events per context.
    pools: HashMap<usize, Vec<CUevent>>,
    recent: RecentBusy,
    had_work: bool,
    last_settle_ns: u64,
}

// SAFETY: the raw event and context handles are plain driver handles, valid from any thread.
unsafe impl Send for Inner {}

/// A bracketed launch whose end event has not been read yet.
struct Sample {
    key: u64,
    context: usize,
    start: CUevent,
    end: CUevent,
    /// What the launch was charged when it went out.
    charged_ns: u64,
    /// Whether it was charged from an estimate (else it is paid when it settles).
    known: bool,
    /// When the stream was idle as the start event went in, the start event fires at
    /// once and the kernel only after the launch call submitted it: the host time from
    /// the start event's record to the launch's return, which the GPU spent idle (as
    /// NVML sees it) and must not be charged. Zero when the stream had work queued, so
    /// the start event fired only when that work finished.
    idle_gap_ns: u64,
    /// Monotonic ns just after the start event was recorded on an idle stream; 0 else.
    idle_since_ns: u64,
}

impl Sample {
    fn unmeasured(key: u64, charged_ns: u64) -> Sample {
        Sample {
            key,
            context: 0,
            start: std::ptr::null_mut(),
            end: std::ptr::null_mut(),
            charged_ns,
            known: true,
            idle_gap_ns: 0,
            idle_since_ns: 0,
        }
    }

    /// The kernel's own GPU time from the events' elapsed time.
    fn kernel_ns(&self, elapsed_ns: u64) -> u64 {
        // Never below a quarter of what the events saw: an over-long host gap (the
        // thread descheduled, say) must not make a kernel look free.
        elapsed_ns
            .saturating_sub(self.idle_gap_ns)
            .max(elapsed_ns / 4)
    }
}

/// The limiter, built on first use (and again in a forked child); `None` when no
/// visible device has a compute limit.
fn limiter(enforcer: &Enforcer) -> Option<&'static Limiter> {
    let generation = FORK_GENERATION.load(Ordering::Acquire);
    let current = LIMITER.load(Ordering::Acquire);
    // SAFETY: LIMITER only holds leaked, never-freed Limiter boxes.
    if let Some(limiter) = unsafe { current.as_ref() }
        && limiter.generation == generation
    {
        return (!limiter.devices.is_empty()).then_some(limiter);
    }
    // Before cuInit the devices are unknown: decide nothing yet.
    let devices = enforcer.devices()?;
    let fresh = Box::into_raw(Box::new(Limiter {
        generation,
        devices: build_devices(enforcer, devices),
    }));
    register_handlers();
    let winner = match LIMITER.compare_exchange(current, fresh, Ordering::AcqRel, Ordering::Acquire)
    {
        Ok(_) => fresh,
        Err(other) => {
            // SAFETY: `fresh` is ours alone and was never shared.
            let ours = unsafe { Box::from_raw(fresh) };
            ours.leave_cards();
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

fn build_devices(enforcer: &Enforcer, devices: &[Visible]) -> Vec<DeviceLimiter> {
    let container = cardstate::container_id(enforcer.region.path());
    let now = cardstate::monotonic_ns();
    devices
        .iter()
        .filter_map(|visible| {
            let limit = visible.core_limit?;
            let card = join_card(enforcer, visible, container, now);
            let start = duty::effective_percent(
                visible.core_mode,
                limit,
                visible.core_ceiling,
                visible.core_mode == CoreMode::Soft && card.is_none(),
            );
            debug!(
                "compute limit {limit}% ({:?}) on {}",
                visible.core_mode, visible.uuid
            );
            Some(DeviceLimiter {
                visible: visible.clone(),
                limit,
                card,
                container,
                inner: Mutex::new(Inner {
                    bucket: DutyCycle::new(start, WINDOW_NS, now),
                    estimates: Estimates::default(),
                    pending: VecDeque::new(),
                    pools: HashMap::new(),
                    recent: RecentBusy::new(now),
                    had_work: false,
                    last_settle_ns: 0,
                }),
            })
        })
        .collect()
}

/// Where the per-card state files live: the config's `card_state_dir`, else
/// `vgpu-cards` in the temp folder (shared by every `vgpu run` of the host).
pub fn card_state_dir(enforcer: &Enforcer) -> PathBuf {
    enforcer
        .config
        .card_state_dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join("vgpu-cards"))
}

fn join_card(
    enforcer: &Enforcer,
    visible: &Visible,
    container: u64,
    now: u64,
) -> Option<(CardState, EntryId)> {
    let dir = card_state_dir(enforcer);
    let opened = CardState::open(&dir, &visible.uuid).and_then(|(card, _)| {
        let entry = card.join(&vgpu_common::process::current(), container, now)?;
        Ok((card, entry))
    });
    match opened {
        Ok(joined) => Some(joined),
        Err(err) => {
            let consequence = if visible.core_mode == CoreMode::Soft {
                "soft mode keeps to its limit"
            } else {
                "other containers cannot see this one"
            };
            runtime::notice("cuda", format_args!("{err}; {consequence}"));
            None
        }
    }
}

impl Limiter {
    fn leave_cards(&self) {
        for device in &self.devices {
            if let Some((card, entry)) = &device.card {
                card.leave(*entry);
            }
        }
    }
}

fn register_handlers() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: registering plain extern "C" handlers that only touch atomics (and, at
        // exit, the leaked limiter); the shim is linked with -z nodelete.
        unsafe {
            libc::pthread_atfork(None, None, Some(after_fork_in_child));
            libc::atexit(at_exit);
        }
    });
}

extern "C" fn after_fork_in_child() {
    FORK_GENERATION.fetch_add(1, Ordering::SeqCst);
}

extern "C" fn at_exit() {
    EXITING.store(true, Ordering::SeqCst);
    runtime::guard((), || {
        // SAFETY: LIMITER only holds leaked limiters.
        if let Some(limiter) = unsafe { LIMITER.load(Ordering::Acquire).as_ref() }
            && limiter.generation == FORK_GENERATION.load(Ordering::Acquire)
        {
            limiter.leave_cards();
        }
    });
}

impl DeviceLimiter {
    fn lock(&self) -> Option<std::sync::MutexGuard<'_, Inner>> {
        // A panic while the lock was held leaves consistent-enough numbers behind.
        Some(
            self.inner
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        )
    }

    /// Waits until this process may launch again. Returns whether `work` has no cost
    /// estimate yet (then this launch is measured and paid when it settles).
    fn wait_turn(&self, work: Option<Work>) -> bool {
        let started = cardstate::monotonic_ns();
        loop {
            let now = cardstate::monotonic_ns();
            let (sleep_ns, unknown) = {
                let Some(mut inner) = self.lock() else {
                    return false;
                };
                self.settle(&mut inner, now, false);
                self.publish(&mut inner, now);
                let unknown = work.is_some_and(|work| inner.estimates.get(work.key()).is_none());
                // An unknown kernel waits for the measurement already under way of
                // another unknown one, so a queue of long kernels cannot slip past.
                let unknown_in_flight = unknown && inner.pending.iter().any(|sample| !sample.known);
                let delay = inner.bucket.delay(now);
                let sleep = if delay > 0 {
                    delay.clamp(MIN_SLEEP_NS, SLEEP_SLICE_NS)
                } else if unknown_in_flight
                    && now.saturating_sub(started) < FIRST_MEASURE_PATIENCE_NS
                {
                    100_000
                } else {
                    0
                };
                if sleep > 0 {
                    inner.recent.add_wait(sleep);
                }
                (sleep, unknown)
            };
            if sleep_ns == 0 || EXITING.load(Ordering::Relaxed) {
                return unknown;
            }
            std::thread::sleep(Duration::from_nanos(sleep_ns));
        }
    }

    /// Records the start event of a sampled launch; an unsampled one is charged its
    /// estimate when it went out.
    fn begin_sample(&self, work: Work, target: Target, unknown: bool) -> Sample {
        let key = work.key();
        let Some(mut inner) = self.lock() else {
            return Sample::unmeasured(key, 0);
        };
        let estimate = inner.estimates.get(key).map(|e| e.cost_ns).unwrap_or(0);
        let unmeasured = Sample::unmeasured(key, estimate);
        let wanted = inner.estimates.should_sample(key) || unknown;
        if !wanted || inner.pending.len() >= MAX_PENDING {
            return unmeasured;
        }
        let Some(context) = current_context() else {
            return unmeasured;
        };
        let Some(start) = self.take_event(&mut inner, context) else {
            return unmeasured;
        };
        let Some(end) = self.take_event(&mut inner, context) else {
            inner.pools.entry(context).or_default().push(start);
            return unmeasured;
        };
        drop(inner);
        let query = real!(cuStreamQuery as fn(CUstream) -> CUresult);
        let record = real!(cuEventRecord as fn(CUevent, CUstream) -> CUresult);
        // SAFETY: a stream handle the caller is launching on.
        let idle = unsafe { query(target.stream()) } == CUDA_SUCCESS;
        // SAFETY: events of the current context, recorded on the caller's stream.
        if unsafe { record(start, target.stream()) } != CUDA_SUCCESS {
            destroy_events(&[start, end]);
            return unmeasured;
        }
        let idle_since_ns = if idle { cardstate::monotonic_ns() } else { 0 };
        Sample {
            key,
            context,
            start,
            end,
            charged_ns: estimate,
            known: !unknown,
            idle_gap_ns: 0,
            idle_since_ns,
        }
    }

    /// After the real launch: charges the launch, and queues its measurement.
    fn finish_launch(&self, target: Target, mut sample: Sample, launched: bool) {
        let now = cardstate::monotonic_ns();
        if sample.idle_since_ns != 0 {
            sample.idle_gap_ns = now.saturating_sub(sample.idle_since_ns);
        }
        let measured = !sample.start.is_null();
        let ended = measured && launched && {
            let record = real!(cuEventRecord as fn(CUevent, CUstream) -> CUresult);
            // SAFETY: as in begin_sample.
            unsafe { record(sample.end, target.stream()) == CUDA_SUCCESS }
        };
        if measured && !ended {
            self.give_back(sample.context, &[sample.start, sample.end]);
        }
        if !launched {
            return;
        }
        let Some(mut inner) = self.lock() else { return };
        inner.had_work = true;
        inner.recent.add_launch();
        if sample.known {
            inner.bucket.charge(sample.charged_ns as i64, now);
            inner.recent.add_busy(sample.charged_ns);
        }
        let region_busy = if sample.known { sample.charged_ns } else { 0 };
        if ended {
            inner.pending.push_back(sample);
        }
        drop(inner);
        if let Ok(Some(enforcer)) = enforcer()
            && let Some(slot) = enforcer.slot()
        {
            enforcer
                .region
                .add_busy(slot, self.visible.region_index, region_busy, 1);
        }
    }

    /// Reads finished samples: learns their cost and corrects the bucket. Rate-limited
    /// to every 200 µs unless `force`.
    fn settle(&self, inner: &mut Inner, now: u64, force: bool) {
        if inner.pending.is_empty()
            || (!force && now.saturating_sub(inner.last_settle_ns) < 200_000)
        {
            return;
        }
        inner.last_settle_ns = now;
        let query = real!(cuEventQuery as fn(CUevent) -> CUresult);
        let elapsed = real!(cuEventElapsedTime as fn(*mut f32, CUevent, CUevent) -> CUresult);
        let mode_guard = RelaxedCapture::enter();
        let mut region_busy = 0u64;
        let mut index = 0;
        while index < inner.pending.len() {
            let sample = &inner.pending[index];
            // SAFETY: an event we created and recorded.
            let state = unsafe { query(sample.end) };
            if state == CUDA_ERROR_NOT_READY {
                index += 1;
                continue;
            }
            let Some(sample) = inner.pending.remove(index) else {
                break;
            };
            let mut ms = 0f32;
            // SAFETY: valid out-pointer; both events recorded on one stream.
            let measured = (state == CUDA_SUCCESS
                && unsafe { elapsed(&mut ms, sample.start, sample.end) } == CUDA_SUCCESS)
                .then(|| sample.kernel_ns((ms.max(0.0) as f64 * 1e6) as u64));
            match measured {
                Some(ns) => {
                    inner.estimates.record(sample.key, ns);
                    let correction = if sample.known {
                        ns as i64 - sample.charged_ns as i64
                    } else {
                        ns as i64
                    };
                    inner.bucket.charge(correction, now);
                    if correction > 0 {
                        inner.recent.add_busy(correction as u64);
                        region_busy += correction as u64;
                    }
                    inner
                        .pools
                        .entry(sample.context)
                        .or_default()
                        .extend([sample.start, sample.end]);
                }
                None => {
                    // A destroyed context or a failed launch: the events are no good.
                    inner.pools.remove(&sample.context);
                    destroy_events(&[sample.start, sample.end]);
                }
            }
        }
        drop(mode_guard);
        if region_busy > 0
            && let Ok(Some(enforcer)) = enforcer()
            && let Some(slot) = enforcer.slot()
        {
            enforcer
                .region
                .add_busy(slot, self.visible.region_index, region_busy, 0);
        }
    }

    /// Publishes to the card state and, in soft mode, follows contention.
    fn publish(&self, inner: &mut Inner, now: u64) {
        let Some(interval) = inner.recent.close(now, PUBLISH_NS) else {
            return;
        };
        let active = std::mem::take(&mut inner.had_work)
            || interval.demand_permille > 0
            || !inner.pending.is_empty();
        let Some((card, entry)) = &self.card else {
            return;
        };
        let percent = inner.bucket.percent();
        card.publish(
            *entry,
            &Report {
                now_ns: now,
                busy_permille: interval.busy_permille,
                demand_permille: interval.demand_permille,
                active,
                limit_percent: self.limit,
                soft: self.visible.core_mode == CoreMode::Soft,
            },
        );
        let container_percent = if self.visible.core_mode == CoreMode::Soft {
            let contended = card.others_active(self.container, now, CONTENDED_WITHIN_NS);
            duty::effective_percent(
                CoreMode::Soft,
                self.limit,
                self.visible.core_ceiling,
                contended,
            )
        } else {
            self.limit
        };
        // The limit is the container's, not each process's: split it evenly among the
        // container's processes that were active on this card lately.
        let siblings = card
            .entries(now)
            .iter()
            .filter(|other| {
                other.container == self.container
                    && other.index != entry.index()
                    && now.saturating_sub(other.active_ns) <= CONTENDED_WITHIN_NS
            })
            .count() as u32;
        let wanted = duty::share_of(container_percent, siblings + 1);
        if wanted != percent {
            debug!(
                "limit on {}: {percent}% -> {wanted}% ({} active processes in the container)",
                self.visible.uuid,
                siblings + 1
            );
            inner.bucket.set_percent(wanted, now);
        }
    }

    fn take_event(&self, inner: &mut Inner, context: usize) -> Option<CUevent> {
        let pool = inner.pools.entry(context).or_default();
        if let Some(event) = pool.pop() {
            return Some(event);
        }
        let create = real!(cuEventCreate as fn(*mut CUevent, u32) -> CUresult);
        let _mode = RelaxedCapture::enter();
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

    fn give_back(&self, context: usize, events: &[CUevent]) {
        if let Some(mut inner) = self.lock() {
            inner
                .pools
                .entry(context)
                .or_default()
                .extend_from_slice(events);
        }
    }
}

fn current_context() -> Option<usize> {
    let get = real!(cuCtxGetCurrent as fn(*mut CUcontext) -> CUresult);
    let mut context = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    (unsafe { get(&mut context) } == CUDA_SUCCESS && !context.is_null()).then_some(context as usize)
}

fn destroy_events(events: &[CUevent]) {
    let destroy = real!(cuEventDestroy_v2 as fn(CUevent) -> CUresult);
    for event in events {
        // SAFETY: an event we created; destroying a stale handle only returns an error.
        unsafe { destroy(*event) };
    }
}

/// Puts the calling thread in relaxed stream-capture mode for the guard's lifetime, so
/// our event calls neither fail nor invalidate a global-mode capture on another thread.
struct RelaxedCapture(Option<u32>);

impl RelaxedCapture {
    fn enter() -> RelaxedCapture {
        let exchange = real!(cuThreadExchangeStreamCaptureMode as fn(*mut u32) -> CUresult);
        let mut mode = CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: valid in/out pointer.
        let ok = unsafe { exchange(&mut mode) } == CUDA_SUCCESS;
        RelaxedCapture(ok.then_some(mode))
    }
}

impl Drop for RelaxedCapture {
    fn drop(&mut self) {
        if let Some(mut previous) = self.0 {
            let exchange = real!(cuThreadExchangeStreamCaptureMode as fn(*mut u32) -> CUresult);
            // SAFETY: valid in/out pointer; restores the thread's own mode.
            unsafe { exchange(&mut previous) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_gap_is_not_charged_but_never_makes_a_kernel_free() {
        let mut sample = Sample::unmeasured(1, 0);
        assert_eq!(
            sample.kernel_ns(20_000),
            20_000,
            "a backlogged stream: the events bracket the kernel alone"
        );
        sample.idle_gap_ns = 6_000;
        assert_eq!(
            sample.kernel_ns(20_000),
            14_000,
            "an idle stream: the host gap before submission is not GPU time"
        );
        sample.idle_gap_ns = 1_000_000;
        assert_eq!(
            sample.kernel_ns(20_000),
            5_000,
            "a descheduled thread's gap is capped"
        );
    }
}
