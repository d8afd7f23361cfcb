//! What the shim knows: the real driver, the policy from the config (forward only,
//! fail closed, or enforce), the visible devices, the usage region and this process's
//! own allocations.
//!
//! Per-process state (the region slot and the allocation table) is rebuilt in a forked
//! child: the fork handler only bumps a counter (async-signal-safe), and the first hook
//! call in the child builds fresh state instead of touching locks that a parent thread
//! may have held at the fork.

use std::collections::HashMap;
use std::ffi::{c_char, c_void};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use vgpu_common::config::Config;
use vgpu_common::config::MAX_DEVICES;
use vgpu_common::region::{OpenOutcome, Region, SlotId};
use vgpu_common::{CoreMode, DeviceSelector, process};
use vgpu_shimgen::runtime::{self, RealLibrary, StartConfig};

use crate::cuda::*;
use crate::forward::{self, SLOTS};
use crate::{debug, stubs};

/// Calls the real function behind export `$name` (see `vgpu_shimgen::call_real`).
macro_rules! real {
    ($($tokens:tt)*) => {
        ::vgpu_shimgen::call_real!(crate::forward, $($tokens)*)
    };
}
pub(crate) use real;

/// What the config says the shim should do; `Apply` enforces quotas.
pub type Policy = runtime::Policy<Enforcer>;

pub struct Shim {
    pub real: Option<RealLibrary>,
    pub policy: Policy,
}

/// The live quota machinery.
pub struct Enforcer {
    pub config: Config,
    pub region: Region,
    pub driver_dir: PathBuf,
    devices: OnceLock<Vec<Visible>>,
}

/// A device the container may use.
#[derive(Clone, Debug)]
pub struct Visible {
    /// The real driver's handle.
    pub real: CUdevice,
    pub uuid: String,
    /// Index of this device in the config and in the usage region.
    pub region_index: usize,
    /// The quota (the card's memory when the config sets none).
    pub memory_limit: u64,
    pub core_limit: Option<u32>,
    pub core_mode: CoreMode,
    pub core_ceiling: Option<u32>,
}

static SHIM: OnceLock<Shim> = OnceLock::new();

/// The shim's state, loaded on first use (normally by the load-time constructor).
pub fn shim() -> &'static Shim {
    SHIM.get_or_init(load)
}

fn load() -> Shim {
    let start = runtime::Start {
        shim: "cuda",
        library: "libcuda.so.1",
        unloaded_effect: "every CUDA call returns CUDA_ERROR_NOT_INITIALIZED",
        fail_closed_effect: "hiding every GPU (fail-closed)",
    };
    let (real, config, driver_dir) = start.run(
        &forward::NAMES,
        &SLOTS,
        |index| forward::HOOKS[index].is_some(),
        stubs::missing_in_driver as *mut c_void,
    );
    let policy = match config {
        StartConfig::Absent => Policy::Passthrough,
        StartConfig::Broken => Policy::FailClosed,
        StartConfig::Found(config, path) => match Enforcer::new(config, path, driver_dir) {
            Some(enforcer) => Policy::Apply(Box::new(enforcer)),
            None => Policy::FailClosed,
        },
    };
    // SAFETY: registering a fork handler that only touches an atomic, and an exit
    // handler; the shim is linked with -z nodelete, so both stay mapped.
    unsafe {
        libc::pthread_atfork(None, None, Some(after_fork_in_child));
        libc::atexit(at_exit);
    }
    Shim { real, policy }
}

impl Enforcer {
    fn new(config: Config, config_path: PathBuf, driver_dir: PathBuf) -> Option<Enforcer> {
        let devices = config.region_devices();
        let region_path = config.resolved_region_path(&config_path);
        let region = match Region::open(&region_path, &devices) {
            Ok((region, outcome)) => {
                if let OpenOutcome::Rebuilt(reason) = outcome {
                    runtime::notice(
                        "cuda",
                        format_args!(
                            "usage region {} was rebuilt: {reason}",
                            region_path.display()
                        ),
                    );
                }
                region
            }
            Err(err) => {
                // The quota must still hold inside this process.
                let private = std::env::temp_dir()
                    .join(format!("vgpu-private-{}.region", std::process::id()));
                match Region::open(&private, &devices) {
                    Ok((region, _)) => {
                        let _ = std::fs::remove_file(&private);
                        runtime::notice(
                            "cuda",
                            format_args!("{err}; enforcing the quota for this process alone"),
                        );
                        region
                    }
                    Err(second) => {
                        runtime::notice(
                            "cuda",
                            format_args!("{err}; {second}; hiding every GPU (fail-closed)"),
                        );
                        return None;
                    }
                }
            }
        };
        Some(Enforcer {
            config,
            region,
            driver_dir,
            devices: OnceLock::new(),
        })
    }

    /// The visible devices, in container order; `None` until the real driver answers
    /// (before cuInit).
    pub fn devices(&self) -> Option<&[Visible]> {
        if let Some(devices) = self.devices.get() {
            return Some(devices);
        }
        let built = self.discover()?;
        let _ = self.devices.set(built);
        self.devices.get().map(Vec::as_slice)
    }

    fn discover(&self) -> Option<Vec<Visible>> {
        let get_count = real!(cuDeviceGetCount as fn(*mut i32) -> CUresult);
        let get = real!(cuDeviceGet as fn(*mut CUdevice, i32) -> CUresult);
        let mut count = 0;
        // SAFETY: valid out-pointer.
        if unsafe { get_count(&mut count) } != CUDA_SUCCESS {
            return None;
        }
        struct Card {
            handle: CUdevice,
            uuid: String,
            pci: (i32, i32, i32),
            total: u64,
        }
        let mut cards = Vec::new();
        for ordinal in 0..count {
            let mut handle = 0;
            // SAFETY: valid out-pointer, ordinal < count.
            if unsafe { get(&mut handle, ordinal) } != CUDA_SUCCESS {
                continue;
            }
            cards.push(Card {
                handle,
                uuid: device_uuid(handle).unwrap_or_default(),
                pci: pci_location(handle),
                total: total_memory(handle),
            });
        }
        // `index:` selectors count in PCI order, as nvidia-smi and NVML do.
        let mut by_pci: Vec<usize> = (0..cards.len()).collect();
        by_pci.sort_by_key(|&i| cards[i].pci);
        let mut visible = Vec::new();
        for (region_index, quota) in self.config.devices.iter().enumerate() {
            let found = match quota.selector() {
                DeviceSelector::Uuid(uuid) => cards
                    .iter()
                    .position(|card| card.uuid.eq_ignore_ascii_case(uuid.trim())),
                DeviceSelector::Index(index) => by_pci.get(index as usize).copied(),
            };
            let Some(position) = found else {
                runtime::notice(
                    "cuda",
                    format_args!(
                        "config device {} is not on this host; it stays hidden",
                        quota.selector()
                    ),
                );
                continue;
            };
            let card = &cards[position];
            if visible.iter().any(|v: &Visible| v.real == card.handle) {
                continue;
            }
            visible.push(Visible {
                real: card.handle,
                uuid: card.uuid.clone(),
                region_index,
                memory_limit: quota
                    .memory_limit
                    .map(|limit| limit.bytes())
                    .unwrap_or(card.total),
                core_limit: quota.effective_core_limit(),
                core_mode: quota.core_mode,
                core_ceiling: quota.core_ceiling,
            });
        }
        debug!("{} of {} devices visible", visible.len(), cards.len());
        Some(visible)
    }

    /// The visible device behind a real handle.
    pub fn visible(&self, handle: CUdevice) -> Option<&Visible> {
        self.devices()?.iter().find(|device| device.real == handle)
    }

    /// The visible device of the calling thread's current context.
    pub fn current(&self) -> Result<&Visible, CUresult> {
        let get_device = real!(cuCtxGetDevice as fn(*mut CUdevice) -> CUresult);
        let mut handle = 0;
        // SAFETY: valid out-pointer.
        let result = unsafe { get_device(&mut handle) };
        if result != CUDA_SUCCESS {
            return Err(result);
        }
        self.visible(handle).ok_or(CUDA_ERROR_INVALID_DEVICE)
    }

    /// Bytes the container holds on a device.
    pub fn used(&self, device: &Visible) -> u64 {
        let process = process_state(self);
        if let Some(slot) = process.slot {
            self.sync_with_driver(process, slot, device);
        }
        self.region.device_used(device.region_index)
    }

    /// At most every `SYNC_INTERVAL_NS`, counts what the driver holds for this process
    /// beyond its counted allocations and contexts (module code the driver loads after
    /// the context exists, for one), from NVML's own figure for the process. Best
    /// effort: skipped when NVML cannot see our PID (a PID namespace), when another
    /// thread is at it, or when NVML is unavailable.
    fn sync_with_driver(&self, process: &ProcessState, slot: SlotId, device: &Visible) {
        if !process.pid_is_host_pid {
            return;
        }
        let now = monotonic_ns();
        let last = process.last_sync_ns.load(Ordering::Relaxed);
        if now.saturating_sub(last) < SYNC_INTERVAL_NS
            || process
                .last_sync_ns
                .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        // try_lock: never wait (and never deadlock in a forked child) for a best-effort figure.
        let Ok(mut cache) = NVML_BY_UUID.try_lock() else {
            return;
        };
        let position = match cache.iter().position(|(uuid, _)| *uuid == device.uuid) {
            Some(position) => position,
            None => {
                cache.push((
                    device.uuid.clone(),
                    open_nvml(&self.real_nvml_path(), &device.uuid),
                ));
                cache.len() - 1
            }
        };
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() } as u64;
        let Some(own) = cache[position]
            .1
            .as_ref()
            .and_then(|nvml| nvml.process_used(pid))
        else {
            return;
        };
        drop(cache);
        let index = device.region_index;
        let extra = &process.driver_extra[index];
        let before = extra.load(Ordering::Acquire);
        let counted_without_extra = self.region.slot_used(slot, index).saturating_sub(before);
        let after = own.saturating_sub(counted_without_extra);
        if after > before {
            self.region.add_used(slot, index, after - before);
        } else {
            self.region.release(slot, index, before - after);
        }
        extra.store(after, Ordering::Release);
        let contexts: u64 = process
            .contexts
            .lock()
            .map(|c| {
                c.iter()
                    .filter(|c| c.region_index == index)
                    .map(|c| c.bytes)
                    .sum()
            })
            .unwrap_or(0);
        self.region.set_context(slot, index, contexts + after);
        if after != before {
            debug!(
                "driver holds {after} bytes beyond our counts on {} (was {before})",
                device.uuid
            );
        }
    }

    /// Reserves `bytes` on `device` for this process, or says why not.
    pub fn reserve(&self, device: &Visible, bytes: u64) -> Result<Ticket, CUresult> {
        let process = process_state(self);
        let Some(slot) = process.slot else {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        };
        self.sync_with_driver(process, slot, device);
        let limit = if self.config.memory_oversubscribe {
            u64::MAX
        } else {
            device.memory_limit
        };
        if self
            .region
            .try_reserve(slot, device.region_index, bytes, limit)
        {
            return Ok(Ticket {
                slot,
                region_index: device.region_index,
                bytes,
            });
        }
        // Before saying no, credit back what dead processes held, and try once more.
        if self.region.reclaim_dead() > 0
            && self
                .region
                .try_reserve(slot, device.region_index, bytes, limit)
        {
            return Ok(Ticket {
                slot,
                region_index: device.region_index,
                bytes,
            });
        }
        debug!(
            "refused {bytes} bytes on {}: {} used of {}",
            device.uuid,
            self.used(device),
            limit
        );
        Err(CUDA_ERROR_OUT_OF_MEMORY)
    }

    /// A ticket for bytes already added to the region.
    pub fn ticket(&self, slot: SlotId, device: &Visible, bytes: u64) -> Ticket {
        Ticket {
            slot,
            region_index: device.region_index,
            bytes,
        }
    }

    /// Gives back a reservation whose allocation failed.
    pub fn unreserve(&self, ticket: Ticket) {
        self.region
            .release(ticket.slot, ticket.region_index, ticket.bytes);
    }

    /// Remembers a successful allocation so that its free credits it back.
    pub fn record(&self, key: AllocKey, ticket: Ticket, context: usize) {
        let process = process_state(self);
        if let Ok(mut allocations) = process.allocations.lock()
            && let Some(previous) = allocations.insert(key, Allocation { ticket, context })
        {
            // The driver reused a key we still held: the old one was freed behind our back.
            self.region.release(
                previous.ticket.slot,
                previous.ticket.region_index,
                previous.ticket.bytes,
            );
        }
    }

    /// Credits back the allocation under `key`, if we counted it.
    pub fn forget(&self, key: AllocKey) {
        let process = process_state(self);
        let removed = process
            .allocations
            .lock()
            .ok()
            .and_then(|mut allocations| allocations.remove(&key));
        if let Some(allocation) = removed {
            self.region.release(
                allocation.ticket.slot,
                allocation.ticket.region_index,
                allocation.ticket.bytes,
            );
        }
    }

    /// Credits back everything allocated in `context` (its destruction frees it all).
    pub fn forget_context(&self, context: usize) {
        let process = process_state(self);
        let Ok(mut allocations) = process.allocations.lock() else {
            return;
        };
        allocations.retain(|_, allocation| {
            if allocation.context == context {
                self.region.release(
                    allocation.ticket.slot,
                    allocation.ticket.region_index,
                    allocation.ticket.bytes,
                );
                false
            } else {
                true
            }
        });
    }

    /// This process's slot, when it has one.
    pub fn slot(&self) -> Option<SlotId> {
        process_state(self).slot
    }

    /// Records the overhead of a new context (once per context); `measure` gets the
    /// bytes this process's counted usage held before.
    pub fn charge_context(
        &self,
        device: &Visible,
        context: usize,
        primary: bool,
        measure: impl FnOnce(u64) -> u64,
    ) {
        let process = process_state(self);
        let Some(slot) = process.slot else { return };
        let tracked = self.region.slot_used(slot, device.region_index);
        let bytes = measure(tracked);
        let Ok(mut charges) = process.contexts.lock() else {
            return;
        };
        if charges.iter().any(|charge| charge.context == context) {
            return;
        }
        charges.push(ContextCharge {
            context,
            region_index: device.region_index,
            bytes,
            primary,
        });
        self.region.add_used(slot, device.region_index, bytes);
        let total = charges
            .iter()
            .filter(|c| c.region_index == device.region_index)
            .map(|c| c.bytes)
            .sum();
        self.region.set_context(slot, device.region_index, total);
        debug!(
            "context {context:#x} on {} costs {bytes} bytes",
            device.uuid
        );
    }

    /// Whether this process already charged `context`.
    pub fn context_charged(&self, context: usize) -> bool {
        process_state(self)
            .contexts
            .lock()
            .is_ok_and(|charges| charges.iter().any(|c| c.context == context))
    }

    /// The primary context charged on a device, if any.
    pub fn primary_context(&self, device: &Visible) -> Option<usize> {
        let charges = process_state(self).contexts.lock().ok()?;
        charges
            .iter()
            .find(|c| c.primary && c.region_index == device.region_index)
            .map(|c| c.context)
    }

    /// Credits back a destroyed context: its allocations and its overhead.
    pub fn context_destroyed(&self, context: usize) {
        self.forget_context(context);
        let process = process_state(self);
        let Some(slot) = process.slot else { return };
        let Ok(mut charges) = process.contexts.lock() else {
            return;
        };
        let Some(position) = charges.iter().position(|c| c.context == context) else {
            return;
        };
        let charge = charges.remove(position);
        self.region.release(slot, charge.region_index, charge.bytes);
        let total = charges
            .iter()
            .filter(|c| c.region_index == charge.region_index)
            .map(|c| c.bytes)
            .sum();
        self.region.set_context(slot, charge.region_index, total);
    }

    /// Host directory of the real NVML, for measuring context overhead.
    pub fn real_nvml_path(&self) -> PathBuf {
        self.driver_dir.join("libnvidia-ml.so.1")
    }
}

/// A reservation in the usage region.
#[derive(Clone, Copy, Debug)]
pub struct Ticket {
    slot: SlotId,
    region_index: usize,
    pub bytes: u64,
}

/// What an allocation is keyed by: a device pointer, an array, or a VMM handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AllocKey {
    Pointer(u64),
    Array(usize),
    Physical(u64),
}

struct Allocation {
    ticket: Ticket,
    context: usize,
}

/// The overhead charged for one context of this process.
struct ContextCharge {
    context: usize,
    region_index: usize,
    bytes: u64,
    primary: bool,
}

/// State that belongs to one process (rebuilt after fork).
struct ProcessState {
    generation: u64,
    slot: Option<SlotId>,
    allocations: Mutex<HashMap<AllocKey, Allocation>>,
    contexts: Mutex<Vec<ContextCharge>>,
    /// Whether NVML (which reports host PIDs) can see this process under its own PID.
    pid_is_host_pid: bool,
    /// Monotonic ns of the last reconciliation with NVML.
    last_sync_ns: AtomicU64,
    /// Per device: device memory the driver holds for this process beyond its counted
    /// allocations and context overhead (module code loaded later, and the like).
    driver_extra: [AtomicU64; MAX_DEVICES],
}

/// How often a process reconciles its counted usage with NVML's figure for it.
const SYNC_INTERVAL_NS: u64 = 250_000_000;

fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// Real NVML handles by device UUID, opened once per process.
static NVML_BY_UUID: Mutex<Vec<(String, Option<Nvml>)>> = Mutex::new(Vec::new());

static FORK_GENERATION: AtomicU64 = AtomicU64::new(0);
static PROCESS: AtomicPtr<ProcessState> = AtomicPtr::new(std::ptr::null_mut());

extern "C" fn after_fork_in_child() {
    FORK_GENERATION.fetch_add(1, Ordering::SeqCst);
}

fn process_state(enforcer: &Enforcer) -> &'static ProcessState {
    let generation = FORK_GENERATION.load(Ordering::Acquire);
    let current = PROCESS.load(Ordering::Acquire);
    // SAFETY: PROCESS only ever holds leaked (never freed) ProcessState boxes.
    if let Some(state) = unsafe { current.as_ref() }
        && state.generation == generation
    {
        return state;
    }
    let slot = match enforcer.region.attach(&process::current()) {
        Ok(slot) => Some(slot),
        Err(err) => {
            runtime::notice("cuda", format_args!("{err}; allocations are refused"));
            None
        }
    };
    let me = process::current();
    let fresh = Box::into_raw(Box::new(ProcessState {
        generation,
        slot,
        allocations: Mutex::new(HashMap::new()),
        contexts: Mutex::new(Vec::new()),
        pid_is_host_pid: me.pid_ns == process::INIT_PID_NS,
        last_sync_ns: AtomicU64::new(0),
        driver_extra: [const { AtomicU64::new(0) }; MAX_DEVICES],
    }));
    match PROCESS.compare_exchange(current, fresh, Ordering::AcqRel, Ordering::Acquire) {
        // SAFETY: `fresh` was just leaked above and is never freed.
        Ok(_) => unsafe { &*fresh },
        Err(winner) => {
            // Another thread built it first: give our slot back and use theirs.
            // SAFETY: `fresh` is ours alone; `winner` is a leaked, never-freed state.
            let ours = unsafe { Box::from_raw(fresh) };
            if let Some(slot) = ours.slot
                && unsafe { winner.as_ref() }.is_some_and(|w| w.slot != Some(slot))
            {
                enforcer.region.detach(slot);
            }
            // SAFETY: as above.
            unsafe { &*winner }
        }
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
    // SAFETY: PROCESS only holds leaked states.
    if let Some(state) = unsafe { PROCESS.load(Ordering::Acquire).as_ref() }
        && state.generation == FORK_GENERATION.load(Ordering::Acquire)
        && let Some(slot) = state.slot
    {
        enforcer.region.detach(slot);
    }
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` of a real device.
pub fn device_uuid(handle: CUdevice) -> Option<String> {
    let get_uuid = real!(cuDeviceGetUuid_v2 as fn(*mut CUuuid, CUdevice) -> CUresult);
    let mut uuid = CUuuid::default();
    // SAFETY: valid out-pointer.
    if unsafe { get_uuid(&mut uuid, handle) } != CUDA_SUCCESS {
        let get_uuid_v1 = real!(cuDeviceGetUuid as fn(*mut CUuuid, CUdevice) -> CUresult);
        // SAFETY: valid out-pointer.
        if unsafe { get_uuid_v1(&mut uuid, handle) } != CUDA_SUCCESS {
            return None;
        }
    }
    Some(format_uuid(&uuid.bytes))
}

pub fn format_uuid(b: &[u8; 16]) -> String {
    format!(
        "GPU-{:02x}{:02x}{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}{:02x}{:02x}{:02x}{:02x}",
        b[0],
        b[1],
        b[2],
        b[3],
        b[4],
        b[5],
        b[6],
        b[7],
        b[8],
        b[9],
        b[10],
        b[11],
        b[12],
        b[13],
        b[14],
        b[15]
    )
}

fn pci_location(handle: CUdevice) -> (i32, i32, i32) {
    let attribute = real!(cuDeviceGetAttribute as fn(*mut i32, i32, CUdevice) -> CUresult);
    let read = |which| {
        let mut value = 0;
        // SAFETY: valid out-pointer.
        unsafe { attribute(&mut value, which, handle) };
        value
    };
    (
        read(CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID),
        read(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID),
        read(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID),
    )
}

/// The card's own memory, from the real driver.
pub fn total_memory(handle: CUdevice) -> u64 {
    let total_mem = real!(cuDeviceTotalMem_v2 as fn(*mut usize, CUdevice) -> CUresult);
    let mut bytes = 0usize;
    // SAFETY: valid out-pointer.
    unsafe { total_mem(&mut bytes, handle) };
    bytes as u64
}

/// The enforcer, `Ok(None)` when the shim only forwards, or the error every hooked
/// call returns when the shim fails closed.
pub fn enforcer() -> Result<Option<&'static Enforcer>, CUresult> {
    match &shim().policy {
        Policy::Passthrough => Ok(None),
        Policy::FailClosed => Err(CUDA_ERROR_NO_DEVICE),
        Policy::Apply(enforcer) => Ok(Some(enforcer)),
    }
}

/// Measures how much device memory a new context took, through the real NVML: the
/// process's own figure when its PID is visible to NVML, else the card's used-memory
/// delta around the creation (`before` was read just before).
pub struct ContextMeter {
    nvml: Option<Nvml>,
    before: Option<u64>,
    uuid: String,
}

struct Nvml {
    /// An NVML device handle: a pointer into NVML's own static device table.
    device: *mut c_void,
    memory_info: unsafe extern "C" fn(*mut c_void, *mut [u64; 3]) -> u32,
    processes: Option<unsafe extern "C" fn(*mut c_void, *mut u32, *mut ProcessInfoV1) -> u32>,
}

impl ContextMeter {
    pub fn start(enforcer: &Enforcer, uuid: &str) -> ContextMeter {
        let nvml = open_nvml(&enforcer.real_nvml_path(), uuid);
        let before = nvml.as_ref().and_then(Nvml::card_used);
        ContextMeter {
            nvml,
            before,
            uuid: uuid.to_string(),
        }
    }

    /// Bytes the context took; `tracked` is what this process's counted usage held.
    pub fn finish(self, tracked: u64) -> u64 {
        let Some(nvml) = &self.nvml else { return 0 };
        // SAFETY: getpid has no preconditions.
        let me = unsafe { libc::getpid() } as u64;
        if let Some(own) = nvml.process_used(me) {
            debug!("context overhead on {} from NVML's process list", self.uuid);
            return own.saturating_sub(tracked);
        }
        match (self.before, nvml.card_used()) {
            (Some(before), Some(after)) => after.saturating_sub(before),
            _ => 0,
        }
    }
}

// SAFETY: the handle points into NVML's process-wide device table, and NVML's calls
// are thread-safe; the function pointers are plain code addresses.
unsafe impl Send for Nvml {}

impl Nvml {
    fn card_used(&self) -> Option<u64> {
        let mut info = [0u64; 3];
        // SAFETY: nvmlMemory_t is three u64 (total, free, used).
        (unsafe { (self.memory_info)(self.device, &mut info) } == 0).then_some(info[2])
    }

    fn process_used(&self, pid: u64) -> Option<u64> {
        let processes = self.processes?;
        let mut entries = [ProcessInfoV1 {
            pid: 0,
            used_gpu_memory: 0,
        }; 64];
        let mut count = entries.len() as u32;
        // SAFETY: `entries` holds `count` records of nvmlProcessInfo_v1_t, the layout of
        // the unversioned nvmlDeviceGetComputeRunningProcesses.
        if unsafe { processes(self.device, &mut count, entries.as_mut_ptr()) } != 0 {
            return None;
        }
        entries[..(count as usize).min(entries.len())]
            .iter()
            .find(|entry| entry.pid as u64 == pid)
            .map(|entry| entry.used_gpu_memory)
    }
}

/// `nvmlProcessInfo_v1_t`.
#[repr(C)]
#[derive(Clone, Copy)]
struct ProcessInfoV1 {
    pid: u32,
    used_gpu_memory: u64,
}

fn open_nvml(path: &Path, uuid: &str) -> Option<Nvml> {
    // The real NVML's SONAME is `libnvidia-ml.so.1`, and glibc's dlopen matches a
    // requested name against the SONAMEs of loaded objects: once we load the real NVML
    // by path, the application's own dlopen("libnvidia-ml.so.1") would get it instead of
    // the NVML shim. Loading the shim (whatever the loader finds under that name) first
    // puts it ahead in the link map, so name lookups keep finding it.
    // SAFETY: loading the library the application itself would get under this name.
    if let Ok(by_name) = unsafe {
        libloading::os::unix::Library::open(
            Some("libnvidia-ml.so.1"),
            libc::RTLD_NOW | libc::RTLD_LOCAL,
        )
    } {
        std::mem::forget(by_name);
    }
    // SAFETY: loading NVIDIA's NVML from the real driver folder; it stays loaded.
    let library = unsafe {
        libloading::os::unix::Library::open(Some(path), libc::RTLD_NOW | libc::RTLD_LOCAL)
    }
    .ok()?;
    // SAFETY: symbol types match NVML's C declarations.
    let nvml = unsafe {
        let init: libloading::os::unix::Symbol<unsafe extern "C" fn() -> u32> =
            library.get(b"nvmlInit_v2\0").ok()?;
        let by_uuid: libloading::os::unix::Symbol<
            unsafe extern "C" fn(*const c_char, *mut *mut c_void) -> u32,
        > = library.get(b"nvmlDeviceGetHandleByUUID\0").ok()?;
        let memory_info = *library.get(b"nvmlDeviceGetMemoryInfo\0").ok()?;
        let processes = library
            .get(b"nvmlDeviceGetComputeRunningProcesses\0")
            .ok()
            .map(|s| *s);
        if init() != 0 {
            return None;
        }
        let name = std::ffi::CString::new(uuid).ok()?;
        let mut device = std::ptr::null_mut();
        if by_uuid(name.as_ptr(), &mut device) != 0 {
            return None;
        }
        Nvml {
            device,
            memory_info,
            processes,
        }
    };
    std::mem::forget(library);
    Some(nvml)
}

/// Rounds an allocation the way the driver's allocator spends memory: large blocks in
/// 2 MiB pages, small ones in 512-byte units.
pub fn charged_size(bytes: u64) -> u64 {
    const PAGE: u64 = 2 << 20;
    if bytes >= (1 << 20) {
        bytes.div_ceil(PAGE) * PAGE
    } else {
        bytes.div_ceil(512) * 512
    }
}
