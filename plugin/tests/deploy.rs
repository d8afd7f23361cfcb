//! The shipped manifests hold together: the ConfigMap's plugin config parses with the
//! plugin's own schema, the DaemonSet selects gpu-manager's node label and mounts what
//! the config names, the example pod asks for what the README says, and the README's
//! "Deploy on Kubernetes" commands name files that exist.

use std::path::PathBuf;

use serde::Deserialize;
use serde_norway::Value;
use vgpu_plugin::PluginConfig;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("repo root")
        .to_path_buf()
}

fn documents(name: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(repo().join("deploy").join(name)).expect("manifest");
    serde_norway::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).expect("YAML document"))
        .collect()
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter()
        .find(|doc| doc["kind"].as_str() == Some(kind))
        .unwrap_or_else(|| panic!("no {kind}"))
}

#[test]
fn the_configmap_is_a_valid_plugin_config_and_the_daemonset_matches_it() {
    let docs = documents("vgpu-plugin.yaml");
    let text = of_kind(&docs, "ConfigMap")["data"]["plugin.yaml"]
        .as_str()
        .expect("plugin.yaml in the ConfigMap");
    let config = PluginConfig::from_yaml(text, std::path::Path::new("deploy/vgpu-plugin.yaml"))
        .expect("valid plugin config");
    assert_eq!(config.core_resource, "tencent.com/vcuda-core");
    assert_eq!(config.memory_resource, "tencent.com/vcuda-memory");
    assert_eq!(config.memory_unit, vgpu_common::ByteSize::mib(256));

    let daemonset = of_kind(&docs, "DaemonSet");
    let pod = &daemonset["spec"]["template"]["spec"];
    assert_eq!(
        pod["nodeSelector"]["nvidia-device-enable"].as_str(),
        Some("enable"),
        "gpu-manager's node label"
    );
    assert_eq!(
        pod["hostPID"].as_bool(),
        Some(true),
        "host PIDs for NVML inside containers"
    );
    let host_paths: Vec<&str> = pod["volumes"]
        .as_sequence()
        .expect("volumes")
        .iter()
        .filter_map(|v| v["hostPath"]["path"].as_str())
        .collect();
    for needed in [&config.device_plugin_dir, &config.state_dir] {
        let needed = needed.to_str().expect("utf-8");
        assert!(
            host_paths.iter().any(|p| needed.starts_with(p)),
            "{needed} is not mounted from the host: {host_paths:?}"
        );
    }
    let pod_resources = config
        .pod_resources_socket
        .parent()
        .and_then(|p| p.to_str())
        .expect("folder");
    assert!(
        host_paths.iter().any(|p| pod_resources.starts_with(p)),
        "{pod_resources}: {host_paths:?}"
    );
    let port = config.metrics_address.expect("metrics on").port();
    let ports: Vec<i64> = pod["containers"][0]["ports"]
        .as_sequence()
        .map(|ports| {
            ports
                .iter()
                .filter_map(|p| p["containerPort"].as_i64())
                .collect()
        })
        .unwrap_or_default();
    assert!(
        ports.contains(&i64::from(port)),
        "metrics port {port} not declared: {ports:?}"
    );
}

#[test]
fn the_example_pod_is_the_seeds_and_the_readme_points_at_real_files() {
    let docs = documents("example-pod.yaml");
    let pod = of_kind(&docs, "Pod");
    assert_eq!(
        pod["metadata"]["annotations"]["tencent.com/vcuda-core-limit"].as_str(),
        Some("50")
    );
    let limits = &pod["spec"]["containers"][0]["resources"]["limits"];
    assert_eq!(limits["tencent.com/vcuda-core"].as_i64(), Some(30));
    assert_eq!(limits["tencent.com/vcuda-memory"].as_i64(), Some(10));

    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README");
    let deploy = readme
        .split("## Deploy on Kubernetes")
        .nth(1)
        .expect("a Deploy on Kubernetes section");
    let deploy = deploy.split("\n## ").next().unwrap_or(deploy);
    let applied: Vec<&str> = deploy
        .split_whitespace()
        .filter(|word| word.starts_with("deploy/") && word.ends_with(".yaml"))
        .collect();
    assert!(applied.len() >= 2, "{applied:?}");
    for file in applied {
        assert!(
            repo().join(file).is_file(),
            "the README applies {file}, which does not exist"
        );
    }
    for fact in [
        "nvidia-device-enable=enable",
        "vcuda-core: 30",
        "vcuda-memory: 10",
        "9401",
    ] {
        assert!(
            deploy.contains(fact),
            "the README's deploy section lacks `{fact}`"
        );
    }
}
