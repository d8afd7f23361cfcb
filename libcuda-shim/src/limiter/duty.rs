//! The compute limiter's arithmetic, with no FFI, no atomics and no clock of its own
//! (every function takes `now` in nanoseconds), so it is tested with a fake clock.
//!
//! - The token bucket is kept as one number, `paid_until`: the wall time up to which the
//!   container's allowance is spent (a "generic cell rate" bucket). At rate `r` a launch
//!   of cost `c` moves it to `max(paid_until, now - window) + c / r`; a launch waits
//!   while it is in the future. That is a bucket of capacity `r * window` filling at
//!   `r`, in one word, so every thread and process of a container can share it with a
//!   compare-and-swap.
//! - The union: a launch whose projected run is `[start, end)` adds to the container's
//!   busy time only what lies beyond the horizon of work already queued (the latest
//!   projected end of any of its streams): `max(0, end - max(start, horizon))`. Kernels
//!   overlapping on several streams are counted once, as the card spends them.
//! - `Estimate`: what one launch of a kernel (or a graph) costs, learned from sampled
//!   measurements, packed into one word so a lock-free table can hold it.

/// Nanoseconds per second.
pub const SECOND_NS: u64 = 1_000_000_000;
/// The most debt the bucket carries, in GPU time: a pathological kernel can never cause
/// a wait longer than this divided by the rate.
pub const MAX_DEBT_NS: u64 = 4 * SECOND_NS;
/// Parts per million of the card at 100%.
pub const FULL_PPM: u64 = 1_000_000;

/// `percent` (clamped to 1-100) in parts per million.
pub fn percent_ppm(percent: u32) -> u64 {
    percent.clamp(1, 100) as u64 * 10_000
}

/// `100 / percent` in 32.32 fixed point, for every whole percent: rates are whole
/// percents, and a launch's charge then takes a multiply, not a 128-bit division.
const WALL_PER_GPU: [u64; 101] = {
    let mut table = [0u64; 101];
    let mut percent = 1;
    while percent <= 100 {
        table[percent] = (100u64 << 32) / percent as u64;
        percent += 1;
    }
    table
};

/// GPU time `cost_ns` at `rate_ppm`, as wall time.
fn wall_of(cost_ns: u64, rate_ppm: u64) -> u64 {
    let wall = if rate_ppm.is_multiple_of(10_000) && (10_000..=FULL_PPM).contains(&rate_ppm) {
        (cost_ns as u128 * WALL_PER_GPU[(rate_ppm / 10_000) as usize] as u128) >> 32
    } else {
        cost_ns as u128 * FULL_PPM as u128 / rate_ppm.max(1) as u128
    };
    wall.min(u64::MAX as u128) as u64
}

/// Where a bucket that reads `paid_until` stands at `now_ns`: never fuller than one
/// window, and empty if it was never charged (zero, as a container's usage region
/// starts). A new container gets its rate from its first launch, not its rate plus a
/// window's burst: with the burst a hard 60 beside a busy neighbour ran its first second
/// at 61.5-63.0 of the card and its first 100 ms at 71 (the sim's limiter tests, CI of
/// bddc3ae), where every later second held 60-61.
fn bucket_at(paid_until: u64, now_ns: u64, window_ns: u64) -> u64 {
    if paid_until == 0 {
        now_ns
    } else {
        paid_until.max(now_ns.saturating_sub(window_ns))
    }
}

/// The bucket after spending `cost_ns` of GPU time (negative: giving back an
/// over-estimate) at `now_ns`: never fuller than one window (a bucket never charged
/// starts empty, see `bucket_at`), never deeper in debt than `MAX_DEBT_NS`.
pub fn charge(paid_until: u64, now_ns: u64, cost_ns: i64, rate_ppm: u64, window_ns: u64) -> u64 {
    let full = now_ns.saturating_sub(window_ns);
    let from = bucket_at(paid_until, now_ns, window_ns);
    let moved = if cost_ns >= 0 {
        from.saturating_add(wall_of(cost_ns as u64, rate_ppm))
    } else {
        from.saturating_sub(wall_of(cost_ns.unsigned_abs(), rate_ppm))
    };
    moved
        .max(full)
        .min(now_ns.saturating_add(wall_of(MAX_DEBT_NS, rate_ppm)))
}

/// How long a launch must wait: 0 unless the bucket is in debt.
pub fn delay(paid_until: u64, now_ns: u64) -> u64 {
    paid_until.saturating_sub(now_ns)
}

/// The bucket after a rate change from `old_ppm` to `new_ppm`: what was saved (or owed)
/// in GPU time is kept; the burst becomes the new rate's window.
pub fn rescale(paid_until: u64, now_ns: u64, old_ppm: u64, new_ppm: u64, window_ns: u64) -> u64 {
    let full = now_ns.saturating_sub(window_ns);
    let from = bucket_at(paid_until, now_ns, window_ns);
    let rescaled = if from >= now_ns {
        let owed_gpu = (from - now_ns) as u128 * old_ppm as u128 / FULL_PPM as u128;
        now_ns.saturating_add(wall_of(owed_gpu as u64, new_ppm))
    } else {
        let saved_gpu = (now_ns - from) as u128 * old_ppm as u128 / FULL_PPM as u128;
        now_ns.saturating_sub(wall_of(saved_gpu as u64, new_ppm))
    };
    rescaled.max(full)
}

/// What a launch projected to run over `[start, end)` adds to the union of the
/// container's queued work, whose latest projected end was `horizon`.
pub fn union_increment(start: u64, end: u64, horizon: u64) -> u64 {
    end.saturating_sub(start.max(horizon))
}

/// The most set-up a launch placed behind queued work is taken to hide: an H100 took
/// 2.3 us or more to set up an empty kernel after an event (4.46 us samples of launches
/// 2.2 us apart, BENCHMARKS run 14), and pairs of the launch loop showed 0.7-3.4 us
/// (run 17). A pair that says more timed something else: training's said 14.6-16 us of
/// kernels estimated at 7-15 us (run 17), which would have charged them a quarter.
pub const SETUP_MOST_NS: u64 = 5_000;

/// What a launch estimated at `cost_ns` adds to the card's busy time when it is placed
/// behind its stream's own queued work: the card sets a kernel up while the one before
/// it runs, so the set-up `setup_ns` that samples time (a sample's start event makes the
/// kernel after it wait for its set-up) is hidden there. Never less than a quarter of
/// the estimate, as a settled sample never makes a kernel cheaper than that.
pub fn behind_cost(cost_ns: u64, setup_ns: u64) -> u64 {
    cost_ns - setup_ns.min(cost_ns - cost_ns / 4)
}

/// What a launch estimated at `cost_ns` and placed to start at `start_ns` by a call at
/// `now_ns` runs for: [`behind_cost`] when it starts behind queued work, else all of it.
pub fn placed_cost(start_ns: u64, now_ns: u64, cost_ns: u64, setup_ns: u64) -> u64 {
    if start_ns > now_ns {
        behind_cost(cost_ns, setup_ns)
    } else {
        cost_ns
    }
}

/// The set-up a sample of two launches shows: a sample of one times a kernel's set-up
/// with it, so two launches whose single estimates are `first_ns` and `second_ns`, the
/// second set up while the first ran, take `pair_ns` between the events, and the
/// difference is the second's set-up (none where the pair took longer, as it does when
/// the second launch found the stream idle). `None` where the difference is more than
/// [`SETUP_MOST_NS`] or three quarters of the shorter estimate: no set-up is that long,
/// and the pair timed something else (on an H100, BENCHMARKS run 17, training's pairs
/// said 16 us and more of kernels estimated at 7-15 us).
pub fn pair_setup(first_ns: u64, second_ns: u64, pair_ns: u64) -> Option<u64> {
    let setup = first_ns.saturating_add(second_ns).saturating_sub(pair_ns);
    let shorter = first_ns.min(second_ns);
    (setup <= SETUP_MOST_NS && setup <= shorter - shorter / 4).then_some(setup)
}

/// How far apart a kernel's single samples may lie, on average, from its estimate (per
/// mille) for its pairs to teach a set-up: a kernel whose cost varies from launch to
/// launch (its grid does, as a training step's do) makes a pair's difference from its
/// estimates say that, not a set-up (over the sim's training-like launches, pairs of
/// such kernels taught 16 us, the cap then, and the card ran 61 % busy at 50).
pub const STEADY_PERMILLE: u64 = 200;
/// Single samples a kernel needs, after its first, before it can count as steady.
pub const STEADY_SAMPLES: u32 = 3;

/// What a kernel's single samples say of how steady its cost is: the mean deviation of
/// a sample from the estimate it was folded into (per mille, an exponential average of
/// a quarter) and how many deviations are in it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Steadiness {
    pub deviation_permille: u64,
    pub samples: u32,
}

impl Steadiness {
    /// Folds in a sample that measured `measured_ns` of a kernel estimated at
    /// `estimate_ns`.
    pub fn fold(self, measured_ns: u64, estimate_ns: u64) -> Steadiness {
        let deviation = (measured_ns.abs_diff(estimate_ns))
            .saturating_mul(1000)
            .checked_div(estimate_ns)
            .unwrap_or(1000)
            .min(10_000);
        Steadiness {
            deviation_permille: if self.samples == 0 {
                deviation
            } else {
                (self.deviation_permille * 3 + deviation) / 4
            },
            samples: self.samples.saturating_add(1),
        }
    }

    /// Whether pairs of this kernel may teach a set-up.
    pub fn is_steady(self) -> bool {
        self.samples >= STEADY_SAMPLES && self.deviation_permille <= STEADY_PERMILLE
    }
}

/// The class of a grid of `blocks` blocks that a kernel's cost is learned for
/// (`Work::key`): every count up to 16 apart, then eight classes an octave, so that two
/// grids of one class differ by at most an eighth and a kernel launched with grids of
/// every size has at most 255 classes. Under 256.
pub fn grid_class(blocks: u64) -> u64 {
    if blocks <= 16 {
        return blocks;
    }
    let octave = u64::from(63 - blocks.leading_zeros());
    let eighth = (blocks >> (octave - 3)) & 7;
    (17 + (octave - 4) * 8 + eighth).min(255)
}

/// How many classes of grid away (`grid_class`), either way, a kernel's first launch
/// with a new grid looks for a class of the same function already learned
/// ([`seed_classes`]): eight is an octave of grid sizes above 16 blocks.
pub const SEED_REACH: u64 = 8;

/// The classes of grid near `class`, nearest first (below, then above, at each
/// distance), that a first launch of `class` may be seeded from: within
/// [`SEED_REACH`], between 1 and 255.
pub fn seed_classes(class: u64) -> impl Iterator<Item = u64> {
    (1..=SEED_REACH)
        .flat_map(move |distance| [class.checked_sub(distance), Some(class + distance)])
        .flatten()
        .filter(|&near| (1..=255).contains(&near))
}

/// The fewest blocks a grid of `class` has (`grid_class`'s inverse, at its low end).
pub fn class_floor(class: u64) -> u64 {
    if class <= 17 {
        return class;
    }
    let octave = (class - 17) / 8 + 4;
    let eighth = (class - 17) % 8;
    (8 + eighth) << (octave - 3)
}

/// What a kernel's first launch with a grid of `blocks` is charged until it is measured,
/// from its function's estimate `known_ns` for the nearby class `known_class`: scaled by
/// the grids' sizes (a grid of several waves runs about as many times as long), within
/// half and twice the known cost (under a wave the grid hardly changes the time). Its
/// settling pays the difference (`Charged::Seed`), so the seed only has to be near
/// enough for the time it is in flight: without one, the launch would wait for any
/// other first measurement under way (up to `FIRST_MEASURE_PATIENCE_NS`) and go out
/// charged nothing.
pub fn seed_cost(known_ns: u64, known_class: u64, blocks: u64) -> u64 {
    let scaled =
        u128::from(known_ns) * u128::from(blocks) / u128::from(class_floor(known_class).max(1));
    (scaled.min(u128::from(known_ns) * 2) as u64).max(known_ns / 2)
}

/// What the settling of a launch charged a seed of `seed_ns` pays, its measured run
/// `measured_ns`: the part of the seed that was new to the union when it went out
/// (`charged_ns`) rescaled to the run, less what it was charged. Not the run's own
/// union increment: seeds project a stream's queue too long or too short, and the
/// launches behind a seed went out against its projection, so where a queue of seeds
/// ran shorter than projected, each one's real run would find the one before it still
/// projected (its increment nothing).
pub fn seed_correction(seed_ns: u64, charged_ns: u64, measured_ns: u64) -> i64 {
    let owed = u128::from(charged_ns) * u128::from(measured_ns) / u128::from(seed_ns.max(1));
    (owed.min(i64::MAX as u128) as i64).saturating_sub(charged_ns.min(i64::MAX as u64) as i64)
}

/// The set-up a process's launches behind queued work are taken to hide: the median of
/// its recent samples of two launches (`recent`; none without any), so that one pair
/// that timed a neighbour's slice or a kernel's unusually short run moves nothing. Of
/// the latest [`SETUPS_MOST`] at most, sorted on the stack (it runs as a pair settles,
/// on a launch's slow path: no allocation).
pub fn setup_from(recent: &[u64]) -> u64 {
    let len = recent.len().min(SETUPS_MOST);
    let mut sorted = [0u64; SETUPS_MOST];
    sorted[..len].copy_from_slice(&recent[recent.len() - len..]);
    let sorted = &mut sorted[..len];
    sorted.sort_unstable();
    match len {
        0 => 0,
        len => sorted[(len - 1) / 2],
    }
}

/// The most recent pairs' set-ups [`setup_from`] takes the median of.
pub const SETUPS_MOST: usize = 16;

/// What a settled sample of a known kernel is charged for running past everything queued
/// since: `beyond_ns`, what its real run added beyond the horizon. In a process whose
/// kernels have not `overlapped` each other lately, nothing of its own can have held the
/// kernel past its projection (already charged): a later run waited for another
/// context's slice, so only a run longer than projected (`measured_ns` over
/// `projected_ns`) is charged.
pub fn settled_overrun(
    beyond_ns: u64,
    measured_ns: u64,
    projected_ns: u64,
    overlapped: bool,
) -> u64 {
    if overlapped {
        beyond_ns
    } else {
        beyond_ns.min(measured_ns.saturating_sub(projected_ns))
    }
}

/// Whether a settled sample's run may include another context's slice, so that it
/// neither teaches its kernel's cost nor is charged past its projection.
///
/// On a time-sliced card an event recorded on an idle stream fires at once although
/// another context holds the card (the H200, BENCHMARKS run 12), and the kernel after it
/// waits for the slice: such a sample times the neighbour's slice too. It is only
/// believed over the process's own when nothing says so: the sample started on an idle
/// stream (`started_idle`), the kernel was `known` (its launch was charged its
/// estimate), the process's kernels have not `overlapped` each other lately (where they
/// do, a kernel may have waited for SMs behind its own process's, which the card spent
/// on it), another container may be active on the card (`neighbours`), and the kernel
/// has been measured behind queued work before (`measured_backlogged`: those samples
/// start when the kernel before them ends, with the context on the card, and teach its
/// cost; a kernel only ever launched on an idle stream keeps learning from what it has).
pub fn idle_sample_may_time_a_neighbour(
    started_idle: bool,
    known: bool,
    overlapped: bool,
    neighbours: bool,
    measured_backlogged: bool,
) -> bool {
    started_idle && known && !overlapped && neighbours && measured_backlogged
}

/// An idle gap longer than this can be what decides a sample's measurement
/// ([`is_doubtful`]): the part of its launch call before its kernel was queued on an idle
/// stream (`Sample::idle_gap_ns`). A launch call takes a few microseconds; one that
/// takes longer loaded the kernel's code (CUDA 12 loads a kernel at its first launch,
/// inside that call: PyTorch's took a millisecond or more on an H100, BENCHMARKS run
/// 20) or lost its thread.
pub const DOUBTFUL_GAP_NS: u64 = 50_000;

/// The least a sample whose events were `elapsed_ns` apart says its kernel ran, whatever
/// its idle gap (`Sample::kernel_ns`): a quarter of the events' time, so that an
/// over-long host gap (the thread descheduled, say) cannot make a kernel look free.
pub fn measured_floor_ns(elapsed_ns: u64) -> u64 {
    elapsed_ns / 4
}

/// Whether `host_ns` of host time within a sample's span of `span_ns` decides what the
/// sample measured, so that it timed the host rather than its kernel: the host time is
/// over [`DOUBTFUL_GAP_NS`] and less than a quarter of the span
/// ([`measured_floor_ns`]) lies beyond it. A sample has two such host times:
/// - its idle gap (`Sample::idle_gap_ns`), within the events' elapsed time: a gap that
///   long was its launch call, which taught a 20 us kernel 5 ms after a 20 ms load;
/// - the delay from its last launch's return to its end event's record
///   (`Sample::end_record_delay`: the thread lost that time first, to a busy host or a
///   container's CPU quota), within the time from that return to the event's firing:
///   an end event recorded after its kernel ended fires at its record, so the sample
///   timed the delay. A 20 us kernel whose thread slept 500 us before one event record
///   in 13 was taught 52 us (sim), and its loop was charged 2.6 times its kernels.
///
/// A kernel longer than a third of the host time is measured as usual.
pub fn is_doubtful(span_ns: u64, host_ns: u64) -> bool {
    host_ns > DOUBTFUL_GAP_NS && span_ns.saturating_sub(host_ns) < measured_floor_ns(span_ns)
}

/// Whether a sample teaches its kernel's cost, where it `doubtful` ([`is_doubtful`]),
/// the kernel `known` or not, and this its `doubtful_in_a_row`th doubtful sample in a
/// row. A doubtful sample teaches nothing: a known kernel keeps its estimate, an
/// unknown one is measured again at its next launch; but the second doubtful sample in
/// a row of a kernel never measured teaches, so that a process whose every launch call
/// is that slow still learns its kernels.
pub fn sample_teaches(doubtful: bool, known: bool, doubtful_in_a_row: u32) -> bool {
    !doubtful || (!known && doubtful_in_a_row >= 2)
}

/// Set-aside samples of a kernel in a row, with none measured behind queued work
/// between them, after which they teach its cost (`set_aside_sample_teaches`).
pub const SET_ASIDE_RUN: u32 = 16;

/// Whether a sample set aside by `idle_sample_may_time_a_neighbour` still teaches its
/// kernel's cost: once the kernel's samples have all been set aside for a while
/// (`set_aside_in_a_row`, at least `SET_ASIDE_RUN`: nothing measured behind queued work
/// corrects the estimate any more), where its run was at most a quarter longer than the
/// estimate (`estimate_ns`). A neighbour's slice that a sample waited for is longer than
/// that (on the H200 milliseconds against a decode step's kernels of 10-100 us; on the
/// sim a 1 ms kernel against 100 us), so the estimate comes to the kernel's own run.
///
/// Without it, an estimate learned before the host's view named a neighbour stayed where
/// those samples put it wherever the process stopped queueing work: a decode loop whose
/// launch calls outlast its kernels (a slow host: CI's of bddc3ae) kept a 100 us kernel
/// at 144 us and was charged 1.5-2.0x what it ran. Not while samples behind queued work
/// still come: those are the kernel's own, and set-aside samples, kept only when short,
/// would pull the estimate of a kernel whose runs vary to its shorter ones (a
/// training-like loop at 50 ran the card at 53-54 %).
pub fn set_aside_sample_teaches(
    measured_ns: u64,
    estimate_ns: u64,
    set_aside_in_a_row: u32,
) -> bool {
    set_aside_in_a_row >= SET_ASIDE_RUN
        && measured_ns <= estimate_ns.saturating_add(estimate_ns / 4)
}

/// Whether a launch of `cost_ns` that adds `added_ns` to the union may go while the
/// bucket holds launches, with `owed_ns` of wall time owed at `rate_ppm`: it runs almost
/// entirely within work already queued (it adds at most a quarter of its cost), and the
/// bucket owes no more than one such launch and its ride (five quarters of its cost, as
/// wall time). Riding along keeps one round of concurrent streams together when a hold
/// falls between them; the debt bound keeps it to that round. Without it, a thread
/// paced by a saturated card launches at gaps of a quarter of a kernel or less, every
/// launch rides, and the hold never comes (CI of cea03dc: 8 streams from one thread at
/// 30 ran the card at 100 %).
pub fn rides_along(added_ns: u64, cost_ns: u64, owed_ns: u64, rate_ppm: u64) -> bool {
    cost_ns != 0
        && added_ns.saturating_mul(4) <= cost_ns
        && owed_ns <= wall_of(cost_ns.saturating_add(cost_ns / 4), rate_ppm)
}

/// Launches between two samples of a short kernel, on average.
pub const SAMPLE_EVERY: u32 = 8;

/// The number of launches after which a short kernel's next sample is due, drawn anew
/// for each launch from `entropy` (any fast-changing number, such as the clock's low
/// bits): 4 to 12, 8 on average. A fixed count would alias with a program's period (the
/// same launch of a kernel in every training step, say the one on the smallest tensor),
/// and the estimate would then stand for that launch, not for all of them.
pub fn sample_every(entropy: u64) -> u32 {
    let mixed = entropy.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32;
    SAMPLE_EVERY / 2 + (mixed % (SAMPLE_EVERY as u64 + 1)) as u32
}
/// Kernels at least this long are measured every launch (the events cost nothing next to them).
pub const ALWAYS_SAMPLE_NS: u64 = 1_000_000;

/// Samples of short kernels on a device are at least this far apart while the sampled
/// kernel is still being learned, and always in a process whose kernels overlap: with
/// launches of a few microseconds, one in eight would cost more in event calls than the
/// launch itself.
pub const SAMPLE_GAP_NS: u64 = 200_000;
/// The gap after a sample of a kernel measured `SETTLED_SAMPLES` times already, in a
/// process whose kernels have not overlapped lately (one stream at a time).
pub const SETTLED_SAMPLE_GAP_NS: u64 = 1_000_000;
/// Samples after which a kernel's cost counts as settled (`SETTLED_SAMPLE_GAP_NS`).
pub const SETTLED_SAMPLES: u32 = 32;

/// How long after sampling a kernel measured `samples` times the device's next sample
/// of a short kernel may come, in a process whose kernels have `overlapped` lately or
/// not.
///
/// Where kernels overlap, settled samples correct the union for the process's own
/// queueing on the SMs, and fewer of them charge too little: one container's two
/// processes of four streams at 30 took 35.3 and 36.6 % of their bare pair with the
/// 1 ms gap, 31.2 with 200 us (H200, BENCHMARKS run 12, one machine). One stream at a
/// time, nothing of the process's own can hold a kernel, and beside a busy neighbour
/// the 200 us gap taught a decode loop costs of 54-93 us for kernels it learned at
/// 10-11 us with 1 ms, and its steps stalled (50/50: max 10.5 ms against 3.2 and 5.3;
/// the bare pair's 2.7-3.6). Samples cost too: two event records and two elapsed
/// times (`Sample::read`); the 200 us gap sampled one launch in 40 of a 4 us launch loop.
///
/// Once the device's last `QUIET_SAMPLES` samples (`agreeing` in a row) each measured
/// its kernel within a quarter of the estimate or a microsecond (`agrees`), the gap is
/// `QUIET_SAMPLE_GAP_NS`: a sample then says what the estimate says already, and on a
/// slower host its events and settle cost about 55 ns of a 4.4 us launch at one per
/// 1 ms (H100, BENCHMARKS run 26: settle 6.6-8.1 us, events 4.1-4.7 us). The first
/// sample that disagrees (a neighbour's slice, a kernel that changed, a doubtful or set
/// aside measurement) brings the 1 ms gap back when it settles (the next sample then
/// comes within 1 ms: `DeviceLimiter::note_agreement`), so a change is measured at most
/// `QUIET_SAMPLE_GAP_NS` late and then sampled as before.
pub fn sample_gap_ns(samples: u32, overlapped: bool, agreeing: u32) -> u64 {
    if overlapped || samples < SETTLED_SAMPLES {
        SAMPLE_GAP_NS
    } else if agreeing >= QUIET_SAMPLES {
        QUIET_SAMPLE_GAP_NS
    } else {
        SETTLED_SAMPLE_GAP_NS
    }
}

/// The gap after a settled kernel's sample where the device's samples have agreed with
/// their estimates lately (`sample_gap_ns`).
pub const QUIET_SAMPLE_GAP_NS: u64 = 4_000_000;
/// Samples in a row that must agree with their estimates for `QUIET_SAMPLE_GAP_NS`.
pub const QUIET_SAMPLES: u32 = 8;
/// How far a sample may lie from its kernel's estimate and still agree with it, per
/// mille of the estimate.
pub const AGREE_PERMILLE: u64 = 250;
/// ... and at least this far, ns: two events time a kernel of a few microseconds to
/// about half a microsecond either way, which is no change in the kernel.
pub const AGREE_SLACK_NS: u64 = 1_000;

/// Whether a kernel measured at `measured_ns` agrees with its estimate `estimate_ns`
/// (within `AGREE_PERMILLE` of it, or `AGREE_SLACK_NS`; an estimate of zero agrees
/// with nothing).
pub fn agrees(measured_ns: u64, estimate_ns: u64) -> bool {
    let off = measured_ns.abs_diff(estimate_ns);
    estimate_ns > 0
        && (off <= AGREE_SLACK_NS
            || (off as u128) * 1000 <= (estimate_ns as u128) * AGREE_PERMILLE as u128)
}

/// A learned cost, packed into one word: the cost (40 bits of ns, up to 18 minutes), the
/// number of samples (8 bits, saturating) and the launches since the last sample (16).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Estimate {
    pub cost_ns: u64,
    pub samples: u32,
    pub since_sample: u32,
}

const COST_BITS: u32 = 40;
const COST_MASK: u64 = (1 << COST_BITS) - 1;
/// Where the launches-since-sample counter starts in a packed estimate (its top bits).
pub const SINCE_SHIFT: u32 = COST_BITS + 8;

impl Estimate {
    pub fn pack(self) -> u64 {
        self.cost_ns.min(COST_MASK)
            | (self.samples.min(0xff) as u64) << COST_BITS
            | (self.since_sample.min(0xffff) as u64) << SINCE_SHIFT
    }

    pub fn unpack(word: u64) -> Estimate {
        Estimate {
            cost_ns: word & COST_MASK,
            samples: ((word >> COST_BITS) & 0xff) as u32,
            since_sample: (word >> SINCE_SHIFT) as u32 & 0xffff,
        }
    }

    /// The first measurement.
    pub fn first(measured_ns: u64) -> Estimate {
        Estimate {
            cost_ns: measured_ns,
            samples: 1,
            since_sample: 0,
        }
    }

    /// Folds in a measurement: an exponential average, quick to settle over the first
    /// samples (a quarter of each), then steadier (a sixteenth): kernels that wait for
    /// SMs behind the container's own measure in two modes, and a noisy cost would make
    /// the union of concurrent streams' projections (a maximum) read long.
    pub fn record(self, measured_ns: u64) -> Estimate {
        let weight = if self.samples < 8 { 4 } else { 16 };
        Estimate {
            cost_ns: if self.samples == 0 {
                measured_ns
            } else {
                (self
                    .cost_ns
                    .saturating_mul(weight - 1)
                    .saturating_add(measured_ns))
                    / weight
            },
            samples: self.samples.saturating_add(1),
            since_sample: 0,
        }
    }

    /// Counts one launch; `Some(counted)` with the sample counter reset when this launch
    /// should be measured (every launch of a long kernel; of a short one, once
    /// `sample_allowed`, the first after `every` launches, see [`sample_every`]), else the
    /// counted estimate and false.
    pub fn count_launch(self, sample_allowed: bool, every: u32) -> (Estimate, bool) {
        let since = self.since_sample.saturating_add(1);
        let due = self.cost_ns >= ALWAYS_SAMPLE_NS || (since >= every && sample_allowed);
        let counted = Estimate {
            since_sample: if due { 0 } else { since },
            ..self
        };
        (counted, due)
    }
}

/// `ns` scaled by `permille` / 1000: a multiply and a division by a constant in 64
/// bits, which the compiler turns into a multiply and shifts (a 128-bit division is a
/// call to `__divti3`, on every launch beside a neighbour); 128 bits only where the
/// product overflows (a charge of weeks).
pub fn scale_permille(ns: i64, permille: u64) -> i64 {
    match i64::try_from(permille)
        .ok()
        .and_then(|factor| ns.checked_mul(factor))
    {
        Some(product) => product / 1000,
        None => {
            (ns as i128 * permille as i128 / 1000).clamp(i64::MIN as i128, i64::MAX as i128) as i64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_launch_behind_queued_work_is_charged_without_the_set_up_the_card_hides() {
        // A 30 us estimate of which 10 us was the set-up its samples timed: 20 us.
        assert_eq!(behind_cost(30 * US, 10 * US), 20 * US);
        // No set-up learned: the estimate.
        assert_eq!(behind_cost(30 * US, 0), 30 * US);
        // Never below a quarter of the estimate, whatever the set-up says.
        assert_eq!(behind_cost(4 * US, 16 * US), US);
        assert_eq!(behind_cost(0, 10 * US), 0);
    }

    #[test]
    fn a_pair_of_launches_shows_the_second_ones_set_up() {
        // Single samples time 25 us each (5 us of set-up behind the start event); the
        // pair took 45: the second's 5 us of set-up ran beside the first.
        assert_eq!(pair_setup(25 * US, 25 * US, 45 * US), Some(5 * US));
        // The second found the stream idle (its set-up exposed, and host time between):
        // nothing is hidden.
        assert_eq!(pair_setup(25 * US, 25 * US, 70 * US), Some(0));
        // A pair that says more than any card's set-up timed something else.
        assert_eq!(pair_setup(500 * US, 500 * US, 100 * US), None);
        assert_eq!(pair_setup(30 * US, 30 * US, 44 * US), None);
        // As does one that would hide most of a kernel: 4 us of a 5 us estimate.
        assert_eq!(pair_setup(5 * US, 30 * US, 31 * US), None);
        // An empty kernel's: 4.4 us samples of launches that add 1.5 us each.
        assert_eq!(pair_setup(4_400, 4_400, 5_900), Some(2_900));
    }

    #[test]
    fn only_a_kernel_whose_samples_agree_with_its_estimate_is_steady() {
        let fold = |samples: &[(u64, u64)]| {
            samples
                .iter()
                .fold(Steadiness::default(), |s, &(measured, estimate)| {
                    s.fold(measured, estimate)
                })
        };
        // Within 10 %: steady once it has three deviations.
        let steady = fold(&[(30, 30), (33, 30), (28, 30)]);
        assert!(steady.is_steady(), "{steady:?}");
        assert!(!fold(&[(30, 30), (33, 30)]).is_steady(), "too few");
        // A training step's kernel: one grid in four six times the others'.
        let varying = fold(&[(10, 22), (60, 22), (10, 22), (10, 22), (60, 22), (10, 22)]);
        assert!(!varying.is_steady(), "{varying:?}");
        // An estimate of zero says nothing steady.
        assert!(!fold(&[(5, 0), (5, 0), (5, 0)]).is_steady());
    }

    #[test]
    fn the_set_up_is_the_median_of_recent_pairs_so_one_odd_pair_moves_nothing() {
        assert_eq!(setup_from(&[]), 0);
        assert_eq!(setup_from(&[7]), 7);
        assert_eq!(setup_from(&[2, 3, 5_000]), 3);
        assert_eq!(setup_from(&[0, 3, 3, 3, 0]), 3);
        // Even counts take the lower middle: on the side of charging more.
        assert_eq!(setup_from(&[1, 5]), 1);
        // Only the latest SETUPS_MOST count: sixteen 4s after a hundred 9s.
        let many: Vec<u64> = [9; 100].into_iter().chain([4; SETUPS_MOST]).collect();
        assert_eq!(setup_from(&many), 4);
    }

    #[test]
    fn a_one_stream_kernel_delayed_by_another_context_is_charged_only_its_longer_run() {
        // Projected 1 ms, ran 1 ms but 3 ms later (another context's slice): its real run
        // lies wholly beyond the horizon (1 ms), and its projection was charged already.
        assert_eq!(settled_overrun(MS, MS, MS, false), 0);
        // Ran 1.5 ms: the half millisecond more than projected is its own.
        assert_eq!(settled_overrun(MS, MS + MS / 2, MS, false), MS / 2);
        // Never more than what it added beyond the horizon.
        assert_eq!(settled_overrun(MS / 4, 2 * MS, MS, false), MS / 4);
        // Streams that overlap: the kernel may have waited for SMs behind the process's
        // own kernels, which the card spent on it: the whole overrun.
        assert_eq!(settled_overrun(MS, MS, MS, true), MS);
    }

    #[test]
    fn grids_within_an_eighth_share_a_class_and_larger_ones_do_not() {
        assert_eq!(grid_class(0), 0);
        assert_eq!(grid_class(7), 7);
        assert_ne!(grid_class(16), grid_class(17));
        // 1024 and 1151 are within an eighth of 1024; 1152 is the next class.
        assert_eq!(grid_class(1024), grid_class(1151));
        assert_ne!(grid_class(1151), grid_class(1152));
        // Classes rise with the grid and stay under 256.
        let mut last = 0;
        for shift in 0..64 {
            for blocks in [1u64 << shift, (1u64 << shift) | ((1u64 << shift) / 2)] {
                let class = grid_class(blocks);
                assert!(class >= last && class < 256, "{blocks}: {class}");
                last = class;
            }
        }
        assert_eq!(grid_class(u64::MAX), 255);
    }

    #[test]
    fn a_seed_is_corrected_to_the_run_it_stood_for() {
        // A seed of 150 us, all of it new to the union, for a 100 us run: 50 back.
        assert_eq!(seed_correction(150_000, 150_000, 100_000), -50_000);
        // A seed that ran longer pays the rest.
        assert_eq!(seed_correction(100_000, 100_000, 130_000), 30_000);
        // Half of it overlapped other streams' queued work when it went out: half the
        // difference.
        assert_eq!(seed_correction(150_000, 75_000, 100_000), -25_000);
        // Nothing of it was new: nothing to correct; and no overflow.
        assert_eq!(seed_correction(150_000, 0, 100_000), 0);
        assert_eq!(seed_correction(0, u64::MAX, u64::MAX), 0);
    }

    #[test]
    fn a_class_floor_is_the_fewest_blocks_of_its_class() {
        for class in 1..=255u64 {
            let floor = class_floor(class);
            assert_eq!(grid_class(floor), class, "class {class}: floor {floor}");
            if class < 255 {
                assert_eq!(
                    grid_class(floor - 1),
                    class - 1,
                    "below class {class}'s floor"
                );
            }
        }
    }

    #[test]
    fn a_new_grid_is_seeded_from_the_nearest_classes_first_within_an_octave() {
        let near: Vec<u64> = seed_classes(40).collect();
        assert_eq!(&near[..4], &[39, 41, 38, 42]);
        assert_eq!(near.len(), 16);
        assert!(near.iter().all(|c| c.abs_diff(40) <= SEED_REACH));
        // Never class 0 (an empty grid) or above 255.
        assert_eq!(
            seed_classes(2).collect::<Vec<_>>(),
            [1, 3, 4, 5, 6, 7, 8, 9, 10]
        );
        assert!(seed_classes(250).all(|c| c <= 255));
    }

    #[test]
    fn a_seed_scales_with_the_grid_within_half_and_twice_the_known_cost() {
        let class = grid_class(1024);
        // 1100 blocks against a class of 1024: about 7 % more.
        assert_eq!(seed_cost(100_000, class, 1100), 107_421);
        // Far larger or smaller grids: at most twice, at least half.
        assert_eq!(seed_cost(100_000, class, 1 << 20), 200_000);
        assert_eq!(seed_cost(100_000, class, 1), 50_000);
        // Never overflows.
        assert_eq!(seed_cost(u64::MAX / 2, 255, u64::MAX), u64::MAX / 2 * 2);
    }

    #[test]
    fn only_an_idle_start_beside_a_neighbour_with_a_backlogged_measure_is_discounted() {
        assert!(idle_sample_may_time_a_neighbour(
            true, true, false, true, true
        ));
        // Any one thing that says the run was the process's own keeps the sample.
        for (idle, known, overlapped, neighbours, backlogged) in [
            (false, true, false, true, true),
            (true, false, false, true, true),
            (true, true, true, true, true),
            (true, true, false, false, true),
            (true, true, false, true, false),
        ] {
            assert!(
                !idle_sample_may_time_a_neighbour(idle, known, overlapped, neighbours, backlogged),
                "{idle} {known} {overlapped} {neighbours} {backlogged}"
            );
        }
    }

    #[test]
    fn a_set_aside_sample_teaches_a_run_near_the_estimate_not_a_slice() {
        let run = SET_ASIDE_RUN;
        // An estimate too long or too short comes to the kernel's own run.
        assert!(set_aside_sample_teaches(97 * US, 144 * US, run));
        assert!(set_aside_sample_teaches(97 * US, 81 * US, run));
        assert!(set_aside_sample_teaches(125 * US, 100 * US, run));
        // A neighbour's slice does not.
        assert!(!set_aside_sample_teaches(126 * US, 100 * US, run));
        assert!(!set_aside_sample_teaches(MS + 100 * US, 100 * US, run));
        // Nor anything while samples behind queued work still teach.
        assert!(!set_aside_sample_teaches(97 * US, 144 * US, run - 1));
    }

    #[test]
    fn a_sample_whose_end_event_was_recorded_late_timed_the_delay() {
        // 500 us lost before the end record of a 20 us kernel: the sample ends at the
        // record, 504 us after the launch returned.
        assert!(is_doubtful(504 * US, 500 * US));
        // A kernel that ran well past the late record was timed.
        assert!(!is_doubtful(900 * US, 500 * US));
        assert!(!is_doubtful(200 * US, 60 * US));
        // A record as prompt as usual decides nothing, however short the kernel.
        assert!(!is_doubtful(4 * US, 3 * US));
        assert!(!is_doubtful(50 * US, 50 * US));
        assert!(is_doubtful(60 * US, 51 * US));
    }

    #[test]
    fn a_sample_whose_launch_call_loaded_its_kernel_teaches_nothing_once() {
        // A 20 us kernel after a 20 ms load is doubtful; after a launch call of a few
        // microseconds, or a long one shorter than three times the kernel, it is not.
        assert!(is_doubtful(20 * MS + 20 * US, 20 * MS));
        assert!(!is_doubtful(6 * US, 5 * US));
        assert!(!is_doubtful(300 * US, 200 * US));
        assert!(is_doubtful(220 * US, 200 * US));
        // A doubtful sample teaches a known kernel nothing however many come, an unknown
        // one from the second in a row; any other teaches.
        for in_a_row in 1..4 {
            assert!(!sample_teaches(true, true, in_a_row));
        }
        assert!(!sample_teaches(true, false, 1));
        assert!(sample_teaches(true, false, 2));
        assert!(sample_teaches(false, true, 0));
        assert!(sample_teaches(false, false, 0));
    }

    #[test]
    fn scaling_a_charge_matches_128_bit_arithmetic_everywhere() {
        for ns in [
            0,
            1,
            999,
            1_000_001,
            -7_777,
            1 << 40,
            -(1 << 40),
            i64::MAX,
            i64::MIN + 1,
        ] {
            for permille in [500u64, 731, 1000, 1999, 2000] {
                let exact = (ns as i128 * permille as i128 / 1000)
                    .clamp(i64::MIN as i128, i64::MAX as i128) as i64;
                assert_eq!(scale_permille(ns, permille), exact, "{ns} x {permille}");
            }
        }
        assert_eq!(
            scale_permille(i64::MAX, 2000),
            i64::MAX,
            "saturates, never wraps"
        );
    }

    const MS: u64 = 1_000_000;
    const US: u64 = 1_000;
    const WINDOW: u64 = 10 * MS;

    /// A GPU with `streams` concurrent streams and a program that launches `kernel_ns`
    /// kernels round-robin as fast as the limiter lets it, charging each launch its union
    /// increment (what the shim does once a kernel's cost is learned). Returns each
    /// kernel's [start, end) on the GPU.
    fn run(percent: u32, kernel_ns: u64, streams: usize, wall_ns: u64) -> Vec<(u64, u64)> {
        let rate = percent_ppm(percent);
        let mut paid = 0u64;
        let mut horizon = 0u64;
        let mut host = 1_000 * SECOND_NS;
        let t0 = host;
        let mut busy_until = vec![0u64; streams];
        let mut kernels = Vec::new();
        let mut next = 0;
        while host < t0 + wall_ns {
            host += delay(paid, host);
            let stream = next % streams;
            next += 1;
            let start = host.max(busy_until[stream]);
            let end = start + kernel_ns;
            busy_until[stream] = end;
            kernels.push((start - t0, end - t0));
            let increment = union_increment(start, end, horizon);
            horizon = horizon.max(end);
            paid = charge(paid, host, increment as i64, rate, WINDOW);
            host += 5_000; // launch overhead
            // The host may not run ahead of the GPU by more than a small queue per stream.
            let queue_end = *busy_until.iter().min().unwrap_or(&0);
            if queue_end > host + 2 * kernel_ns {
                host = queue_end - 2 * kernel_ns;
            }
        }
        kernels
    }

    /// Busy time of the union of `kernels` within [from, to).
    fn union_in(kernels: &[(u64, u64)], from: u64, to: u64) -> u64 {
        let mut spans: Vec<(u64, u64)> = kernels
            .iter()
            .map(|&(s, e)| (s.max(from), e.min(to)))
            .filter(|(s, e)| s < e)
            .collect();
        spans.sort_unstable();
        let (mut busy, mut reach) = (0, 0);
        for (s, e) in spans {
            busy += e.saturating_sub(s.max(reach));
            reach = reach.max(e);
        }
        busy
    }

    #[test]
    fn converges_on_the_limit_for_short_and_long_kernels_on_any_number_of_streams() {
        for percent in [10, 30, 50, 70] {
            for kernel in [100_000, MS, 10 * MS] {
                for streams in [1, 2, 4, 8] {
                    let kernels = run(percent, kernel, streams, 2 * SECOND_NS);
                    let fraction = union_in(&kernels, 0, 2 * SECOND_NS) as f64
                        / (2 * SECOND_NS) as f64
                        * 100.0;
                    assert!(
                        (fraction - percent as f64).abs() <= 2.0,
                        "{percent}% with {kernel} ns kernels on {streams} streams gave {fraction:.1}%"
                    );
                }
            }
        }
    }

    #[test]
    fn hard_limit_holds_in_every_100ms_window() {
        for percent in [10, 30, 70] {
            for kernel in [100_000, MS, 10 * MS] {
                let kernels = run(percent, kernel, 4, 2 * SECOND_NS);
                let worst = (0..19)
                    .map(|i| {
                        union_in(&kernels, i * 100 * MS, (i + 1) * 100 * MS) as f64
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
    fn overlapping_kernels_are_charged_once() {
        // Four streams, each a 100 us kernel queued at once: 100 us of union, not 400.
        let (mut horizon, mut charged) = (0, 0);
        for _ in 0..4 {
            charged += union_increment(1_000, 101_000, horizon);
            horizon = horizon.max(101_000);
        }
        assert_eq!(charged, 100_000);
        // Staggered by 30 us: 100 + 3 x 30.
        let (mut horizon, mut charged) = (0, 0);
        for i in 0..4 {
            let start = 1_000 + i * 30_000;
            charged += union_increment(start, start + 100_000, horizon);
            horizon = horizon.max(start + 100_000);
        }
        assert_eq!(charged, 190_000);
        // Past the horizon, the whole kernel; a gap does not count.
        assert_eq!(union_increment(500_000, 600_000, 200_000), 100_000);
    }

    #[test]
    fn a_bucket_never_charged_starts_empty_and_fills_only_while_idle() {
        let now = 100 * SECOND_NS;
        let rate = percent_ppm(60);
        // The first launch goes; its 6 ms at 60% is paid over the next 10 ms.
        assert_eq!(delay(0, now), 0);
        let paid = charge(0, now, 6 * MS as i64, rate, 20 * MS);
        assert!(delay(paid, now).abs_diff(10 * MS) < 10, "(ns rounding)");
        // A rate change of a bucket never charged keeps it empty.
        assert_eq!(rescale(0, now, FULL_PPM, rate, 20 * MS), now);
        // Idle for a second afterwards, it holds one window's burst: 12 ms at 60%.
        let later = paid + SECOND_NS;
        let paid = charge(paid, later, 12 * MS as i64, rate, 20 * MS);
        assert_eq!(delay(paid, later), 0);
        let paid = charge(paid, later, 6 * MS as i64, rate, 20 * MS);
        assert!(delay(paid, later).abs_diff(10 * MS) < 10, "(ns rounding)");
    }

    #[test]
    fn a_kernel_longer_than_the_window_is_paid_after() {
        let now = 100 * SECOND_NS;
        let full = now - 20 * MS;
        let paid = charge(full, now, 50 * MS as i64, percent_ppm(30), 20 * MS);
        // 50 ms against a 6 ms burst at 30%: (50 - 6) / 0.3 ms of waiting.
        let wait = delay(paid, now);
        assert!(
            (wait as i64 - (44 * MS * 10 / 3) as i64).abs() < 1_000,
            "{wait}"
        );
        assert_eq!(delay(paid, now + wait), 0);
    }

    #[test]
    fn debt_is_bounded_and_idle_time_does_not_bank_beyond_the_burst() {
        let now = 100 * SECOND_NS;
        let rate = percent_ppm(10);
        let paid = charge(now - 20 * MS, now, 100 * SECOND_NS as i64, rate, 20 * MS);
        assert_eq!(delay(paid, now), MAX_DEBT_NS * 10);
        // A long idle spell refills only the burst: 10% of 20 ms = 2 ms of GPU time, so
        // 3 ms at once leaves 1 ms of debt (10 ms of wall time).
        let later = paid + 1000 * SECOND_NS;
        let paid = charge(paid, later, 3 * MS as i64, rate, 20 * MS);
        assert_eq!(delay(paid, later), 10 * MS);
        // Giving back never fills beyond the burst either.
        let paid = charge(paid, later, -(100 * MS as i64), rate, 20 * MS);
        assert_eq!(paid, later - 20 * MS);
    }

    #[test]
    fn rate_changes_keep_the_debt_and_shrink_the_burst() {
        let now = 100 * SECOND_NS;
        // Full at 100% (20 ms of GPU time); at 25% the burst is 5 ms.
        let paid = rescale(now - 20 * MS, now, FULL_PPM, percent_ppm(25), 20 * MS);
        let paid = charge(paid, now, 15 * MS as i64, percent_ppm(25), 20 * MS);
        // 15 ms spent of a 5 ms burst: 10 ms of GPU time owed, 40 ms at 25%.
        assert_eq!(delay(paid, now), 40 * MS);
        // Owed time is kept in GPU time: at 50% it takes 20 ms.
        let paid = rescale(paid, now, percent_ppm(25), percent_ppm(50), 20 * MS);
        assert_eq!(delay(paid, now), 20 * MS);
    }

    #[test]
    fn whole_percent_rates_take_the_table_and_agree_with_division() {
        for percent in 1..=100u32 {
            for cost in [1u64, 999, 100_000, 7 * MS, MAX_DEBT_NS] {
                let rate = percent_ppm(percent);
                let exact = cost as u128 * FULL_PPM as u128 / rate as u128;
                let table = wall_of(cost, rate) as u128;
                assert!(
                    exact - table <= 1,
                    "{cost} ns at {percent}%: {table} vs {exact}"
                );
            }
        }
        assert_eq!(wall_of(1_000, 123_456), 8_100, "other rates divide");
    }

    #[test]
    fn a_launch_rides_along_only_within_queued_work_and_a_small_debt() {
        let rate = percent_ppm(25);
        let cost = 100_000;
        // Within queued work (a quarter of its cost added at most), little owed: it goes.
        assert!(rides_along(0, cost, 0, rate));
        assert!(rides_along(cost / 4, cost, 500_000, rate));
        // More than a quarter of it beyond the queued work: held.
        assert!(!rides_along(cost / 4 + 1, cost, 0, rate));
        // Five quarters of its cost at 25 % is 500 us of wall time owed; beyond it, held.
        assert!(!rides_along(0, cost, 500_001, rate));
        assert!(
            !rides_along(0, 0, 0, rate),
            "a launch costing nothing has no ride"
        );
    }

    #[test]
    fn sample_intervals_vary_around_eight() {
        let draws: Vec<u32> = (0..10_000u64).map(|i| sample_every(i * 977)).collect();
        assert!(draws.iter().all(|d| (4..=12).contains(d)), "4 to 12");
        let mean = draws.iter().sum::<u32>() as f64 / draws.len() as f64;
        assert!((mean - 8.0).abs() < 0.3, "mean {mean}");
        for every in 4..=12 {
            assert!(draws.contains(&every), "{every} is drawn");
        }
    }

    #[test]
    fn estimates_pack_sample_and_follow_a_change() {
        let estimate = Estimate::first(100_000);
        assert_eq!(Estimate::unpack(estimate.pack()), estimate);
        let mut current = estimate;
        let mut sampled = 0;
        for _ in 0..SAMPLE_EVERY * 4 {
            let (counted, due) = current.count_launch(true, SAMPLE_EVERY);
            current = if due {
                sampled += 1;
                counted.record(100_000)
            } else {
                counted
            };
        }
        assert_eq!(sampled, 4, "one short launch in {SAMPLE_EVERY} is measured");
        let (held, due) = Estimate {
            since_sample: SAMPLE_EVERY,
            ..current
        }
        .count_launch(false, SAMPLE_EVERY);
        assert!(
            !due && held.since_sample > SAMPLE_EVERY,
            "waits for a sample slot"
        );
        assert!(
            Estimate::first(2 * MS).count_launch(false, SAMPLE_EVERY).1,
            "long kernels: every launch"
        );
        for _ in 0..48 {
            current = current.record(300_000);
        }
        assert!(
            (290_000..=300_000).contains(&current.cost_ns),
            "{current:?}"
        );
        let huge = Estimate::first(u64::MAX);
        assert_eq!(Estimate::unpack(huge.pack()).cost_ns, COST_MASK);
    }

    #[test]
    fn a_settled_kernel_of_one_stream_is_sampled_five_times_less_often() {
        assert_eq!(sample_gap_ns(0, false, 0), SAMPLE_GAP_NS);
        assert_eq!(sample_gap_ns(SETTLED_SAMPLES - 1, false, 0), SAMPLE_GAP_NS);
        assert_eq!(
            sample_gap_ns(SETTLED_SAMPLES, false, 0),
            SETTLED_SAMPLE_GAP_NS
        );
        assert_eq!(sample_gap_ns(u32::MAX, false, 0), SETTLED_SAMPLE_GAP_NS);
        assert_eq!(SETTLED_SAMPLE_GAP_NS, 5 * SAMPLE_GAP_NS);
        // Overlapping kernels keep the short gap, settled or not.
        assert_eq!(sample_gap_ns(0, true, 0), SAMPLE_GAP_NS);
        assert_eq!(sample_gap_ns(u32::MAX, true, 0), SAMPLE_GAP_NS);
    }

    #[test]
    fn a_device_whose_samples_agree_with_their_estimates_samples_four_times_less_often() {
        let settled = SETTLED_SAMPLES;
        assert_eq!(
            sample_gap_ns(settled, false, QUIET_SAMPLES - 1),
            SETTLED_SAMPLE_GAP_NS
        );
        assert_eq!(
            sample_gap_ns(settled, false, QUIET_SAMPLES),
            QUIET_SAMPLE_GAP_NS
        );
        assert_eq!(sample_gap_ns(settled, false, u32::MAX), QUIET_SAMPLE_GAP_NS);
        assert_eq!(QUIET_SAMPLE_GAP_NS, 4 * SETTLED_SAMPLE_GAP_NS);
        // Agreement does not lengthen the gap of a kernel still learned, nor where the
        // process's kernels overlap (settles charge their queueing there).
        assert_eq!(sample_gap_ns(settled - 1, false, u32::MAX), SAMPLE_GAP_NS);
        assert_eq!(sample_gap_ns(settled, true, u32::MAX), SAMPLE_GAP_NS);
    }

    #[test]
    fn a_sample_agrees_within_a_quarter_of_its_estimate() {
        assert!(agrees(10_000, 10_000));
        assert!(agrees(12_500, 10_000));
        assert!(agrees(7_500, 10_000));
        assert!(!agrees(12_501, 10_000));
        assert!(!agrees(7_499, 10_000));
        // A neighbour's slice in the sample: far off.
        assert!(!agrees(2_000_000, 10_000));
        // A kernel of a few microseconds agrees within the events' own resolution.
        assert!(agrees(3_000, 2_000));
        assert!(agrees(1_000, 2_000));
        assert!(!agrees(3_001, 2_000));
        // Nothing agrees with an estimate of zero, and no product overflows.
        assert!(!agrees(0, 0));
        assert!(!agrees(5, 0));
        assert!(agrees(u64::MAX, u64::MAX));
        assert!(!agrees(0, u64::MAX));
    }
}
