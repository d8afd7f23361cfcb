//! Device visibility: which of the host's GPUs the container sees through NVML, in
//! config order (renumbered from 0), each with its quotas. Resolved from the real NVML
//! once it is initialised (`nvmlDeviceGetCount_v2` fails before `nvmlInit`): a config
//! device is looked up by UUID, or by host index; one NVML does not find stays hidden.

use std::ffi::{CString, c_char};

use vgpu_contract::{DeviceQuota, DeviceSelector};

use crate::nvml::*;
use crate::state::View;
use crate::{debug, real};

/// A device the container may see.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VisibleGpu {
    /// The real NVML's handle.
    pub handle: usize,
    /// Index of this device in the config and in the usage region.
    pub region_index: usize,
    /// The quota; `None` means the card's own memory.
    pub memory_limit: Option<u64>,
    /// Percent of the card's SMs; `None` is no throttling.
    pub core_limit: Option<u32>,
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
        let mut total = 0u32;
        // SAFETY: our own out-pointer, to the real nvmlDeviceGetCount_v2 (which fails
        // with UNINITIALIZED before nvmlInit).
        if unsafe { count(&mut total) } != NVML_SUCCESS {
            return None;
        }
        Some(select(&self.config.devices, handle_of))
    }

    /// The visible device behind a real handle, and its container index.
    pub fn find(&self, handle: NvmlDevice) -> Option<(usize, &VisibleGpu)> {
        self.devices()?
            .iter()
            .enumerate()
            .find(|(_, device)| device.handle == handle as usize)
    }
}

/// The real NVML's handle for a config selector.
fn handle_of(selector: &DeviceSelector) -> Result<usize, NvmlReturn> {
    let by_uuid =
        real!(nvmlDeviceGetHandleByUUID as fn(*const c_char, *mut NvmlDevice) -> NvmlReturn);
    let by_index = real!(nvmlDeviceGetHandleByIndex_v2 as fn(u32, *mut NvmlDevice) -> NvmlReturn);
    let mut handle: NvmlDevice = std::ptr::null_mut();
    let result = match selector {
        DeviceSelector::Uuid(uuid) => match CString::new(uuid.trim()) {
            // SAFETY: our own C string and out-pointer, to the real
            // nvmlDeviceGetHandleByUUID.
            Ok(name) => unsafe { by_uuid(name.as_ptr(), &mut handle) },
            Err(_) => NVML_ERROR_INVALID_ARGUMENT,
        },
        // SAFETY: our own out-pointer, to the real nvmlDeviceGetHandleByIndex_v2.
        DeviceSelector::Index(index) => unsafe { by_index(*index, &mut handle) },
    };
    match result {
        NVML_SUCCESS if !handle.is_null() => Ok(handle as usize),
        NVML_SUCCESS => Err(NVML_ERROR_NOT_FOUND),
        error => Err(error),
    }
}

/// The config's devices that `lookup` finds, in config order, each handle once.
fn select(
    quotas: &[DeviceQuota],
    mut lookup: impl FnMut(&DeviceSelector) -> Result<usize, NvmlReturn>,
) -> Vec<VisibleGpu> {
    let mut visible: Vec<VisibleGpu> = Vec::new();
    for (region_index, quota) in quotas.iter().enumerate() {
        let selector = quota.selector();
        let handle = match lookup(&selector) {
            Ok(handle) if !visible.iter().any(|v| v.handle == handle) => handle,
            Ok(_) => {
                debug!("config device {selector} is listed twice");
                continue;
            }
            Err(result) => {
                debug!("config device {selector} not found in NVML ({result})");
                continue;
            }
        };
        visible.push(VisibleGpu {
            handle,
            region_index,
            memory_limit: quota.memory_limit.map(|limit| limit.bytes()),
            core_limit: quota.effective_core_limit(),
        });
    }
    visible
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_contract::ByteSize;

    fn by_uuid(uuid: &str) -> DeviceQuota {
        DeviceQuota {
            uuid: Some(uuid.to_string()),
            ..DeviceQuota::unlimited_index(0)
        }
    }

    /// A host with GPU-a (handle 0xa0, index 0) and GPU-b (0xb0, index 1).
    fn host(selector: &DeviceSelector) -> Result<usize, NvmlReturn> {
        match selector {
            DeviceSelector::Uuid(uuid) if uuid == "GPU-a" => Ok(0xa0),
            DeviceSelector::Uuid(uuid) if uuid == "GPU-b" => Ok(0xb0),
            DeviceSelector::Index(0) => Ok(0xa0),
            DeviceSelector::Index(1) => Ok(0xb0),
            _ => Err(NVML_ERROR_NOT_FOUND),
        }
    }

    #[test]
    fn devices_are_renumbered_in_config_order() {
        let mut second = DeviceQuota::unlimited_index(0);
        second.memory_limit = Some(ByteSize(4 << 30));
        second.core_limit = Some(25);
        let visible = select(&[by_uuid("GPU-b"), second], host);
        assert_eq!(
            visible,
            [
                VisibleGpu {
                    handle: 0xb0,
                    region_index: 0,
                    memory_limit: None,
                    core_limit: None
                },
                VisibleGpu {
                    handle: 0xa0,
                    region_index: 1,
                    memory_limit: Some(4 << 30),
                    core_limit: Some(25)
                },
            ],
            "the host's index 1 is the container's 0"
        );
    }

    #[test]
    fn missing_and_repeated_devices_stay_hidden() {
        let visible = select(
            &[
                by_uuid("GPU-zz"),
                DeviceQuota::unlimited_index(1),
                by_uuid("GPU-b"),
                DeviceQuota::unlimited_index(7),
            ],
            host,
        );
        assert_eq!(visible.len(), 1);
        assert_eq!((visible[0].handle, visible[0].region_index), (0xb0, 1));
    }
}
