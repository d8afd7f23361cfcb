//! The DRA plugin through the test kubelet (registration and DRA v1/v1beta1 over unix
//! sockets, the real protos) and the stand-in API server, over the sim driver with four
//! GPUs: slices published (golden JSON, checked against the v1 schema), claims of 60
//! then 50 cores placed by a consumable-capacity scheduler on two cards and prepared,
//! each quota seen through the shims, prepare idempotent, a plugin restart that loses
//! nothing, re-registration when the registration socket goes, and the refusal to run
//! beside the device plugin. No real kubelet or kube-apiserver runs here.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use serde_json::Value;
use vgpu_contract::{ByteSize, Config, CoreMode};
use vgpu_dra::cards::{NoDetails, NvmlDetails};
use vgpu_kube::k8s_openapi::api::resource::v1::ResourceSlice;
use vgpu_kube::standin::StandInApiServer;
use vgpu_node_agent::devices::{DeviceSource, FakeSource, NvmlSource};
use vgpu_node_agent::persist::Versioned;
use vgpu_test_support::{Need, require};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

/// The slice as the driver wrote it: the server's own metadata taken out.
fn as_written(slice: &Value) -> Value {
    let mut slice = slice.clone();
    if let Some(meta) = slice.get_mut("metadata").and_then(Value::as_object_mut) {
        for key in ["uid", "resourceVersion", "creationTimestamp"] {
            meta.remove(key);
        }
    }
    slice
}

/// Parses with k8s-openapi and writes back: anything the v1 schema does not know
/// would be dropped, so equality means every field is a v1 field.
fn assert_v1_schema(slice: &Value) {
    let parsed: ResourceSlice = serde_json::from_value(slice.clone()).expect("a v1 ResourceSlice");
    let again = serde_json::to_value(&parsed).expect("serialize");
    assert_eq!(
        &again, slice,
        "fields outside the resource.k8s.io/v1 schema"
    );
}

fn golden(name: &str, actual: &Value) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    let text = serde_json::to_string_pretty(actual).expect("json") + "\n";
    if std::env::var("VGPU_UPDATE_GOLDEN").is_ok_and(|v| v == "1") {
        std::fs::write(&path, &text).expect("write golden");
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|_| {
        panic!(
            "{} missing (VGPU_UPDATE_GOLDEN=1 writes it)",
            path.display()
        )
    });
    assert_eq!(text, expected, "{} differs", path.display());
}

/// The built pieces the shim check needs, or `None` (by the prerequisite policy).
fn shim_artifacts() -> Option<[PathBuf; 4]> {
    let wanted = [
        "libcuda_shim.so",
        "libnvml_shim.so",
        "libvgpu_sim.so",
        "vgpu",
    ];
    require!(return None; Need::Built(wanted[0]), Need::Built(wanted[1]), Need::Built(wanted[2]), Need::Built(wanted[3]));
    Some(wanted.map(|name| built(name).expect("checked")))
}

/// Runs `vgpu probe` and pynvml through the shims under the prepared config, as the
/// container would see it: the config's container paths mapped to their host sources
/// (the region to the prepared region, the driver folder to the sim).
fn through_the_shims(
    kubelet: &TestKubelet,
    allocation: &Path,
    artifacts: &[PathBuf; 4],
    alloc: &str,
) -> (Value, Option<String>) {
    let [cuda_shim, nvml_shim, sim, vgpu] = artifacts;
    let shims = kubelet.path("shim-libs");
    let real = kubelet.path("sim-libs");
    for (dir, links) in [
        (
            &shims,
            [
                ("libcuda.so.1", cuda_shim),
                ("libnvidia-ml.so.1", nvml_shim),
            ],
        ),
        (&real, [("libcuda.so.1", sim), ("libnvidia-ml.so.1", sim)]),
    ] {
        std::fs::create_dir_all(dir).expect("mkdir");
        for (name, target) in links {
            let _ = std::os::unix::fs::symlink(target, dir.join(name));
        }
    }
    let mut config = Config::load(&allocation.join("vgpu.yaml")).expect("prepared config parses");
    config.usage_region = Some(allocation.join("usage.region"));
    config.driver_dir = Some(real.clone());
    let view = kubelet.path(&format!(
        "view-{}.yaml",
        allocation
            .file_name()
            .and_then(|n| n.to_str())
            .expect("name")
    ));
    std::fs::write(&view, config.to_yaml()).expect("write view");
    let run = |command: &mut Command| {
        command
            .env("VGPU_CONFIG", &view)
            .env("LD_LIBRARY_PATH", &shims)
            .env("VGPU_SIM_GPUS", GPUS.to_string())
            .env("VGPU_SIM_STATE", kubelet.path("sim.state"))
            .env_remove("VGPU_DRIVER_DIR")
            .output()
            .expect("spawn")
    };
    let probe = run(Command::new(vgpu).args(["probe", "--json", "--alloc", alloc]));
    let report: Value = serde_json::from_slice(
        String::from_utf8_lossy(&probe.stdout)
            .lines()
            .last()
            .unwrap_or("{}")
            .as_bytes(),
    )
    .unwrap_or_else(|err| panic!("probe printed no JSON ({err}): {probe:?}"));
    let nvml = vgpu_test_support::present(&[Need::Python(&["pynvml"])]).then(|| {
        let python = run(Command::new("python3").args([
            "-c",
            "import pynvml; pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0); \
             u = pynvml.nvmlDeviceGetUUID(h); u = u.decode() if isinstance(u, bytes) else u; \
             print(pynvml.nvmlDeviceGetCount(), u, pynvml.nvmlDeviceGetMemoryInfo(h).total)",
        ]));
        assert!(
            python.status.success(),
            "pynvml through the shims failed: {}",
            String::from_utf8_lossy(&python.stderr)
        );
        String::from_utf8_lossy(&python.stdout).trim().to_string()
    });
    (report, nvml)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_sim_gpus_slices_placement_prepare_and_restart() {
    let Some(sim) = sim_library() else { return };
    let server = StandInApiServer::start().await.expect("stand-in");
    let kubelet = TestKubelet::new();
    let config = kubelet.config(&server.url());
    let source: Arc<dyn DeviceSource> =
        Arc::new(NvmlSource::open(&sim).expect("NVML over the sim"));
    let cards = source.discover().expect("discover");
    assert_eq!(cards.len(), GPUS as usize);
    let details = Arc::new(NvmlDetails::open(&sim).expect("details"));
    let plugin = vgpu_dra::start(config.clone(), source.clone(), details.clone())
        .await
        .expect("start");

    // Registration, as kubelet's plugin watcher does it.
    let info = kubelet.register().await;
    assert_eq!(info.name, DRIVER);
    assert_eq!(info.endpoint, config.dra_socket().to_string_lossy());
    assert_eq!(
        info.supported_versions,
        vec!["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    );
    assert_eq!(plugin.registration().accepted.load(Ordering::Relaxed), 1);

    // The slices: one pool named after the node, four shareable cards.
    let slices = wait_slices(&server, |s| s.len() == 1).await;
    let written = as_written(&slices[0]);
    assert_v1_schema(&written);
    golden("resourceslice-4-sim-gpus.json", &written);
    let parsed = parsed_slices(&slices);

    // A first-fit consumable-capacity scheduler: 60 cores fill gpu-0 past what 50 more
    // would need, so the second claim goes to gpu-1.
    let mut scheduler = Scheduler::default();
    let first = scheduler
        .place(&parsed, Some(60), Some(4 * GIB))
        .expect("60 cores fit");
    let second = scheduler
        .place(&parsed, Some(50), Some(2560 * MIB))
        .expect("50 cores fit");
    assert_eq!(
        (first.device.as_str(), second.device.as_str()),
        ("gpu-0", "gpu-1")
    );
    // Rounding to the policy's step: 1000 MiB of memory is taken as 1024 MiB.
    let rounded = Scheduler::default()
        .place(&parsed, Some(1), Some(1000 * MIB))
        .expect("fits");
    assert_eq!(rounded.memory, 1024 * MIB);

    let uid_a = "11111111-aaaa-4aaa-8aaa-000000000060";
    let uid_b = "22222222-bbbb-4bbb-8bbb-000000000050";
    server.put_claim(allocated_claim(
        "team",
        "train-60",
        uid_a,
        "gpu",
        &first,
        ("trainer", "pod-a"),
    ));
    server.put_claim(allocated_claim(
        "team",
        "infer-50",
        uid_b,
        "gpu",
        &second,
        ("infer", "pod-b"),
    ));
    server.put_pod(pod("team", "trainer", "pod-a", Some("80")));
    server.put_pod(pod("team", "infer", "pod-b", None));

    let mut v1 = kubelet.v1(&info.endpoint).await;
    let devices_a = prepare(&mut v1, claim("team", "train-60", uid_a))
        .await
        .expect("prepare 60");
    assert_eq!(devices_a.len(), 1);
    assert_eq!(devices_a[0].pool_name, NODE);
    assert_eq!(devices_a[0].device_name, "gpu-0");
    assert_eq!(devices_a[0].request_names, vec!["gpu"]);
    assert_eq!(
        devices_a[0].cdi_device_ids,
        vec![format!("vgpu-shim.io/gpu={uid_a}-gpu")]
    );
    // The same service on v1beta1.
    let mut beta = kubelet.v1beta1(&info.endpoint).await;
    let answer = beta
        .node_prepare_resources(vgpu_kubelet_api::dra_v1beta1::NodePrepareResourcesRequest {
            claims: vec![vgpu_kubelet_api::dra_v1beta1::Claim {
                namespace: "team".into(),
                name: "infer-50".into(),
                uid: uid_b.into(),
            }],
        })
        .await
        .expect("v1beta1 prepare")
        .into_inner();
    let entry = &answer.claims[uid_b];
    assert_eq!(entry.error, "");
    assert_eq!(entry.devices[0].device_name, "gpu-1");

    // What was written: config, region, CDI spec.
    let preparer = plugin.preparer();
    for (uid, card, cores, memory, mode, ceiling) in [
        (uid_a, &cards[0], 60, 4 * GIB, CoreMode::Soft, Some(80)),
        (uid_b, &cards[1], 50, 2560 * MIB, CoreMode::Hard, None),
    ] {
        let id = format!("{uid}-gpu");
        let dir = preparer.allocation_dir(&id);
        let written = Config::load(&dir.join("vgpu.yaml")).expect("config");
        assert_eq!(written.container_id.as_deref(), Some(id.as_str()));
        assert_eq!(
            written.usage_region.as_deref(),
            Some(Path::new("/etc/vgpu/usage.region"))
        );
        let device = &written.devices[0];
        assert_eq!(device.uuid.as_deref(), Some(card.uuid.as_str()));
        assert_eq!(device.core_limit, Some(cores));
        assert_eq!(device.memory_limit, Some(ByteSize(memory)));
        assert_eq!((device.core_mode, device.core_ceiling), (mode, ceiling));
        let region = vgpu_contract::snapshot::RegionSnapshot::read(&dir.join("usage.region"))
            .expect("region");
        drop(region);
        let spec: Value = serde_json::from_str(
            &std::fs::read_to_string(
                kubelet
                    .path("cdi")
                    .join(format!("vgpu-shim.io-gpu_{id}.json")),
            )
            .expect("CDI spec"),
        )
        .expect("json");
        assert_eq!(spec["kind"], "vgpu-shim.io/gpu");
        assert_eq!(spec["devices"][0]["name"], id.as_str());
        let mounts = spec["devices"][0]["containerEdits"]["mounts"]
            .as_array()
            .expect("mounts");
        assert!(
            mounts
                .iter()
                .any(|m| m["containerPath"] == "/etc/vgpu/vgpu.yaml"
                    && m["hostPath"] == dir.join("vgpu.yaml").to_string_lossy().as_ref())
        );
        assert!(
            mounts
                .iter()
                .any(|m| m["containerPath"] == "/etc/vgpu/usage.region")
        );
        let env = spec["devices"][0]["containerEdits"]["env"]
            .as_array()
            .expect("env");
        assert!(env.iter().any(|e| e == "VGPU_CONFIG=/etc/vgpu/vgpu.yaml"));
    }

    // Each quota through the shims: one card, its UUID, the claim's memory.
    if let Some(artifacts) = shim_artifacts() {
        for (uid, card, memory) in [(uid_a, &cards[0], 4 * GIB), (uid_b, &cards[1], 2560 * MIB)] {
            let dir = preparer.allocation_dir(&format!("{uid}-gpu"));
            let (report, nvml) = through_the_shims(&kubelet, &dir, &artifacts, "5GiB");
            assert_eq!(report["device_count"], 1, "{report}");
            assert_eq!(report["devices"][0]["total_mem"], memory, "{report}");
            assert_eq!(
                report["allocations"][0]["result"], "CUDA_ERROR_OUT_OF_MEMORY",
                "{report}"
            );
            if let Some(nvml) = nvml {
                assert_eq!(nvml, format!("1 {} {memory}", card.uuid));
            }
        }
    }

    // Prepare is idempotent: the same answer, nothing rewritten.
    let config_a = preparer
        .allocation_dir(&format!("{uid_a}-gpu"))
        .join("vgpu.yaml");
    let before = std::fs::metadata(&config_a)
        .and_then(|m| m.modified())
        .expect("mtime");
    assert_eq!(
        prepare(&mut v1, claim("team", "train-60", uid_a))
            .await
            .expect("again"),
        devices_a
    );
    assert_eq!(
        std::fs::metadata(&config_a)
            .and_then(|m| m.modified())
            .expect("mtime"),
        before
    );

    // A plugin restart loses nothing, even with the API server away.
    drop(v1);
    drop(beta);
    plugin.stop().await;
    // A crash between writing a request and checkpointing it leaves a folder and a spec
    // nobody was told of: the restart sweeps them.
    let orphan_id = "33333333-cccc-4ccc-8ccc-000000000000-gpu";
    let orphan = config.state_dir.join("allocations").join(orphan_id);
    std::fs::create_dir_all(&orphan).expect("orphan folder");
    let orphan_spec = kubelet
        .path("cdi")
        .join(format!("vgpu-shim.io-gpu_{orphan_id}.json"));
    std::fs::write(&orphan_spec, "{}").expect("orphan spec");
    server.set_down(true);
    let plugin = vgpu_dra::start(config.clone(), source.clone(), details)
        .await
        .expect("restart");
    assert!(!orphan.exists() && !orphan_spec.exists(), "orphans swept");
    let info = kubelet.register().await;
    let mut v1 = kubelet.v1(&info.endpoint).await;
    assert_eq!(plugin.preparer().prepared().len(), 2);
    assert_eq!(
        prepare(&mut v1, claim("team", "train-60", uid_a))
            .await
            .expect("after restart"),
        devices_a
    );
    assert_eq!(
        unprepare(&mut v1, claim("team", "train-60", uid_a)).await,
        ""
    );
    assert!(
        !plugin
            .preparer()
            .allocation_dir(&format!("{uid_a}-gpu"))
            .exists()
    );
    assert!(
        !kubelet
            .path("cdi")
            .join(format!("vgpu-shim.io-gpu_{uid_a}-gpu.json"))
            .exists()
    );
    assert_eq!(
        unprepare(&mut v1, claim("team", "train-60", uid_a)).await,
        "",
        "twice is fine"
    );
    assert_eq!(
        unprepare(&mut v1, claim("team", "never", "no-such-uid")).await,
        "",
        "unknown is fine"
    );
    let checkpoint =
        vgpu_dra::checkpoint::Checkpoint::load(&config.state_file()).expect("checkpoint");
    assert_eq!(checkpoint.claims.keys().collect::<Vec<_>>(), vec![uid_b]);
    // A claim the plugin never saw cannot be prepared while the API server is away.
    let err = prepare(&mut v1, claim("team", "train-60", uid_a))
        .await
        .expect_err("API down");
    assert!(err.contains("ResourceClaim team/train-60"), "{err}");
    server.set_down(false);

    // The registration socket goes (kubelet's folder wiped): it is served again and
    // the plugin watcher registers it again.
    let socket = config.registration_socket();
    std::fs::remove_file(&socket).expect("remove");
    for _ in 0..100 {
        if socket.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    kubelet.register().await;
    assert_eq!(plugin.registration().accepted.load(Ordering::Relaxed), 2);
    assert_eq!(
        unprepare(&mut v1, claim("team", "infer-50", uid_b)).await,
        ""
    );
    assert!(plugin.preparer().prepared().is_empty());
    plugin.stop().await;
    assert!(!config.registration_socket().exists() && !config.dra_socket().exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unhealthy_card_is_tainted_and_recovers() {
    let server = StandInApiServer::start().await.expect("stand-in");
    let kubelet = TestKubelet::new();
    let source = Arc::new(FakeSource::uniform(2, 16 * GIB));
    let plugin = vgpu_dra::start(
        kubelet.config(&server.url()),
        source.clone(),
        Arc::new(NoDetails),
    )
    .await
    .expect("start");
    wait_slices(&server, |s| {
        s.len() == 1 && s[0]["spec"]["pool"]["generation"] == 1
    })
    .await;
    source.fail("GPU-fake-1", "fell off the bus");
    let slices = wait_slices(&server, |s| {
        s.len() == 1 && s[0]["spec"]["pool"]["generation"] == 2
    })
    .await;
    let devices = &slices[0]["spec"]["devices"];
    assert!(devices[0].get("taints").is_none());
    assert_eq!(devices[1]["taints"][0]["key"], "gpu.vgpu-shim.io/unhealthy");
    assert_eq!(devices[1]["taints"][0]["effect"], "NoSchedule");
    // The scheduler stops placing on it.
    let mut scheduler = Scheduler::default();
    let parsed = parsed_slices(&slices);
    assert_eq!(
        scheduler.place(&parsed, Some(60), None).map(|p| p.device),
        Some("gpu-0".into())
    );
    assert_eq!(scheduler.place(&parsed, Some(60), None), None);
    source.recover("GPU-fake-1");
    let slices = wait_slices(&server, |s| {
        s.len() == 1 && s[0]["spec"]["pool"]["generation"] == 3
    })
    .await;
    assert!(slices[0]["spec"]["devices"][1].get("taints").is_none());
    plugin.stop().await;
}

/// The DaemonSet's readiness (`/healthz`) waits for kubelet's plugin watcher: a pod
/// with a claim of ours that reaches kubelet before the driver is registered fails ("DRA
/// driver ... is not registered") and is retried only after a back-off of about a
/// minute (seen on the real cluster: 82 s before c60 ran). Once registered it is ready
/// at once, not a tick later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_only_once_kubelet_registered_the_driver() {
    let server = StandInApiServer::start().await.expect("stand-in");
    let kubelet = TestKubelet::new();
    let config = vgpu_dra::DraConfig {
        // A tick no test waits for: readiness follows the registration itself.
        registration_watch_interval_ms: 600_000,
        ..kubelet.config(&server.url())
    };
    let plugin = vgpu_dra::start(
        config,
        Arc::new(FakeSource::uniform(1, 16 * GIB)),
        Arc::new(NoDetails),
    )
    .await
    .expect("start");
    let address = plugin.metrics_address().expect("metrics served");
    let (code, body) = http_get(address, "/healthz").expect("healthz");
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("registration socket: not registered with kubelet"),
        "{body}"
    );
    kubelet.register().await;
    let mut answers = Vec::new();
    for _ in 0..100 {
        let answer = http_get(address, "/healthz").expect("healthz");
        let ready = answer.0 == 200;
        answers.push(answer);
        if ready {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        answers.last().map(|(code, _)| *code),
        Some(200),
        "{answers:?}"
    );
    plugin.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_to_start_beside_the_device_plugin() {
    let server = StandInApiServer::start().await.expect("stand-in");
    let kubelet = TestKubelet::new();
    let config = kubelet.config(&server.url());
    // A stale socket file nobody serves is no obstacle…
    let socket = kubelet.path("device-plugins/vgpu-vcuda-core.sock");
    drop(std::os::unix::net::UnixListener::bind(&socket).expect("bind"));
    let plugin = vgpu_dra::start(
        config.clone(),
        Arc::new(FakeSource::uniform(1, 8 * GIB)),
        Arc::new(NoDetails),
    )
    .await
    .expect("a dead socket does not count");
    plugin.stop().await;
    // …a live one is.
    std::fs::remove_file(&socket).expect("rm");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).expect("bind");
    let err = vgpu_dra::start(
        config,
        Arc::new(FakeSource::uniform(1, 8 * GIB)),
        Arc::new(NoDetails),
    )
    .await
    .err()
    .expect("refused")
    .to_string();
    assert!(
        err.contains("never run on one node") && err.contains("vgpu-vcuda-core.sock"),
        "{err}"
    );
}
