//! The DRA plugin's own YAML config (`--config`, default `/etc/vgpu/dra.yaml`). Every
//! key is optional except where the environment supplies it (`node_name` from
//! `NODE_NAME`); unknown keys are errors that name the key.
//!
//! ```yaml
//! driver_name: gpu.vgpu-shim.io                # DeviceClass selectors name it
//! node_name: node-a                            # default: env NODE_NAME (the downward API)
//! plugins_registry_dir: /var/lib/kubelet/plugins_registry   # <driver>-reg.sock
//! plugin_dir: /var/lib/kubelet/plugins/gpu.vgpu-shim.io     # dra.sock
//! state_dir: /var/lib/vgpu/dra                 # dra-state.json, allocations/
//! cdi_dir: /var/run/cdi                        # one spec per prepared request
//! cdi_kind: vgpu-shim.io/gpu
//! host_driver_dir: /var/lib/vgpu/driver        # prepared by `vgpu-ldconfig prepare`
//! shim_dir: /var/lib/vgpu/driver/shim
//! nvml_library: libnvidia-ml.so.1
//! device_plugin_dir: /var/lib/kubelet/device-plugins   # refuse to start beside vgpu-plugin
//! device_plugin_sockets: [vgpu-vcuda-core.sock, vgpu-vcuda-memory.sock]
//! unhealthy: taint                             # or `remove` (the device leaves the slice)
//! default_core_ceiling: null                   # soft ceiling for pods without the annotation
//! kubeconfig: null                             # default: the pod's service account (else KUBECONFIG)
//! api_server_url: null                         # plain HTTP, no credentials: tests' stand-in only
//! health_interval_secs: 5
//! registration_watch_interval_ms: 1000
//! slice_resync_secs: 600
//! host_proc: /proc                            # the host's /proc (the DaemonSet runs with hostPID)
//! dev_root: /dev
//! metrics_address: 127.0.0.1:9402              # /metrics and /healthz; null turns them off
//! quota_events: true                           # an Event on the claim's pod at its first refusal (and over quota)
//! quota_event_interval_secs: 300               # then at most one Event per request and card this often
//! sharing: time-slicing                        # or mps (docs/mps.md); per card: card_sharing
//! card_sharing: {}                             # {GPU-<uuid> or "<index>": mps | time-slicing}
//! mps: {}                                      # the MPS daemons' settings (vgpu_mps::sharing)
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use vgpu_kube::ClientSource;
use vgpu_kube::slices::UnhealthyPolicy;
use vgpu_mps::{MpsSettings, Sharing};
use vgpu_node_agent::config::NodeConfig;

/// Where the config is read from when `--config` is not given.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/vgpu/dra.yaml";
/// The driver name this project publishes under.
pub const DEFAULT_DRIVER_NAME: &str = "gpu.vgpu-shim.io";
/// Env var with the node name (set from `spec.nodeName` in the DaemonSet).
pub const NODE_NAME_ENV: &str = "NODE_NAME";

/// The DRA plugin config.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DraConfig {
    /// `driver_name`: the DRA driver name (a lower-case DNS subdomain with a dot): the
    /// slices' `spec.driver`, what DeviceClass selectors and claim results name, and the
    /// registration socket's name.
    pub driver_name: String,
    /// `node_name`: the node whose pool this plugin publishes; `None` in the file means
    /// env `NODE_NAME`, and validation refuses a config where both are missing.
    pub node_name: Option<String>,
    /// `plugins_registry_dir`: kubelet's plugin-watcher folder, where
    /// `<driver_name>-reg.sock` is served.
    pub plugins_registry_dir: PathBuf,
    /// `plugin_dir`: where `dra.sock` is served. Default:
    /// `/var/lib/kubelet/plugins/<driver_name>`.
    pub plugin_dir: Option<PathBuf>,
    /// `state_dir`: `dra-state.json` and the per-request `allocations/` folders.
    pub state_dir: PathBuf,
    /// `cdi_dir`: where one CDI spec per prepared request is written (the runtime's CDI
    /// spec directory).
    pub cdi_dir: PathBuf,
    /// `cdi_kind`: the CDI `vendor/class` of the devices named in the answer to kubelet.
    pub cdi_kind: String,
    /// `host_driver_dir`: the driver libraries prepared by `vgpu-ldconfig prepare`,
    /// mounted into containers.
    pub host_driver_dir: PathBuf,
    /// `shim_dir`: the folder with `libcuda_shim.so` and `libnvml_shim.so`.
    pub shim_dir: PathBuf,
    /// `nvml_library`: what nvml-wrapper loads for discovery and health (a name or a
    /// path).
    pub nvml_library: PathBuf,
    /// `device_plugin_dir`: kubelet's device-plugin folder, checked at start so this
    /// plugin refuses to run beside a live `vgpu-plugin` on the same cards.
    pub device_plugin_dir: PathBuf,
    /// `device_plugin_sockets`: the `vgpu-plugin` socket names looked for in
    /// `device_plugin_dir` (default: the core and memory resources' endpoints).
    pub device_plugin_sockets: Vec<String>,
    /// `unhealthy`: what the slice does with an unhealthy card (taint or remove).
    pub unhealthy: UnhealthyPolicy,
    /// `default_core_ceiling`: the soft-mode ceiling (percent, 1-100) written for pods
    /// without `tencent.com/vcuda-core-limit`; `None`: hard limits.
    pub default_core_ceiling: Option<u32>,
    /// `kubeconfig`: a kubeconfig file for the API server; `None` (and no
    /// `api_server_url`): the pod's service account, else env `KUBECONFIG`.
    pub kubeconfig: Option<PathBuf>,
    /// `api_server_url`: an API server over plain HTTP without credentials (the tests'
    /// stand-in only); exclusive with `kubeconfig`.
    pub api_server_url: Option<String>,
    /// `health_interval_secs`: seconds between NVML health probes of the cards
    /// (critical Xid events, where the driver has events, count within 500 ms); a
    /// change republishes the slices.
    pub health_interval_secs: u64,
    /// `registration_watch_interval_ms`: milliseconds between checks that both sockets
    /// are still served (kubelet may wipe its folders); a missing one is served again.
    pub registration_watch_interval_ms: u64,
    /// `slice_resync_secs`: seconds between publish passes while nothing changes; a
    /// change of the cards, or of the node's slices by someone else (a watch), starts
    /// one sooner.
    pub slice_resync_secs: u64,
    /// `host_proc`: the host's `/proc`, to map containers' PIDs to host PIDs for NVML
    /// readers.
    pub host_proc: PathBuf,
    /// `dev_root`: the root under which host device nodes (`nvidia<minor>`, `nvidiactl`,
    /// ...) are looked up for the CDI spec (tests point it elsewhere).
    pub dev_root: PathBuf,
    /// `metrics_address`: where `/metrics` and `/healthz` are served over plain HTTP
    /// (the device plugin's server and limits, [`vgpu_node_agent::http`]); `None` (null)
    /// turns the server off. Default `127.0.0.1:9402`; the manifests serve the pod's
    /// address on port 9402.
    pub metrics_address: Option<std::net::SocketAddr>,
    /// `quota_events`: write a Kubernetes Event (`events.k8s.io/v1`) on the pod a
    /// prepared claim is reserved for, at the first allocation its containers were
    /// refused at the memory quota and when they are found over it (the device plugin's
    /// watch, [`vgpu_node_agent::quota_watch`]).
    pub quota_events: bool,
    /// `quota_event_interval_secs`: after the first, at most one Event per request, card
    /// and reason this often (the Event says how many refusals it covers).
    pub quota_event_interval_secs: u64,
    /// `sharing`: how this node's cards are shared (time-slicing, or mps: docs/mps.md).
    pub sharing: Sharing,
    /// `card_sharing`: per card (UUID or host index), over `sharing`.
    pub card_sharing: BTreeMap<String, Sharing>,
    /// `mps`: the MPS daemons' settings, for cards in mps mode.
    pub mps: MpsSettings,
}

impl Default for DraConfig {
    fn default() -> DraConfig {
        let node = NodeConfig::default();
        DraConfig {
            driver_name: DEFAULT_DRIVER_NAME.into(),
            node_name: None,
            plugins_registry_dir: PathBuf::from("/var/lib/kubelet/plugins_registry"),
            plugin_dir: None,
            state_dir: PathBuf::from("/var/lib/vgpu/dra"),
            cdi_dir: PathBuf::from(vgpu_node_agent::cdi::DEFAULT_SPEC_DIR),
            cdi_kind: "vgpu-shim.io/gpu".into(),
            host_driver_dir: node.host_driver_dir,
            shim_dir: node.shim_dir,
            nvml_library: node.nvml_library,
            device_plugin_dir: node.device_plugin_dir,
            device_plugin_sockets: [&node.core_resource, &node.memory_resource]
                .iter()
                .map(|resource| NodeConfig::endpoint_name(resource))
                .collect(),
            unhealthy: UnhealthyPolicy::Taint,
            default_core_ceiling: None,
            kubeconfig: None,
            api_server_url: None,
            health_interval_secs: 5,
            registration_watch_interval_ms: 1000,
            slice_resync_secs: 600,
            host_proc: node.host_proc,
            dev_root: PathBuf::from("/dev"),
            metrics_address: Some(std::net::SocketAddr::from(([127, 0, 0, 1], 9402))),
            quota_events: node.quota_events,
            quota_event_interval_secs: node.quota_event_interval_secs,
            sharing: node.sharing,
            card_sharing: node.card_sharing,
            mps: node.mps,
        }
    }
}

fn is_dns_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

impl DraConfig {
    /// Parses and checks YAML text (`origin` labels errors); fills `node_name` from
    /// `NODE_NAME` when the file does not set it.
    pub fn from_yaml(text: &str, origin: &Path) -> anyhow::Result<DraConfig> {
        let mut config: DraConfig = if text.trim().is_empty() {
            DraConfig::default()
        } else {
            serde_saphyr::from_str(text)
                .map_err(|err| anyhow::anyhow!("{}: {}", origin.display(), err.without_snippet()))?
        };
        if config.node_name.is_none() {
            config.node_name = std::env::var(NODE_NAME_ENV).ok().filter(|n| !n.is_empty());
        }
        config
            .validate()
            .map_err(|message| anyhow::anyhow!("{}: {message}", origin.display()))?;
        Ok(config)
    }

    /// Reads one file; the missing default file means the defaults.
    pub fn load(path: &Path) -> anyhow::Result<DraConfig> {
        if !path.exists() && path == Path::new(DEFAULT_CONFIG_PATH) {
            return DraConfig::from_yaml("", path);
        }
        let text = std::fs::read_to_string(path)
            .map_err(|err| anyhow::anyhow!("cannot read {}: {err}", path.display()))?;
        DraConfig::from_yaml(&text, path)
    }

    fn validate(&self) -> Result<(), String> {
        if !is_dns_subdomain(&self.driver_name) || !self.driver_name.contains('.') {
            return Err(format!(
                "driver_name: `{}` is not a lower-case DNS subdomain such as gpu.vgpu-shim.io",
                self.driver_name
            ));
        }
        match &self.node_name {
            None => {
                return Err(format!(
                    "node_name: not set and {NODE_NAME_ENV} is empty (the DaemonSet sets it from spec.nodeName)"
                ));
            }
            Some(node) if !is_dns_subdomain(node) => {
                return Err(format!("node_name: `{node}` is not a DNS subdomain"));
            }
            Some(_) => {}
        }
        if self.kubeconfig.is_some() && self.api_server_url.is_some() {
            return Err("kubeconfig and api_server_url: set one, not both".into());
        }
        vgpu_node_agent::cdi::parse_kind(&self.cdi_kind)
            .map_err(|err| format!("cdi_kind: {err}"))?;
        if let Some(ceiling) = self.default_core_ceiling
            && !(1..=100).contains(&ceiling)
        {
            return Err(format!("default_core_ceiling: {ceiling} is outside 1-100"));
        }
        for (key, value) in [
            ("health_interval_secs", self.health_interval_secs),
            (
                "registration_watch_interval_ms",
                self.registration_watch_interval_ms,
            ),
            ("slice_resync_secs", self.slice_resync_secs),
            ("quota_event_interval_secs", self.quota_event_interval_secs),
        ] {
            if value == 0 {
                return Err(format!("{key}: must be more than 0"));
            }
        }
        self.node_config().sharing_config().validate()?;
        Ok(())
    }

    /// Where the API server is.
    pub fn api_server(&self) -> ClientSource {
        match (&self.kubeconfig, &self.api_server_url) {
            (Some(path), _) => ClientSource::Kubeconfig(path.clone()),
            (None, Some(url)) => ClientSource::Url(url.clone()),
            (None, None) => ClientSource::Infer,
        }
    }

    /// The node name (present after validation).
    pub fn node(&self) -> &str {
        self.node_name.as_deref().unwrap_or_default()
    }

    /// `<plugin_dir>` or `/var/lib/kubelet/plugins/<driver>`.
    pub fn plugin_dir(&self) -> PathBuf {
        self.plugin_dir
            .clone()
            .unwrap_or_else(|| Path::new("/var/lib/kubelet/plugins").join(&self.driver_name))
    }

    /// The DRA service socket kubelet dials (`PluginInfo.endpoint`).
    pub fn dra_socket(&self) -> PathBuf {
        self.plugin_dir().join("dra.sock")
    }

    /// The registration socket kubelet's plugin watcher finds.
    pub fn registration_socket(&self) -> PathBuf {
        self.plugins_registry_dir
            .join(format!("{}-reg.sock", self.driver_name))
    }

    /// `<state_dir>/dra-state.json`.
    pub fn state_file(&self) -> PathBuf {
        self.state_dir.join("dra-state.json")
    }

    /// The node config of the same folders and settings, so the node agent's
    /// allocation-folder, mount, CDI and MPS code serves both daemons.
    pub fn node_config(&self) -> NodeConfig {
        NodeConfig {
            state_dir: self.state_dir.clone(),
            host_driver_dir: self.host_driver_dir.clone(),
            shim_dir: self.shim_dir.clone(),
            nvml_library: self.nvml_library.clone(),
            dev_root: self.dev_root.clone(),
            host_proc: self.host_proc.clone(),
            cdi_kind: self.cdi_kind.clone(),
            cdi_spec_dir: self.cdi_dir.clone(),
            cdi_spec_format: vgpu_node_agent::cdi::SpecFormat::Json,
            default_core_ceiling: self.default_core_ceiling,
            metrics_address: None,
            sharing: self.sharing,
            card_sharing: self.card_sharing.clone(),
            mps: self.mps.clone(),
            ..NodeConfig::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mps_docs_examples_parse() {
        let doc =
            std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/mps.md"))
                .expect("docs/mps.md");
        let blocks: Vec<&str> = doc
            .split("```yaml ")
            .skip(1)
            .filter_map(|rest| rest.split_once('\n'))
            .map(|(_tag, rest)| rest.split("```").next().unwrap_or_default())
            .collect();
        assert_eq!(blocks.len(), 2, "the plugin's and the DRA driver's example");
        let plugin = NodeConfig::from_yaml(blocks[0], Path::new("docs/mps.md"))
            .expect("the plugin example parses");
        let sharing = plugin.sharing_config();
        assert_eq!(sharing.of("GPU-x", 0), Sharing::Mps);
        assert_eq!(sharing.of("GPU-y", 1), Sharing::TimeSlicing);
        assert!(!sharing.mps.compute_limiter && !sharing.mps.multiuser);
        let dra = DraConfig::from_yaml(blocks[1], Path::new("docs/mps.md"))
            .expect("the DRA example parses");
        let sharing = dra.node_config().sharing_config();
        assert_eq!(
            sharing.of("GPU-5f1c9a8e-0000-4000-8000-000000000001", 3),
            Sharing::Mps
        );
        assert_eq!(sharing.of("GPU-other", 0), Sharing::TimeSlicing);
    }

    #[test]
    fn sharing_keys_reach_the_node_config() {
        let config = DraConfig::from_yaml(
            "node_name: n\nsharing: mps\ncard_sharing: {\"1\": time-slicing}\nmps: {compute_limiter: true}\n",
            Path::new("d.yaml"),
        )
        .expect("valid");
        let sharing = config.node_config().sharing_config();
        assert_eq!(sharing.of("GPU-a", 0), Sharing::Mps);
        assert_eq!(sharing.of("GPU-b", 1), Sharing::TimeSlicing);
        assert!(sharing.mps.compute_limiter);
    }

    #[test]
    fn defaults_and_bad_keys() {
        let config =
            DraConfig::from_yaml("node_name: node-a\n", Path::new("d.yaml")).expect("valid");
        assert_eq!(config.driver_name, DEFAULT_DRIVER_NAME);
        assert_eq!(
            config.registration_socket(),
            PathBuf::from("/var/lib/kubelet/plugins_registry/gpu.vgpu-shim.io-reg.sock")
        );
        assert_eq!(
            config.dra_socket(),
            PathBuf::from("/var/lib/kubelet/plugins/gpu.vgpu-shim.io/dra.sock")
        );
        assert_eq!(
            config.device_plugin_sockets,
            vec!["vgpu-vcuda-core.sock", "vgpu-vcuda-memory.sock"]
        );
        let config = DraConfig::from_yaml(
            "node_name: n\napi_server_url: http://127.0.0.1:1\nunhealthy: remove\n",
            Path::new("d.yaml"),
        )
        .expect("valid");
        assert_eq!(
            config.api_server(),
            ClientSource::Url("http://127.0.0.1:1".into())
        );
        assert_eq!(config.unhealthy, UnhealthyPolicy::Remove);
        for (text, needle) in [
            ("node_name: n\ndriver: x\n", "driver"),
            ("node_name: n\ndriver_name: Bad_Name\n", "driver_name"),
            ("node_name: N_1\n", "node_name"),
            ("node_name: n\ncdi_kind: nokind\n", "cdi_kind"),
            (
                "node_name: n\ndefault_core_ceiling: 0\n",
                "default_core_ceiling",
            ),
            ("node_name: n\nunhealthy: ignore\n", "ignore"),
            ("node_name: n\nslice_resync_secs: 0\n", "slice_resync_secs"),
            (
                "node_name: n\nkubeconfig: /k\napi_server_url: http://127.0.0.1:1\n",
                "not both",
            ),
            ("node_name: n\nsharing: spatial\n", "spatial"),
            ("node_name: n\ncard_sharing: {gpu0: mps}\n", "card_sharing"),
            (
                "node_name: n\nmps: {health_interval_ms: 0}\n",
                "health_interval_ms",
            ),
        ] {
            let err = DraConfig::from_yaml(text, Path::new("d.yaml"))
                .expect_err(text)
                .to_string();
            assert!(err.contains(needle), "{text:?} gave {err}");
        }
    }
}
