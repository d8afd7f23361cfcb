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

fn assert_root() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "vgpu run needs root here");
}

#[test]
fn a_run_with_mps_starts_its_cards_daemon_and_is_its_client_at_its_share() {
    assert_root();
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
    assert_root();
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
    assert_root();
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
