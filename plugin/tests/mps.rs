//! The MPS sharing mode through the device plugin, against the stand-in kubelet and a
//! STAND-IN MPS control daemon (`mps/tests/fake/nvidia-cuda-mps-control`: a shell script,
//! not MPS): the daemon of an MPS card is started for that card and stopped with the
//! plugin; a container on an MPS card gets the pipe and shm mounts and its share's env in
//! its Allocate answers and CDI specs, and a quota without the time limiter (unless
//! `mps.compute_limiter`); a container on a time-sliced card gets none of it; a card
//! whose daemon cannot run is unhealthy.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Admitted, Plugin, TestKubelet, allocate, config_of, device_list};
use vgpu_contract::ByteSize;
use vgpu_mps::Sharing;
use vgpu_node_agent::config::DeviceListStrategy;
use vgpu_node_agent::config::NodeConfig;
use vgpu_node_agent::devices::FakeSource;

const CARD_MEMORY: u64 = 8 << 30; // 32 memory units of 256MiB

fn fake_control() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../mps/tests/fake/nvidia-cuda-mps-control")
}

/// Card 0 (`GPU-fake-0`, named by index) in MPS mode, card 1 time-sliced; both CDI and
/// mounts in the answers.
fn mps_config(kubelet: &TestKubelet) -> NodeConfig {
    let mut config = kubelet.plugin_config();
    config.card_sharing.insert("0".into(), Sharing::Mps);
    config.mps.control = Some(fake_control());
    config.mps.health_interval_ms = 100;
    config.device_list_strategy = DeviceListStrategy::Both;
    config.cdi_spec_dir = kubelet.root.path().join("cdi");
    config
}

fn control_log(config: &NodeConfig, card: &str) -> String {
    std::fs::read_to_string(
        config
            .state_dir
            .join("mps")
            .join(card)
            .join("log/control.log"),
    )
    .unwrap_or_default()
}

async fn wait_healthy(plugin: &mut Plugin, card: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let devices = device_list(&mut plugin.cores).await;
        if devices
            .iter()
            .filter(|device| device.id.starts_with(&format!("{card}-")))
            .all(|device| device.health == "Healthy")
        {
            return;
        }
        assert!(Instant::now() < deadline, "{card} never turned healthy");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Kubelet's admission of `cores` and `units` on `card` for `pod`, by explicit IDs.
async fn admit_on(
    kubelet: &TestKubelet,
    plugin: &mut Plugin,
    card: &str,
    cores: usize,
    units: usize,
    pod: &str,
) -> Admitted {
    let core_ids: Vec<String> = (0..cores).map(|k| format!("{card}-core-{k}")).collect();
    let memory_ids: Vec<String> = (0..units).map(|k| format!("{card}-mem-{k}")).collect();
    let mut admitted = Admitted::default();
    admitted
        .responses
        .push(allocate(&mut plugin.cores, &core_ids).await.expect("cores"));
    kubelet.set_container("default", pod, "main", &core_ids, &[]);
    admitted.responses.push(
        allocate(&mut plugin.memory, &memory_ids)
            .await
            .expect("memory"),
    );
    kubelet.set_container("default", pod, "main", &core_ids, &memory_ids);
    admitted.cores = core_ids;
    admitted.memory = memory_ids;
    kubelet
        .start_container(plugin, &admitted)
        .await
        .expect("PreStartContainer");
    admitted
}

/// The env of the CDI spec files named in the answers, merged.
fn cdi_env(admitted: &Admitted, config: &NodeConfig) -> Vec<String> {
    let mut env = Vec::new();
    for response in &admitted.responses {
        for device in &response.cdi_devices {
            let id = device.name.rsplit('=').next().expect("name");
            let path = config
                .cdi_spec_dir
                .join(format!("tencent.com-vcuda_{id}.json"));
            let spec: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&path).expect("spec")).expect("json");
            for entry in spec["devices"][0]["containerEdits"]["env"]
                .as_array()
                .into_iter()
                .flatten()
            {
                env.push(entry.as_str().expect("string").to_string());
            }
            for mount in spec["devices"][0]["containerEdits"]["mounts"]
                .as_array()
                .into_iter()
                .flatten()
            {
                env.push(format!(
                    "mount {} <- {}",
                    mount["containerPath"].as_str().expect("path"),
                    mount["hostPath"].as_str().expect("path")
                ));
            }
        }
    }
    env
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_on_an_mps_card_is_a_client_of_that_cards_daemon_at_its_share() {
    // The node agent gives each card's daemon a private /dev/shm: a mount.
    vgpu_test_support::require!(vgpu_test_support::Need::Root);
    let kubelet = TestKubelet::start().await;
    let config = mps_config(&kubelet);
    let mut plugin = Plugin::start(
        &kubelet,
        config.clone(),
        Arc::new(FakeSource::uniform(2, CARD_MEMORY)),
    )
    .await;
    wait_healthy(&mut plugin, "GPU-fake-0").await;
    assert!(
        control_log(&config, "GPU-fake-0").contains("visible=GPU-fake-0 "),
        "one daemon, for card 0 only: {}",
        control_log(&config, "GPU-fake-0")
    );
    assert!(
        !config.state_dir.join("mps/GPU-fake-1").exists(),
        "no daemon for the time-sliced card"
    );

    let admitted = admit_on(&kubelet, &mut plugin, "GPU-fake-0", 30, 20, "infer").await;
    let merged = admitted.merged();
    assert_eq!(merged.envs["CUDA_MPS_PIPE_DIRECTORY"], "/tmp/nvidia-mps");
    assert_eq!(merged.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "30");
    assert_eq!(
        merged.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=5120M",
        "20 units of 256MiB"
    );
    let card_dir = config.state_dir.join("mps/GPU-fake-0");
    let mounted = |path: &str| {
        merged
            .mounts
            .iter()
            .find(|mount| mount.container_path == path)
            .map(|mount| (mount.host_path.clone(), mount.read_only))
    };
    assert_eq!(
        mounted("/tmp/nvidia-mps"),
        Some((card_dir.join("pipe").display().to_string(), false))
    );
    assert_eq!(
        mounted("/dev/shm"),
        Some((card_dir.join("shm").display().to_string(), false))
    );
    let spec = cdi_env(&admitted, &config);
    for wanted in [
        "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps".to_string(),
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30".to_string(),
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=5120M".to_string(),
        format!(
            "mount /tmp/nvidia-mps <- {}",
            card_dir.join("pipe").display()
        ),
        format!("mount /dev/shm <- {}", card_dir.join("shm").display()),
    ] {
        assert!(
            spec.contains(&wanted),
            "{wanted} missing from the CDI specs: {spec:?}"
        );
    }
    let quota = config_of(&admitted);
    assert_eq!(quota.devices[0].memory_limit, Some(ByteSize::mib(5120)));
    assert_eq!(
        quota.devices[0].core_limit, None,
        "compute is left to MPS (mps.compute_limiter: false)"
    );

    let other = admit_on(&kubelet, &mut plugin, "GPU-fake-1", 40, 4, "batch").await;
    let merged = other.merged();
    assert!(
        merged.envs.keys().all(|key| !key.starts_with("CUDA_MPS_")),
        "a time-sliced card's container is no MPS client: {:?}",
        merged.envs
    );
    assert!(
        merged
            .mounts
            .iter()
            .all(|m| m.container_path != "/tmp/nvidia-mps")
    );
    assert_eq!(config_of(&other).devices[0].core_limit, Some(40));

    plugin.handle.stop().await;
    assert!(
        control_log(&config, "GPU-fake-0").contains("quit pid="),
        "the daemon is stopped with the plugin"
    );
    let left: Vec<_> = std::fs::read_dir(card_dir.join("pipe"))
        .expect("pipe folder")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "pipe folder emptied: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_card_is_a_client_at_100_and_the_limiter_stays_when_asked() {
    // The node agent gives each card's daemon a private /dev/shm: a mount.
    vgpu_test_support::require!(vgpu_test_support::Need::Root);
    let kubelet = TestKubelet::start().await;
    let mut config = mps_config(&kubelet);
    config.mps.compute_limiter = true;
    let mut plugin = Plugin::start(
        &kubelet,
        config.clone(),
        Arc::new(FakeSource::uniform(2, CARD_MEMORY)),
    )
    .await;
    wait_healthy(&mut plugin, "GPU-fake-0").await;
    let admitted = admit_on(&kubelet, &mut plugin, "GPU-fake-0", 30, 8, "limited").await;
    assert_eq!(
        config_of(&admitted).devices[0].core_limit,
        Some(30),
        "mps.compute_limiter: true keeps the time limiter on top"
    );
    assert_eq!(
        admitted.merged().envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"],
        "0=2048M"
    );
    kubelet.remove_pod("default", "limited");

    // A whole MPS card: a client at 100 %.
    let card0: Vec<String> = (0..100).map(|k| format!("GPU-fake-0-core-{k}")).collect();
    let whole = allocate(&mut plugin.cores, &card0)
        .await
        .expect("card 0 whole");
    assert_eq!(whole.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "100");
    kubelet.set_container("default", "whole", "main", &card0, &[]);
    kubelet.remove_pod("default", "whole");
    // Two whole cards: no one daemon serves both, so no MPS.
    let both: Vec<String> = ["GPU-fake-0", "GPU-fake-1"]
        .iter()
        .flat_map(|card| (0..100).map(move |k| format!("{card}-core-{k}")))
        .collect();
    let two = allocate(&mut plugin.cores, &both)
        .await
        .expect("two whole cards");
    assert!(two.envs.keys().all(|key| !key.starts_with("CUDA_MPS_")));
    plugin.handle.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mps_card_whose_daemon_cannot_run_is_unhealthy() {
    let kubelet = TestKubelet::start().await;
    let mut config = mps_config(&kubelet);
    config.mps.control = Some(kubelet.root.path().join("no-such-nvidia-cuda-mps-control"));
    let mut plugin = Plugin::start(
        &kubelet,
        config,
        Arc::new(FakeSource::uniform(2, CARD_MEMORY)),
    )
    .await;
    // The time-sliced card is healthy; the MPS card stays unhealthy (a process that
    // cannot reach its daemon would run without MPS, uncapped).
    wait_healthy(&mut plugin, "GPU-fake-1").await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let devices = device_list(&mut plugin.cores).await;
    assert!(
        devices
            .iter()
            .filter(|device| device.id.starts_with("GPU-fake-0-"))
            .all(|device| device.health == "Unhealthy")
    );
    plugin.handle.stop().await;
}
