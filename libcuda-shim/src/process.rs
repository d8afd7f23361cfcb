//! Per-process state and what fork and exit do to it: this process's [`Ledger`] (its
//! slot in the usage region and what is counted there), and what its reconciliation
//! with NVML and its lazily loaded code keep.
//!
//! The state is rebuilt in a forked child: the fork handler only bumps the fork epoch
//! (`crate::fork_epoch`, async-signal-safe), and the first hook call in the child builds fresh state
//! (attaching a slot of its own) instead of touching locks that a parent thread may
//! have held at the fork. At exit the slot is given back ([`give_back`], called by the
//! exit service, `crate::exit`).

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use vgpu_contract::process;
use vgpu_contract::region::SlotId;
use vgpu_shimgen::runtime;

use crate::fork_epoch;
use crate::ledger::Ledger;
use crate::state::{Enforcer, Policy, loaded};

/// State that belongs to one process (rebuilt after fork).
pub struct ProcessState {
    generation: u64,
    /// This process's memory account (its slot; `None` when allocations are refused).
    pub ledger: Ledger<'static>,
    /// This process's PID namespace (for matching NVML's process list).
    pub pid_ns: u64,
    /// Monotonic ns of the last reconciliation with NVML.
    pub last_sync_ns: AtomicU64,
    /// Functions, modules and globals already used once (lazy loading brings their code
    /// and data at the first use, which is settled with NVML; later uses are not).
    first_uses: Mutex<HashSet<usize>>,
}

impl ProcessState {
    /// Whether this is the first use of `handle` (a function, module or global) this
    /// process has seen; false for 0.
    pub fn first_use(&self, handle: usize) -> bool {
        handle != 0 && runtime::lock(&self.first_uses).insert(handle)
    }
}

static PROCESS: AtomicPtr<ProcessState> = AtomicPtr::new(std::ptr::null_mut());
/// One more than the fork generation whose process state a thread is building (0:
/// none). A value left by a parent's thread at fork names an older generation, so the
/// child never waits on it.
static BUILDING: AtomicU64 = AtomicU64::new(0);

/// Registers the fork epoch's handler and the exit service (once, when the shim loads).
pub fn register_handlers() {
    fork_epoch::register();
    crate::exit::register();
}

/// This process's state, built on first use in each process (after a fork as well).
#[inline]
pub fn process_state(enforcer: &'static Enforcer) -> &'static ProcessState {
    match current(fork_epoch::generation()) {
        Some(state) => state,
        None => first_use(enforcer),
    }
}

/// Builds this process's state (one thread per fork generation builds it; the others
/// wait for it).
#[cold]
fn first_use(enforcer: &'static Enforcer) -> &'static ProcessState {
    loop {
        let generation = fork_epoch::generation();
        if let Some(state) = current(generation) {
            return state;
        }
        // One builder per generation: two threads attaching at once would each claim a
        // slot (or take each other's), and one would count into a slot it lost.
        let building = BUILDING.load(Ordering::Acquire);
        if building == generation + 1
            || BUILDING
                .compare_exchange(
                    building,
                    generation + 1,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_err()
        {
            std::thread::yield_now();
            continue;
        }
        /// Lets the next builder in even if building panics (the hook's guard catches it).
        struct Built;
        impl Drop for Built {
            fn drop(&mut self) {
                BUILDING.store(0, Ordering::Release);
            }
        }
        let built = Built;
        let fresh: &'static ProcessState =
            Box::leak(Box::new(build_process_state(enforcer, generation)));
        PROCESS.store(std::ptr::from_ref(fresh).cast_mut(), Ordering::Release);
        drop(built);
        return fresh;
    }
}

/// The state built for fork generation `generation`, if there is one yet.
#[inline]
fn current(generation: u64) -> Option<&'static ProcessState> {
    // SAFETY: PROCESS is null or a leaked (never freed) ProcessState, which is never
    // written through after it was stored.
    let state = unsafe { PROCESS.load(Ordering::Acquire).as_ref() }?;
    (state.generation == generation).then_some(state)
}

fn build_process_state(enforcer: &'static Enforcer, generation: u64) -> ProcessState {
    let me = process::current();
    let slot = if enforcer.refused {
        None
    } else {
        match enforcer.region.attach(&me) {
            Ok(slot) => Some(slot),
            Err(err) => {
                runtime::notice("cuda", format_args!("{err}; allocations are refused"));
                None
            }
        }
    };
    ProcessState {
        generation,
        ledger: Ledger::new(&enforcer.region, slot),
        pid_ns: me.pid_ns,
        last_sync_ns: AtomicU64::new(0),
        first_uses: Mutex::new(HashSet::new()),
    }
}

/// Gives this process's slot back at exit (called by `crate::exit`). Nothing when the
/// shim never loaded, or this process (generation) never built its state.
pub fn give_back() {
    let Some(Policy::Apply(enforcer)) = loaded().map(|shim| &shim.policy) else {
        return;
    };
    if let Some(state) = current(fork_epoch::generation())
        && let Some(slot) = state.ledger.slot()
    {
        enforcer.region.detach(slot);
    }
}

impl Enforcer {
    /// This process's slot, when it has one.
    #[inline]
    pub fn slot(&'static self) -> Option<SlotId> {
        process_state(self).ledger.slot()
    }
}
