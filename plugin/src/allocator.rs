//! The allocation logic, free of I/O except the state file: which card a request
//! should take (GetPreferredAllocation), whether a set of device IDs may be handed out
//! (Allocate), and, once PodResources names the container, which Allocate calls made
//! it and what quota it gets (PreStartContainer).
//!
//! Kubelet calls the two resources of a container back to back, in either order, and
//! an Allocate call carries device IDs only, never the pod or container: two neighbouring
//! calls may be one container's halves or the last half of one pod and the first of the
//! next. So no call is ever joined to another at Allocate time. Every call gets its own
//! record, folder and mounts (kubelet merges the two responses of a container and keeps
//! one mount per container path); GetPreferredAllocation only steers the second call
//! onto the card of the first. PreStartContainer then pairs the container's two records
//! from PodResources, the source of truth (for init containers, which PodResources does
//! not list, from the neighbouring Allocate call), folds them into one allocation whose
//! folders hold the same files, and refuses a request shape that cannot work with a
//! message that says what to change.
//!
//! Kubelet hands an init container's devices to the pod's next container and calls
//! Allocate again with the same IDs (`devicesToReuse`); that happens while the pod is
//! admitted, before any of its containers starts. So IDs held only by records that no
//! container has started yet, made within the pairing window, may be handed out again:
//! the new record shares them (one group, counted once) and gets its own folder. IDs held
//! by a container that has started are refused.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;

use tonic::Status;
use vgpu_common::{CoreMode, DeviceQuota};

use crate::config::{PluginConfig, Policy};
use crate::devices::CardInfo;
use crate::ids::{CORES_PER_CARD, DeviceId, Kind};
use crate::proto::{deviceplugin, podresources};
use crate::state::{AllocationRecord, Owner, PluginState};

/// One container as PodResources lists it.
#[derive(Clone, Debug)]
struct Listed {
    owner: Owner,
    core_ids: BTreeSet<String>,
    memory_ids: BTreeSet<String>,
}

impl Listed {
    fn ids(&self, kind: Kind) -> &BTreeSet<String> {
        match kind {
            Kind::Core => &self.core_ids,
            Kind::Memory => &self.memory_ids,
        }
    }
}

/// Which container holds each device ID, from one PodResources List.
#[derive(Clone, Debug, Default)]
pub struct HolderIndex {
    containers: Vec<Listed>,
    /// Device ID -> index into `containers`.
    holders: HashMap<String, usize>,
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
                let mut listed = Listed {
                    owner: Owner {
                        namespace: pod.namespace.clone(),
                        pod: pod.name.clone(),
                        container: container.name.clone(),
                    },
                    core_ids: BTreeSet::new(),
                    memory_ids: BTreeSet::new(),
                };
                for devices in &container.devices {
                    let target = if devices.resource_name == core_resource {
                        &mut listed.core_ids
                    } else if devices.resource_name == memory_resource {
                        &mut listed.memory_ids
                    } else {
                        continue;
                    };
                    target.extend(devices.device_ids.iter().cloned());
                }
                if listed.core_ids.is_empty() && listed.memory_ids.is_empty() {
                    continue;
                }
                let position = index.containers.len();
                for id in listed.core_ids.iter().chain(listed.memory_ids.iter()) {
                    index.holders.insert(id.clone(), position);
                }
                index.containers.push(listed);
            }
        }
        index
    }

    /// The container holding `id`.
    pub fn holder(&self, id: &str) -> Option<&Owner> {
        self.holders
            .get(id)
            .map(|&position| &self.containers[position].owner)
    }

    fn listed_holder(&self, id: &str) -> Option<&Listed> {
        self.holders
            .get(id)
            .map(|&position| &self.containers[position])
    }

    /// (core IDs, memory IDs) of a container.
    pub fn devices_of(&self, owner: &Owner) -> (Vec<String>, Vec<String>) {
        self.containers
            .iter()
            .find(|listed| listed.owner == *owner)
            .map(|listed| {
                (
                    listed.core_ids.iter().cloned().collect(),
                    listed.memory_ids.iter().cloned().collect(),
                )
            })
            .unwrap_or_default()
    }

    /// The container whose IDs of `kind` are exactly `ids`.
    fn exactly(&self, kind: Kind, ids: &BTreeSet<String>) -> Option<&Listed> {
        let first = ids.iter().next()?;
        self.listed_holder(first)
            .filter(|listed| listed.ids(kind) == ids)
    }
}

/// What Allocate decided: the new record.
#[derive(Clone, Debug)]
pub struct AllocateDecision {
    pub record: AllocationRecord,
}

/// What PreStartContainer must write for one container allocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreStartPlan {
    /// The allocation (and `container_id` of its config): the earlier of its records.
    pub allocation_id: String,
    /// Folders that must hold the same files (the other record's, and earlier aliases).
    pub alias_ids: Vec<String>,
    /// The container, when PodResources lists it.
    pub owner: Option<Owner>,
    pub devices: Vec<DeviceQuota>,
    /// The records folded into the allocation.
    folded: Vec<String>,
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

fn set_of(ids: &[String]) -> BTreeSet<String> {
    ids.iter().cloned().collect()
}

fn who(owner: Option<&Owner>, ids: &[String]) -> String {
    match owner {
        Some(owner) => format!("{}/{}/{}", owner.namespace, owner.pod, owner.container),
        None => format!(
            "the container of {} (an init container: PodResources lists none)",
            ids.first().map_or("?", String::as_str)
        ),
    }
}

/// The kind of a record that holds one resource only (every record before PreStart).
fn half_kind(record: &AllocationRecord) -> Option<Kind> {
    match (record.core_ids.is_empty(), record.memory_ids.is_empty()) {
        (false, true) => Some(Kind::Core),
        (true, false) => Some(Kind::Memory),
        _ => None,
    }
}

/// Whether a core record and a memory record can be one container's halves: the
/// memory's card is one of the cores' cards.
fn cards_fit(core: &AllocationRecord, memory: &AllocationRecord) -> bool {
    memory.cards.len() == 1 && core.cards.contains(&memory.cards[0])
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

    /// Every booked device ID and the records holding it (several only within one
    /// group of shared IDs).
    fn booked(&self) -> HashMap<&str, Vec<&AllocationRecord>> {
        let mut booked: HashMap<&str, Vec<&AllocationRecord>> = HashMap::new();
        for record in self.state.allocations.values() {
            for id in record.device_ids() {
                booked.entry(id.as_str()).or_default().push(record);
            }
        }
        booked
    }

    /// Booked units of a card, each device ID counted once: (cores, memory units).
    pub fn booked_units(&self, uuid: &str) -> (u64, u64) {
        let ids: BTreeSet<&String> = self
            .state
            .allocations
            .values()
            .flat_map(|record| record.device_ids())
            .collect();
        let (mut cores, mut memory) = (0, 0);
        for id in ids.into_iter().filter_map(|id| DeviceId::parse(id)) {
            if id.uuid == uuid {
                match id.kind {
                    Kind::Core => cores += 1,
                    Kind::Memory => memory += 1,
                }
            }
        }
        (cores, memory)
    }

    /// Whether an allocation may still be in use: its devices are held in PodResources;
    /// or it is younger than the grace period, unless PodResources listed its container
    /// at PreStart and lists it no more (that container is gone).
    pub fn is_live(&self, record: &AllocationRecord, holders: &HolderIndex, now: u64) -> bool {
        if record.device_ids().any(|id| holders.holder(id).is_some()) {
            return true;
        }
        let listed_once = record.prepared_unix.is_some() && record.owner.is_some();
        !listed_once && now.saturating_sub(record.created_unix) < self.config.gc_grace_secs
    }

    /// The record of the last Allocate call, while its container may still be in the
    /// middle of its two calls: not prepared, within the pairing window.
    fn last_call(&self, now: u64) -> Option<&AllocationRecord> {
        self.state
            .allocations
            .values()
            .max_by_key(|record| record.sequence)
            .filter(|record| record.prepared_unix.is_none() && half_kind(record).is_some())
            .filter(|record| {
                now.saturating_sub(record.created_unix) <= self.config.pairing_window_secs
            })
    }

    /// The last Allocate call when it is the first half of a container whose second
    /// call is still to come. Kubelet records each resource's devices as soon as its
    /// Allocate returns, so PodResources tells: the container holding that call's IDs
    /// holds none of the other resource yet. When PodResources does not list them
    /// (unavailable, or an init container), the run of alternating calls that ends
    /// with it tells: an odd run leaves it unpaired.
    fn open_half(&self, now: u64, holders: Option<&HolderIndex>) -> Option<&AllocationRecord> {
        let last = self.last_call(now)?;
        let kind = half_kind(last)?;
        let listed = holders.and_then(|holders| {
            last.ids(kind)
                .first()
                .and_then(|id| holders.listed_holder(id))
        });
        if let Some(listed) = listed {
            return listed.ids(kind.other()).is_empty().then_some(last);
        }
        let window = self.config.pairing_window_secs;
        let mut run = 1;
        let mut current = last;
        while let Some(previous) = current.sequence.checked_sub(1).and_then(|sequence| {
            self.state
                .allocations
                .values()
                .find(|record| record.sequence == sequence)
        }) {
            let alternates = match (half_kind(previous), half_kind(current)) {
                (Some(Kind::Core), Some(Kind::Memory)) => cards_fit(previous, current),
                (Some(Kind::Memory), Some(Kind::Core)) => cards_fit(current, previous),
                _ => false,
            };
            if !alternates
                || previous.prepared_unix.is_some()
                || current.created_unix.saturating_sub(previous.created_unix) > window
            {
                break;
            }
            run += 1;
            current = previous;
        }
        (run % 2 == 1).then_some(last)
    }

    /// Cards held whole by a record, with that record's id.
    fn whole_holders(&self) -> BTreeMap<&str, Vec<&AllocationRecord>> {
        let mut held: BTreeMap<&str, Vec<&AllocationRecord>> = BTreeMap::new();
        for record in self.state.allocations.values() {
            if record.is_whole_card() {
                for card in &record.cards {
                    held.entry(card.as_str()).or_default().push(record);
                }
            }
        }
        held
    }

    /// GetPreferredAllocation for one container request.
    pub fn preferred(
        &self,
        kind: Kind,
        available: &[String],
        must_include: &[String],
        size: usize,
        holders: Option<&HolderIndex>,
        now: u64,
    ) -> Vec<String> {
        let booked = self.booked();
        let mut free: BTreeMap<&str, Vec<DeviceId>> = BTreeMap::new();
        for id in available {
            if booked.contains_key(id.as_str()) || must_include.contains(id) {
                continue;
            }
            if let Some(parsed) = DeviceId::parse(id).filter(|parsed| parsed.kind == kind)
                && let Some(card) = self.card(&parsed.uuid)
                && !self.unhealthy.contains_key(&parsed.uuid)
            {
                free.entry(card.uuid.as_str()).or_default().push(parsed);
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
        // The card of the other half, when the last call was this container's (or the
        // previous pod's: a guess; PreStart checks). Memory is never steered onto a card
        // held whole: a whole-card container needs none, and the next pod's memory
        // there would part it from its cores.
        let last = self.open_half(now, holders);
        let steer: Option<&str> = last.and_then(|record| match (kind, half_kind(record)) {
            (Kind::Core, Some(Kind::Memory)) => record.cards.first().map(String::as_str),
            (Kind::Memory, Some(Kind::Core)) if !record.is_whole_card() => {
                record.cards.first().map(String::as_str)
            }
            _ => None,
        });
        let held_whole = self.whole_holders();
        let must_cards: BTreeSet<String> = must_include
            .iter()
            .filter_map(|id| DeviceId::parse(id))
            .map(|id| id.uuid)
            .collect();
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
            (
                steer != Some(card.uuid.as_str()),
                !must_cards.contains(&card.uuid),
            )
        });
        let whole = kind == Kind::Core && size.is_multiple_of(CORES_PER_CARD as usize) && size > 0;
        if whole {
            for card in order.iter().filter(|card| {
                free_count(card) == CORES_PER_CARD as usize
                    && self
                        .whole_card_blockers(&card.uuid, None, holders, now)
                        .is_empty()
            }) {
                if chosen.len() >= size {
                    break;
                }
                chosen.extend(free[card.uuid.as_str()].iter().map(DeviceId::to_string));
            }
        } else if let Some(card) = order.iter().find(|card| {
            free_count(card) >= needed
                && (kind == Kind::Core || !held_whole.contains_key(card.uuid.as_str()))
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

    /// Records on `card` that keep it from being handed out whole: all of them but the
    /// last call when that is a memory half there (this container's memory, asked for
    /// first) and those of the group `root` (shared IDs).
    fn whole_card_blockers(
        &self,
        card: &str,
        root: Option<&str>,
        holders: Option<&HolderIndex>,
        now: u64,
    ) -> Vec<String> {
        let last = self
            .open_half(now, holders)
            .filter(|record| half_kind(record) == Some(Kind::Memory))
            .map(|record| record.id.as_str());
        self.state
            .allocations
            .values()
            .filter(|record| record.cards.iter().any(|c| c == card))
            .filter(|record| Some(record.id.as_str()) != last)
            .filter(|record| root.is_none_or(|root| record.reuse_root() != root))
            .map(|record| record.id.clone())
            .collect()
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

    /// Records that Allocate of `ids` would collide with: those holding any of them,
    /// and those that keep their cards from being handed out as asked.
    pub fn blockers(&self, kind: Kind, ids: &[String], now: u64) -> Vec<String> {
        let wanted = set_of(ids);
        let mut found: BTreeSet<String> = self
            .state
            .allocations
            .values()
            .filter(|record| record.device_ids().any(|id| wanted.contains(id)))
            .map(|record| record.id.clone())
            .collect();
        let cards: BTreeSet<String> = ids
            .iter()
            .filter_map(|id| DeviceId::parse(id))
            .map(|id| id.uuid)
            .collect();
        let whole_core = kind == Kind::Core && ids.len().is_multiple_of(CORES_PER_CARD as usize);
        for card in &cards {
            if whole_core {
                found.extend(self.whole_card_blockers(card, None, None, now));
            } else if kind == Kind::Memory
                && let Some(holders) = self.whole_holders().get(card.as_str())
            {
                found.extend(holders.iter().map(|record| record.id.clone()));
            }
        }
        found.into_iter().collect()
    }

    /// Drops the allocations among `ids` that are no longer live; returns them.
    pub fn release_stale(
        &mut self,
        ids: &[String],
        holders: &HolderIndex,
        now: u64,
    ) -> anyhow::Result<Vec<AllocationRecord>> {
        self.release_where(ids, |allocator, record| {
            !allocator.is_live(record, holders, now)
        })
    }

    /// Drops the allocations among `ids` that stand in the way of an Allocate call
    /// kubelet made and that no container can be using: kubelet hands out only device
    /// IDs it holds free, so a record PodResources does not list is stale, unless it may
    /// be the same pod's own a moment ago (not prepared, within the pairing window:
    /// kubelet reusing an init container's devices). Returns them.
    pub fn release_colliding(
        &mut self,
        ids: &[String],
        holders: &HolderIndex,
        now: u64,
    ) -> anyhow::Result<Vec<AllocationRecord>> {
        let window = self.config.pairing_window_secs;
        self.release_where(ids, |_, record| {
            let listed = record.device_ids().any(|id| holders.holder(id).is_some());
            let admitting =
                record.prepared_unix.is_none() && now.saturating_sub(record.created_unix) <= window;
            !listed && !admitting
        })
    }

    fn release_where(
        &mut self,
        ids: &[String],
        stale: impl Fn(&Allocator, &AllocationRecord) -> bool,
    ) -> anyhow::Result<Vec<AllocationRecord>> {
        let doomed: Vec<String> = ids
            .iter()
            .filter(|id| {
                self.state
                    .allocations
                    .get(*id)
                    .is_some_and(|record| stale(self, record))
            })
            .cloned()
            .collect();
        let removed: Vec<AllocationRecord> = doomed
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

    /// Allocate for one container request of `kind`: a new record of its own. `holders`
    /// is PodResources when the service asked it (the request collided with records).
    pub fn allocate(
        &mut self,
        kind: Kind,
        ids: &[String],
        holders: Option<&HolderIndex>,
        now: u64,
    ) -> Result<AllocateDecision, Status> {
        let devices = self.validate(kind, ids)?;
        let reuses = self.reuse_group(ids, holders, now)?;
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
        let core_resource = &self.config.core_resource;
        let memory_resource = &self.config.memory_resource;
        match kind {
            Kind::Core => {
                let count = ids.len();
                let per_100 = CORES_PER_CARD as usize;
                if count > per_100 {
                    let uneven: Vec<String> = per_card
                        .values()
                        .filter(|(_, n)| *n != per_100)
                        .map(|(uuid, n)| format!("{uuid}: {n}"))
                        .collect();
                    if !count.is_multiple_of(per_100) || !uneven.is_empty() {
                        return Err(Status::invalid_argument(format!(
                            "{core_resource}: {count} must be 1-99 (part of one card) or a multiple of 100 (whole cards): change this container's limit ({})",
                            if uneven.is_empty() {
                                format!("{count} is not a multiple of 100")
                            } else {
                                format!("cores per card: {}", uneven.join(", "))
                            }
                        )));
                    }
                }
                if count < per_100 && cards.len() > 1 {
                    return Err(Status::invalid_argument(format!(
                        "core IDs span cards {}: a request under 100 cores must stay on one card ({})",
                        cards.join(", "),
                        list(ids)
                    )));
                }
                if count.is_multiple_of(per_100) {
                    for card in &cards {
                        let busy = self.whole_card_blockers(card, reuses.as_deref(), holders, now);
                        if !busy.is_empty() {
                            return Err(Status::failed_precondition(format!(
                                "whole card {card} is shared by allocations {}: cannot hand it out whole",
                                busy.join(", ")
                            )));
                        }
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
                            "{count} memory units ({}) exceed the largest card's {largest} units ({}): lower {memory_resource} to at most {largest}; IDs: {}",
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
                // A card held whole takes memory only from that very container (its
                // memory call right after its cores) or from its group.
                let last = self
                    .open_half(now, holders)
                    .filter(|record| record.is_whole_card())
                    .map(|record| record.id.clone());
                let whole = self.whole_holders();
                let blocking: Vec<String> = cards
                    .iter()
                    .filter_map(|card| whole.get(card.as_str()))
                    .flatten()
                    .filter(|record| Some(&record.id) != last.as_ref())
                    .filter(|record| reuses.as_deref() != Some(record.reuse_root()))
                    .map(|record| record.id.clone())
                    .collect();
                if !blocking.is_empty() {
                    return Err(Status::failed_precondition(format!(
                        "card {} is allocated whole to another container ({}): memory IDs {} cannot be handed out",
                        cards.join(", "),
                        blocking.join(", "),
                        list(ids)
                    )));
                }
            }
        }
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
            owner: None,
            prepared_unix: None,
            reuses,
            aliases: Vec::new(),
        };
        self.state
            .allocations
            .insert(record.id.clone(), record.clone());
        self.save()
            .map_err(|err| Status::internal(format!("cannot record the allocation: {err}")))?;
        Ok(AllocateDecision { record })
    }

    /// For IDs some records already hold: the group they may be shared in (kubelet
    /// reusing an init container's devices for the pod's next container), or the
    /// refusal. `None` when no record holds any of them.
    fn reuse_group(
        &self,
        ids: &[String],
        holders: Option<&HolderIndex>,
        now: u64,
    ) -> Result<Option<String>, Status> {
        let booked = self.booked();
        let taken: Vec<String> = ids
            .iter()
            .filter(|id| booked.contains_key(id.as_str()))
            .cloned()
            .collect();
        if taken.is_empty() {
            return Ok(None);
        }
        let mut held_by: BTreeMap<&str, &AllocationRecord> = BTreeMap::new();
        for id in &taken {
            for record in &booked[id.as_str()] {
                held_by.insert(record.id.as_str(), record);
            }
        }
        let roots: BTreeSet<&str> = held_by.values().map(|record| record.reuse_root()).collect();
        let admitting = held_by.values().all(|record| {
            record.prepared_unix.is_none()
                && record.owner.is_none()
                && now.saturating_sub(record.created_unix) <= self.config.pairing_window_secs
        });
        // PodResources may list the init container (newer kubelets list restartable
        // ones): any that hold these IDs must be of one pod.
        let pods: BTreeSet<(&str, &str)> = holders
            .map(|holders| {
                taken
                    .iter()
                    .filter_map(|id| holders.holder(id))
                    .map(|owner| (owner.namespace.as_str(), owner.pod.as_str()))
                    .collect()
            })
            .unwrap_or_default();
        if roots.len() == 1 && admitting && pods.len() <= 1 {
            return Ok(roots.into_iter().next().map(str::to_string));
        }
        let named: Vec<String> = held_by
            .values()
            .map(|record| match &record.owner {
                Some(owner) => format!(
                    "{} ({}/{}/{})",
                    record.id, owner.namespace, owner.pod, owner.container
                ),
                None => record.id.clone(),
            })
            .collect();
        Err(Status::failed_precondition(format!(
            "device IDs already allocated: {} (held by {})",
            list(&taken),
            named.join(", ")
        )))
    }

    /// Undoes an allocation whose folder or spec could not be written.
    pub fn forget(&mut self, id: &str) {
        if self.state.allocations.remove(id).is_some() {
            let _ = self.save();
        }
    }

    /// PreStartContainer for the device IDs of one resource: the allocation of every
    /// record those IDs make up (a pod's init container and the container that reuses its
    /// devices both), its other half paired from PodResources (or, for a container
    /// PodResources does not list, from the neighbouring Allocate call), and its quota.
    /// Preparing a container that has not started yet is harmless, so all are planned;
    /// the answer is the refusal of the one most likely starting now, if it has one.
    pub fn plan_prestart(
        &self,
        kind: Kind,
        ids: &[String],
        holders: &HolderIndex,
    ) -> Result<Vec<PreStartPlan>, Status> {
        let wanted = set_of(ids);
        let exact = holders.exactly(kind, &wanted);
        let owner = exact
            .map(|listed| listed.owner.clone())
            .or_else(|| ids.iter().find_map(|id| holders.holder(id)).cloned());
        let name = who(owner.as_ref(), ids);
        let mut targets: Vec<&AllocationRecord> = self
            .state
            .allocations
            .values()
            .filter(|record| {
                !record.ids(kind).is_empty()
                    && record.ids(kind).iter().all(|id| wanted.contains(id))
            })
            .collect();
        targets.sort_by_key(|record| record.sequence);
        if targets.is_empty() {
            let touched = self
                .state
                .allocations
                .values()
                .any(|record| record.device_ids().any(|id| wanted.contains(id)));
            return Err(Status::failed_precondition(if touched {
                format!(
                    "{name}: device IDs {} are part of other allocations; delete the pod to retry",
                    list(ids)
                )
            } else {
                format!(
                    "{name}: device IDs {} were never allocated by this plugin (or were collected); delete the pod to retry",
                    list(ids)
                )
            }));
        }
        let starting = targets
            .iter()
            .find(|record| record.prepared_unix.is_none())
            .or_else(|| targets.iter().max_by_key(|record| record.prepared_unix))
            .map(|record| record.id.clone());
        let mut used = BTreeSet::new();
        let mut plans = Vec::new();
        for target in targets {
            match self.plan_one(kind, target, exact, owner.as_ref(), holders, &mut used) {
                Ok(plan) => plans.push(plan),
                Err(status) if Some(&target.id) == starting.as_ref() => return Err(status),
                Err(status) => {
                    tracing::warn!(allocation = %target.id, reason = status.message(), "not prepared")
                }
            }
        }
        Ok(plans)
    }

    fn plan_one(
        &self,
        kind: Kind,
        target: &AllocationRecord,
        exact: Option<&Listed>,
        owner: Option<&Owner>,
        holders: &HolderIndex,
        used: &mut BTreeSet<String>,
    ) -> Result<PreStartPlan, Status> {
        let other_kind = kind.other();
        let ids = target.ids(kind);
        let name = who(owner, ids);
        let other: Option<&AllocationRecord> = if half_kind(target).is_none()
            || target.prepared_unix.is_some()
        {
            // Already one container's allocation: check it against PodResources.
            if let Some(listed) = exact
                && *listed.ids(other_kind) != set_of(target.ids(other_kind))
            {
                return Err(Status::failed_precondition(format!(
                    "{name}: its allocation {} was paired with devices {} that PodResources does not list for it; delete the pod to retry",
                    target.id,
                    list(target.ids(other_kind))
                )));
            }
            None
        } else if let Some(listed) = exact {
            let wanted = listed.ids(other_kind);
            if wanted.is_empty() {
                None
            } else {
                let candidates: Vec<&AllocationRecord> = self
                    .state
                    .allocations
                    .values()
                    .filter(|record| half_kind(record) == Some(other_kind))
                    .filter(|record| record.prepared_unix.is_none() && !used.contains(&record.id))
                    .filter(|record| set_of(record.ids(other_kind)) == *wanted)
                    .collect();
                let neighbour = |sequence: u64| {
                    candidates
                        .iter()
                        .find(|record| record.sequence == sequence)
                        .copied()
                };
                let chosen = neighbour(target.sequence.wrapping_sub(1))
                    .or_else(|| neighbour(target.sequence + 1))
                    .or_else(|| {
                        candidates
                            .iter()
                            .min_by_key(|record| record.sequence)
                            .copied()
                    });
                match chosen {
                    Some(record) => Some(record),
                    None => {
                        let wanted: Vec<String> = wanted.iter().cloned().collect();
                        return Err(Status::failed_precondition(format!(
                            "{name}: its {} IDs {} were never allocated by this plugin; delete the pod to retry",
                            self.resource(other_kind),
                            list(&wanted)
                        )));
                    }
                }
            }
        } else {
            self.neighbour_half(target, other_kind, holders, used)
        };
        let (core_ids, memory_ids) = match other {
            Some(other) => match kind {
                Kind::Core => (target.core_ids.clone(), other.memory_ids.clone()),
                Kind::Memory => (other.core_ids.clone(), target.memory_ids.clone()),
            },
            None => (target.core_ids.clone(), target.memory_ids.clone()),
        };
        let devices = self.quota(&core_ids, &memory_ids, &name)?;
        let mut folded = vec![target.id.clone()];
        folded.extend(other.map(|record| record.id.clone()));
        self.check_one_pod(&folded, &core_ids, &memory_ids, owner, &name)?;
        let primary = match other {
            Some(other) if other.sequence < target.sequence => other,
            _ => target,
        };
        let mut alias_ids: Vec<String> = Vec::new();
        for record in std::iter::once(target).chain(other) {
            if record.id != primary.id {
                alias_ids.push(record.id.clone());
            }
            alias_ids.extend(record.aliases.iter().cloned());
        }
        if let Some(other) = other {
            used.insert(other.id.clone());
        }
        Ok(PreStartPlan {
            allocation_id: primary.id.clone(),
            alias_ids,
            owner: owner.cloned(),
            devices,
            folded,
        })
    }

    /// The other half of a container PodResources does not list: the Allocate call just
    /// before `target` (else just after) for the other resource on a fitting card,
    /// within the pairing window, not prepared, and not held by a listed container.
    fn neighbour_half(
        &self,
        target: &AllocationRecord,
        other_kind: Kind,
        holders: &HolderIndex,
        used: &BTreeSet<String>,
    ) -> Option<&AllocationRecord> {
        let window = self.config.pairing_window_secs;
        let fits = |record: &&AllocationRecord| {
            half_kind(record) == Some(other_kind)
                && record.prepared_unix.is_none()
                && !used.contains(&record.id)
                && record.created_unix.abs_diff(target.created_unix) <= window
                && record.device_ids().all(|id| holders.holder(id).is_none())
                && match other_kind {
                    Kind::Memory => cards_fit(target, record),
                    Kind::Core => cards_fit(record, target),
                }
        };
        let at = |sequence: u64| {
            self.state
                .allocations
                .values()
                .find(|record| record.sequence == sequence)
                .filter(fits)
        };
        at(target.sequence.wrapping_sub(1)).or_else(|| at(target.sequence + 1))
    }

    /// Refuses an allocation whose devices a started container of another pod holds
    /// too (Allocate lets records share IDs only while one pod is admitted, so this is
    /// kubelet and the plugin disagreeing).
    fn check_one_pod(
        &self,
        folded: &[String],
        core_ids: &[String],
        memory_ids: &[String],
        owner: Option<&Owner>,
        name: &str,
    ) -> Result<(), Status> {
        let mine: BTreeSet<&String> = core_ids.iter().chain(memory_ids).collect();
        let Some(ours) = owner else { return Ok(()) };
        for record in self.state.allocations.values() {
            if folded.contains(&record.id) || !record.device_ids().any(|id| mine.contains(id)) {
                continue;
            }
            if let Some(theirs) = &record.owner
                && record.prepared_unix.is_some()
                && (theirs.namespace != ours.namespace || theirs.pod != ours.pod)
            {
                return Err(Status::failed_precondition(format!(
                    "{name}: its devices are also booked by allocation {} of {}/{}/{}, another pod; delete the pod to retry",
                    record.id, theirs.namespace, theirs.pod, theirs.container
                )));
            }
        }
        Ok(())
    }

    fn resource(&self, kind: Kind) -> &str {
        match kind {
            Kind::Core => &self.config.core_resource,
            Kind::Memory => &self.config.memory_resource,
        }
    }

    /// The quota of a container's devices, or the refusal of a shape that cannot work.
    fn quota(
        &self,
        core_ids: &[String],
        memory_ids: &[String],
        name: &str,
    ) -> Result<Vec<DeviceQuota>, Status> {
        let core_resource = &self.config.core_resource;
        let memory_resource = &self.config.memory_resource;
        if core_ids.is_empty() {
            return Err(Status::failed_precondition(format!(
                "{name} requests {memory_resource}: {} without {core_resource}: memory alone is not supported; add {core_resource}: N (1-99 for part of a card, 100 per whole card) to this container's limits",
                memory_ids.len()
            )));
        }
        let core_cards = cards_of(core_ids);
        let memory_cards = cards_of(memory_ids);
        let mut devices = Vec::new();
        if core_ids.len().is_multiple_of(CORES_PER_CARD as usize) {
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
            return Ok(devices);
        }
        if memory_ids.is_empty() {
            return Err(Status::failed_precondition(format!(
                "{name} requests {core_resource}: {} without {memory_resource}: a part of a card needs its memory too; add {memory_resource}: M (M x {} of that card) to this container's limits, or ask for {core_resource}: 100 for the whole card",
                core_ids.len(),
                self.config.memory_unit
            )));
        }
        if core_cards != memory_cards {
            return Err(Status::failed_precondition(format!(
                "{name}: cores are on card {} but memory is on card {}; both must be on one card: delete the pod to retry",
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
        Ok(devices)
    }

    /// Records what PreStartContainer wrote: each plan's records fold into its
    /// allocation, which is now prepared.
    pub fn commit_prestart(&mut self, plans: &[PreStartPlan], now: u64) -> anyhow::Result<()> {
        for plan in plans {
            let mut merged_core = Vec::new();
            let mut merged_memory = Vec::new();
            for id in plan.folded.iter().filter(|id| **id != plan.allocation_id) {
                if let Some(removed) = self.state.allocations.remove(id) {
                    merged_core.extend(removed.core_ids);
                    merged_memory.extend(removed.memory_ids);
                }
            }
            if let Some(record) = self.state.allocations.get_mut(&plan.allocation_id) {
                record.core_ids.extend(merged_core);
                record.memory_ids.extend(merged_memory);
                for alias in &plan.alias_ids {
                    if !record.aliases.contains(alias) {
                        record.aliases.push(alias.clone());
                    }
                }
                if plan.owner.is_some() {
                    record.owner = plan.owner.clone();
                }
                record.prepared_unix = Some(now);
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
    use crate::proto::podresources::{ContainerDevices, ContainerResources, PodResources};

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

    /// What kubelet does for one resource of a container: preferred, then Allocate.
    fn take(allocator: &mut Allocator, kind: Kind, size: usize, now: u64) -> Vec<String> {
        let chosen = allocator.preferred(kind, &ids(allocator, kind), &[], size, None, now);
        allocator
            .allocate(kind, &chosen, None, now)
            .expect("allocate");
        chosen
    }

    /// One fractional container: cores then memory, as kubelet asks for them.
    fn place(allocator: &mut Allocator, cores: usize, memory: usize, now: u64) -> String {
        let core_ids = take(allocator, Kind::Core, cores, now);
        let memory_ids = take(allocator, Kind::Memory, memory, now);
        let core_card = DeviceId::parse(&core_ids[0]).expect("id").uuid;
        let memory_card = DeviceId::parse(&memory_ids[0]).expect("id").uuid;
        assert_eq!(
            core_card, memory_card,
            "one container's cores and memory on one card"
        );
        core_card
    }

    fn allocator(policy: Policy, dir: &std::path::Path, count: u32) -> Allocator {
        let config = PluginConfig {
            policy,
            state_dir: dir.to_path_buf(),
            ..PluginConfig::default()
        };
        Allocator::new(config, cards(count), PluginState::default())
    }

    fn pod(name: &str, containers: &[(&str, &[String], &[String])]) -> PodResources {
        PodResources {
            name: name.into(),
            namespace: "default".into(),
            containers: containers
                .iter()
                .map(|(container, cores, memory)| ContainerResources {
                    name: (*container).into(),
                    devices: [
                        ("tencent.com/vcuda-core", *cores),
                        ("tencent.com/vcuda-memory", *memory),
                    ]
                    .into_iter()
                    .filter(|(_, ids)| !ids.is_empty())
                    .map(|(resource, ids)| ContainerDevices {
                        resource_name: resource.into(),
                        device_ids: ids.to_vec(),
                        topology: None,
                    })
                    .collect(),
                    cpu_ids: vec![],
                    memory: vec![],
                })
                .collect(),
        }
    }

    fn index(pods: &[PodResources]) -> HolderIndex {
        HolderIndex::from_list(pods, "tencent.com/vcuda-core", "tencent.com/vcuda-memory")
    }

    #[test]
    fn binpack_fills_one_card_before_the_next() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut allocator = allocator(Policy::Binpack, dir.path(), 2);
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
        let mut allocator = allocator(Policy::Spread, dir.path(), 2);
        let first = place(&mut allocator, 30, 4, 1);
        let second = place(&mut allocator, 30, 4, 2);
        assert_ne!(first, second, "spread uses the idle card");
        let third = place(&mut allocator, 10, 2, 3);
        assert!(third == first || third == second);
    }

    #[test]
    fn every_call_gets_its_own_record_and_prestart_folds_a_container_from_podresources() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut allocator = allocator(Policy::Binpack, dir.path(), 1);
        // A memory-only pod, then a normal pod whose cores come first: the cores land
        // right after the stray memory half and must not be paired with it.
        let stray = take(&mut allocator, Kind::Memory, 2, 1);
        let cores = take(&mut allocator, Kind::Core, 30, 1);
        let memory = take(&mut allocator, Kind::Memory, 4, 1);
        assert_eq!(
            allocator.state().allocations.len(),
            3,
            "no call joins another"
        );
        let holders = index(&[
            pod("stray", &[("main", &[], &stray)]),
            pod("tenant", &[("cuda", &cores, &memory)]),
        ]);
        let plans = allocator
            .plan_prestart(Kind::Core, &cores, &holders)
            .expect("the normal pod starts");
        assert_eq!(plans.len(), 1);
        let plan = &plans[0];
        assert_eq!(plan.devices[0].core_limit, Some(30));
        assert_eq!(
            plan.devices[0].memory_limit,
            Some(vgpu_common::ByteSize::gib(1))
        );
        assert_eq!(
            plan.alias_ids.len(),
            1,
            "its memory call's folder is an alias"
        );
        allocator.commit_prestart(&plans, 2).expect("commit");
        let again = allocator
            .plan_prestart(Kind::Memory, &memory, &holders)
            .expect("the memory PreStart of the same start");
        assert_eq!(
            again,
            plans
                .iter()
                .map(|p| PreStartPlan {
                    folded: vec![p.allocation_id.clone()],
                    ..p.clone()
                })
                .collect::<Vec<_>>()
        );
        let refused = allocator
            .plan_prestart(Kind::Memory, &stray, &holders)
            .expect_err("memory alone");
        assert!(
            refused.message().contains("add tencent.com/vcuda-core: N"),
            "{}",
            refused.message()
        );
    }

    #[test]
    fn a_whole_card_pod_without_memory_does_not_draw_the_next_pods_memory() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut allocator = allocator(Policy::Binpack, dir.path(), 2);
        let whole = take(&mut allocator, Kind::Core, 100, 1);
        let whole_card = DeviceId::parse(&whole[0]).expect("id").uuid;
        // The next pod asks for memory first.
        let memory = take(&mut allocator, Kind::Memory, 4, 1);
        let cores = take(&mut allocator, Kind::Core, 30, 1);
        let card = DeviceId::parse(&memory[0]).expect("id").uuid;
        assert_ne!(
            card, whole_card,
            "memory is never steered onto a card held whole"
        );
        assert_eq!(DeviceId::parse(&cores[0]).expect("id").uuid, card);
        let holders = index(&[
            pod("trainer", &[("main", &whole, &[])]),
            pod("tenant", &[("cuda", &cores, &memory)]),
        ]);
        let plans = allocator
            .plan_prestart(Kind::Memory, &memory, &holders)
            .expect("starts");
        assert_eq!(plans[0].devices[0].core_limit, Some(30));
        let plans = allocator
            .plan_prestart(Kind::Core, &whole, &holders)
            .expect("whole");
        assert_eq!(plans[0].devices[0].core_limit, None);
    }

    #[test]
    fn a_whole_card_container_may_take_memory_of_its_own_card_right_after_its_cores() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut allocator = allocator(Policy::Binpack, dir.path(), 1);
        let whole = take(&mut allocator, Kind::Core, 100, 1);
        let memory = take(&mut allocator, Kind::Memory, 2, 1);
        let holders = index(&[pod("trainer", &[("main", &whole, &memory)])]);
        let plans = allocator
            .plan_prestart(Kind::Core, &whole, &holders)
            .expect("whole");
        assert_eq!(
            plans[0].devices[0].memory_limit, None,
            "a whole card has all its memory"
        );
        allocator.commit_prestart(&plans, 2).expect("commit");
        let later = allocator.allocate(Kind::Memory, &ids(&allocator, Kind::Memory)[2..3], None, 3);
        assert_eq!(
            later.expect_err("held whole").code(),
            tonic::Code::FailedPrecondition
        );
    }

    #[test]
    fn an_init_containers_devices_are_handed_out_again_during_admission_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut allocator = allocator(Policy::Binpack, dir.path(), 1);
        // Init container, then the app container reusing its IDs (kubelet order).
        let cores = take(&mut allocator, Kind::Core, 30, 1);
        let memory = take(&mut allocator, Kind::Memory, 4, 1);
        let app_memory = allocator
            .allocate(Kind::Memory, &memory, None, 1)
            .expect("reuse")
            .record;
        let app_cores = allocator
            .allocate(Kind::Core, &cores, None, 1)
            .expect("reuse")
            .record;
        assert!(app_cores.reuses.is_some() && app_memory.reuses.is_some());
        assert_eq!(
            allocator.booked_units("GPU-card-0"),
            (30, 4),
            "shared IDs count once"
        );
        // PodResources lists the app container only.
        let holders = index(&[pod("job", &[("app", &cores, &memory)])]);
        let plans = allocator
            .plan_prestart(Kind::Core, &cores, &holders)
            .expect("init starts");
        assert_eq!(
            plans.len(),
            2,
            "the init container's allocation and the app's"
        );
        assert_ne!(
            plans[0].allocation_id, plans[1].allocation_id,
            "each its own folder"
        );
        assert!(
            plans
                .iter()
                .all(|plan| plan.devices[0].core_limit == Some(30))
        );
        allocator.commit_prestart(&plans, 2).expect("commit");
        assert_eq!(allocator.state().allocations.len(), 2);
        // Once a container has started, the same IDs are refused.
        let refused = allocator
            .allocate(Kind::Core, &cores, None, 2)
            .expect_err("started");
        assert!(
            refused.message().contains("already allocated"),
            "{}",
            refused.message()
        );
        assert!(
            allocator
                .plan_prestart(Kind::Memory, &memory, &holders)
                .is_ok(),
            "the app container's own start"
        );
    }

    #[test]
    fn an_unlisted_init_container_is_paired_with_its_neighbouring_call() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut allocator = allocator(Policy::Binpack, dir.path(), 1);
        let stray = take(&mut allocator, Kind::Memory, 2, 1);
        let cores = take(&mut allocator, Kind::Core, 30, 1);
        let _memory = take(&mut allocator, Kind::Memory, 4, 1);
        // Only the stray pod is listed; the init container is not (PodResources lists
        // regular containers only).
        let holders = index(&[pod("stray", &[("main", &[], &stray)])]);
        let plans = allocator
            .plan_prestart(Kind::Core, &cores, &holders)
            .expect("init");
        assert_eq!(
            plans[0].devices[0].memory_limit,
            Some(vgpu_common::ByteSize::gib(1))
        );
        let cores_only = {
            let dir = tempfile::tempdir().expect("tempdir");
            let mut lonely = super::tests::allocator(Policy::Binpack, dir.path(), 1);
            let cores = take(&mut lonely, Kind::Core, 30, 1);
            lonely
                .plan_prestart(Kind::Core, &cores, &HolderIndex::default())
                .expect_err("no memory")
        };
        assert!(
            cores_only
                .message()
                .contains("add tencent.com/vcuda-memory: M"),
            "{}",
            cores_only.message()
        );
    }
}
