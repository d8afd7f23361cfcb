//! The allocation logic, free of I/O except the state file: which card a request
//! should take (GetPreferredAllocation), whether a set of device IDs may be handed out
//! (Allocate), pairing the two resources of one container, and what quota the
//! container gets once PodResources names it (PreStartContainer).
//!
//! Kubelet calls the two resources back to back for a container, in either order:
//! GetPreferredAllocation(A), Allocate(A), GetPreferredAllocation(B), Allocate(B). The
//! first Allocate opens an allocation (and its response carries the mounts); the second,
//! within `pairing_window_secs` and on the same card, joins it. PreStartContainer then
//! checks the pairing against PodResources, the source of truth.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;

use tonic::Status;
use vgpu_common::{CoreMode, DeviceQuota};

use crate::config::{PluginConfig, Policy};
use crate::devices::CardInfo;
use crate::ids::{CORES_PER_CARD, DeviceId, Kind};
use crate::proto::{deviceplugin, podresources};
use crate::state::{AllocationRecord, Owner, PluginState};

/// (namespace, pod, container) as PodResources names a container.
type ContainerKey = (String, String, String);

/// Which container holds each device ID, from one PodResources List.
#[derive(Clone, Debug, Default)]
pub struct HolderIndex {
    holders: HashMap<String, Owner>,
    /// Each container's (core IDs, memory IDs).
    devices: HashMap<ContainerKey, (Vec<String>, Vec<String>)>,
}

impl HolderIndex {
    /// Indexes the devices of our two resources.
    pub fn from_list(
        pods: &[podresources::PodResources],
        core_resource: &str,
        memory_resource: &str,
    ) -> HolderIndex {
        let mut index = HolderIndex::default();
        for pod in pods {
            for container in &pod.containers {
                let owner = Owner {
                    namespace: pod.namespace.clone(),
                    pod: pod.name.clone(),
                    container: container.name.clone(),
                };
                let key = (
                    owner.namespace.clone(),
                    owner.pod.clone(),
                    owner.container.clone(),
                );
                for devices in &container.devices {
                    let is_core = devices.resource_name == core_resource;
                    if !is_core && devices.resource_name != memory_resource {
                        continue;
                    }
                    let entry = index.devices.entry(key.clone()).or_default();
                    for id in &devices.device_ids {
                        index.holders.insert(id.clone(), owner.clone());
                        if is_core {
                            entry.0.push(id.clone())
                        } else {
                            entry.1.push(id.clone())
                        }
                    }
                }
            }
        }
        index
    }

    /// The container holding `id`.
    pub fn holder(&self, id: &str) -> Option<&Owner> {
        self.holders.get(id)
    }

    /// (core IDs, memory IDs) of a container.
    pub fn devices_of(&self, owner: &Owner) -> (Vec<String>, Vec<String>) {
        self.devices
            .get(&(
                owner.namespace.clone(),
                owner.pod.clone(),
                owner.container.clone(),
            ))
            .cloned()
            .unwrap_or_default()
    }
}

/// What Allocate decided.
#[derive(Clone, Debug)]
pub struct AllocateDecision {
    pub record: AllocationRecord,
    /// True when this response carries the mounts (the allocation is new).
    pub returns_mounts: bool,
}

/// What PreStartContainer must write.
#[derive(Clone, Debug)]
pub struct PreStartPlan {
    /// Allocation folders to write (normally one).
    pub allocation_ids: Vec<String>,
    pub owner: Owner,
    pub devices: Vec<DeviceQuota>,
}

/// The plugin's book of cards and allocations.
pub struct Allocator {
    config: PluginConfig,
    cards: Vec<CardInfo>,
    unhealthy: BTreeMap<String, String>,
    state: PluginState,
    state_path: PathBuf,
}

fn list(ids: &[String]) -> String {
    ids.join(", ")
}

impl Allocator {
    pub fn new(config: PluginConfig, cards: Vec<CardInfo>, state: PluginState) -> Allocator {
        let state_path = config.state_file();
        Allocator {
            config,
            cards,
            unhealthy: BTreeMap::new(),
            state,
            state_path,
        }
    }

    pub fn config(&self) -> &PluginConfig {
        &self.config
    }

    pub fn cards(&self) -> &[CardInfo] {
        &self.cards
    }

    pub fn state(&self) -> &PluginState {
        &self.state
    }

    /// Why a card is unhealthy, if it is.
    pub fn unhealthy_reason(&self, uuid: &str) -> Option<&str> {
        self.unhealthy.get(uuid).map(String::as_str)
    }

    /// Records a probe result; true when the card's health changed.
    pub fn set_health(&mut self, uuid: &str, health: Result<(), String>) -> bool {
        match health {
            Ok(()) => self.unhealthy.remove(uuid).is_some(),
            Err(reason) => self.unhealthy.insert(uuid.to_string(), reason).is_none(),
        }
    }

    fn card(&self, uuid: &str) -> Option<&CardInfo> {
        self.cards.iter().find(|card| card.uuid == uuid)
    }

    /// Memory devices of a card.
    pub fn memory_units(&self, card: &CardInfo) -> u32 {
        u32::try_from(card.memory_total / self.config.memory_unit.bytes()).unwrap_or(u32::MAX)
    }

    fn units_of(&self, card: &CardInfo, kind: Kind) -> u32 {
        match kind {
            Kind::Core => CORES_PER_CARD,
            Kind::Memory => self.memory_units(card),
        }
    }

    /// The ListAndWatch list of one resource.
    pub fn devices(&self, kind: Kind) -> Vec<deviceplugin::Device> {
        let mut devices = Vec::new();
        for card in &self.cards {
            let health = if self.unhealthy.contains_key(&card.uuid) {
                deviceplugin::UNHEALTHY
            } else {
                deviceplugin::HEALTHY
            };
            let topology = card.numa_node.map(|node| deviceplugin::TopologyInfo {
                nodes: vec![deviceplugin::NumaNode { id: node }],
            });
            for unit in 0..self.units_of(card, kind) {
                devices.push(deviceplugin::Device {
                    id: DeviceId::new(&card.uuid, kind, unit).to_string(),
                    health: health.to_string(),
                    topology: topology.clone(),
                });
            }
        }
        devices
    }

    fn booked(&self) -> HashMap<&str, &AllocationRecord> {
        let mut booked = HashMap::new();
        for record in self.state.allocations.values() {
            for id in record.device_ids() {
                booked.insert(id.as_str(), record);
            }
        }
        booked
    }

    /// Whether an allocation may still be in use: its devices are held in PodResources,
    /// or it is younger than the grace period.
    pub fn is_live(&self, record: &AllocationRecord, holders: &HolderIndex, now: u64) -> bool {
        now.saturating_sub(record.created_unix) < self.config.gc_grace_secs
            || record.device_ids().any(|id| holders.holder(id).is_some())
    }

    /// The newest allocation still waiting for its other resource, within the window.
    fn pending_pair(&self, kind: Kind, now: u64) -> Option<&AllocationRecord> {
        self.state
            .allocations
            .values()
            .filter(|record| record.owner.is_none())
            .filter(|record| {
                now.saturating_sub(record.created_unix) <= self.config.pairing_window_secs
            })
            .filter(|record| match kind {
                Kind::Core => record.core_ids.is_empty(),
                Kind::Memory => record.memory_ids.is_empty(),
            })
            .max_by_key(|record| record.sequence)
    }

    fn cards_held_whole(&self) -> BTreeSet<&str> {
        self.state
            .allocations
            .values()
            .filter(|record| record.is_whole_card())
            .flat_map(|record| record.cards.iter().map(String::as_str))
            .collect()
    }

    /// GetPreferredAllocation for one container request.
    pub fn preferred(
        &self,
        kind: Kind,
        available: &[String],
        must_include: &[String],
        size: usize,
        now: u64,
    ) -> Vec<String> {
        let booked = self.booked();
        let mut free: BTreeMap<&str, Vec<DeviceId>> = BTreeMap::new();
        for id in available {
            if booked.contains_key(id.as_str()) || must_include.contains(id) {
                continue;
            }
            if let Some(parsed) = DeviceId::parse(id).filter(|parsed| parsed.kind == kind)
                && self.card(&parsed.uuid).is_some()
                && !self.unhealthy.contains_key(&parsed.uuid)
            {
                let uuid = self
                    .card(&parsed.uuid)
                    .map(|card| card.uuid.as_str())
                    .unwrap_or_default();
                free.entry(uuid).or_default().push(parsed);
            }
        }
        for ids in free.values_mut() {
            ids.sort();
        }
        let mut chosen: Vec<String> = must_include.to_vec();
        let needed = size.saturating_sub(chosen.len());
        if needed == 0 {
            return chosen;
        }
        let pending = self.pending_pair(kind, now);
        let held_whole = self.cards_held_whole();
        let must_cards: BTreeSet<String> = must_include
            .iter()
            .filter_map(|id| DeviceId::parse(id))
            .map(|id| id.uuid)
            .collect();
        // Cards in preference order: the pending pair's card, must-include cards, then policy.
        let mut order: Vec<&CardInfo> = self
            .cards
            .iter()
            .filter(|card| free.contains_key(card.uuid.as_str()))
            .collect();
        let free_count = |card: &CardInfo| free.get(card.uuid.as_str()).map_or(0, Vec::len);
        match self.config.policy {
            Policy::Binpack => order.sort_by_key(|card| (free_count(card), card.index)),
            Policy::Spread => {
                order.sort_by_key(|card| (std::cmp::Reverse(free_count(card)), card.index))
            }
        }
        order.sort_by_key(|card| {
            let paired = pending.is_some_and(|record| record.cards.contains(&card.uuid));
            let must = must_cards.contains(&card.uuid);
            (!paired, !must)
        });
        let whole = kind == Kind::Core && size.is_multiple_of(CORES_PER_CARD as usize) && size > 0;
        if whole {
            let booked_cards: BTreeSet<&str> = self
                .state
                .allocations
                .values()
                .flat_map(|record| record.cards.iter().map(String::as_str))
                .collect();
            for card in order.iter().filter(|card| {
                free_count(card) == CORES_PER_CARD as usize
                    && !booked_cards.contains(card.uuid.as_str())
            }) {
                if chosen.len() >= size {
                    break;
                }
                chosen.extend(free[card.uuid.as_str()].iter().map(DeviceId::to_string));
            }
        } else if let Some(card) = order.iter().find(|card| {
            free_count(card) >= needed
                && (kind == Kind::Core
                    || !held_whole.contains(card.uuid.as_str())
                    || pending.is_some_and(|record| record.cards.contains(&card.uuid)))
        }) {
            chosen.extend(
                free[card.uuid.as_str()]
                    .iter()
                    .take(needed)
                    .map(DeviceId::to_string),
            );
        }
        if chosen.len() < size {
            // Nothing fits on one card: give kubelet a plain pick; Allocate will say why it fails.
            chosen = must_include.to_vec();
            chosen.extend(
                available
                    .iter()
                    .filter(|id| !must_include.contains(id))
                    .take(size - chosen.len())
                    .cloned(),
            );
        }
        chosen.truncate(size.max(must_include.len()));
        chosen
    }

    /// Parses and checks IDs of `kind`: unknown ones are InvalidArgument, unhealthy
    /// ones FailedPrecondition, each naming the IDs.
    pub fn validate(&self, kind: Kind, ids: &[String]) -> Result<Vec<DeviceId>, Status> {
        if ids.is_empty() {
            return Err(Status::invalid_argument("the request names no devices"));
        }
        let mut unknown = Vec::new();
        let mut unhealthy = Vec::new();
        let mut parsed = Vec::new();
        let mut seen = BTreeSet::new();
        let mut duplicates = Vec::new();
        for id in ids {
            if !seen.insert(id.as_str()) {
                duplicates.push(id.clone());
                continue;
            }
            match DeviceId::parse(id).filter(|parsed| parsed.kind == kind) {
                Some(device) => match self.card(&device.uuid) {
                    Some(card) if device.unit < self.units_of(card, kind) => {
                        if self.unhealthy.contains_key(&device.uuid) {
                            unhealthy.push(id.clone());
                        }
                        parsed.push(device);
                    }
                    _ => unknown.push(id.clone()),
                },
                None => unknown.push(id.clone()),
            }
        }
        if !unknown.is_empty() {
            return Err(Status::invalid_argument(format!(
                "unknown device IDs: {}",
                list(&unknown)
            )));
        }
        if !duplicates.is_empty() {
            return Err(Status::invalid_argument(format!(
                "device IDs listed twice: {}",
                list(&duplicates)
            )));
        }
        if !unhealthy.is_empty() {
            let reasons: BTreeSet<String> = parsed
                .iter()
                .filter_map(|device| {
                    self.unhealthy
                        .get(&device.uuid)
                        .map(|why| format!("{}: {why}", device.uuid))
                })
                .collect();
            return Err(Status::failed_precondition(format!(
                "unhealthy device IDs: {} ({})",
                list(&unhealthy),
                reasons.into_iter().collect::<Vec<_>>().join("; ")
            )));
        }
        Ok(parsed)
    }

    /// Allocations that already hold any of `ids`.
    pub fn conflicts(&self, ids: &[String]) -> Vec<String> {
        let booked = self.booked();
        let found: BTreeSet<String> = ids
            .iter()
            .filter_map(|id| booked.get(id.as_str()).map(|record| record.id.clone()))
            .collect();
        found.into_iter().collect()
    }

    /// Drops the allocations among `ids` that are no longer live; returns them.
    pub fn release_stale(
        &mut self,
        ids: &[String],
        holders: &HolderIndex,
        now: u64,
    ) -> anyhow::Result<Vec<AllocationRecord>> {
        let stale: Vec<String> = ids
            .iter()
            .filter(|id| {
                self.state
                    .allocations
                    .get(*id)
                    .is_some_and(|record| !self.is_live(record, holders, now))
            })
            .cloned()
            .collect();
        let removed: Vec<AllocationRecord> = stale
            .iter()
            .filter_map(|id| self.state.allocations.remove(id))
            .collect();
        if !removed.is_empty() {
            self.save()?;
        }
        Ok(removed)
    }

    fn save(&self) -> anyhow::Result<()> {
        self.state.save(&self.state_path)
    }

    /// Allocate for one container request of `kind`.
    pub fn allocate(
        &mut self,
        kind: Kind,
        ids: &[String],
        now: u64,
    ) -> Result<AllocateDecision, Status> {
        let devices = self.validate(kind, ids)?;
        let booked = self.booked();
        let taken: Vec<String> = ids
            .iter()
            .filter(|id| booked.contains_key(id.as_str()))
            .cloned()
            .collect();
        if !taken.is_empty() {
            let holders: BTreeSet<String> = taken
                .iter()
                .filter_map(|id| booked.get(id.as_str()))
                .map(|record| match &record.owner {
                    Some(owner) => format!(
                        "{} ({}/{}/{})",
                        record.id, owner.namespace, owner.pod, owner.container
                    ),
                    None => record.id.clone(),
                })
                .collect();
            return Err(Status::failed_precondition(format!(
                "device IDs already allocated: {} (held by {})",
                list(&taken),
                holders.into_iter().collect::<Vec<_>>().join(", ")
            )));
        }
        let mut per_card: BTreeMap<u32, (String, usize)> = BTreeMap::new();
        for device in &devices {
            if let Some(card) = self.card(&device.uuid) {
                per_card
                    .entry(card.index)
                    .or_insert_with(|| (card.uuid.clone(), 0))
                    .1 += 1;
            }
        }
        let cards: Vec<String> = per_card.values().map(|(uuid, _)| uuid.clone()).collect();
        let pending = self.pending_pair(kind, now).cloned();
        let joins = |pending: &Option<AllocationRecord>| {
            pending.as_ref().is_some_and(|record| {
                record.cards.len() == 1 && cards.len() == 1 && record.cards == cards
            })
        };
        match kind {
            Kind::Core => {
                let count = ids.len();
                if count > CORES_PER_CARD as usize {
                    let uneven: Vec<String> = per_card
                        .values()
                        .filter(|(_, n)| *n != CORES_PER_CARD as usize)
                        .map(|(uuid, n)| format!("{uuid}: {n}"))
                        .collect();
                    if !count.is_multiple_of(CORES_PER_CARD as usize) || !uneven.is_empty() {
                        return Err(Status::invalid_argument(format!(
                            "a request of {count} cores must be under 100 (part of one card) or a multiple of 100 (whole cards); cores per card: {}",
                            if uneven.is_empty() {
                                format!("{count} is not a multiple of 100")
                            } else {
                                uneven.join(", ")
                            }
                        )));
                    }
                }
                if count < CORES_PER_CARD as usize && cards.len() > 1 {
                    return Err(Status::invalid_argument(format!(
                        "core IDs span cards {}: a request under 100 cores must stay on one card ({})",
                        cards.join(", "),
                        list(ids)
                    )));
                }
                if count.is_multiple_of(CORES_PER_CARD as usize) {
                    let busy: Vec<String> = self
                        .state
                        .allocations
                        .values()
                        .filter(|record| record.cards.iter().any(|card| cards.contains(card)))
                        .filter(|record| {
                            !(joins(&pending)
                                && pending.as_ref().is_some_and(|p| p.id == record.id))
                        })
                        .map(|record| record.id.clone())
                        .collect();
                    if !busy.is_empty() {
                        return Err(Status::failed_precondition(format!(
                            "whole card {} is shared by allocations {}: cannot hand it out whole",
                            cards.join(", "),
                            busy.join(", ")
                        )));
                    }
                }
            }
            Kind::Memory => {
                let count = ids.len();
                if cards.len() > 1 {
                    let largest = self
                        .cards
                        .iter()
                        .map(|card| self.memory_units(card))
                        .max()
                        .unwrap_or(0);
                    let unit = self.config.memory_unit;
                    if count as u64 > largest as u64 {
                        return Err(Status::invalid_argument(format!(
                            "{count} memory units ({}) exceed the largest card's {largest} units ({}); IDs: {}",
                            vgpu_common::ByteSize(unit.bytes() * count as u64),
                            vgpu_common::ByteSize(unit.bytes() * largest as u64),
                            list(ids)
                        )));
                    }
                    return Err(Status::invalid_argument(format!(
                        "memory IDs span cards {}: one container's memory must come from one card ({})",
                        cards.join(", "),
                        list(ids)
                    )));
                }
                let held_whole = self.cards_held_whole();
                if cards.iter().any(|card| held_whole.contains(card.as_str())) && !joins(&pending) {
                    return Err(Status::failed_precondition(format!(
                        "card {} is allocated whole to another container: memory IDs {} cannot be handed out",
                        cards.join(", "),
                        list(ids)
                    )));
                }
            }
        }
        let joined = if joins(&pending) { pending } else { None };
        let decision = if let Some(mut record) = joined {
            match kind {
                Kind::Core => record.core_ids = ids.to_vec(),
                Kind::Memory => record.memory_ids = ids.to_vec(),
            }
            self.state
                .allocations
                .insert(record.id.clone(), record.clone());
            AllocateDecision {
                record,
                returns_mounts: false,
            }
        } else {
            let sequence = self.state.next_sequence;
            self.state.next_sequence += 1;
            let record = AllocationRecord {
                id: format!("a{now:x}-{sequence}"),
                sequence,
                cards,
                core_ids: if kind == Kind::Core {
                    ids.to_vec()
                } else {
                    Vec::new()
                },
                memory_ids: if kind == Kind::Memory {
                    ids.to_vec()
                } else {
                    Vec::new()
                },
                created_unix: now,
                mounts_returned: true,
                owner: None,
            };
            self.state
                .allocations
                .insert(record.id.clone(), record.clone());
            AllocateDecision {
                record,
                returns_mounts: true,
            }
        };
        self.save()
            .map_err(|err| Status::internal(format!("cannot record the allocation: {err}")))?;
        Ok(decision)
    }

    /// Undoes an allocation whose folder could not be written.
    pub fn forget(&mut self, id: &str) {
        if self.state.allocations.remove(id).is_some() {
            let _ = self.save();
        }
    }

    /// PreStartContainer: finds the container holding `ids`, checks its pairing and
    /// computes its quota.
    pub fn plan_prestart(
        &mut self,
        ids: &[String],
        holders: &HolderIndex,
    ) -> Result<PreStartPlan, Status> {
        let owner = ids
            .iter()
            .find_map(|id| holders.holder(id))
            .cloned()
            .ok_or_else(|| {
                Status::failed_precondition(format!(
                    "PodResources lists no container holding {}",
                    list(ids)
                ))
            })?;
        let (core_ids, memory_ids) = holders.devices_of(&owner);
        let who = format!("{}/{}/{}", owner.namespace, owner.pod, owner.container);
        let mine: BTreeSet<&String> = core_ids.iter().chain(memory_ids.iter()).collect();
        let records: Vec<AllocationRecord> = self
            .state
            .allocations
            .values()
            .filter(|record| record.device_ids().any(|id| mine.contains(id)))
            .cloned()
            .collect();
        let known: BTreeSet<&String> = records
            .iter()
            .flat_map(|record| record.device_ids())
            .collect();
        let missing: Vec<String> = mine
            .iter()
            .filter(|id| !known.contains(*id))
            .map(|id| (*id).clone())
            .collect();
        if !missing.is_empty() {
            return Err(Status::failed_precondition(format!(
                "{who}: device IDs {} were never allocated by this plugin",
                list(&missing)
            )));
        }
        let foreign: Vec<String> = records
            .iter()
            .flat_map(|record| record.device_ids())
            .filter(|id| !mine.contains(id))
            .cloned()
            .collect();
        if !foreign.is_empty() {
            return Err(Status::failed_precondition(format!(
                "{who}: its allocation was paired with devices of another container ({}); delete the pod to retry",
                list(&foreign)
            )));
        }
        if core_ids.is_empty() {
            return Err(Status::failed_precondition(format!(
                "{who} requests {} without {}: memory alone is not supported",
                self.config.memory_resource, self.config.core_resource
            )));
        }
        let core_cards = cards_of(&core_ids);
        let memory_cards = cards_of(&memory_ids);
        let whole = core_ids.len().is_multiple_of(CORES_PER_CARD as usize);
        let mut devices = Vec::new();
        if whole {
            for uuid in &core_cards {
                devices.push(DeviceQuota {
                    uuid: Some(uuid.clone()),
                    index: None,
                    memory_limit: None,
                    core_limit: None,
                    core_mode: CoreMode::Hard,
                    core_ceiling: None,
                });
            }
        } else {
            if memory_ids.is_empty() {
                return Err(Status::failed_precondition(format!(
                    "{who} requests {} {} without {}: a partial card needs a memory request too",
                    core_ids.len(),
                    self.config.core_resource,
                    self.config.memory_resource
                )));
            }
            if core_cards != memory_cards {
                return Err(Status::failed_precondition(format!(
                    "{who}: cores are on card {} but memory is on card {}; both must be on one card",
                    core_cards.join(", "),
                    memory_cards.join(", ")
                )));
            }
            let cores = core_ids.len() as u32;
            let (core_mode, core_ceiling) = match self.config.default_core_ceiling {
                Some(ceiling) => (CoreMode::Soft, Some(ceiling.max(cores))),
                None => (CoreMode::Hard, None),
            };
            devices.push(DeviceQuota {
                uuid: core_cards.first().cloned(),
                index: None,
                memory_limit: Some(vgpu_common::ByteSize(
                    self.config.memory_unit.bytes() * memory_ids.len() as u64,
                )),
                core_limit: Some(cores),
                core_mode,
                core_ceiling,
            });
        }
        // Fold the container's records into the one whose response carried the mounts.
        let mut primaries: Vec<AllocationRecord> = records
            .iter()
            .filter(|record| record.mounts_returned)
            .cloned()
            .collect();
        primaries.sort_by_key(|record| record.sequence);
        let Some(first) = primaries.first() else {
            return Err(Status::internal(format!(
                "{who}: no allocation of its devices carried the mounts"
            )));
        };
        let first_id = first.id.clone();
        for record in &records {
            if !record.mounts_returned
                && let Some(removed) = self.state.allocations.remove(&record.id)
                && let Some(target) = self.state.allocations.get_mut(&first_id)
            {
                target.core_ids.extend(removed.core_ids);
                target.memory_ids.extend(removed.memory_ids);
            }
        }
        Ok(PreStartPlan {
            allocation_ids: primaries.into_iter().map(|record| record.id).collect(),
            owner,
            devices,
        })
    }

    /// Records the owner found by PreStartContainer.
    pub fn commit_owner(&mut self, plan: &PreStartPlan) -> anyhow::Result<()> {
        for id in &plan.allocation_ids {
            if let Some(record) = self.state.allocations.get_mut(id) {
                record.owner = Some(plan.owner.clone());
            }
        }
        self.save()
    }

    /// Drops every allocation that is no longer live; returns them.
    pub fn collect_garbage(
        &mut self,
        holders: &HolderIndex,
        now: u64,
    ) -> anyhow::Result<Vec<AllocationRecord>> {
        let ids: Vec<String> = self.state.allocations.keys().cloned().collect();
        self.release_stale(&ids, holders, now)
    }
}

fn cards_of(ids: &[String]) -> Vec<String> {
    let cards: BTreeSet<String> = ids
        .iter()
        .filter_map(|id| DeviceId::parse(id))
        .map(|id| id.uuid)
        .collect();
    cards.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cards(count: u32) -> Vec<CardInfo> {
        (0..count)
            .map(|index| CardInfo {
                uuid: format!("GPU-card-{index}"),
                index,
                minor: Some(index),
                memory_total: 4 << 30,
                numa_node: None,
            })
            .collect()
    }

    fn ids(allocator: &Allocator, kind: Kind) -> Vec<String> {
        allocator
            .devices(kind)
            .into_iter()
            .map(|device| device.id)
            .collect()
    }

    /// One fractional container: cores then memory, as kubelet asks for them.
    fn place(allocator: &mut Allocator, cores: usize, memory: usize, now: u64) -> String {
        let core_ids =
            allocator.preferred(Kind::Core, &ids(allocator, Kind::Core), &[], cores, now);
        allocator
            .allocate(Kind::Core, &core_ids, now)
            .expect("cores");
        let memory_ids = allocator.preferred(
            Kind::Memory,
            &ids(allocator, Kind::Memory),
            &[],
            memory,
            now,
        );
        allocator
            .allocate(Kind::Memory, &memory_ids, now)
            .expect("memory");
        let core_card = DeviceId::parse(&core_ids[0]).expect("id").uuid;
        let memory_card = DeviceId::parse(&memory_ids[0]).expect("id").uuid;
        assert_eq!(
            core_card, memory_card,
            "one container's cores and memory on one card"
        );
        core_card
    }

    fn allocator(policy: Policy, dir: &std::path::Path) -> Allocator {
        let config = PluginConfig {
            policy,
            state_dir: dir.to_path_buf(),
            ..PluginConfig::default()
        };
        Allocator::new(config, cards(2), PluginState::default())
    }

    #[test]
    fn binpack_fills_one_card_before_the_next() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut allocator = allocator(Policy::Binpack, dir.path());
        let first = place(&mut allocator, 30, 4, 1);
        let second = place(&mut allocator, 30, 4, 2);
        assert_eq!(
            first, second,
            "binpack puts the second container beside the first"
        );
        let third = place(&mut allocator, 50, 4, 3);
        assert_ne!(third, first, "50 more cores do not fit the first card's 40");
    }

    #[test]
    fn spread_puts_each_container_on_the_emptiest_card() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut allocator = allocator(Policy::Spread, dir.path());
        let first = place(&mut allocator, 30, 4, 1);
        let second = place(&mut allocator, 30, 4, 2);
        assert_ne!(first, second, "spread uses the idle card");
        let third = place(&mut allocator, 10, 2, 3);
        assert!(third == first || third == second);
    }
}
