//! What one container gets on disk and in its Allocate response: the allocation folder
//! (`<state_dir>/allocations/<id>/` with `vgpu.yaml` and `usage.region`), the link
//! `<state_dir>/containers/<namespace>_<pod>/<container>` to it, and the mounts,
//! devices, envs and annotations kubelet passes to the runtime.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use vgpu_common::region::{Region, RegionDevice};
use vgpu_common::{Config, CoreMode, DeviceQuota};

use crate::allocator::PreStartPlan;
use crate::config::PluginConfig;
use crate::devices::CardInfo;
use crate::layout;
use crate::proto::deviceplugin::{CdiDevice, ContainerAllocateResponse, DeviceSpec, Mount};
use crate::state::{AllocationRecord, Owner, write_atomically};

/// Annotation with the allocation ID.
pub const ANNOTATION_ALLOCATION: &str = "tencent.com/vcuda-allocation";
/// Annotation with the card UUIDs.
pub const ANNOTATION_CARDS: &str = "tencent.com/vcuda-cards";
/// Annotation with the number of core units of this response.
pub const ANNOTATION_CORES: &str = "tencent.com/vcuda-core";
/// Annotation with the number of memory units of this response.
pub const ANNOTATION_MEMORY: &str = "tencent.com/vcuda-memory";

/// `<state_dir>/allocations/<id>`.
pub fn allocation_dir(config: &PluginConfig, id: &str) -> PathBuf {
    config.allocations_dir().join(id)
}

/// Creates the allocation folder with a provisional config (the final one is written at
/// PreStartContainer), so the file mounts always have a source.
pub fn create_allocation_dir(
    config: &PluginConfig,
    record: &AllocationRecord,
) -> anyhow::Result<PathBuf> {
    let dir = allocation_dir(config, &record.id);
    std::fs::create_dir_all(&dir)
        .map_err(|err| anyhow::anyhow!("cannot create {}: {err}", dir.display()))?;
    let provisional = Config {
        driver_dir: Some(vgpu_ldconfig::LayoutPaths::default().container_driver_lib_dir()),
        usage_region: Some(PathBuf::from(layout::CONTAINER_REGION)),
        devices: Vec::new(),
        ..Config::default()
    };
    write_atomically(&dir.join("vgpu.yaml"), provisional.to_yaml().as_bytes())?;
    let region = dir.join("usage.region");
    if !region.exists() {
        std::fs::File::create(&region)
            .map_err(|err| anyhow::anyhow!("cannot create {}: {err}", region.display()))?;
    }
    Ok(dir)
}

fn mount(container: &str, host: &Path, read_only: bool) -> Mount {
    Mount {
        container_path: container.to_string(),
        host_path: host.to_string_lossy().into_owned(),
        read_only,
    }
}

/// The Allocate response of one container request.
pub fn allocate_response(
    config: &PluginConfig,
    record: &AllocationRecord,
    cards: &[&CardInfo],
    returns_mounts: bool,
    units: (usize, usize),
) -> ContainerAllocateResponse {
    let mut annotations = HashMap::new();
    annotations.insert(ANNOTATION_ALLOCATION.to_string(), record.id.clone());
    annotations.insert(ANNOTATION_CARDS.to_string(), record.cards.join(","));
    if units.0 > 0 {
        annotations.insert(ANNOTATION_CORES.to_string(), units.0.to_string());
    }
    if units.1 > 0 {
        annotations.insert(ANNOTATION_MEMORY.to_string(), units.1.to_string());
    }
    let mut response = ContainerAllocateResponse {
        annotations,
        ..ContainerAllocateResponse::default()
    };
    if !returns_mounts {
        return response;
    }
    let dir = allocation_dir(config, &record.id);
    // The driver folder, the shims over every library folder, nvidia-smi and their env:
    // the layout vgpu-ldconfig describes. Only nvidia-smi is optional (the host may have
    // none); a missing shim must fail the container's start, never let it run unshimmed.
    let mut driver = layout::driver_layout(config).layout();
    driver
        .mounts
        .retain(|m| !m.container_path.ends_with("nvidia-smi") || m.host_path.exists());
    for driver_mount in &driver.mounts {
        let container = driver_mount.container_path.to_string_lossy();
        response.mounts.push(mount(
            &container,
            &driver_mount.host_path,
            driver_mount.read_only,
        ));
    }
    response.envs.extend(driver.env);
    response.mounts.push(mount(
        layout::CONTAINER_CONFIG,
        &dir.join("vgpu.yaml"),
        true,
    ));
    response.mounts.push(mount(
        layout::CONTAINER_REGION,
        &dir.join("usage.region"),
        false,
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
    for node in nodes {
        let host = config.dev_root.join(&node);
        if host.exists() {
            response.devices.push(DeviceSpec {
                container_path: format!("/dev/{node}"),
                host_path: host.to_string_lossy().into_owned(),
                permissions: "rw".into(),
            });
        }
    }
    response.envs.insert(
        vgpu_common::config::CONFIG_ENV.to_string(),
        layout::CONTAINER_CONFIG.to_string(),
    );
    response
        .envs
        .insert("NVIDIA_VISIBLE_DEVICES".into(), "void".into());
    if config.cdi_devices {
        for card in cards {
            response.cdi_devices.push(CdiDevice {
                name: format!("{}={}", config.cdi_kind, card.uuid),
            });
        }
    }
    response
}

/// The final container config of a PreStart plan.
pub fn container_config(devices: &[DeviceQuota]) -> Config {
    Config {
        driver_dir: Some(vgpu_ldconfig::LayoutPaths::default().container_driver_lib_dir()),
        usage_region: Some(PathBuf::from(layout::CONTAINER_REGION)),
        devices: devices.to_vec(),
        ..Config::default()
    }
}

fn region_devices(devices: &[DeviceQuota]) -> Vec<RegionDevice> {
    devices
        .iter()
        .map(|device| RegionDevice {
            id: device.selector().to_string(),
            memory_limit: device.memory_limit.map_or(0, |limit| limit.bytes()),
            core_limit: device.effective_core_limit().unwrap_or(0),
            core_mode: u32::from(device.core_mode == CoreMode::Soft),
        })
        .collect()
}

/// Writes the config and the region of every folder of the plan, and links the
/// container's folder to the first.
pub fn write_prestart(config: &PluginConfig, plan: &PreStartPlan) -> anyhow::Result<PathBuf> {
    let quota = container_config(&plan.devices);
    quota
        .validate()
        .map_err(|message| anyhow::anyhow!("the computed config is invalid: {message}"))?;
    let yaml = quota.to_yaml();
    let mut first = None;
    for id in &plan.allocation_ids {
        let dir = allocation_dir(config, id);
        std::fs::create_dir_all(&dir)
            .map_err(|err| anyhow::anyhow!("cannot create {}: {err}", dir.display()))?;
        write_atomically(&dir.join("vgpu.yaml"), yaml.as_bytes())?;
        Region::open(&dir.join("usage.region"), &region_devices(&plan.devices))?;
        first.get_or_insert(dir);
    }
    let target = first.ok_or_else(|| anyhow::anyhow!("the plan names no allocation"))?;
    link_container(config, &plan.owner, &target)?;
    Ok(target)
}

/// `<containers>/<namespace>_<pod>/<container>`.
pub fn container_link(config: &PluginConfig, owner: &Owner) -> PathBuf {
    config
        .containers_dir()
        .join(owner.pod_key())
        .join(&owner.container)
}

fn link_container(config: &PluginConfig, owner: &Owner, target: &Path) -> anyhow::Result<()> {
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

/// Removes a collected allocation's folder and container link.
pub fn remove_allocation(config: &PluginConfig, record: &AllocationRecord) {
    let dir = allocation_dir(config, &record.id);
    if let Err(err) = std::fs::remove_dir_all(&dir)
        && err.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(dir = %dir.display(), error = %err, "cannot remove allocation folder");
    }
    if let Some(owner) = &record.owner {
        let link = container_link(config, owner);
        let _ = std::fs::remove_file(&link);
        if let Some(parent) = link.parent() {
            let _ = std::fs::remove_dir(parent);
        }
    }
}

/// Allocation folders on disk that the state does not know and that are older than
/// `grace`: leftovers of a crash between mkdir and the state write.
pub fn orphan_dirs(
    config: &PluginConfig,
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
