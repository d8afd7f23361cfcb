//! Refusing to start when another device plugin already serves our resource names on
//! this node (gpu-manager registers the same `tencent.com/vcuda-core` and
//! `tencent.com/vcuda-memory`): kubelet would hand the resource to whichever plugin
//! registered last, and the two would double-book the cards.
//!
//! The signal needs two facts, because either alone can be stale:
//! * a *live* foreign socket in the device-plugin folder: one that is not kubelet's nor
//!   ours and that accepts a connection (a socket file left by a dead plugin refuses);
//! * that it serves one of our names: kubelet's checkpoint
//!   (`kubelet_internal_checkpoint`, `RegisteredDevices`) lists devices that are not
//!   ours under that name, and the socket's ListAndWatch offers them; or its file name
//!   is gpu-manager's (`vcore.sock`, `vmemory.sock`). Other plugins' sockets are only
//!   asked for their devices when the checkpoint gives a reason to.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::ids::DeviceId;
use vgpu_kubelet_api::deviceplugin::Empty;
use vgpu_kubelet_api::deviceplugin::device_plugin_client::DevicePluginClient;
use vgpu_node_agent::config::NodeConfig;
use vgpu_node_agent::dial::connect_unix;

/// Kubelet's device-manager checkpoint, in the device-plugin folder.
pub const KUBELET_CHECKPOINT: &str = "kubelet_internal_checkpoint";
/// gpu-manager's socket names and the resource each serves.
pub const GPU_MANAGER_SOCKETS: [(&str, &str); 2] = [
    ("vcore.sock", "tencent.com/vcuda-core"),
    ("vmemory.sock", "tencent.com/vcuda-memory"),
];
/// How long a foreign socket has to answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// Another plugin serving one of our resource names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Foreign {
    pub resource: String,
    pub socket: PathBuf,
    /// How we know: the checkpoint's devices, or gpu-manager's socket name.
    pub evidence: String,
}

impl Foreign {
    /// The line the plugin exits with.
    pub fn refusal(&self) -> String {
        format!(
            "{} is already served on this node by another device plugin (socket {}; {}): remove that plugin from this node first (deploy/README.md, co-existence), or set check_foreign_plugins: false",
            self.resource,
            self.socket.display(),
            self.evidence
        )
    }
}

#[derive(Deserialize)]
struct Checkpoint {
    #[serde(rename = "Data")]
    data: CheckpointData,
}

#[derive(Deserialize)]
struct CheckpointData {
    #[serde(rename = "RegisteredDevices", default)]
    registered_devices: BTreeMap<String, Vec<String>>,
}

/// Devices kubelet's checkpoint lists for each resource; empty when it is absent or
/// unreadable (a missing checkpoint is a fresh kubelet).
pub fn registered_devices(device_plugin_dir: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let Ok(bytes) = std::fs::read(device_plugin_dir.join(KUBELET_CHECKPOINT)) else {
        return BTreeMap::new();
    };
    match serde_json::from_slice::<Checkpoint>(&bytes) {
        Ok(checkpoint) => checkpoint
            .data
            .registered_devices
            .into_iter()
            .map(|(resource, ids)| (resource, ids.into_iter().collect()))
            .collect(),
        Err(err) => {
            tracing::warn!(error = %err, "kubelet's device checkpoint is unreadable; judging foreign sockets by name only");
            BTreeMap::new()
        }
    }
}

/// The first ListAndWatch answer of the plugin on `socket`; `None` when nothing
/// answers in time (a dead plugin's socket file).
async fn advertised(socket: &Path) -> Option<BTreeSet<String>> {
    let ask = async {
        let channel = connect_unix(socket).await.ok()?;
        let mut stream = DevicePluginClient::new(channel)
            .list_and_watch(Empty {})
            .await
            .ok()?
            .into_inner();
        let first = stream.message().await.ok()??;
        Some(first.devices.into_iter().map(|device| device.id).collect())
    };
    tokio::time::timeout(PROBE_TIMEOUT, ask).await.ok()?
}

/// Live foreign plugins serving our resource names.
pub(crate) async fn foreign_plugins(config: &NodeConfig) -> Vec<Foreign> {
    let ours: BTreeSet<String> = [
        config.kubelet_socket.clone(),
        NodeConfig::endpoint_name(&config.core_resource),
        NodeConfig::endpoint_name(&config.memory_resource),
    ]
    .into();
    let our_resources = [&config.core_resource, &config.memory_resource];
    // Devices kubelet registered under our names that are not ours (ours from an
    // earlier run of this plugin do not count).
    let registered: BTreeMap<String, BTreeSet<String>> =
        registered_devices(&config.device_plugin_dir)
            .into_iter()
            .filter(|(resource, _)| our_resources.contains(&resource))
            .map(|(resource, ids)| {
                let foreign = ids
                    .into_iter()
                    .filter(|id| DeviceId::parse(id).is_none())
                    .collect::<BTreeSet<String>>();
                (resource, foreign)
            })
            .filter(|(_, ids)| !ids.is_empty())
            .collect();
    let Ok(entries) = std::fs::read_dir(&config.device_plugin_dir) else {
        return Vec::new();
    };
    let mut sockets: Vec<(String, PathBuf)> = entries
        .flatten()
        .filter(|entry| {
            use std::os::unix::fs::FileTypeExt;
            entry.file_type().is_ok_and(|kind| kind.is_socket())
        })
        .filter_map(|entry| Some((entry.file_name().into_string().ok()?, entry.path())))
        .filter(|(name, _)| !ours.contains(name))
        .collect();
    sockets.sort();
    let mut found = Vec::new();
    for (name, socket) in sockets {
        // Only a socket that answers is a plugin; a leftover file is not.
        let connect = tokio::net::UnixStream::connect(&socket);
        if !matches!(
            tokio::time::timeout(PROBE_TIMEOUT, connect).await,
            Ok(Ok(_))
        ) {
            continue;
        }
        let devices = if registered.is_empty() {
            None
        } else {
            advertised(&socket).await
        };
        let mut matched = false;
        if let Some(devices) = &devices {
            for resource in our_resources {
                let Some(known) = registered.get(resource.as_str()) else {
                    continue;
                };
                let shared: Vec<&String> = devices.intersection(known).take(3).collect();
                if !shared.is_empty() {
                    matched = true;
                    found.push(Foreign {
                        resource: resource.clone(),
                        socket: socket.clone(),
                        evidence: format!(
                            "kubelet's checkpoint registers its devices ({}) for {resource}",
                            shared
                                .iter()
                                .map(|id| id.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    });
                }
            }
        }
        if matched {
            continue;
        }
        for (gpu_manager_name, resource) in GPU_MANAGER_SOCKETS {
            if name == gpu_manager_name && our_resources.iter().any(|ours| *ours == resource) {
                found.push(Foreign {
                    resource: resource.to_string(),
                    socket: socket.clone(),
                    evidence: "gpu-manager's socket name, and it answers".to_string(),
                });
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checkpoint_is_read_for_its_registered_devices() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(registered_devices(dir.path()).is_empty());
        std::fs::write(
            dir.path().join(KUBELET_CHECKPOINT),
            r#"{"Data":{"PodDeviceEntries":[{"PodUID":"u","ContainerName":"c","ResourceName":"tencent.com/vcuda-core","DeviceIDs":{"-1":["vcore-0"]},"AllocResp":""}],"RegisteredDevices":{"tencent.com/vcuda-core":["vcore-0","vcore-1"],"nvidia.com/gpu":["GPU-1"]}},"Checksum":1234}"#,
        )
        .expect("write");
        let registered = registered_devices(dir.path());
        assert_eq!(registered.len(), 2);
        assert!(registered["tencent.com/vcuda-core"].contains("vcore-1"));
        std::fs::write(dir.path().join(KUBELET_CHECKPOINT), b"not json").expect("write");
        assert!(registered_devices(dir.path()).is_empty());
    }
}
