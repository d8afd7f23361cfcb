//! Which container holds each device ID, from one PodResources List: the source of
//! truth PreStartContainer pairs a container's two records from, and that garbage
//! collection and Allocate's collision check consult.

use std::collections::{BTreeSet, HashMap};

use crate::ids::Kind;
use vgpu_kubelet_api::podresources;
use vgpu_node_agent::state::Owner;

/// One container as PodResources lists it.
#[derive(Clone, Debug)]
pub(super) struct Listed {
    pub(super) owner: Owner,
    core_ids: BTreeSet<String>,
    memory_ids: BTreeSet<String>,
}

impl Listed {
    pub(super) fn ids(&self, kind: Kind) -> &BTreeSet<String> {
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
                // Containers holding none of ours are kept too: kubelet lists a pod as
                // soon as it starts admitting it, before its first Allocate, so they
                // tell how far its admission got (`crate::admitting`).
                let position = index.containers.len();
                for id in listed.core_ids.iter().chain(listed.memory_ids.iter()) {
                    index.holders.insert(id.clone(), position);
                }
                index.containers.push(listed);
            }
        }
        index
    }

    /// (core IDs, memory IDs) of every container PodResources lists, including those
    /// that hold none; `None` when it lists no such container.
    pub fn listed_container(
        &self,
        owner: &Owner,
    ) -> Option<(&BTreeSet<String>, &BTreeSet<String>)> {
        self.containers
            .iter()
            .find(|listed| listed.owner == *owner)
            .map(|listed| (&listed.core_ids, &listed.memory_ids))
    }

    /// Whether PodResources lists the pod `namespace/pod` (kubelet lists a pod from the
    /// moment it starts admitting it until it is gone; a rejected pod is not listed).
    pub fn lists_pod(&self, namespace: &str, pod: &str) -> bool {
        self.containers
            .iter()
            .any(|listed| listed.owner.namespace == namespace && listed.owner.pod == pod)
    }

    /// The container holding `id`.
    pub fn holder(&self, id: &str) -> Option<&Owner> {
        self.holders
            .get(id)
            .map(|&position| &self.containers[position].owner)
    }

    pub(super) fn listed_holder(&self, id: &str) -> Option<&Listed> {
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
    pub(super) fn exactly(&self, kind: Kind, ids: &BTreeSet<String>) -> Option<&Listed> {
        let first = ids.iter().next()?;
        self.listed_holder(first)
            .filter(|listed| listed.ids(kind) == ids)
    }
}
