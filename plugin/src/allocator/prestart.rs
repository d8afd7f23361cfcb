//! PreStartContainer: pairing a container's two records from PodResources (or from
//! the neighbouring Allocate call), its quota, and the refusal of a shape that cannot
//! work. [`Allocator::plan_prestart`] only reads the book; the caller writes the folders
//! and then records the plans with [`Allocator::commit_prestart`].

use std::collections::BTreeSet;

use tonic::Status;
use vgpu_contract::{CoreMode, DeviceQuota};
use vgpu_kube::pods::apply_ceiling;

use super::holders::Listed;
use super::{Allocator, HolderIndex, cards_fit, half_kind, list, set_of};
use crate::ids::{CORES_PER_CARD, DeviceId, Kind, RecordIds};
use vgpu_node_agent::state::{AllocationRecord, Owner};

/// What PreStartContainer must write for one container allocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreStartPlan {
    /// The allocation (and `container_id` of its config): the earlier of its records.
    pub allocation_id: String,
    /// Folders that must hold the same files (the other record's, and earlier aliases).
    pub alias_ids: Vec<String>,
    /// The container, when PodResources lists it.
    pub owner: Option<Owner>,
    /// The container config's `devices`: one quota per card (memory limit from the
    /// memory IDs, core limit from the core IDs, soft ceiling if any).
    pub devices: Vec<DeviceQuota>,
    /// The records folded into the allocation.
    pub(super) folded: Vec<String>,
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

impl Allocator {
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

    pub(super) fn resource(&self, kind: Kind) -> &str {
        match kind {
            Kind::Core => &self.config.core_resource,
            Kind::Memory => &self.config.memory_resource,
        }
    }

    /// Why a container asking for `cores` and `memory` units cannot be served, if it
    /// cannot: memory without cores (no compute is booked for it, so it would take what
    /// other containers' cores pay for), or part of a card's cores without its memory
    /// (no memory is booked, so its neighbours' quotas could not hold). The plugin says
    /// so at Allocate when it can tell the container's request (`crate::admitting`),
    /// else at PreStartContainer.
    pub fn unsupported_shape(&self, name: &str, cores: usize, memory: usize) -> Option<String> {
        let core_resource = &self.config.core_resource;
        let memory_resource = &self.config.memory_resource;
        if cores == 0 && memory > 0 {
            return Some(format!(
                "{name} requests {memory_resource}: {memory} without {core_resource}: memory alone is not supported; add {core_resource}: N (1-99 for part of a card, 100 per whole card) to this container's limits"
            ));
        }
        if cores > 0 && !cores.is_multiple_of(CORES_PER_CARD as usize) && memory == 0 {
            return Some(format!(
                "{name} requests {core_resource}: {cores} without {memory_resource}: a part of a card needs its memory too; add {memory_resource}: M (M x {} of that card) to this container's limits, or ask for {core_resource}: 100 for the whole card",
                self.config.memory_unit
            ));
        }
        None
    }

    /// The quota of a container's devices, or the refusal of a shape that cannot work.
    fn quota(
        &self,
        core_ids: &[String],
        memory_ids: &[String],
        name: &str,
    ) -> Result<Vec<DeviceQuota>, Status> {
        if let Some(refusal) = self.unsupported_shape(name, core_ids.len(), memory_ids.len()) {
            return Err(Status::failed_precondition(refusal));
        }
        let core_cards = cards_of(core_ids);
        let memory_cards = cards_of(memory_ids);
        let mut devices = Vec::new();
        if core_ids.len().is_multiple_of(CORES_PER_CARD as usize) {
            let split: Vec<String> = core_cards
                .iter()
                .map(|uuid| {
                    (
                        uuid,
                        core_ids
                            .iter()
                            .filter(|id| card_of(id).as_deref() == Some(uuid))
                            .count(),
                    )
                })
                .filter(|(_, count)| *count != CORES_PER_CARD as usize)
                .map(|(uuid, count)| format!("{uuid}: {count}"))
                .collect();
            if !split.is_empty() {
                return Err(Status::failed_precondition(format!(
                    "{name}: {} cores are whole cards only as {} of each card, not {}; delete the pod to retry",
                    core_ids.len(),
                    CORES_PER_CARD,
                    split.join(", ")
                )));
            }
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
        if core_cards != memory_cards {
            return Err(Status::failed_precondition(format!(
                "{name}: cores are on card {} but memory is on card {}; both must be on one card: delete the pod to retry",
                core_cards.join(", "),
                memory_cards.join(", ")
            )));
        }
        let mut partial = DeviceQuota {
            uuid: core_cards.first().cloned(),
            index: None,
            memory_limit: Some(vgpu_contract::ByteSize(
                self.config.memory_unit.bytes() * memory_ids.len() as u64,
            )),
            core_limit: Some(core_ids.len() as u32),
            core_mode: CoreMode::Hard,
            core_ceiling: None,
        };
        // The operator's default ceiling, by the rule the pod annotation uses too.
        if let Some(ceiling) = self.config.default_core_ceiling {
            apply_ceiling(&mut partial, ceiling);
        }
        devices.push(partial);
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
}

fn card_of(id: &str) -> Option<String> {
    DeviceId::parse(id).map(|id| id.uuid)
}

fn cards_of(ids: &[String]) -> Vec<String> {
    let cards: BTreeSet<String> = ids
        .iter()
        .filter_map(|id| DeviceId::parse(id))
        .map(|id| id.uuid)
        .collect();
    cards.into_iter().collect()
}
