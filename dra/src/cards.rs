//! The cards as the ResourceSlice describes them: the device plugin's discovery
//! ([`vgpu_node_agent::devices::DeviceSource`]: UUID, index, minor, memory, NUMA node, health) plus
//! what only the slice needs (product name, compute capability, driver version), read
//! through NVML by [`NvmlDetails`], or left out by [`NoDetails`].

use std::collections::BTreeMap;
use std::path::Path;

use nvml_wrapper::Nvml;
use vgpu_kube::slices::GpuDevice;
use vgpu_node_agent::devices::CardInfo;

/// What the slice adds to a [`CardInfo`]; a `None` leaves that attribute out of the
/// slice.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Details {
    /// NVML's product name (`NVIDIA H200`): the `productName` attribute.
    pub product_name: Option<String>,
    /// CUDA compute capability (major, minor): the `computeCapability` attribute.
    pub compute_capability: Option<(u32, u32)>,
    /// The driver version as NVML writes it (`580.159.04`): the `driverVersion`
    /// attribute.
    pub driver_version: Option<String>,
}

/// Where [`Details`] come from.
pub trait Describe: Send + Sync + 'static {
    /// The details of the card with this NVML UUID; what cannot be read is `None`
    /// (never an error: the slice is published without it).
    fn details(&self, uuid: &str) -> Details;
}

/// No details (scripted cards in tests).
pub struct NoDetails;

impl Describe for NoDetails {
    fn details(&self, _: &str) -> Details {
        Details::default()
    }
}

/// Details read through NVML (the real library, or the sim driver's).
pub struct NvmlDetails {
    nvml: Nvml,
}

impl NvmlDetails {
    /// Initialises NVML from `library` (a name the loader resolves, or a path); fails
    /// with the library and NVML's error where it cannot.
    pub fn open(library: &Path) -> anyhow::Result<NvmlDetails> {
        Ok(NvmlDetails {
            nvml: vgpu_node_agent::devices::open_nvml(library)?,
        })
    }
}

impl Describe for NvmlDetails {
    fn details(&self, uuid: &str) -> Details {
        let driver_version = self.nvml.sys_driver_version().ok();
        let Ok(device) = self.nvml.device_by_uuid(uuid) else {
            return Details {
                driver_version,
                ..Details::default()
            };
        };
        Details {
            product_name: device.name().ok(),
            compute_capability: device.cuda_compute_capability().ok().and_then(|cc| {
                Some((u32::try_from(cc.major).ok()?, u32::try_from(cc.minor).ok()?))
            }),
            driver_version,
        }
    }
}

/// The slice's view of `cards`, with `unhealthy` naming the cards that fail and why.
pub fn gpu_devices(
    cards: &[CardInfo],
    details: &BTreeMap<String, Details>,
    unhealthy: &BTreeMap<String, String>,
) -> Vec<GpuDevice> {
    cards
        .iter()
        .map(|card| {
            let extra = details.get(&card.uuid).cloned().unwrap_or_default();
            GpuDevice {
                uuid: card.uuid.clone(),
                index: card.index,
                minor: card.minor,
                product_name: extra.product_name,
                memory_bytes: card.memory_total,
                compute_capability: extra.compute_capability,
                numa_node: card.numa_node,
                driver_version: extra.driver_version,
                unhealthy: unhealthy.get(&card.uuid).cloned(),
            }
        })
        .collect()
}
