//! Kubelet's admission as kubelet v1.37 runs it (the harness of `common`), where it
//! strays from the happy path: a pod rejected after one of its Allocate calls (kubelet
//! frees its IDs without telling the plugin, and hands them to the next pod), a short
//! preferred pick that kubelet fills itself, `must_include` and `available` lists that
//! name what they should not, and one Allocate call whose second request fails.

mod common;

use std::sync::Arc;

use common::{Admitted, CORE, MEMORY, Plugin, TestKubelet, allocate, config_of, list_ids};
use tonic::Code;
use vgpu_plugin::devices::FakeSource;
use vgpu_plugin::proto::deviceplugin::{
    AllocateRequest, ContainerAllocateRequest, ContainerPreferredAllocationRequest,
    PreferredAllocationRequest,
};

const CARD_MEMORY: u64 = 4 << 30; // 16 memory units of 256MiB

async fn start_plugin(kubelet: &TestKubelet, cards: u32) -> Plugin {
    Plugin::start(
        kubelet,
        kubelet.plugin_config(),
        Arc::new(FakeSource::uniform(cards, CARD_MEMORY)),
    )
    .await
}

/// A pod admitted and started as kubelet does it.
async fn running(
    kubelet: &TestKubelet,
    plugin: &mut Plugin,
    pod: &str,
    requests: &[(&str, usize)],
) -> Admitted {
    let admitted = kubelet
        .admit(plugin, "default", pod, "main", requests)
        .await
        .unwrap_or_else(|(_, status)| panic!("{pod} admitted: {status:?}"));
    kubelet
        .start_container(plugin, &admitted)
        .await
        .unwrap_or_else(|status| panic!("{pod} starts: {status:?}"));
    admitted
}

/// Pod `pod`'s first Allocate succeeds, then kubelet rejects the pod (a later
/// resource, or the pod's admission, fails) and frees its IDs: the plugin is not told.
async fn rejected_after(
    kubelet: &TestKubelet,
    plugin: &mut Plugin,
    pod: &str,
    requests: &[(&str, usize)],
) -> Admitted {
    let admitted = kubelet
        .admit(plugin, "default", pod, "main", requests)
        .await
        .unwrap_or_else(|(_, status)| panic!("{pod}'s first half: {status:?}"));
    kubelet.remove_pod("default", pod);
    admitted
}

fn overlaps(a: &[String], b: &[String]) -> bool {
    a.iter().any(|id| b.contains(id))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_pods_leftover_half_never_joins_the_next_pod() {
    // Cores first: pod A's 10 cores are allocated and A is rejected; B's pick falls
    // short of 15 and kubelet fills it with A's freed IDs.
    let kubelet = TestKubelet::start().await;
    let mut plugin = start_plugin(&kubelet, 1).await;
    running(&kubelet, &mut plugin, "x", &[(CORE, 85), (MEMORY, 4)]).await;
    let a = rejected_after(&kubelet, &mut plugin, "a", &[(CORE, 10)]).await;
    let b = running(&kubelet, &mut plugin, "b", &[(CORE, 15), (MEMORY, 4)]).await;
    assert!(overlaps(&a.cores, &b.cores), "kubelet handed B A's IDs");
    let config = config_of(&b);
    assert_eq!(
        config.devices.len(),
        1,
        "the config B mounts hides its GPU: {config:?}"
    );
    assert_eq!(config.devices[0].core_limit, Some(15));
    assert_eq!(
        config.devices[0].memory_limit.map(|limit| limit.bytes()),
        Some(4 << 28)
    );
    // Its restart is prepared again.
    kubelet
        .start_container(&mut plugin, &b)
        .await
        .expect("B restarts");
    assert_eq!(config_of(&b).devices[0].core_limit, Some(15));
    plugin.handle.stop().await;

    // Memory first: A's 2 memory units, then B's 4 memory units filled with them.
    let kubelet = TestKubelet::start().await;
    let mut plugin = start_plugin(&kubelet, 1).await;
    running(&kubelet, &mut plugin, "x", &[(CORE, 20), (MEMORY, 12)]).await;
    let a = rejected_after(&kubelet, &mut plugin, "a", &[(MEMORY, 2)]).await;
    let b = running(&kubelet, &mut plugin, "b", &[(MEMORY, 4), (CORE, 20)]).await;
    assert!(overlaps(&a.memory, &b.memory), "kubelet handed B A's IDs");
    let config = config_of(&b);
    assert_eq!(config.devices.len(), 1, "{config:?}");
    assert_eq!(config.devices[0].core_limit, Some(20));
    plugin.handle.stop().await;

    // A whole card within the pairing window of a rejected 10-core pod on that card:
    // its start, and every restart, must work.
    let kubelet = TestKubelet::start().await;
    let mut plugin = start_plugin(&kubelet, 1).await;
    let a = rejected_after(&kubelet, &mut plugin, "a", &[(CORE, 10)]).await;
    let b = running(&kubelet, &mut plugin, "b", &[(CORE, 100)]).await;
    assert!(overlaps(&a.cores, &b.cores));
    let config = config_of(&b);
    assert_eq!(config.devices.len(), 1, "{config:?}");
    assert_eq!(
        (config.devices[0].core_limit, config.devices[0].memory_limit),
        (None, None),
        "the whole card, unthrottled"
    );
    kubelet
        .start_container(&mut plugin, &b)
        .await
        .expect("B restarts");
    // A's leftover is gone from the book: the card's cores are B's alone.
    let records = plugin.handle.shared().allocator().state().allocations.len();
    assert_eq!(records, 1, "one allocation: B's");
    plugin.handle.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_cores_split_across_two_cards_are_refused() {
    // Kubelet fills a short pick at random: for 100 cores it may send 99 of one card
    // and 1 of the other (here both cards are otherwise free, so nothing else stands
    // in the way).
    let kubelet = TestKubelet::start().await;
    let mut plugin = start_plugin(&kubelet, 2).await;
    let all_cores = list_ids(&mut plugin.cores).await;
    let split: Vec<String> = all_cores
        .iter()
        .filter(|id| id.starts_with("GPU-fake-0-"))
        .take(99)
        .chain(
            all_cores
                .iter()
                .filter(|id| id.starts_with("GPU-fake-1-"))
                .take(1),
        )
        .cloned()
        .collect();
    let status = allocate(&mut plugin.cores, &split)
        .await
        .expect_err("99 + 1 is neither one card nor whole cards");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status
            .message()
            .contains("cores per card: GPU-fake-0: 99, GPU-fake-1: 1"),
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
            .is_empty()
    );
    // Whole cards still work, and a part of one card too.
    let whole: Vec<String> = all_cores.iter().take(100).cloned().collect();
    allocate(&mut plugin.cores, &whole)
        .await
        .expect("one whole card");
    plugin.handle.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preferred_allocation_names_only_offered_ids() {
    let kubelet = TestKubelet::start().await;
    let mut plugin = start_plugin(&kubelet, 2).await;
    let all_cores = list_ids(&mut plugin.cores).await;
    let available: Vec<String> = all_cores.iter().take(50).cloned().collect();
    let ask = |available: Vec<String>, must_include: Vec<String>, size: i32| {
        let mut client = plugin.cores.clone();
        async move {
            client
                .get_preferred_allocation(PreferredAllocationRequest {
                    container_requests: vec![ContainerPreferredAllocationRequest {
                        available_device_i_ds: available,
                        must_include_device_i_ds: must_include,
                        allocation_size: size,
                    }],
                })
                .await
                .expect("GetPreferredAllocation")
                .into_inner()
                .container_responses
                .remove(0)
                .device_i_ds
        }
    };
    // `must_include` naming IDs kubelet did not offer (and one that is nobody's).
    let pick = ask(
        available.clone(),
        vec![
            "bogus".into(),
            "GPU-fake-1-core-3".into(),
            available[7].clone(),
        ],
        10,
    )
    .await;
    assert_eq!(pick.len(), 10, "{pick:?}");
    assert!(pick.contains(&available[7]), "{pick:?}");
    assert!(pick.iter().all(|id| available.contains(id)), "{pick:?}");
    // Nothing fits: only IDs of ours that were offered, even if that is short.
    let offered = vec![
        "bogus".to_string(),
        "GPU-fake-0-core-1".to_string(),
        "GPU-nope-core-1".to_string(),
        "GPU-fake-0-mem-1".to_string(),
    ];
    let pick = ask(offered, vec![], 3).await;
    assert_eq!(pick, vec!["GPU-fake-0-core-1".to_string()]);
    plugin.handle.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allocate_call_that_fails_books_none_of_its_requests() {
    let kubelet = TestKubelet::start().await;
    let mut plugin = start_plugin(&kubelet, 1).await;
    let cores: Vec<String> = list_ids(&mut plugin.cores)
        .await
        .into_iter()
        .take(10)
        .collect();
    let status = plugin
        .cores
        .allocate(AllocateRequest {
            container_requests: vec![
                ContainerAllocateRequest {
                    devices_ids: cores.clone(),
                },
                ContainerAllocateRequest {
                    devices_ids: vec!["bogus".into()],
                },
            ],
        })
        .await
        .expect_err("the second request is invalid");
    assert_eq!(status.code(), Code::InvalidArgument);
    let shared = plugin.handle.shared().clone();
    assert!(
        shared.allocator().state().allocations.is_empty(),
        "the valid part stays booked: {:?}",
        shared.allocator().state().allocations.keys()
    );
    let folders = std::fs::read_dir(kubelet.root.path().join("vgpu/allocations"))
        .expect("allocations folder")
        .count();
    assert_eq!(folders, 0, "its folder is removed too");
    plugin.handle.stop().await;
}

#[test]
fn a_plugin_dropped_without_stop_lets_its_runtime_end() {
    // A test that fails mid-way drops the plugin without stopping it; its runtime's
    // drop must still end (it waits for the coordinator's blocking thread), or the
    // failure hangs the test run.
    let (ended, ends) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let kubelet = TestKubelet::start().await;
            let plugin = start_plugin(&kubelet, 1).await;
            drop(plugin);
        });
        drop(runtime);
        let _ = ended.send(());
    });
    ends.recv_timeout(std::time::Duration::from_secs(60))
        .expect("the runtime ended within 60 s of the plugin's drop");
}
