//! Per-process state and what fork and exit do to it: this process's slot in the usage
//! region and its ledger tables (allocations, context charges, VMM handles, pools), and
//! the figures its reconciliation with NVML keeps.
//!
//! The state is rebuilt in a forked child: the fork handler only bumps the fork epoch
//! (`crate::fork_epoch`, async-signal-safe), and the first hook call in the child builds fresh state
//! (attaching a slot of its own) instead of touching locks that a parent thread may
//! have held at the fork. At exit the slot is given back.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use vgpu_contract::config::MAX_DEVICES;
use vgpu_contract::process;
use vgpu_contract::region::SlotId;
use vgpu_shimgen::runtime;

use crate::fork_epoch;
use crate::ledger::allocations::{AllocKey, Allocation};
use crate::ledger::contexts::ContextCharge;
use crate::ledger::pools::PoolTable;
use crate::ledger::vmm::VmmTable;
use crate::state::{Enforcer, Policy, shim};

/// State that belongs to one process (rebuilt after fork).
pub struct ProcessState {
    generation: u64,
    /// This process's slot in the usage region; `None` when allocations are refused.
    pub slot: Option<SlotId>,
    /// Single allocations, by pointer or array handle.
    pub allocations: Mutex<HashMap<AllocKey, Allocation>>,
    /// The overhead charged for each context.
    pub contexts: Mutex<Vec<ContextCharge>>,
    /// Physical allocations (`cuMemCreate`), their references and mappings.
    pub vmm: Mutex<VmmTable>,
    /// The memory pools this process uses and what each has reserved.
    pub pools: Mutex<PoolTable>,
    /// Whether some pool holds counted memory (the synchronisation hooks settle only
    /// then, so they cost one load otherwise).
    pub pools_hold_memory: AtomicBool,
    /// This process's PID namespace (for matching NVML's process list).
    pub pid_ns: u64,
    /// Monotonic ns of the last reconciliation with NVML.
    pub last_sync_ns: AtomicU64,
    /// Per device: device memory the driver holds for this process beyond its counted
    /// allocations and context overhead (module code loaded later, and the like).
    pub driver_extra: [AtomicU64; MAX_DEVICES],
    /// Functions, modules and globals already used once (lazy loading brings their code
    /// and data at the first use, which is settled with NVML; later uses are not).
    first_uses: Mutex<HashSet<usize>>,
}

impl ProcessState {
    /// The pool table (waiting for it; a poisoned lock is recovered).
    pub fn pools(&self) -> MutexGuard<'_, PoolTable> {
        runtime::lock(&self.pools)
    }

    /// The pool table if no other thread holds it now.
    pub fn try_pools(&self) -> Option<MutexGuard<'_, PoolTable>> {
        runtime::try_lock(&self.pools)
    }

    /// Whether this is the first use of `handle` (a function, module or global) this
    /// process has seen; false for 0.
    pub fn first_use(&self, handle: usize) -> bool {
        handle != 0 && runtime::lock(&self.first_uses).insert(handle)
    }

    /// Records whether some pool of `pools` still holds counted memory.
    pub fn pools_changed(&self, pools: &PoolTable) {
        self.pools_hold_memory
            .store(pools.holds_memory(), Ordering::Relaxed);
    }
}

static PROCESS: AtomicPtr<ProcessState> = AtomicPtr::new(std::ptr::null_mut());
/// One more than the fork generation whose process state a thread is building (0:
/// none). A value left by a parent's thread at fork names an older generation, so the
/// child never waits on it.
static BUILDING: AtomicU64 = AtomicU64::new(0);

/// Registers the fork epoch's handler and the exit handler (once, when the shim loads).
pub fn register_handlers() {
    fork_epoch::register();
    // SAFETY: registering an exit handler; the shim is linked with -z nodelete, so it
    // stays mapped.
    unsafe { libc::atexit(at_exit) };
}

/// This process's state, built on first use in each process (after a fork as well).
#[inline]
pub fn process_state(enforcer: &Enforcer) -> &'static ProcessState {
    match current(fork_epoch::generation()) {
        Some(state) => state,
        None => first_use(enforcer),
    }
}

/// Builds this process's state (one thread per fork generation builds it; the others
/// wait for it).
#[cold]
fn first_use(enforcer: &Enforcer) -> &'static ProcessState {
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

fn build_process_state(enforcer: &Enforcer, generation: u64) -> ProcessState {
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
        slot,
        allocations: Mutex::new(HashMap::new()),
        contexts: Mutex::new(Vec::new()),
        vmm: Mutex::new(VmmTable::default()),
        pools: Mutex::new(PoolTable::default()),
        pools_hold_memory: AtomicBool::new(false),
        pid_ns: me.pid_ns,
        last_sync_ns: AtomicU64::new(0),
        driver_extra: [const { AtomicU64::new(0) }; MAX_DEVICES],
        first_uses: Mutex::new(HashSet::new()),
    }
}

extern "C" fn at_exit() {
    runtime::guard((), on_exit);
}

/// Gives this process's slot back at exit.
fn on_exit() {
    let Policy::Apply(enforcer) = &shim().policy else {
        return;
    };
    if let Some(state) = current(fork_epoch::generation())
        && let Some(slot) = state.slot
    {
        enforcer.region.detach(slot);
    }
}

impl Enforcer {
    /// This process's slot, when it has one.
    #[inline]
    pub fn slot(&self) -> Option<SlotId> {
        process_state(self).slot
    }
}
