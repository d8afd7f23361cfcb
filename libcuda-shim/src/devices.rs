//! Device discovery: which of the host's cards the container sees, in config order
//! (renumbered from 0), each with its quotas, and the device a call lands on.
//!
//! The real driver is asked once it is initialised (`cuDeviceGetCount` fails before
//! `cuInit`): each card's handle, UUID, PCI location and memory. A config device names a
//! card by UUID or by `index:` (which counts in PCI order, as nvidia-smi and NVML do);
//! one not on the host stays hidden, with one stderr line.

use vgpu_contract::{CoreMode, DeviceQuota, DeviceSelector};
use vgpu_shimgen::runtime;

use crate::cuda::*;
use crate::state::Enforcer;
use crate::{debug, real};

/// A device the container may use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Visible {
    /// The real driver's handle of the card.
    pub handle: CUdevice,
    /// `GPU-...` as NVML and nvidia-smi print it.
    pub uuid: String,
    /// Index of this device in the config and in the usage region.
    pub region_index: usize,
    /// The quota (the card's memory when the config sets none).
    pub memory_limit: u64,
    /// Percent of the card's SMs; `None` is no throttling.
    pub core_limit: Option<u32>,
    /// Hard or soft compute limit.
    pub core_mode: CoreMode,
    /// Soft mode's ceiling.
    pub core_ceiling: Option<u32>,
}

/// Which device an allocation lands on.
pub enum LandsOn {
    /// The calling thread's current context.
    Current,
    /// A device named by the call (a VMM location, a pool's device).
    Device(CUdevice),
}

/// A card as the real driver describes it.
#[derive(Clone, Debug)]
struct Card {
    handle: CUdevice,
    uuid: String,
    pci: (i32, i32, i32),
    total: u64,
}

impl Enforcer {
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
        let cards = host_cards()?;
        let (visible, absent) = select(&cards, &self.config.devices);
        for selector in absent {
            runtime::notice(
                "cuda",
                format_args!("config device {selector} is not on this host; it stays hidden"),
            );
        }
        debug!("{} of {} devices visible", visible.len(), cards.len());
        Some(visible)
    }

    /// The visible device behind a real handle.
    pub fn visible(&self, handle: CUdevice) -> Option<&Visible> {
        self.devices()?
            .iter()
            .find(|device| device.handle == handle)
    }

    /// The visible device of the calling thread's current context.
    pub fn current(&self) -> Result<&Visible, CUresult> {
        let get_device = real!(cuCtxGetDevice as fn(*mut CUdevice) -> CUresult);
        let mut handle = 0;
        // SAFETY: our own out-pointer, to the real cuCtxGetDevice.
        let result = unsafe { get_device(&mut handle) };
        if result != CUDA_SUCCESS {
            return Err(result);
        }
        self.visible(handle).ok_or(CUDA_ERROR_INVALID_DEVICE)
    }

    /// The visible device `lands_on` names: CUDA_ERROR_INVALID_DEVICE for a hidden one,
    /// the driver's own error when there is no current context, CUDA_ERROR_NOT_INITIALIZED
    /// for a named device before cuInit.
    pub fn device_for(&self, lands_on: &LandsOn) -> Result<&Visible, CUresult> {
        match lands_on {
            LandsOn::Current => self.current(),
            LandsOn::Device(handle) => {
                if self.devices().is_none() {
                    return Err(CUDA_ERROR_NOT_INITIALIZED);
                }
                self.visible(*handle).ok_or(CUDA_ERROR_INVALID_DEVICE)
            }
        }
    }
}

/// Every card the real driver lists; `None` before cuInit.
fn host_cards() -> Option<Vec<Card>> {
    let get_count = real!(cuDeviceGetCount as fn(*mut i32) -> CUresult);
    let get = real!(cuDeviceGet as fn(*mut CUdevice, i32) -> CUresult);
    let mut count = 0;
    // SAFETY: our own out-pointer, to the real cuDeviceGetCount.
    if unsafe { get_count(&mut count) } != CUDA_SUCCESS {
        return None;
    }
    let mut cards = Vec::new();
    for ordinal in 0..count {
        let mut handle = 0;
        // SAFETY: our own out-pointer and an ordinal below the count, to the real cuDeviceGet.
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
    Some(cards)
}

/// The config's devices among `cards`, in config order (each at most once), and the
/// selectors no card answers to.
fn select(cards: &[Card], quotas: &[DeviceQuota]) -> (Vec<Visible>, Vec<DeviceSelector>) {
    let mut by_pci: Vec<usize> = (0..cards.len()).collect();
    by_pci.sort_by_key(|&i| cards[i].pci);
    let mut visible: Vec<Visible> = Vec::new();
    let mut absent = Vec::new();
    for (region_index, quota) in quotas.iter().enumerate() {
        let selector = quota.selector();
        let found = match &selector {
            DeviceSelector::Uuid(uuid) => cards
                .iter()
                .position(|card| card.uuid.eq_ignore_ascii_case(uuid.trim())),
            DeviceSelector::Index(index) => by_pci.get(*index as usize).copied(),
        };
        let Some(position) = found else {
            absent.push(selector);
            continue;
        };
        let card = &cards[position];
        if visible.iter().any(|v| v.handle == card.handle) {
            continue;
        }
        visible.push(Visible {
            handle: card.handle,
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
    (visible, absent)
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` of a real device.
pub fn device_uuid(handle: CUdevice) -> Option<String> {
    let get_uuid = real!(cuDeviceGetUuid_v2 as fn(*mut CUuuid, CUdevice) -> CUresult);
    let mut uuid = CUuuid::default();
    // SAFETY: our own out-pointer, to the real cuDeviceGetUuid_v2.
    if unsafe { get_uuid(&mut uuid, handle) } != CUDA_SUCCESS {
        let get_uuid_v1 = real!(cuDeviceGetUuid as fn(*mut CUuuid, CUdevice) -> CUresult);
        // SAFETY: our own out-pointer, to the real cuDeviceGetUuid.
        if unsafe { get_uuid_v1(&mut uuid, handle) } != CUDA_SUCCESS {
            return None;
        }
    }
    Some(format_uuid(&uuid.bytes))
}

/// The `GPU-` form of a 16-byte UUID.
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
        // SAFETY: our own out-pointer, to the real cuDeviceGetAttribute.
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
    // SAFETY: our own out-pointer, to the real cuDeviceTotalMem_v2.
    unsafe { total_mem(&mut bytes, handle) };
    bytes as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_contract::ByteSize;

    const GIB: u64 = 1 << 30;

    fn card(handle: CUdevice, uuid: &str, bus: i32) -> Card {
        Card {
            handle,
            uuid: uuid.to_string(),
            pci: (0, bus, 0),
            total: 80 * GIB,
        }
    }

    fn by_uuid(uuid: &str) -> DeviceQuota {
        DeviceQuota {
            uuid: Some(uuid.to_string()),
            ..DeviceQuota::unlimited_index(0)
        }
    }

    #[test]
    fn config_order_renumbers_and_index_counts_in_pci_order() {
        // The driver lists the cards out of PCI order.
        let cards = [
            card(10, "GPU-b", 0x41),
            card(11, "GPU-a", 0x11),
            card(12, "GPU-c", 0x81),
        ];
        let mut second = DeviceQuota::unlimited_index(0);
        second.memory_limit = Some(ByteSize(4 * GIB));
        second.core_limit = Some(30);
        let (visible, absent) = select(&cards, &[by_uuid(" gpu-C "), second]);
        assert!(absent.is_empty());
        let handles: Vec<_> = visible.iter().map(|v| (v.handle, v.region_index)).collect();
        assert_eq!(handles, [(12, 0), (11, 1)], "index:0 is the lowest PCI bus");
        assert_eq!(
            visible[0].memory_limit,
            80 * GIB,
            "no limit: the card's memory"
        );
        assert_eq!(visible[1].memory_limit, 4 * GIB);
        assert_eq!(visible[1].core_limit, Some(30));
    }

    #[test]
    fn absent_and_repeated_devices_stay_hidden() {
        let cards = [card(10, "GPU-a", 1)];
        let mut full = DeviceQuota::unlimited_index(0);
        full.core_limit = Some(100);
        let (visible, absent) = select(
            &cards,
            &[
                by_uuid("GPU-zz"),
                full,
                DeviceQuota::unlimited_index(0),
                DeviceQuota::unlimited_index(3),
            ],
        );
        assert_eq!(visible.len(), 1, "the same card twice is one device");
        assert_eq!(visible[0].region_index, 1);
        assert_eq!(visible[0].core_limit, None, "100% is no throttling");
        assert_eq!(
            absent,
            [
                DeviceSelector::Uuid("GPU-zz".into()),
                DeviceSelector::Index(3)
            ]
        );
    }

    #[test]
    fn uuids_print_as_nvml_does() {
        let bytes = [
            0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab,
            0xcd, 0xef,
        ];
        assert_eq!(
            format_uuid(&bytes),
            "GPU-12345678-9abc-def0-0123-456789abcdef"
        );
    }
}
