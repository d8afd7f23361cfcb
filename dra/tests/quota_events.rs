//! Issue 27 in DRA mode: a refusal in a prepared request's container becomes the device
//! plugin's Event (`GPUMemoryQuotaRefused`, `events.k8s.io/v1`, rate-limited, naming the
//! quota, the size asked and what the container held) on the pod the claim is reserved
//! for, and the counters survive a driver restart: the metrics keep the totals, refusals
//! told before the restart are not told again, new ones are. A checkpoint of a driver
//! that kept no pods gets them from the claim. Against the stand-in API server; the
//! shim's counters are bumped through the region API exactly as the shim bumps them.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;
use vgpu_contract::region::Region;
use vgpu_dra::cards::NoDetails;
use vgpu_dra::checkpoint::ClaimPod;
use vgpu_kube::standin::StandInApiServer;
use vgpu_node_agent::devices::FakeSource;
use vgpu_test_support::metric_value;

const GIB: u64 = 1 << 30;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_in_a_claims_container_is_told_on_its_pod_and_survives_a_restart() {
    let server = StandInApiServer::start().await.expect("stand-in");
    let kubelet = TestKubelet::new();
    let config = kubelet.config(&server.url());
    let source = Arc::new(FakeSource::uniform(2, 16 * GIB));
    let plugin = vgpu_dra::start(config.clone(), source.clone(), Arc::new(NoDetails))
        .await
        .expect("start");
    let info = kubelet.register().await;

    // A claim of 40 cores and 4 GiB on gpu-0, reserved for pod team/trainer.
    let uid = "55555555-eeee-4eee-8eee-000000000040";
    let placement = Placement {
        pool: NODE.into(),
        device: "gpu-0".into(),
        cores: 40,
        memory: 4 * GIB,
    };
    put_reserved_claim(
        &server,
        ("team", "train", uid),
        &placement,
        ("trainer", "pod-uid-trainer"),
    );
    let mut v1 = kubelet.v1(&info.endpoint).await;
    prepare(&mut v1, claim("team", "train", uid))
        .await
        .expect("prepared");
    let trainer = vec![ClaimPod {
        name: "trainer".into(),
        uid: "pod-uid-trainer".into(),
    }];
    assert_eq!(plugin.preparer().prepared()[uid].pods, trainer);
    let id = plugin.preparer().prepared()[uid].requests[0]
        .container_id
        .clone();
    let region_path = plugin.preparer().allocation_dir(&id).join("usage.region");

    // The shim of the container: holds 3 GiB, refused 1 GiB more.
    let region = Region::open_existing(&region_path).expect("region");
    region.count_refusal(0, GIB, 3 * GIB);
    let events = server.k8s_events_within(1, Duration::from_secs(10)).await;
    assert_eq!(events.len(), 1, "{events:?}");
    let event = &events[0];
    assert_eq!(event["reason"], "GPUMemoryQuotaRefused");
    assert_eq!(event["type"], "Warning");
    assert_eq!(event["metadata"]["namespace"], "team");
    assert_eq!(event["regarding"]["kind"], "Pod");
    assert_eq!(event["regarding"]["namespace"], "team");
    assert_eq!(event["regarding"]["name"], "trainer");
    assert_eq!(event["regarding"]["uid"], "pod-uid-trainer");
    // Reported by the DRA driver, under its driver name (not the device plugin's).
    assert_eq!(event["reportingController"], DRIVER);
    assert_eq!(event["reportingInstance"], format!("{DRIVER}-{NODE}"));
    let note = event["note"].as_str().expect("note");
    for part in [
        "team/trainer/claim train, request gpu",
        "an allocation of 1.00 GiB",
        "on GPU-fake-0",
        "quota of 4.00 GiB",
        "held 3.00 GiB",
        "memory in the ResourceClaim",
    ] {
        assert!(note.contains(part), "{part:?} not in {note}");
    }

    // More refusals within the interval (300 s): counted, not told again.
    for _ in 0..5 {
        region.count_refusal(0, 512 << 20, 3 * GIB);
    }
    let address = plugin.metrics_address().expect("metrics");
    let labels = r#"namespace="team",claim="train",request="gpu",UUID="GPU-fake-0""#;
    let (_, metrics) = http_get(address, "/metrics").expect("metrics");
    assert_eq!(
        metric_value(&metrics, "vgpu_container_memory_refusals_total", labels),
        Some(6.0),
        "{metrics}"
    );
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(server.k8s_events().len(), 1, "rate-limited");

    // A restart, from a checkpoint of a driver that kept no pods.
    drop(v1);
    plugin.stop().await;
    let state = config.state_file();
    let mut checkpoint: Value =
        serde_json::from_str(&std::fs::read_to_string(&state).expect("state")).expect("json");
    checkpoint["claims"][uid]
        .as_object_mut()
        .expect("claim")
        .remove("pods");
    std::fs::write(&state, checkpoint.to_string()).expect("write");
    let plugin = vgpu_dra::start(config.clone(), source, Arc::new(NoDetails))
        .await
        .expect("restart");
    let deadline = Instant::now() + Duration::from_secs(10);
    while plugin.preparer().prepared()[uid].pods.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        plugin.preparer().prepared()[uid].pods,
        trainer,
        "the pods come from the claim's reservedFor"
    );
    // The totals come back from the region; what was told is not told again.
    let address = plugin.metrics_address().expect("metrics");
    let (_, metrics) = http_get(address, "/metrics").expect("metrics");
    assert_eq!(
        metric_value(&metrics, "vgpu_container_memory_refusals_total", labels),
        Some(6.0),
        "{metrics}"
    );
    assert_eq!(
        metric_value(
            &metrics,
            "vgpu_container_memory_refused_bytes_total",
            labels
        ),
        Some((GIB + 5 * (512 << 20)) as f64)
    );
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        server.k8s_events().len(),
        1,
        "no second Event for old refusals"
    );

    // New findings after the restart are told: over quota and a refusal.
    region.count_over_quota(0);
    region.count_refusal(0, 2 * GIB, 3 * GIB);
    let events = server.k8s_events_within(3, Duration::from_secs(10)).await;
    let mut reasons: Vec<&str> = events
        .iter()
        .map(|event| event["reason"].as_str().expect("reason"))
        .collect();
    reasons.sort();
    assert_eq!(
        reasons,
        [
            "GPUMemoryOverQuota",
            "GPUMemoryQuotaRefused",
            "GPUMemoryQuotaRefused"
        ],
        "{events:?}"
    );
    let newest = events
        .iter()
        .filter(|event| event["reason"] == "GPUMemoryQuotaRefused")
        .find(|event| {
            event["note"]
                .as_str()
                .is_some_and(|note| note.contains("an allocation of 2.00 GiB"))
        })
        .expect("the refusal after the restart");
    assert!(
        newest["note"]
            .as_str()
            .is_some_and(|note| note.contains("7 refusal(s) so far, 1 since")),
        "{newest}"
    );
    assert!(
        events
            .iter()
            .all(|event| event["regarding"]["uid"] == "pod-uid-trainer")
    );
    let (_, metrics) = http_get(address, "/metrics").expect("metrics");
    assert_eq!(
        metric_value(&metrics, "vgpu_container_memory_over_quota_total", labels),
        Some(1.0)
    );
    drop(region);
    plugin.stop().await;
}
