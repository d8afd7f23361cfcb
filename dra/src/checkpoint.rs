//! Prepared claims kept on disk in `dra-state.json`, so a restarted plugin answers a
//! repeated NodePrepareResources with the same devices and can still undo a claim
//! prepared before the restart. Read and written by the device plugin's
//! `vgpu_node_agent::persist` (version check, atomic replacement) before kubelet hears the
//! answer.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use vgpu_node_agent::persist::Versioned;

/// Layout version of the state file.
pub const CHECKPOINT_VERSION: u32 = 1;

/// One device entry of a NodePrepareResources answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedDevice {
    /// The `Device.request_names` answered: the claim's requests this device serves.
    pub request_names: Vec<String>,
    /// `Device.pool_name`: the ResourceSlice pool (this node's).
    pub pool_name: String,
    /// `Device.device_name`: the slice's device (`gpu-<index>`).
    pub device_name: String,
    /// `Device.cdi_device_ids`: fully-qualified CDI names (`vendor/class=name`) the
    /// runtime applies to the container.
    pub cdi_device_ids: Vec<String>,
}

/// One prepared request: its container config folder and CDI device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedRequest {
    /// The claim's request (`name` or `name/subrequest`).
    pub request: String,
    /// The config's `container_id`, the allocation folder's and the CDI device's name.
    pub container_id: String,
    /// Card UUIDs with their consumed (cores, memory bytes); `None` is the whole card.
    pub cards: Vec<(String, Option<u64>, Option<u64>)>,
    /// The soft ceiling written, if any.
    pub core_ceiling: Option<u32>,
}

/// A pod a prepared claim is reserved for (its `status.reservedFor`, in the claim's
/// namespace): whose Events a refusal in the claim's containers becomes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimPod {
    /// The pod's name.
    pub name: String,
    /// The pod's UID.
    pub uid: String,
}

/// One prepared claim.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedClaim {
    /// The claim's namespace, as kubelet named it.
    pub namespace: String,
    /// The claim's name.
    pub name: String,
    /// The pods the claim was reserved for when it was prepared. Absent in files of
    /// drivers before this field (read as empty; the daemon fills it in from the claim).
    #[serde(default)]
    pub pods: Vec<ClaimPod>,
    /// The answer kubelet got, returned unchanged if it asks again.
    pub devices: Vec<PreparedDevice>,
    /// What was written per request, so unprepare removes exactly that.
    pub requests: Vec<PreparedRequest>,
}

/// The whole file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The file's layout version ([`CHECKPOINT_VERSION`]); another version is refused.
    pub version: u32,
    /// By claim UID.
    pub claims: BTreeMap<String, PreparedClaim>,
}

impl Default for Checkpoint {
    fn default() -> Checkpoint {
        Checkpoint {
            version: CHECKPOINT_VERSION,
            claims: BTreeMap::new(),
        }
    }
}

/// Read and written by `Versioned::load` and `Versioned::save`: missing is empty, corrupt
/// is an error (the plugin refuses to start rather than forget what it prepared).
impl Versioned for Checkpoint {
    const VERSION: u32 = CHECKPOINT_VERSION;
    const WHAT: &'static str = "checkpoint";
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
        let path = dir.path().join("dra-state.json");
        assert_eq!(
            Checkpoint::load(&path).expect("missing"),
            Checkpoint::default()
        );
        let mut checkpoint = Checkpoint::default();
        checkpoint.claims.insert(
            "uid-1".into(),
            PreparedClaim {
                namespace: "ns".into(),
                name: "c".into(),
                pods: vec![ClaimPod {
                    name: "p".into(),
                    uid: "pod-uid".into(),
                }],
                devices: vec![PreparedDevice {
                    request_names: vec!["gpu".into()],
                    pool_name: "node".into(),
                    device_name: "gpu-0".into(),
                    cdi_device_ids: vec!["vgpu-shim.io/gpu=uid-1-gpu".into()],
                }],
                requests: vec![PreparedRequest {
                    request: "gpu".into(),
                    container_id: "uid-1-gpu".into(),
                    cards: vec![("GPU-0".into(), Some(30), Some(2560 << 20))],
                    core_ceiling: Some(50),
                }],
            },
        );
        checkpoint.save(&path).expect("save");
        assert_eq!(Checkpoint::load(&path).expect("load"), checkpoint);
        // A file of a driver before `pods`: read, with no pods.
        let mut old: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("json");
        old["claims"]["uid-1"]
            .as_object_mut()
            .expect("claim")
            .remove("pods");
        std::fs::write(&path, old.to_string()).expect("write");
        let read = Checkpoint::load(&path).expect("an older file");
        assert_eq!(read.claims["uid-1"].pods, Vec::new());
        assert_eq!(
            read.claims["uid-1"].requests,
            checkpoint.claims["uid-1"].requests
        );
        std::fs::write(&path, b"{").expect("write");
        assert!(
            Checkpoint::load(&path)
                .unwrap_err()
                .to_string()
                .contains("corrupt")
        );
    }
}
