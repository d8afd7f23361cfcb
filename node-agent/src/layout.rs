//! The per-container part of the mount layout: the config, the usage region and the
//! device nodes. The driver part (shims, driver folder, nvidia-smi, env) is
//! `vgpu_ldconfig::layout`, shared with `vgpu-ldconfig layout`.

/// The container config (read-only).
pub const CONTAINER_CONFIG: &str = "/etc/vgpu/vgpu.yaml";
/// The usage region (read-write).
pub const CONTAINER_REGION: &str = "/etc/vgpu/usage.region";
/// The host's per-card compute views (read-only): the config's `card_state_dir`.
pub const CONTAINER_CARDS: &str = "/etc/vgpu/cards";

/// The prepared driver folder on the host (`vgpu-ldconfig prepare` output).
pub const HOST_DRIVER_DIR: &str = "/var/lib/vgpu/driver";
/// Inside the host driver folder: the shims.
pub const HOST_SHIM_SUBDIR: &str = "shim";

/// Host device nodes every container gets, when they exist.
pub const CONTROL_DEVICES: [&str; 3] =
    ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"];

/// The driver layout for a node config. `host_driver_dir` is resolved through its
/// `current` link now (as are configured paths inside it), so a container mounts the
/// version folder that is current when it starts and keeps it for its whole life,
/// whatever later preparations switch `current` to.
pub fn driver_layout(config: &crate::config::NodeConfig) -> vgpu_ldconfig::LayoutPaths {
    let base = &config.host_driver_dir;
    vgpu_ldconfig::LayoutPaths {
        host_driver_dir: vgpu_ldconfig::versions::prepared_dir(base),
        host_shim_dir: Some(vgpu_ldconfig::versions::follow_current(
            base,
            &config.shim_dir,
        )),
        ..vgpu_ldconfig::LayoutPaths::default()
    }
}
