//! What the device plugin writes and answers for one container beyond the shared
//! allocation folder ([`vgpu_node_agent::container`]): the Allocate response (the
//! container edits and the CDI device name, as `device_list_strategy` says), and the
//! files PreStartContainer leaves (the config and a fresh region in the allocation's
//! folder, hard links in every alias folder, the container's link).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use vgpu_contract::region::Region;
use vgpu_node_agent::cdi::ContainerEdits;
use vgpu_node_agent::config::NodeConfig;
use vgpu_node_agent::container::{
    ANNOTATION_ALLOCATION, ANNOTATION_CARDS, ANNOTATION_CORES, ANNOTATION_MEMORY, CONFIG_FILE,
    REGION_FILE, allocation_dir, container_config, link_container,
};
use vgpu_node_agent::persist::write_atomically;
use vgpu_node_agent::state::AllocationRecord;

use crate::allocator::PreStartPlan;
use vgpu_kubelet_api::deviceplugin::{CdiDevice, ContainerAllocateResponse, DeviceSpec, Mount};

/// The Allocate response of one container request: the edits themselves unless the
/// strategy is CDI alone, and the CDI device name when a spec was written.
pub fn allocate_response(
    config: &NodeConfig,
    record: &AllocationRecord,
    edits: &ContainerEdits,
    cdi_name: Option<String>,
) -> ContainerAllocateResponse {
    let mut annotations = HashMap::new();
    annotations.insert(ANNOTATION_ALLOCATION.to_string(), record.id.clone());
    annotations.insert(ANNOTATION_CARDS.to_string(), record.cards.join(","));
    if !record.core_ids.is_empty() {
        annotations.insert(
            ANNOTATION_CORES.to_string(),
            record.core_ids.len().to_string(),
        );
    }
    if !record.memory_ids.is_empty() {
        annotations.insert(
            ANNOTATION_MEMORY.to_string(),
            record.memory_ids.len().to_string(),
        );
    }
    let mut response = ContainerAllocateResponse {
        annotations,
        ..ContainerAllocateResponse::default()
    };
    if config.device_list_strategy.mounts() {
        response.mounts = edits
            .mounts
            .iter()
            .map(|mount| Mount {
                container_path: mount.container_path.clone(),
                host_path: mount.host_path.clone(),
                read_only: mount.read_only(),
            })
            .collect();
        response.devices = edits
            .device_nodes
            .iter()
            .map(|node| DeviceSpec {
                container_path: node.path.clone(),
                host_path: node.host_path.clone().unwrap_or_else(|| node.path.clone()),
                permissions: node.permissions.clone().unwrap_or_default(),
            })
            .collect();
        response.envs = edits.env_map().into_iter().collect();
    }
    if let Some(name) = cdi_name {
        response.cdi_devices.push(CdiDevice { name });
    }
    response
}

/// Replaces `at` with a hard link to `target` (link beside it, then rename).
fn hard_link_over(target: &Path, at: &Path) -> anyhow::Result<()> {
    let name = at
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temp = at.with_file_name(format!(".{name}.link-{}", std::process::id()));
    let _ = std::fs::remove_file(&temp);
    std::fs::hard_link(target, &temp)
        .and_then(|()| std::fs::rename(&temp, at))
        .map_err(|err| {
            let _ = std::fs::remove_file(&temp);
            anyhow::anyhow!(
                "cannot link {} to {}: {err}",
                at.display(),
                target.display()
            )
        })
}

/// Writes the config and a fresh region of the plan's allocation, makes every alias
/// folder hold the same two files, and links the container's folder to it.
pub fn write_prestart(config: &NodeConfig, plan: &PreStartPlan) -> anyhow::Result<PathBuf> {
    let mut quota = container_config(&plan.devices, &plan.allocation_id);
    quota.warn_on_refusal = plan
        .owner
        .as_ref()
        .is_some_and(|owner| config.warns_on_refusal(&owner.namespace));
    quota
        .validate()
        .map_err(|message| anyhow::anyhow!("the computed config is invalid: {message}"))?;
    let dir = allocation_dir(config, &plan.allocation_id);
    std::fs::create_dir_all(&dir)
        .map_err(|err| anyhow::anyhow!("cannot create {}: {err}", dir.display()))?;
    write_atomically(&dir.join(CONFIG_FILE), quota.to_yaml().as_bytes())?;
    // The container is not running (kubelet calls PreStartContainer before each start):
    // a fresh region carries over no slot of an earlier run's processes.
    Region::create_file(&dir.join(REGION_FILE), &quota.region_devices())?;
    for alias in &plan.alias_ids {
        let alias_dir = allocation_dir(config, alias);
        std::fs::create_dir_all(&alias_dir)
            .map_err(|err| anyhow::anyhow!("cannot create {}: {err}", alias_dir.display()))?;
        for file in [CONFIG_FILE, REGION_FILE] {
            hard_link_over(&dir.join(file), &alias_dir.join(file))?;
        }
    }
    if let Some(owner) = &plan.owner {
        link_container(config, owner, &dir)?;
    }
    Ok(dir)
}
