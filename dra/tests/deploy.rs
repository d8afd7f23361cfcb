//! The DRA manifests hold together: every document is a valid object of its kind (parsed
//! with k8s-openapi and written back unchanged, so no field lies outside the schema), the
//! ConfigMap is a valid plugin config, the DeviceClass selects the driver the config
//! names, the example claim is the seed's example pod (30 cores, 10 × 256Mi), the
//! DaemonSet mounts what the config uses and never lands where the device plugin's
//! DaemonSet does, and the RBAC grants exactly what the plugin calls.

use std::path::PathBuf;

use serde_json::Value;
use vgpu_dra::DraConfig;
use vgpu_kube::k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use vgpu_kube::k8s_openapi::api::apps::v1::DaemonSet;
use vgpu_kube::k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, ServiceAccount};
use vgpu_kube::k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use vgpu_kube::k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaimTemplate};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("repo root")
        .to_path_buf()
}

fn documents(name: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(repo().join("deploy").join(name)).expect("manifest");
    serde_saphyr::from_multiple(&text).expect("YAML documents")
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
            "DaemonSet" => drop(strict::<DaemonSet>(doc)),
            "DeviceClass" => drop(strict::<DeviceClass>(doc)),
            "ResourceClaimTemplate" => drop(strict::<ResourceClaimTemplate>(doc)),
            "Pod" => drop(strict::<Pod>(doc)),
            other => panic!("unexpected kind {other}"),
        }
    }
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter()
        .find(|doc| doc["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind}"))
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
    assert!(
        expressions
            .iter()
            .any(|e| e["key"] == "vgpu-shim.io/mode" && e["values"][0] == "dra")
    );

    // RBAC: exactly the calls the plugin makes.
    let rules: Vec<(String, String, Vec<String>)> = of_kind(&plugin, "ClusterRole")["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .map(|rule| {
            let words = |key: &str| -> Vec<String> {
                rule[key]
                    .as_array()
                    .expect(key)
                    .iter()
                    .map(|v| v.as_str().expect("string").to_string())
                    .collect()
            };
            (
                words("apiGroups").join(","),
                words("resources").join(","),
                words("verbs"),
            )
        })
        .collect();
    let expected = [
        (
            "resource.k8s.io",
            "resourceslices",
            vec!["list", "watch", "create", "update", "delete"],
        ),
        ("resource.k8s.io", "resourceclaims", vec!["get"]),
        ("", "pods", vec!["get", "list"]),
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
