//! What the real kubelet of tests/k8s (v1.37.2) did that the stand-in had not, each
//! replayed on the stand-in kubelet (`common`) and the stand-in API server:
//! * it walks a container's limits (a Go map) in random order, so its memory may be
//!   placed before its cores: both must land on one card, whichever comes first;
//! * it hands a deleted pod's IDs out again at once, long before the plugin's garbage
//!   collection: the next pod's pick must find them free;
//! * a container asking for memory alone was admitted, then refused at
//!   PreStartContainer forever: it is refused at Allocate, saying why;
//! * an Allocate refusal is copied into the pod's status: it names a few IDs, not 562;
//! * a pod refused at its second Allocate left its first half booked in the plugin for
//!   the pairing window while kubelet freed it: the card looked full.
//!
//! tests/k8s/test.sh runs the same steps on the real cluster.

mod common;

use common::{CORE, MEMORY, Plugin, TestKubelet, card_of, config_of, list_ids, put_pod};
use tonic::Code;

/// 4 GiB cards: 16 memory units of 256 MiB.
const CARD_MEMORY: u64 = 4 << 30;
const CARD_UNITS: usize = 16;

/// Admits and starts `namespace/pod`'s one container as kubelet does, its pod in the
/// API server first.
async fn run(
    server: &vgpu_kube::standin::StandInApiServer,
    kubelet: &TestKubelet,
    plugin: &mut Plugin,
    pod: &str,
    requests: &[(&str, usize)],
) -> Result<common::Admitted, tonic::Status> {
    let count = |resource: &str| {
        requests
            .iter()
            .find(|(name, _)| *name == resource)
            .map_or(0, |(_, count)| *count)
    };
    let containers = [("main", count(CORE), count(MEMORY))];
    put_pod(server, "default", pod, &containers);
    let admitted = match kubelet
        .admit(plugin, "default", pod, "main", requests)
        .await
    {
        Ok(admitted) => admitted,
        Err((_, status)) => {
            // Kubelet rejects the pod: it fails it and no longer lists it.
            kubelet.remove_pod("default", pod);
            common::put_pod_in_phase(server, "default", pod, &containers, "Failed");
            return Err(status);
        }
    };
    kubelet.start_container(plugin, &admitted).await?;
    Ok(admitted)
}

fn one_card(admitted: &common::Admitted) -> String {
    let cards: std::collections::BTreeSet<String> = admitted
        .cores
        .iter()
        .chain(&admitted.memory)
        .map(|id| card_of(id))
        .collect();
    assert_eq!(cards.len(), 1, "cores and memory on {cards:?}");
    cards.into_iter().next().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_containers_cores_and_memory_land_on_one_card_whichever_kubelet_walks_first() {
    for memory_first in [true, false] {
        let (server, kubelet, mut plugin) = common::plugin_with_api(2, CARD_MEMORY).await;
        // Card 0: 90 cores and 2 units taken. Binpack alone would put the next pod's
        // memory there (the fuller card), where its 20 cores do not fit.
        let first = run(
            &server,
            &kubelet,
            &mut plugin,
            "full",
            &[(CORE, 90), (MEMORY, 2)],
        )
        .await
        .expect("the first pod runs");
        let full = one_card(&first);
        let order: &[(&str, usize)] = if memory_first {
            &[(MEMORY, 4), (CORE, 20)]
        } else {
            &[(CORE, 20), (MEMORY, 4)]
        };
        let next = run(&server, &kubelet, &mut plugin, "next", order)
            .await
            .unwrap_or_else(|status| panic!("memory first: {memory_first}: {status:?}"));
        assert_ne!(one_card(&next), full, "20 cores beside 90");
        assert_eq!(config_of(&next).devices[0].core_limit, Some(20));
        plugin.handle.stop().await;
    }
    // Cores first, each container with a whole card's memory: the cores go where the
    // memory fits, not to the fuller card.
    let (server, kubelet, mut plugin) = common::plugin_with_api(2, CARD_MEMORY).await;
    let a = run(
        &server,
        &kubelet,
        &mut plugin,
        "a",
        &[(CORE, 10), (MEMORY, CARD_UNITS)],
    )
    .await
    .expect("a runs");
    let b = run(
        &server,
        &kubelet,
        &mut plugin,
        "b",
        &[(CORE, 10), (MEMORY, CARD_UNITS)],
    )
    .await
    .expect("b runs beside a card's memory");
    assert_ne!(one_card(&a), one_card(&b));
    plugin.handle.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_pods_share_is_free_for_the_next_pod_at_once_and_a_live_ones_never() {
    let (server, kubelet, mut plugin) = common::plugin_with_api(2, CARD_MEMORY).await;
    // Two whole cards: every core is held.
    run(&server, &kubelet, &mut plugin, "w0", &[(CORE, 100)])
        .await
        .expect("w0");
    run(&server, &kubelet, &mut plugin, "w1", &[(CORE, 100)])
        .await
        .expect("w1");
    // w0 is deleted: kubelet forgets it and offers its IDs at once; w1 lives.
    kubelet.remove_pod("default", "w0");
    let held = kubelet.held_ids();
    let offered: Vec<String> = list_ids(&mut plugin.cores)
        .await
        .into_iter()
        .filter(|id| !held.contains(id))
        .collect();
    let pick = common::preferred(&mut plugin.cores, &offered, 10).await;
    assert_eq!(pick.len(), 10, "the pick is short: {pick:?}");
    assert!(
        pick.iter().all(|id| card_of(id) == card_of(&offered[0])),
        "{pick:?}"
    );
    // A hostile or confused call that offers w1's IDs frees nothing of w1's: PodResources
    // lists it.
    let everything = list_ids(&mut plugin.cores).await;
    common::preferred(&mut plugin.cores, &everything, 10).await;
    let allocations = plugin
        .handle
        .shared()
        .allocator()
        .state()
        .allocations
        .clone();
    assert_eq!(
        allocations.len(),
        1,
        "w0 released, w1 kept: {allocations:?}"
    );
    let next = run(
        &server,
        &kubelet,
        &mut plugin,
        "next",
        &[(CORE, 10), (MEMORY, 2)],
    )
    .await
    .expect("next runs on w0's card");
    assert_eq!(config_of(&next).devices[0].core_limit, Some(10));
    // After a restart of the plugin, w1 and next are still booked.
    plugin.handle.stop().await;
    let mut config = kubelet.plugin_config();
    config.api_server_url = Some(server.url());
    config.node_name = Some(common::NODE.into());
    let plugin = Plugin::start(
        &kubelet,
        config,
        std::sync::Arc::new(vgpu_node_agent::devices::FakeSource::uniform(
            2,
            CARD_MEMORY,
        )),
    )
    .await;
    assert_eq!(
        plugin.handle.shared().allocator().state().allocations.len(),
        2,
        "w1 and next"
    );
    plugin.handle.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_alone_or_part_of_a_card_alone_is_refused_at_allocate_saying_why() {
    let (server, kubelet, mut plugin) = common::plugin_with_api(1, CARD_MEMORY).await;
    let status = run(
        &server,
        &kubelet,
        &mut plugin,
        "memory-only",
        &[(MEMORY, 4)],
    )
    .await
    .expect_err("memory alone is refused");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("memory alone is not supported")
            && status.message().contains("default/memory-only/main"),
        "{}",
        status.message()
    );
    let status = run(&server, &kubelet, &mut plugin, "cores-only", &[(CORE, 20)])
        .await
        .expect_err("part of a card without memory is refused");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("needs its memory too"),
        "{}",
        status.message()
    );
    assert!(
        plugin
            .handle
            .shared()
            .allocator()
            .state()
            .allocations
            .is_empty(),
        "nothing booked"
    );
    // A whole card needs no memory limit.
    run(&server, &kubelet, &mut plugin, "whole", &[(CORE, 100)])
        .await
        .expect("a whole card runs");
    plugin.handle.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_of_hundreds_of_ids_stays_short() {
    let (_server, kubelet, mut plugin) = common::plugin_with_api(2, CARD_MEMORY).await;
    // More memory than one card has: kubelet picks across both cards.
    let memory = list_ids(&mut plugin.memory).await;
    let status = common::allocate(&mut plugin.memory, &memory)
        .await
        .expect_err("two cards' memory for one container");
    let message = status.message();
    assert!(message.contains("exceed the largest card"), "{message}");
    assert!(message.contains("29 more"), "{message}");
    assert!(
        message.len() < 400,
        "{} characters: {message}",
        message.len()
    );
    drop(kubelet);
    plugin.handle.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_pods_first_half_does_not_crowd_its_card_within_the_pairing_window() {
    // tests/k8s: a pod refused at its memory's Allocate left its cores booked in the
    // plugin (not prepared, within the pairing window) while kubelet freed them, so the
    // card looked fuller than it was and binpack split two pods that fit on one card.
    let (server, kubelet, mut plugin) = common::plugin_with_api(2, CARD_MEMORY).await;
    let status = run(
        &server,
        &kubelet,
        &mut plugin,
        "too-wide",
        &[(CORE, 20), (MEMORY, CARD_UNITS + 1)],
    )
    .await
    .expect_err("more memory than a card has");
    assert!(status.message().contains("exceed"), "{}", status.message());
    let q30 = run(
        &server,
        &kubelet,
        &mut plugin,
        "q30",
        &[(CORE, 30), (MEMORY, 4)],
    )
    .await
    .expect("q30 runs");
    let p60 = run(
        &server,
        &kubelet,
        &mut plugin,
        "p60",
        &[(CORE, 60), (MEMORY, 4)],
    )
    .await
    .expect("p60 runs");
    assert_eq!(one_card(&q30), one_card(&p60), "30 + 60 cores fit one card");
    plugin.handle.stop().await;
}
