//! One MPS control daemon per card, supervised.
//!
//! [`CardDaemon`] runs `nvidia-cuda-mps-control -f` (foreground: it is our child, so its
//! death is seen at once) for one card: `CUDA_VISIBLE_DEVICES` is the card's UUID (or
//! nvidia-smi's index: `CUDA_DEVICE_ORDER=PCI_BUS_ID`),
//! `CUDA_MPS_PIPE_DIRECTORY` and `CUDA_MPS_LOG_DIRECTORY` are folders of its own
//! ([`CardDirs`]), its `/dev/shm` is the card's shm folder (a mount namespace of its own,
//! `spawn`), and it leads a process group that the MPS servers it starts join.
//!
//! * start: whatever an earlier daemon of the card left is killed (its process group)
//!   and its pipe and shm folders are emptied, then the daemon starts and must answer
//!   `get_server_list` within the ready timeout;
//! * health: the child must be alive and answer `get_server_list`; three unanswered
//!   checks in a row count as hung (one slow answer under load must not cost every
//!   client of the card its server);
//! * stop: `quit` (SIGTERM when no control client can run), up to 5 s for the daemon to
//!   leave, then SIGKILL to its process group (servers included), and the pipe and shm
//!   folders emptied.
//!
//! [`Supervisor`] keeps a set of card daemons running on a thread of its own: it
//! starts each, checks each every `health_interval`, restarts a dead or hung one (backing
//! off from 1 s to 30 s while starts keep failing), publishes each card's state for the
//! health probes, and stops them all on [`Supervisor::stop`] or drop.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Unanswered checks in a row that make a live daemon count as hung.
const HUNG_AFTER: u32 = 3;
/// How long `quit` may take before the process group is killed.
const QUIT_GRACE: Duration = Duration::from_secs(5);
/// The control daemon's own record of its PID, in the pipe folder.
const PID_FILE: &str = "nvidia-cuda-mps-control.pid";
/// The longest wait between two restarts of a card whose daemon keeps failing.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// The folders of one card's daemon: `<root>/<uuid>/{pipe,log,shm}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CardDirs {
    /// `CUDA_MPS_PIPE_DIRECTORY`: the control socket, the servers' pipes (mounted into
    /// the card's containers).
    pub pipe: PathBuf,
    /// `CUDA_MPS_LOG_DIRECTORY`: `control.log`, `server.log`, and `daemon.out` (the
    /// daemon's own stdout and stderr).
    pub log: PathBuf,
    /// The daemon's `/dev/shm` (mounted at `/dev/shm` in the card's containers).
    pub shm: PathBuf,
}

impl CardDirs {
    /// The folders of card `uuid` under `root`.
    pub fn new(root: &Path, uuid: &str) -> CardDirs {
        let card = root.join(uuid);
        CardDirs {
            pipe: card.join("pipe"),
            log: card.join("log"),
            shm: card.join("shm"),
        }
    }
}

/// How the daemons are run.
#[derive(Clone, Debug)]
pub struct DaemonOptions {
    /// The `nvidia-cuda-mps-control` binary; its folder goes first on the daemon's
    /// `PATH` (the daemon finds `nvidia-cuda-mps-server` there).
    pub control: PathBuf,
    /// `LD_LIBRARY_PATH` of the daemon and its servers: the real driver's folder.
    pub library_path: Option<PathBuf>,
    /// Start with `--multiuser-server` (`-M`, driver 580's multi-user mode).
    pub multiuser: bool,
    /// Give the daemon the card's shm folder as `/dev/shm` (needs CAP_SYS_ADMIN).
    pub private_shm: bool,
    /// How long one control command may take.
    pub query_timeout: Duration,
    /// How long a new daemon has to answer its first command.
    pub ready_timeout: Duration,
}

impl DaemonOptions {
    /// Options for `control` with the production timeouts (5 s per command, 15 s to
    /// come up), private shm, single-user.
    pub fn new(control: PathBuf) -> DaemonOptions {
        DaemonOptions {
            control,
            library_path: None,
            multiuser: false,
            private_shm: true,
            query_timeout: Duration::from_secs(5),
            ready_timeout: Duration::from_secs(15),
        }
    }
}

/// What a health check found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DaemonHealth {
    /// Alive and answering; the servers it lists.
    Running(Vec<u32>),
    /// Alive, but this many checks in a row went unanswered (the last error).
    NotAnswering(u32, String),
    /// The process is gone.
    Died(String),
    /// Never started, or stopped.
    Stopped,
}

/// The daemon of one card.
#[derive(Debug)]
pub struct CardDaemon {
    uuid: String,
    dirs: CardDirs,
    options: DaemonOptions,
    child: Option<Child>,
    /// The process group of the last daemon started (its PID), killed before the next.
    group: Option<i32>,
    unanswered: u32,
    starts: u32,
}

impl CardDaemon {
    /// The daemon of card `uuid` in `dirs`; nothing runs until [`CardDaemon::start`].
    pub fn new(uuid: &str, dirs: CardDirs, options: DaemonOptions) -> CardDaemon {
        CardDaemon {
            uuid: uuid.to_string(),
            dirs,
            options,
            child: None,
            group: None,
            unanswered: 0,
            starts: 0,
        }
    }

    /// The card's UUID.
    pub fn uuid(&self) -> &str {
        &self.uuid
    }

    /// The card's folders.
    pub fn dirs(&self) -> &CardDirs {
        &self.dirs
    }

    /// The PID of the running daemon.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// How many times a daemon was started for this card.
    pub fn starts(&self) -> u32 {
        self.starts
    }

    /// Starts the daemon from a clean slate (see the module docs); returns once it
    /// answers. On failure nothing of it is left running.
    pub fn start(&mut self) -> Result<(), String> {
        self.stop();
        self.kill_stale();
        for dir in [&self.dirs.pipe, &self.dirs.shm] {
            empty_folder(dir);
        }
        for dir in [&self.dirs.pipe, &self.dirs.log, &self.dirs.shm] {
            std::fs::create_dir_all(dir)
                .map_err(|err| format!("cannot create {}: {err}", dir.display()))?;
            // Clients and the servers that run as their users write here (like /tmp).
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o1777))
                .map_err(|err| format!("cannot open up {}: {err}", dir.display()))?;
        }
        let out_path = self.dirs.log.join("daemon.out");
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&out_path)
            .map_err(|err| format!("cannot open {}: {err}", out_path.display()))?;
        let err_out = out
            .try_clone()
            .map_err(|err| format!("cannot open {}: {err}", out_path.display()))?;
        let mut command = self.command();
        command.arg("-f");
        if self.options.multiuser {
            command.arg("--multiuser-server");
        }
        command
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err_out)
            .process_group(0);
        if self.options.private_shm {
            crate::spawn::with_private_shm(&mut command, &self.dirs.shm)
                .map_err(|err| format!("cannot prepare the daemon's /dev/shm: {err}"))?;
        }
        let child = command.spawn().map_err(|err| {
            format!(
                "cannot start {} for {}: {err}",
                self.options.control.display(),
                self.uuid
            )
        })?;
        self.group = i32::try_from(child.id()).ok();
        self.child = Some(child);
        self.starts += 1;
        self.unanswered = 0;
        let deadline = Instant::now() + self.options.ready_timeout;
        loop {
            if let Some(status) = self.exited() {
                let tail = tail_of(&out_path);
                self.stop();
                return Err(format!(
                    "the MPS control daemon of {} exited at start ({status}): {tail}",
                    self.uuid
                ));
            }
            match self.query("get_server_list") {
                Ok(_) => {
                    tracing::info!(card = %self.uuid, pid = ?self.pid(), pipe = %self.dirs.pipe.display(), "MPS control daemon running");
                    return Ok(());
                }
                Err(err) if Instant::now() >= deadline => {
                    self.stop();
                    return Err(format!(
                        "the MPS control daemon of {} did not answer within {:?}: {err}",
                        self.uuid, self.options.ready_timeout
                    ));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// Checks the daemon (see the module docs).
    pub fn check(&mut self) -> DaemonHealth {
        if self.child.is_none() {
            return DaemonHealth::Stopped;
        }
        if let Some(status) = self.exited() {
            return DaemonHealth::Died(format!(
                "exited ({status}); {}",
                tail_of(&self.dirs.log.join("daemon.out"))
            ));
        }
        match self.query("get_server_list") {
            Ok(list) => {
                self.unanswered = 0;
                DaemonHealth::Running(
                    list.split_whitespace()
                        .filter_map(|pid| pid.parse().ok())
                        .collect(),
                )
            }
            Err(err) => {
                self.unanswered += 1;
                DaemonHealth::NotAnswering(self.unanswered, err)
            }
        }
    }

    /// Whether the daemon counts as hung (alive, three checks in a row unanswered).
    pub fn hung(&self) -> bool {
        self.unanswered >= HUNG_AFTER
    }

    /// Stops the daemon and whatever its process group holds, and empties the pipe and
    /// shm folders. Does nothing when this never started a daemon (the folders may be
    /// another's: `vgpu run --mps` joining a running daemon).
    pub fn stop(&mut self) {
        if self.child.is_none() && self.group.is_none() {
            return;
        }
        if self.child.is_some() && self.exited().is_none() {
            if self.query("quit").is_err()
                && let Some(pid) = self.pid().and_then(|pid| i32::try_from(pid).ok())
            {
                // No control client could run (`vgpu run` after its PID namespace
                // ended cannot fork): ask the daemon itself.
                // SAFETY: kill(2) of our own child; no memory is passed.
                unsafe { libc::kill(pid, libc::SIGTERM) };
            }
            let deadline = Instant::now() + QUIT_GRACE;
            while self.exited().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        if let Some(group) = self.group.take() {
            kill_group(group);
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        for dir in [&self.dirs.pipe, &self.dirs.shm] {
            empty_folder(dir);
        }
        self.unanswered = 0;
    }

    /// Kills a daemon an earlier run left in the pipe folder (its pid file names a live
    /// `nvidia-cuda-mps…` process): a second daemon on one card would split its clients.
    /// The folders are emptied by the caller.
    fn kill_stale(&self) {
        let pid_file = self.dirs.pipe.join(PID_FILE);
        let Some(pid) = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|text| text.trim().parse::<i32>().ok())
            .filter(|pid| *pid > 1)
        else {
            return;
        };
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.starts_with("nvidia-cuda-mps") {
            tracing::warn!(card = %self.uuid, pid, "killing the MPS control daemon an earlier run left");
            kill_group(pid);
            // SAFETY: kill(2) of one PID; no memory is passed.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }

    /// The exit status, once the daemon has exited (reaped here).
    fn exited(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|child| child.try_wait().ok().flatten())
    }

    /// The control binary with the card's env.
    fn command(&self) -> Command {
        let mut command = Command::new(&self.options.control);
        command
            .env("CUDA_VISIBLE_DEVICES", &self.uuid)
            // An index (`vgpu mps --card 1`) is nvidia-smi's, not CUDA's fastest-first.
            .env("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
            .env("CUDA_MPS_PIPE_DIRECTORY", &self.dirs.pipe)
            .env("CUDA_MPS_LOG_DIRECTORY", &self.dirs.log);
        if let Some(folder) = self.options.control.parent() {
            let path = std::env::var_os("PATH").unwrap_or_default();
            let mut joined = vec![folder.to_path_buf()];
            joined.extend(std::env::split_paths(&path));
            if let Ok(path) = std::env::join_paths(joined) {
                command.env("PATH", path);
            }
        }
        if let Some(libraries) = &self.options.library_path {
            command.env("LD_LIBRARY_PATH", libraries);
        }
        command
    }

    /// Sends one command to the daemon through the control client; its output, or why
    /// not (an error, or no answer within the query timeout: the client is killed).
    pub fn query(&self, line: &str) -> Result<String, String> {
        let mut command = self.command();
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let mut client = command
            .spawn()
            .map_err(|err| format!("cannot run {}: {err}", self.options.control.display()))?;
        if let Some(mut stdin) = client.stdin.take() {
            let _ = writeln!(stdin, "{line}");
        }
        let deadline = Instant::now() + self.options.query_timeout;
        let status = loop {
            match client.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                _ => {
                    if let Ok(group) = i32::try_from(client.id()) {
                        kill_group(group);
                    }
                    let _ = client.kill();
                    let _ = client.wait();
                    return Err(format!(
                        "`{line}` got no answer within {:?}",
                        self.options.query_timeout
                    ));
                }
            }
        };
        let mut out = String::new();
        let mut err = String::new();
        if let Some(mut stdout) = client.stdout.take() {
            let _ = stdout.read_to_string(&mut out);
        }
        if let Some(mut stderr) = client.stderr.take() {
            let _ = stderr.read_to_string(&mut err);
        }
        if status.success() {
            Ok(out)
        } else {
            Err(format!("`{line}` failed ({status}): {}", err.trim()))
        }
    }
}

impl Drop for CardDaemon {
    fn drop(&mut self) {
        self.stop();
    }
}

/// SIGKILL to a process group; a group that is gone already is fine.
fn kill_group(group: i32) {
    if group > 1 {
        // SAFETY: kill(2) with a negative PID signals that process group; no memory is
        // passed.
        unsafe { libc::kill(-group, libc::SIGKILL) };
    }
}

/// Removes everything inside `dir` (sockets, pipes, shm files of a dead server), keeping
/// the folder itself (it is a mount source of running containers).
fn empty_folder(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let removed = match entry.file_type() {
            Ok(kind) if kind.is_dir() => std::fs::remove_dir_all(&path),
            _ => std::fs::remove_file(&path),
        };
        if let Err(err) = removed {
            tracing::warn!(path = %path.display(), error = %err, "cannot clean up");
        }
    }
}

/// The last line of a log file, for error messages.
fn tail_of(path: &Path) -> String {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|text| {
            text.lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .map(str::to_string)
        })
        .unwrap_or_else(|| format!("nothing in {}", path.display()))
}

/// Each card's state as the supervisor last saw it: `Ok` while its daemon answers.
pub type CardStates = Arc<Mutex<BTreeMap<String, Result<(), String>>>>;

/// Keeps card daemons running on a thread of its own (see the module docs).
pub struct Supervisor {
    stop: Arc<AtomicBool>,
    states: CardStates,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Supervisor {
    /// Starts supervising `daemons`, checking each every `interval`.
    pub fn start(daemons: Vec<CardDaemon>, interval: Duration) -> std::io::Result<Supervisor> {
        let stop = Arc::new(AtomicBool::new(false));
        let states: CardStates = Arc::new(Mutex::new(
            daemons
                .iter()
                .map(|d| {
                    (
                        d.uuid.clone(),
                        Err("the MPS control daemon is starting".into()),
                    )
                })
                .collect(),
        ));
        let thread = {
            let stop = stop.clone();
            let states = states.clone();
            std::thread::Builder::new()
                .name("vgpu-mps".into())
                .spawn(move || supervise(daemons, interval, &stop, &states))?
        };
        Ok(Supervisor {
            stop,
            states,
            thread: Some(thread),
        })
    }

    /// Each card's state now.
    pub fn states(&self) -> CardStates {
        self.states.clone()
    }

    /// Stops supervising and stops every daemon (blocks until they are down).
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One card under supervision: its daemon and when to try it next.
struct Watched {
    daemon: CardDaemon,
    next: Instant,
    failures: u32,
}

fn supervise(daemons: Vec<CardDaemon>, interval: Duration, stop: &AtomicBool, states: &CardStates) {
    let now = Instant::now();
    let mut watched: Vec<Watched> = daemons
        .into_iter()
        .map(|daemon| Watched {
            daemon,
            next: now,
            failures: 0,
        })
        .collect();
    let set = |uuid: &str, state: Result<(), String>| {
        if let Ok(mut states) = states.lock() {
            states.insert(uuid.to_string(), state);
        }
    };
    while !stop.load(Ordering::SeqCst) {
        for card in &mut watched {
            if stop.load(Ordering::SeqCst) || Instant::now() < card.next {
                continue;
            }
            let uuid = card.daemon.uuid.clone();
            let restart_why = match card.daemon.check() {
                DaemonHealth::Running(_) => {
                    set(&uuid, Ok(()));
                    None
                }
                DaemonHealth::NotAnswering(count, err) if !card.daemon.hung() => {
                    tracing::warn!(card = %uuid, count, error = %err, "MPS control daemon did not answer");
                    None
                }
                DaemonHealth::NotAnswering(count, err) => {
                    Some(format!("hung ({count} checks unanswered: {err})"))
                }
                DaemonHealth::Died(why) => Some(format!("died: {why}")),
                DaemonHealth::Stopped => Some(String::new()),
            };
            if let Some(why) = restart_why {
                if !why.is_empty() {
                    tracing::warn!(card = %uuid, reason = %why, "MPS control daemon down: restarting it");
                    set(&uuid, Err(format!("the MPS control daemon {why}")));
                }
                match card.daemon.start() {
                    Ok(()) => {
                        card.failures = 0;
                        set(&uuid, Ok(()));
                    }
                    Err(err) => {
                        card.failures += 1;
                        let backoff =
                            Duration::from_secs(1 << card.failures.min(5)).min(MAX_BACKOFF);
                        tracing::error!(card = %uuid, error = %err, retry_in = ?backoff, "cannot start the MPS control daemon");
                        set(&uuid, Err(err));
                        card.next = Instant::now() + backoff;
                        continue;
                    }
                }
            }
            card.next = Instant::now() + interval;
        }
        std::thread::sleep(Duration::from_millis(20).min(interval));
    }
    for card in &mut watched {
        card.daemon.stop();
        set(
            &card.daemon.uuid,
            Err("the MPS control daemon is stopped".into()),
        );
    }
}
