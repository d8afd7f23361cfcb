//! The DRA driver through kubelet's own gRPC client: `tests/k8s/kubelet-dial`, a Go
//! program on the grpc-go that kubelet v1.37.2 is built with, dials the registration
//! socket as the plugin watcher does (the socket's path as the target, no authority
//! set: grpc-go sends the percent-encoded path as the HTTP/2 `:authority`) and the DRA
//! socket as the DRA plugin manager does (`unix:` target). The test kubelet of
//! `common` is tonic, which sends a valid authority, so it never saw what the real
//! kubelet sends. Needs Go (by the prerequisite policy: skipped outside CI without it).

mod common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use common::*;
use serde_json::Value;
use vgpu_dra::cards::NoDetails;
use vgpu_kube::standin::StandInApiServer;
use vgpu_node_agent::devices::FakeSource;
use vgpu_test_support::kubelet_dial;

const GIB: u64 = 1 << 30;

/// Runs `kubelet-dial ARGS` off the async runtime: the JSON it printed, or its
/// `error: ...` line.
async fn dial(program: &Path, args: &[&str]) -> Result<Value, String> {
    let program = program.to_path_buf();
    let args: Vec<String> = args.iter().map(|arg| arg.to_string()).collect();
    let out = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        kubelet_dial::run(&program, &args)
    })
    .await
    .expect("join")?;
    Ok(serde_json::from_str(&out).unwrap_or_else(|err| panic!("{err}: {out}")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelets_own_grpc_client_registers_prepares_and_unprepares() {
    let Some(client) = kubelet_dial::kubelet_dial() else {
        return;
    };
    let server = StandInApiServer::start().await.expect("stand-in");
    let kubelet = TestKubelet::new();
    let config = kubelet.config(&server.url());
    let plugin = vgpu_dra::start(
        config.clone(),
        Arc::new(FakeSource::uniform(2, 16 * GIB)),
        Arc::new(NoDetails),
    )
    .await
    .expect("start");

    // The plugin watcher: GetInfo, then NotifyRegistrationStatus.
    let socket = kubelet.wait_registration_socket().await;
    let info = dial(&client, &["register", &socket.to_string_lossy()])
        .await
        .unwrap_or_else(|err| panic!("kubelet's plugin watcher cannot register us: {err}"));
    assert_eq!(info["type"], "DRAPlugin");
    assert_eq!(info["name"], DRIVER);
    let endpoint = info["endpoint"].as_str().expect("endpoint").to_string();
    assert_eq!(endpoint, config.dra_socket().to_string_lossy());
    assert_eq!(plugin.registration().accepted.load(Ordering::Relaxed), 1);

    // The DRA plugin manager: NodePrepareResources, v1.
    let placement = Placement {
        pool: NODE.into(),
        device: "gpu-1".into(),
        cores: 40,
        memory: 2 * GIB,
    };
    let uid = "44444444-dddd-4ddd-8ddd-000000000040";
    put_reserved_claim(
        &server,
        ("team", "train-40", uid),
        &placement,
        ("trainer", "pod-uid-40"),
    );
    let prepared = dial(&client, &["prepare", &endpoint, "team", "train-40", uid])
        .await
        .unwrap_or_else(|err| panic!("NodePrepareResources: {err}"));
    let entry = &prepared["claims"][uid];
    assert_eq!(entry.get("error"), None, "{prepared}");
    assert_eq!(entry["devices"][0]["device_name"], "gpu-1", "{prepared}");
    assert_eq!(
        entry["devices"][0]["cdi_device_ids"][0],
        format!("vgpu-shim.io/gpu={uid}-gpu"),
        "{prepared}"
    );
    assert!(plugin.preparer().prepared().contains_key(uid));

    let unprepared = dial(&client, &["unprepare", &endpoint, "team", "train-40", uid])
        .await
        .unwrap_or_else(|err| panic!("NodeUnprepareResources: {err}"));
    assert_eq!(unprepared["claims"][uid].get("error"), None, "{unprepared}");
    assert!(plugin.preparer().prepared().is_empty());

    // A re-served registration socket registers again through the same client.
    std::fs::remove_file(&socket).expect("remove");
    let socket = kubelet.wait_registration_socket().await;
    dial(&client, &["register", &socket.to_string_lossy()])
        .await
        .unwrap_or_else(|err| panic!("registration after re-serving: {err}"));
    assert_eq!(plugin.registration().accepted.load(Ordering::Relaxed), 2);
    plugin.stop().await;
}
