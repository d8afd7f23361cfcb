//! The thread's tab: a run of launches of one known short kernel on one stream, made on
//! busy time the thread borrowed from the container's bucket when the tab opened, and
//! paid in one go when it closes. A launch the tab covers touches two lines of data: the
//! thread's tab (one line, reached without a destructor's state byte) and the switches
//! (the clock, and `lifecycle::sole_device`, which stands for the device and capture
//! checks where the process has one limited device). No atomic read-modify-write, no
//! line of the limiter, the region, the cost table or the stream table, which the real
//! driver's launch evicts between two launches (`super::fast`: those lines were what a
//! limited launch cost on a card).
//!
//! A tab opens after a fast-path launch that repeats the thread's last launch (the same
//! kernel on the same stream: a closed tab remembers it) of a kernel whose cost is known and below
//! `MOST_COST_NS`, in a process whose kernels have not overlapped lately (one stream at
//! a time: its launches' union is its stream's projection), when the bucket can lend
//! `CREDIT_NS` of busy time (scaled by the host's factor) without going into debt. It
//! covers the thread's next launches of that kernel on that stream until the earliest
//! of `TAB_NS` after it opened, the device's next sample and its next publish tick, or
//! until the busy time its launches add would pass the credit. Each covered launch is
//! projected on the tab's own copy of its stream (`ran`), as the stream table would
//! have placed it.
//!
//! Paying it (at the thread's next launch the tab does not cover) does what the covered
//! launches skipped: the stream's projection and the container's union move to the
//! tab's end, the bucket gets back the credit the launches did not use, the process's
//! busy time and launch count and the kernel's launches since its last sample are
//! added. A tab does not see work another thread or process queues meanwhile (nor they
//! its launches, until it is paid): its launches are charged in full, as if nothing
//! overlapped them, so concurrent work is charged twice for at most one tab's credit;
//! the next launch placed per launch that starts before the other work's end marks the
//! process as overlapping, and it opens no tab for a while. (Paying cannot tell
//! overlapping work from work queued after the tab's, as a thread that takes over from
//! one that exits queues it.)
//!
//! What it costs: a thread that stops launching keeps its whole credit charged (at most
//! `CREDIT_NS` a thread, never less than its launches used) and its stream's projection
//! behind, until its next launch or its exit (the tab is paid when the thread's
//! storage is dropped). A tab opened in a parent is dropped, not paid, in a forked
//! child (its limiter is another), and the child's launches on it before its own
//! limiter is built go uncharged (at most the credit). `VGPU_LIMITER_TABS=off` keeps
//! every launch on the per-launch fast path.

use std::cell::Cell;
use std::sync::atomic::Ordering;

use super::fast::is_capturing;
use super::lifecycle::{SWITCHES, built, sole_device_address};
use super::trace::{self, Counter};
use super::{DeviceLimiter, LEGACY_KEY, Target, current_limited, duty};
use crate::cuda::*;
use crate::hooks::capture;

/// The env var that turns tabs off (`off`).
pub const TABS_ENV: &str = "VGPU_LIMITER_TABS";

/// The longest a tab stays open, wall time.
const TAB_NS: u64 = 1_000_000;
/// The busy time a tab borrows from the bucket when it opens (before the host's factor).
const CREDIT_NS: u64 = 500_000;
/// Kernels estimated at this or more take no tab: their launches are few, and what the
/// per-launch path costs is small beside them.
const MOST_COST_NS: u64 = 50_000;

/// One thread's tab. `device == 0`: closed. `repr(C)` in one cache line: a covered
/// launch reads and writes nothing else of it (`a_tab_is_one_cache_line`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C, align(64))]
struct Tab {
    /// The address of its `DeviceLimiter` (compared, never dereferenced: a limiter is
    /// leaked, never freed, so no other one ever has it; a tab finds its limiter again
    /// by it when it is paid).
    device: usize,
    kernel: u64,
    stream: u64,
    /// The first launch at or after this time closes the tab.
    until_ns: u64,
    /// The stream's projected end, as the tab's launches left it.
    busy_until_ns: u64,
    /// The union's end after the launch that opened the tab (on the legacy stream,
    /// which waits for all the context's work, launches start no earlier).
    horizon_ns: u64,
    cost_ns: u32,
    /// Busy time the tab's launches added (before the host's factor; at most
    /// `CREDIT_NS`, which fits).
    added_ns: u32,
    /// The host's factor when it opened, per mille (at most
    /// `cardview::CHARGE_MAX_PERMILLE`, which fits).
    permille: u32,
    /// The set-up a launch behind the tab's last is not charged (`super::pair`; at most
    /// `duty::SETUP_MOST_NS`, which fits).
    setup_ns: u16,
    launches: u16,
}

impl Tab {
    const CLOSED: Tab = Tab {
        device: 0,
        kernel: 0,
        stream: 0,
        until_ns: 0,
        busy_until_ns: 0,
        horizon_ns: 0,
        cost_ns: 0,
        added_ns: 0,
        permille: 0,
        setup_ns: 0,
        launches: 0,
    };

    fn is_open(&self) -> bool {
        self.device != 0
    }

    /// A closed tab that remembers the thread's last launch: its kernel and stream.
    const fn after(kernel: u64, stream: u64) -> Tab {
        Tab {
            kernel,
            stream,
            ..Tab::CLOSED
        }
    }

    /// Whether a launch of `kernel` on `stream` goes on this tab: its kernel, its stream,
    /// and credit left for the most it can add. (Time and device are checked after the
    /// launch, see [`run`].)
    #[inline]
    fn covers(&self, kernel: u64, stream: u64) -> bool {
        self.kernel == kernel
            && self.stream == stream
            && u64::from(self.added_ns) + u64::from(self.cost_ns) <= CREDIT_NS
    }

    /// Projects one covered launch at `now_ns` on the tab's stream and adds what it adds
    /// to the union.
    #[inline]
    fn ran(&mut self, now_ns: u64) {
        let floor = if self.stream == LEGACY_KEY {
            self.horizon_ns
        } else {
            0
        };
        let start = now_ns.max(self.busy_until_ns).max(floor);
        let cost = duty::placed_cost(
            start,
            now_ns,
            u64::from(self.cost_ns),
            u64::from(self.setup_ns),
        );
        let end = start.saturating_add(cost);
        let horizon = self.horizon_ns.max(self.busy_until_ns);
        let added = u64::from(self.added_ns) + duty::union_increment(start, end, horizon);
        // Within the credit (`covers`): at most `CREDIT_NS`, which fits.
        self.added_ns = added.min(CREDIT_NS) as u32;
        self.busy_until_ns = end;
        // A tab lasts 1 ms of launches that each take microseconds: never saturates.
        self.launches = self.launches.saturating_add(1);
    }
}

thread_local! {
    /// The thread's tab. No destructor of its own, so reaching it is an address and no
    /// state byte (`PaidAtExit` pays it when the thread exits).
    static TAB: Cell<Tab> = const { Cell::new(Tab::CLOSED) };
    /// Set up the first time the thread opens a tab: pays it when the thread exits (a
    /// thread that stops launching otherwise keeps its credit charged until its next
    /// launch).
    static PAID_AT_EXIT: PaidAtExit = const { PaidAtExit };
}

/// Pays the thread's open tab when the thread's storage is torn down.
struct PaidAtExit;

impl Drop for PaidAtExit {
    fn drop(&mut self) {
        // `TAB` has no destructor: it is still there while this one runs.
        let tab = TAB.with(|cell| cell.replace(Tab::CLOSED));
        if tab.is_open() {
            pay(&tab, SWITCHES.clock.now_ns());
        }
    }
}

/// Runs `launch` on the calling thread's tab if the tab covers a launch of `kernel` on
/// `stream` (`Ok`: the real launch's result); otherwise pays the tab, if one is
/// open, and gives `launch` back for the per-launch path.
///
/// Before the real launch the tab's line is read, and the clock (on the switches' line,
/// which the hook has just read): the launch is projected from when its call began, as
/// the per-launch path projects it, and the launch that finds the tab's time up is its
/// last. The first counter read after a real launch cost a limited launch a point or
/// more on an H100 where a read before it costs nothing measurable (BENCHMARKS run 25).
/// Everything else a launch must know is asked after it, where the CPU overlaps it with
/// the driver's work (the limiter's work moved after the launch cost 1.008-1.024x on an
/// H100, before it 1.05-1.10x: BENCHMARKS run 14): whether the launch went to the tab's
/// limiter, in one word of the switches' line (`lifecycle::sole_device`: the process's
/// one limited device, while no capture may be under way). Where that word cannot say
/// (several devices, a capture, a forked child before its limiter is built),
/// [`still_on_its_device`] asks the way the per-launch path does.
#[inline]
pub(super) fn run<F: FnOnce() -> CUresult>(
    kernel: u64,
    target: Target,
    stream: u64,
    started: u64,
    launch: F,
) -> Result<CUresult, F> {
    let mut launch = Some(launch);
    let ran = TAB.with(|cell| on_tab(cell, kernel, target, stream, started, &mut launch));
    match (ran, launch) {
        (Some(result), _) => Ok(result),
        (None, Some(launch)) => Err(launch),
        // Not reached: the tab takes the launch only to run it.
        (None, None) => Ok(CUDA_ERROR_UNKNOWN),
    }
}

/// [`run`] on the thread's tab `cell`: `Some` with the result when it ran the launch
/// (taking it out of `launch`).
#[inline]
fn on_tab<F: FnOnce() -> CUresult>(
    cell: &Cell<Tab>,
    kernel: u64,
    target: Target,
    stream: u64,
    started: u64,
    launch: &mut Option<F>,
) -> Option<CUresult> {
    let mut tab = cell.get();
    if !tab.is_open() {
        return None;
    }
    if !tab.covers(kernel, stream) {
        close(cell, &tab, Tab::after(tab.kernel, tab.stream), None);
        return None;
    }
    let launch = launch.take()?;
    let now_ns = SWITCHES.clock.now_ns();
    let launching = trace::ticks();
    let result = launch();
    let launched = trace::ticks();
    if result != CUDA_SUCCESS {
        return Some(result);
    }
    if sole_device_address() != tab.device && !still_on_its_device(cell, &tab, target, now_ns) {
        return Some(result);
    }
    tab.ran(now_ns);
    if now_ns >= tab.until_ns {
        close(cell, &tab, Tab::after(kernel, stream), Some(now_ns));
    } else {
        cell.set(tab);
    }
    if trace::on() {
        trace::count(Counter::Launches);
        trace::count(Counter::FastPath);
        trace::count(Counter::Tabbed);
        trace::own(started, launching, launched);
    }
    Some(result)
}

/// Whether a covered launch that `lifecycle::sole_device` could not vouch for went to
/// `tab`'s limiter and ran (asked as the per-launch path asks: the current device, and
/// the stream's capture while one may be under way). A launch that went elsewhere (a
/// forked child's, another device's) closes the tab, paid if its limiter is still this
/// process's; a captured one ran nothing and leaves the tab as it was.
#[cold]
#[inline(never)]
fn still_on_its_device(cell: &Cell<Tab>, tab: &Tab, target: Target, now_ns: u64) -> bool {
    if current_limited().is_none_or(|device| address(device) != tab.device) {
        close(cell, tab, Tab::after(tab.kernel, tab.stream), Some(now_ns));
        trace::count(Counter::NoDevice);
        return false;
    }
    if capture::possible() && is_capturing(target) {
        trace::count(Counter::Captured);
        return false;
    }
    true
}

/// Closes the thread's tab `tab`, leaving `after` (what it remembers) in `cell`, and
/// pays it at `now_ns` (the clock's, when not given).
#[cold]
#[inline(never)]
fn close(cell: &Cell<Tab>, tab: &Tab, after: Tab, now_ns: Option<u64>) {
    cell.set(after);
    pay(tab, now_ns.unwrap_or_else(|| SWITCHES.clock.now_ns()));
}

/// Whether a launch of `kernel` on `stream` repeats the thread's last launch, as the
/// thread's closed tab `cell` remembers it; remembers this one. A tab serves a run of
/// one kernel: opened for a launch that the next does not repeat, it would borrow and
/// pay for nothing (a decode step's kernels take turns: on an H100, run 17, 172624 tabs
/// opened for 0 launches on them, and a launch's own work was 432 ns against 166 in a
/// one-kernel loop).
fn repeats(cell: &Cell<Tab>, kernel: u64, stream: u64) -> bool {
    let last = cell.get();
    let repeat = !last.is_open() && last.kernel == kernel && last.stream == stream;
    if !repeat && !last.is_open() {
        cell.set(Tab::after(kernel, stream));
    }
    repeat
}

fn address(device: &DeviceLimiter) -> usize {
    device as *const DeviceLimiter as usize
}

/// Pays `tab` into its device's limiter, if that is still one of this process's (a
/// tab inherited through fork is dropped: the child's limiters are others).
fn pay(tab: &Tab, now_ns: u64) {
    let Some(device) = built().and_then(|limiter| {
        limiter
            .devices
            .iter()
            .find(|device| address(device) == tab.device)
    }) else {
        return;
    };
    device.pay_tab(tab, now_ns);
}

impl DeviceLimiter {
    /// Opens a tab on the calling thread after a fast-path launch of `kernel` (`cost_ns`)
    /// on `stream` at `now_ns`, charged as `charged` says (`DeviceLimiter::charge`: its
    /// projected start, and the union's end before it); see the module's header for when.
    pub(super) fn open_tab(
        &self,
        kernel: u64,
        stream: u64,
        cost_ns: u64,
        (start_ns, horizon_before): (u64, u64),
        now_ns: u64,
        rate: u64,
    ) {
        if !self.tabs
            || !TAB.with(|cell| repeats(cell, kernel, stream))
            || cost_ns == 0
            || cost_ns >= MOST_COST_NS
            || self.overlapped_lately(now_ns)
        {
            return;
        }
        let until_ns = now_ns
            .saturating_add(TAB_NS)
            .min(self.next_sample_ns.load(Ordering::Relaxed))
            .min(self.next_publish_ns.load(Ordering::Relaxed));
        // A thread whose storage is being torn down opens none: nothing would pay it.
        if until_ns <= now_ns || PAID_AT_EXIT.try_with(|_| ()).is_err() {
            return;
        }
        let permille = self.charge_permille.load(Ordering::Relaxed);
        if !self
            .shared
            .borrow(scaled(CREDIT_NS, permille), now_ns, rate)
        {
            return;
        }
        let setup_ns = self.setup_ns();
        let (busy_until_ns, horizon_ns) =
            opening_projection(start_ns, now_ns, cost_ns, setup_ns, horizon_before);
        TAB.with(|cell| {
            cell.set(Tab {
                device: address(self),
                kernel,
                stream,
                until_ns,
                busy_until_ns,
                horizon_ns,
                // Below `MOST_COST_NS`, which fits.
                cost_ns: cost_ns as u32,
                added_ns: 0,
                // Within `cardview::CHARGE_MAX_PERMILLE`, which fits.
                permille: permille.min(u64::from(u32::MAX)) as u32,
                setup_ns: setup_ns.min(u64::from(u16::MAX)) as u16,
                launches: 0,
            })
        });
        trace::count(Counter::TabsOpened);
    }

    /// Does what `tab`'s launches skipped (see the module's header).
    fn pay_tab(&self, tab: &Tab, now_ns: u64) {
        self.streams.extend(tab.stream, tab.busy_until_ns);
        self.shared
            .extend(tab.busy_until_ns, tab.busy_until_ns, now_ns);
        let used = u64::from(tab.added_ns);
        let permille = u64::from(tab.permille);
        let used_scaled = scaled(used, permille);
        self.shared.charge(
            used_scaled - scaled(CREDIT_NS, permille),
            now_ns,
            self.rate(),
        );
        trace::add(Counter::ChargedNs, used);
        trace::add(Counter::ChargedScaledNs, used_scaled as u64);
        if tab.launches > 0 {
            let launches = u64::from(tab.launches);
            self.add_unpublished(used, launches);
            self.estimates.count_launches(tab.kernel, launches);
            if trace::on() {
                self.traced.count(&self.estimates, tab.kernel, launches);
                self.traced.charge(&self.estimates, tab.kernel, used as i64);
            }
            self.stamp_active(now_ns);
        }
    }
}

/// `ns` of busy time as the bucket is charged it under the factor `permille`.
fn scaled(ns: u64, permille: u64) -> i64 {
    duty::scale_permille(ns.min(i64::MAX as u64) as i64, permille)
}

/// Where the launch that opens a tab ends on its stream and the union's horizon after
/// it: placed as the table placed it (`duty::placed_cost`, so a launch behind queued
/// work ends its set-up sooner), so the tab's next launch starts where the table's
/// projection would have had it.
fn opening_projection(
    start_ns: u64,
    now_ns: u64,
    cost_ns: u64,
    setup_ns: u64,
    horizon_before: u64,
) -> (u64, u64) {
    let busy_until_ns =
        start_ns.saturating_add(duty::placed_cost(start_ns, now_ns, cost_ns, setup_ns));
    (busy_until_ns, horizon_before.max(busy_until_ns))
}

/// Whether `VGPU_LIMITER_TABS` leaves tabs on (anything but `off`).
pub(super) fn allowed() -> bool {
    std::env::var_os(TABS_ENV).is_none_or(|value| value != "off")
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: u64 = 1_000;

    fn open_at(now: u64, cost: u64) -> Tab {
        Tab {
            device: 0x1000,
            kernel: 7,
            stream: 9,
            cost_ns: cost as u32,
            until_ns: now + TAB_NS,
            horizon_ns: now + cost,
            busy_until_ns: now + cost,
            permille: 1000,
            ..Tab::CLOSED
        }
    }

    #[test]
    fn a_tab_is_one_cache_line() {
        // A covered launch copies the whole tab in and out (`Cell::get`, `Cell::set`).
        assert_eq!(align_of::<Tab>(), 64);
        assert_eq!(size_of::<Tab>(), 64);
    }

    #[test]
    fn a_tab_opens_only_for_a_launch_that_repeats_the_threads_last() {
        let cell = Cell::new(Tab::CLOSED);
        assert!(!repeats(&cell, 7, 9), "the thread's first launch");
        assert!(repeats(&cell, 7, 9), "the same kernel on the same stream");
        // Kernels that take turns never repeat.
        for kernel in [8, 7, 8, 7] {
            assert!(!repeats(&cell, kernel, 9));
        }
        assert!(!repeats(&cell, 7, 10), "another stream");
        assert!(repeats(&cell, 7, 10));
        // A tab that closes remembers its launches' kernel, so a run reopens at once.
        cell.set(Tab::after(7, 9));
        assert!(repeats(&cell, 7, 9));
        // An open tab is never overwritten.
        let open = open_at(1_000_000 * US, 4 * US);
        cell.set(open);
        assert!(!repeats(&cell, 1, 2));
        assert_eq!(cell.get(), open);
    }

    #[test]
    fn a_tab_covers_only_its_kernel_and_stream() {
        let now = 1_000_000 * US;
        let tab = open_at(now, 4 * US);
        assert!(tab.covers(7, 9));
        assert!(!tab.covers(8, 9), "another kernel");
        assert!(!tab.covers(7, 10), "another stream");
        assert!(tab.is_open() && !Tab::CLOSED.is_open());
    }

    #[test]
    fn launches_behind_each_other_add_their_cost_and_an_idle_gap_adds_nothing() {
        let now = 1_000_000 * US;
        let mut tab = open_at(now, 4 * US);
        // Launched every 2 us, each 4 us long: they queue, and each adds its 4 us.
        for step in 1..=10 {
            tab.ran(now + step * 2 * US);
        }
        assert_eq!(u64::from(tab.added_ns), 40 * US);
        assert_eq!(tab.busy_until_ns, now + 44 * US);
        // The stream runs dry; the next launch starts when it comes.
        tab.ran(now + 100 * US);
        assert_eq!(u64::from(tab.added_ns), 44 * US);
        assert_eq!(tab.busy_until_ns, now + 104 * US);
        assert_eq!(tab.launches, 11);
    }

    #[test]
    fn launches_behind_the_tabs_last_are_charged_without_their_set_up() {
        let now = 1_000_000 * US;
        let mut tab = Tab {
            setup_ns: (2 * US) as u16,
            ..open_at(now, 4 * US)
        };
        // Every 1 us, 4 us estimates of which 2 us is the set-up hidden behind the last.
        for step in 1..=10 {
            tab.ran(now + step * US);
        }
        assert_eq!(u64::from(tab.added_ns), 20 * US);
        assert_eq!(tab.busy_until_ns, now + 24 * US);
        // On the idle stream, the whole estimate.
        tab.ran(now + 100 * US);
        assert_eq!(tab.busy_until_ns, now + 104 * US);
    }

    #[test]
    fn a_tab_opened_behind_queued_work_ends_its_first_launch_where_the_table_did() {
        let now = 1_000_000 * US;
        // Placed 10 us behind the stream's queued work, a 4 us estimate with 2 us of
        // set-up hidden: the table's projection ends it at +12 us, and so does the tab.
        let (busy_until, horizon) = opening_projection(now + 10 * US, now, 4 * US, 2 * US, 0);
        assert_eq!(busy_until, now + 12 * US);
        assert_eq!(horizon, now + 12 * US);
        // On an idle stream, the whole estimate; a later horizon stands.
        let (busy_until, horizon) = opening_projection(now, now, 4 * US, 2 * US, now + 50 * US);
        assert_eq!((busy_until, horizon), (now + 4 * US, now + 50 * US));
    }

    #[test]
    fn a_tab_stops_covering_before_its_launches_pass_the_credit() {
        let now = 1_000_000 * US;
        let mut tab = open_at(now, 40 * US);
        let mut covered = 0;
        while tab.covers(7, 9) {
            tab.ran(now + US);
            covered += 1;
        }
        assert_eq!(covered, CREDIT_NS / (40 * US));
        assert!(u64::from(tab.added_ns) <= CREDIT_NS);
    }

    #[test]
    fn a_legacy_stream_tab_starts_its_launches_behind_the_union() {
        let now = 1_000_000 * US;
        let behind = |stream| {
            let mut tab = Tab {
                stream,
                horizon_ns: now + 50 * US,
                ..open_at(now, 4 * US)
            };
            tab.ran(now + US);
            tab.busy_until_ns
        };
        assert_eq!(behind(LEGACY_KEY), now + 54 * US);
        assert_eq!(behind(9), now + 8 * US, "another stream does not wait");
    }
}
