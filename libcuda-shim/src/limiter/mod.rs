//! The compute (SM) limiter: throttles kernel launches so that the GPU time a
//! container's work takes on a card, divided by wall time, stays at its `core_limit`.
//!
//! Busy time is the union of a process's kernels on the card, not their sum: each
//! stream keeps a projected "busy until" (a launch on stream `s` at host time `t` with
//! cost `c` runs over `[max(t, busy_until_s), +c)`), the process keeps the latest
//! projected end of any of its streams (the horizon, in its slot of the region), and a
//! launch is charged only what it adds beyond the horizon (`duty::union_increment`).
//! Four streams of kernels that overlap on the card pay once, as the card spends it.
//! The processes of a container are summed: a card without MPS runs one context at a
//! time (under MPS, where they can overlap, that errs towards charging more).
//!
//! Costs are measured, not guessed from NVML: a sampled launch is bracketed by two CUDA
//! events on its own stream, and once the end event completes `cuEventElapsedTime` says
//! what it took (resource waits behind the container's own kernels included, which is
//! what makes the union of projections match the card when kernels do not all fit).
//! That teaches a per-kernel cost (`tables::Estimates`) from which every other launch is
//! charged; a settled sample corrects the bucket by what its measured run adds to the
//! union beyond what its estimate did.
//!
//! The bucket and the rate live in the container's usage region (`shared::Shared`), so
//! all processes of a container spend one budget. A launch that
//! is not sampled takes no lock and makes no driver call: a few atomics, one clock read
//! (the current device comes from `crate::current`, captures from
//! `hooks::capture::possible`). Sampled launches, waits and the publish tick (every
//! `PUBLISH_NS`: activity for the host's coordinator, and in soft mode the card's view)
//! take the slow path.
//!
//! One job per file: `fast` (the unsampled launch), `tab` (a thread's run of launches on
//! borrowed credit), `fast_clock` (the fast path's clock), `slow`
//! (waits and sampled launches), `pair` (samples of two launches, which show the
//! set-up a launch behind queued work hides), `settle` (what a finished sample teaches), `publish`
//! (the tick that talks to the host), `lifecycle` (build, fork, exit), `clock` (event
//! times on the host clock), `sample` (the events of one measurement), `shared` (the
//! container's bucket, horizon and rate), `tables` (lock-free estimates and stream
//! projections), `duty` (the pure arithmetic) and `trace` (opt-in counters).
//!
//! Safety rails: nothing is throttled or timed while the launch's stream captures a
//! graph, in a forked child until it rebuilds, or once the process is exiting; our own
//! event calls run in relaxed capture mode while any capture is under way. No thread is
//! started and nothing sleeps with a lock held.

mod clock;
pub mod duty;
mod fast;
mod fast_clock;
mod lifecycle;
#[cfg(test)]
mod model;
mod pair;
mod publish;
mod sample;
mod settle;
mod shared;
mod slow;
mod tab;
mod tables;
mod trace;

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use vgpu_contract::cardview::ViewReader;
use vgpu_contract::region::{Region, SLOT_LIMITER_WORDS, SlotId};

use crate::cuda::*;
use crate::current::PER_THREAD_KEY_BIT;
use crate::state::{Visible, enforcing, real};
use clock::GpuClock;
use lifecycle::{LIMITS_NONE, SWITCHES, built, limiter};
pub(crate) use lifecycle::{clear_sole_device, refresh_sole_device, stand_down};
use sample::Sample;
use shared::Shared;
use tables::{Estimates, Streams};

/// Bucket window: the burst a limited container may take at once is `limit` of this,
/// so no 100 ms stretch exceeds the limit by more than a fifth of it. Long enough that a
/// burst holds several rounds of kernels on concurrent streams (each round's ragged
/// edge costs a little overlap), short enough for a 100 ms window to see the limit.
const WINDOW_NS: u64 = 20_000_000;
/// A launch held back by the limit waits until the bucket has refilled this much wall
/// time's worth, so that all the container's streams resume together and overlap: with
/// a trickle of budget, only one of them would get through at a time. Less than the
/// window, so that oversleeping by up to a quarter of it loses nothing. Only while the
/// process's work has overlapped lately (`CONCURRENT_LATELY_NS`): one stream's kernels
/// run one after another whatever the hold, and a latency-bound loop held for a refill
/// waits 15 ms or more for each (H200, BENCHMARKS run 11: a decode loop beside a busy
/// neighbour had steps of 35 ms with it, 4.8 ms without it).
const REFILL_NS: u64 = WINDOW_NS * 3 / 4;
/// How long after a launch that overlapped the process's other queued work the refill is
/// kept (`REFILL_NS`).
const CONCURRENT_LATELY_NS: u64 = 1_000_000_000;
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

/// What one launch is, for costing: a kernel (its function handle and its grid's
/// blocks) or a graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Work {
    Kernel { function: usize, blocks: u64 },
    Graph(usize),
}

/// The cost-table key of a graph: its handle with this bit set, so that a graph and a
/// kernel at the same address (user-space pointers never have it) are learned apart.
const GRAPH_KEY_BIT: u64 = 1 << 63;
/// The cost-table key of a null function handle (the table's keys are nonzero; the real
/// launch rejects it, but it is counted like any other until then).
const NULL_KERNEL_KEY: u64 = 1 << 61;
/// Where a kernel's grid class (`duty::grid_class`, under 256) sits in its key: above
/// any user-space address, below the flags above.
const GRID_CLASS_SHIFT: u32 = 48;

impl Work {
    /// A kernel of `function` launched with a grid of `grid` blocks (saturating: a grid
    /// the driver will reject, of three dimensions near `u32::MAX`, must not panic here).
    pub fn kernel(function: usize, grid: [u32; 3]) -> Work {
        Work::Kernel {
            function,
            blocks: grid
                .iter()
                .fold(1u64, |blocks, &d| blocks.saturating_mul(u64::from(d))),
        }
    }

    /// A nonzero key per kernel and class of grid, or per graph. A kernel is learned per
    /// class of grid (`duty::grid_class`), not per function alone: one function launched
    /// with grids of different sizes runs for different times, and one estimate for them
    /// all is what its samples happened to time. PyTorch's optimizer launches each of its
    /// `multi_tensor_apply` kernels twice a step, a full grid and then the rest; samples
    /// open after host work, so they timed the first, and both were charged it (on an
    /// H100, run 18: 47-67 us learned for kernels the profiler timed at 35-59 on average),
    /// and its elementwise copies run with up to seven grids a step.
    fn key(self) -> u64 {
        match self {
            Work::Kernel { function: 0, .. } => NULL_KERNEL_KEY,
            Work::Kernel { function, blocks } => kernel_key(function, duty::grid_class(blocks)),
            Work::Graph(exec) => exec as u64 | GRAPH_KEY_BIT,
        }
    }
}

/// The cost-table key of a kernel of `function` (nonzero) launched with a grid of
/// `class` (`duty::grid_class`): [`kernel_of_key`]'s inverse.
fn kernel_key(function: usize, class: u64) -> u64 {
    function as u64 ^ (class << GRID_CLASS_SHIFT)
}

/// What a kernel's cost-table key ([`Work::key`]) holds: its class of grid and its
/// function handle; `None` for a graph's key or the null kernel's.
fn kernel_of_key(key: u64) -> Option<(u64, u64)> {
    (key & GRAPH_KEY_BIT == 0 && key != NULL_KERNEL_KEY)
        .then_some((key >> GRID_CLASS_SHIFT, key & ((1 << GRID_CLASS_SHIFT) - 1)))
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

pub use fast::{launch, throttle_only};

/// The limiter of the calling thread's current device, when it has a compute limit and
/// throttling is allowed now.
fn current_limited() -> Option<&'static DeviceLimiter> {
    if SWITCHES.exiting.load(Ordering::Relaxed) {
        return None;
    }
    let limiter = match built() {
        Some(limiter) if limiter.devices.is_empty() => return None,
        Some(limiter) => limiter,
        None => {
            // Forwarding only or failing closed: nothing to limit, now or later.
            let Some(enforcer) = enforcing() else {
                SWITCHES.limits.store(LIMITS_NONE, Ordering::Relaxed);
                return None;
            };
            limiter(enforcer)?
        }
    };
    if limiter.only_device {
        return limiter.devices.first();
    }
    let (_, device) = crate::current::for_launch()?;
    limiter
        .devices
        .iter()
        .find(|limited| limited.visible.handle == device)
}

/// All limited devices of this process.
struct Limiter {
    generation: u64,
    devices: Vec<DeviceLimiter>,
    /// The container sees one device, and it is limited: every launch goes to it.
    only_device: bool,
}

/// One limited device. `repr(C)`, with what an unsampled launch reads or writes first:
/// those fields fill the first two cache lines (`fast_path_fields_fill_two_cache_lines`).
/// The real driver's launch evicts the shim's lines between launches, so each line the
/// fast path touches is a likely miss; the rest is for sampled launches and the publish
/// tick.
#[repr(C, align(64))]
struct DeviceLimiter {
    // Read by every launch.
    estimates: Estimates,
    streams: Streams,
    shared: Shared<'static>,
    limit_ppm: u64,
    ceiling: u32,
    soft: bool,
    /// Whether fast-path launches may open a tab (`tab`; `VGPU_LIMITER_TABS=off`).
    tabs: bool,
    /// Whether samples of short kernels may bracket two launches (`pair`;
    /// `VGPU_LIMITER_PAIRS=off`).
    pairs: bool,
    // Written by launches.
    /// Busy time and launches not yet added to the region (one atomic per launch on
    /// this process's own memory; the region gets them at each publish tick): busy ns
    /// in the low `BUSY_BITS`, launches above. Busy time is as measured (the host's
    /// coordinator compares it with what the card says), not scaled.
    unpublished: AtomicU64,
    next_sample_ns: AtomicU64,
    next_publish_ns: AtomicU64,
    /// The host's correction of this container's charges on this card, per mille: what
    /// the card measured of the container's work against what the container measured
    /// itself (`cardview::charge_permille`); 1000 without a fresh view.
    charge_permille: AtomicU64,
    /// Until when held launches wait for the refill (`REFILL_NS`): a launch that
    /// overlapped other queued work of this process moves it `CONCURRENT_LATELY_NS`
    /// ahead.
    concurrent_until_ns: AtomicU64,
    /// When this process's activity word in the region is written next.
    next_stamp_ns: AtomicU64,
    /// The set-up a launch placed behind its stream's queued work is not charged
    /// (`duty::behind_cost`), from this process's samples of two launches
    /// (`duty::setup_from`); written when one settles.
    setup_ns: AtomicU64,
    /// Whether a sample of two launches waits for its second (`Slow::pair`): launches
    /// that find a sample slot open then take the slow path.
    pair_open: AtomicBool,
    // The rest: sampled launches, settling, the publish tick, tabs.
    /// This process's limiter words in its region slot.
    mine: Option<&'static [AtomicU64; SLOT_LIMITER_WORDS]>,
    visible: Visible,
    region: &'static Region,
    slot: Option<SlotId>,
    /// Busy ns that settled samples gave back, taken off the next publish.
    given_back: AtomicU64,
    /// Pending samples of kernels that had no estimate yet.
    unknown_in_flight: AtomicUsize,
    /// The device's latest settled samples in a row that agreed with their kernels'
    /// estimates (`duty::agrees`; written when one settles, under the `Slow` lock):
    /// enough of them lengthen the sample gap (`duty::sample_gap_ns`).
    agreeing_samples: AtomicU32,
    /// Whether another container may have work on the card, from the last card view
    /// (`cardview::neighbours_active`; true without one).
    neighbours_active: AtomicBool,
    /// Where the host's card views are, and who this container is in them.
    card_dir: Option<PathBuf>,
    container_id: Option<String>,
    /// The card's view as last read (`publish::with_view`).
    card_view: Mutex<Option<ViewReader>>,
    slow: Mutex<Slow>,
    /// Launches of each learned kernel while the trace is on (`trace::on`).
    traced: tables::Traced,
}

/// What only sampled launches and settling touch.
struct Slow {
    pending: VecDeque<Sample>,
    /// Spare events per context.
    pools: HashMap<usize, Vec<CUevent>>,
    /// Per context: how event times map to the host clock.
    clocks: HashMap<usize, GpuClock>,
    last_settle_ns: u64,
    /// What single samples have shown of each kernel (at most `REMEMBERED_KERNELS`).
    seen: HashMap<u64, Seen>,
    /// A sample of two launches waiting for its second launch (`super::pair`).
    pair: Option<pair::OpenPair>,
    /// Whether the next sample of a short kernel opens a pair (every other one does).
    pair_next: bool,
    /// The set-ups recent pairs showed (at most `pair::RECENT`), oldest first.
    setups: VecDeque<u64>,
}

/// What a kernel's single samples have shown, as `Slow::seen` keeps it.
#[derive(Clone, Copy, Debug, Default)]
struct Seen {
    /// `Some` once it was measured behind queued work
    /// (`duty::idle_sample_may_time_a_neighbour`): how many of its samples were set
    /// aside since its last such measurement (`duty::set_aside_sample_teaches`).
    set_aside_since_backlogged: Option<u32>,
    /// How steady its samples are: only pairs of steady kernels teach a set-up.
    steadiness: duty::Steadiness,
    /// Its latest samples in a row that measured their launch call rather than the
    /// kernel (`duty::is_doubtful`).
    doubtful_in_a_row: u32,
}

/// The most kernels `Slow::seen` remembers (as many as the estimate table holds): past
/// it, it starts again.
const REMEMBERED_KERNELS: usize = ESTIMATE_SLOTS;

impl Slow {
    /// What has been seen of `key`, made room for (forgetting every kernel when the
    /// map is full).
    fn seen_mut(&mut self, key: u64) -> &mut Seen {
        if self.seen.len() >= REMEMBERED_KERNELS && !self.seen.contains_key(&key) {
            self.seen.clear();
        }
        self.seen.entry(key).or_default()
    }
}

// SAFETY: the raw event and context handles are plain driver handles, valid from any thread.
unsafe impl Send for Slow {}

impl DeviceLimiter {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Slow> {
        // A panic while the lock was held leaves consistent-enough numbers behind.
        self.slow
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The rate in force: the limit in hard mode; in soft mode what the container's
    /// processes last read from the card view, within `[limit, ceiling]`.
    pub(super) fn rate(&self) -> u64 {
        if !self.soft {
            return self.limit_ppm;
        }
        self.shared
            .rate_ppm(self.limit_ppm)
            .clamp(self.limit_ppm, duty::percent_ppm(self.ceiling))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_path_fields_fill_two_cache_lines() {
        use std::mem::offset_of;
        assert_eq!(align_of::<DeviceLimiter>(), 64);
        let read = [
            offset_of!(DeviceLimiter, estimates),
            offset_of!(DeviceLimiter, streams),
            offset_of!(DeviceLimiter, shared),
            offset_of!(DeviceLimiter, limit_ppm),
            offset_of!(DeviceLimiter, ceiling),
            offset_of!(DeviceLimiter, soft),
            offset_of!(DeviceLimiter, tabs),
        ];
        assert!(read.iter().all(|&offset| offset < 64), "{read:?}");
        let written = [
            offset_of!(DeviceLimiter, unpublished),
            offset_of!(DeviceLimiter, next_sample_ns),
            offset_of!(DeviceLimiter, next_publish_ns),
            offset_of!(DeviceLimiter, charge_permille),
            offset_of!(DeviceLimiter, concurrent_until_ns),
            offset_of!(DeviceLimiter, next_stamp_ns),
            offset_of!(DeviceLimiter, setup_ns),
            offset_of!(DeviceLimiter, pair_open),
        ];
        assert!(
            written.iter().all(|&offset| (64..128).contains(&offset)),
            "{written:?}"
        );
    }

    #[test]
    fn the_switches_every_launch_reads_are_one_line() {
        use lifecycle::Switches;
        assert_eq!(align_of::<Switches>(), 64);
        assert_eq!(
            size_of::<Switches>(),
            64,
            "limits, exiting, limiter, tracing and the fast clock"
        );
    }

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
        let kernel = |function, blocks| Work::kernel(function, [blocks, 1, 1]).key();
        assert_ne!(kernel(0, 1), 0);
        assert_ne!(Work::Graph(0x7000).key(), kernel(0x7000, 1));
        // Learned per class of grid: a full grid and its remainder apart, one grid
        // however it is shaped alike.
        assert_ne!(kernel(0x7000, 1024), kernel(0x7000, 96));
        assert_eq!(
            Work::kernel(0x7000, [32, 32, 1]).key(),
            Work::kernel(0x7000, [1024, 1, 1]).key()
        );
        for blocks in [1, 17, 1 << 20, u32::MAX] {
            let key = kernel(0x7fff_ffff_f000, blocks);
            assert_eq!(
                key & (GRAPH_KEY_BIT | NULL_KERNEL_KEY),
                0,
                "{blocks}: {key:#x}"
            );
            assert_eq!(
                kernel_of_key(key),
                Some((duty::grid_class(u64::from(blocks)), 0x7fff_ffff_f000))
            );
        }
        // A grid no driver takes still has a key (the largest class), never a panic.
        let huge = Work::kernel(0x7000, [u32::MAX; 3]).key();
        assert_eq!(kernel_of_key(huge), Some((255, 0x7000)));
        assert_eq!(kernel_of_key(Work::Graph(0x7000).key()), None);
        assert_eq!(kernel_of_key(kernel(0, 1)), None);
    }
}
