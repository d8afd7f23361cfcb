//! What the NVML shim knows: the real NVML, the policy from the config, the usage region
//! and the visible devices (resolved from the real NVML once it is initialised).

use std::ffi::{CString, c_char, c_void};
use std::sync::OnceLock;

use vgpu_common::config::Config;
use vgpu_common::region::{ProcessUsage, Region};
use vgpu_common::{DeviceSelector, UtilizationScale};
use vgpu_shimgen::runtime::{self, RealLibrary, StartConfig};

use crate::forward::{self, SLOTS};
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
    region: Option<Region>,
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
        &forward::NAMES,
        &SLOTS,
        |index| forward::HOOKS[index].is_some(),
        stubs::missing_in_driver as *mut c_void,
    );
    let policy = match config {
        StartConfig::Absent => Policy::Passthrough,
        StartConfig::Broken => Policy::FailClosed,
        StartConfig::Found(config, path) => {
            let region_path = config.resolved_region_path(&path);
            let region = match Region::open(&region_path, &config.region_devices()) {
                Ok((region, _)) => Some(region),
                Err(_) => match Region::open_existing(&region_path) {
                    Ok(region) => Some(region),
                    Err(err) => {
                        runtime::notice("nvml", format_args!("{err}; memory used reads 0"));
                        None
                    }
                },
            };
            Policy::Apply(Box::new(View {
                config,
                region,
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

    /// Bytes the container holds on a device.
    pub fn used(&self, device: &VisibleGpu) -> u64 {
        match &self.region {
            Some(region) => {
                region.reclaim_dead();
                region.device_used(device.region_index)
            }
            None => 0,
        }
    }

    /// The container's live processes.
    pub fn processes(&self) -> Vec<ProcessUsage> {
        match &self.region {
            Some(region) => {
                region.reclaim_dead();
                region.processes()
            }
            None => Vec::new(),
        }
    }

    /// A host PID (as NVML reports it) mapped to the container's PID, if it is ours.
    pub fn container_pid(&self, processes: &[ProcessUsage], host_pid: u32) -> Option<u32> {
        processes
            .iter()
            .find(|p| {
                if p.host_pid != 0 {
                    p.host_pid as u32 == host_pid
                } else {
                    p.pid as u32 == host_pid
                }
            })
            .map(|p| p.pid as u32)
    }

    pub fn utilization_scale(&self) -> UtilizationScale {
        self.config.utilization_scale
    }
}
