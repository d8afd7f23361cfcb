//! A real container started through the CDI spec of a prepared claim: the DRA plugin
//! prepares a claim of 30 cores and 2560MiB (the example ResourceClaimTemplate's) on
//! one of four sim GPUs, and `podman run --device vgpu-shim.io/gpu=<claim uid>-gpu`
//! starts a container whose only GPU wiring is that spec. Inside, `vgpu probe` and
//! pynvml must see one card, the claim's card, with 2560MiB, through the shims.
//!
//! Needs root, podman (Debian's 4.3 reads specs only from /etc/cdi and /var/run/cdi, so
//! the spec goes to /var/run/cdi, under a name unique to this test run), runc, the
//! built shims, sim and `vgpu`, and python3 with pynvml. A missing prerequisite fails
//! the test in CI and skips it elsewhere (vgpu-test-support's policy). The host's `/` is the
//! container's read-only lower layer (`--rootfs /:O`).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use common::*;
use vgpu_dra::cards::NvmlDetails;
use vgpu_kube::standin::StandInApiServer;
use vgpu_node_agent::devices::{DeviceSource, NvmlSource};
use vgpu_test_support::{Need, require};

/// Checks the prerequisites (by the one policy: skip outside CI, fail in CI); python3's
/// executable when all are there.
fn prerequisites() -> Option<PathBuf> {
    require!(return None;
        Need::Root,
        Need::program("podman", "apt-get install podman"),
        Need::program("runc", "apt-get install runc"),
        Need::Python(&["pynvml"]),
        Need::Built("libcuda_shim.so"),
        Need::Built("libnvml_shim.so"),
        Need::Built("libvgpu_sim.so"),
        Need::Built("vgpu"),
    );
    let python = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3 runs: checked");
    Some(PathBuf::from(
        String::from_utf8_lossy(&python.stdout).trim(),
    ))
}

/// A prepared driver folder as `vgpu-ldconfig prepare` leaves it, with the sim as the
/// real driver.
fn driver_folder(kubelet: &TestKubelet) {
    let lib = kubelet.path("driver/lib64");
    let shim = kubelet.path("driver/shim");
    for dir in [&lib, &shim] {
        std::fs::create_dir_all(dir).expect("mkdir");
    }
    for name in ["libcuda.so.1", "libnvidia-ml.so.1"] {
        std::fs::copy(built("libvgpu_sim.so").expect("checked"), lib.join(name)).expect("copy sim");
    }
    for name in ["libcuda_shim.so", "libnvml_shim.so"] {
        std::fs::copy(built(name).expect("checked"), shim.join(name)).expect("copy shim");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_podman_container_runs_through_the_claims_cdi_spec() {
    let Some(python) = prerequisites() else {
        return;
    };
    let Some(sim) = sim_library() else { return };
    let server = StandInApiServer::start().await.expect("stand-in");
    let kubelet = TestKubelet::new();
    driver_folder(&kubelet);
    let mut config = kubelet.config(&server.url());
    config.cdi_dir = PathBuf::from("/var/run/cdi");
    let source: Arc<dyn DeviceSource> = Arc::new(NvmlSource::open(&sim).expect("NVML"));
    let cards = source.discover().expect("cards");
    let plugin = vgpu_dra::start(
        config,
        source,
        Arc::new(NvmlDetails::open(&sim).expect("details")),
    )
    .await
    .expect("start");
    let info = kubelet.register().await;
    let slices = wait_slices(&server, |s| s.len() == 1).await;

    // Two claims already hold most of gpu-0 and gpu-1; the example claim lands on gpu-2.
    let mut scheduler = Scheduler::default();
    let parsed = parsed_slices(&slices);
    scheduler.place(&parsed, Some(90), None).expect("first");
    scheduler.place(&parsed, Some(90), None).expect("second");
    let placement = scheduler
        .place(&parsed, Some(30), Some(2560 << 20))
        .expect("example");
    assert_eq!(placement.device, "gpu-2");
    let uid = format!("{:08x}-cdi0-4000-8000-{:012x}", std::process::id(), 0x2560);
    server.put_claim(allocated_claim(
        "default",
        "vcuda-example-gpu",
        &uid,
        "gpu",
        &placement,
        ("vcuda-example", "pod-e"),
    ));
    server.put_pod(pod("default", "vcuda-example", "pod-e", Some("50")));
    let mut v1 = kubelet.v1(&info.endpoint).await;
    let devices = prepare(&mut v1, claim("default", "vcuda-example-gpu", &uid))
        .await
        .expect("prepare");
    let cdi = devices[0].cdi_device_ids[0].clone();
    assert_eq!(cdi, format!("vgpu-shim.io/gpu={uid}-gpu"));

    let conf = kubelet.path("containers.conf");
    std::fs::write(
        &conf,
        "[containers]\ndefault_ulimits = []\n[engine]\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\nruntime = \"runc\"\n",
    )
    .expect("containers.conf");
    let script = format!(
        "{vgpu} probe --json --alloc 1GiB --alloc 2GiB | tail -n 1; \
         {python} -c 'import pynvml; pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0); \
         u = pynvml.nvmlDeviceGetUUID(h); u = u.decode() if isinstance(u, bytes) else u; \
         print(\"NVML\", pynvml.nvmlDeviceGetCount(), u, pynvml.nvmlDeviceGetMemoryInfo(h).total)'; \
         grep -E \"container_id|core_\" /etc/vgpu/vgpu.yaml",
        vgpu = built("vgpu").expect("checked").display(),
        python = python.display(),
    );
    let output = Command::new("timeout")
        .arg("120")
        .arg("podman")
        .arg("--root")
        .arg(kubelet.path("podman/storage"))
        .arg("--runroot")
        .arg(kubelet.path("podman/run"))
        .args([
            "run",
            "--rm",
            "--network",
            "none",
            "--security-opt",
            "label=disable",
        ])
        .args(["--device", &cdi])
        .args([
            "-e",
            &format!("VGPU_SIM_GPUS={GPUS}"),
            "-e",
            "VGPU_SIM_STATE=/tmp/sim.state",
        ])
        .args(["--rootfs", "/:O", "/bin/sh", "-c", &script])
        .env("CONTAINERS_CONF", &conf)
        .output()
        .expect("podman");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let unprepared = unprepare(&mut v1, claim("default", "vcuda-example-gpu", &uid)).await;
    plugin.stop().await;
    assert!(output.status.success(), "podman failed: {stdout}\n{stderr}");
    assert_eq!(unprepared, "");
    assert!(!Path::new(&format!("/var/run/cdi/vgpu-shim.io-gpu_{uid}-gpu.json")).exists());

    let probe: serde_json::Value = serde_json::from_str(stdout.lines().next().unwrap_or("{}"))
        .unwrap_or_else(|err| panic!("no probe JSON ({err}): {stdout}\n{stderr}"));
    assert_eq!(probe["device_count"], 1, "{stdout}");
    assert_eq!(probe["devices"][0]["total_mem"], 2560u64 << 20, "{stdout}");
    assert_eq!(
        probe["allocations"][0]["result"], "CUDA_SUCCESS",
        "{stdout}"
    );
    assert_eq!(
        probe["allocations"][1]["result"], "CUDA_ERROR_OUT_OF_MEMORY",
        "{stdout}"
    );
    let nvml = format!("NVML 1 {} {}", cards[2].uuid, 2560u64 << 20);
    assert!(
        stdout.lines().any(|line| line == nvml),
        "want `{nvml}` in {stdout}"
    );
    assert!(
        stdout.contains(&format!("container_id: {uid}-gpu")),
        "{stdout}"
    );
    assert!(
        stdout.contains("core_limit: 30")
            && stdout.contains("core_mode: soft")
            && stdout.contains("core_ceiling: 50"),
        "{stdout}"
    );
}
