//! Daemon supervision against a STAND-IN control daemon (`tests/fake/nvidia-cuda-mps-control`,
//! a shell script that is not MPS: it only behaves like the control daemon where the
//! supervisor looks). Start, health, crash → clean restart, hang → restart, stop, the
//! pipe and shm folders' cleanup, a leftover daemon of an earlier run, and a daemon that
//! cannot start.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use vgpu_mps::daemon::DaemonOptions;
use vgpu_mps::{CardDaemon, CardDirs, DaemonHealth, Supervisor};

const CARD: &str = "GPU-11111111-2222-4333-8444-555555555555";

fn fake() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake/nvidia-cuda-mps-control")
}

/// Whether this process may give the daemon a private `/dev/shm` (`CAP_SYS_ADMIN`).
fn may_mount() -> bool {
    vgpu_contract::process::holds_cap_sys_admin()
}

fn options(control: PathBuf) -> DaemonOptions {
    let mut options = DaemonOptions::new(control);
    // The private /dev/shm needs CAP_SYS_ADMIN; without it that part is not tested.
    options.private_shm = may_mount();
    options
}

/// Alive and not a zombie (an orphan's zombie may never be reaped in a container).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            stat.rsplit_once(") ")
                .map(|(_, rest)| !rest.starts_with('Z'))
        })
        .unwrap_or(false)
}

fn daemon_pid(dirs: &CardDirs) -> Option<u32> {
    std::fs::read_to_string(dirs.pipe.join("nvidia-cuda-mps-control.pid"))
        .ok()
        .and_then(|text| text.trim().parse().ok())
}

fn log_of(dirs: &CardDirs) -> String {
    std::fs::read_to_string(dirs.log.join("control.log")).unwrap_or_default()
}

/// The `key=value` of the last start line of the log.
fn last_start(dirs: &CardDirs, key: &str) -> String {
    log_of(dirs)
        .lines()
        .rev()
        .find(|line| line.starts_with("start "))
        .and_then(|line| {
            line.split_whitespace()
                .find_map(|field| field.strip_prefix(&format!("{key}=")).map(str::to_string))
        })
        .unwrap_or_default()
}

fn wait_for(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_card_daemon_starts_with_its_own_folders_answers_and_stops_clean() {
    let root = tempfile::tempdir().expect("tempdir");
    let dirs = CardDirs::new(root.path(), CARD);
    let mut daemon = CardDaemon::new(CARD, dirs.clone(), options(fake()));
    daemon.start().expect("starts");
    assert_eq!(
        last_start(&dirs, "visible"),
        CARD,
        "CUDA_VISIBLE_DEVICES is the card"
    );
    if may_mount() {
        use std::os::unix::fs::MetadataExt;
        let inode = std::fs::metadata(&dirs.shm).expect("shm").ino();
        assert_eq!(
            last_start(&dirs, "shm_inode"),
            inode.to_string(),
            "the daemon's /dev/shm is the card's shm folder"
        );
    }
    let server: u32 = last_start(&dirs, "server").parse().expect("server pid");
    assert_eq!(daemon.check(), DaemonHealth::Running(vec![server]));
    assert!(alive(server));
    std::fs::write(dirs.shm.join("cuda.shm.0"), b"x").expect("a client's shm file");
    daemon.stop();
    assert!(log_of(&dirs).contains("quit pid="), "stopped through quit");
    assert!(
        entries(&dirs.pipe).is_empty(),
        "pipe folder emptied: {:?}",
        entries(&dirs.pipe)
    );
    assert!(entries(&dirs.shm).is_empty(), "shm folder emptied");
    assert!(dirs.pipe.is_dir(), "the folder stays: it is a mount source");
    wait_for("the server to go", Duration::from_secs(10), || {
        !alive(server)
    });
    assert_eq!(daemon.check(), DaemonHealth::Stopped);
}

#[test]
fn a_crashed_daemon_is_restarted_with_a_clean_pipe_folder_and_its_servers_gone() {
    let root = tempfile::tempdir().expect("tempdir");
    let dirs = CardDirs::new(root.path(), CARD);
    let daemon = CardDaemon::new(CARD, dirs.clone(), options(fake()));
    let mut supervisor =
        Supervisor::start(vec![daemon], Duration::from_millis(100)).expect("supervisor");
    let states = supervisor.states();
    let ok = || {
        states
            .lock()
            .expect("states")
            .get(CARD)
            .is_some_and(Result::is_ok)
    };
    wait_for("the first start", Duration::from_secs(20), ok);
    let first = daemon_pid(&dirs).expect("pid file");
    let server: u32 = last_start(&dirs, "server").parse().expect("server pid");
    std::fs::write(dirs.pipe.join("stale-client-pipe"), b"").expect("stale entry");
    // SAFETY: kill(2) of the stand-in daemon this test started.
    unsafe { libc::kill(first as i32, libc::SIGKILL) };
    wait_for("a new daemon", Duration::from_secs(20), || {
        daemon_pid(&dirs).is_some_and(|pid| pid != first) && ok()
    });
    assert!(
        !dirs.pipe.join("stale-client-pipe").exists(),
        "the dead daemon's pipe folder was emptied before the restart"
    );
    wait_for(
        "the dead daemon's server to go",
        Duration::from_secs(10),
        || !alive(server),
    );
    assert_eq!(log_of(&dirs).matches("start pid=").count(), 2);
    supervisor.stop();
    let last = daemon_pid(&dirs);
    assert_eq!(last, None, "stopped: no pid file left");
    assert!(entries(&dirs.pipe).is_empty());
    let state = states
        .lock()
        .expect("states")
        .get(CARD)
        .cloned()
        .expect("state");
    assert!(state.expect_err("down after stop").contains("stopped"));
}

#[test]
fn a_hung_daemon_is_restarted_after_three_unanswered_checks() {
    let root = tempfile::tempdir().expect("tempdir");
    let dirs = CardDirs::new(root.path(), CARD);
    let mut options = options(fake());
    options.query_timeout = Duration::from_millis(500);
    let daemon = CardDaemon::new(CARD, dirs.clone(), options);
    let mut supervisor =
        Supervisor::start(vec![daemon], Duration::from_millis(100)).expect("supervisor");
    let states = supervisor.states();
    wait_for("the first start", Duration::from_secs(20), || {
        states
            .lock()
            .expect("states")
            .get(CARD)
            .is_some_and(Result::is_ok)
    });
    let first = daemon_pid(&dirs).expect("pid file");
    std::fs::write(dirs.pipe.join(".hang"), b"").expect("hang");
    wait_for("a new daemon", Duration::from_secs(30), || {
        daemon_pid(&dirs).is_some_and(|pid| pid != first)
    });
    assert!(!alive(first), "the hung daemon was killed");
    supervisor.stop();
}

#[test]
fn a_daemon_that_cannot_start_marks_its_card_down_and_is_retried() {
    let root = tempfile::tempdir().expect("tempdir");
    let failing = root.path().join("nvidia-cuda-mps-control");
    std::fs::write(&failing, "#!/bin/sh\necho 'no GPU for MPS' >&2\nexit 3\n").expect("script");
    Command::new("chmod")
        .arg("+x")
        .arg(&failing)
        .status()
        .expect("chmod");
    let dirs = CardDirs::new(root.path(), CARD);
    let mut daemon = CardDaemon::new(CARD, dirs.clone(), options(failing.clone()));
    let err = daemon.start().expect_err("exits at start");
    assert!(
        err.contains("exited at start") && err.contains("no GPU for MPS"),
        "{err}"
    );
    let missing = CardDaemon::new(CARD, dirs, options(root.path().join("absent")));
    let mut supervisor =
        Supervisor::start(vec![missing], Duration::from_millis(100)).expect("supervisor");
    let states = supervisor.states();
    wait_for("the failure to show", Duration::from_secs(10), || {
        states
            .lock()
            .expect("states")
            .get(CARD)
            .is_some_and(|state| state.as_ref().is_err_and(|e| e.contains("cannot start")))
    });
    supervisor.stop();
}

#[test]
fn a_daemon_an_earlier_run_left_is_killed_before_a_new_one_starts() {
    let root = tempfile::tempdir().expect("tempdir");
    let dirs = CardDirs::new(root.path(), CARD);
    for dir in [&dirs.pipe, &dirs.log, &dirs.shm] {
        std::fs::create_dir_all(dir).expect("mkdir");
    }
    let mut leftover = {
        use std::os::unix::process::CommandExt;
        Command::new(fake())
            .arg("-f")
            .env("CUDA_MPS_PIPE_DIRECTORY", &dirs.pipe)
            .env("CUDA_MPS_LOG_DIRECTORY", &dirs.log)
            .process_group(0)
            .spawn()
            .expect("leftover daemon")
    };
    wait_for("the leftover's pid file", Duration::from_secs(10), || {
        daemon_pid(&dirs).is_some()
    });
    let mut daemon = CardDaemon::new(CARD, dirs.clone(), options(fake()));
    daemon.start().expect("starts");
    let mut status = None;
    wait_for("the leftover to be killed", Duration::from_secs(10), || {
        status = leftover.try_wait().expect("try_wait");
        status.is_some()
    });
    let status = status.expect("exited");
    assert!(!status.success(), "the leftover was killed: {status}");
    assert_eq!(
        daemon_pid(&dirs),
        daemon.pid(),
        "the pid file is the new daemon's"
    );
    daemon.stop();
}

#[test]
fn a_daemon_handle_that_never_started_leaves_a_running_daemons_folders_alone() {
    let root = tempfile::tempdir().expect("tempdir");
    let dirs = CardDirs::new(root.path(), CARD);
    let mut running = CardDaemon::new(CARD, dirs.clone(), options(fake()));
    running.start().expect("starts");
    {
        let joined = CardDaemon::new(CARD, dirs.clone(), options(fake()));
        assert!(
            joined.query("get_server_list").is_ok(),
            "joins the running daemon"
        );
    }
    assert!(
        dirs.pipe.join("control").exists() && daemon_pid(&dirs) == running.pid(),
        "dropping a handle that started nothing stops and empties nothing"
    );
    assert!(matches!(running.check(), DaemonHealth::Running(_)));
    running.stop();
}
