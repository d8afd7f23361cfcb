//! The node's config, [`NodeConfig`]: what both daemons' node-side work reads. The device
//! plugin reads it as YAML from `--config` (default `/etc/vgpu/plugin.yaml`); the DRA
//! driver builds one from its own file (`vgpu_dra::DraConfig::node_config`). Every key
//! is optional; unknown keys are errors that name the key.
//!
//! ```yaml
//! device_plugin_dir: /var/lib/kubelet/device-plugins   # kubelet.sock and our sockets
//! kubelet_socket: kubelet.sock                          # inside device_plugin_dir
//! pod_resources_socket: /var/lib/kubelet/pod-resources/kubelet.sock
//! state_dir: /var/lib/vgpu          # plugin-state.json, allocations/, containers/
//! host_driver_dir: /var/lib/vgpu/driver   # prepared by `vgpu-ldconfig prepare`
//! shim_dir: /var/lib/vgpu/driver/shim     # libcuda_shim.so, libnvml_shim.so
//! nvml_library: libnvidia-ml.so.1         # what nvml-wrapper loads (a name or a path)
//! core_resource: tencent.com/vcuda-core
//! memory_resource: tencent.com/vcuda-memory
//! memory_unit: 256MiB                     # one vcuda-memory device
//! policy: binpack                         # or spread
//! default_core_ceiling: 100               # soft-mode ceiling; omit for hard limits
//! pairing_window_secs: 30                # a container's two Allocate calls, and a pod's admission
//! gc_interval_secs: 60
//! gc_grace_secs: 300
//! health_interval_secs: 5
//! kubelet_watch_interval_ms: 1000
//! metrics_address: 127.0.0.1:9401         # omit or null to turn metrics off
//! device_list_strategy: mounts           # mounts (Allocate carries the mounts), cdi, or both
//! cdi_kind: tencent.com/vcuda             # vendor/class of the CDI devices
//! cdi_spec_dir: /var/run/cdi              # where the CDI specs are written
//! cdi_spec_format: json                   # or yaml
//! host_proc: /proc                        # the host's /proc (the DaemonSet runs with hostPID)
//! pod_annotations: true                   # read tencent.com/vcuda-core-limit at PreStart
//! node_name: null                         # this node (default: env NODE_NAME); pods elsewhere are ignored
//! api_server_url: null                    # plain HTTP, no credentials: tests only (default: in-cluster)
//! check_foreign_plugins: true             # refuse to start beside another plugin of our resources
//! config_watch_interval_ms: 2000          # how often the config file is checked for changes
//! quota_events: true                      # a Kubernetes Event on the pod at its first refusal (and over quota)
//! quota_event_interval_secs: 300          # then at most one Event per container and card this often
//! warn_on_refusal_namespaces: []          # namespaces ("*": all) whose containers' shims print a line at each refusal
//! sharing: time-slicing                   # or mps (docs/mps.md); per card: card_sharing
//! card_sharing: {}                        # {GPU-<uuid> or "<index>": mps | time-slicing}
//! mps: {}                                 # the MPS daemons' settings (vgpu_mps::sharing)
//! ```
//!
//! A change of the config file makes the running device plugin exit cleanly, so kubelet
//! restarts it with the new config (the device plugin's `reload`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use vgpu_contract::ByteSize;
use vgpu_mps::{MpsSettings, Sharing, SharingConfig};

use crate::cdi::SpecFormat;
use crate::layout;

/// Where the config is read from when `--config` is not given.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/vgpu/plugin.yaml";

/// How GetPreferredAllocation picks a card among those that fit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// The fullest card that still fits: keeps whole cards free.
    #[default]
    Binpack,
    /// The emptiest card: spreads load.
    Spread,
}

/// How Allocate hands a container its mounts, env and device nodes (NVIDIA's device
/// plugin calls this `deviceListStrategy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceListStrategy {
    /// In the Allocate response: every runtime applies them.
    #[default]
    Mounts,
    /// As a CDI device (`cdi_devices` of the response, a spec in `cdi_spec_dir`): for
    /// kubelet 1.28+ (DevicePluginCDIDevices) with a CDI-enabled runtime.
    Cdi,
    /// Both: a runtime without CDI uses the mounts; one with CDI applies the spec's
    /// identical edits over them (CDI replaces a mount or device node at the same path,
    /// and an env var of the same name).
    Both,
}

impl DeviceListStrategy {
    /// Whether the response carries the mounts, env and devices.
    pub fn mounts(self) -> bool {
        self != DeviceListStrategy::Cdi
    }

    /// Whether a CDI spec is written and named.
    pub fn cdi(self) -> bool {
        self != DeviceListStrategy::Mounts
    }
}

/// The node's config (the module header lists its YAML keys).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NodeConfig {
    /// `device_plugin_dir`: kubelet's device-plugin folder, holding `kubelet.sock` and
    /// the device plugin's own two sockets.
    pub device_plugin_dir: PathBuf,
    /// `kubelet_socket`: kubelet's Registration socket, relative to `device_plugin_dir`.
    pub kubelet_socket: String,
    /// `pod_resources_socket`: kubelet's PodResources v1 socket, which names the
    /// container that holds each device ID (PreStart, GC).
    pub pod_resources_socket: PathBuf,
    /// `state_dir`: `plugin-state.json`, `allocations/`, `containers/` and `cards/`.
    pub state_dir: PathBuf,
    /// `host_driver_dir`: the driver libraries prepared by `vgpu-ldconfig prepare`,
    /// mounted into containers.
    pub host_driver_dir: PathBuf,
    /// `shim_dir`: the folder with `libcuda_shim.so` and `libnvml_shim.so`.
    pub shim_dir: PathBuf,
    /// `nvml_library`: what nvml-wrapper loads for discovery and health (a name or a
    /// path).
    pub nvml_library: PathBuf,
    /// `core_resource`: the extended resource of SM percent (`tencent.com/vcuda-core`).
    pub core_resource: String,
    /// `memory_resource`: the extended resource of memory units
    /// (`tencent.com/vcuda-memory`).
    pub memory_resource: String,
    /// `memory_unit`: the memory one `memory_resource` device stands for (default
    /// 256MiB, gpu-manager's).
    pub memory_unit: ByteSize,
    /// `policy`: how GetPreferredAllocation picks a card.
    pub policy: Policy,
    /// `default_core_ceiling`: the soft-mode ceiling (percent, 1-100) written for pods
    /// without `tencent.com/vcuda-core-limit`; `None`: hard limits.
    pub default_core_ceiling: Option<u32>,
    /// `pairing_window_secs`: how long after an Allocate call its record may still be
    /// paired with the container's other resource, or be a pod's own record during
    /// admission (not collected, not treated as stale).
    pub pairing_window_secs: u64,
    /// `gc_interval_secs`: seconds between garbage collections against PodResources.
    pub gc_interval_secs: u64,
    /// `gc_grace_secs`: an allocation never seen in PodResources, and a folder unknown
    /// to the state, are kept this many seconds after creation before GC removes them.
    pub gc_grace_secs: u64,
    /// `health_interval_secs`: seconds between NVML health probes of the cards
    /// (critical Xid events, where the driver has events, count within 500 ms); a
    /// change is sent to kubelet in ListAndWatch.
    pub health_interval_secs: u64,
    /// `kubelet_watch_interval_ms`: milliseconds between checks of `kubelet.sock` (a new
    /// inode means kubelet restarted: register again) and of the device plugin's own
    /// sockets; a change in the folder wakes the check at once where inotify works
    /// (`crate::folder_watch`), so this is the fallback and the retry backoff's ceiling.
    pub kubelet_watch_interval_ms: u64,
    /// The host's `/proc`, to map containers' PIDs to host PIDs for NVML readers.
    pub host_proc: PathBuf,
    /// `metrics_address`: where Prometheus metrics and `/healthz` are served over plain
    /// HTTP; `None` (omitted or null) turns the server off.
    pub metrics_address: Option<SocketAddr>,
    /// `device_list_strategy`: whether Allocate answers with mounts, a CDI device, or
    /// both.
    pub device_list_strategy: DeviceListStrategy,
    /// `cdi_kind`: the CDI `vendor/class` of the devices named in Allocate answers.
    pub cdi_kind: String,
    /// `cdi_spec_dir`: where one CDI spec per allocation is written (the runtime's CDI
    /// spec directory).
    pub cdi_spec_dir: PathBuf,
    /// `cdi_spec_format`: JSON or YAML spec files.
    pub cdi_spec_format: SpecFormat,
    /// Read `tencent.com/vcuda-core-limit` from the pod at PreStartContainer.
    pub pod_annotations: bool,
    /// `node_name`: this node; a pod whose annotation is read must be bound to it.
    /// `None`: env `NODE_NAME`, and where that is unset too the binding is not checked.
    pub node_name: Option<String>,
    /// The API server without credentials (tests' stand-in); `None`: in-cluster.
    pub api_server_url: Option<String>,
    /// Root under which host device nodes are looked up (tests point it elsewhere).
    pub dev_root: PathBuf,
    /// Refuse to start when another device plugin serves our resource names on the node.
    pub check_foreign_plugins: bool,
    /// How often the config file is read again to notice a change.
    pub config_watch_interval_ms: u64,
    /// `quota_events`: write a Kubernetes Event (`events.k8s.io/v1`) on a container's pod
    /// at its first allocation refused at the memory quota, and when it is found over
    /// its quota ([`crate::quota_watch`]).
    pub quota_events: bool,
    /// `quota_event_interval_secs`: after the first, at most one Event per container,
    /// card and reason this often (the Event says how many refusals it covers).
    pub quota_event_interval_secs: u64,
    /// `warn_on_refusal_namespaces`: the namespaces (`"*"`: every one) whose containers
    /// get `warn_on_refusal: true` in their quota config, so their shims write one
    /// stderr line at each refusal (at most one a second) whatever `VGPU_LOG` says.
    pub warn_on_refusal_namespaces: Vec<String>,
    /// `sharing`: how this node's cards are shared (time-slicing, or mps: docs/mps.md).
    pub sharing: Sharing,
    /// `card_sharing`: per card (UUID or host index), over `sharing`.
    pub card_sharing: BTreeMap<String, Sharing>,
    /// `mps`: the MPS daemons' settings, for cards in mps mode.
    pub mps: MpsSettings,
}

impl Default for NodeConfig {
    fn default() -> NodeConfig {
        NodeConfig {
            device_plugin_dir: PathBuf::from("/var/lib/kubelet/device-plugins"),
            kubelet_socket: "kubelet.sock".into(),
            pod_resources_socket: PathBuf::from("/var/lib/kubelet/pod-resources/kubelet.sock"),
            state_dir: PathBuf::from("/var/lib/vgpu"),
            host_driver_dir: PathBuf::from(layout::HOST_DRIVER_DIR),
            shim_dir: Path::new(layout::HOST_DRIVER_DIR).join(layout::HOST_SHIM_SUBDIR),
            nvml_library: PathBuf::from("libnvidia-ml.so.1"),
            core_resource: "tencent.com/vcuda-core".into(),
            memory_resource: "tencent.com/vcuda-memory".into(),
            memory_unit: ByteSize::mib(256),
            policy: Policy::Binpack,
            default_core_ceiling: None,
            pairing_window_secs: 30,
            gc_interval_secs: 60,
            gc_grace_secs: 300,
            health_interval_secs: 5,
            kubelet_watch_interval_ms: 1000,
            host_proc: PathBuf::from("/proc"),
            metrics_address: Some(SocketAddr::from(([127, 0, 0, 1], 9401))),
            device_list_strategy: DeviceListStrategy::Mounts,
            cdi_kind: "tencent.com/vcuda".into(),
            cdi_spec_dir: PathBuf::from(crate::cdi::DEFAULT_SPEC_DIR),
            cdi_spec_format: SpecFormat::Json,
            pod_annotations: true,
            node_name: None,
            api_server_url: None,
            dev_root: PathBuf::from("/dev"),
            check_foreign_plugins: true,
            config_watch_interval_ms: 2000,
            quota_events: true,
            quota_event_interval_secs: 300,
            warn_on_refusal_namespaces: Vec::new(),
            sharing: Sharing::TimeSlicing,
            card_sharing: BTreeMap::new(),
            mps: MpsSettings::default(),
        }
    }
}

impl NodeConfig {
    /// Parses and checks YAML text; `origin` labels errors.
    pub fn from_yaml(text: &str, origin: &Path) -> anyhow::Result<NodeConfig> {
        let config: NodeConfig = if text.trim().is_empty() {
            NodeConfig::default()
        } else {
            serde_saphyr::from_str(text)
                .map_err(|err| anyhow::anyhow!("{}: {}", origin.display(), err.without_snippet()))?
        };
        config
            .validate()
            .map_err(|message| anyhow::anyhow!("{}: {message}", origin.display()))?;
        Ok(config)
    }

    /// Reads one file.
    pub fn load(path: &Path) -> anyhow::Result<NodeConfig> {
        let text = std::fs::read_to_string(path)
            .map_err(|err| anyhow::anyhow!("cannot read {}: {err}", path.display()))?;
        NodeConfig::from_yaml(&text, path)
    }

    /// Whether the containers of `namespace` get the shims' refusal warning line.
    pub fn warns_on_refusal(&self, namespace: &str) -> bool {
        self.warn_on_refusal_namespaces
            .iter()
            .any(|name| name == "*" || name == namespace)
    }

    fn validate(&self) -> Result<(), String> {
        if self.memory_unit.bytes() < (1 << 20) {
            return Err(format!("memory_unit: {} is below 1MiB", self.memory_unit));
        }
        for (key, name) in [
            ("core_resource", &self.core_resource),
            ("memory_resource", &self.memory_resource),
        ] {
            if !name.contains('/') || name.starts_with('/') || name.ends_with('/') {
                return Err(format!(
                    "{key}: `{name}` is not an extended resource name such as tencent.com/vcuda-core"
                ));
            }
        }
        if self.core_resource == self.memory_resource {
            return Err("core_resource and memory_resource must differ".into());
        }
        if self.kubelet_socket.contains('/') || self.kubelet_socket.is_empty() {
            return Err(format!(
                "kubelet_socket: `{}` must be a file name inside device_plugin_dir",
                self.kubelet_socket
            ));
        }
        crate::cdi::parse_kind(&self.cdi_kind).map_err(|err| format!("cdi_kind: {err}"))?;
        if let Some(ceiling) = self.default_core_ceiling
            && !(1..=100).contains(&ceiling)
        {
            return Err(format!("default_core_ceiling: {ceiling} is outside 1-100"));
        }
        for (key, value) in [
            ("gc_interval_secs", self.gc_interval_secs),
            ("health_interval_secs", self.health_interval_secs),
            ("kubelet_watch_interval_ms", self.kubelet_watch_interval_ms),
            ("config_watch_interval_ms", self.config_watch_interval_ms),
        ] {
            if value == 0 {
                return Err(format!("{key}: must be more than 0"));
            }
        }
        self.sharing_config().validate()?;
        Ok(())
    }

    /// The sharing keys (`sharing`, `card_sharing`, `mps`) together.
    pub fn sharing_config(&self) -> SharingConfig {
        SharingConfig {
            default: self.sharing,
            cards: self.card_sharing.clone(),
            mps: self.mps.clone(),
        }
    }

    /// `<state_dir>/plugin-state.json`.
    pub fn state_file(&self) -> PathBuf {
        self.state_dir.join("plugin-state.json")
    }

    /// `<state_dir>/allocations`.
    pub fn allocations_dir(&self) -> PathBuf {
        self.state_dir.join("allocations")
    }

    /// The CDI spec writer of this config.
    pub fn cdi_writer(&self) -> Result<crate::cdi::SpecWriter, crate::cdi::CdiError> {
        crate::cdi::SpecWriter::new(&self.cdi_spec_dir, &self.cdi_kind, self.cdi_spec_format)
    }

    /// `<state_dir>/containers`.
    pub fn containers_dir(&self) -> PathBuf {
        self.state_dir.join("containers")
    }

    /// The kubelet's registration socket.
    pub fn kubelet_socket_path(&self) -> PathBuf {
        self.device_plugin_dir.join(&self.kubelet_socket)
    }

    /// Socket file name of a resource's plugin endpoint (`vgpu-vcuda-core.sock`).
    pub fn endpoint_name(resource: &str) -> String {
        let tail = resource.rsplit('/').next().unwrap_or(resource);
        format!("vgpu-{tail}.sock")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_overrides() {
        let config = NodeConfig::from_yaml("", Path::new("p.yaml")).expect("empty is default");
        assert_eq!(config, NodeConfig::default());
        let config = NodeConfig::from_yaml(
            "policy: spread\nmemory_unit: 512MiB\nmetrics_address: null\ndevice_list_strategy: both\ncdi_spec_format: yaml\n",
            Path::new("p.yaml"),
        )
        .expect("valid");
        assert_eq!(config.policy, Policy::Spread);
        assert_eq!(config.memory_unit, ByteSize::mib(512));
        assert_eq!(config.metrics_address, None);
        assert_eq!(config.device_list_strategy, DeviceListStrategy::Both);
        assert!(config.device_list_strategy.mounts() && config.device_list_strategy.cdi());
        assert_eq!(config.cdi_spec_format, SpecFormat::Yaml);
        assert_eq!(
            NodeConfig::endpoint_name("tencent.com/vcuda-core"),
            "vgpu-vcuda-core.sock"
        );
    }

    #[test]
    fn bad_configs_name_the_key() {
        for (text, needle) in [
            ("polcy: spread\n", "polcy"),
            ("policy: random\n", "random"),
            ("memory_unit: 1KiB\n", "memory_unit"),
            ("core_resource: vcuda\n", "core_resource"),
            ("default_core_ceiling: 0\n", "default_core_ceiling"),
            ("kubelet_socket: a/b.sock\n", "kubelet_socket"),
            ("gc_interval_secs: 0\n", "gc_interval_secs"),
            ("device_list_strategy: volume-mounts\n", "volume-mounts"),
            ("cdi_kind: nvidia.com/x\n", "cdi_kind"),
            ("cdi_devices: true\n", "cdi_devices"),
            ("sharing: spatial\n", "spatial"),
            ("card_sharing: {gpu0: mps}\n", "card_sharing"),
            ("mps: {threads: 50}\n", "threads"),
        ] {
            let err = NodeConfig::from_yaml(text, Path::new("p.yaml"))
                .expect_err(text)
                .to_string();
            assert!(err.contains(needle), "{text:?} gave {err}");
        }
    }
}
