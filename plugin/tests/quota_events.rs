//! Issue 27 on the device plugin: what the quota did to a container is seen from the
//! host. The shim's counters in the container's usage region (bumped here through the
//! region API exactly as the shim bumps them) become the metrics
//! `vgpu_container_memory_refusals_total`, `..._refused_bytes_total`,
//! `vgpu_container_throttled_seconds_total` and `..._memory_over_quota_total`, and the
//! first refusal and the first time over quota each become a Kubernetes Event on the
//! pod (the stand-in API server's `events.k8s.io/v1`), rate-limited; the config of a
//! namespace listed in `warn_on_refusal_namespaces` turns the shims' warning line on.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{CORE, MEMORY, config_of, host_path_of, http_get, metric_value as value};
use serde_json::json;
use vgpu_contract::process::Identity;
use vgpu_contract::region::Region;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_is_counted_exported_and_told_on_the_pod_once_an_interval() {
    let (server, kubelet, mut plugin) = common::plugin_with_api_and(2, 8 << 30, |config| {
        config.warn_on_refusal_namespaces = vec!["team-a".into()];
    })
    .await;
    server.put_pod(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "trainer", "namespace": "team-a", "uid": "uid-trainer"},
        "spec": {"nodeName": common::NODE, "containers": [{"name": "main"}]}
    }));
    // 30 cores and 8 x 256 MiB = 2 GiB of the card.
    let admitted = kubelet
        .admit_and_start(
            &mut plugin,
            "team-a",
            "trainer",
            "main",
            &[(CORE, 30), (MEMORY, 8)],
        )
        .await;
    assert!(
        config_of(&admitted).warn_on_refusal,
        "team-a is listed: its shims print the warning line"
    );
    let merged = admitted.merged();
    let region_path = Path::new(host_path_of(&merged, "/etc/vgpu/usage.region")).to_path_buf();

    // A whole card for a second pod, with no memory limit of its own.
    let whole = kubelet
        .admit(&mut plugin, "team-b", "other", "main", &[(CORE, 100)])
        .await
        .map_err(|(_, status)| status)
        .expect("a whole card admitted");

    // The shim of a process of the container: holds 1.5 GiB, refused 1 GiB, waited.
    let region = Region::open_existing(&region_path).expect("region");
    let me = Identity {
        pid: 4242,
        start_time: 1,
        pid_ns: 4026532999,
    };
    let slot = region.attach(&me).expect("attach");
    region.add_used(slot, 0, 1536 << 20);
    region.count_refusal(0, 1 << 30, 1536 << 20);
    region.add_throttled(0, 2_500_000_000);

    let events = server.k8s_events_within(1, Duration::from_secs(10)).await;
    assert_eq!(events.len(), 1, "{events:?}");
    let event = &events[0];
    assert_eq!(event["reason"], "GPUMemoryQuotaRefused");
    assert_eq!(event["type"], "Warning");
    assert_eq!(event["regarding"]["kind"], "Pod");
    assert_eq!(event["regarding"]["name"], "trainer");
    assert_eq!(event["regarding"]["uid"], "uid-trainer");
    assert_eq!(event["reportingInstance"], "tencent.com/vgpu-plugin-node-a");
    let note = event["note"].as_str().expect("note");
    for part in [
        "team-a/trainer/main",
        "an allocation of 1.00 GiB",
        "quota of 2.00 GiB",
        "held 1.50 GiB",
        "GPU-fake-0",
    ] {
        assert!(note.contains(part), "{part:?} not in {note}");
    }

    // The metrics, with the existing labels.
    let address = plugin.handle.metrics_address().expect("metrics");
    let labels = r#"namespace="team-a",pod="trainer",container="main",UUID="GPU-fake-0""#;
    let (code, metrics) = http_get(address, "/metrics").await;
    assert_eq!(code, 200);
    assert_eq!(
        value(&metrics, "vgpu_container_memory_refusals_total", labels),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        value(
            &metrics,
            "vgpu_container_memory_refused_bytes_total",
            labels
        ),
        Some(1073741824.0)
    );
    assert_eq!(
        value(&metrics, "vgpu_container_throttled_seconds_total", labels),
        Some(2.5)
    );
    assert_eq!(
        value(&metrics, "vgpu_container_memory_over_quota_total", labels),
        Some(0.0)
    );
    assert_eq!(
        value(&metrics, "vgpu_container_memory_limit_bytes", labels),
        Some(2147483648.0)
    );

    // Many more refusals, and the process exits: the counters keep counting for the
    // container, but no second refusal Event within the interval (300 s by default).
    for _ in 0..50 {
        region.count_refusal(0, 64 << 20, 2000 << 20);
    }
    region.detach(slot);
    // Over quota is its own reason: told at once.
    region.count_over_quota(0);
    let events = server.k8s_events_within(2, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let events_later = server.k8s_events();
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events_later.len(), 2, "rate-limited: {events_later:?}");
    assert!(
        events_later
            .iter()
            .any(|event| event["reason"] == "GPUMemoryOverQuota")
    );
    let (_, metrics) = http_get(address, "/metrics").await;
    assert_eq!(
        value(&metrics, "vgpu_container_memory_refusals_total", labels),
        Some(51.0)
    );
    assert_eq!(
        value(&metrics, "vgpu_container_memory_over_quota_total", labels),
        Some(1.0)
    );

    drop(region);
    kubelet
        .start_container(&mut plugin, &whole)
        .await
        .expect("PreStart whole card");
    let whole_config = config_of(&whole);
    assert!(!whole_config.warn_on_refusal, "team-b is not listed");
    assert_eq!(whole_config.devices[0].memory_limit, None);
    let whole_card = whole_config.devices[0].uuid.clone().expect("uuid");
    let whole_labels =
        format!(r#"namespace="team-b",pod="other",container="main",UUID="{whole_card}""#);
    let (_, metrics) = http_get(address, "/metrics").await;
    assert_eq!(
        value(&metrics, "vgpu_container_memory_limit_bytes", &whole_labels),
        Some((8u64 << 30) as f64),
        "no limit of its own reads as the card's memory, never 0: {metrics}"
    );
    plugin.handle.stop().await;
}
