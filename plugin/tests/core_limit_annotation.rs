//! `tencent.com/vcuda-core-limit` in device-plugin mode: at PreStartContainer the plugin
//! reads the pod PodResources names from the stand-in API server (the real pod path
//! and JSON; no kube-apiserver runs here) and writes `core_mode: soft` with the
//! annotation's ceiling; a pod without it keeps the default (hard here), and while the
//! API server is away the container still starts, with the default.

mod common;

use common::{CORE, MEMORY, config_of};
use serde_json::json;
use vgpu_contract::CoreMode;

fn pod(name: &str, node: &str, ceiling: Option<&str>) -> serde_json::Value {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
        "spec": {"nodeName": node, "containers": [{"name": "main"}]}
    });
    if let Some(value) = ceiling {
        pod["metadata"]["annotations"] = json!({"tencent.com/vcuda-core-limit": value});
    }
    pod
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pods_ceiling_annotation_makes_the_limit_soft() {
    let (server, kubelet, mut plugin) = common::plugin_with_api(4, 4 << 30).await;
    server.put_pod(pod("annotated", common::NODE, Some("50")));
    server.put_pod(pod("plain", common::NODE, None));
    server.put_pod(pod("elsewhere", "node-b", Some("90")));
    server.put_pod(pod("later", common::NODE, Some("70")));

    let mut start = async |name: &str| {
        let admitted = kubelet
            .admit_and_start(
                &mut plugin,
                "default",
                name,
                "main",
                &[(CORE, 20), (MEMORY, 2)],
            )
            .await;
        config_of(&admitted).devices[0].clone()
    };
    let annotated = start("annotated").await;
    assert_eq!(
        (
            annotated.core_limit,
            annotated.core_mode,
            annotated.core_ceiling
        ),
        (Some(20), CoreMode::Soft, Some(50))
    );
    let plain = start("plain").await;
    assert_eq!(
        (plain.core_mode, plain.core_ceiling),
        (CoreMode::Hard, None)
    );
    let elsewhere = start("elsewhere").await;
    assert_eq!(
        elsewhere.core_mode,
        CoreMode::Hard,
        "a pod bound to another node is not trusted"
    );
    server.set_down(true);
    let later = start("later").await;
    assert_eq!(
        later.core_mode,
        CoreMode::Hard,
        "API server away: the default applies"
    );
    assert!(
        server
            .requests()
            .iter()
            .any(|r| r == "GET /api/v1/namespaces/default/pods/annotated"),
        "{:?}",
        server.requests()
    );
    plugin.handle.stop().await;
}
