//! Liveness and garbage collection: which records a container may still use, and
//! dropping the others (the periodic pass, and records in the way of an Allocate call).

use super::{Allocator, HolderIndex, set_of};
use crate::ids::{Kind, RecordIds};
use vgpu_node_agent::state::AllocationRecord;

impl Allocator {
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
    /// kubelet reusing an init container's devices; when the record names the container
    /// it was made for, only while PodResources still lists that pod: kubelet rejected
    /// it otherwise). Returns them.
    pub fn release_colliding(
        &mut self,
        ids: &[String],
        holders: &HolderIndex,
        now: u64,
    ) -> anyhow::Result<Vec<AllocationRecord>> {
        let window = self.config.pairing_window_secs;
        self.release_where(ids, |_, record| {
            let listed = record.device_ids().any(|id| holders.holder(id).is_some());
            let admitting = record.prepared_unix.is_none()
                && now.saturating_sub(record.created_unix) <= window
                && !released(record, holders);
            !listed && !admitting
        })
    }

    /// Records holding any of `offered`, the IDs kubelet offers as free in a
    /// GetPreferredAllocation call: kubelet offers an ID only when no active pod holds
    /// it, so such a record is a deleted pod's (or the same pod's own, being admitted,
    /// which [`Allocator::release_colliding`] keeps). Its caller releases them at once,
    /// before the pick, so a deleted pod's share is free for the next pod.
    pub fn holding_any(&self, offered: &[String]) -> Vec<String> {
        let offered = set_of(offered);
        self.state
            .allocations
            .values()
            .filter(|record| record.device_ids().any(|id| offered.contains(id)))
            .map(|record| record.id.clone())
            .collect()
    }

    /// Drops the records kubelet has released, at the PreStartContainer of a container
    /// PodResources lists with exactly `ids` of `kind`: kubelet handed that container
    /// these IDs, so a record of them that no container started is not the same pod's
    /// init container (those start, and so are prepared, before the pod's other
    /// containers) but the leftover half of a pod kubelet rejected after its Allocate
    /// (kubelet frees such IDs without telling the plugin). Records holding exactly the
    /// container's IDs of their kind are kept: an init container whose devices the
    /// container reuses holds the same set, and the pairing tells them apart. Returns
    /// them.
    pub fn release_leftovers(
        &mut self,
        kind: Kind,
        ids: &[String],
        holders: &HolderIndex,
    ) -> anyhow::Result<Vec<AllocationRecord>> {
        let Some(listed) = holders.exactly(kind, &set_of(ids)) else {
            return Ok(Vec::new());
        };
        let leftovers: Vec<String> = self
            .state
            .allocations
            .values()
            .filter(|record| record.prepared_unix.is_none())
            .filter(|record| {
                [Kind::Core, Kind::Memory].into_iter().any(|kind| {
                    let theirs = record.ids(kind);
                    let mine = listed.ids(kind);
                    theirs.iter().any(|id| mine.contains(id)) && set_of(theirs) != *mine
                })
            })
            .map(|record| record.id.clone())
            .collect();
        self.release_where(&leftovers, |_, _| true)
    }

    /// Drops every record kubelet has released: one of a pod that PodResources no
    /// longer lists (the pod named at PreStart once the container started, else the pod
    /// being admitted at Allocate). Kubelet lists a pod from the moment it starts
    /// admitting it until the pod is gone, so such a record is the half (or whole) of a
    /// pod kubelet rejected after its Allocate, or of a pod deleted: kubelet has freed
    /// its IDs, of both resources, and may hand them to the next pod, which must never
    /// be paired with it, steered by it or kept off its card. Called only with a fresh
    /// list while kubelet admits a pod (its pod manager holds every pod by then). A
    /// record whose container could not be told (an init container PodResources does
    /// not list) is left to the other checks. Returns them.
    pub fn release_released(
        &mut self,
        holders: &HolderIndex,
    ) -> anyhow::Result<Vec<AllocationRecord>> {
        let ids: Vec<String> = self.state.allocations.keys().cloned().collect();
        self.release_where(&ids, |_, record| released(record, holders))
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

/// Whether kubelet has released `record` ([`Allocator::release_released`]): the pod it
/// was started for (once prepared) or admitted for (before) is no longer listed.
pub(super) fn released(record: &AllocationRecord, holders: &HolderIndex) -> bool {
    let pod = match record.prepared_unix {
        Some(_) => record.owner.as_ref(),
        None => record.admitted_for.as_ref(),
    };
    pod.is_some_and(|owner| !holders.lists_pod(&owner.namespace, &owner.pod))
}
