//! The node's ResourceSlices: one pool named after the node, one device per card,
//! each multi-allocatable (`allowMultipleAllocations: true`) with two consumable
//! capacities (KEP-5075):
//!
//! * `cores`: 100 per card, request policy default 100, valid range min 1 step 1;
//! * `memory`: the card's bytes, request policy default and valid range in steps of
//!   256Mi, so `tencent.com/vcuda-memory` units carry over.
//!
//! A request that names neither capacity therefore takes the whole card. Attributes
//! (qualified by the driver name in CEL: `device.attributes["<driver>"].productName`):
//! `uuid`, `index`, `minor`, `productName`, `computeCapability`, `numaNode`,
//! `driverVersion`. A capacity and an attribute may not share a name, so the card's
//! memory is the `memory` capacity only.
//!
//! An unhealthy card is tainted `<driver>/unhealthy=true:NoSchedule` (KEP-5055: the
//! scheduler places no new claim on it, running pods are left alone) or, with
//! [`UnhealthyPolicy::Remove`], left out of the slice. Every change bumps the pool's
//! generation in all its slices; at most [`DEVICES_PER_SLICE`] devices go in a slice.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Device, DeviceAttribute, DeviceCapacity,
    DeviceTaint, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, ListParams, PostParams, WatchParams};
use serde::Deserialize;
use tokio::sync::watch;

use crate::quantity;

/// The memory capacity's step: one `tencent.com/vcuda-memory` unit.
pub const MEMORY_STEP: u64 = 256 << 20;
/// Core units per card.
pub const CORES_PER_CARD: u64 = 100;
/// Devices per slice (the API's limit when devices carry taints).
pub const DEVICES_PER_SLICE: usize = 64;

/// What happens to an unhealthy card in the slice.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UnhealthyPolicy {
    /// Keep the device with a NoSchedule taint (KEP-5055; needs the DRADeviceTaints
    /// feature in the cluster, which drops the taint silently where it is off).
    #[default]
    Taint,
    /// Leave the device out of the slice until it recovers.
    Remove,
}

/// One card as the slice describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuDevice {
    /// The NVML UUID (`GPU-…`), published as the `uuid` attribute.
    pub uuid: String,
    /// Host index (NVML order); the device is named `gpu-<index>`.
    pub index: u32,
    /// The `/dev/nvidia<minor>` number, published as the `minor` attribute; `None` leaves
    /// the attribute out.
    pub minor: Option<u32>,
    /// NVML's product name (`NVIDIA H200`), the `productName` attribute; `None` leaves it
    /// out.
    pub product_name: Option<String>,
    /// Total memory in bytes: the `memory` capacity (its valid range rounds down to
    /// 256Mi steps).
    pub memory_bytes: u64,
    /// (major, minor), published as the `computeCapability` version `major.minor.0`;
    /// `None` leaves it out.
    pub compute_capability: Option<(u32, u32)>,
    /// The card's NUMA node, the `numaNode` attribute; `None` where the host has no NUMA
    /// information.
    pub numa_node: Option<i64>,
    /// As NVML writes it (`580.159.04`); published as a semantic version.
    pub driver_version: Option<String>,
    /// Why the card is unhealthy, if it is.
    pub unhealthy: Option<String>,
}

impl GpuDevice {
    /// The device name in the slice.
    pub fn device_name(&self) -> String {
        device_name(self.index)
    }
}

/// `gpu-<index>`.
pub fn device_name(index: u32) -> String {
    format!("gpu-{index}")
}

/// The taint key of an unhealthy card.
pub fn unhealthy_taint_key(driver: &str) -> String {
    format!("{driver}/unhealthy")
}

/// `580.159.04` → `580.159.4`; `535.54` → `535.54.0`; `None` for anything else.
pub fn semantic_version(text: &str) -> Option<String> {
    let parts: Vec<u64> = text
        .trim()
        .split('.')
        .map(|part| part.parse::<u64>().ok())
        .collect::<Option<_>>()?;
    match parts.as_slice() {
        [major] => Some(format!("{major}.0.0")),
        [major, minor] => Some(format!("{major}.{minor}.0")),
        [major, minor, patch] => Some(format!("{major}.{minor}.{patch}")),
        _ => None,
    }
}

fn string(value: &str) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(value.to_string()),
        ..DeviceAttribute::default()
    }
}

fn int(value: i64) -> DeviceAttribute {
    DeviceAttribute {
        int: Some(value),
        ..DeviceAttribute::default()
    }
}

fn version(value: String) -> DeviceAttribute {
    DeviceAttribute {
        version: Some(value),
        ..DeviceAttribute::default()
    }
}

fn capacity(value: u64, default: u64, min: u64, step: u64, as_bytes: bool) -> DeviceCapacity {
    let write = |v| {
        if as_bytes {
            quantity::bytes(v)
        } else {
            quantity::count(v)
        }
    };
    DeviceCapacity {
        value: write(value),
        request_policy: Some(CapacityRequestPolicy {
            default: Some(write(default)),
            valid_range: Some(CapacityRequestPolicyRange {
                min: write(min),
                step: Some(write(step)),
                max: None,
            }),
            valid_values: None,
        }),
    }
}

/// The slice entry of one card.
pub fn slice_device(driver: &str, card: &GpuDevice) -> Device {
    let mut attributes = BTreeMap::new();
    attributes.insert("uuid".to_string(), string(&card.uuid));
    attributes.insert("index".to_string(), int(i64::from(card.index)));
    if let Some(minor) = card.minor {
        attributes.insert("minor".to_string(), int(i64::from(minor)));
    }
    if let Some(name) = &card.product_name {
        attributes.insert("productName".to_string(), string(name));
    }
    if let Some((major, minor)) = card.compute_capability {
        attributes.insert(
            "computeCapability".to_string(),
            version(format!("{major}.{minor}.0")),
        );
    }
    if let Some(node) = card.numa_node {
        attributes.insert("numaNode".to_string(), int(node));
    }
    if let Some(text) = card.driver_version.as_deref().and_then(semantic_version) {
        attributes.insert("driverVersion".to_string(), version(text));
    }
    // Default and steps of memory are whole 256Mi units; a card's odd tail is unusable.
    let usable = card.memory_bytes / MEMORY_STEP * MEMORY_STEP;
    let mut capacities = BTreeMap::new();
    capacities.insert(
        "cores".to_string(),
        capacity(CORES_PER_CARD, CORES_PER_CARD, 1, 1, false),
    );
    capacities.insert(
        "memory".to_string(),
        capacity(card.memory_bytes, usable, MEMORY_STEP, MEMORY_STEP, true),
    );
    let taints = card.unhealthy.as_ref().map(|_| {
        vec![DeviceTaint {
            key: unhealthy_taint_key(driver),
            value: Some("true".to_string()),
            effect: "NoSchedule".to_string(),
            time_added: None,
        }]
    });
    Device {
        name: card.device_name(),
        allow_multiple_allocations: Some(true),
        attributes: Some(attributes),
        capacity: Some(capacities),
        taints,
        ..Device::default()
    }
}

/// The devices a node publishes, in index order.
pub fn slice_devices(driver: &str, cards: &[GpuDevice], policy: UnhealthyPolicy) -> Vec<Device> {
    let mut sorted: Vec<&GpuDevice> = cards
        .iter()
        .filter(|card| card.unhealthy.is_none() || policy == UnhealthyPolicy::Taint)
        .collect();
    sorted.sort_by_key(|card| card.index);
    sorted
        .into_iter()
        .map(|card| slice_device(driver, card))
        .collect()
}

/// `<node>-<driver>-<k>`.
pub fn slice_name(node: &str, driver: &str, chunk: usize) -> String {
    format!("{node}-{driver}-{chunk}")
}

/// The node's slices at `generation`: the devices in chunks of [`DEVICES_PER_SLICE`]
/// (one empty slice when there is no card, so the pool is known to be empty).
pub fn build_slices(
    driver: &str,
    node: &str,
    generation: i64,
    devices: &[Device],
) -> Vec<ResourceSlice> {
    let chunks: Vec<&[Device]> = if devices.is_empty() {
        vec![&[]]
    } else {
        devices.chunks(DEVICES_PER_SLICE).collect()
    };
    let count = chunks.len() as i64;
    chunks
        .into_iter()
        .enumerate()
        .map(|(chunk, devices)| ResourceSlice {
            metadata: ObjectMeta {
                name: Some(slice_name(node, driver, chunk)),
                ..ObjectMeta::default()
            },
            spec: ResourceSliceSpec {
                driver: driver.to_string(),
                node_name: Some(node.to_string()),
                pool: ResourcePool {
                    name: node.to_string(),
                    generation,
                    resource_slice_count: count,
                },
                devices: Some(devices.to_vec()),
                ..ResourceSliceSpec::default()
            },
        })
        .collect()
}

/// What one publish pass did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Published {
    /// The API already held exactly these slices.
    Unchanged {
        /// The pool's `spec.pool.generation` as found.
        generation: i64,
    },
    /// Slices were created, replaced or deleted; the pool is at this generation.
    Written {
        /// The pool's `spec.pool.generation` after the write.
        generation: i64,
    },
}

/// The devices of a stored slice with what the server adds (taint times) taken out.
fn comparable(devices: Option<&Vec<Device>>) -> Vec<Device> {
    let mut devices = devices.cloned().unwrap_or_default();
    for device in &mut devices {
        for taint in device.taints.iter_mut().flatten() {
            taint.time_added = None;
        }
    }
    devices
}

/// Keeps the node's slices equal to its cards.
pub struct SlicePublisher {
    api: Api<ResourceSlice>,
    driver: String,
    node: String,
    policy: UnhealthyPolicy,
    /// The highest generation this process wrote or saw.
    generation: AtomicI64,
}

impl SlicePublisher {
    /// A publisher of `node`'s pool for `driver` (the DRA driver name, which is also the
    /// slices' `spec.driver`); it writes nothing until asked to publish.
    pub fn new(client: kube::Client, driver: &str, node: &str, policy: UnhealthyPolicy) -> Self {
        SlicePublisher {
            api: Api::all(client),
            driver: driver.to_string(),
            node: node.to_string(),
            policy,
            generation: AtomicI64::new(0),
        }
    }

    /// `spec.nodeName=<node>,spec.driver=<driver>`: the only slices this node touches.
    pub fn field_selector(&self) -> String {
        format!("spec.nodeName={},spec.driver={}", self.node, self.driver)
    }

    /// The node's slices as the API holds them now.
    pub async fn current(&self) -> anyhow::Result<Vec<ResourceSlice>> {
        let list = self
            .api
            .list(&ListParams::default().fields(&self.field_selector()))
            .await
            .map_err(|err| anyhow::anyhow!("cannot list ResourceSlices: {err}"))?;
        // The field selector is the server's job; check it anyway before deleting anything.
        Ok(list
            .items
            .into_iter()
            .filter(|slice| {
                slice.spec.driver == self.driver
                    && slice.spec.node_name.as_deref() == Some(self.node.as_str())
            })
            .collect())
    }

    /// One pass: make the API hold exactly the slices of `cards`. Retries a pass that
    /// lost a race (409) twice.
    pub async fn publish(&self, cards: &[GpuDevice]) -> anyhow::Result<Published> {
        let mut last = None;
        for _ in 0..3 {
            match self.publish_once(cards).await {
                Ok(done) => return Ok(done),
                Err(PassError::Conflict(message)) => {
                    tracing::info!(%message, "ResourceSlice changed under us; publishing again");
                    last = Some(message);
                }
                Err(PassError::Other(err)) => return Err(err),
            }
        }
        anyhow::bail!("ResourceSlices kept changing: {}", last.unwrap_or_default())
    }

    async fn publish_once(&self, cards: &[GpuDevice]) -> Result<Published, PassError> {
        let existing = self.current().await?;
        let devices = slice_devices(&self.driver, cards, self.policy);
        let seen = existing
            .iter()
            .map(|slice| slice.spec.pool.generation)
            .max()
            .unwrap_or(0);
        let known = self.generation.load(Ordering::SeqCst).max(seen);
        let same_generation = existing
            .iter()
            .all(|slice| slice.spec.pool.generation == known);
        let wanted = build_slices(&self.driver, &self.node, known, &devices);
        let matches = same_generation
            && existing.len() == wanted.len()
            && wanted.iter().all(|want| {
                existing.iter().any(|have| {
                    have.metadata.name == want.metadata.name
                        && have.spec.pool == want.spec.pool
                        && comparable(have.spec.devices.as_ref())
                            == comparable(want.spec.devices.as_ref())
                })
            });
        if matches && known > 0 {
            self.generation.store(known, Ordering::SeqCst);
            return Ok(Published::Unchanged { generation: known });
        }
        let generation = known + 1;
        let wanted = build_slices(&self.driver, &self.node, generation, &devices);
        for mut slice in wanted {
            let name = slice.metadata.name.clone().unwrap_or_default();
            match existing
                .iter()
                .find(|have| have.metadata.name.as_deref() == Some(name.as_str()))
            {
                Some(have) => {
                    slice.metadata.resource_version = have.metadata.resource_version.clone();
                    self.api
                        .replace(&name, &PostParams::default(), &slice)
                        .await
                        .map_err(|err| PassError::from_kube("update", &name, err))?;
                }
                None => {
                    self.api
                        .create(&PostParams::default(), &slice)
                        .await
                        .map_err(|err| PassError::from_kube("create", &name, err))?;
                }
            }
        }
        let names: Vec<String> = build_slices(&self.driver, &self.node, generation, &devices)
            .into_iter()
            .filter_map(|slice| slice.metadata.name)
            .collect();
        for stale in existing
            .iter()
            .filter_map(|slice| slice.metadata.name.as_deref())
            .filter(|name| !names.iter().any(|keep| keep == name))
        {
            match self.api.delete(stale, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(err) => return Err(PassError::from_kube("delete", stale, err)),
            }
        }
        self.generation.store(generation, Ordering::SeqCst);
        tracing::info!(generation, devices = devices.len(), node = %self.node, "ResourceSlices published");
        Ok(Published::Written { generation })
    }

    /// Deletes every slice of this node and driver (on uninstall).
    pub async fn withdraw(&self) -> anyhow::Result<usize> {
        let existing = self.current().await?;
        for name in existing
            .iter()
            .filter_map(|slice| slice.metadata.name.as_deref())
        {
            match self.api.delete(name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(err) => anyhow::bail!("cannot delete ResourceSlice {name}: {err}"),
            }
        }
        Ok(existing.len())
    }

    /// Publishes `cards` now and whenever they change, whenever someone else changes or
    /// deletes one of the node's slices (a watch), and every `resync`; until `stop`.
    /// Errors are logged and retried after a pause.
    pub async fn run(
        &self,
        mut cards: watch::Receiver<Vec<GpuDevice>>,
        resync: Duration,
        mut stop: watch::Receiver<bool>,
    ) {
        let pause = Duration::from_secs(2);
        loop {
            let snapshot = cards.borrow_and_update().clone();
            let wait = match self.publish(&snapshot).await {
                Ok(_) => resync,
                Err(err) => {
                    tracing::warn!(error = %format!("{err:#}"), "ResourceSlice publishing failed; retrying");
                    pause
                }
            };
            let params = WatchParams::default()
                .fields(&self.field_selector())
                .timeout(290);
            let events = self.api.watch(&params, "0").await;
            let mut events = match events {
                Ok(stream) => Some(stream.boxed()),
                Err(err) => {
                    tracing::debug!(error = %err, "cannot watch ResourceSlices");
                    None
                }
            };
            let deadline = tokio::time::sleep(if events.is_some() {
                wait
            } else {
                wait.min(pause)
            });
            tokio::pin!(deadline);
            let mut watch_ended = false;
            loop {
                tokio::select! {
                    _ = &mut deadline => break,
                    changed = cards.changed() => {
                        if changed.is_err() { return; }
                        break;
                    }
                    _ = stop.wait_for(|stopped| *stopped) => return,
                    event = async {
                        match events.as_mut() {
                            Some(stream) => stream.next().await,
                            None => std::future::pending().await,
                        }
                    } => {
                        match event {
                            Some(Ok(kube::api::WatchEvent::Bookmark(_))) => {}
                            Some(Ok(
                                kube::api::WatchEvent::Added(slice)
                                | kube::api::WatchEvent::Modified(slice),
                            )) => {
                                if self.is_foreign_change(&slice, &snapshot) {
                                    tracing::info!(slice = ?slice.metadata.name, "a ResourceSlice of this node differs; publishing again");
                                    break;
                                }
                            }
                            Some(Ok(kube::api::WatchEvent::Deleted(slice))) => {
                                tracing::info!(slice = ?slice.metadata.name, "a ResourceSlice of this node was deleted; publishing again");
                                break;
                            }
                            Some(Ok(kube::api::WatchEvent::Error(_)) | Err(_)) | None => {
                                // The watch ended (its timeout, or the server went away):
                                // check the slices and watch again, after a pause.
                                watch_ended = true;
                                break;
                            }
                        }
                    }
                }
            }
            if watch_ended {
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = stop.wait_for(|stopped| *stopped) => return,
                }
            }
        }
    }

    /// True when `slice` is not one this process wrote for `cards` at its generation.
    fn is_foreign_change(&self, slice: &ResourceSlice, cards: &[GpuDevice]) -> bool {
        let devices = slice_devices(&self.driver, cards, self.policy);
        let generation = self.generation.load(Ordering::SeqCst);
        let wanted = build_slices(&self.driver, &self.node, generation, &devices);
        !wanted.iter().any(|want| {
            want.metadata.name == slice.metadata.name
                && want.spec.pool == slice.spec.pool
                && comparable(want.spec.devices.as_ref()) == comparable(slice.spec.devices.as_ref())
        })
    }
}

enum PassError {
    Conflict(String),
    Other(anyhow::Error),
}

impl From<anyhow::Error> for PassError {
    fn from(err: anyhow::Error) -> PassError {
        PassError::Other(err)
    }
}

impl PassError {
    fn from_kube(verb: &str, name: &str, err: kube::Error) -> PassError {
        match err {
            kube::Error::Api(status) if status.code == 409 => {
                PassError::Conflict(format!("{verb} {name}: {}", status.message))
            }
            other => PassError::Other(anyhow::anyhow!(
                "cannot {verb} ResourceSlice {name}: {other}"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn card(index: u32) -> GpuDevice {
        GpuDevice {
            uuid: format!("GPU-{index}"),
            index,
            minor: Some(index),
            product_name: Some("NVIDIA H200".into()),
            memory_bytes: (141 << 30) + (5 << 20),
            compute_capability: Some((9, 0)),
            numa_node: Some(0),
            driver_version: Some("580.159.04".into()),
            unhealthy: None,
        }
    }

    #[test]
    fn versions_are_semantic() {
        assert_eq!(semantic_version("580.159.04").as_deref(), Some("580.159.4"));
        assert_eq!(semantic_version("535.54").as_deref(), Some("535.54.0"));
        assert_eq!(semantic_version("r535"), None);
        assert_eq!(semantic_version("1.2.3.4"), None);
    }

    #[test]
    fn memory_default_is_whole_steps_and_taints_follow_health() {
        let mut sick = card(1);
        sick.unhealthy = Some("fell off the bus".into());
        let devices = slice_devices(
            "gpu.example",
            &[sick.clone(), card(0)],
            UnhealthyPolicy::Taint,
        );
        assert_eq!(devices[0].name, "gpu-0");
        let memory = &devices[0].capacity.as_ref().expect("capacity")["memory"];
        let policy = memory.request_policy.as_ref().expect("policy");
        assert_eq!(policy.default.as_ref().map(|q| q.0.as_str()), Some("141Gi"));
        assert_eq!(devices[0].taints, None);
        let taints = devices[1].taints.as_ref().expect("tainted");
        assert_eq!(taints[0].key, "gpu.example/unhealthy");
        assert_eq!(taints[0].effect, "NoSchedule");
        let removed = slice_devices("gpu.example", &[sick, card(0)], UnhealthyPolicy::Remove);
        assert_eq!(removed.len(), 1);
    }

    #[test]
    fn many_cards_split_into_slices_of_one_pool() {
        let cards: Vec<GpuDevice> = (0..130).map(card).collect();
        let devices = slice_devices("gpu.example", &cards, UnhealthyPolicy::Taint);
        let slices = build_slices("gpu.example", "node-a", 7, &devices);
        assert_eq!(slices.len(), 3);
        assert!(slices.iter().all(|s| s.spec.pool.resource_slice_count == 3
            && s.spec.pool.generation == 7
            && s.spec.pool.name == "node-a"));
        assert_eq!(
            slices[2].metadata.name.as_deref(),
            Some("node-a-gpu.example-2")
        );
        let empty = build_slices("gpu.example", "node-a", 1, &[]);
        assert_eq!(empty.len(), 1);
    }
}
