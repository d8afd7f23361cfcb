//! What one container gets on disk: the allocation folder (`<state_dir>/allocations/<id>/`
//! with `vgpu.yaml` and `usage.region`), the link
//! `<state_dir>/containers/<namespace>_<pod>/<container>` to it, and the container edits
//! (mounts, device nodes, env) with their CDI spec. Both daemons write these; how the
//! edits reach the runtime beyond the spec is each front end's (the device plugin's
//! Allocate response and PreStart files are `vgpu_plugin::response`).
//!
//! Each Allocate call gets a folder of its own. At PreStartContainer the container's
//! folders are made one: the allocation's folder gets the config and a fresh region
//! (written with file I/O, never mapped: the region is tenant-writable), and every alias
//! folder gets hard links to the same two files, so whichever response's mounts kubelet
//! kept, the container sees the same region, with its own `container_id`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use vgpu_contract::region::Region;
use vgpu_contract::{Config, DeviceQuota};

use crate::cdi::{ContainerEdits, DeviceNode, Mount as CdiMount};
use crate::config::NodeConfig;
use crate::devices::CardInfo;
use crate::layout;
use crate::persist::write_atomically;
use crate::state::{AllocationRecord, Owner};

/// Annotation with the allocation ID (of this response's folder).
pub const ANNOTATION_ALLOCATION: &str = "tencent.com/vcuda-allocation";
/// Annotation with the card UUIDs.
pub const ANNOTATION_CARDS: &str = "tencent.com/vcuda-cards";
/// Annotation with the number of core units of this response.
pub const ANNOTATION_CORES: &str = "tencent.com/vcuda-core";
/// Annotation with the number of memory units of this response.
pub const ANNOTATION_MEMORY: &str = "tencent.com/vcuda-memory";

/// The container config in an allocation folder.
pub const CONFIG_FILE: &str = "vgpu.yaml";
/// The usage region in an allocation folder.
pub const REGION_FILE: &str = "usage.region";
/// Cgroup access of the device nodes.
const DEVICE_PERMISSIONS: &str = "rw";

/// `<state_dir>/allocations/<id>`.
pub fn allocation_dir(config: &NodeConfig, id: &str) -> PathBuf {
    config.allocations_dir().join(id)
}

/// The container config of an allocation: the quota (none yet while provisional,
/// which hides every GPU) and its identity.
pub fn container_config(devices: &[DeviceQuota], container_id: &str) -> Config {
    Config {
        driver_dir: Some(vgpu_ldconfig::LayoutPaths::default().container_driver_lib_dir()),
        container_id: Some(container_id.to_string()),
        usage_region: Some(PathBuf::from(layout::CONTAINER_REGION)),
        card_state_dir: Some(PathBuf::from(layout::CONTAINER_CARDS)),
        devices: devices.to_vec(),
        ..Config::default()
    }
}

/// Creates the allocation folder with a provisional config that hides every GPU (the
/// quota is written at PreStartContainer, which kubelet calls before the container
/// starts) and an empty region, so the file mounts always have a source.
pub fn create_allocation_dir(
    config: &NodeConfig,
    record: &AllocationRecord,
) -> anyhow::Result<PathBuf> {
    let dir = allocation_dir(config, &record.id);
    std::fs::create_dir_all(&dir)
        .map_err(|err| anyhow::anyhow!("cannot create {}: {err}", dir.display()))?;
    let provisional = container_config(&[], &record.id);
    write_atomically(&dir.join(CONFIG_FILE), provisional.to_yaml().as_bytes())?;
    Region::create_file(&dir.join(REGION_FILE), &[])?;
    Ok(dir)
}

/// Everything the container of `record` is given: the driver layout (real driver
/// folder, shims and helper libraries over the loader's folders, `nvidia-smi`), its
/// config and region, the device nodes of its cards and the control nodes, and the env.
pub fn container_edits(
    config: &NodeConfig,
    record: &AllocationRecord,
    cards: &[&CardInfo],
) -> ContainerEdits {
    let dir = allocation_dir(config, &record.id);
    // Only nvidia-smi is optional (the host may have none); a missing shim must fail
    // the container's start, never let it run unshimmed.
    let mut driver = layout::driver_layout(config).layout();
    driver
        .mounts
        .retain(|m| !m.container_path.ends_with("nvidia-smi") || m.host_path.exists());
    let mut mounts: Vec<CdiMount> = driver
        .mounts
        .iter()
        .map(|m| {
            CdiMount::bind(
                &m.host_path,
                &m.container_path.to_string_lossy(),
                m.read_only,
            )
        })
        .collect();
    mounts.push(CdiMount::bind(
        &dir.join(CONFIG_FILE),
        layout::CONTAINER_CONFIG,
        true,
    ));
    mounts.push(CdiMount::bind(
        &dir.join(REGION_FILE),
        layout::CONTAINER_REGION,
        false,
    ));
    // The host's per-card compute views, written by the node's coordinator.
    mounts.push(CdiMount::bind(
        &crate::coordination::cards_dir(&config.state_dir),
        layout::CONTAINER_CARDS,
        true,
    ));
    let mut nodes: Vec<String> = cards
        .iter()
        .filter_map(|card| card.minor)
        .map(|minor| format!("nvidia{minor}"))
        .collect();
    nodes.extend(
        layout::CONTROL_DEVICES
            .iter()
            .filter_map(|path| path.strip_prefix("/dev/"))
            .map(str::to_string),
    );
    let device_nodes = nodes
        .into_iter()
        .map(|node| (format!("/dev/{node}"), config.dev_root.join(&node)))
        .filter(|(_, host)| host.exists())
        .map(|(path, host)| DeviceNode {
            path,
            host_path: Some(host.to_string_lossy().into_owned()),
            node_type: None,
            major: None,
            minor: None,
            permissions: Some(DEVICE_PERMISSIONS.into()),
        })
        .collect();
    let mut env: BTreeMap<String, String> = driver.env;
    env.insert(
        vgpu_contract::config::CONFIG_ENV.to_string(),
        layout::CONTAINER_CONFIG.to_string(),
    );
    // So the NVIDIA runtime hook does not mount the GPUs a second time.
    env.insert("NVIDIA_VISIBLE_DEVICES".into(), "void".into());
    let mut edits = ContainerEdits {
        mounts,
        device_nodes,
        ..ContainerEdits::default()
    };
    edits.set_env(&env);
    edits
}

/// Writes the CDI spec of `record` (its edits, device nodes described from the host);
/// returns the CDI device name.
pub fn write_cdi_spec(
    config: &NodeConfig,
    record: &AllocationRecord,
    edits: &ContainerEdits,
) -> anyhow::Result<String> {
    let mut described = edits.clone();
    described.device_nodes = edits
        .device_nodes
        .iter()
        .map(|node| {
            let host = node.host_path.as_deref().unwrap_or(&node.path);
            DeviceNode::from_host(&node.path, Path::new(host), DEVICE_PERMISSIONS)
        })
        .collect::<Result<_, _>>()?;
    Ok(config.cdi_writer()?.write(&record.id, &described)?)
}

/// `<containers>/<namespace>_<pod>/<container>`.
pub fn container_link(config: &NodeConfig, owner: &Owner) -> PathBuf {
    config
        .containers_dir()
        .join(owner.pod_key())
        .join(&owner.container)
}

/// Points the container's link at `target` (a symlink beside it, then rename).
pub fn link_container(config: &NodeConfig, owner: &Owner, target: &Path) -> anyhow::Result<()> {
    let link = container_link(config, owner);
    if let Some(parent) = link.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|err| anyhow::anyhow!("cannot create {}: {err}", parent.display()))?;
    }
    if std::fs::read_link(&link).is_ok_and(|existing| existing == target) {
        return Ok(());
    }
    let temp = link.with_extension("link-tmp");
    let _ = std::fs::remove_file(&temp);
    std::os::unix::fs::symlink(target, &temp)
        .map_err(|err| anyhow::anyhow!("cannot link {}: {err}", temp.display()))?;
    std::fs::rename(&temp, &link)
        .map_err(|err| anyhow::anyhow!("cannot link {}: {err}", link.display()))
}

/// Removes the CDI spec of each of `ids` (whatever the strategy: it may have changed).
fn remove_specs<'a>(config: &NodeConfig, ids: impl IntoIterator<Item = &'a String>) {
    let Ok(writer) = config.cdi_writer() else {
        return;
    };
    for id in ids {
        if let Err(err) = writer.remove(id) {
            tracing::warn!(allocation = %id, error = %err, "cannot remove CDI spec");
        }
    }
}

/// Removes a collected allocation's folders, CDI specs and container link.
pub fn remove_allocation(config: &NodeConfig, record: &AllocationRecord) {
    for id in record.folder_ids() {
        let dir = allocation_dir(config, id);
        if let Err(err) = std::fs::remove_dir_all(&dir)
            && err.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(dir = %dir.display(), error = %err, "cannot remove allocation folder");
        }
    }
    remove_specs(config, record.folder_ids());
    if let Some(owner) = &record.owner {
        let link = container_link(config, owner);
        if std::fs::read_link(&link)
            .is_ok_and(|target| target == allocation_dir(config, &record.id))
        {
            let _ = std::fs::remove_file(&link);
        }
        if let Some(parent) = link.parent() {
            let _ = std::fs::remove_dir(parent);
        }
    }
}

/// Allocation folders on disk that the state does not know (`known`: every folder id,
/// aliases included) and that are older than `grace`: leftovers of a crash between
/// mkdir and the state write.
pub fn orphan_dirs(
    config: &NodeConfig,
    known: &[String],
    grace: std::time::Duration,
) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(config.allocations_dir()) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|entry| {
            entry
                .file_name()
                .to_str()
                .is_some_and(|name| !known.iter().any(|id| id == name))
        })
        .filter(|entry| {
            entry
                .metadata()
                .and_then(|meta| meta.modified())
                .is_ok_and(|modified| modified.elapsed().is_ok_and(|age| age >= grace))
        })
        .map(|entry| entry.path())
        .collect()
}

/// Removes the CDI specs of our kind whose allocation the state does not know and
/// whose folder is gone; returns how many.
pub fn remove_orphan_specs(config: &NodeConfig, known: &[String]) -> usize {
    let Ok(writer) = config.cdi_writer() else {
        return 0;
    };
    let orphans: Vec<String> = writer
        .names()
        .into_iter()
        .filter(|name| !known.contains(name))
        .filter(|name| !allocation_dir(config, name).exists())
        .collect();
    remove_specs(config, &orphans);
    orphans.len()
}
