//! The DRA manifests hold together: every document is a valid object of its kind (parsed
//! with k8s-openapi and written back unchanged, so no field lies outside the schema), the
//! ConfigMap is a valid plugin config, the DeviceClass selects the driver the config
//! names, the example claim is the seed's example pod (30 cores, 10 × 256Mi), the
//! DaemonSet mounts what the config uses and never lands where the device plugin's
//! DaemonSet does, and the RBAC grants exactly what the plugin calls. The Namespace is a
//! file of its own that neither mode's manifest touches; the DRA DaemonSet has probes,
//! requests and a metrics Service; the driver paths both configs name are what the init
//! container's `vgpu-ldconfig prepare` writes.

mod manifest;

use std::path::PathBuf;

use manifest::of_kind;
use serde_json::Value;
use vgpu_dra::DraConfig;
use vgpu_kube::k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use vgpu_kube::k8s_openapi::api::apps::v1::DaemonSet;
use vgpu_kube::k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Service, ServiceAccount};
use vgpu_kube::k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use vgpu_kube::k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaimTemplate};
use vgpu_test_support::repo_root;

fn documents(name: &str) -> Vec<Value> {
    manifest::parse(
        &std::fs::read_to_string(repo_root().join("deploy").join(name)).expect("manifest"),
    )
}

fn strict<T: serde::de::DeserializeOwned + serde::Serialize>(doc: &Value) -> T {
    let parsed: T =
        serde_json::from_value(doc.clone()).unwrap_or_else(|err| panic!("{}: {err}", doc["kind"]));
    let again = serde_json::to_value(&parsed).expect("serialize");
    assert_eq!(&again, doc, "{} has fields outside its schema", doc["kind"]);
    parsed
}

fn check_kinds(docs: &[Value]) {
    for doc in docs {
        match doc["kind"].as_str().expect("kind") {
            "Namespace" => drop(strict::<Namespace>(doc)),
            "ServiceAccount" => drop(strict::<ServiceAccount>(doc)),
            "ClusterRole" => drop(strict::<ClusterRole>(doc)),
            "ClusterRoleBinding" => drop(strict::<ClusterRoleBinding>(doc)),
            "ValidatingAdmissionPolicy" => drop(strict::<ValidatingAdmissionPolicy>(doc)),
            "ValidatingAdmissionPolicyBinding" => {
                drop(strict::<ValidatingAdmissionPolicyBinding>(doc))
            }
            "ConfigMap" => drop(strict::<ConfigMap>(doc)),
            "Service" => drop(strict::<Service>(doc)),
            "DaemonSet" => drop(strict::<DaemonSet>(doc)),
            "DeviceClass" => drop(strict::<DeviceClass>(doc)),
            "ResourceClaimTemplate" => drop(strict::<ResourceClaimTemplate>(doc)),
            "Pod" => drop(strict::<Pod>(doc)),
            other => panic!("unexpected kind {other}"),
        }
    }
}

#[test]
fn the_dra_manifests_are_valid_and_agree() {
    let plugin = documents("dra/vgpu-dra-plugin.yaml");
    let class = documents("dra/device-class.yaml");
    let example = documents("dra/example-claim.yaml");
    for docs in [&plugin, &class, &example] {
        check_kinds(docs);
    }

    let text = of_kind(&plugin, "ConfigMap")["data"]["dra.yaml"]
        .as_str()
        .expect("dra.yaml");
    let config = DraConfig::from_yaml(
        &format!("{text}node_name: test-node\n"),
        std::path::Path::new("deploy/dra/vgpu-dra-plugin.yaml"),
    )
    .expect("a valid DRA config");
    assert_eq!(config.driver_name, vgpu_dra::config::DEFAULT_DRIVER_NAME);

    let device_class = of_kind(&class, "DeviceClass");
    let expression = device_class["spec"]["selectors"][0]["cel"]["expression"]
        .as_str()
        .expect("CEL");
    assert_eq!(
        expression,
        format!("device.driver == \"{}\"", config.driver_name)
    );

    let template = of_kind(&example, "ResourceClaimTemplate");
    let request = &template["spec"]["spec"]["devices"]["requests"][0];
    assert_eq!(
        request["exactly"]["deviceClassName"],
        device_class["metadata"]["name"]
    );
    let asks = &request["exactly"]["capacity"]["requests"];
    assert_eq!(
        vgpu_kube::quantity::parse_whole(asks["cores"].as_str().expect("cores")),
        Ok(30)
    );
    assert_eq!(
        vgpu_kube::quantity::parse_whole(asks["memory"].as_str().expect("memory")),
        Ok(10 * vgpu_kube::slices::MEMORY_STEP),
        "the seed's 10 vcuda-memory units"
    );
    let pod = of_kind(&example, "Pod");
    assert_eq!(
        pod["metadata"]["annotations"]["tencent.com/vcuda-core-limit"],
        "50"
    );
    assert_eq!(
        pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"],
        template["metadata"]["name"]
    );
    assert_eq!(
        pod["spec"]["containers"][0]["resources"]["claims"][0]["name"],
        pod["spec"]["resourceClaims"][0]["name"]
    );

    // The DaemonSet: mounts what the config uses; never on a device-plugin node.
    let spec = &of_kind(&plugin, "DaemonSet")["spec"]["template"]["spec"];
    let host_paths: Vec<&str> = spec["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .filter_map(|v| v["hostPath"]["path"].as_str())
        .collect();
    for needed in [
        &config.plugins_registry_dir,
        &config.plugin_dir(),
        &config.state_dir,
        &config.cdi_dir,
        &config.device_plugin_dir,
        &config.host_driver_dir,
    ] {
        let needed = needed.to_str().expect("utf-8");
        assert!(
            host_paths.iter().any(|p| needed.starts_with(p)),
            "{needed} is not mounted from the host: {host_paths:?}"
        );
    }
    let env = &spec["containers"][0]["env"];
    assert!(
        env.as_array()
            .expect("env")
            .iter()
            .any(|e| e["name"] == vgpu_dra::config::NODE_NAME_ENV
                && e["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"),
        "NODE_NAME from the downward API"
    );
    let device_plugin = documents("vgpu-plugin.yaml");
    let dp_label = of_kind(&device_plugin, "DaemonSet")["spec"]["template"]["spec"]["nodeSelector"]
        .as_object()
        .expect("the device plugin selects nodes by label")
        .keys()
        .next()
        .expect("a label")
        .clone();
    assert_eq!(spec["nodeSelector"]["vgpu-shim.io/mode"], "dra");
    let terms = &spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"];
    let expressions = terms[0]["matchExpressions"]
        .as_array()
        .expect("expressions");
    assert_eq!(
        terms.as_array().map(Vec::len),
        Some(1),
        "one term: all expressions must hold"
    );
    assert!(
        expressions
            .iter()
            .any(|e| e["key"] == dp_label.as_str() && e["operator"] == "DoesNotExist")
    );

    // RBAC: exactly the calls the plugin makes.
    let rules = manifest::cluster_role_rules(&plugin);
    let expected = [
        (
            "resource.k8s.io",
            "resourceslices",
            vec!["list", "watch", "create", "update", "delete"],
        ),
        ("resource.k8s.io", "resourceclaims", vec!["get"]),
        ("", "pods", vec!["get"]),
        ("events.k8s.io", "events", vec!["create"]),
    ];
    assert_eq!(rules.len(), expected.len(), "{rules:?}");
    for (group, resource, verbs) in expected {
        assert!(
            rules
                .iter()
                .any(|(g, r, v)| g == group && r == resource && v == &verbs),
            "no rule {group}/{resource} {verbs:?} in {rules:?}"
        );
    }
}

/// (kind, namespace, name) of every object of a manifest.
fn objects(docs: &[Value]) -> Vec<(String, String, String)> {
    docs.iter()
        .map(|doc| {
            let field = |value: &Value| value.as_str().unwrap_or_default().to_string();
            (
                field(&doc["kind"]),
                field(&doc["metadata"]["namespace"]),
                field(&doc["metadata"]["name"]),
            )
        })
        .collect()
}

/// Both modes' manifests once declared the Namespace: applying the DRA one stripped the
/// Pod Security labels the device plugin's had set, and deleting either deleted both.
/// Now the Namespace is a file of its own, and the two modes share no object.
#[test]
fn the_namespace_is_a_file_of_its_own_and_the_modes_share_no_object() {
    let namespace = documents("namespace.yaml");
    for docs in [&namespace, &documents("vgpu-plugin.yaml")] {
        check_kinds(docs);
    }
    assert_eq!(namespace.len(), 1, "the Namespace alone");
    let labels = &of_kind(&namespace, "Namespace")["metadata"]["labels"];
    for mode in ["enforce", "audit", "warn"] {
        assert_eq!(
            labels[format!("pod-security.kubernetes.io/{mode}")],
            "privileged",
            "{mode}"
        );
    }
    let name = namespace[0]["metadata"]["name"].as_str().expect("name");
    let plugin = objects(&documents("vgpu-plugin.yaml"));
    let mut dra = objects(&documents("dra/vgpu-dra-plugin.yaml"));
    dra.extend(objects(&documents("dra/device-class.yaml")));
    for (kind, namespace, object) in plugin.iter().chain(&dra) {
        assert_ne!(kind, "Namespace", "{object}");
        let cluster_scoped = [
            "ClusterRole",
            "ClusterRoleBinding",
            "DeviceClass",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        ]
        .contains(&kind.as_str());
        assert_eq!(
            namespace.is_empty(),
            cluster_scoped,
            "{kind} {object}: namespaced objects go in {name}, and only they"
        );
        if !cluster_scoped {
            assert_eq!(namespace, name, "{kind} {object}");
        }
    }
    let shared: Vec<_> = plugin
        .iter()
        .filter(|object| dra.contains(object))
        .collect();
    assert!(shared.is_empty(), "both modes' files hold {shared:?}");
}

/// The DRA DaemonSet once had no resource requests and gave its init container the
/// API token too.
#[test]
fn the_dra_daemonset_has_requests_and_its_token_only_where_it_is_used() {
    let docs = documents("dra/vgpu-dra-plugin.yaml");
    let pod = &of_kind(&docs, "DaemonSet")["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    for container in [&pod["initContainers"][0], container] {
        let resources = &container["resources"];
        assert!(
            resources["requests"]["cpu"].is_string()
                && resources["requests"]["memory"].is_string()
                && resources["limits"]["memory"].is_string(),
            "{} lacks requests or a memory limit",
            container["name"]
        );
    }
    assert_eq!(pod["automountServiceAccountToken"], false);
    let token_mounts = |container: &Value| {
        container["volumeMounts"]
            .as_array()
            .expect("mounts")
            .iter()
            .filter(|m| m["name"] == "api-token")
            .count()
    };
    assert_eq!(token_mounts(&pod["initContainers"][0]), 0);
    assert_eq!(token_mounts(container), 1);
}

/// The DRA DaemonSet once had no probes and no metrics port; the DRA driver serves
/// metrics and `/healthz` at `metrics_address`, as the device plugin does.
#[test]
fn the_dra_daemonset_has_probes_and_a_metrics_service() {
    let docs = documents("dra/vgpu-dra-plugin.yaml");
    let text = of_kind(&docs, "ConfigMap")["data"]["dra.yaml"]
        .as_str()
        .expect("dra.yaml");
    let config: serde_json::Value = serde_saphyr::from_str(text).expect("YAML");
    assert_eq!(
        config["metrics_address"].as_str(),
        Some("0.0.0.0:9402"),
        "the pod's IP; 9401 is the device plugin's"
    );
    let pod = &of_kind(&docs, "DaemonSet")["spec"]["template"]["spec"];
    assert_ne!(pod["hostNetwork"], true, "metrics on the pod's own IP");
    let container = &pod["containers"][0];
    assert_eq!(
        container["ports"],
        serde_json::json!([{"name": "metrics", "containerPort": 9402}])
    );
    for probe in ["livenessProbe", "readinessProbe"] {
        assert_eq!(container[probe]["httpGet"]["path"], "/healthz", "{probe}");
        assert_eq!(container[probe]["httpGet"]["port"], "metrics", "{probe}");
    }
    let service = of_kind(&docs, "Service");
    assert_eq!(service["spec"]["clusterIP"], "None");
    assert_eq!(
        service["spec"]["ports"][0],
        serde_json::json!({"name": "metrics", "port": 9402, "targetPort": "metrics"})
    );
    let pod_labels = &of_kind(&docs, "DaemonSet")["spec"]["template"]["metadata"]["labels"];
    for (key, value) in service["spec"]["selector"].as_object().expect("selector") {
        assert_eq!(&pod_labels[key], value);
    }
    let monitors = documents("dra/servicemonitor.yaml");
    let monitor = of_kind(&monitors, "ServiceMonitor");
    for (key, value) in monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("matchLabels")
    {
        assert_eq!(&service["metadata"]["labels"][key], value);
    }
    assert_eq!(
        monitor["spec"]["endpoints"][0]["port"],
        service["spec"]["ports"][0]["name"]
    );
}

/// The init container's `--dest=` (where `vgpu-ldconfig prepare` writes on the host).
fn init_dest(docs: &[Value]) -> PathBuf {
    let init = &of_kind(docs, "DaemonSet")["spec"]["template"]["spec"]["initContainers"][0];
    assert_eq!(init["command"][0], "vgpu-ldconfig");
    assert_eq!(init["command"][1], "prepare");
    init["command"]
        .as_array()
        .expect("command")
        .iter()
        .filter_map(|arg| arg.as_str()?.strip_prefix("--dest="))
        .map(PathBuf::from)
        .next()
        .expect("--dest=")
}

/// `path` (a host path) inside `node`, a folder standing for the host's `/`.
fn on_node(node: &std::path::Path, path: &std::path::Path) -> PathBuf {
    node.join(path.strip_prefix("/").expect("an absolute host path"))
}

/// The real `prepare` (what the init container runs) over a host whose driver is the
/// sim, into `node` at the manifest's `--dest`; then the paths each daemon's config
/// names must be files that layout holds: the NVML library it loads (read as given,
/// nothing follows `current` for it) and the shims (followed through `current`, as
/// node-agent/src/layout.rs does). The DRA manifest once named
/// `<dest>/lib64/libnvidia-ml.so.1`, a path `prepare` never writes.
#[test]
fn each_configs_driver_paths_are_files_the_init_container_writes() {
    let (Some(sim), Some(cuda_shim), Some(nvml_shim)) = (
        vgpu_test_support::built("libvgpu_sim.so"),
        vgpu_test_support::built("libcuda_shim.so"),
        vgpu_test_support::built("libnvml_shim.so"),
    ) else {
        panic!("cargo test builds the sim driver and the shims (dev-dependencies)");
    };
    let work = tempfile::tempdir().expect("tempdir");
    // The host: the sim in the real driver's place, under versioned file names.
    let version = "580.65.06";
    let lib_dir = work.path().join("host/usr/lib/x86_64-linux-gnu");
    std::fs::create_dir_all(&lib_dir).expect("lib dir");
    for soname in ["libcuda.so.1", "libnvidia-ml.so.1"] {
        let file = format!("{}.{version}", soname.trim_end_matches(".1"));
        std::fs::copy(&sim, lib_dir.join(&file)).expect("copy the sim");
        std::os::unix::fs::symlink(&file, lib_dir.join(soname)).expect("soname link");
    }
    let shims = work.path().join("shims");
    std::fs::create_dir_all(&shims).expect("shims");
    std::fs::copy(&cuda_shim, shims.join("libcuda_shim.so")).expect("cuda shim");
    std::fs::copy(&nvml_shim, shims.join("libnvml_shim.so")).expect("nvml shim");
    let driver = vgpu_ldconfig::discover(&vgpu_ldconfig::DiscoverOptions {
        host_root: work.path().join("host"),
        library_dirs: vec![PathBuf::from("/usr/lib/x86_64-linux-gnu")],
        ..vgpu_ldconfig::DiscoverOptions::default()
    })
    .expect("discover");
    assert_eq!(driver.version.as_deref(), Some(version));

    let node = work.path().join("node");
    let plugin_docs = documents("vgpu-plugin.yaml");
    let dra_docs = documents("dra/vgpu-dra-plugin.yaml");
    let dest = init_dest(&plugin_docs);
    assert_eq!(init_dest(&dra_docs), dest, "both modes prepare one folder");
    vgpu_ldconfig::prepare(&vgpu_ldconfig::PrepareOptions {
        dest: on_node(&node, &dest),
        shim_dir: shims,
        driver,
        force: false,
        // The sim exports CUDA and NVML from one library: neither shim covers it all.
        allow_missing_exports: true,
        keep_previous: vgpu_ldconfig::prepare::DEFAULT_KEEP_PREVIOUS,
        verify: false,
    })
    .expect("prepare");

    let plugin_text = of_kind(&plugin_docs, "ConfigMap")["data"]["plugin.yaml"]
        .as_str()
        .expect("plugin.yaml");
    let plugin =
        vgpu_node_agent::config::NodeConfig::from_yaml(plugin_text, std::path::Path::new("plugin"))
            .expect("plugin config");
    let dra_text = of_kind(&dra_docs, "ConfigMap")["data"]["dra.yaml"]
        .as_str()
        .expect("dra.yaml");
    let dra = DraConfig::from_yaml(
        &format!("{dra_text}node_name: test-node\n"),
        std::path::Path::new("dra"),
    )
    .expect("DRA config");
    for (mode, host_driver_dir, shim_dir, nvml_library) in [
        (
            "device-plugin",
            &plugin.host_driver_dir,
            &plugin.shim_dir,
            &plugin.nvml_library,
        ),
        (
            "dra",
            &dra.host_driver_dir,
            &dra.shim_dir,
            &dra.nvml_library,
        ),
    ] {
        assert_eq!(host_driver_dir, &dest, "{mode}: host_driver_dir");
        let nvml = on_node(&node, nvml_library);
        assert_eq!(
            std::fs::read(&nvml).unwrap_or_else(|err| panic!(
                "{mode}: nvml_library {}: {err}",
                nvml_library.display()
            )),
            std::fs::read(&sim).expect("sim"),
            "{mode}: nvml_library is the host's NVML"
        );
        let shims = vgpu_ldconfig::versions::follow_current(
            &on_node(&node, host_driver_dir),
            &on_node(&node, shim_dir),
        );
        for shim in ["libcuda_shim.so", "libnvml_shim.so"] {
            assert!(
                shims.join(shim).is_file(),
                "{mode}: shim_dir {} lacks {shim}",
                shim_dir.display()
            );
        }
    }
}
