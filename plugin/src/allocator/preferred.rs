//! GetPreferredAllocation: which free IDs of one resource a container should take
//! (its other half's card first, then by the placement policy; whole cards whole).

use std::collections::{BTreeMap, BTreeSet};

use super::{Allocator, HolderIndex, half_kind};
use crate::config::Policy;
use crate::devices::CardInfo;
use crate::ids::{CORES_PER_CARD, DeviceId, Kind};

impl Allocator {
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
