//! What the shim knows: the real driver, the policy from the config (forward only,
//! fail closed, or enforce), the visible devices, the usage region and this process's
//! own ledger: single allocations, VMM handles and memory pools (the last two in
//! `crate::ledger`), context overhead, and what the driver holds beyond all that
//! (reconciled with NVML's figure for the process, in any PID namespace).
//!
//! Per-process state (the region slot and the allocation table) is rebuilt in a forked
//! child: the fork handler only bumps a counter (async-signal-safe), and the first hook
//! call in the child builds fresh state instead of touching locks that a parent thread
//! may have held at the fork.

use std::collections::HashMap;
use std::ffi::{c_char, c_void};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use vgpu_abi::nvml::ProcessInfoV1;
use vgpu_common::config::Config;
use vgpu_common::config::MAX_DEVICES;
use vgpu_common::region::{self, OpenOutcome, ProcessUsage, Region, RegionError, SlotId};
use vgpu_common::{CoreMode, DeviceSelector, process};
use vgpu_shimgen::runtime::{self, RealLibrary, StartConfig};

use crate::cuda::*;
use crate::exports::{self, SLOTS};
use crate::ledger::pools::{Change, PoolDriver, PoolTable};
use crate::ledger::vmm::{Freed, VmmTable};
use crate::{debug, stubs};

/// Calls the real function behind export `$name` (see `vgpu_shimgen::call_real`).
macro_rules! real {
    ($($tokens:tt)*) => {
        ::vgpu_shimgen::call_real!(crate::exports, $($tokens)*)
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
    /// The container's region is damaged or foreign while live processes hold it:
    /// this process refuses every allocation rather than count outside it.
    refused: bool,
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
        &exports::NAMES,
        &SLOTS,
        |index| exports::HOOKS[index].is_some(),
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
        let (region, refused) = match Region::open(&region_path, &devices) {
            Ok((region, outcome)) => {
                if let OpenOutcome::Rebuilt(reason) = outcome {
                    runtime::notice(
                        "cuda",
                        format_args!(
                            "usage region {} was rebuilt (no live process held it): {reason}",
                            region_path.display()
                        ),
                    );
                }
                (region, false)
            }
            Err(err) => {
                // Held: another process's usage is in there, so counting apart from it
                // would pass the quota; refuse. Unopenable: the quota must still hold
                // inside this process.
                let held = matches!(err, RegionError::Held { .. });
                let effect = if held {
                    "every allocation of this process is refused"
                } else {
                    "enforcing the quota for this process alone"
                };
                let private = std::env::temp_dir()
                    .join(format!("vgpu-private-{}.region", std::process::id()));
                let _ = std::fs::remove_file(&private);
                match Region::open(&private, &devices) {
                    Ok((region, _)) => {
                        let _ = std::fs::remove_file(&private);
                        runtime::notice("cuda", format_args!("{err}; {effect}"));
                        (region, held)
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
            refused,
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

    /// Bytes the container holds on a device, after crediting back what processes that
    /// are gone held (one `kill(pid, 0)` per other process) and settling this process's
    /// pools (what `cuMemGetInfo` answers from).
    pub fn used(&self, device: &Visible) -> u64 {
        let process = process_state(self);
        let Some(slot) = process.slot else {
            return if self.refused {
                device.memory_limit
            } else {
                self.region.device_used(device.region_index)
            };
        };
        self.region.reclaim_gone(slot, process.pid_ns);
        self.settle_pools(process, slot, Some(device.region_index));
        self.sync_with_driver(process, slot, device);
        self.region.device_used(device.region_index)
    }

    /// This process as the NVML matching rule sees it.
    fn me(&self, process: &ProcessState, slot: Option<SlotId>) -> ProcessUsage {
        ProcessUsage {
            slot: slot.map_or(0, SlotId::index),
            // SAFETY: getpid has no preconditions.
            pid: unsafe { libc::getpid() },
            host_pid: slot.map_or(0, |slot| self.region.slot_host_pid(slot)),
            start_time: 0,
            pid_ns: process.pid_ns,
            used: Vec::new(),
            context: Vec::new(),
            busy_ns: Vec::new(),
            launches: Vec::new(),
        }
    }

    /// At most every `SYNC_INTERVAL_NS`, counts what the driver holds for this process
    /// beyond its counted allocations, pools, VMM handles and contexts (module code the
    /// driver loads after the context exists, for one), from NVML's own figure for the
    /// process: found under our own PID (driver 580 answers in the caller's PID
    /// namespace) or under the host PID the host recorded in our slot (older drivers
    /// report host PIDs). Best effort: skipped when NVML lists us under neither, when
    /// another thread is at it, or when NVML is unavailable.
    fn sync_with_driver(&self, process: &ProcessState, slot: SlotId, device: &Visible) {
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
        let me = self.me(process, Some(slot));
        let Some(own) = cache[position]
            .1
            .as_ref()
            .and_then(|nvml| nvml.process_used(&me))
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

    /// The quota that reservations on `device` are checked against.
    fn limit(&self, device: &Visible) -> u64 {
        if self.config.memory_oversubscribe {
            u64::MAX
        } else {
            device.memory_limit
        }
    }

    /// Reserves `bytes` on `device` for this process, or says why not. Before saying no,
    /// it credits back what dead processes held, settles this process's pools, and
    /// trims them if what they hold unused makes room.
    pub fn reserve(&self, device: &Visible, bytes: u64) -> Result<Ticket, CUresult> {
        let process = process_state(self);
        let Some(slot) = process.slot else {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        };
        self.sync_with_driver(process, slot, device);
        let limit = self.limit(device);
        let index = device.region_index;
        let ticket = Ticket {
            slot,
            region_index: index,
            bytes,
        };
        if self.region.try_reserve(slot, index, bytes, limit) {
            return Ok(ticket);
        }
        let reserved = match process.pools.lock() {
            Ok(mut pools) => self.reserve_making_room(slot, device, bytes, &mut pools),
            Err(_) => false,
        };
        if reserved {
            return Ok(ticket);
        }
        debug!(
            "refused {bytes} bytes on {}: {} used of {limit}",
            device.uuid,
            self.region.device_used(index)
        );
        Err(CUDA_ERROR_OUT_OF_MEMORY)
    }

    /// The slow path of a reservation that did not fit: reclaim dead processes' slots,
    /// settle this process's pools, trim them if that makes room; true once `bytes` are
    /// reserved.
    fn reserve_making_room(
        &self,
        slot: SlotId,
        device: &Visible,
        bytes: u64,
        pools: &mut PoolTable,
    ) -> bool {
        let (index, limit) = (device.region_index, self.limit(device));
        self.region.reclaim_dead();
        self.apply(slot, pools.settle_all(Some(index), &RealPools));
        if self.region.try_reserve(slot, index, bytes, limit) {
            return true;
        }
        let shortfall = self
            .region
            .device_used(index)
            .saturating_add(bytes)
            .saturating_sub(limit);
        if shortfall > 0 && pools.trimmable(index, &RealPools) >= shortfall {
            debug!(
                "trimming this process's pools on {} for {bytes} bytes",
                device.uuid
            );
            self.apply(slot, pools.trim_all(index, &RealPools));
            return self.region.try_reserve(slot, index, bytes, limit);
        }
        false
    }

    /// Applies the ledger's changes to this process's slot.
    fn apply(&self, slot: SlotId, changes: impl IntoIterator<Item = Change>) {
        for change in changes {
            let bytes = change.delta.unsigned_abs().min(u64::MAX as u128) as u64;
            if change.delta > 0 {
                self.region.add_used(slot, change.region_index, bytes);
            } else {
                self.region.release(slot, change.region_index, bytes);
            }
        }
    }

    /// Credits what the VMM ledger freed.
    fn credit(&self, slot: Option<SlotId>, freed: impl IntoIterator<Item = Freed>) {
        if let Some(slot) = slot {
            for freed in freed {
                self.region.release(slot, freed.region_index, freed.bytes);
            }
        }
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
        self.remember(
            key,
            Allocation {
                ticket,
                context,
                pool: None,
            },
        );
    }

    fn remember(&self, key: AllocKey, allocation: Allocation) {
        let process = process_state(self);
        let previous = match process.allocations.lock() {
            Ok(mut allocations) => allocations.insert(key, allocation),
            Err(_) => return,
        };
        if let Some(previous) = previous {
            // The driver reused a key we still held: the old one was freed behind our back.
            self.credit_allocation(process, previous);
        }
    }

    fn credit_allocation(&self, process: &ProcessState, allocation: Allocation) {
        self.region.release(
            allocation.ticket.slot,
            allocation.ticket.region_index,
            allocation.ticket.bytes,
        );
        if let Some(pool) = allocation.pool
            && let Ok(mut pools) = process.pools.lock()
            && let Some(change) = pools.freed(pool)
        {
            self.apply(allocation.ticket.slot, [change]);
        }
    }

    /// Credits back the allocation under `key`, if we counted it. A pool allocation
    /// credits nothing: its memory stays reserved in the pool (see `settle_pools`).
    pub fn forget(&self, key: AllocKey) {
        let process = process_state(self);
        let removed = process
            .allocations
            .lock()
            .ok()
            .and_then(|mut allocations| allocations.remove(&key));
        if let Some(allocation) = removed {
            self.credit_allocation(process, allocation);
        }
    }

    /// Credits back everything allocated in `context` (its destruction frees it all),
    /// and settles the pools, whose allocations went with it.
    pub fn forget_context(&self, context: usize) {
        let process = process_state(self);
        let removed: Vec<Allocation> = match process.allocations.lock() {
            Ok(mut allocations) => {
                let keys: Vec<AllocKey> = allocations
                    .iter()
                    .filter(|(_, a)| a.context == context)
                    .map(|(key, _)| *key)
                    .collect();
                keys.iter()
                    .filter_map(|key| allocations.remove(key))
                    .collect()
            }
            Err(_) => return,
        };
        for allocation in removed {
            self.credit_allocation(process, allocation);
        }
        if let Some(slot) = process.slot {
            self.settle_pools(process, slot, None);
        }
    }

    /// This process's slot, when it has one.
    pub fn slot(&self) -> Option<SlotId> {
        process_state(self).slot
    }

    // --- VMM: physical memory lives until its last unmap and release -------------

    /// `cuMemCreate` succeeded with the bytes `ticket` reserved.
    pub fn vmm_created(&self, handle: u64, ticket: Ticket) {
        self.with_vmm(|vmm| vmm.created(handle, ticket.region_index, ticket.bytes));
    }

    /// `cuMemRelease` succeeded.
    pub fn vmm_released(&self, handle: u64) {
        self.with_vmm(|vmm| vmm.released(handle));
    }

    /// `cuMemRetainAllocationHandle` succeeded.
    pub fn vmm_retained(&self, handle: u64) {
        self.with_vmm(|vmm| {
            vmm.retained(handle);
            None
        });
    }

    /// `cuMemMap` succeeded.
    pub fn vmm_mapped(&self, start: u64, len: u64, handle: u64) {
        self.with_vmm(|vmm| vmm.mapped(start, len, handle));
    }

    /// `cuMemUnmap` succeeded.
    pub fn vmm_unmapped(&self, start: u64, len: u64) {
        self.with_vmm(|vmm| vmm.unmapped(start, len));
    }

    fn with_vmm<F: IntoIterator<Item = Freed>>(&self, change: impl FnOnce(&mut VmmTable) -> F) {
        let process = process_state(self);
        let freed: Vec<Freed> = match process.vmm.lock() {
            Ok(mut vmm) => change(&mut vmm).into_iter().collect(),
            Err(_) => return,
        };
        self.credit(process.slot, freed);
    }

    // --- memory pools: counted by what they have reserved ------------------------

    /// A pool of `device` became known (created, or looked up as a device's pool).
    pub fn pool_known(&self, pool: usize, device: &Visible) {
        if let Ok(mut pools) = process_state(self).pools.lock() {
            pools.know(pool, device.region_index);
        }
    }

    /// The visible device a known pool belongs to.
    pub fn pool_device(&self, pool: usize) -> Option<&Visible> {
        let index = process_state(self).pools.lock().ok()?.device_of(pool)?;
        self.devices()?.iter().find(|d| d.region_index == index)
    }

    /// Re-reads what `pool` has reserved (after a trim or an attribute change).
    pub fn pool_settle(&self, pool: usize) {
        let process = process_state(self);
        let Some(slot) = process.slot else { return };
        if let Ok(mut pools) = process.pools.lock() {
            self.apply(slot, pools.settle(pool, &RealPools));
            process
                .pools_hold_memory
                .store(pools.holds_memory(), Ordering::Relaxed);
        }
    }

    /// `cuMemPoolDestroy` succeeded.
    pub fn pool_destroyed(&self, pool: usize) {
        let process = process_state(self);
        let Some(slot) = process.slot else { return };
        if let Ok(mut pools) = process.pools.lock() {
            self.apply(slot, pools.destroyed(pool));
            process
                .pools_hold_memory
                .store(pools.holds_memory(), Ordering::Relaxed);
        }
    }

    /// A synchronisation point passed (the driver may have released pool memory
    /// beyond the release thresholds): settle the pools. One load when no pool holds
    /// counted memory; never waits for a thread that is allocating.
    pub fn synchronized(&self) {
        let process = process_state(self);
        if let Some(slot) = process.slot {
            self.settle_pools(process, slot, None);
        }
    }

    fn settle_pools(&self, process: &ProcessState, slot: SlotId, index: Option<usize>) {
        if !process.pools_hold_memory.load(Ordering::Relaxed) {
            return;
        }
        let Ok(mut pools) = process.pools.try_lock() else {
            return;
        };
        self.apply(slot, pools.settle_all(index, &RealPools));
        process
            .pools_hold_memory
            .store(pools.holds_memory(), Ordering::Relaxed);
    }

    /// Allocates `bytes` from `pool` on `device` with the pool counted by what it has
    /// reserved: reserves the most the pool can grow by for it first (refusing, after
    /// making room, when even that does not fit, unless the pool has the room unused),
    /// runs `allocate`, then settles the pool at the driver's figure. Should the pool
    /// have grown past the quota anyway, `undo` frees the allocation (freed and
    /// synchronised) and the pool is trimmed: CUDA_ERROR_OUT_OF_MEMORY.
    #[allow(clippy::too_many_arguments)]
    pub fn pool_allocate(
        &self,
        device: &Visible,
        pool: usize,
        bytes: u64,
        context: usize,
        allocate: impl FnOnce() -> CUresult,
        pointer: impl FnOnce() -> u64,
        undo: impl FnOnce(u64),
    ) -> CUresult {
        let process = process_state(self);
        let Some(slot) = process.slot else {
            return CUDA_ERROR_OUT_OF_MEMORY;
        };
        self.sync_with_driver(process, slot, device);
        let Ok(mut pools) = process.pools.lock() else {
            return CUDA_ERROR_OUT_OF_MEMORY;
        };
        let (index, limit) = (device.region_index, self.limit(device));
        if pools.know(pool, index) {
            // A pool seen for the first time may hold memory already.
            self.apply(slot, pools.settle(pool, &RealPools));
        }
        let bound = pool_growth_bound(bytes);
        let held = if self.region.try_reserve(slot, index, bound, limit)
            || self.reserve_making_room(slot, device, bound, &mut pools)
        {
            bound
        } else if pool_has_room(pool, bytes) {
            0
        } else {
            debug!(
                "refused {bytes} bytes from pool {pool:#x} on {}: {} used of {limit}",
                device.uuid,
                self.region.device_used(index)
            );
            return CUDA_ERROR_OUT_OF_MEMORY;
        };
        let result = allocate();
        let change = pools.settle(pool, &RealPools);
        let grew = change.map_or(0, |c| c.delta);
        self.apply(slot, change);
        self.region.release(slot, index, held);
        if result != CUDA_SUCCESS {
            process
                .pools_hold_memory
                .store(pools.holds_memory(), Ordering::Relaxed);
            return result;
        }
        let ptr = pointer();
        if grew > held as i128 && self.region.device_used(index) > limit {
            debug!("pool {pool:#x} grew by {grew} bytes for {bytes}, past the quota: undone");
            undo(ptr);
            RealPools.trim(pool);
            self.apply(slot, pools.settle(pool, &RealPools));
            process
                .pools_hold_memory
                .store(pools.holds_memory(), Ordering::Relaxed);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        pools.allocated(pool);
        process
            .pools_hold_memory
            .store(pools.holds_memory(), Ordering::Relaxed);
        drop(pools);
        self.remember(
            AllocKey::Pointer(ptr),
            Allocation {
                ticket: Ticket {
                    slot,
                    region_index: index,
                    bytes: 0,
                },
                context,
                pool: Some(pool),
            },
        );
        CUDA_SUCCESS
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

/// What an allocation is keyed by: a device pointer or an array.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AllocKey {
    Pointer(u64),
    Array(usize),
}

struct Allocation {
    ticket: Ticket,
    context: usize,
    /// The pool it came from (its memory is counted as the pool's reservation).
    pool: Option<usize>,
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
    /// Physical allocations (`cuMemCreate`), their references and mappings.
    vmm: Mutex<VmmTable>,
    /// The memory pools this process uses and what each has reserved.
    pools: Mutex<PoolTable>,
    /// Whether some pool holds counted memory (the synchronisation hooks settle only
    /// then, so they cost one load otherwise).
    pools_hold_memory: AtomicBool,
    /// This process's PID namespace (for matching NVML's process list).
    pid_ns: u64,
    /// Monotonic ns of the last reconciliation with NVML.
    last_sync_ns: AtomicU64,
    /// Per device: device memory the driver holds for this process beyond its counted
    /// allocations and context overhead (module code loaded later, and the like).
    driver_extra: [AtomicU64; MAX_DEVICES],
}

/// The most a pool's reservation grows for one allocation of `bytes`: the allocation in
/// 2 MiB steps, and at least 32 MiB (on the H200 with driver 580, a 5 MiB
/// `cuMemAllocAsync` reserves 32 MiB). Should a driver grow more, the allocation is
/// settled (and undone past the quota) by what the pool then reports.
pub fn pool_growth_bound(bytes: u64) -> u64 {
    const STEP: u64 = 2 << 20;
    const CHUNK: u64 = 32 << 20;
    bytes.div_ceil(STEP).saturating_mul(STEP).max(CHUNK)
}

/// Whether `pool` has `bytes` (in 2 MiB steps) reserved and unused.
fn pool_has_room(pool: usize, bytes: u64) -> bool {
    let reserved = RealPools.attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
    let used = RealPools.attribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
    match (reserved, used) {
        (Some(reserved), Some(used)) => {
            reserved.saturating_sub(used) >= bytes.div_ceil(2 << 20).saturating_mul(2 << 20)
        }
        _ => false,
    }
}

/// The real driver's pool attributes, for the pool ledger.
struct RealPools;

impl PoolDriver for RealPools {
    fn attribute(&self, pool: usize, attribute: i32) -> Option<u64> {
        let get = real!(cuMemPoolGetAttribute as fn(CUmemoryPool, i32, *mut c_void) -> CUresult);
        let mut value = 0u64;
        // SAFETY: the reserved/used attributes are cuuint64_t, written to a valid u64.
        let result = unsafe {
            get(
                pool as CUmemoryPool,
                attribute,
                (&mut value as *mut u64).cast(),
            )
        };
        (result == CUDA_SUCCESS).then_some(value)
    }

    fn trim(&self, pool: usize) {
        let trim = real!(cuMemPoolTrimTo as fn(CUmemoryPool, usize) -> CUresult);
        // SAFETY: trimming a pool handle this process allocated from; it releases only
        // memory that no allocation uses.
        unsafe { trim(pool as CUmemoryPool, 0) };
    }
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
/// One more than the fork generation whose process state a thread is building (0:
/// none). A value left by a parent's thread at fork names an older generation, so the
/// child never waits on it.
static BUILDING: AtomicU64 = AtomicU64::new(0);

extern "C" fn after_fork_in_child() {
    FORK_GENERATION.fetch_add(1, Ordering::SeqCst);
}

fn process_state(enforcer: &Enforcer) -> &'static ProcessState {
    loop {
        let generation = FORK_GENERATION.load(Ordering::Acquire);
        let current = PROCESS.load(Ordering::Acquire);
        // SAFETY: PROCESS only ever holds leaked (never freed) ProcessState boxes.
        if let Some(state) = unsafe { current.as_ref() }
            && state.generation == generation
        {
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
        let fresh = Box::into_raw(Box::new(build_process_state(enforcer, generation)));
        PROCESS.store(fresh, Ordering::Release);
        drop(built);
        // SAFETY: `fresh` was just leaked above and is never freed.
        return unsafe { &*fresh };
    }
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
/// process's own figure when NVML lists it (under its own PID in its namespace, or its
/// recorded host PID), else the card's used-memory delta around the creation (`before`
/// was read just before).
pub struct ContextMeter {
    nvml: Option<Nvml>,
    before: Option<u64>,
    uuid: String,
    me: ProcessUsage,
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
        let process = process_state(enforcer);
        ContextMeter {
            nvml,
            before,
            uuid: uuid.to_string(),
            me: enforcer.me(process, process.slot),
        }
    }

    /// Bytes the context took; `tracked` is what this process's counted usage held.
    pub fn finish(self, tracked: u64) -> u64 {
        let Some(nvml) = &self.nvml else { return 0 };
        if let Some(own) = nvml.process_used(&self.me) {
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

    /// NVML's figure for the process `me` (see `region::nvml_match`).
    fn process_used(&self, me: &ProcessUsage) -> Option<u64> {
        let processes = self.processes?;
        let mut entries = [ProcessInfoV1::default(); 64];
        let mut count = entries.len() as u32;
        // SAFETY: `entries` holds `count` records of nvmlProcessInfo_v1_t, the layout of
        // the unversioned nvmlDeviceGetComputeRunningProcesses.
        if unsafe { processes(self.device, &mut count, entries.as_mut_ptr()) } != 0 {
            return None;
        }
        entries[..(count as usize).min(entries.len())]
            .iter()
            .find(|entry| {
                region::nvml_match(std::slice::from_ref(me), entry.pid, me.pid_ns).is_some()
            })
            .map(|entry| entry.used_gpu_memory.min(region::MAX_COUNT))
    }
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
