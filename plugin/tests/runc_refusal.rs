//! Issue 27 end to end in a real container: the plugin (stand-in kubelet and API
//! server, the simulated driver) allocates 30 cores and 4 memory units (1 GiB) and a
//! `runc` container built from the merged Allocate responses runs NVIDIA's
//! cuda-bindings through the shims: 700 MiB fits, 700 MiB more is refused. Then the
//! shim's own counter reaches the plugin's metrics
//! (`vgpu_container_memory_refusals_total`, `..._refused_bytes_total`), an Event
//! `GPUMemoryQuotaRefused` is written on the pod with the quota, the size asked and
//! what the container held, and the shim's warning line is in the container's stderr
//! (its namespace is listed in `warn_on_refusal_namespaces`).
//!
//! Needs root, `runc`, overlayfs, python3 with pynvml and cuda-bindings, and the shims
//! and sim driver in `target/<profile>/`. Missing prerequisites skip the test here and
//! fail it on CI.

mod common;

use std::time::{Duration, Instant};

use common::e2e;
use common::{CORE, MEMORY, TestKubelet, http_get, metric_value as value};
use serde_json::json;
use vgpu_kube::standin::StandInApiServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_in_a_real_container_reaches_the_metrics_the_event_and_its_stderr() {
    if !e2e::prerequisites("runc") {
        return;
    }
    let server = StandInApiServer::start().await.expect("stand-in");
    server.put_pod(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "e2e", "namespace": "default", "uid": "uid-e2e"},
        "spec": {"nodeName": "node-a", "containers": [{"name": "cuda"}]}
    }));
    let kubelet = TestKubelet::start().await;
    let mut config = kubelet.plugin_config();
    config.api_server_url = Some(server.url());
    config.node_name = Some("node-a".into());
    config.warn_on_refusal_namespaces = vec!["default".into()];
    let (_config, plugin, admitted) =
        e2e::started_container(&kubelet, config, &[(CORE, 30), (MEMORY, 4)]).await;
    let response = admitted.merged();
    let bundle = e2e::python_bundle(
        kubelet.root.path(),
        "bundle",
        &response,
        &[
            "PATH=/usr/local/bin:/usr/bin:/bin".into(),
            "VGPU_SIM_GPUS=2".into(),
            "VGPU_SIM_CONTEXT_OVERHEAD=64MiB".into(),
        ],
        &[
            "/vgpu-tests/clients/cuda_check.py",
            "sequence",
            "700",
            "700",
        ],
    );
    let (ok, stdout, stderr) =
        e2e::runc_run(&bundle, &format!("vgpu-refusal-{}", std::process::id()));
    assert!(ok, "runc failed: {stdout}\n{stderr}");
    assert!(
        stdout.contains(r#""results": ["CUDA_SUCCESS", "CUDA_ERROR_OUT_OF_MEMORY"]"#),
        "{stdout}\n{stderr}"
    );
    let warning = stderr
        .lines()
        .find(|line| line.starts_with("vgpu-shim[cuda]: CUDA_ERROR_OUT_OF_MEMORY"))
        .unwrap_or_else(|| panic!("no warning line: {stderr}"));
    assert!(
        warning.contains("refused 700.0 MiB") && warning.contains("quota of 1024.0 MiB"),
        "{warning}"
    );

    let deadline = Instant::now() + Duration::from_secs(15);
    while server.k8s_events().is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let events = server.k8s_events();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["reason"], "GPUMemoryQuotaRefused");
    assert_eq!(events[0]["regarding"]["uid"], "uid-e2e");
    let note = events[0]["note"].as_str().expect("note");
    assert!(
        note.contains("default/e2e/cuda")
            && note.contains("an allocation of 700.0 MiB")
            && note.contains("quota of 1.00 GiB"),
        "{note}"
    );

    let card = events[0]["note"]
        .as_str()
        .and_then(|note| note.split_whitespace().find(|w| w.starts_with("GPU-")))
        .expect("the card in the note")
        .to_string();
    let labels = format!(r#"namespace="default",pod="e2e",container="cuda",UUID="{card}""#);
    let address = plugin.handle.metrics_address().expect("metrics");
    let (_, metrics) = http_get(address, "/metrics").await;
    assert_eq!(
        value(&metrics, "vgpu_container_memory_refusals_total", &labels),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        value(
            &metrics,
            "vgpu_container_memory_refused_bytes_total",
            &labels
        ),
        Some((700u64 << 20) as f64)
    );
    assert_eq!(
        value(&metrics, "vgpu_container_throttled_seconds_total", &labels),
        Some(0.0)
    );
    plugin.handle.stop().await;
}
