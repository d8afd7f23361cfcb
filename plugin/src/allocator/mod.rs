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
//!
//! Kubelet also frees, without a word to the plugin, the IDs of a pod it rejects after
//! one of its Allocate calls succeeded (v1.37: at its next admission or PodResources
//! List, `UpdateAllocatedDevices`), and may hand them to the next pod. A record names
//! the pod it was admitted for (`admitted_for`) and, once started, its owner; kubelet
//! lists a pod from the moment it starts admitting it until it is gone, so a record
//! whose pod PodResources no longer lists is released, never pending its other half:
//! each GetPreferredAllocation and Allocate drops such records before it picks or books
//! ([`Allocator::release_released`]). Where the pod could not be told, sharing at
//! Allocate decides nothing: at the PreStartContainer of a container PodResources
//! lists, records that hold some of its IDs and that no container started are such
//! leftovers (an init container whose devices it reuses started before it) and are
//! released, never paired ([`Allocator::release_leftovers`]).
//!
//! One file per kubelet phase: `preferred.rs` (GetPreferredAllocation), `allocate.rs`
//! (Allocate), `prestart.rs` (PreStartContainer), `garbage.rs` (liveness and garbage
//! collection), with `holders.rs` (the PodResources view) beside them; this file keeps
//! the book they share.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;

use crate::ids::{CORES_PER_CARD, DeviceId, Kind, RecordIds};
use vgpu_kubelet_api::deviceplugin;
use vgpu_node_agent::config::NodeConfig;
use vgpu_node_agent::devices::CardInfo;
use vgpu_node_agent::persist::Versioned;
use vgpu_node_agent::state::{AllocationRecord, PluginState};

mod allocate;
mod garbage;
mod holders;
mod preferred;
mod prestart;
#[cfg(test)]
mod tests;

pub use allocate::AllocateDecision;
pub use holders::HolderIndex;
pub use prestart::PreStartPlan;

/// The plugin's book of cards and allocations.
pub struct Allocator {
    config: NodeConfig,
    cards: Vec<CardInfo>,
    unhealthy: BTreeMap<String, String>,
    state: PluginState,
    state_path: PathBuf,
}

/// How many IDs a message names before it only counts the rest.
const NAMED_IDS: usize = 4;

/// IDs for a message: the first few and a count of the rest. Kubelet copies an Allocate
/// refusal into the pod's status, so a request of hundreds of IDs must not be listed
/// whole (`plugin/tests/admission.rs` checks the length).
fn list(ids: &[String]) -> String {
    if ids.len() <= NAMED_IDS {
        return ids.join(", ");
    }
    format!(
        "{} and {} more",
        ids[..NAMED_IDS - 1].join(", "),
        ids.len() - (NAMED_IDS - 1)
    )
}

fn set_of(ids: &[String]) -> BTreeSet<String> {
    ids.iter().cloned().collect()
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
    pub(crate) fn new(config: NodeConfig, cards: Vec<CardInfo>, state: PluginState) -> Allocator {
        let state_path = config.state_file();
        Allocator {
            config,
            cards,
            unhealthy: BTreeMap::new(),
            state,
            state_path,
        }
    }

    pub(crate) fn config(&self) -> &NodeConfig {
        &self.config
    }

    pub(crate) fn cards(&self) -> &[CardInfo] {
        &self.cards
    }

    /// The allocations as they are on disk (the state file is written before any
    /// answer to kubelet).
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

    fn save(&self) -> anyhow::Result<()> {
        self.state.save(&self.state_path)
    }
}
