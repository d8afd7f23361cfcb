//! What the NVML shim knows: the real NVML, the policy from the config, the usage region
//! (read only: a private copy per query, so a truncated or replaced file can neither
//! crash nor stall a monitoring tool) and the visible devices (resolved from the real
//! NVML once it is initialised).

use std::ffi::{CString, c_char, c_void};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use vgpu_abi::nvml::ProcessInfoV1;
use vgpu_common::config::Config;
use vgpu_common::process;
use vgpu_common::region::{self, ProcessUsage};
use vgpu_common::snapshot::RegionSnapshot;
use vgpu_common::{DeviceSelector, UtilizationScale};
use vgpu_shimgen::runtime::{self, RealLibrary, StartConfig};

use crate::exports::{self, SLOTS};
use crate::nvml::*;
use crate::{debug, real, stubs};

/// What the config says the shim should do; `Apply` shows the container's view.
pub type Policy = runtime::Policy<View>;

pub struct Shim {
    pub real: Option<RealLibrary>,
    pub policy: Policy,
}

pub struct View {
    pub config: Config,
    region_path: PathBuf,
    devices: OnceLock<Vec<VisibleGpu>>,
}

/// A device the container may see.
#[derive(Clone, Debug)]
pub struct VisibleGpu {
    pub handle: usize,
    pub region_index: usize,
    /// The quota; `None` means the card's own memory.
    pub memory_limit: Option<u64>,
    pub core_limit: Option<u32>,
}

static SHIM: OnceLock<Shim> = OnceLock::new();

pub fn shim() -> &'static Shim {
    SHIM.get_or_init(load)
}

fn load() -> Shim {
    let start = runtime::Start {
        shim: "nvml",
        library: "libnvidia-ml.so.1",
        unloaded_effect: "every NVML call returns NVML_ERROR_DRIVER_NOT_LOADED",
        fail_closed_effect: "no GPU is visible (fail-closed)",
    };
    let (real, config, _) = start.run(
        &exports::NAMES,
        &SLOTS,
        |index| exports::HOOKS[index].is_some(),
        stubs::missing_in_driver as *mut c_void,
    );
    let policy = match config {
        StartConfig::Absent => Policy::Passthrough,
        StartConfig::Broken => Policy::FailClosed,
        StartConfig::Found(config, path) => {
            let region_path = config.resolved_region_path(&path);
            Policy::Apply(Box::new(View {
                config,
                region_path,
                devices: OnceLock::new(),
            }))
        }
    };
    Shim { real, policy }
}

/// `Ok(None)` to forward, `Ok(Some(view))` to virtualize, `Err(())` when failing closed.
pub fn view() -> Result<Option<&'static View>, ()> {
    match &shim().policy {
        Policy::Passthrough => Ok(None),
        Policy::FailClosed => Err(()),
        Policy::Apply(view) => Ok(Some(view)),
    }
}

/// This process's PID namespace (0 when unreadable).
fn my_pid_namespace() -> u64 {
    process::pid_namespace_in(Path::new("/proc"), "self").unwrap_or(0)
}

impl View {
    /// The visible devices; `None` until the real NVML is initialised.
    pub fn devices(&self) -> Option<&[VisibleGpu]> {
        if let Some(devices) = self.devices.get() {
            return Some(devices);
        }
        let built = self.discover()?;
        let _ = self.devices.set(built);
        self.devices.get().map(Vec::as_slice)
    }

    fn discover(&self) -> Option<Vec<VisibleGpu>> {
        let count = real!(nvmlDeviceGetCount_v2 as fn(*mut u32) -> NvmlReturn);
        let by_uuid =
            real!(nvmlDeviceGetHandleByUUID as fn(*const c_char, *mut NvmlDevice) -> NvmlReturn);
        let by_index =
            real!(nvmlDeviceGetHandleByIndex_v2 as fn(u32, *mut NvmlDevice) -> NvmlReturn);
        let mut total = 0u32;
        // SAFETY: valid out-pointer; fails with UNINITIALIZED before nvmlInit.
        if unsafe { count(&mut total) } != NVML_SUCCESS {
            return None;
        }
        let mut visible: Vec<VisibleGpu> = Vec::new();
        for (region_index, quota) in self.config.devices.iter().enumerate() {
            let mut handle: NvmlDevice = std::ptr::null_mut();
            let result = match quota.selector() {
                DeviceSelector::Uuid(uuid) => match CString::new(uuid.trim()) {
                    // SAFETY: valid C string and out-pointer.
                    Ok(name) => unsafe { by_uuid(name.as_ptr(), &mut handle) },
                    Err(_) => NVML_ERROR_INVALID_ARGUMENT,
                },
                // SAFETY: valid out-pointer.
                DeviceSelector::Index(index) => unsafe { by_index(index, &mut handle) },
            };
            if result != NVML_SUCCESS
                || handle.is_null()
                || visible.iter().any(|v| v.handle == handle as usize)
            {
                debug!(
                    "config device {} not found in NVML ({result})",
                    quota.selector()
                );
                continue;
            }
            visible.push(VisibleGpu {
                handle: handle as usize,
                region_index,
                memory_limit: quota.memory_limit.map(|limit| limit.bytes()),
                core_limit: quota.effective_core_limit(),
            });
        }
        Some(visible)
    }

    /// The visible device behind a real handle.
    pub fn find(&self, handle: NvmlDevice) -> Option<(usize, &VisibleGpu)> {
        self.devices()?
            .iter()
            .enumerate()
            .find(|(_, device)| device.handle == handle as usize)
    }

    /// Bytes the container holds on a device: per live process, what the usage region
    /// counts or, where the real NVML lists the process with more, NVML's own figure
    /// (memory the driver loaded after the process last reconciled).
    pub fn used(&self, device: &VisibleGpu) -> u64 {
        let processes = self.processes();
        let my_ns = my_pid_namespace();
        let listed = real_processes(device.handle as NvmlDevice);
        processes
            .iter()
            .map(|process| {
                let counted = process.used.get(device.region_index).copied().unwrap_or(0);
                let reported = listed
                    .iter()
                    .filter(|entry| {
                        region::nvml_match(std::slice::from_ref(process), entry.pid, my_ns)
                            .is_some()
                    })
                    .map(|entry| entry.used_gpu_memory.min(region::MAX_COUNT))
                    .max()
                    .unwrap_or(0);
                counted.max(reported)
            })
            .fold(0u64, u64::saturating_add)
    }

    /// The container's live processes: a private copy of the usage region, without the
    /// processes this namespace can tell are gone. None when the region cannot be read
    /// (missing, damaged, not a regular file).
    pub fn processes(&self) -> Vec<ProcessUsage> {
        match RegionSnapshot::read(&self.region_path) {
            Ok(snapshot) => {
                let my_ns = my_pid_namespace();
                let mut processes = snapshot.processes();
                processes.retain(|process| !region::is_dead(process, my_ns));
                processes
            }
            Err(err) => {
                debug!("{err}; the container's usage reads 0");
                Vec::new()
            }
        }
    }

    /// An NVML process-list PID mapped to the container's PID, if it is one of ours.
    pub fn container_pid(&self, processes: &[ProcessUsage], nvml_pid: u32) -> Option<u32> {
        region::nvml_match(processes, nvml_pid, my_pid_namespace()).map(|p| p.pid as u32)
    }

    pub fn utilization_scale(&self) -> UtilizationScale {
        self.config.utilization_scale
    }
}

/// The real NVML's compute process list of a device (empty on any error).
fn real_processes(device: NvmlDevice) -> Vec<ProcessInfoV1> {
    let list = real!(
        nvmlDeviceGetComputeRunningProcesses
            as fn(NvmlDevice, *mut u32, *mut ProcessInfoV1) -> NvmlReturn
    );
    let mut capacity = 64u32;
    loop {
        let mut entries = vec![ProcessInfoV1::default(); capacity as usize];
        let mut count = capacity;
        // SAFETY: `entries` holds `count` records of nvmlProcessInfo_v1_t, the layout of
        // the unversioned call.
        match unsafe { list(device, &mut count, entries.as_mut_ptr()) } {
            NVML_SUCCESS => {
                entries.truncate((count as usize).min(entries.len()));
                return entries;
            }
            NVML_ERROR_INSUFFICIENT_SIZE if capacity < 4096 => capacity = count.max(capacity * 2),
            _ => return Vec::new(),
        }
    }
}
