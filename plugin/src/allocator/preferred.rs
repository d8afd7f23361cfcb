//! GetPreferredAllocation: which free IDs of one resource a container should take
//! (its other half's card first, then by the placement policy; whole cards whole).

use std::collections::{BTreeMap, BTreeSet};

use super::{Allocator, HolderIndex, half_kind};
use crate::admitting::Admitting;
use crate::ids::{CORES_PER_CARD, DeviceId, Kind, RecordIds};
use vgpu_node_agent::config::Policy;
use vgpu_node_agent::devices::CardInfo;

impl Allocator {
    /// GetPreferredAllocation for one container request, from the calls alone.
    pub fn preferred(
        &self,
        kind: Kind,
        available: &[String],
        must_include: &[String],
        size: usize,
        holders: Option<&HolderIndex>,
        now: u64,
    ) -> Vec<String> {
        self.preferred_for(kind, available, must_include, size, holders, None, now)
    }

    /// GetPreferredAllocation for one container request; `admitting` is that container
    /// when [`crate::admitting`] could tell it. Then its first half goes to a card where
    /// its second half fits too, and its second half to the card of its first, whichever
    /// resource kubelet happens to walk first.
    #[allow(clippy::too_many_arguments)]
    pub fn preferred_for(
        &self,
        kind: Kind,
        available: &[String],
        must_include: &[String],
        size: usize,
        holders: Option<&HolderIndex>,
        admitting: Option<&Admitting>,
        now: u64,
    ) -> Vec<String> {
        let booked = self.booked();
        // Kubelet's contract: `must_include` is part of `available`. Whatever it sends,
        // the answer names only IDs it offered, of this resource on a known card.
        let known = |id: &String| {
            DeviceId::parse(id)
                .filter(|parsed| parsed.kind == kind)
                .and_then(|parsed| {
                    self.card(&parsed.uuid)
                        .filter(|card| parsed.unit < self.units_of(card, kind))
                })
                .is_some()
        };
        let must_include: Vec<String> = must_include
            .iter()
            .filter(|id| available.contains(id) && known(id))
            .cloned()
            .collect();
        let must_include = must_include.as_slice();
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
        let other = kind.other();
        let given: Option<String> = admitting
            .and_then(|container| container.listed(other).first())
            .and_then(|id| DeviceId::parse(id))
            .map(|id| id.uuid);
        let steer: Option<&str> = match (admitting, &given) {
            // Its other half is on a card: follow it (memory never onto whole cards).
            (Some(container), Some(card)) => (kind == Kind::Core
                || !container
                    .listed(other)
                    .len()
                    .is_multiple_of(CORES_PER_CARD as usize))
            .then_some(card.as_str()),
            (Some(_), None) => None,
            (None, _) => {
                self.open_half(now, holders)
                    .and_then(|record| match (kind, half_kind(record)) {
                        (Kind::Core, Some(Kind::Memory)) => {
                            record.cards.first().map(String::as_str)
                        }
                        (Kind::Memory, Some(Kind::Core)) if !record.is_whole_card() => {
                            record.cards.first().map(String::as_str)
                        }
                        _ => None,
                    })
            }
        };
        // Its other half still to come: the cards where that fits too go first.
        let other_need = admitting
            .filter(|container| container.listed(other).is_empty())
            .map(|container| container.wants(other))
            .filter(|&need| {
                need > 0
                    && !(other == Kind::Core && need.is_multiple_of(CORES_PER_CARD as usize))
                    && !(kind == Kind::Core && size.is_multiple_of(CORES_PER_CARD as usize))
            });
        let room_for_other = |card: &CardInfo| match other_need {
            None => true,
            Some(need) => {
                let (cores, memory) = self.booked_units(&card.uuid);
                let booked = match other {
                    Kind::Core => cores,
                    Kind::Memory => memory,
                };
                let free = u64::from(self.units_of(card, other)).saturating_sub(booked);
                free >= need as u64 && !self.whole_holders().contains_key(card.uuid.as_str())
            }
        };
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
                !room_for_other(card),
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
            // Nothing fits on one card: a plain pick of free IDs (Allocate will say why it
            // fails), short when there are not enough: kubelet fills the rest itself.
            chosen = must_include.to_vec();
            chosen.extend(
                order
                    .iter()
                    .flat_map(|card| free[card.uuid.as_str()].iter())
                    .map(DeviceId::to_string)
                    .take(size - chosen.len()),
            );
        }
        chosen.truncate(size.max(must_include.len()));
        chosen
    }
}
