//! Device discovery and health, behind [`DeviceSource`]: [`NvmlSource`] reads the cards
//! through nvml-wrapper (the real NVML, or the sim driver's in tests); [`FakeSource`] is
//! a scripted source for unit tests. [`watch_health`] is the health loop both daemons
//! run over a source.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::event::EventSet;

/// One physical card.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CardInfo {
    /// The NVML UUID (`GPU-…`), the stable name of the card in device IDs and configs.
    pub uuid: String,
    /// Host index (NVML enumeration order).
    pub index: u32,
    /// Minor of `/dev/nvidiaN`, when known.
    pub minor: Option<u32>,
    /// Total device memory, bytes.
    pub memory_total: u64,
    /// NUMA node of the card's PCI device, when known.
    pub numa_node: Option<i64>,
}

/// The longest wait for critical events between two looks at the stop flag.
const EVENT_SLICE: Duration = Duration::from_millis(500);

/// Watches the health of the cards `uuids` until `stop` is set. Waits for critical
/// events in slices of at most 500 ms (a panicking source counts as no event); a card
/// hit stays unhealthy until the process restarts. Every `interval`, and on every pass
/// once a card was hit, hands `report` each card's health in order: the critical
/// event's reason, else what [`DeviceSource::probe`] says.
pub fn watch_health(
    source: &dyn DeviceSource,
    uuids: &[String],
    interval: Duration,
    stop: &AtomicBool,
    mut report: impl FnMut(Vec<(String, Result<(), String>)>),
) {
    let slice = interval.min(EVENT_SLICE);
    let mut critical: BTreeMap<String, String> = BTreeMap::new();
    let mut last_probe = std::time::Instant::now();
    while !stop.load(Ordering::SeqCst) {
        let hit =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| source.wait_critical(slice)))
                .unwrap_or_default();
        critical.extend(hit);
        if last_probe.elapsed() < interval && critical.is_empty() {
            continue;
        }
        last_probe = std::time::Instant::now();
        let health = uuids
            .iter()
            .map(|uuid| {
                let health = match critical.get(uuid) {
                    Some(reason) => Err(reason.clone()),
                    None => source.probe(uuid),
                };
                (uuid.clone(), health)
            })
            .collect();
        report(health);
    }
}

/// Where cards and their health come from.
pub trait DeviceSource: Send + Sync + 'static {
    /// The cards present now.
    fn discover(&self) -> anyhow::Result<Vec<CardInfo>>;

    /// `Ok` while the card answers; the reason when it does not (fell off the bus).
    fn probe(&self, uuid: &str) -> Result<(), String>;

    /// Blocks up to `timeout` for critical errors; the cards hit and why. Sources
    /// without events just wait.
    fn wait_critical(&self, timeout: Duration) -> Vec<(String, String)> {
        std::thread::sleep(timeout);
        Vec::new()
    }
}

/// A scripted source: fixed cards, failures set by the test.
#[derive(Default)]
pub struct FakeSource {
    cards: Vec<CardInfo>,
    failures: Mutex<HashMap<String, String>>,
}

impl FakeSource {
    /// A source of exactly `cards`, all healthy until a test says otherwise.
    pub fn new(cards: Vec<CardInfo>) -> FakeSource {
        FakeSource {
            cards,
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// `count` cards of `memory` bytes, UUIDs `GPU-fake-<i>`.
    pub fn uniform(count: u32, memory: u64) -> FakeSource {
        FakeSource::new(
            (0..count)
                .map(|index| CardInfo {
                    uuid: format!("GPU-fake-{index}"),
                    index,
                    minor: Some(index),
                    memory_total: memory,
                    numa_node: None,
                })
                .collect(),
        )
    }

    /// Makes `probe` fail for `uuid` with `reason`.
    pub fn fail(&self, uuid: &str, reason: &str) {
        if let Ok(mut failures) = self.failures.lock() {
            failures.insert(uuid.to_string(), reason.to_string());
        }
    }

    /// Makes `uuid` answer again.
    pub fn recover(&self, uuid: &str) {
        if let Ok(mut failures) = self.failures.lock() {
            failures.remove(uuid);
        }
    }
}

impl DeviceSource for FakeSource {
    fn discover(&self) -> anyhow::Result<Vec<CardInfo>> {
        Ok(self.cards.clone())
    }

    fn probe(&self, uuid: &str) -> Result<(), String> {
        if !self.cards.iter().any(|card| card.uuid == uuid) {
            return Err(format!("no card {uuid}"));
        }
        match self.failures.lock() {
            Ok(failures) => failures
                .get(uuid)
                .map_or(Ok(()), |reason| Err(reason.clone())),
            Err(_) => Ok(()),
        }
    }
}

/// Xids that an application causes and that leave the card usable (the NVIDIA device
/// plugin's list): these do not make a card unhealthy.
const APPLICATION_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];

/// Cards read through NVML.
pub struct NvmlSource {
    nvml: &'static Nvml,
    /// Critical-Xid event set; `None` where the driver does not support events.
    events: Mutex<Option<EventSet<'static>>>,
}

/// Initialises NVML from `library` (a file name searched by the loader, or a path);
/// the error names the library and NVML's reason. Both daemons open NVML this way.
pub fn open_nvml(library: &Path) -> anyhow::Result<Nvml> {
    Nvml::builder()
        .lib_path(library.as_os_str())
        .init()
        .map_err(|err| anyhow::anyhow!("cannot initialise NVML from {}: {err}", library.display()))
}

impl NvmlSource {
    /// Loads NVML from `library` (a file name searched by the loader, or a path).
    ///
    /// The handle lives as long as the process (it is leaked so the event set can
    /// borrow it), which is what a daemon wants anyway.
    pub fn open(library: &Path) -> anyhow::Result<NvmlSource> {
        let nvml = open_nvml(library)?;
        let nvml: &'static Nvml = Box::leak(Box::new(nvml));
        let events = NvmlSource::register_critical_events(nvml);
        Ok(NvmlSource {
            nvml,
            events: Mutex::new(events),
        })
    }

    fn register_critical_events(nvml: &'static Nvml) -> Option<EventSet<'static>> {
        let mut set = nvml.create_event_set().ok()?;
        let count = nvml.device_count().ok()?;
        let mut registered = 0;
        for index in 0..count {
            let Ok(device) = nvml.device_by_index(index) else {
                continue;
            };
            match device.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
                Ok(back) => {
                    set = back;
                    registered += 1;
                }
                Err(err) => {
                    tracing::info!(index, error = %err.error, "critical-Xid events not available for this card");
                    set = nvml.create_event_set().ok()?;
                }
            }
        }
        (registered > 0).then_some(set)
    }
}

fn sysfs_numa_node(bus_id: &str) -> Option<i64> {
    // NVML writes `00000000:3B:00.0` (8-digit domain); sysfs uses `0000:3b:00.0`.
    let lower = bus_id.to_ascii_lowercase();
    let (domain, rest) = lower.split_once(':')?;
    let short = format!("{:04x}:{rest}", u32::from_str_radix(domain, 16).ok()?);
    let text = std::fs::read_to_string(
        Path::new("/sys/bus/pci/devices")
            .join(short)
            .join("numa_node"),
    )
    .ok()?;
    text.trim().parse::<i64>().ok().filter(|node| *node >= 0)
}

impl DeviceSource for NvmlSource {
    fn discover(&self) -> anyhow::Result<Vec<CardInfo>> {
        let count = self
            .nvml
            .device_count()
            .map_err(|err| anyhow::anyhow!("NVML device count: {err}"))?;
        let mut cards = Vec::new();
        for index in 0..count {
            let device = self
                .nvml
                .device_by_index(index)
                .map_err(|err| anyhow::anyhow!("NVML device {index}: {err}"))?;
            let uuid = device
                .uuid()
                .map_err(|err| anyhow::anyhow!("NVML device {index} UUID: {err}"))?;
            let memory_total = device
                .memory_info()
                .map_err(|err| anyhow::anyhow!("NVML device {index} memory: {err}"))?
                .total;
            cards.push(CardInfo {
                uuid,
                index,
                minor: device.minor_number().ok(),
                memory_total,
                numa_node: device
                    .pci_info()
                    .ok()
                    .and_then(|pci| sysfs_numa_node(&pci.bus_id)),
            });
        }
        Ok(cards)
    }

    fn probe(&self, uuid: &str) -> Result<(), String> {
        self.nvml
            .device_by_uuid(uuid)
            .map(|_| ())
            .map_err(|err| format!("NVML lookup by UUID failed: {err}"))
    }

    fn wait_critical(&self, timeout: Duration) -> Vec<(String, String)> {
        let Ok(guard) = self.events.lock() else {
            std::thread::sleep(timeout);
            return Vec::new();
        };
        let Some(set) = guard.as_ref() else {
            drop(guard);
            std::thread::sleep(timeout);
            return Vec::new();
        };
        let millis = u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX);
        match set.wait(millis) {
            Ok(event) => {
                let xid = event.event_data.map(|xid| match xid {
                    nvml_wrapper::enums::event::XidError::Value(value) => value,
                    nvml_wrapper::enums::event::XidError::Unknown => 0,
                });
                if xid.is_some_and(|xid| APPLICATION_XIDS.contains(&xid)) {
                    return Vec::new();
                }
                match event.device.uuid() {
                    Ok(uuid) => vec![(uuid, format!("critical Xid error {}", xid.unwrap_or(0)))],
                    Err(_) => Vec::new(),
                }
            }
            Err(NvmlError::Timeout) => Vec::new(),
            Err(err) => {
                tracing::warn!(error = %err, "NVML event wait failed; falling back to probing");
                drop(guard);
                if let Ok(mut guard) = self.events.lock() {
                    *guard = None;
                }
                Vec::new()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_source_fails_and_recovers() {
        let source = FakeSource::uniform(2, 4 << 30);
        assert_eq!(source.discover().expect("discover").len(), 2);
        assert!(source.probe("GPU-fake-1").is_ok());
        source.fail("GPU-fake-1", "fell off the bus");
        assert_eq!(source.probe("GPU-fake-1"), Err("fell off the bus".into()));
        source.recover("GPU-fake-1");
        assert!(source.probe("GPU-fake-1").is_ok());
        assert!(source.probe("GPU-nope").is_err());
    }
}
