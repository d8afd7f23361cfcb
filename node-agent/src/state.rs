//! Allocations kept on disk in `plugin-state.json`, so a restarted plugin neither loses
//! nor double-books them. Read and written by [`crate::persist`] (version check, atomic
//! replacement).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::persist::Versioned;

/// Layout version of the state file.
pub const STATE_VERSION: u32 = 1;

/// The pod and container that hold an allocation (known after PreStartContainer).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    /// The pod's namespace, as PodResources lists it.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The container's name within the pod.
    pub container: String,
}

impl Owner {
    /// Folder name of the pod under `containers/`: PodResources v1 names pods by
    /// namespace and name only (it carries no UID), so `<namespace>_<pod>`.
    pub fn pod_key(&self) -> String {
        format!("{}_{}", self.namespace, self.pod)
    }
}

/// The devices of one Allocate call, and after PreStartContainer those of the whole
/// container (its other resource's record folded in, that record's folder kept as an
/// alias of this one).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocationRecord {
    /// `a<creation seconds, hex>-<sequence>`: the allocation folder's name, the CDI
    /// device's name and (for the record a container keeps) its `container_id`.
    pub id: String,
    /// Order of creation (newest is highest): one per Allocate call, so a container's two
    /// calls are neighbours.
    pub sequence: u64,
    /// Card UUIDs, in order (several only for whole-card requests).
    pub cards: Vec<String>,
    /// The `tencent.com/vcuda-core` device IDs kubelet allocated (`<uuid>-core-<k>`);
    /// empty for a memory-only record.
    pub core_ids: Vec<String>,
    /// The `tencent.com/vcuda-memory` device IDs (`<uuid>-mem-<k>`); empty for a
    /// core-only record.
    pub memory_ids: Vec<String>,
    /// Seconds since the epoch at the Allocate call.
    pub created_unix: u64,
    /// The container, when PodResources named it at PreStartContainer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<Owner>,
    /// Seconds since the epoch at the last PreStartContainer; `None` until then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prepared_unix: Option<u64>,
    /// The earliest record whose device IDs this one shares: kubelet hands an init
    /// container's devices to the pod's next container (`devicesToReuse`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reuses: Option<String>,
    /// Folders of the records folded into this one; they hold the same files.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aliases: Vec<String>,
    /// The container kubelet was admitting at this Allocate call, when
    /// the device plugin's `admitting` could tell: once PodResources no longer lists its pod, kubelet
    /// rejected or forgot it, and the record is released even within the pairing window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admitted_for: Option<Owner>,
}

impl AllocationRecord {
    /// Every device ID held.
    pub fn device_ids(&self) -> impl Iterator<Item = &String> {
        self.core_ids.iter().chain(self.memory_ids.iter())
    }

    /// The record that began this one's group of shared IDs (itself when it shares none).
    pub fn reuse_root(&self) -> &str {
        self.reuses.as_deref().unwrap_or(&self.id)
    }

    /// This record's folder and its aliases.
    pub fn folder_ids(&self) -> impl Iterator<Item = &String> {
        std::iter::once(&self.id).chain(self.aliases.iter())
    }
}

/// The whole state file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginState {
    /// The file's layout version ([`STATE_VERSION`]); another version is refused.
    pub version: u32,
    /// Next sequence number for allocation IDs.
    pub next_sequence: u64,
    /// Every live allocation, by [`AllocationRecord::id`].
    pub allocations: BTreeMap<String, AllocationRecord>,
}

impl Default for PluginState {
    fn default() -> PluginState {
        PluginState {
            version: STATE_VERSION,
            next_sequence: 1,
            allocations: BTreeMap::new(),
        }
    }
}

impl PluginState {
    /// Every allocation folder the state knows (records and their aliases).
    pub fn folder_ids(&self) -> Vec<String> {
        self.allocations
            .values()
            .flat_map(|record| record.folder_ids().cloned())
            .collect()
    }
}

/// Read and written by [`Versioned::load`] and [`Versioned::save`].
impl Versioned for PluginState {
    const VERSION: u32 = STATE_VERSION;
    const WHAT: &'static str = "state";
    fn version(&self) -> u32 {
        self.version
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_corruption() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("plugin-state.json");
        assert_eq!(
            PluginState::load(&path).expect("missing is empty"),
            PluginState::default()
        );
        let mut state = PluginState::default();
        state.allocations.insert(
            "a1".into(),
            AllocationRecord {
                id: "a1".into(),
                sequence: 1,
                cards: vec!["GPU-1".into()],
                core_ids: vec!["GPU-1-core-0".into()],
                memory_ids: vec![],
                created_unix: 5,
                owner: Some(Owner {
                    namespace: "ns".into(),
                    pod: "p".into(),
                    container: "c".into(),
                }),
                prepared_unix: Some(6),
                reuses: None,
                aliases: vec!["a2".into()],
                admitted_for: None,
            },
        );
        state.save(&path).expect("save");
        assert_eq!(PluginState::load(&path).expect("load"), state);
        assert_eq!(state.folder_ids(), ["a1", "a2"]);
        let leftovers: Vec<_> = std::fs::read_dir(dir.path()).expect("dir").collect();
        assert_eq!(leftovers.len(), 1, "no temp file is left behind");
        std::fs::write(&path, b"{ not json").expect("write");
        assert!(
            PluginState::load(&path)
                .unwrap_err()
                .to_string()
                .contains("corrupt")
        );
    }
}
