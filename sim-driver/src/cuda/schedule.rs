//! When a simulated kernel gets the SMs it needs, and the card.
//!
//! The simulated card gives each block of a kernel one SM for the kernel's whole
//! duration (as a block that takes most of an SM's shared memory would on a real card),
//! so a kernel of `B` blocks occupies `min(B, SMs)` SMs. A kernel whose SMs are not free
//! when its stream reaches it waits until they are: kernels on several streams overlap
//! while they fit on the card and queue behind each other when they do not, and events
//! around a kernel that waited time the wait too, as on a real card. That schedule is
//! per process and device ([`SmSchedule`]).
//!
//! Between processes, a real card without MPS time-slices: one context's kernels run at
//! a time, so a process's kernel waits while another process's run, and the events
//! around it time that wait too. The sim does the same by default ([`place_on_card`],
//! from every process's current turn in the cross-process state file): processes take
//! turns on the card in the order they queued, a process's streams overlap within its
//! turn, and each process's busy time (what NVML's per-process utilization reports) is
//! only its own kernels' run. `VGPU_SIM_MPS=1` runs the
//! processes side by side instead, as with MPS (each process's timeline independent).

use crate::state::{SharedState, SlotIndex};

/// Env: set to `1` to run different processes' kernels side by side (as under MPS)
/// instead of time-slicing the card between them.
pub const MPS_ENV: &str = "VGPU_SIM_MPS";

/// Whether processes share the card side by side (`VGPU_SIM_MPS=1`), read once.
fn side_by_side() -> bool {
    static MPS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *MPS.get_or_init(|| std::env::var(MPS_ENV).is_ok_and(|value| value == "1"))
}

/// Env: set to `1` for kernels whose duration is per wave: a kernel of more blocks than
/// the card has SMs runs its named duration once per `SMs` blocks, as a real kernel's
/// cost grows with its grid (so one function launched on tensors of different sizes
/// costs different times per launch).
pub const WAVES_ENV: &str = "VGPU_SIM_WAVES";

/// Env: host nanoseconds each kernel or graph launch call takes (the caller's thread
/// spins that long, as a real driver's launch path costs its caller a few
/// microseconds, more on a busy machine); 0 by default.
pub const LAUNCH_CALL_ENV: &str = "VGPU_SIM_LAUNCH_CALL_NS";

/// Spends the host time `VGPU_SIM_LAUNCH_CALL_NS` asks of a launch call, if any.
pub fn spend_launch_call() {
    static CALL_NS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let call_ns = *CALL_NS.get_or_init(|| {
        std::env::var(LAUNCH_CALL_ENV)
            .ok()
            .and_then(|value| value.parse::<u64>().ok())
            .unwrap_or(0)
            .min(1_000_000_000)
    });
    if call_ns > 0 {
        spin_ns(call_ns);
    }
}

/// Env: host nanoseconds the first launch call of each function (or library kernel)
/// handle in a process spends before the kernel is queued; 0 by default. CUDA 12 loads
/// a kernel's code onto the card at its first launch (lazy loading, the default), inside
/// that launch call: PyTorch's first launches of a kernel took a millisecond or more
/// (an H100, BENCHMARKS run 20), between a sample's start event and the kernel.
pub const FIRST_LAUNCH_ENV: &str = "VGPU_SIM_FIRST_LAUNCH_NS";

/// Spends `VGPU_SIM_FIRST_LAUNCH_NS` of host time if this is `handle`'s first launch
/// call in the process.
pub fn spend_first_launch(handle: u64) {
    static NS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    static LAUNCHED: std::sync::Mutex<Option<std::collections::HashSet<u64>>> =
        std::sync::Mutex::new(None);
    let ns = *NS.get_or_init(|| env_ns(FIRST_LAUNCH_ENV));
    if ns == 0 {
        return;
    }
    let first = match LAUNCHED.lock() {
        Ok(mut launched) => launched.get_or_insert_with(Default::default).insert(handle),
        Err(_) => false,
    };
    if first {
        spin_ns(ns);
    }
}

/// Spins the calling thread for `ns` of the sim's clock.
fn spin_ns(ns: u64) {
    let until = crate::clock::now_ns().saturating_add(ns);
    while crate::clock::now_ns() < until {
        std::hint::spin_loop();
    }
}

/// Env: `EVERY:NS`, so that every `EVERY`th event record call of the process first
/// sleeps `NS` nanoseconds of host time (at most a second) before it records; unset by
/// default. It is a thread descheduled just before it records an event, as a busy host
/// or a CPU quota does to it: an end event recorded after its kernel has ended fires at
/// its record, so it times the stall too.
pub const RECORD_STALL_ENV: &str = "VGPU_SIM_RECORD_STALL";

/// `VGPU_SIM_RECORD_STALL`'s value: `(every, ns)`, or `None` for anything but two
/// numbers with `every` at least 1 (`ns` capped at a second).
pub fn parse_record_stall(value: &str) -> Option<(u64, u64)> {
    let (every, ns) = value.split_once(':')?;
    let every = every
        .trim()
        .parse::<u64>()
        .ok()
        .filter(|every| *every > 0)?;
    let ns = ns.trim().parse::<u64>().ok()?.min(1_000_000_000);
    Some((every, ns))
}

/// Sleeps what `VGPU_SIM_RECORD_STALL` asks of this event record call, if anything.
pub fn stall_before_record() {
    static STALL: std::sync::OnceLock<Option<(u64, u64)>> = std::sync::OnceLock::new();
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let Some((every, ns)) = *STALL.get_or_init(|| {
        std::env::var(RECORD_STALL_ENV)
            .ok()
            .and_then(|value| parse_record_stall(&value))
    }) else {
        return;
    };
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
    if call.is_multiple_of(every) {
        std::thread::sleep(std::time::Duration::from_nanos(ns));
    }
}

/// Env: nanoseconds a kernel queued right after an event on its stream waits before it
/// starts; 0 by default. A real card sets a kernel up while the kernel before it on the
/// stream runs, but an event waits for the stream's work to finish before it fires, and
/// the kernel after it is set up only then: so two events around a kernel time its
/// set-up too, and in a loop of short kernels launched back to back (a decode step, a
/// launch benchmark) a bracketed kernel looks longer than what each kernel adds to the
/// card's busy time (H100, BENCHMARKS run 14: 4.46 us bracketed against launches 2.2 us
/// apart).
pub const KERNEL_AFTER_EVENT_ENV: &str = "VGPU_SIM_KERNEL_AFTER_EVENT_NS";

/// `VGPU_SIM_KERNEL_AFTER_EVENT_NS`, read once.
pub fn kernel_after_event_ns() -> u64 {
    static NS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *NS.get_or_init(|| env_ns(KERNEL_AFTER_EVENT_ENV))
}

/// Nanoseconds from the env var `name`: 0 unset or unreadable, at most a second.
fn env_ns(name: &str) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse::<u64>().ok())
        .unwrap_or(0)
        .min(1_000_000_000)
}

/// Env: nanoseconds between a launch or event record on an idle stream and the card
/// starting it; 0 by default. A real card fetches and sets up work submitted to an idle
/// stream before it runs, without being busy meanwhile, and overlaps that with the work
/// ahead on a busy stream: so a sample of a kernel launched into an idle stream times
/// the latency too (from the launch call's return to the end event; about 3.8 us for an
/// empty kernel on an H100, BENCHMARKS run 17), though the card's busy time is the
/// kernel's alone. Kernels right after an event on an idle stream wait the longer of
/// this and `VGPU_SIM_KERNEL_AFTER_EVENT_NS`.
pub const IDLE_SUBMIT_ENV: &str = "VGPU_SIM_IDLE_SUBMIT_NS";

/// `VGPU_SIM_IDLE_SUBMIT_NS`, read once.
pub fn idle_submit_ns() -> u64 {
    static NS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *NS.get_or_init(|| env_ns(IDLE_SUBMIT_ENV))
}

/// How long a kernel of `blocks` blocks takes on a card of `card_sms` SMs whose name
/// says `duration_ns`: per wave of blocks under `VGPU_SIM_WAVES=1`, else the name's.
pub fn kernel_duration(duration_ns: u64, blocks: u64, card_sms: u32) -> u64 {
    static WAVES: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *WAVES.get_or_init(|| std::env::var(WAVES_ENV).is_ok_and(|value| value == "1")) {
        duration_ns.saturating_mul(blocks.div_ceil(card_sms.max(1) as u64).max(1))
    } else {
        duration_ns
    }
}

/// Places a kernel of `duration_ns` needing `sms` of `card_sms` SMs, ready at `ready_ns`,
/// for the process holding `slot` on `device`, whose own SM schedule is `schedule`;
/// returns its start.
///
/// The card takes turns between processes: a kernel joins its process's current turn
/// when that turn is still going when the kernel is ready and the kernel starts before
/// another process's turn that was queued after it begins (it may run into that turn
/// by less than its own length, as a real time slice runs on past a kernel boundary);
/// otherwise it starts a new turn once every other process's queued kernels have run.
/// So a process's concurrent streams overlap within its turn, and processes alternate in
/// the order they queued, as a card without MPS time-slices contexts. Another process's
/// turn counts only while its kernels run (`SharedState::others_turns`). Under
/// `VGPU_SIM_MPS=1`: the process's own schedule only.
///
/// Known limit: turns are a kernel long, not a time slice, and while another process's
/// work is queued a stream that runs ahead of its process's others begins a new turn
/// with each kernel, which the others' next kernels then wait for: busy processes of
/// several streams each run them nearly one after the other (one container's two
/// processes of four streams: about 5 % of their bare throughput each, where the H200
/// gave them their share, BENCHMARKS run 11). Letting a kernel that starts where its
/// process's work ends continue the turn fixes that, but then every sample of such a
/// process times the other's kernels too and the limiter charges it for them (the card
/// 18 % busy for a limit of 30): a model of time slices is what would judge that.
#[allow(clippy::too_many_arguments)]
pub fn place_on_card(
    state: &SharedState,
    slot: SlotIndex,
    device: usize,
    schedule: &mut SmSchedule,
    ready_ns: u64,
    duration_ns: u64,
    sms: u32,
    card_sms: u32,
    now_ns: u64,
) -> u64 {
    if side_by_side() || duration_ns == 0 {
        return schedule.place(ready_ns, duration_ns, sms, card_sms, now_ns);
    }
    let others = state.others_turns(slot, device, now_ns);
    let (turn_start, turn_end) = state.own_turn(slot, device);
    if others.is_empty() {
        // The card is the process's alone: its own schedule decides.
        let start = schedule.place(ready_ns, duration_ns, sms, card_sms, now_ns);
        if ready_ns >= turn_end {
            state.begin_turn(slot, device, start);
        }
        return start;
    }
    if ready_ns < turn_end {
        let next_turn = others
            .iter()
            .map(|&(start, _)| start)
            .filter(|start| *start >= turn_start)
            .min();
        // Not before its turn (other processes' kernels ran until then).
        let at = ready_ns.max(turn_start);
        let start = schedule.earliest(at, duration_ns, sms, card_sms, now_ns);
        if next_turn.is_none_or(|next| start < next) {
            return schedule.place(at, duration_ns, sms, card_sms, now_ns);
        }
    }
    let others_done = others.iter().map(|&(_, end)| end).max().unwrap_or(0);
    let start = schedule.place(
        ready_ns.max(others_done),
        duration_ns,
        sms,
        card_sms,
        now_ns,
    );
    state.begin_turn(slot, device, start);
    start
}

/// Env: set to `0` for events that fire at their record whatever runs on the card
/// (the sim's behaviour before it modelled [`event_on_card`]).
pub const EVENT_TURNS_ENV: &str = "VGPU_SIM_EVENT_TURNS";

/// Whether events wait for their process's turn (unless `VGPU_SIM_EVENT_TURNS=0`), read
/// once.
fn events_wait_for_turns() -> bool {
    static TURNS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *TURNS.get_or_init(|| std::env::var(EVENT_TURNS_ENV).map_or(true, |value| value != "0"))
}

/// When an event recorded at `at_ns` on a stream of `slot`'s with nothing queued before
/// it fires on a time-sliced card: at once within the process's own turn, else, like a
/// kernel of the process arriving then (`place_on_card`), once the other processes'
/// queued work is done. `VGPU_SIM_EVENT_TURNS=0` fires every event at its record; under
/// `VGPU_SIM_MPS=1` events never wait for another process.
///
/// Which is the H200's behaviour is measured, and it is not this model's: an event on an
/// idle stream fired within microseconds while another process kept the card busy
/// (BENCHMARKS run 12, `event_turns.py`: p50 15.6 us beside, 17.1 alone, none of 200 over
/// 200 us), and one container's two processes are charged right there only by a union
/// of their kernels' intervals (which therefore span the other's slices). The model
/// stays the default because the sim's turns are a kernel long, not a time slice: with
/// events at their record, a hard container's 1 ms kernels beside an unlimited one are
/// timed with the neighbour's whole kernels and it gets 7-14 % of the card for 30-60
/// (the H200: 30.3 / 40.3 / 48.5 on the same spin kernels), while with this model the
/// neighbour tests give the H200's figures. Tests that judge what a process's own events
/// time across another process's work set `VGPU_SIM_EVENT_TURNS=0`; only a model of time
/// slices would serve both.
pub fn event_on_card(state: &SharedState, slot: SlotIndex, device: usize, at_ns: u64) -> u64 {
    if side_by_side() || !events_wait_for_turns() {
        return at_ns;
    }
    let (own_start, own_end) = state.own_turn(slot, device);
    if own_start <= at_ns && at_ns < own_end {
        return at_ns;
    }
    let others_done = state
        .others_turns(slot, device, at_ns)
        .iter()
        .map(|&(_, end)| end)
        .max()
        .unwrap_or(0);
    at_ns.max(others_done)
}

/// The kernels of one device that have not finished yet.
#[derive(Debug, Default)]
pub struct SmSchedule {
    placed: Vec<Placed>,
}

#[derive(Clone, Copy, Debug)]
struct Placed {
    start: u64,
    end: u64,
    sms: u32,
}

/// Beyond this many unfinished kernels a new one is simply queued after all of them
/// (the exact search is quadratic in their number).
const MAX_TRACKED: usize = 1024;

impl SmSchedule {
    /// Places a kernel of `duration_ns` that needs `sms` of the card's `card_sms` SMs and
    /// may start at `ready_ns` (its stream's turn) at the earliest; returns its start.
    pub fn place(
        &mut self,
        ready_ns: u64,
        duration_ns: u64,
        sms: u32,
        card_sms: u32,
        now_ns: u64,
    ) -> u64 {
        if duration_ns == 0 {
            return ready_ns;
        }
        let start = self.earliest(ready_ns, duration_ns, sms, card_sms, now_ns);
        let want = sms.clamp(1, card_sms.max(1));
        self.placed.push(Placed {
            start,
            end: start.saturating_add(duration_ns),
            sms: want,
        });
        start
    }

    /// Where [`SmSchedule::place`] would start the kernel, without placing it.
    pub fn earliest(
        &mut self,
        ready_ns: u64,
        duration_ns: u64,
        sms: u32,
        card_sms: u32,
        now_ns: u64,
    ) -> u64 {
        self.placed.retain(|kernel| kernel.end > now_ns);
        let card_sms = card_sms.max(1);
        if duration_ns == 0 {
            ready_ns
        } else if self.placed.len() >= MAX_TRACKED {
            self.queued_end().max(ready_ns)
        } else {
            self.earliest_fit(ready_ns, duration_ns, sms.clamp(1, card_sms), card_sms)
        }
    }

    fn queued_end(&self) -> u64 {
        self.placed
            .iter()
            .map(|kernel| kernel.end)
            .max()
            .unwrap_or(0)
    }

    /// The earliest time from `ready` at which `want` SMs stay free for `duration`: the
    /// answer is `ready` or the end of some placed kernel, and within a window the use
    /// is highest at its start or where a placed kernel starts.
    fn earliest_fit(&self, ready: u64, duration: u64, want: u32, card_sms: u32) -> u64 {
        let mut candidates: Vec<u64> = std::iter::once(ready)
            .chain(
                self.placed
                    .iter()
                    .map(|kernel| kernel.end)
                    .filter(|end| *end > ready),
            )
            .collect();
        candidates.sort_unstable();
        for &start in &candidates {
            let end = start.saturating_add(duration);
            let fits = std::iter::once(start)
                .chain(
                    self.placed
                        .iter()
                        .map(|kernel| kernel.start)
                        .filter(|at| *at > start && *at < end),
                )
                .all(|at| self.used_at(at) + want <= card_sms);
            if fits {
                return start;
            }
        }
        // Unreachable (after the last end nothing is in use), kept total.
        candidates.last().copied().unwrap_or(ready)
    }

    fn used_at(&self, at: u64) -> u32 {
        self.placed
            .iter()
            .filter(|kernel| kernel.start <= at && at < kernel.end)
            .map(|kernel| kernel.sms)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_stall_is_two_numbers_and_anything_else_stalls_nothing() {
        assert_eq!(parse_record_stall("13:500000"), Some((13, 500_000)));
        assert_eq!(parse_record_stall(" 2 : 7 "), Some((2, 7)));
        assert_eq!(
            parse_record_stall("1:99999999999"),
            Some((1, 1_000_000_000))
        );
        for bad in ["", "13", "0:500", ":500", "13:", "x:5", "13:-5", "13:5:6"] {
            assert_eq!(parse_record_stall(bad), None, "{bad:?}");
        }
    }

    /// Two processes, four streams each of quarter-card kernels, queued in turn as two
    /// busy programs would: each process's four run side by side within its turn, the
    /// processes alternate, and nothing of one overlaps the other.
    #[test]
    // Streams outside, processes inside (the order they queue): two indices into one table.
    #[allow(clippy::needless_range_loop)]
    fn processes_take_turns_and_their_streams_overlap_within_a_turn() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = SharedState::open(&dir.path().join("state")).expect("state");
        let me = vgpu_contract::process::current();
        let slots = [0u64, 1].map(|n| {
            state
                .claim(me.pid, me.start_time, me.pid_ns + n)
                .expect("slot")
        });
        let mut schedules = [SmSchedule::default(), SmSchedule::default()];
        // Per process and stream: where its queued work ends.
        let mut streams = [[0u64; 4]; 2];
        let mut runs: Vec<(usize, u64, u64)> = Vec::new();
        let base = 1_000_000;
        for _round in 0..3 {
            for stream in 0..4 {
                for process in 0..2 {
                    let ready = streams[process][stream].max(base);
                    let start = place_on_card(
                        &state,
                        slots[process],
                        0,
                        &mut schedules[process],
                        ready,
                        100,
                        33,
                        132,
                        base,
                    );
                    streams[process][stream] = start + 100;
                    state.record_busy(slots[process], 0, start, start + 100, base);
                    runs.push((process, start, start + 100));
                }
            }
        }
        for &(process, start, end) in &runs {
            for &(other, other_start, other_end) in &runs {
                assert!(
                    process == other || end <= other_start || other_end <= start,
                    "{runs:?}"
                );
            }
        }
        let starts = |process: usize| {
            let mut starts: Vec<u64> = runs
                .iter()
                .filter(|run| run.0 == process)
                .map(|run| run.1 - base)
                .collect();
            starts.sort_unstable();
            starts
        };
        assert_eq!(
            starts(0),
            [0, 0, 0, 0, 200, 200, 200, 200, 400, 400, 400, 400]
        );
        assert_eq!(
            starts(1),
            [100, 100, 100, 100, 300, 300, 300, 300, 500, 500, 500, 500]
        );
    }

    /// A live neighbour whose turn ended before now (an idle process, or a killed one
    /// whose slot is not reclaimed yet) holds nothing: a process's streams overlap as on
    /// a card of its own. Before, any other live slot's turn, however old, put the
    /// process on the shared path, where each kernel of the stream ahead began a new
    /// turn and the other stream's kernels waited for it: two streams ran one after the
    /// other (the GPU suite's limiter script over the sim gave 4 streams at 30 7-14 % of
    /// bare, in a state file holding slots of processes killed earlier).
    #[test]
    fn a_neighbour_whose_turn_ended_does_not_serialize_a_process_s_streams() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = SharedState::open(&dir.path().join("state")).expect("state");
        let me = vgpu_contract::process::current();
        let [mine, theirs] = [0u64, 1].map(|n| {
            state
                .claim(me.pid, me.start_time, me.pid_ns + n)
                .expect("slot")
        });
        // The neighbour's one turn, a full-card kernel over [1000, 2000), long ago.
        let start = place_on_card(
            &state,
            theirs,
            0,
            &mut SmSchedule::default(),
            1_000,
            1_000,
            132,
            132,
            1_000,
        );
        state.record_busy(theirs, 0, start, start + 1_000, 1_000);
        // Now two streams of quarter-card kernels of 100 ns, the first running ahead (its
        // thread queued all four before the other's woke).
        let base = 1_000_000;
        let mut schedule = SmSchedule::default();
        let starts = [0, 1].map(|_| {
            let mut ready = base;
            (0..4)
                .map(|_| {
                    let start =
                        place_on_card(&state, mine, 0, &mut schedule, ready, 100, 33, 132, base);
                    state.record_busy(mine, 0, start, start + 100, base);
                    ready = start + 100;
                    start - base
                })
                .collect::<Vec<u64>>()
        });
        assert_eq!(starts, [[0, 100, 200, 300], [0, 100, 200, 300]]);
    }

    #[test]
    fn kernels_that_fit_overlap_and_the_rest_wait_for_free_sms() {
        let mut card = SmSchedule::default();
        // Four quarter-card kernels fit at once.
        for _ in 0..4 {
            assert_eq!(card.place(1000, 100, 33, 132, 0), 1000);
        }
        // The next four wait for them.
        for _ in 0..4 {
            assert_eq!(card.place(1000, 100, 33, 132, 0), 1100);
        }
        // A full-card kernel waits for all of those.
        assert_eq!(card.place(1000, 50, 500, 132, 0), 1200);
        // A small one fits into no gap before that, and finished kernels are forgotten.
        assert_eq!(card.place(1000, 10, 1, 132, 0), 1250);
        assert_eq!(card.place(5000, 10, 132, 132, 2000), 5000);
        assert_eq!(card.placed.len(), 1);
    }

    #[test]
    fn a_kernel_only_starts_where_it_fits_for_its_whole_duration() {
        let mut card = SmSchedule::default();
        assert_eq!(card.place(0, 100, 100, 132, 0), 0);
        assert_eq!(card.place(50, 100, 100, 132, 0), 100);
        // 32 SMs are free over [0, 100) but a 200-long kernel would meet the one at 100.
        assert_eq!(card.place(0, 200, 40, 132, 0), 200);
        assert_eq!(card.place(0, 100, 32, 132, 0), 0);
        assert_eq!(
            card.place(7, 0, 132, 132, 0),
            7,
            "zero-length work needs no SMs"
        );
    }
}
