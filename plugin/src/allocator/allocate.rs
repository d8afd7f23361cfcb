//! Allocate: checking the IDs kubelet hands out, refusing shapes that cannot work, and
//! recording each call as a record of its own (sharing IDs only with an init container
//! of the same pod being admitted).

use std::collections::{BTreeMap, BTreeSet};

use tonic::Status;

use super::{Allocator, HolderIndex, list, set_of};
use crate::ids::{CORES_PER_CARD, DeviceId, Kind, RecordIds};
use vgpu_node_agent::state::{AllocationRecord, Owner};

/// What Allocate decided: the new record.
#[derive(Clone, Debug)]
pub struct AllocateDecision {
    /// The record as stored (already in the state file); its folder is written next.
    pub record: AllocationRecord,
}

impl Allocator {
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

    /// Refuses the second half of a container that kubelet put on another card than its
    /// first: kubelet fills a short pick from any free IDs, so when no card had room for
    /// both, the second half lands elsewhere, and the container could only be refused at
    /// PreStartContainer, for ever. Told only when PodResources is certain: the last
    /// Allocate call's IDs are listed for a container that holds none of `kind` yet
    /// (kubelet admits one container at a time and lists each resource as soon as its
    /// Allocate returns). Whole cards take no memory of their own and are not judged.
    pub fn check_second_half(
        &self,
        kind: Kind,
        ids: &[String],
        holders: &HolderIndex,
        now: u64,
    ) -> Result<(), Status> {
        let Some(first) = self.open_half(now, Some(holders)) else {
            return Ok(());
        };
        let first_kind = kind.other();
        let listed = first
            .ids(first_kind)
            .first()
            .and_then(|id| holders.listed_holder(id));
        let (Some(listed), Some(card)) = (listed, first.cards.first()) else {
            return Ok(());
        };
        let whole = |count: usize| count.is_multiple_of(CORES_PER_CARD as usize);
        let partial = match kind {
            Kind::Core => !whole(ids.len()),
            Kind::Memory => !first.is_whole_card(),
        };
        if first.cards.len() != 1 || !partial || !listed.ids(kind).is_empty() {
            return Ok(());
        }
        // IDs spanning cards, or more than a card has, are refused by Allocate's own
        // checks, which say so.
        let cards: BTreeSet<String> = ids
            .iter()
            .filter_map(|id| DeviceId::parse(id))
            .map(|device| device.uuid)
            .collect();
        if cards.len() != 1 || cards.contains(card) {
            return Ok(());
        }
        let elsewhere = ids;
        let owner = &listed.owner;
        Err(Status::invalid_argument(format!(
            "{}/{}/{}: its {} is on card {card}, but kubelet gave it {} IDs elsewhere ({}): no card has room for both its cores and its memory now; a container's cores and memory must come from one card",
            owner.namespace,
            owner.pod,
            owner.container,
            self.resource(first_kind),
            self.resource(kind),
            list(elsewhere)
        )))
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
        self.allocate_for(kind, ids, holders, None, now)
    }

    /// [`Allocator::allocate`] for the container `admitted_for`, when
    /// `crate::admitting` could tell which container kubelet is admitting.
    pub fn allocate_for(
        &mut self,
        kind: Kind,
        ids: &[String],
        holders: Option<&HolderIndex>,
        admitted_for: Option<&Owner>,
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
                // From 100 up a container gets whole cards: 100 IDs of each card it
                // touches, however kubelet filled the pick (99 + 1 across two cards is
                // no whole card, and no part of one either).
                if count >= per_100 {
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
                            vgpu_contract::ByteSize(unit.bytes() * count as u64),
                            vgpu_contract::ByteSize(unit.bytes() * largest as u64),
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
            admitted_for: admitted_for.cloned(),
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
}
