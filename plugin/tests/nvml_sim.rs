//! The NVML device source against the sim driver (`target/<profile>/libvgpu_sim.so`,
//! `VGPU_SIM_GPUS=2`), through the plugin and the stand-in kubelet: two cards, 100 core
//! devices each and one memory device per 256MiB. Returns early (saying so on stderr)
//! while the sim is not built.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::{TestKubelet, plugin_client};
use vgpu_kubelet_api::deviceplugin::Empty;
use vgpu_node_agent::devices::{DeviceSource, NvmlSource};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_cards_are_advertised() {
    let exe = std::env::current_exe().expect("exe");
    let profile = exe.parent().and_then(Path::parent).expect("profile dir");
    let sim = vgpu_test_support::in_profile_dir(profile, "libvgpu_sim.so")
        .expect("libvgpu_sim.so is not built: run `cargo test --workspace`");
    // SAFETY: set before the sim is loaded and before other threads read the environment.
    unsafe { std::env::set_var("VGPU_SIM_GPUS", "2") };
    let source = NvmlSource::open(&sim).expect("NVML from the sim");
    let cards = source.discover().expect("discover");
    assert_eq!(cards.len(), 2);
    assert_ne!(cards[0].uuid, cards[1].uuid);
    assert!(cards.iter().all(|card| card.memory_total > 0));
    for card in &cards {
        assert!(
            source.probe(&card.uuid).is_ok(),
            "{} answers by UUID",
            card.uuid
        );
    }
    assert!(
        source
            .probe("GPU-00000000-0000-0000-0000-000000000000")
            .is_err()
    );

    let kubelet = TestKubelet::start().await;
    let plugin = vgpu_plugin::start(kubelet.plugin_config(), Arc::new(source))
        .await
        .expect("plugin");
    kubelet.wait_registrations(2).await;
    let mut cores = plugin_client(&plugin.sockets()[0]).await;
    let mut memory = plugin_client(&plugin.sockets()[1]).await;
    let core_devices = cores
        .list_and_watch(Empty {})
        .await
        .expect("stream")
        .into_inner()
        .message()
        .await
        .expect("msg")
        .expect("list")
        .devices;
    let memory_devices = memory
        .list_and_watch(Empty {})
        .await
        .expect("stream")
        .into_inner()
        .message()
        .await
        .expect("msg")
        .expect("list")
        .devices;
    assert_eq!(core_devices.len(), 200);
    let expected: u64 = cards
        .iter()
        .map(|card| card.memory_total / (256 << 20))
        .sum();
    assert_eq!(memory_devices.len() as u64, expected);
    plugin.stop().await;
}
