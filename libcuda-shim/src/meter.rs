//! The NVML meter: what the driver really holds for this process, from the real NVML
//! (loaded from the driver folder beside the real libcuda, never through the NVML shim).
//!
//! Two uses: a new context's overhead (`ContextMeter`: the process's own NVML figure,
//! or the card's used-memory delta around the creation), and the reconciliation that
//! counts what the driver holds for the process beyond its counted allocations, pools,
//! VMM handles, contexts and reservations: module code, and whatever part of a module's
//! data or a limit the shim could not price before the call. It runs at most every
//! `SYNC_INTERVAL_NS` on the allocation path (`Enforcer::sync_with_driver`) and at once
//! right after a call that makes the driver take memory of its own
//! (`Enforcer::settle_with_driver`: module and library loads, first uses, limits). The
//! meter reads the figure; the ledger settles its count with it
//! (`Ledger::settle_with_figure`).
//!
//! NVML lists a process under its own PID (driver 580 answers in the caller's PID
//! namespace) or under the host PID the host recorded in our slot (older drivers report
//! host PIDs); `region::nvml_match` decides which entry is ours.

use std::ffi::{c_char, c_void};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::Ordering;

use vgpu_abi::nvml::ProcessInfoV1;
use vgpu_contract::clock::monotonic_ns;
use vgpu_contract::region::{self, ProcessUsage, SlotId};
use vgpu_shimgen::runtime;

use crate::debug;
use crate::devices::Visible;
use crate::process::{ProcessState, process_state};
use crate::state::Enforcer;

/// How often a process reconciles its counted usage with NVML's figure for it.
const SYNC_INTERVAL_NS: u64 = 250_000_000;
/// How often a settling right after a call tries for the NVML handles' lock.
const SETTLE_TRIES: u32 = 1000;

/// Real NVML handles by device UUID, opened once per process.
static NVML_BY_UUID: Mutex<Vec<(String, Option<Nvml>)>> = Mutex::new(Vec::new());

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

impl ContextMeter {
    /// Starts measuring, just before a context on the card `uuid` is created.
    pub fn start(enforcer: &'static Enforcer, uuid: &str) -> ContextMeter {
        let nvml = open_nvml(&enforcer.real_nvml_path(), uuid);
        let before = nvml.as_ref().and_then(Nvml::card_used);
        let process = process_state(enforcer);
        ContextMeter {
            nvml,
            before,
            uuid: uuid.to_string(),
            me: enforcer.me(process, process.ledger.slot()),
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

impl Enforcer {
    /// The real NVML, beside the real driver.
    pub fn real_nvml_path(&self) -> PathBuf {
        self.driver_dir.join("libnvidia-ml.so.1")
    }

    /// This process as the NVML matching rule sees it.
    fn me(&self, process: &ProcessState, slot: Option<SlotId>) -> ProcessUsage {
        ProcessUsage {
            slot: slot.map_or(0, SlotId::index),
            pid: std::process::id() as i32,
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
    /// on `device` beyond what it counted. Best effort: skipped when the process has no
    /// slot, when NVML lists us under neither PID, when another thread is at it, or
    /// when NVML is unavailable.
    pub(crate) fn sync_with_driver(&'static self, device: &Visible) {
        let process = process_state(self);
        let Some(slot) = process.ledger.slot() else {
            return;
        };
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
        self.reconcile(process, slot, device, 1);
    }

    /// Now, whatever the interval: counts what the driver holds for this process on
    /// `device` beyond what it counted (right after a call that made the driver take
    /// memory of its own: a module load, a limit). Returns whether NVML answered for us.
    /// Waits for another thread's reconciliation a little (never for a lock a forked
    /// parent may have held: it only retries `try_lock`).
    pub(crate) fn settle_with_driver(&'static self, device: &Visible) -> bool {
        let process = process_state(self);
        let Some(slot) = process.ledger.slot() else {
            return false;
        };
        process
            .last_sync_ns
            .store(monotonic_ns(), Ordering::Relaxed);
        self.reconcile(process, slot, device, SETTLE_TRIES)
    }

    /// The reconciliation itself, trying the NVML handles' lock up to `tries` times; the
    /// lock is held while the ledger settles with the figure, so two threads never
    /// apply one reading twice.
    fn reconcile(
        &self,
        process: &ProcessState,
        slot: SlotId,
        device: &Visible,
        tries: u32,
    ) -> bool {
        // try_lock: never wait (and never deadlock in a forked child) for a best-effort figure.
        let mut cache = None;
        for attempt in 0..tries {
            cache = runtime::try_lock(&NVML_BY_UUID);
            if cache.is_some() {
                break;
            }
            if attempt + 1 < tries {
                std::thread::yield_now();
            }
        }
        let Some(mut cache) = cache else {
            return false;
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
            return false;
        };
        let settled = process.ledger.settle_with_figure(device.region_index, own);
        drop(cache);
        if let Some((before, after)) = settled
            && after != before
        {
            debug!(
                "driver holds {after} bytes beyond our counts on {} (was {before})",
                device.uuid
            );
        }
        true
    }
}

/// The real NVML's calls for one device.
struct Nvml {
    /// An NVML device handle: a pointer into NVML's own static device table.
    device: *mut c_void,
    memory_info: unsafe extern "C" fn(*mut c_void, *mut [u64; 3]) -> u32,
    processes: Option<unsafe extern "C" fn(*mut c_void, *mut u32, *mut ProcessInfoV1) -> u32>,
}

// SAFETY: the handle points into NVML's process-wide device table, and NVML's calls
// are thread-safe; the function pointers are plain code addresses.
unsafe impl Send for Nvml {}

impl Nvml {
    fn card_used(&self) -> Option<u64> {
        let mut info = [0u64; 3];
        // SAFETY: nvmlMemory_t is three u64 (total, free, used), written to our own array.
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
    // SAFETY: the symbol types are NVML's C declarations; nvmlInit_v2 takes nothing, the
    // UUID lookup gets a NUL-terminated string and our own out-pointer.
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
