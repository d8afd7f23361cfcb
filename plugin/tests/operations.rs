//! Day-2 operations against the stand-in kubelet: metrics that keep counting across
//! process exits and survive a tenant truncating its region, `/healthz`, the refusal to
//! start beside another plugin of our resource names (a fake gpu-manager on a real
//! socket), and the `vgpu-plugin` binary's version line and its exit when its config
//! file changes the way a ConfigMap update changes it.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use common::{
    TestKubelet, allocate, http_get, list_ids, metric_value as value, plugin_client, prestart,
    sim_nvml, tenant,
};
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};
use vgpu_contract::region::Region;
use vgpu_contract::snapshot::RegionSnapshot;
use vgpu_kubelet_api::deviceplugin::device_plugin_server::{DevicePlugin, DevicePluginServer};
use vgpu_kubelet_api::deviceplugin::{
    AllocateRequest, AllocateResponse, Device, DevicePluginOptions, Empty, ListAndWatchResponse,
    PreStartContainerRequest, PreStartContainerResponse, PreferredAllocationRequest,
    PreferredAllocationResponse,
};
use vgpu_node_agent::devices::FakeSource;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_never_drop_when_processes_exit_and_the_region_is_read_by_copy() {
    let (kubelet, plugin, region_path, address) = common::one_container_on_a_4gib_card().await;
    let labels = r#"namespace="team",pod="trainer",container="cuda",UUID="GPU-fake-0""#;
    let scrape = || async {
        let (code, body) = http_get(address, "/metrics").await;
        assert_eq!(code, 200, "{body}");
        body
    };

    // Two processes of the container, as their shims count.
    let region = Region::open_existing(&region_path).expect("region");
    let first = region.attach(&tenant(100)).expect("attach");
    let second = region.attach(&tenant(101)).expect("attach");
    region.add_busy(first, 0, 2_000_000_000, 10);
    region.add_busy(second, 0, 1_000_000_000, 5);
    region.add_used(second, 0, 256 << 20);
    let metrics = scrape().await;
    assert_eq!(
        value(&metrics, "vgpu_container_kernel_launches_total", labels),
        Some(15.0),
        "{metrics}"
    );
    assert_eq!(
        value(&metrics, "vgpu_container_gpu_busy_seconds_total", labels),
        Some(3.0)
    );
    assert_eq!(
        value(&metrics, "vgpu_container_processes", labels),
        Some(2.0)
    );
    assert_eq!(
        value(&metrics, "vgpu_container_memory_used_bytes", labels),
        Some(268435456.0)
    );
    assert_eq!(
        value(&metrics, "vgpu_container_core_limit", labels),
        Some(30.0)
    );
    assert_eq!(
        value(
            &metrics,
            "vgpu_card_allocated_cores",
            r#"UUID="GPU-fake-0",gpu="0""#
        ),
        Some(30.0)
    );
    assert_eq!(
        value(
            &metrics,
            "vgpu_build_info",
            &format!(
                r#"version="{}",commit="{}""#,
                vgpu_build_info::VERSION,
                vgpu_build_info::COMMIT
            )
        ),
        Some(1.0),
        "{metrics}"
    );

    // The first exits (its slot is cleared), a new process takes the slot.
    region.detach(first);
    let metrics = scrape().await;
    assert_eq!(
        value(&metrics, "vgpu_container_kernel_launches_total", labels),
        Some(15.0),
        "an exit must not lower the total: {metrics}"
    );
    let third = region.attach(&tenant(102)).expect("attach");
    assert_eq!(third.index(), first.index(), "the freed slot is reused");
    region.add_busy(third, 0, 500_000_000, 1);
    let metrics = scrape().await;
    assert_eq!(
        value(&metrics, "vgpu_container_kernel_launches_total", labels),
        Some(16.0)
    );
    assert_eq!(
        value(&metrics, "vgpu_container_gpu_busy_seconds_total", labels),
        Some(3.5)
    );
    drop(region);

    // The tenant truncates its region: the plugin reads copies, so it neither dies nor
    // forgets what was counted.
    std::fs::File::options()
        .write(true)
        .open(&region_path)
        .expect("open")
        .set_len(4096)
        .expect("truncate");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let metrics = scrape().await;
    assert_eq!(
        value(&metrics, "vgpu_container_kernel_launches_total", labels),
        Some(16.0)
    );
    assert_eq!(value(&metrics, "vgpu_container_processes", labels), None);
    let (code, body) = http_get(address, "/healthz").await;
    assert_eq!(code, 200, "{body}");
    assert!(body.starts_with("ok: tencent.com/vcuda-core, tencent.com/vcuda-memory"));
    plugin.stop().await;
    assert!(
        kubelet
            .root
            .path()
            .join("vgpu")
            .join(vgpu_plugin::usage::TOTALS_FILE)
            .is_file(),
        "the totals are kept for the next start"
    );
}

/// A scrape copies each container's usage region once, and that one copy feeds both
/// running totals (launches and busy time; what the quota did) with the figures the
/// served `/metrics` has. The copies are counted through the scrape's reader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrape_copies_each_region_once_for_both_running_totals() {
    let (kubelet, plugin, first_path, address) = common::one_container_on_a_4gib_card().await;
    // A second container on the card: the next 20 cores and 4 memory units.
    let sockets = plugin.sockets();
    let mut core_client = plugin_client(&sockets[0]).await;
    let mut memory_client = plugin_client(&sockets[1]).await;
    let cores: Vec<String> = list_ids(&mut core_client)
        .await
        .into_iter()
        .skip(30)
        .take(20)
        .collect();
    let memory: Vec<String> = list_ids(&mut memory_client)
        .await
        .into_iter()
        .skip(4)
        .take(4)
        .collect();
    let response = allocate(&mut core_client, &cores).await.expect("cores");
    allocate(&mut memory_client, &memory).await.expect("memory");
    kubelet.add_container("team", "eval", "cuda", &cores, &memory);
    prestart(&mut core_client, &cores).await.expect("PreStart");
    let second_path = PathBuf::from(common::host_path_of(&response, "/etc/vgpu/usage.region"));
    assert_ne!(first_path, second_path);

    // Each container's shims count launches, busy time, refusals, throttling.
    for (path, scale) in [(&first_path, 1), (&second_path, 3)] {
        let region = Region::open_existing(path).expect("region");
        let slot = region.attach(&tenant(100 + scale as i32)).expect("attach");
        region.add_busy(slot, 0, scale * 1_000_000_000, scale * 5);
        region.add_used(slot, 0, scale * (64 << 20));
        for _ in 0..scale {
            region.count_refusal(0, 1 << 30, 100 << 20);
        }
        region.add_throttled(0, scale * 250_000_000);
        region.count_over_quota(0);
    }

    let reads: Arc<std::sync::Mutex<BTreeMap<PathBuf, usize>>> = Arc::default();
    let (shared, usage, counted) = (
        plugin.shared().clone(),
        plugin.usage().clone(),
        reads.clone(),
    );
    let rendered = tokio::task::spawn_blocking(move || {
        vgpu_plugin::metrics::render_reading(&shared, &usage, &|path| {
            *counted
                .lock()
                .expect("count")
                .entry(path.to_path_buf())
                .or_default() += 1;
            RegionSnapshot::read(path).ok()
        })
    })
    .await
    .expect("render");
    assert_eq!(
        *reads.lock().expect("count"),
        BTreeMap::from([(first_path.clone(), 1), (second_path.clone(), 1)]),
        "one copy of each region per scrape"
    );

    let (code, served) = http_get(address, "/metrics").await;
    assert_eq!(code, 200, "{served}");
    for (pod, scale) in [("trainer", 1.0), ("eval", 3.0)] {
        let labels = format!(r#"namespace="team",pod="{pod}",container="cuda",UUID="GPU-fake-0""#);
        for (name, expected) in [
            ("vgpu_container_kernel_launches_total", 5.0 * scale),
            ("vgpu_container_gpu_busy_seconds_total", scale),
            (
                "vgpu_container_memory_used_bytes",
                scale * f64::from(64u32 << 20),
            ),
            ("vgpu_container_processes", 1.0),
            ("vgpu_container_memory_refusals_total", scale),
            (
                "vgpu_container_memory_refused_bytes_total",
                scale * f64::from(1u32 << 30),
            ),
            ("vgpu_container_throttled_seconds_total", scale * 0.25),
            ("vgpu_container_memory_over_quota_total", 1.0),
        ] {
            assert_eq!(
                value(&rendered, name, &labels),
                Some(expected),
                "{name} {labels}: {rendered}"
            );
            assert_eq!(
                value(&served, name, &labels),
                Some(expected),
                "{name} {labels}: {served}"
            );
        }
    }
    assert_eq!(
        value(
            &served,
            "vgpu_card_used_memory_bytes",
            r#"UUID="GPU-fake-0",gpu="0""#
        ),
        Some(f64::from(256u32 << 20))
    );
    plugin.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_says_what_is_missing() {
    let kubelet = TestKubelet::start().await;
    let config = vgpu_node_agent::config::NodeConfig {
        // No kubelet listens there: served, never registered.
        kubelet_socket: "absent.sock".into(),
        ..kubelet.plugin_config()
    };
    let plugin = vgpu_plugin::start(config, Arc::new(FakeSource::uniform(1, 4 << 30)))
        .await
        .expect("plugin");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (code, body) = http_get(plugin.metrics_address().expect("metrics"), "/healthz").await;
    assert_eq!(code, 503, "{body}");
    assert_eq!(
        body,
        "tencent.com/vcuda-core: not registered with kubelet\ntencent.com/vcuda-memory: not registered with kubelet\n"
    );
    let (code, _) = http_get(plugin.metrics_address().expect("metrics"), "/nope").await;
    assert_eq!(code, 404);
    plugin.stop().await;
}

/// A device plugin of someone else's, listing fixed devices.
#[derive(Clone)]
struct OtherPlugin(Vec<String>);

type DeviceStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for OtherPlugin {
    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(DevicePluginOptions::default()))
    }

    type ListAndWatchStream = DeviceStream;

    async fn list_and_watch(&self, _: Request<Empty>) -> Result<Response<DeviceStream>, Status> {
        let devices = self
            .0
            .iter()
            .map(|id| Device {
                id: id.clone(),
                health: "Healthy".into(),
                topology: None,
            })
            .collect();
        let first = tokio_stream::once(Ok(ListAndWatchResponse { devices }));
        Ok(Response::new(Box::pin(tokio_stream::StreamExt::chain(
            first,
            tokio_stream::pending(),
        ))))
    }

    async fn get_preferred_allocation(
        &self,
        _: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        Err(Status::unimplemented("test plugin"))
    }

    async fn allocate(
        &self,
        _: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        Err(Status::unimplemented("test plugin"))
    }

    async fn pre_start_container(
        &self,
        _: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        Ok(Response::new(PreStartContainerResponse {}))
    }
}

fn serve_other(socket: &Path, devices: &[&str]) -> tokio::task::JoinHandle<()> {
    let listener = UnixListener::bind(socket).expect("bind");
    let plugin = OtherPlugin(devices.iter().map(|id| id.to_string()).collect());
    tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(DevicePluginServer::new(plugin))
            .serve_with_incoming(UnixListenerStream::new(listener))
            .await;
    })
}

fn checkpoint(dir: &Path, registered: &str) {
    std::fs::write(
        dir.join("kubelet_internal_checkpoint"),
        format!(r#"{{"Data":{{"PodDeviceEntries":[],"RegisteredDevices":{{{registered}}}}},"Checksum":1}}"#),
    )
    .expect("checkpoint");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_to_start_beside_another_plugin_of_our_resources() {
    let kubelet = TestKubelet::start().await;
    let dir = kubelet.device_plugin_dir();
    // Left over by a dead plugin: a socket file nobody listens on. Not a reason.
    drop(std::os::unix::net::UnixListener::bind(dir.join("vmemory.sock")).expect("bind"));
    // A live plugin of another resource, registered as such. Not a reason either.
    let nvidia = serve_other(&dir.join("nvidia-gpu.sock"), &["GPU-a", "GPU-b"]);
    checkpoint(&dir, r#""nvidia.com/gpu":["GPU-a","GPU-b"]"#);
    let plugin = vgpu_plugin::start(
        kubelet.plugin_config(),
        Arc::new(FakeSource::uniform(1, 4 << 30)),
    )
    .await
    .expect("starts beside a stale socket and another resource's plugin");
    plugin.stop().await;

    // gpu-manager, live, with kubelet's checkpoint saying it serves vcuda-core.
    let gpu_manager = serve_other(&dir.join("vcore.sock"), &["vcore-0", "vcore-1"]);
    checkpoint(
        &dir,
        r#""nvidia.com/gpu":["GPU-a","GPU-b"],"tencent.com/vcuda-core":["vcore-0","vcore-1"]"#,
    );
    let error = vgpu_plugin::start(
        kubelet.plugin_config(),
        Arc::new(FakeSource::uniform(1, 4 << 30)),
    )
    .await
    .err()
    .expect("refused");
    let message = error.to_string();
    assert!(
        message.starts_with("tencent.com/vcuda-core is already served on this node by another device plugin (socket "),
        "{message}"
    );
    assert!(message.contains("vcore.sock"), "{message}");
    assert!(message.contains("vcore-0, vcore-1"), "{message}");
    assert!(
        message.contains("check_foreign_plugins: false"),
        "{message}"
    );
    assert!(
        !dir.join("vgpu-vcuda-core.sock").exists(),
        "nothing is served when refusing"
    );
    // Without a checkpoint entry, gpu-manager's socket name and a live answer suffice.
    checkpoint(&dir, "");
    let error = vgpu_plugin::start(
        kubelet.plugin_config(),
        Arc::new(FakeSource::uniform(1, 4 << 30)),
    )
    .await
    .err()
    .expect("refused by name");
    assert!(
        error.to_string().contains("gpu-manager's socket name"),
        "{error}"
    );
    // And the check can be turned off.
    let config = vgpu_node_agent::config::NodeConfig {
        check_foreign_plugins: false,
        ..kubelet.plugin_config()
    };
    let plugin = vgpu_plugin::start(config, Arc::new(FakeSource::uniform(1, 4 << 30)))
        .await
        .expect("starts when told to");
    plugin.stop().await;
    gpu_manager.abort();
    nvidia.abort();
}

/// Publishes `text` as a ConfigMap volume does: a new timestamped folder, then the
/// `..data` link swapped to it in one rename (`plugin.yaml -> ..data/plugin.yaml`).
fn publish(volume: &Path, stamp: u32, text: &str) {
    let folder = volume.join(format!("..{stamp}"));
    std::fs::create_dir_all(&folder).expect("mkdir");
    std::fs::write(folder.join("plugin.yaml"), text).expect("write");
    let staging = volume.join("..data_tmp");
    let _ = std::fs::remove_file(&staging);
    std::os::unix::fs::symlink(format!("..{stamp}"), &staging).expect("link");
    std::fs::rename(&staging, volume.join("..data")).expect("swap");
    let file = volume.join("plugin.yaml");
    if std::fs::symlink_metadata(&file).is_err() {
        std::os::unix::fs::symlink("..data/plugin.yaml", &file).expect("link");
    }
}

fn wait_exit(child: &mut Child, within: Duration) -> Option<std::process::ExitStatus> {
    let deadline = std::time::Instant::now() + within;
    while std::time::Instant::now() < deadline {
        if let Some(status) = child.try_wait().expect("wait") {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_logs_its_version_and_exits_when_its_configmap_changes() {
    let version = Command::new(env!("CARGO_BIN_EXE_vgpu-plugin"))
        .arg("--version")
        .output()
        .expect("run");
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("vgpu-plugin {}", vgpu_build_info::VERSION_LINE)
    );
    let Some(sim) = sim_nvml("operations") else {
        return;
    };
    let kubelet = TestKubelet::start().await;
    let volume = kubelet.root.path().join("config");
    std::fs::create_dir_all(&volume).expect("mkdir");
    let base = kubelet.plugin_config();
    let yaml = |policy: &str| {
        format!(
            "device_plugin_dir: {}\npod_resources_socket: {}\nstate_dir: {}\nnvml_library: {}\nmetrics_address: null\nkubelet_watch_interval_ms: 50\nconfig_watch_interval_ms: 100\npolicy: {policy}\n",
            base.device_plugin_dir.display(),
            base.pod_resources_socket.display(),
            base.state_dir.display(),
            sim.display()
        )
    };
    publish(&volume, 1, &yaml("binpack"));
    let log = kubelet.root.path().join("plugin.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_vgpu-plugin"))
        .arg("--config")
        .arg(volume.join("plugin.yaml"))
        .env("VGPU_SIM_GPUS", "1")
        .env("VGPU_SIM_STATE", kubelet.root.path().join("sim.state"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("spawn vgpu-plugin");
    kubelet.wait_registrations(2).await;
    // A broken edit is reported and ignored.
    publish(&volume, 2, "policy: sideways\n");
    assert_eq!(
        wait_exit(&mut child, Duration::from_millis(800)),
        None,
        "kept running"
    );
    // A real change: a clean exit, for kubelet to restart it with the new config.
    publish(&volume, 3, &yaml("spread"));
    let status = wait_exit(&mut child, Duration::from_secs(10));
    if status.is_none() {
        let _ = child.kill();
    }
    let text = std::fs::read_to_string(&log).expect("log");
    assert_eq!(status.and_then(|status| status.code()), Some(0), "{text}");
    let first = text.lines().next().unwrap_or_default();
    assert!(
        first.contains(&vgpu_build_info::banner("vgpu-plugin")),
        "the version is logged first: {text}"
    );
    assert!(text.contains("sideways"), "{text}");
    assert!(text.contains("the config file changed"), "{text}");
    assert!(
        !base.device_plugin_dir.join("vgpu-vcuda-core.sock").exists(),
        "sockets removed on the way out"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_mount_the_version_folder_current_names_at_their_start() {
    let kubelet = TestKubelet::start().await;
    let config = kubelet.plugin_config();
    // What `vgpu-ldconfig prepare` leaves: two version folders, `current` at the newer.
    for version in ["535.261.03", "580.159.04"] {
        let shim = config.host_driver_dir.join(version).join("shim");
        std::fs::create_dir_all(&shim).expect("mkdir");
        std::fs::write(shim.join("libcuda_shim.so"), version).expect("shim");
        std::fs::write(shim.join("libnvml_shim.so"), version).expect("shim");
    }
    std::os::unix::fs::symlink("535.261.03", config.host_driver_dir.join("current")).expect("link");
    let plugin = vgpu_plugin::start(config.clone(), Arc::new(FakeSource::uniform(1, 4 << 30)))
        .await
        .expect("plugin");
    kubelet.wait_registrations(2).await;
    let mut cores = plugin_client(&plugin.sockets()[0]).await;
    let all = list_ids(&mut cores).await;
    let mount_of = |response: &vgpu_kubelet_api::deviceplugin::ContainerAllocateResponse,
                    at: &str| {
        response
            .mounts
            .iter()
            .find(|mount| mount.container_path == at)
            .map(|mount| PathBuf::from(&mount.host_path))
            .expect("mount")
    };
    let before = allocate(&mut cores, &all[..30]).await.expect("allocate");
    assert_eq!(
        mount_of(&before, "/usr/local/vgpu/driver"),
        config.host_driver_dir.join("535.261.03")
    );
    assert_eq!(
        mount_of(&before, "/usr/lib64/libcuda.so.1"),
        config
            .host_driver_dir
            .join("535.261.03/shim/libcuda_shim.so")
    );
    // A driver upgrade switches `current`: the next container gets the new folder, the
    // first keeps what it mounted.
    let staging = config.host_driver_dir.join("current.tmp");
    std::os::unix::fs::symlink("580.159.04", &staging).expect("link");
    std::fs::rename(&staging, config.host_driver_dir.join("current")).expect("switch");
    let later = allocate(&mut cores, &all[30..60]).await.expect("allocate");
    assert_eq!(
        mount_of(&later, "/usr/local/vgpu/driver"),
        config.host_driver_dir.join("580.159.04")
    );
    assert_eq!(
        mount_of(&later, "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"),
        config
            .host_driver_dir
            .join("580.159.04/shim/libnvml_shim.so")
    );
    plugin.stop().await;
}
