//! The device plugin's sockets through kubelet's own gRPC client
//! (`tests/k8s/kubelet-dial`, on the grpc-go kubelet v1.37.2 is built with): the
//! device manager dials each resource's socket with `localhost` as the authority and
//! asks GetDevicePluginOptions. The stand-in kubelet of `common` is tonic. Needs Go (by
//! the prerequisite policy: skipped outside CI without it).

mod common;

use std::sync::Arc;

use common::TestKubelet;
use vgpu_node_agent::devices::FakeSource;
use vgpu_test_support::kubelet_dial;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelets_device_manager_client_reaches_both_resource_sockets() {
    let Some(client) = kubelet_dial::kubelet_dial() else {
        return;
    };
    let kubelet = TestKubelet::start().await;
    let plugin = vgpu_plugin::start(
        kubelet.plugin_config(),
        Arc::new(FakeSource::uniform(2, 4 << 30)),
    )
    .await
    .expect("plugin starts");
    kubelet.wait_registrations(2).await;
    let sockets: Vec<String> = plugin
        .sockets()
        .iter()
        .map(|socket| socket.to_string_lossy().into_owned())
        .collect();
    for socket in sockets {
        let program = client.clone();
        let answer = tokio::task::spawn_blocking(move || {
            kubelet_dial::run(&program, &["device-plugin", &socket])
        })
        .await
        .expect("join")
        .unwrap_or_else(|err| panic!("kubelet's device manager: {err}"));
        let options: serde_json::Value = serde_json::from_str(&answer).expect("JSON");
        assert_eq!(options["pre_start_required"], true, "{answer}");
        assert_eq!(
            options["get_preferred_allocation_available"], true,
            "{answer}"
        );
    }
    plugin.stop().await;
}
