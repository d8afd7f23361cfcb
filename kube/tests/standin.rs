//! The API side against the stand-in API server (kube-rs over plain HTTP on loopback;
//! no real kube-apiserver can run here): slices created, left alone when unchanged,
//! republished with a bumped generation when a card turns unhealthy, restored after
//! someone deletes them; claims read; the pod annotation read with its fallback.

use std::time::Duration;

use serde_json::json;
use vgpu_kube::claims::{ClaimError, read_claim};
use vgpu_kube::pods::{CeilingLookup, PodReader};
use vgpu_kube::slices::{GpuDevice, Published, SlicePublisher, UnhealthyPolicy};
use vgpu_kube::standin::StandInApiServer;
use vgpu_kube::{ClientSource, connect};

const DRIVER: &str = "gpu.example.io";

fn cards(count: u32) -> Vec<GpuDevice> {
    (0..count)
        .map(|index| GpuDevice {
            uuid: format!("GPU-{index:08}"),
            index,
            minor: Some(index),
            product_name: Some("Test GPU".into()),
            memory_bytes: 16 << 30,
            compute_capability: Some((9, 0)),
            numa_node: None,
            driver_version: Some("580.159.04".into()),
            unhealthy: None,
        })
        .collect()
}

async fn client(server: &StandInApiServer) -> kube::Client {
    connect(&ClientSource::Url(server.url()))
        .await
        .expect("client")
}

#[tokio::test]
async fn slices_are_published_once_and_bumped_on_change() {
    let server = StandInApiServer::start().await.expect("stand-in");
    let publisher = SlicePublisher::new(
        client(&server).await,
        DRIVER,
        "node-a",
        UnhealthyPolicy::Taint,
    );
    let mut cards = cards(4);
    assert_eq!(
        publisher.publish(&cards).await.expect("publish"),
        Published::Written { generation: 1 }
    );
    assert_eq!(
        publisher.publish(&cards).await.expect("again"),
        Published::Unchanged { generation: 1 }
    );
    let slices = server.slices();
    assert_eq!(slices.len(), 1);
    assert_eq!(slices[0]["metadata"]["name"], "node-a-gpu.example.io-0");
    assert_eq!(
        slices[0]["spec"]["devices"].as_array().map(Vec::len),
        Some(4)
    );
    let writes = |server: &StandInApiServer| {
        server
            .requests()
            .iter()
            .filter(|r| !r.starts_with("GET"))
            .count()
    };
    assert_eq!(writes(&server), 1, "{:?}", server.requests());
    assert!(
        server.requests()[0]
            .contains("fieldSelector=spec.nodeName=node-a,spec.driver=gpu.example.io"),
        "{:?}",
        server.requests()
    );

    cards[2].unhealthy = Some("fell off the bus".into());
    assert_eq!(
        publisher.publish(&cards).await.expect("tainted"),
        Published::Written { generation: 2 }
    );
    let device = server.slices()[0]["spec"]["devices"][2].clone();
    assert_eq!(device["taints"][0]["key"], "gpu.example.io/unhealthy");
    assert_eq!(device["taints"][0]["effect"], "NoSchedule");
    // The server stamped timeAdded; that alone is no reason to write again.
    assert!(device["taints"][0]["timeAdded"].is_string());
    assert_eq!(
        publisher.publish(&cards).await.expect("stable"),
        Published::Unchanged { generation: 2 }
    );

    // A restarted publisher keeps counting from what the API holds.
    let again = SlicePublisher::new(
        client(&server).await,
        DRIVER,
        "node-a",
        UnhealthyPolicy::Remove,
    );
    assert_eq!(
        again.publish(&cards).await.expect("removed"),
        Published::Written { generation: 3 }
    );
    assert_eq!(
        server.slices()[0]["spec"]["devices"]
            .as_array()
            .map(Vec::len),
        Some(3)
    );
    assert_eq!(again.withdraw().await.expect("withdraw"), 1);
    assert!(server.slices().is_empty());
}

/// Waits until the stand-in's slices pass `check`. The bound is generous (a loaded
/// 2-core CI machine): a passing test returns as soon as the check holds.
async fn wait_for(server: &StandInApiServer, check: impl Fn(&[serde_json::Value]) -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while tokio::time::Instant::now() < deadline {
        if check(&server.slices()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("slices never got there: {:?}", server.slices());
}

#[tokio::test]
async fn a_deleted_slice_comes_back_through_the_watch() {
    let server = StandInApiServer::start().await.expect("stand-in");
    let publisher = std::sync::Arc::new(SlicePublisher::new(
        client(&server).await,
        DRIVER,
        "node-b",
        UnhealthyPolicy::Taint,
    ));
    let (cards_tx, cards_rx) = tokio::sync::watch::channel(cards(2));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let running = {
        let publisher = publisher.clone();
        tokio::spawn(async move {
            publisher
                .run(cards_rx, Duration::from_secs(3600), stop_rx)
                .await
        })
    };
    wait_for(&server, |s| s.len() == 1).await;
    assert!(server.delete_slice("node-b-gpu.example.io-0"));
    wait_for(&server, |s| {
        s.len() == 1 && s[0]["spec"]["pool"]["generation"] == 2
    })
    .await;
    let mut changed = cards(2);
    changed.push(cards(3).remove(2));
    cards_tx.send(changed).expect("send");
    wait_for(&server, |s| {
        s.len() == 1 && s[0]["spec"]["devices"].as_array().map(Vec::len) == Some(3)
    })
    .await;
    stop_tx.send(true).expect("stop");
    tokio::time::timeout(Duration::from_secs(60), running)
        .await
        .expect("run stops")
        .expect("join");
    assert!(
        server.requests().iter().any(|r| r.contains("watch=true")),
        "{:?}",
        server.requests()
    );
}

#[tokio::test]
async fn claims_and_pods_are_read_with_a_fallback() {
    let server = StandInApiServer::start().await.expect("stand-in");
    server.put_claim(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "gpu-claim", "namespace": "team", "uid": "claim-1"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "vgpu"}}]}},
        "status": {
            "allocation": {"devices": {"results": [{
                "request": "gpu", "driver": DRIVER, "pool": "node-a", "device": "gpu-3",
                "shareID": "0f3c", "consumedCapacity": {"cores": "30", "memory": "2560Mi"}
            }]}},
            "reservedFor": [{"resource": "pods", "name": "trainer", "uid": "pod-1"}]
        }
    }));
    server.put_pod(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "trainer", "namespace": "team", "uid": "pod-1",
                     "annotations": {"tencent.com/vcuda-core-limit": "50"}},
        "spec": {"nodeName": "node-a", "containers": [{"name": "c"}]}
    }));
    let client = client(&server).await;
    let claim = read_claim(client.clone(), DRIVER, "team", "gpu-claim", "claim-1")
        .await
        .expect("claim");
    assert_eq!(claim.shares[0].device, "gpu-3");
    assert_eq!(claim.shares[0].cores, Some(30));
    assert_eq!(claim.shares[0].memory, Some(2560 << 20));
    assert_eq!(claim.pods[0].name, "trainer");
    assert!(matches!(
        read_claim(client.clone(), DRIVER, "team", "missing", "x").await,
        Err(ClaimError::NotFound { .. })
    ));

    let reader = PodReader::new(client.clone(), Some("node-a"));
    assert_eq!(
        reader.core_ceiling("team", "trainer", Some("pod-1")).await,
        CeilingLookup::Set(50)
    );
    assert_eq!(reader.list_on_node().await.expect("list").len(), 1);
    assert!(
        server.requests().iter().any(|r| r
            == "GET /api/v1/pods?&fieldSelector=spec.nodeName=node-a"
            || r.ends_with("/api/v1/pods?fieldSelector=spec.nodeName=node-a")),
        "{:?}",
        server.requests()
    );
    let elsewhere = PodReader::new(client.clone(), Some("node-z"));
    let lookup = elsewhere.core_ceiling("team", "trainer", None).await;
    assert!(
        matches!(lookup, CeilingLookup::Unreachable(ref why) if why.contains("node-a")),
        "{lookup:?}"
    );

    server.set_down(true);
    let lookup = reader
        .clone()
        .with_timeout(Duration::from_secs(2))
        .core_ceiling("team", "trainer", None)
        .await;
    assert!(
        matches!(lookup, CeilingLookup::Unreachable(_)),
        "{lookup:?}"
    );
    assert_eq!(lookup.or_default(Some(70)), Some(70));
    assert!(matches!(
        read_claim(client, DRIVER, "team", "gpu-claim", "claim-1").await,
        Err(ClaimError::Unreachable { .. })
    ));
}
