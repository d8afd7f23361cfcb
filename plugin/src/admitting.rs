//! Which container kubelet is admitting, from PodResources and the pods of this node.
//!
//! Kubelet's Allocate carries device IDs only, and it calls the two resources of a
//! container one after the other in the order of a Go map walk (random). To place the
//! first half where the second fits too, and to refuse a shape that cannot work before
//! the container is admitted, the plugin needs the container's whole request. Kubelet
//! (v1.37 `HandlePodAdditions`) adds a pod to its pod manager before it admits it, and
//! admits pods one at a time, container by container (init containers first), recording
//! each resource's devices as soon as its Allocate returns. So PodResources lists the pod
//! being admitted, and the first of its containers whose listed devices fall short of
//! its limits (read from the API server) is the one being admitted. Every other pod
//! PodResources lists was admitted whole (a rejected pod is terminal and no longer
//! listed).
//!
//! Answers `None` whenever that is not certain: no API server, no such pod, two such pods,
//! or a non-restartable init container asking for our resources (PodResources never
//! lists those, so how far the pod got cannot be told). Callers then fall back to what
//! the calls alone tell.

use vgpu_kube::k8s_openapi::api::core::v1::{Container, Pod};

use crate::allocator::HolderIndex;
use crate::ids::Kind;
use vgpu_node_agent::state::Owner;

/// The container being admitted: its whole request and what kubelet gave it so far.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Admitting {
    /// The container.
    pub owner: Owner,
    /// Its limit of the core resource (0 when not asked for).
    pub cores: usize,
    /// Its limit of the memory resource (0 when not asked for).
    pub memory: usize,
    /// The core IDs PodResources lists for it already.
    pub listed_cores: Vec<String>,
    /// The memory IDs PodResources lists for it already.
    pub listed_memory: Vec<String>,
}

impl Admitting {
    /// How many of `kind` it asks for.
    pub fn wants(&self, kind: Kind) -> usize {
        match kind {
            Kind::Core => self.cores,
            Kind::Memory => self.memory,
        }
    }

    /// The IDs of `kind` kubelet gave it already.
    pub fn listed(&self, kind: Kind) -> &[String] {
        match kind {
            Kind::Core => &self.listed_cores,
            Kind::Memory => &self.listed_memory,
        }
    }
}

fn limit(container: &Container, resource: &str) -> usize {
    container
        .resources
        .as_ref()
        .and_then(|resources| resources.limits.as_ref())
        .and_then(|limits| limits.get(resource))
        .and_then(|quantity| vgpu_kube::quantity::whole(quantity).ok())
        .and_then(|value| usize::try_from(value).ok())
        .unwrap_or(0)
}

fn restartable(container: &Container) -> bool {
    container.restart_policy.as_deref() == Some("Always")
}

/// The container being admitted, when PodResources and `pods` (this node's) tell it for
/// certain.
pub fn admitting(
    pods: &[Pod],
    holders: &HolderIndex,
    core_resource: &str,
    memory_resource: &str,
) -> Option<Admitting> {
    let mut found = None;
    for pod in pods {
        let (Some(namespace), Some(name), Some(spec)) = (
            pod.metadata.namespace.as_deref(),
            pod.metadata.name.as_deref(),
            pod.spec.as_ref(),
        ) else {
            continue;
        };
        let phase = pod
            .status
            .as_ref()
            .and_then(|status| status.phase.as_deref());
        if pod.metadata.deletion_timestamp.is_some()
            || matches!(phase, Some("Succeeded" | "Failed"))
        {
            continue;
        }
        let init = spec.init_containers.iter().flatten().map(|c| (c, true));
        let mut short = None;
        let mut unlisted_init = false;
        for (container, is_init) in init.chain(spec.containers.iter().map(|c| (c, false))) {
            let (cores, memory) = (
                limit(container, core_resource),
                limit(container, memory_resource),
            );
            if cores == 0 && memory == 0 {
                continue;
            }
            if is_init && !restartable(container) {
                unlisted_init = true;
                continue;
            }
            let owner = Owner {
                namespace: namespace.to_string(),
                pod: name.to_string(),
                container: container.name.clone(),
            };
            let Some((listed_cores, listed_memory)) = holders.listed_container(&owner) else {
                break; // Not listed: kubelet has not started admitting this pod.
            };
            if listed_cores.len() < cores || listed_memory.len() < memory {
                short = Some(Admitting {
                    owner,
                    cores,
                    memory,
                    listed_cores: listed_cores.iter().cloned().collect(),
                    listed_memory: listed_memory.iter().cloned().collect(),
                });
                break;
            }
        }
        // PodResources never lists an init container that is not restartable: while
        // such a pod is being admitted, which container it is cannot be told.
        if unlisted_init && short.is_some() {
            return None;
        }
        if let Some(short) = short {
            if found.is_some() {
                return None;
            }
            found = Some(short);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_kubelet_api::podresources::{ContainerDevices, ContainerResources, PodResources};

    const CORE: &str = "tencent.com/vcuda-core";
    const MEMORY: &str = "tencent.com/vcuda-memory";

    fn pod(name: &str, containers: &[(&str, u32, u32)], phase: &str) -> Pod {
        let containers: Vec<serde_json::Value> = containers
            .iter()
            .map(|(name, cores, memory)| {
                let mut limits = serde_json::Map::new();
                if *cores > 0 {
                    limits.insert(CORE.into(), cores.to_string().into());
                }
                if *memory > 0 {
                    limits.insert(MEMORY.into(), memory.to_string().into());
                }
                serde_json::json!({"name": name, "resources": {"limits": limits}})
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"nodeName": "n", "containers": containers},
            "status": {"phase": phase}
        }))
        .expect("pod")
    }

    /// A container as PodResources lists it: (name, core IDs held, memory IDs held).
    type ListedContainer<'a> = (&'a str, usize, usize);

    fn listed(pods: &[(&str, &[ListedContainer])]) -> HolderIndex {
        let pods: Vec<PodResources> = pods
            .iter()
            .map(|(name, containers)| PodResources {
                name: name.to_string(),
                namespace: "ns".into(),
                containers: containers
                    .iter()
                    .map(|(container, cores, memory)| ContainerResources {
                        name: container.to_string(),
                        devices: [(CORE, *cores, "c"), (MEMORY, *memory, "m")]
                            .into_iter()
                            .filter(|(_, count, _)| *count > 0)
                            .map(|(resource, count, tag)| ContainerDevices {
                                resource_name: resource.into(),
                                device_ids: (0..count)
                                    .map(|i| format!("{name}-{container}-{tag}{i}"))
                                    .collect(),
                                topology: None,
                            })
                            .collect(),
                        cpu_ids: vec![],
                        memory: vec![],
                    })
                    .collect(),
            })
            .collect();
        HolderIndex::from_list(&pods, CORE, MEMORY)
    }

    #[test]
    fn the_first_short_container_of_the_listed_pod_is_the_one_admitted() {
        let pods = [
            pod("done", &[("a", 30, 8)], "Running"),
            pod("new", &[("a", 20, 4), ("b", 10, 2)], "Pending"),
            pod("later", &[("a", 10, 2)], "Pending"),
        ];
        // `new`'s memory was allocated first; `later` is not listed yet.
        let holders = listed(&[
            ("done", &[("a", 30, 8)]),
            ("new", &[("a", 0, 4), ("b", 0, 0)]),
        ]);
        let found = admitting(&pods, &holders, CORE, MEMORY).expect("found");
        assert_eq!(found.owner.pod, "new");
        assert_eq!(found.owner.container, "a");
        assert_eq!((found.cores, found.memory), (20, 4));
        assert_eq!(found.listed(Kind::Memory).len(), 4);
        assert!(found.listed(Kind::Core).is_empty());
        // Its first container done, the second is next.
        let holders = listed(&[
            ("done", &[("a", 30, 8)]),
            ("new", &[("a", 20, 4), ("b", 0, 0)]),
        ]);
        let found = admitting(&pods, &holders, CORE, MEMORY).expect("found");
        assert_eq!(found.owner.container, "b");
    }

    #[test]
    fn nothing_is_guessed_when_two_pods_fall_short_or_none_does() {
        let pods = [
            pod("x", &[("a", 20, 4)], "Pending"),
            pod("y", &[("a", 20, 4)], "Pending"),
        ];
        let both = listed(&[("x", &[("a", 0, 0)]), ("y", &[("a", 20, 0)])]);
        assert_eq!(admitting(&pods, &both, CORE, MEMORY), None);
        let done = listed(&[("x", &[("a", 20, 4)]), ("y", &[("a", 20, 4)])]);
        assert_eq!(admitting(&pods, &done, CORE, MEMORY), None);
    }

    #[test]
    fn terminal_and_deleted_pods_are_never_the_one_admitted() {
        let failed = pod("x", &[("a", 20, 4)], "Failed");
        let holders = listed(&[("x", &[("a", 0, 0)])]);
        assert_eq!(admitting(&[failed], &holders, CORE, MEMORY), None);
    }
}
