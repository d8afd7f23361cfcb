//! `vgpu run --mps` and `vgpu mps` over the simulated driver and a STAND-IN MPS control
//! daemon (`mps/tests/fake/nvidia-cuda-mps-control`, a shell script put first on PATH:
//! it is not MPS, it only answers like the control daemon). A run starts the card's
//! daemon when none answers, gives its command the client env (pipe folder, thread
//! percentage from --cores, memory limit from --memory, no CUDA_VISIBLE_DEVICES), the
//! card's shm folder as /dev/shm, a quota without the time limiter, and stops the daemon
//! at the end; a run beside `vgpu mps` joins that daemon and leaves it running.
//!
//! Needs root (vgpu run's mount namespace) and the shims and the sim driver built
//! (`cargo test --workspace` builds them).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn fake_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../mps/tests/fake")
}

fn path_with_fake() -> String {
    format!(
        "{}:{}",
        fake_dir().display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// Prints what the command sees: its MPS env, its /dev/shm inode and its quota.
const PROBE: &str = "env | grep -E '^CUDA_(MPS|VISIBLE)' | sort; echo shm_inode=$(stat -c %i /dev/shm); cat \"$VGPU_CONFIG\"";

fn run_mps(dir: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vgpu"))
        .args(["run", "--simulate", "--mps", "--mps-dir"])
        .arg(dir.join("mps"))
        .args(extra)
        .args(["--", "sh", "-c", PROBE])
        .env("PATH", path_with_fake())
        .env("CUDA_VISIBLE_DEVICES", "3")
        .env("VGPU_HOST_DIR", dir.join("host"))
        .env("VGPU_SIM_STATE", dir.join("sim-state"))
        .env_remove("VGPU_CONFIG")
        .output()
        .expect("run vgpu")
}

fn log_of(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("mps/0/log/control.log")).unwrap_or_default()
}

#[test]
fn a_run_with_mps_starts_its_cards_daemon_and_is_its_client_at_its_share() {
    // The card's daemon gets a private /dev/shm only where the run may mount.
    vgpu_test_support::require!(vgpu_test_support::Need::Root);
    let dir = tempfile::tempdir().expect("tempdir");
    let output = run_mps(dir.path(), &["--cores", "30", "--memory", "2GiB"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let pipe = dir.path().join("mps/0/pipe");
    for wanted in [
        format!("CUDA_MPS_PIPE_DIRECTORY={}", pipe.display()),
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30".to_string(),
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2048M".to_string(),
    ] {
        assert!(
            stdout.lines().any(|line| line == wanted),
            "{wanted} missing:\n{stdout}"
        );
    }
    assert!(
        !stdout.contains("CUDA_VISIBLE_DEVICES"),
        "an MPS client sees its daemon's card as device 0: {stdout}"
    );
    let shm = std::fs::metadata(dir.path().join("mps/0/shm"))
        .expect("shm")
        .ino();
    assert!(
        stdout.contains(&format!("shm_inode={shm}")),
        "/dev/shm is the card's shm folder, shared with the daemon:\n{stdout}"
    );
    assert!(stdout.contains("memory_limit: 2GiB"), "{stdout}");
    assert!(
        !stdout.contains("core_limit"),
        "compute is left to MPS:\n{stdout}"
    );
    let log = log_of(dir.path());
    assert!(log.contains("visible=0 "), "{log}");
    // vgpu run's PID namespace is gone by then (no control client can fork): SIGTERM.
    assert!(
        log.contains("term pid="),
        "the run's own daemon is stopped: {log}"
    );
    let left: Vec<_> = std::fs::read_dir(dir.path().join("mps/0/pipe"))
        .expect("pipe")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "pipe folder emptied: {left:?}");
}

#[test]
fn a_run_with_mps_limiter_keeps_the_time_limiter() {
    // The card's daemon gets a private /dev/shm only where the run may mount.
    vgpu_test_support::require!(vgpu_test_support::Need::Root);
    let dir = tempfile::tempdir().expect("tempdir");
    let output = run_mps(dir.path(), &["--cores", "40", "--mps-limiter"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    assert!(stdout.contains("core_limit: 40"), "{stdout}");
    assert!(
        stdout.contains("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40"),
        "{stdout}"
    );
    assert!(
        !stdout.contains("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"),
        "no --memory: {stdout}"
    );
}

#[test]
fn runs_join_the_daemon_vgpu_mps_keeps_and_leave_it_running() {
    // The card's daemon gets a private /dev/shm only where the run may mount.
    vgpu_test_support::require!(vgpu_test_support::Need::Root);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut keeper = Command::new(env!("CARGO_BIN_EXE_vgpu"))
        .args(["mps", "--card", "0", "--interval", "1", "--dir"])
        .arg(dir.path().join("mps"))
        .arg("--control")
        .arg(fake_dir().join("nvidia-cuda-mps-control"))
        .stderr(Stdio::piped())
        .spawn()
        .expect("vgpu mps");
    let pid_file = dir.path().join("mps/0/pipe/nvidia-cuda-mps-control.pid");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !pid_file.exists() {
        assert!(
            Instant::now() < deadline,
            "vgpu mps never started the daemon"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for cores in ["20", "50"] {
        let output = run_mps(dir.path(), &["--cores", cores]);
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let log = log_of(dir.path());
    assert_eq!(
        log.matches("start pid=").count(),
        1,
        "both runs joined: {log}"
    );
    assert!(
        !log.contains("quit"),
        "the runs left the daemon running: {log}"
    );
    assert!(pid_file.exists());
    // SAFETY: kill(2) of the vgpu mps this test started.
    unsafe { libc::kill(keeper.id() as i32, libc::SIGTERM) };
    let status = keeper.wait().expect("vgpu mps exits");
    assert!(status.success(), "{status}");
    assert!(
        log_of(dir.path()).contains("quit pid="),
        "stopped on SIGTERM"
    );
    assert!(!pid_file.exists());
}

/// NVML inside an MPS run lists the container's process and what it holds (the H200's
/// MPS section once read 0 MiB there: its inner loop never saw the marker, so it looked
/// after the holder had exited; this checks the view itself on the run's MPS path).
#[test]
fn nvml_inside_an_mps_run_shows_the_containers_process_and_its_memory() {
    vgpu_test_support::require!(vgpu_test_support::Need::Root);
    vgpu_test_support::require!(vgpu_test_support::Need::Python(&[
        "cuda.bindings.driver",
        "pynvml"
    ]));
    let dir = tempfile::tempdir().expect("tempdir");
    let marker = dir.path().join("holder.pid");
    let client = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/clients/cuda_check.py");
    let view = "import json, pynvml; pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0); \
         m = pynvml.nvmlDeviceGetMemoryInfo(h); \
         print('RESULT ' + json.dumps({'total': m.total, 'used': m.used, \
         'pids': [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]}))";
    let script = format!(
        "python3 {client} hold 512 30 {marker} >/dev/null & \
         while [ ! -s {marker} ]; do sleep 0.05; done; python3 -c \"{view}\"; kill $!",
        client = client.display(),
        marker = marker.display(),
    );
    let output = Command::new(env!("CARGO_BIN_EXE_vgpu"))
        .args(["run", "--simulate", "--mps", "--mps-dir"])
        .arg(dir.path().join("mps"))
        .args([
            "--cores", "50", "--memory", "2GiB", "--", "bash", "-c", &script,
        ])
        .env("PATH", path_with_fake())
        .env("VGPU_HOST_DIR", dir.path().join("host"))
        .env("VGPU_SIM_STATE", dir.path().join("sim-state"))
        .env_remove("VGPU_CONFIG")
        .output()
        .expect("run vgpu");
    let line = vgpu_test_support::result_line(&output);
    let holder: u64 = std::fs::read_to_string(&marker)
        .expect("marker")
        .trim()
        .parse()
        .expect("pid");
    let result: serde_json::Value = serde_json::from_str(&line).expect("RESULT json");
    assert_eq!(
        result["total"],
        2u64 << 30,
        "the quota is the total: {result}"
    );
    assert!(
        result["used"].as_u64().expect("used") >= 512 << 20,
        "the holder's 512 MiB is used: {result}"
    );
    assert_eq!(
        result["pids"],
        serde_json::json!([holder]),
        "the holder is the process listed: {result}"
    );
}
