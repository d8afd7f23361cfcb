//! The shipped manifests hold together: the ConfigMap's plugin config parses with the
//! plugin's own schema, the DaemonSet selects gpu-manager's node label and mounts what
//! the config names, the example pod asks for what the README says, and the README's
//! "Deploy on Kubernetes" commands name files that exist.

use serde_json::Value;
use vgpu_node_agent::config::NodeConfig;
use vgpu_test_support::repo_root;

fn documents(name: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(repo_root().join("deploy").join(name)).expect("manifest");
    serde_saphyr::from_multiple(&text).expect("YAML documents")
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
    let config = NodeConfig::from_yaml(text, std::path::Path::new("deploy/vgpu-plugin.yaml"))
        .expect("valid plugin config");
    assert_eq!(config.core_resource, "tencent.com/vcuda-core");
    assert_eq!(config.memory_resource, "tencent.com/vcuda-memory");
    assert_eq!(config.memory_unit, vgpu_contract::ByteSize::mib(256));

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
        .as_array()
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
        .as_array()
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

    let readme = std::fs::read_to_string(repo_root().join("README.md")).expect("README");
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
            repo_root().join(file).is_file(),
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

fn daemonset_pod(docs: &[Value]) -> &Value {
    &of_kind(docs, "DaemonSet")["spec"]["template"]["spec"]
}

fn strings(value: &Value) -> Vec<&str> {
    value
        .as_array()
        .map(|items| items.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

#[test]
fn the_manifests_name_the_versioned_image_that_build_image_makes() {
    let expected = format!("vgpu-shim/vgpu-plugin:{}", env!("CARGO_PKG_VERSION"));
    let docs = documents("vgpu-plugin.yaml");
    let pod = daemonset_pod(&docs);
    let mut images = Vec::new();
    for list in ["initContainers", "containers"] {
        for container in pod[list].as_array().expect(list) {
            images.push(container["image"].as_str().expect("image"));
        }
    }
    assert_eq!(images, [expected.as_str(), expected.as_str()]);
    assert_eq!(
        of_kind(&docs, "DaemonSet")["metadata"]["labels"]["app.kubernetes.io/version"].as_str(),
        Some(env!("CARGO_PKG_VERSION"))
    );
    let folders = [repo_root().join("deploy"), repo_root().join("deploy/dra")];
    for entry in folders
        .iter()
        .flat_map(|folder| std::fs::read_dir(folder).expect("deploy").flatten())
        .filter(|entry| entry.path().is_file())
    {
        let text = std::fs::read_to_string(entry.path()).expect("read");
        assert!(
            !text.contains(":latest"),
            "{} names a latest tag",
            entry.path().display()
        );
    }
    // What deploy/build-image.sh tags (podman adds localhost/ to a name without registry).
    let output = std::process::Command::new("bash")
        .arg(repo_root().join("deploy/build-image.sh"))
        .arg("--print-ref")
        .output()
        .expect("bash");
    assert!(output.status.success());
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        format!("localhost/{expected}")
    );
}

#[test]
fn the_daemonset_grants_only_what_the_plugin_uses() {
    let docs = documents("vgpu-plugin.yaml");
    let pod = daemonset_pod(&docs);
    assert!(
        !pod["hostNetwork"].as_bool().unwrap_or(false),
        "metrics are served on the pod IP, not every node address"
    );
    // The API token: not automounted, projected into the plugin container only.
    assert_eq!(pod["automountServiceAccountToken"].as_bool(), Some(false));
    assert_eq!(
        of_kind(&docs, "ServiceAccount")["automountServiceAccountToken"].as_bool(),
        Some(false)
    );
    let token_path = "/var/run/secrets/kubernetes.io/serviceaccount";
    let mounts_of = |container: &Value| -> Vec<String> {
        container["volumeMounts"]
            .as_array()
            .map(|mounts| {
                mounts
                    .iter()
                    .filter_map(|m| m["mountPath"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let init = &pod["initContainers"][0];
    let plugin = &pod["containers"][0];
    assert!(!mounts_of(init).iter().any(|path| path == token_path));
    assert!(mounts_of(plugin).iter().any(|path| path == token_path));
    let token = pod["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .find(|volume| volume["name"].as_str() == Some("api-token"))
        .expect("api-token volume");
    assert!(token["projected"]["sources"][0]["serviceAccountToken"].is_object());

    // RBAC: get a pod (the soft-ceiling annotation, kube/src/pods.rs PodReader::get),
    // create an Event on it (issue 27's quota refusal); nothing else.
    let rules = of_kind(&docs, "ClusterRole")["rules"]
        .as_array()
        .expect("rules");
    let rules: Vec<(Vec<&str>, Vec<&str>, Vec<&str>)> = rules
        .iter()
        .map(|rule| {
            (
                strings(&rule["apiGroups"]),
                strings(&rule["resources"]),
                strings(&rule["verbs"]),
            )
        })
        .collect();
    assert_eq!(
        rules,
        [
            (vec![""], vec!["pods"], vec!["get", "list"]),
            (vec!["events.k8s.io"], vec!["events"], vec!["create"]),
        ]
    );

    // The init container runs with no privilege; the namespace admits the plugin's.
    let init_security = &init["securityContext"];
    assert_eq!(init_security["privileged"].as_bool(), Some(false));
    assert_eq!(strings(&init_security["capabilities"]["drop"]), ["ALL"]);
    assert_eq!(
        init_security["readOnlyRootFilesystem"].as_bool(),
        Some(true)
    );
    assert!(strings(&init["command"]).contains(&"--host-root=/host"));
    assert_eq!(
        plugin["securityContext"]["privileged"].as_bool(),
        Some(true)
    );
    // deploy/namespace.yaml, applied first, is shared with DRA mode.
    assert!(
        docs.iter()
            .all(|doc| doc["kind"].as_str() != Some("Namespace"))
    );
    let namespace = documents("namespace.yaml");
    let namespace = of_kind(&namespace, "Namespace");
    assert_eq!(
        namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"].as_str(),
        Some("privileged")
    );
    assert_eq!(
        of_kind(&docs, "DaemonSet")["metadata"]["namespace"],
        namespace["metadata"]["name"]
    );
    // gpu-manager's taint is tolerated.
    assert!(
        pod["tolerations"]
            .as_array()
            .expect("tolerations")
            .iter()
            .any(|t| t["key"].as_str() == Some("tencent.com/vcuda-core")
                && t["operator"].as_str() == Some("Exists"))
    );
    for container in [init, plugin] {
        let resources = &container["resources"];
        assert!(
            resources["requests"]["cpu"].is_string()
                && resources["requests"]["memory"].is_string()
                && resources["limits"]["memory"].is_string(),
            "{:?} lacks requests or a memory limit",
            container["name"]
        );
    }
}

#[test]
fn probes_service_and_servicemonitor_reach_the_metrics_port() {
    let docs = documents("vgpu-plugin.yaml");
    let text = of_kind(&docs, "ConfigMap")["data"]["plugin.yaml"]
        .as_str()
        .expect("plugin.yaml");
    let config = NodeConfig::from_yaml(text, std::path::Path::new("configmap")).expect("config");
    assert!(
        config
            .nvml_library
            .starts_with(config.host_driver_dir.join("current")),
        "NVML from the prepared driver in use"
    );
    let port = config.metrics_address.expect("metrics on").port();
    let pod = daemonset_pod(&docs);
    let plugin = &pod["containers"][0];
    let named: Vec<(&str, i64)> = plugin["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .map(|p| {
            (
                p["name"].as_str().expect("name"),
                p["containerPort"].as_i64().expect("port"),
            )
        })
        .collect();
    assert_eq!(named, [("metrics", i64::from(port))]);
    for probe in ["livenessProbe", "readinessProbe"] {
        assert_eq!(plugin[probe]["httpGet"]["path"].as_str(), Some("/healthz"));
        assert_eq!(plugin[probe]["httpGet"]["port"].as_str(), Some("metrics"));
    }
    let service = of_kind(&docs, "Service");
    let pod_labels = &of_kind(&docs, "DaemonSet")["spec"]["template"]["metadata"]["labels"];
    for (key, value) in service["spec"]["selector"].as_object().expect("selector") {
        assert_eq!(&pod_labels[key.as_str()], value);
    }
    assert_eq!(service["spec"]["clusterIP"].as_str(), Some("None"));
    assert_eq!(
        service["spec"]["ports"][0]["targetPort"].as_str(),
        Some("metrics")
    );
    let monitors = documents("servicemonitor.yaml");
    let monitor = of_kind(&monitors, "ServiceMonitor");
    for (key, value) in monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("matchLabels")
    {
        assert_eq!(&service["metadata"]["labels"][key.as_str()], value);
    }
    let endpoint = &monitor["spec"]["endpoints"][0];
    assert_eq!(endpoint["port"], service["spec"]["ports"][0]["name"]);
    assert_eq!(endpoint["path"].as_str(), Some("/metrics"));
    assert_eq!(
        endpoint["honorLabels"].as_bool(),
        Some(true),
        "keeps the tenants' namespace/pod/container labels"
    );
}

#[test]
fn the_networkpolicy_example_parses_and_covers_both_metrics_ports() {
    use vgpu_kube::k8s_openapi::api::networking::v1::NetworkPolicy;
    let docs = documents("networkpolicy.yaml");
    let policies: Vec<NetworkPolicy> = docs
        .iter()
        .map(|doc| serde_json::from_value(doc.clone()).expect("a NetworkPolicy"))
        .collect();
    assert_eq!(policies.len(), 2);
    let ingress = policies[0].spec.as_ref().expect("spec");
    let ports: Vec<String> = ingress.ingress.as_ref().expect("ingress")[0]
        .ports
        .iter()
        .flatten()
        .filter_map(|port| port.port.as_ref().map(|port| format!("{port:?}")))
        .collect();
    assert_eq!(ports, ["Int(9401)", "Int(9402)"]);
    // The plugin's own port is the one the DaemonSet serves.
    let daemonset = of_kind(&documents("vgpu-plugin.yaml"), "DaemonSet").clone();
    let text = serde_json::to_string(&daemonset).expect("json");
    assert!(text.contains("\"containerPort\":9401"), "{text}");
    let egress = policies[1].spec.as_ref().expect("spec");
    assert_eq!(
        egress.policy_types.as_deref(),
        Some(&["Egress".to_string()][..])
    );
}
