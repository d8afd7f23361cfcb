//! Lifecycle: building the per-device limiters on first use (after `cuInit`, from the
//! enforcer's visible devices), rebuilding them in a forked child (`crate::fork_epoch`'s
//! generation moves on; no lock is held across fork), and standing down at exit
//! (`stand_down`, from the exit service `crate::exit`: nothing is throttled any more,
//! and `VGPU_LIMITER_TRACE` is written). The process-wide switches the fast path reads
//! (`SWITCHES`) live here.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering, fence,
};

use vgpu_contract::CoreMode;
use vgpu_contract::cardview;
use vgpu_contract::clock::monotonic_ns;

use super::fast_clock::FastClock;
use super::shared::Shared;
use super::tables::{Estimates, Streams, Traced};
use super::{DeviceLimiter, ESTIMATE_SLOTS, Limiter, STREAM_SLOTS, Slow, WINDOW_NS, duty, trace};
use crate::debug;
use crate::state::{Enforcer, Visible};

pub(super) const LIMITS_UNKNOWN: u8 = 0;
pub(super) const LIMITS_NONE: u8 = 1;
pub(super) const LIMITS_SOME: u8 = 2;
/// The process-wide switches every launch reads, on one cache line of their own (the
/// real driver's launch evicts the shim's lines between launches: one line, one miss).
#[repr(C, align(64))]
pub(super) struct Switches {
    /// Whether any visible device has a compute limit: the launch hooks' fast path is
    /// one load of this and a branch.
    pub limits: AtomicU8,
    /// The process is exiting: nothing is throttled any more.
    pub exiting: AtomicBool,
    /// `VGPU_LIMITER_TRACE` is on (`super::trace`): a launch asks several times, and
    /// here that costs no line of its own.
    pub tracing: AtomicBool,
    /// The limiter of the latest fork generation that built one (leaked, never freed).
    pub limiter: AtomicPtr<Limiter>,
    /// The device every launch goes to while nothing else must be asked (see
    /// [`sole_device`]); null otherwise.
    sole: AtomicPtr<DeviceLimiter>,
    /// The fast path's clock (`super::fast_clock`): its anchor is read on this line too.
    pub clock: FastClock,
}

pub(super) static SWITCHES: Switches = Switches {
    limits: AtomicU8::new(LIMITS_UNKNOWN),
    exiting: AtomicBool::new(false),
    tracing: AtomicBool::new(false),
    limiter: AtomicPtr::new(std::ptr::null_mut()),
    sole: AtomicPtr::new(std::ptr::null_mut()),
    clock: FastClock::new(),
};

/// The limited device every launch of this process goes to, when that needs no other
/// question: this fork generation's limiter is built with one device that the container
/// sees alone (`Limiter::only_device`), the process is not exiting, and no stream
/// capture may be under way (`hooks::capture::possible`). One load of the switches'
/// line, where [`super::current_limited`] reads the limiter, the fork generation and the
/// capture table (three more lines, each a likely miss after the real driver's launch).
/// `None` says only "ask": the process may still have a limited device.
#[inline]
pub(super) fn sole_device() -> Option<&'static DeviceLimiter> {
    // SAFETY: `sole` holds null or a device of a leaked, never-freed Limiter.
    unsafe { SWITCHES.sole.load(Ordering::Acquire).as_ref() }
}

/// [`sole_device`]'s address (0 for none): a tab compares it with its own.
#[inline]
pub(super) fn sole_device_address() -> usize {
    SWITCHES.sole.load(Ordering::Relaxed) as usize
}

/// Points [`sole_device`] at this generation's one limited device where nothing else
/// must be asked, else at nothing. Called where that may have changed for the better:
/// after the limiter is built, after a capture ends (`hooks::capture`), and at every
/// publish tick (which mends a race lost to a capture that began meanwhile within one
/// tick).
///
/// Whoever makes it wrong (a capture that begins, the exit, a fork) clears it after
/// changing its own state ([`clear_sole_device`]); this stores the device first and
/// then checks that state again behind a fence, so one of the two sees the other: the
/// word never stays set while a capture is under way or the process exits.
pub(crate) fn refresh_sole_device() {
    let wanted = built()
        .filter(|limiter| limiter.only_device)
        .and_then(|limiter| limiter.devices.first())
        .filter(|_| !blocks_sole_device());
    let Some(device) = wanted else {
        SWITCHES.sole.store(std::ptr::null_mut(), Ordering::SeqCst);
        return;
    };
    SWITCHES.sole.store(
        device as *const DeviceLimiter as *mut DeviceLimiter,
        Ordering::SeqCst,
    );
    fence(Ordering::SeqCst);
    if blocks_sole_device() {
        SWITCHES.sole.store(std::ptr::null_mut(), Ordering::SeqCst);
    }
}

/// Whether launches must ask more than [`sole_device`] says: the process exits, or a
/// capture may be under way.
fn blocks_sole_device() -> bool {
    SWITCHES.exiting.load(Ordering::SeqCst) || crate::hooks::capture::possible()
}

/// After a capture began (or the table lost track of one), the exit began, or in a
/// forked child: launches ask again (stores only: safe in a forked child).
pub(crate) fn clear_sole_device() {
    fence(Ordering::SeqCst);
    SWITCHES.sole.store(std::ptr::null_mut(), Ordering::SeqCst);
}

/// The limiter of this fork generation if it has been built (one load and a compare):
/// a launch that finds it needs not read the policy, which a built limiter implies (the
/// policy is fixed when the shim loads).
#[inline]
pub(super) fn built() -> Option<&'static Limiter> {
    let current = SWITCHES.limiter.load(Ordering::Acquire);
    // SAFETY: SWITCHES.limiter only holds leaked, never-freed Limiter boxes.
    let limiter = unsafe { current.as_ref() }?;
    (limiter.generation == crate::fork_epoch::generation()).then_some(limiter)
}

/// The limiter, built on first use (and again in a forked child); `None` when no
/// visible device has a compute limit.
#[inline]
pub(super) fn limiter(enforcer: &'static Enforcer) -> Option<&'static Limiter> {
    if let Some(limiter) = built() {
        return (!limiter.devices.is_empty()).then_some(limiter);
    }
    build(
        enforcer,
        crate::fork_epoch::generation(),
        SWITCHES.limiter.load(Ordering::Acquire),
    )
}

/// Builds the limiter of this generation and installs it, unless another thread did.
#[cold]
#[inline(never)]
fn build(
    enforcer: &'static Enforcer,
    generation: u64,
    current: *mut Limiter,
) -> Option<&'static Limiter> {
    // Before cuInit the devices are unknown: decide nothing yet.
    let visible = enforcer.devices()?;
    let devices = build_devices(enforcer, visible);
    let fresh = Box::into_raw(Box::new(Limiter {
        generation,
        only_device: visible.len() == 1 && devices.len() == 1,
        devices,
    }));
    register_handlers();
    let winner =
        match SWITCHES
            .limiter
            .compare_exchange(current, fresh, Ordering::AcqRel, Ordering::Acquire)
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
    SWITCHES.limits.store(
        if limiter.devices.is_empty() {
            LIMITS_NONE
        } else {
            LIMITS_SOME
        },
        Ordering::Relaxed,
    );
    refresh_sole_device();
    (!limiter.devices.is_empty()).then_some(limiter)
}

pub(super) fn build_devices(
    enforcer: &'static Enforcer,
    devices: &[Visible],
) -> Vec<DeviceLimiter> {
    let now = monotonic_ns();
    let slot = enforcer.slot();
    let tabs = super::tab::allowed();
    let pairs = super::pair::allowed();
    devices
        .iter()
        .filter_map(|visible| {
            let limit = visible.core_limit?;
            let soft = visible.core_mode == CoreMode::Soft;
            debug!(
                "compute limit {limit}% ({:?}) on {}",
                visible.core_mode, visible.uuid
            );
            // This process's own limiter words.
            let mine = slot.map(|slot| enforcer.region.slot_limiter(slot, visible.region_index));
            let shared = Shared::new(
                enforcer.region.container_limiter(visible.region_index),
                WINDOW_NS,
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
                tabs,
                pairs,
                region: &enforcer.region,
                shared,
                slot,
                mine,
                estimates: Estimates::new(ESTIMATE_SLOTS),
                streams: Streams::new(STREAM_SLOTS),
                next_publish_ns: AtomicU64::new(0),
                next_sample_ns: AtomicU64::new(0),
                concurrent_until_ns: AtomicU64::new(0),
                next_stamp_ns: AtomicU64::new(0),
                setup_ns: AtomicU64::new(0),
                pair_open: AtomicBool::new(false),
                unpublished: AtomicU64::new(0),
                given_back: AtomicU64::new(0),
                charge_permille: AtomicU64::new(cardview::CHARGE_UNIT),
                unknown_in_flight: AtomicUsize::new(0),
                agreeing_samples: AtomicU32::new(0),
                neighbours_active: AtomicBool::new(true),
                card_dir: enforcer.config.card_state_dir.clone(),
                container_id: enforcer.config.container_id.clone(),
                card_view: Mutex::new(None),
                slow: Mutex::new(Slow {
                    pending: VecDeque::new(),
                    pools: HashMap::new(),
                    clocks: HashMap::new(),
                    last_settle_ns: 0,
                    seen: HashMap::new(),
                    pair: None,
                    pair_next: false,
                    setups: VecDeque::new(),
                }),
                traced: Traced::new(ESTIMATE_SLOTS),
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
        FastClock::allow_where_the_kernel_keeps_time_with_it();
        crate::exit::register();
        crate::fork_epoch::register();
    });
}

/// At exit (called by the exit service, `crate::exit`, under its panic guard: the
/// trace formats and writes a file): nothing is throttled any more, and
/// `VGPU_LIMITER_TRACE` is written.
pub(crate) fn stand_down() {
    SWITCHES.exiting.store(true, Ordering::SeqCst);
    clear_sole_device();
    write_trace();
}

/// Writes `VGPU_LIMITER_TRACE` at exit, when it is on.
fn write_trace() {
    if !trace::on() {
        return;
    }
    // SAFETY: SWITCHES.limiter only holds leaked, never-freed Limiter boxes.
    let lines: Vec<String> = unsafe { SWITCHES.limiter.load(Ordering::Acquire).as_ref() }
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
    /// One line for the trace: the device, its limit and rate, the host's factor, what
    /// its tables and queue hold (without waiting for the lock), and the learned cost of
    /// its most-sampled kernels (`cost_ns/samples`, samples saturate at 255): against a
    /// kernel of known length, whether samples timed more than the kernel (a neighbour's
    /// slices, waits for SMs).
    pub(super) fn describe(&self) -> String {
        let pending = self
            .slow
            .try_lock()
            .map(|slow| slow.pending.len().to_string())
            .unwrap_or_else(|_| "busy".into());
        let known = self.estimates.best_known(ESTIMATE_SLOTS, &self.traced);
        let estimates: Vec<String> = known
            .iter()
            .take(4)
            .map(|k| format!("{}/{}", k.estimate.cost_ns, k.estimate.samples))
            .collect();
        // Every learned kernel on a line of its own
        // (`kernel COST SAMPLES LAUNCHES CHARGED CLASS NAME`).
        let kernels: String = known
            .iter()
            .map(|k| {
                format!(
                    "\nkernel {} {} {} {} {}",
                    k.estimate.cost_ns,
                    k.estimate.samples,
                    k.launches,
                    k.charged_ns,
                    trace::kernel_label(k.key)
                )
            })
            .collect();
        format!(
            "device {} limit_ppm {} rate_ppm {} charge_permille {} soft {} pending {pending} unknown_in_flight {} setup_ns {} estimates {}",
            self.visible.uuid,
            self.limit_ppm,
            self.rate(),
            self.charge_permille.load(Ordering::Relaxed),
            self.soft as u8,
            self.unknown_in_flight.load(Ordering::Relaxed),
            self.setup_ns.load(Ordering::Relaxed),
            estimates.join(","),
        ) + &kernels
    }
}
