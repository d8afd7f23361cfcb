//! The Helm chart `deploy/helm/vgpu-shim`, rendered by the real `helm template`: the
//! config each mode renders parses with the daemon's own parser (`NodeConfig`,
//! `DraConfig`) for the defaults and for changed values, the DaemonSet mounts every path
//! that config names at the same path and declares its metrics port, values that would
//! part the config from the mounts are refused, the values schema admits exactly the
//! keys the parsers accept (less the ones the chart sets itself), and the plain
//! manifests in `deploy/` are the chart's output (`deploy/render.sh --check`).
//!
//! helm is `$VGPU_HELM` (tests/k8s/chart.sh sets it, and then a missing helm fails), else
//! `helm` on `PATH`; without either these tests say so and pass (tests/run.sh runs
//! tests/k8s/chart.sh, so CI always has helm). The last test needs no helm.

mod manifest;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use manifest::of_kind;
use serde_json::Value;
use vgpu_dra::DraConfig;
use vgpu_node_agent::config::NodeConfig;
use vgpu_test_support::repo_root;

fn chart() -> PathBuf {
    repo_root().join("deploy/helm/vgpu-shim")
}

/// The helm binary, or `None` (after saying so) where there is none.
fn helm(test: &str) -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("VGPU_HELM") {
        let path = PathBuf::from(path);
        assert!(path.is_file(), "VGPU_HELM={} is not a file", path.display());
        return Some(path);
    }
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("helm"))
            .find(|path| path.is_file())
    });
    if found.is_none() {
        eprintln!("{test}: skipped: no helm (tests/k8s/chart.sh builds one and runs this test)");
    }
    found
}

/// `helm template vgpu-shim <chart> --namespace vgpu-system ARGS`: stdout, or stderr as
/// the error.
fn render(helm: &Path, args: &[&str]) -> Result<String, String> {
    let output = Command::new(helm)
        .arg("template")
        .arg("vgpu-shim")
        .arg(chart())
        .args(["--namespace", "vgpu-system"])
        .args(args)
        .output()
        .expect("run helm");
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

/// The config file text of a render.
fn config_text(docs: &[Value]) -> (String, String) {
    let data = of_kind(docs, "ConfigMap")["data"]
        .as_object()
        .expect("data");
    assert_eq!(data.len(), 1, "one config file: {data:?}");
    let (name, text) = data.iter().next().expect("a file");
    (name.clone(), text.as_str().expect("text").to_string())
}

/// Every host path of the daemon's container, mounted at the same path.
fn same_path_mounts(docs: &[Value]) -> Vec<PathBuf> {
    let pod = &of_kind(docs, "DaemonSet")["spec"]["template"]["spec"];
    let volumes = pod["volumes"].as_array().expect("volumes");
    pod["containers"][0]["volumeMounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .filter_map(|mount| {
            let volume = volumes.iter().find(|v| v["name"] == mount["name"])?;
            let host = volume["hostPath"]["path"].as_str()?;
            (mount["mountPath"].as_str() == Some(host)).then(|| PathBuf::from(host))
        })
        .collect()
}

fn assert_mounted(docs: &[Value], what: &str, path: &Path) {
    let mounts = same_path_mounts(docs);
    assert!(
        mounts.iter().any(|mount| path.starts_with(mount)),
        "{what} {} is not mounted from the host at the same path: {mounts:?}",
        path.display()
    );
}

fn metrics_port(docs: &[Value]) -> i64 {
    let container = &of_kind(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0];
    let port = container["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .find(|p| p["name"] == "metrics")
        .expect("a metrics port");
    for probe in ["livenessProbe", "readinessProbe"] {
        assert_eq!(container[probe]["httpGet"]["path"], "/healthz", "{probe}");
        assert_eq!(container[probe]["httpGet"]["port"], "metrics", "{probe}");
    }
    port["containerPort"].as_i64().expect("containerPort")
}

fn init_dest(docs: &[Value]) -> PathBuf {
    of_kind(docs, "DaemonSet")["spec"]["template"]["spec"]["initContainers"][0]["command"]
        .as_array()
        .expect("command")
        .iter()
        .find_map(|arg| arg.as_str()?.strip_prefix("--dest="))
        .map(PathBuf::from)
        .expect("--dest=")
}

/// Renders the device plugin with `args` and checks it against its own parser.
fn device_plugin(helm: &Path, args: &[&str]) -> (Vec<Value>, NodeConfig) {
    let docs = manifest::parse(&render(helm, args).expect("helm template"));
    let (name, text) = config_text(&docs);
    assert_eq!(name, "plugin.yaml");
    let config = NodeConfig::from_yaml(&text, Path::new("the chart's plugin.yaml"))
        .unwrap_or_else(|err| panic!("{args:?}: {err:#}\n{text}"));
    assert_mounted(&docs, "device_plugin_dir", &config.device_plugin_dir);
    assert_mounted(&docs, "pod_resources_socket", &config.pod_resources_socket);
    assert_mounted(&docs, "state_dir", &config.state_dir);
    assert_mounted(&docs, "host_driver_dir", &config.host_driver_dir);
    assert_mounted(&docs, "nvml_library", &config.nvml_library);
    if config.device_list_strategy.cdi() {
        assert_mounted(&docs, "cdi_spec_dir", &config.cdi_spec_dir);
    }
    assert_eq!(init_dest(&docs), config.host_driver_dir);
    let address = config.metrics_address.expect("metrics on");
    assert!(address.ip().is_unspecified(), "the pod's IP: {address}");
    assert_eq!(metrics_port(&docs), i64::from(address.port()));
    let command =
        &of_kind(&docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]["command"];
    assert_eq!(command[0], "vgpu-plugin");
    assert_eq!(command[2], "/etc/vgpu/plugin.yaml");
    (docs, config)
}

/// Renders the DRA driver with `args` and checks it against its own parser.
fn dra(helm: &Path, args: &[&str]) -> (Vec<Value>, DraConfig) {
    let mut all = vec!["--set", "mode=dra"];
    all.extend_from_slice(args);
    let docs = manifest::parse(&render(helm, &all).expect("helm template"));
    let (name, text) = config_text(&docs);
    assert_eq!(name, "dra.yaml");
    assert!(!text.contains("node_name"), "each pod's node is its own");
    let config = DraConfig::from_yaml(
        &format!("{text}node_name: test-node\n"),
        Path::new("the chart's dra.yaml"),
    )
    .unwrap_or_else(|err| panic!("{args:?}: {err:#}\n{text}"));
    assert_mounted(&docs, "plugins_registry_dir", &config.plugins_registry_dir);
    assert_mounted(&docs, "plugin_dir", &config.plugin_dir());
    assert_mounted(&docs, "state_dir", &config.state_dir);
    assert_mounted(&docs, "cdi_dir", &config.cdi_dir);
    assert_mounted(&docs, "host_driver_dir", &config.host_driver_dir);
    assert_mounted(&docs, "nvml_library", &config.nvml_library);
    assert_mounted(&docs, "device_plugin_dir", &config.device_plugin_dir);
    assert_eq!(init_dest(&docs), config.host_driver_dir);
    let raw: serde_json::Value = serde_saphyr::from_str(&text).expect("YAML");
    let address = raw["metrics_address"].as_str().expect("metrics_address");
    assert_eq!(
        address,
        format!("0.0.0.0:{}", metrics_port(&docs)),
        "the pod's IP, the declared port"
    );
    let class = of_kind(&docs, "DeviceClass");
    assert_eq!(
        class["spec"]["selectors"][0]["cel"]["expression"],
        format!("device.driver == \"{}\"", config.driver_name)
    );
    let command =
        &of_kind(&docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]["command"];
    assert_eq!(command[0], "vgpu-dra-plugin");
    assert_eq!(command[2], "/etc/vgpu/dra.yaml");
    (docs, config)
}

#[test]
fn the_plain_manifests_are_the_charts_output() {
    let Some(helm) = helm("the_plain_manifests_are_the_charts_output") else {
        return;
    };
    let output = Command::new("bash")
        .arg(repo_root().join("deploy/render.sh"))
        .arg("--check")
        .env("HELM", &helm)
        .output()
        .expect("bash");
    assert!(
        output.status.success(),
        "deploy/ differs from the chart (run deploy/render.sh):\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn each_modes_default_config_parses_and_matches_its_daemonset() {
    let Some(helm) = helm("each_modes_default_config_parses_and_matches_its_daemonset") else {
        return;
    };
    let (docs, config) = device_plugin(&helm, &[]);
    assert_eq!(config.core_resource, "tencent.com/vcuda-core");
    assert_eq!(config.memory_unit, vgpu_contract::ByteSize::mib(256));
    assert_eq!(config.metrics_address.map(|a| a.port()), Some(9401));
    let pod = &of_kind(&docs, "DaemonSet")["spec"]["template"]["spec"];
    assert_eq!(pod["nodeSelector"]["nvidia-device-enable"], "enable");
    assert!(docs.iter().all(|doc| doc["kind"] != "DeviceClass"));

    let (docs, config) = dra(&helm, &[]);
    assert_eq!(config.driver_name, vgpu_dra::config::DEFAULT_DRIVER_NAME);
    assert_eq!(metrics_port(&docs), 9402);
    assert_eq!(of_kind(&docs, "Service")["spec"]["ports"][0]["port"], 9402);
    let pod = &of_kind(&docs, "DaemonSet")["spec"]["template"]["spec"];
    assert_eq!(pod["nodeSelector"]["vgpu-shim.io/mode"], "dra");
    let expressions = &pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"][0]["matchExpressions"];
    assert_eq!(
        expressions[0],
        serde_json::json!({"key": "nvidia-device-enable", "operator": "DoesNotExist"})
    );
}

#[test]
fn changed_values_reach_the_config_and_the_mounts_follow() {
    let Some(helm) = helm("changed_values_reach_the_config_and_the_mounts_follow") else {
        return;
    };
    let (docs, config) = device_plugin(
        &helm,
        &[
            "--set",
            "hostPaths.state=/data/vgpu/",
            "--set",
            "hostPaths.kubeletDevicePlugins=/var/lib/k0s/kubelet/device-plugins",
            "--set",
            "hostPaths.cdi=/etc/cdi",
            "--set",
            "devicePlugin.metricsPort=9500",
            "--set",
            "devicePlugin.config.policy=spread",
            "--set",
            "devicePlugin.config.device_list_strategy=both",
            "--set",
            "devicePlugin.config.default_core_ceiling=80",
            // Helm reads numbers as floats; a large one must still come out whole.
            "--set",
            "devicePlugin.config.gc_grace_secs=1000000",
        ],
    );
    assert_eq!(config.state_dir, Path::new("/data/vgpu"));
    assert_eq!(
        config.nvml_library,
        Path::new("/data/vgpu/driver/current/lib64/libnvidia-ml.so.1")
    );
    assert_eq!(
        config.device_plugin_dir,
        Path::new("/var/lib/k0s/kubelet/device-plugins")
    );
    assert_eq!(config.cdi_spec_dir, Path::new("/etc/cdi"));
    assert_eq!(config.policy, vgpu_node_agent::config::Policy::Spread);
    assert_eq!(config.default_core_ceiling, Some(80));
    assert_eq!(config.gc_grace_secs, 1_000_000);
    assert_eq!(metrics_port(&docs), 9500);
    let service = of_kind(&docs, "Service");
    assert_eq!(service["spec"]["ports"][0]["port"], 9500);

    let (_, config) = dra(
        &helm,
        &[
            "--set",
            "hostPaths.kubeletPlugins=/var/lib/k0s/kubelet/plugins",
            "--set",
            "hostPaths.kubeletPluginsRegistry=/var/lib/k0s/kubelet/plugins_registry",
            "--set",
            "dra.config.unhealthy=remove",
            "--set",
            "dra.config.driver_name=gpu.example.org",
            "--set",
            "dra.metricsPort=9600",
        ],
    );
    assert_eq!(
        config.dra_socket(),
        Path::new("/var/lib/k0s/kubelet/plugins/gpu.example.org/dra.sock")
    );
    assert_eq!(
        config.registration_socket(),
        Path::new("/var/lib/k0s/kubelet/plugins_registry/gpu.example.org-reg.sock")
    );
    assert_eq!(config.unhealthy, vgpu_kube::slices::UnhealthyPolicy::Remove);
}

#[test]
fn values_that_would_part_config_and_mounts_are_refused() {
    let Some(helm) = helm("values_that_would_part_config_and_mounts_are_refused") else {
        return;
    };
    for (args, needle) in [
        (vec!["--set", "mode=daemon"], "mode"),
        (
            vec!["--set", "devicePlugin.config.state_dir=/elsewhere"],
            "state_dir",
        ),
        (vec!["--set", "devicePlugin.config.polcy=spread"], "polcy"),
        (
            vec!["--set", "mode=dra", "--set", "dra.config.node_name=node-a"],
            "node_name",
        ),
        (
            vec!["--set", "mode=dra", "--set", "dra.config.cdi_dir=/etc/cdi"],
            "cdi_dir",
        ),
        (vec!["--set", "hostPaths.state=var/lib/vgpu"], "state"),
        (
            vec!["--set", "mode=dra", "--kube-version", "1.33.4"],
            "Kubernetes 1.34+",
        ),
        (
            vec!["--set", "devicePlugin.metricsPort=70000"],
            "metricsPort",
        ),
    ] {
        let err = render(&helm, &args).expect_err(&format!("{args:?} must be refused"));
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

/// The keys a `deny_unknown_fields` config accepts, from serde's own refusal of an
/// unknown one ("unknown field `x`, expected one of `a`, `b`, ...").
fn accepted_keys(error: &str) -> BTreeSet<String> {
    let list = error
        .split("expected one of")
        .nth(1)
        .unwrap_or_else(|| panic!("the parser's message changed: {error}"));
    // serde-saphyr: `a, b, c at line L, column C` (serde's own: backticked names).
    let list = list.split(" at line ").next().unwrap_or(list);
    list.split(',')
        .map(|key| key.trim().trim_matches('`').to_string())
        .filter(|key| !key.is_empty())
        .collect()
}

fn schema_keys(schema: &Value, section: &str) -> BTreeSet<String> {
    schema["properties"][section]["properties"]["config"]["properties"]
        .as_object()
        .expect("config properties")
        .keys()
        .cloned()
        .collect()
}

#[test]
fn the_values_schema_admits_exactly_what_the_parsers_accept() {
    let Some(helm) = helm("the_values_schema_admits_exactly_what_the_parsers_accept") else {
        return;
    };
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(chart().join("values.schema.json")).expect("schema"),
    )
    .expect("JSON");
    // Keys the chart does not offer: the node's name is each pod's own, the rest are
    // the tests' (an API server without credentials, another /dev).
    let plugin_withheld = ["node_name", "api_server_url", "dev_root"];
    let dra_withheld = ["node_name", "api_server_url", "dev_root", "kubeconfig"];
    let plugin_error = NodeConfig::from_yaml("vgpu_no_such_key: 1\n", Path::new("p"))
        .expect_err("unknown key")
        .to_string();
    let dra_error = DraConfig::from_yaml("node_name: n\nvgpu_no_such_key: 1\n", Path::new("d"))
        .expect_err("unknown key")
        .to_string();
    for (section, mode, parser, withheld) in [
        (
            "devicePlugin",
            "device-plugin",
            accepted_keys(&plugin_error),
            &plugin_withheld[..],
        ),
        ("dra", "dra", accepted_keys(&dra_error), &dra_withheld[..]),
    ] {
        // The keys the chart sets itself: those of the default render that values.yaml
        // does not hold.
        let docs =
            manifest::parse(&render(&helm, &["--set", &format!("mode={mode}")]).expect("render"));
        let rendered: serde_json::Value =
            serde_saphyr::from_str(&config_text(&docs).1).expect("config");
        let rendered: BTreeSet<String> = rendered
            .as_object()
            .expect("mapping")
            .keys()
            .cloned()
            .collect();
        let offered = schema_keys(&schema, section);
        let mut covered: BTreeSet<String> = rendered.union(&offered).cloned().collect();
        covered.extend(withheld.iter().map(|key| key.to_string()));
        assert_eq!(
            covered, parser,
            "{section}.config: the chart's keys (values.schema.json, the derived ones and the withheld) differ from the parser's"
        );
        let derived: BTreeSet<&String> = rendered.difference(&offered).collect();
        for key in withheld {
            assert!(!derived.contains(&key.to_string()), "{key} is rendered");
        }
    }
}

#[test]
fn the_chart_is_versioned_with_the_workspace() {
    let text = std::fs::read_to_string(chart().join("Chart.yaml")).expect("Chart.yaml");
    let meta: serde_json::Value = serde_saphyr::from_str(&text).expect("YAML");
    assert_eq!(meta["version"].as_str(), Some(env!("CARGO_PKG_VERSION")));
    assert_eq!(meta["appVersion"].as_str(), Some(env!("CARGO_PKG_VERSION")));
    let values: serde_json::Value = serde_saphyr::from_str(
        &std::fs::read_to_string(chart().join("values.yaml")).expect("values"),
    )
    .expect("YAML");
    assert_eq!(
        values["image"]["tag"].as_str(),
        Some(""),
        "the tag follows appVersion"
    );
    assert_eq!(values["mode"].as_str(), Some("device-plugin"));
    assert_eq!(
        values["devicePlugin"]["nodeSelector"]["nvidia-device-enable"].as_str(),
        Some("enable"),
        "gpu-manager's node label"
    );
}

/// Whether `path` (`a.b.c`, a last part `*` for any key) names a value of `values`.
fn has_value(values: &serde_json::Value, path: &str) -> bool {
    let mut node = values;
    for part in path.split('.') {
        if part == "*" {
            return node.as_object().is_some_and(|map| !map.is_empty());
        }
        match node.get(part) {
            Some(next) => node = next,
            None => return false,
        }
    }
    true
}

#[test]
fn the_readmes_values_table_names_real_values() {
    let values: serde_json::Value = serde_saphyr::from_str(
        &std::fs::read_to_string(chart().join("values.yaml")).expect("values"),
    )
    .expect("YAML");
    let readme = std::fs::read_to_string(repo_root().join("deploy/README.md")).expect("README");
    let section = readme
        .split("### With Helm")
        .nth(1)
        .expect("a With Helm section");
    let section = section.split("\n## ").next().unwrap_or(section);
    let mut named = 0;
    for row in section.lines().filter(|line| line.starts_with("| `")) {
        let first = row.split('|').nth(1).expect("a first column");
        for name in first.split('`').skip(1).step_by(2) {
            assert!(
                has_value(&values, name),
                "deploy/README.md names the value `{name}`, which values.yaml lacks"
            );
            named += 1;
        }
    }
    assert!(named >= 15, "the table names {named} values");
}

#[test]
fn the_metrics_network_policy_admits_its_peers_to_the_daemons_port_only() {
    let Some(helm) = helm("the_metrics_network_policy_admits_its_peers_to_the_daemons_port_only")
    else {
        return;
    };
    use vgpu_kube::k8s_openapi::api::networking::v1::NetworkPolicy;
    use vgpu_kube::k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    for mode in ["device-plugin", "dra"] {
        let docs = manifest::parse(
            &render(
                &helm,
                &[
                    "--set",
                    &format!("mode={mode}"),
                    "--set",
                    "metrics.networkPolicy.enabled=true",
                ],
            )
            .expect("render"),
        );
        let policy: NetworkPolicy = serde_json::from_value(of_kind(&docs, "NetworkPolicy").clone())
            .expect("a NetworkPolicy");
        let spec = policy.spec.expect("spec");
        let labels = &of_kind(&docs, "DaemonSet")["spec"]["template"]["metadata"]["labels"];
        let selector = spec.pod_selector.expect("podSelector").match_labels;
        assert!(
            selector.as_ref().is_some_and(|labels| !labels.is_empty()),
            "{mode}"
        );
        for (key, value) in selector.iter().flatten() {
            assert_eq!(
                labels[key],
                value.as_str(),
                "{mode}: selects the daemon's pods"
            );
        }
        let ingress = spec.ingress.expect("ingress");
        assert_eq!(ingress.len(), 1, "{mode}");
        assert!(
            !ingress[0].from.as_ref().expect("from").is_empty(),
            "{mode}: peers"
        );
        let ports: Vec<Option<IntOrString>> = ingress[0]
            .ports
            .iter()
            .flatten()
            .map(|port| port.port.clone())
            .collect();
        assert_eq!(
            ports,
            [Some(IntOrString::Int(metrics_port(&docs) as i32))],
            "{mode}: the metrics port only"
        );
    }
    // Off by default, and never without metrics.
    let docs = manifest::parse(&render(&helm, &[]).expect("render"));
    assert!(docs.iter().all(|doc| doc["kind"] != "NetworkPolicy"));
    let err = render(
        &helm,
        &[
            "--set",
            "metrics.networkPolicy.enabled=true",
            "--set",
            "metrics.networkPolicy.from=null",
        ],
    )
    .expect_err("no peers");
    assert!(err.contains("from"), "{err}");
}
