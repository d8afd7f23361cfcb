//! The plugin against a stand-in kubelet (real gRPC servers on unix sockets): both
//! registrations, ListAndWatch, preferred allocation, Allocate and PreStartContainer
//! for partial and whole cards, refusals, re-registration after a kubelet restart, and
//! a plugin restart that keeps its allocations.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{
    CORE, MEMORY, TestKubelet, allocate, card_of, device_list, host_path_of, plugin_client,
    preferred, prestart, scrape,
};
use tonic::Code;
use vgpu_contract::{ByteSize, Config, CoreMode};
use vgpu_kubelet_api::deviceplugin::{ContainerAllocateResponse, Empty};
use vgpu_node_agent::config::NodeConfig;
use vgpu_node_agent::devices::FakeSource;

const CARD_MEMORY: u64 = 4 << 30; // 16 memory units of 256MiB

type Client = vgpu_kubelet_api::deviceplugin::device_plugin_client::DevicePluginClient<
    tonic::transport::Channel,
>;

async fn started(
    kubelet: &TestKubelet,
    source: Arc<FakeSource>,
) -> (vgpu_plugin::PluginHandle, Client, Client) {
    let plugin = vgpu_plugin::start(kubelet.plugin_config(), source)
        .await
        .expect("plugin starts");
    kubelet.wait_registrations(2).await;
    let cores = plugin_client(&plugin.sockets()[0]).await;
    let memory = plugin_client(&plugin.sockets()[1]).await;
    (plugin, cores, memory)
}

fn ids(devices: &[vgpu_kubelet_api::deviceplugin::Device]) -> Vec<String> {
    devices.iter().map(|device| device.id.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_both_resources_and_lists_devices() {
    let kubelet = TestKubelet::start().await;
    let (plugin, mut cores, mut memory) =
        started(&kubelet, Arc::new(FakeSource::uniform(2, CARD_MEMORY))).await;
    let registrations = kubelet.registrations();
    let mut names: Vec<_> = registrations
        .iter()
        .map(|r| r.resource_name.clone())
        .collect();
    names.sort();
    assert_eq!(names, vec![CORE.to_string(), MEMORY.to_string()]);
    for registration in &registrations {
        assert!(
            kubelet
                .device_plugin_dir()
                .join(&registration.endpoint)
                .exists(),
            "served before Register"
        );
        let options = registration.options.expect("options");
        assert!(options.pre_start_required && options.get_preferred_allocation_available);
    }
    let core_devices = device_list(&mut cores).await;
    let memory_devices = device_list(&mut memory).await;
    assert_eq!(core_devices.len(), 200, "100 per card");
    assert_eq!(memory_devices.len(), 32, "4GiB / 256MiB per card");
    assert!(core_devices.iter().all(|device| device.health == "Healthy"));
    assert!(ids(&core_devices).contains(&"GPU-fake-1-core-99".to_string()));
    assert!(ids(&memory_devices).contains(&"GPU-fake-0-mem-15".to_string()));
    let options = cores
        .get_device_plugin_options(Empty {})
        .await
        .expect("options")
        .into_inner();
    assert!(options.pre_start_required);
    plugin.stop().await;
    assert!(
        !kubelet
            .device_plugin_dir()
            .join("vgpu-vcuda-core.sock")
            .exists(),
        "sockets removed on stop"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fractional_request_lands_on_one_card_with_its_quota() {
    let kubelet = TestKubelet::start().await;
    let (plugin, mut cores, mut memory) =
        started(&kubelet, Arc::new(FakeSource::uniform(2, CARD_MEMORY))).await;
    let all_cores = ids(&device_list(&mut cores).await);
    let all_memory = ids(&device_list(&mut memory).await);

    // A first tenant on card 1 so that binpack has something to pack onto.
    let first_cores = preferred(&mut cores, &all_cores, 20).await;
    let card = card_of(&first_cores[0]);
    assert!(
        first_cores.iter().all(|id| card_of(id) == card),
        "{first_cores:?}"
    );
    allocate(&mut cores, &first_cores)
        .await
        .expect("first cores");
    let first_memory = preferred(&mut memory, &all_memory, 4).await;
    assert!(
        first_memory.iter().all(|id| card_of(id) == card),
        "memory follows the cores' card"
    );
    allocate(&mut memory, &first_memory)
        .await
        .expect("first memory");
    kubelet.add_container("default", "first", "main", &first_cores, &first_memory);

    // The container under test: memory first this time (kubelet uses either order).
    let free_memory: Vec<String> = all_memory
        .iter()
        .filter(|id| !first_memory.contains(id))
        .cloned()
        .collect();
    let free_cores: Vec<String> = all_cores
        .iter()
        .filter(|id| !first_cores.contains(id))
        .cloned()
        .collect();
    let memory_ids = preferred(&mut memory, &free_memory, 10).await;
    assert_eq!(memory_ids.len(), 10);
    assert!(
        memory_ids.iter().all(|id| card_of(id) == card),
        "binpack keeps filling card {card}: {memory_ids:?}"
    );
    let memory_response = allocate(&mut memory, &memory_ids)
        .await
        .expect("memory allocate");
    let core_ids = preferred(&mut cores, &free_cores, 30).await;
    assert_eq!(core_ids.len(), 30);
    assert!(
        core_ids.iter().all(|id| card_of(id) == card),
        "cores pair with the memory's card: {core_ids:?}"
    );
    let core_response = allocate(&mut cores, &core_ids)
        .await
        .expect("core allocate");

    // Each response carries the mounts of its own folder (kubelet keeps one mount per
    // container path); PreStart makes the two folders hold the same files.
    assert!(!memory_response.mounts.is_empty() && !core_response.mounts.is_empty());
    let allocation = memory_response.annotations["tencent.com/vcuda-allocation"].clone();
    assert_ne!(
        core_response.annotations["tencent.com/vcuda-allocation"], allocation,
        "every call has its own folder until PreStart folds them"
    );
    assert_eq!(memory_response.envs["VGPU_CONFIG"], "/etc/vgpu/vgpu.yaml");
    assert_eq!(memory_response.envs["NVIDIA_VISIBLE_DEVICES"], "void");
    assert!(
        !memory_response.envs.contains_key("LD_LIBRARY_PATH"),
        "the image keeps its own LD_LIBRARY_PATH"
    );
    for dir in [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib64",
        "/usr/local/nvidia/lib64",
    ] {
        assert!(
            host_path_of(&memory_response, &format!("{dir}/libcuda.so.1"))
                .ends_with("shim/libcuda_shim.so")
        );
        assert!(
            host_path_of(&memory_response, &format!("{dir}/libnvidia-ml.so.1"))
                .ends_with("shim/libnvml_shim.so")
        );
    }
    let config_mount = memory_response
        .mounts
        .iter()
        .find(|m| m.container_path == "/etc/vgpu/vgpu.yaml")
        .expect("config");
    assert!(config_mount.read_only);
    let region_mount = memory_response
        .mounts
        .iter()
        .find(|m| m.container_path == "/etc/vgpu/usage.region")
        .expect("region");
    assert!(!region_mount.read_only);
    assert!(
        memory_response
            .mounts
            .iter()
            .any(|m| m.container_path == "/usr/local/vgpu/driver" && m.read_only)
    );

    kubelet.add_container("default", "tenant", "cuda", &core_ids, &memory_ids);
    prestart(&mut cores, &core_ids)
        .await
        .expect("PreStart cores");
    prestart(&mut memory, &memory_ids)
        .await
        .expect("PreStart memory (idempotent)");
    let config = Config::load(std::path::Path::new(&config_mount.host_path)).expect("final config");
    assert_eq!(
        config.container_id.as_deref(),
        Some(allocation.as_str()),
        "the container's identity is its allocation (the memory call came first)"
    );
    use std::os::unix::fs::MetadataExt;
    for file in ["/etc/vgpu/vgpu.yaml", "/etc/vgpu/usage.region"] {
        let inode = |response: &ContainerAllocateResponse| {
            std::fs::metadata(host_path_of(response, file))
                .expect("folder file")
                .ino()
        };
        assert_eq!(
            inode(&memory_response),
            inode(&core_response),
            "{file}: whichever response's mount kubelet keeps, the same file"
        );
    }
    assert_eq!(
        config.driver_dir.as_deref(),
        Some(std::path::Path::new("/usr/local/vgpu/driver/lib64"))
    );
    assert_eq!(
        config.usage_region.as_deref(),
        Some(std::path::Path::new("/etc/vgpu/usage.region"))
    );
    assert_eq!(config.devices.len(), 1);
    let device = &config.devices[0];
    assert_eq!(device.uuid.as_deref(), Some(card.as_str()));
    assert_eq!(device.core_limit, Some(30));
    assert_eq!(device.memory_limit, Some(ByteSize::mib(2560)));
    assert_eq!(device.core_mode, CoreMode::Hard);
    let region =
        vgpu_contract::region::Region::open_existing(std::path::Path::new(&region_mount.host_path))
            .expect("region");
    assert_eq!(region.devices()[0].memory_limit, 2560 << 20);
    assert_eq!(region.devices()[0].core_limit, 30);
    let link = kubelet
        .root
        .path()
        .join("vgpu/containers/default_tenant/cuda");
    assert_eq!(
        std::fs::read_link(&link).expect("container link"),
        std::path::Path::new(&config_mount.host_path)
            .parent()
            .expect("dir")
    );

    // Metrics see the container's limits.
    let metrics = scrape(plugin.metrics_address().expect("metrics")).await;
    assert!(
        metrics.contains("vgpu_container_memory_limit_bytes{"),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!(
            "pod=\"tenant\",container=\"cuda\",UUID=\"{card}\"}} 2684354560"
        )),
        "{metrics}"
    );
    assert!(metrics.contains("vgpu_card_allocated_cores{"), "{metrics}");
    plugin.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_card_request_gets_the_whole_card_unthrottled() {
    let kubelet = TestKubelet::start().await;
    let (plugin, mut cores, _memory) =
        started(&kubelet, Arc::new(FakeSource::uniform(2, CARD_MEMORY))).await;
    let all_cores = ids(&device_list(&mut cores).await);
    let chosen = preferred(&mut cores, &all_cores, 100).await;
    assert_eq!(chosen.len(), 100);
    let card = card_of(&chosen[0]);
    assert!(chosen.iter().all(|id| card_of(id) == card));
    let response = allocate(&mut cores, &chosen).await.expect("whole card");
    kubelet.add_container("ml", "trainer", "main", &chosen, &[]);
    prestart(&mut cores, &chosen).await.expect("PreStart");
    let config = Config::load(std::path::Path::new(host_path_of(
        &response,
        "/etc/vgpu/vgpu.yaml",
    )))
    .expect("config");
    assert_eq!(config.devices.len(), 1);
    assert_eq!(config.devices[0].uuid.as_deref(), Some(card.as_str()));
    assert_eq!(
        config.devices[0].core_limit, None,
        "whole cards are not throttled"
    );
    assert_eq!(
        config.devices[0].memory_limit, None,
        "whole cards get all their memory"
    );
    // A partial request cannot be packed onto the card held whole: its memory is refused.
    let memory_on_card = vec![format!("{card}-mem-0")];
    let mut memory = plugin_client(&plugin.sockets()[1]).await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    let refused = allocate(&mut memory, &memory_on_card).await;
    // Joining is only for the same container's pending allocation; this one is owned.
    assert_eq!(
        refused.expect_err("card is held whole").code(),
        Code::FailedPrecondition
    );
    plugin.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_refused_with_clear_statuses() {
    let kubelet = TestKubelet::start().await;
    let source = Arc::new(FakeSource::uniform(2, CARD_MEMORY));
    let (plugin, mut cores, mut memory) = started(&kubelet, source.clone()).await;

    let unknown = allocate(
        &mut cores,
        &[
            "GPU-nope-core-1".to_string(),
            "GPU-fake-0-core-100".to_string(),
        ],
    )
    .await
    .expect_err("unknown");
    assert_eq!(unknown.code(), Code::InvalidArgument);
    assert!(
        unknown.message().contains("GPU-nope-core-1")
            && unknown.message().contains("GPU-fake-0-core-100"),
        "{}",
        unknown.message()
    );

    let wrong_kind = allocate(&mut cores, &["GPU-fake-0-mem-1".to_string()])
        .await
        .expect_err("memory ID on the core socket");
    assert_eq!(wrong_kind.code(), Code::InvalidArgument);

    let too_much: Vec<String> = (0..16)
        .map(|k| format!("GPU-fake-0-mem-{k}"))
        .chain((0..4).map(|k| format!("GPU-fake-1-mem-{k}")))
        .collect();
    let refused = allocate(&mut memory, &too_much)
        .await
        .expect_err("more memory than a card");
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(
        refused.message().contains("exceed") && refused.message().contains("5GiB"),
        "{}",
        refused.message()
    );

    let spanning: Vec<String> = (0..10)
        .map(|k| format!("GPU-fake-0-core-{k}"))
        .chain((0..10).map(|k| format!("GPU-fake-1-core-{k}")))
        .collect();
    let refused = allocate(&mut cores, &spanning)
        .await
        .expect_err("partial cores on two cards");
    assert_eq!(refused.code(), Code::InvalidArgument);

    let mut stream = cores
        .list_and_watch(Empty {})
        .await
        .expect("ListAndWatch")
        .into_inner();
    let first = stream.message().await.expect("stream").expect("list");
    assert!(
        first
            .devices
            .iter()
            .all(|device| device.health == "Healthy")
    );
    source.fail("GPU-fake-1", "fell off the bus");
    let update = tokio::time::timeout(Duration::from_secs(5), stream.message())
        .await
        .expect("an update within 5s")
        .expect("stream")
        .expect("list");
    let unhealthy: Vec<_> = update
        .devices
        .iter()
        .filter(|device| device.health == "Unhealthy")
        .map(|device| device.id.clone())
        .collect();
    assert_eq!(unhealthy.len(), 100, "every core of the failed card");
    assert!(unhealthy.iter().all(|id| id.starts_with("GPU-fake-1-")));
    let refused = allocate(&mut cores, &["GPU-fake-1-core-3".to_string()])
        .await
        .expect_err("unhealthy");
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert!(
        refused.message().contains("GPU-fake-1-core-3")
            && refused.message().contains("fell off the bus"),
        "{}",
        refused.message()
    );
    plugin.stop().await;
}

/// A tick no test waits for: what these tests see happens without it.
const TEN_MINUTES_MS: u64 = 600_000;

/// A plugin whose tick never comes while the test runs.
async fn started_without_a_tick(kubelet: &TestKubelet) -> vgpu_plugin::PluginHandle {
    let config = NodeConfig {
        kubelet_watch_interval_ms: TEN_MINUTES_MS,
        ..kubelet.plugin_config()
    };
    vgpu_plugin::start(config, Arc::new(FakeSource::uniform(1, CARD_MEMORY)))
        .await
        .expect("plugin starts")
}

/// Kubelet rejects a pod that asks for our resources before we registered with the
/// restarted kubelet; the plugin must not wait for its next tick to do so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn re_registers_the_moment_kubelet_restarts_not_at_the_next_tick() {
    let mut kubelet = TestKubelet::start().await;
    let plugin = started_without_a_tick(&kubelet).await;
    kubelet.wait_registrations(2).await;
    kubelet.restart().await;
    let seen = kubelet.wait_registrations(4).await;
    let mut again: Vec<_> = seen[2..].iter().map(|r| r.resource_name.clone()).collect();
    again.sort();
    assert_eq!(again, vec![CORE.to_string(), MEMORY.to_string()]);
    for socket in plugin.sockets() {
        assert!(socket.exists(), "{} re-created", socket.display());
    }
    let mut cores = plugin_client(&plugin.sockets()[0]).await;
    assert_eq!(
        device_list(&mut cores).await.len(),
        100,
        "the new socket serves"
    );
    plugin.stop().await;
}

/// A kubelet that refuses a registration (still starting) is asked again soon, backing
/// off, not a tick later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_registration_is_tried_again_soon() {
    let kubelet = TestKubelet::start().await;
    kubelet.refuse_registrations(3);
    let plugin = started_without_a_tick(&kubelet).await;
    let mut seen: Vec<_> = kubelet
        .wait_registrations(2)
        .await
        .iter()
        .map(|r| r.resource_name.clone())
        .collect();
    seen.sort();
    assert_eq!(seen, vec![CORE.to_string(), MEMORY.to_string()]);
    plugin.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_keeps_allocations_and_never_double_books() {
    let kubelet = TestKubelet::start().await;
    let source = Arc::new(FakeSource::uniform(2, CARD_MEMORY));
    let (plugin, mut cores, mut memory) = started(&kubelet, source.clone()).await;
    let all_cores = ids(&device_list(&mut cores).await);
    let all_memory = ids(&device_list(&mut memory).await);
    let core_ids = preferred(&mut cores, &all_cores, 50).await;
    allocate(&mut cores, &core_ids).await.expect("cores");
    let memory_ids = preferred(&mut memory, &all_memory, 8).await;
    allocate(&mut memory, &memory_ids).await.expect("memory");
    kubelet.add_container("default", "keeper", "main", &core_ids, &memory_ids);
    prestart(&mut cores, &core_ids).await.expect("PreStart");
    plugin.stop().await;

    let state = std::fs::read_to_string(kubelet.root.path().join("vgpu/plugin-state.json"))
        .expect("state file");
    assert!(
        state.contains(&core_ids[0]) && state.contains("keeper"),
        "{state}"
    );

    let (plugin, mut cores, _memory) = started(&kubelet, source).await;
    assert_eq!(
        plugin.shared().allocator().state().allocations.len(),
        1,
        "the allocation survived the restart"
    );
    let again = allocate(&mut cores, &core_ids[..5])
        .await
        .expect_err("IDs still held by a live container");
    assert_eq!(again.code(), Code::FailedPrecondition);
    assert!(
        again.message().contains("already allocated") && again.message().contains("keeper"),
        "{}",
        again.message()
    );
    let next = preferred(&mut cores, &all_cores, 50).await;
    assert!(
        next.iter().all(|id| !core_ids.contains(id)),
        "preferred allocation skips booked IDs"
    );
    plugin.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_collection_waits_for_the_container_to_go() {
    let kubelet = TestKubelet::start().await;
    let config = vgpu_node_agent::config::NodeConfig {
        gc_grace_secs: 0,
        ..kubelet.plugin_config()
    };
    let plugin = vgpu_plugin::start(config, Arc::new(FakeSource::uniform(1, CARD_MEMORY)))
        .await
        .expect("plugin");
    kubelet.wait_registrations(2).await;
    let mut cores = plugin_client(&plugin.sockets()[0]).await;
    let core_ids: Vec<String> = (0..100).map(|k| format!("GPU-fake-0-core-{k}")).collect();
    let response = allocate(&mut cores, &core_ids).await.expect("whole card");
    let dir = std::path::Path::new(host_path_of(&response, "/etc/vgpu/vgpu.yaml"))
        .parent()
        .expect("dir")
        .to_path_buf();
    kubelet.add_container("default", "short", "main", &core_ids, &[]);
    prestart(&mut cores, &core_ids).await.expect("PreStart");
    assert_eq!(
        vgpu_plugin::daemon::collect_garbage(plugin.shared())
            .await
            .expect("gc"),
        0,
        "the container still runs"
    );
    assert!(dir.exists());
    kubelet.clear_pods();
    assert_eq!(
        vgpu_plugin::daemon::collect_garbage(plugin.shared())
            .await
            .expect("gc"),
        1
    );
    assert!(!dir.exists(), "allocation folder removed");
    assert!(
        !kubelet
            .root
            .path()
            .join("vgpu/containers/default_short/main")
            .exists(),
        "container link removed"
    );
    assert!(plugin.shared().allocator().state().allocations.is_empty());
    plugin.stop().await;
}
