//! Kubelet's admission as kubelet v1.37 runs it (the harness of `common`), where it
//! strays from the happy path: a pod rejected after one of its Allocate calls (kubelet
//! frees its IDs without telling the plugin, and hands them to the next pod), a short
//! preferred pick that kubelet fills itself, `must_include` and `available` lists that
//! name what they should not, and one Allocate call whose second request fails; and
//! seeded random admission storms of all of these with container and plugin restarts.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;

use common::{Admitted, CORE, MEMORY, Plugin, TestKubelet, allocate, card_of, config_of, list_ids};
use tonic::Code;
use vgpu_kubelet_api::deviceplugin::{
    AllocateRequest, ContainerAllocateRequest, ContainerPreferredAllocationRequest,
    PreferredAllocationRequest,
};
use vgpu_node_agent::devices::FakeSource;

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
async fn a_containers_memory_kubelet_puts_on_another_card_than_its_cores_is_refused_at_allocate() {
    // Card 0's memory is all `x`'s; `p`'s 20 cores go to card 0 (binpack), and its
    // memory, with no room there, is filled by kubelet from card 1. Admitted, `p` could
    // only be refused at PreStartContainer, for ever: it is refused at Allocate.
    let kubelet = TestKubelet::start().await;
    let mut plugin = start_plugin(&kubelet, 2).await;
    running(&kubelet, &mut plugin, "x", &[(CORE, 10), (MEMORY, 16)]).await;
    let (admitted, status) = kubelet
        .admit(
            &mut plugin,
            "default",
            "p",
            "main",
            &[(CORE, 20), (MEMORY, 4)],
        )
        .await
        .expect_err("p's memory is on another card than its cores");
    assert_eq!(card_of(&admitted.cores[0]), "GPU-fake-0");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().starts_with(
            "default/p/main: its tencent.com/vcuda-core is on card GPU-fake-0, but kubelet gave it tencent.com/vcuda-memory IDs elsewhere (GPU-fake-1-mem-"
        ),
        "{}",
        status.message()
    );
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

/// Pod `pod` of one container `main` of (cores, memory units) is rejected (`Failed`) or
/// deleted (`Succeeded`): PodResources lists it no more.
fn gone(
    server: &vgpu_kube::standin::StandInApiServer,
    kubelet: &TestKubelet,
    pod: &str,
    (cores, memory): (usize, usize),
    phase: &str,
) {
    kubelet.remove_pod("default", pod);
    common::put_pod_in_phase(server, "default", pod, &[("main", cores, memory)], phase);
}

/// A plugin beside the stand-in API server and kubelet, whose pods have one container
/// `main` of (cores, memory units).
struct Node {
    server: vgpu_kube::standin::StandInApiServer,
    kubelet: TestKubelet,
    plugin: Plugin,
}

impl Node {
    async fn start(cards: u32) -> Node {
        let (server, kubelet, plugin) = common::plugin_with_api(cards, CARD_MEMORY).await;
        Node {
            server,
            kubelet,
            plugin,
        }
    }

    /// `pod` put in the API server, then admitted by kubelet (which lists it from the
    /// start) with `requests` in that order; a refusal rejects it, as kubelet does.
    async fn admit(
        &mut self,
        pod: &str,
        shape: (usize, usize),
        requests: &[(&str, usize)],
    ) -> Result<Admitted, tonic::Status> {
        common::put_pod(&self.server, "default", pod, &[("main", shape.0, shape.1)]);
        let admitted = self
            .kubelet
            .admit(&mut self.plugin, "default", pod, "main", requests)
            .await;
        admitted.map_err(|(_, status)| {
            self.gone(pod, shape);
            status
        })
    }

    /// [`Node::admit`] and the container's start, each expected to work.
    async fn run(
        &mut self,
        pod: &str,
        shape: (usize, usize),
        requests: &[(&str, usize)],
    ) -> Admitted {
        let admitted = self
            .admit(pod, shape, requests)
            .await
            .unwrap_or_else(|status| panic!("{pod} admitted: {status:?}"));
        self.kubelet
            .start_container(&mut self.plugin, &admitted)
            .await
            .unwrap_or_else(|status| panic!("{pod} starts: {status:?}"));
        admitted
    }

    /// Kubelet rejects `pod`, or it is deleted: PodResources lists it no more.
    fn gone(&self, pod: &str, shape: (usize, usize)) {
        gone(&self.server, &self.kubelet, pod, shape, "Failed");
    }

    /// Every record's (cores, memory units).
    fn book(&self) -> Vec<(usize, usize)> {
        let allocator = self.plugin.handle.shared().allocator();
        let records = allocator.state().allocations.values();
        records
            .map(|record| (record.core_ids.len(), record.memory_ids.len()))
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_pods_first_half_is_not_left_booked_under_the_next_whole_card() {
    // Pod `a`'s memory is allocated first, then kubelet rejects `a` (its cores fail
    // elsewhere). A whole-card pod comes next: it must get the card, and `a`'s memory
    // must not stay booked on it (the plugin took it for `a`'s open first half).
    let mut node = Node::start(1).await;
    node.admit("a", (10, 4), &[(MEMORY, 4)])
        .await
        .expect("a's memory");
    node.gone("a", (10, 4));
    node.run("whole", (100, 0), &[(CORE, 100)]).await;
    assert_eq!(node.book(), [(100, 0)], "only the whole card is booked");
    node.plugin.handle.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_whole_card_takes_the_next_pods_memory_when_kubelet_walks_it_first() {
    // Card 0 holds `x` (13 of 16 memory units), card 1 `whole` (all 100 cores). `whole`
    // is deleted: kubelet frees card 1 at once. The next pod's memory, walked first,
    // fits only card 1; the plugin kept `whole`'s record (its core IDs are not among the
    // memory IDs offered), saw card 1 as held whole, and split the memory across cards.
    let mut node = Node::start(2).await;
    let x = node.run("x", (15, 13), &[(CORE, 15), (MEMORY, 13)]).await;
    let whole = node.run("whole", (100, 0), &[(CORE, 100)]).await;
    assert_ne!(card_of(&x.cores[0]), card_of(&whole.cores[0]));
    node.gone("whole", (100, 0));
    let next = node.run("next", (60, 8), &[(MEMORY, 8), (CORE, 60)]).await;
    let config = config_of(&next);
    assert_eq!(config.devices.len(), 1, "{config:?}");
    assert_eq!(config.devices[0].uuid, Some(card_of(&whole.cores[0])));
    assert_eq!(config.devices[0].core_limit, Some(60));
    node.plugin.handle.stop().await;
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

/// A seeded generator (splitmix64): a storm is the same on every run and machine.
struct Seeded(u64);

impl Seeded {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// Go's map walk: any order.
    fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i + 1);
            items.swap(i, j);
        }
    }
}

/// One running pod of a storm: its one container as kubelet admitted it.
struct Running {
    name: String,
    cores: usize,
    memory: usize,
    admitted: Admitted,
}

const STORM_CARDS: u32 = 2;
const STORM_UNITS: usize = 16;

/// Pods' shapes: (cores, memory units); 100 and 200 are whole cards.
const SHAPES: [(usize, usize); 11] = [
    (10, 2),
    (15, 1),
    (20, 4),
    (25, 2),
    (30, 4),
    (40, 8),
    (50, 6),
    (60, 8),
    (100, 0),
    (100, 0),
    (200, 0),
];

/// Whether kubelet's free IDs (every ID minus `held`) hold the pod on one card (or,
/// for whole cards, as many cards with nothing held).
fn fits(all: &[String], held: &BTreeSet<String>, cores: usize, memory: usize) -> bool {
    let free = |card: &str, kind: &str| {
        all.iter()
            .filter(|id| id.starts_with(&format!("{card}-{kind}-")) && !held.contains(*id))
            .count()
    };
    let cards: Vec<String> = (0..STORM_CARDS).map(|i| format!("GPU-fake-{i}")).collect();
    if cores.is_multiple_of(100) {
        let whole = cards
            .iter()
            .filter(|card| free(card, "core") == 100 && free(card, "mem") == STORM_UNITS)
            .count();
        return whole >= cores / 100;
    }
    cards
        .iter()
        .any(|card| free(card, "core") >= cores && free(card, "mem") >= memory)
}

/// The config a running pod's container mounts is what kubelet gave it: one card at
/// its cores and memory, or its whole cards unthrottled; never a hidden GPU.
fn assert_mounts_what_kubelet_gave(pod: &Running, context: &str) {
    let config = config_of(&pod.admitted);
    let cards: BTreeSet<String> = pod.admitted.cores.iter().map(|id| card_of(id)).collect();
    let mounted: BTreeSet<String> = config
        .devices
        .iter()
        .filter_map(|device| device.uuid.clone())
        .collect();
    assert!(
        !config.devices.is_empty(),
        "{context}: {} runs with its GPU hidden: {config:?}",
        pod.name
    );
    assert_eq!(mounted, cards, "{context}: {}: {config:?}", pod.name);
    if pod.cores.is_multiple_of(100) {
        assert_eq!(config.devices.len(), pod.cores / 100, "{context}");
        for device in &config.devices {
            assert_eq!(
                (device.core_limit, device.memory_limit),
                (None, None),
                "{context}: {}'s whole card",
                pod.name
            );
        }
    } else {
        assert_eq!(config.devices.len(), 1, "{context}: {config:?}");
        let device = &config.devices[0];
        assert_eq!(
            device.core_limit,
            Some(pod.cores as u32),
            "{context}: {} was given {} cores",
            pod.name,
            pod.cores
        );
        assert_eq!(
            device.memory_limit.map(|limit| limit.bytes()),
            Some(pod.memory as u64 * (256 << 20)),
            "{context}: {} was given {} memory units",
            pod.name,
            pod.memory
        );
    }
}

/// One seeded storm: pods of random shapes admitted in random resource order with
/// kubelet's random fill, some rejected after their first half, deleted, their
/// containers restarted, and the plugin restarted. Every container that kubelet admits
/// starts with what kubelet gave it; with the API server (the plugin knows which
/// container kubelet admits) every pod that fits is admitted too, and at the end nothing
/// stays booked.
async fn storm(seed: u64, steps: usize, api_server: bool) {
    let mut rng = Seeded(seed);
    let server = vgpu_kube::standin::StandInApiServer::start()
        .await
        .expect("stand-in API server");
    let kubelet = TestKubelet::start().await;
    // Without the API server the plugin cannot tell which container kubelet admits:
    // it places from the calls alone, and a pod that fits may be refused (not judged).
    let mut config = match api_server {
        true => common::config_with_api(&kubelet, &server),
        false => kubelet.plugin_config(),
    };
    // Everything stays within the pairing window and the grace period, whatever the
    // machine's speed: the hardest case, and the same on every run.
    config.pairing_window_secs = 86_400;
    config.gc_grace_secs = 86_400;
    let source = Arc::new(FakeSource::uniform(STORM_CARDS, CARD_MEMORY));
    let mut plugin = Plugin::start(&kubelet, config.clone(), source.clone()).await;
    let all: Vec<String> = list_ids(&mut plugin.cores)
        .await
        .into_iter()
        .chain(list_ids(&mut plugin.memory).await)
        .collect();
    let mut running: Vec<Running> = Vec::new();
    for step in 0..steps {
        let context = format!("seed {seed} step {step}");
        match rng.below(20) {
            0..=10 => {
                let (cores, memory) = SHAPES[rng.below(SHAPES.len())];
                let name = format!("p{step}");
                let mut requests = vec![(CORE, cores)];
                if memory > 0 {
                    requests.push((MEMORY, memory));
                }
                rng.shuffle(&mut requests);
                // Some pods are rejected after their first Allocate (another admission
                // check fails): kubelet frees their IDs without a word to the plugin.
                let rejected_early = rng.below(6) == 0;
                if rejected_early {
                    requests.truncate(1);
                }
                let fitted = fits(&all, &kubelet.held_ids(), cores, memory);
                common::put_pod(&server, "default", &name, &[("main", cores, memory)]);
                eprintln!(
                    "{context}: {name} {requests:?} fits {fitted} rejected early {rejected_early}"
                );
                let fill = rng.next();
                let mut order = Seeded(fill);
                let outcome = kubelet
                    .admit_filling(&mut plugin, "default", &name, "main", &requests, |ids| {
                        order.shuffle(ids)
                    })
                    .await;
                let admitted = match outcome {
                    Ok(admitted) if !rejected_early => admitted,
                    Ok(_) => {
                        gone(&server, &kubelet, &name, (cores, memory), "Failed");
                        continue;
                    }
                    Err((_, status)) => {
                        assert!(
                            !fitted || rejected_early || !api_server,
                            "{context}: {name} ({cores} cores, {memory} units, {requests:?}) fits a card but was refused: {status:?}"
                        );
                        gone(&server, &kubelet, &name, (cores, memory), "Failed");
                        continue;
                    }
                };
                let pod = Running {
                    name: name.clone(),
                    cores,
                    memory,
                    admitted,
                };
                kubelet
                    .start_container(&mut plugin, &pod.admitted)
                    .await
                    .unwrap_or_else(|status| {
                        panic!(
                            "{context}: {name} ({cores} cores, {memory} units) admitted with {:?} + {:?} but not started: {status:?}",
                            pod.admitted.cores.iter().map(|id| card_of(id)).collect::<BTreeSet<_>>(),
                            pod.admitted.memory.iter().map(|id| card_of(id)).collect::<BTreeSet<_>>(),
                        )
                    });
                assert_mounts_what_kubelet_gave(&pod, &context);
                common::put_pod_in_phase(
                    &server,
                    "default",
                    &name,
                    &[("main", cores, memory)],
                    "Running",
                );
                running.push(pod);
            }
            11..=15 if !running.is_empty() => {
                let pod = running.remove(rng.below(running.len()));
                gone(
                    &server,
                    &kubelet,
                    &pod.name,
                    (pod.cores, pod.memory),
                    "Succeeded",
                );
            }
            16..=17 if !running.is_empty() => {
                let pod = &running[rng.below(running.len())];
                kubelet
                    .start_container(&mut plugin, &pod.admitted)
                    .await
                    .unwrap_or_else(|status| {
                        panic!("{context}: {}'s restart: {status:?}", pod.name)
                    });
                assert_mounts_what_kubelet_gave(pod, &format!("{context}, restarted"));
            }
            _ => {
                plugin.handle.stop().await;
                plugin = Plugin::start(&kubelet, config.clone(), source.clone()).await;
                for pod in &running {
                    kubelet
                        .start_container(&mut plugin, &pod.admitted)
                        .await
                        .unwrap_or_else(|status| {
                            panic!(
                                "{context}: {}'s restart after the plugin's: {status:?}",
                                pod.name
                            )
                        });
                    assert_mounts_what_kubelet_gave(pod, &format!("{context}, plugin restarted"));
                }
            }
        }
    }
    if !api_server {
        // Without it, a rejected pod's leftover cannot be told from an init container's
        // devices that the pod's next container reuses while its pairing window lasts
        // (a day here): it stays booked until then.
        plugin.handle.stop().await;
        return;
    }
    // Every pod gone, every card is free for a pod that takes them all whole.
    for pod in running.drain(..) {
        gone(
            &server,
            &kubelet,
            &pod.name,
            (pod.cores, pod.memory),
            "Succeeded",
        );
    }
    let whole = STORM_CARDS as usize * 100;
    common::put_pod(&server, "default", "last", &[("main", whole, 0)]);
    let last = kubelet
        .admit(&mut plugin, "default", "last", "main", &[(CORE, whole)])
        .await
        .unwrap_or_else(|(_, status)| panic!("seed {seed}: every card whole: {status:?}"));
    kubelet
        .start_container(&mut plugin, &last)
        .await
        .unwrap_or_else(|status| panic!("seed {seed}: every card whole starts: {status:?}"));
    let left: Vec<String> = plugin
        .handle
        .shared()
        .allocator()
        .state()
        .allocations
        .values()
        .filter(|record| {
            record
                .owner
                .as_ref()
                .is_none_or(|owner| owner.pod != "last")
        })
        .map(|record| {
            format!(
                "{} (owner {:?}, admitted for {:?}): {} cores, {} memory units",
                record.id,
                record.owner,
                record.admitted_for,
                record.core_ids.len(),
                record.memory_ids.len()
            )
        })
        .collect();
    assert!(left.is_empty(), "seed {seed}: still booked: {left:?}");
    plugin.handle.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_storms_with_restarts_start_every_admitted_container_with_what_kubelet_gave() {
    for seed in 1..=4 {
        storm(seed, 70, true).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_storms_without_the_api_server_start_every_admitted_container_with_what_kubelet_gave()
 {
    for seed in 1..=4 {
        storm(seed, 70, false).await;
    }
}
