//! MPS for local runs: `vgpu run --mps` makes the command a client of its card's MPS
//! control daemon (joining one that answers in `--mps-dir`, else starting one that it
//! stops when the command ends), and `vgpu mps` keeps a card's daemon running in the
//! foreground, supervised (restarted when it dies) until SIGINT or SIGTERM, for several
//! runs to share.
//!
//! A card's folders are `<mps-dir>/<card>/{pipe,log,shm}`, `<card>` as given (a host
//! index or a UUID; the daemon gets it as `CUDA_VISIBLE_DEVICES` with
//! `CUDA_DEVICE_ORDER=PCI_BUS_ID`, so an index is nvidia-smi's). As root the daemon's
//! `/dev/shm` is the card's shm folder and `vgpu run` binds the same folder over the
//! command's `/dev/shm`; otherwise (or with `VGPU_MPS_HOST_SHM` set) both use the
//! host's.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use vgpu_mps::daemon::DaemonOptions;
use vgpu_mps::{CardDaemon, CardDirs, ClientShare, Supervisor};

/// The default folder of the per-card folders.
pub const DEFAULT_DIR: &str = "/tmp/vgpu-mps";

#[derive(clap::Args)]
pub struct MpsArgs {
    /// The card: a host index or a UUID.
    #[arg(long, default_value = "0")]
    card: String,
    /// The folder of the per-card folders.
    #[arg(long, default_value = DEFAULT_DIR)]
    dir: PathBuf,
    /// The nvidia-cuda-mps-control binary (default: the first on PATH).
    #[arg(long)]
    control: Option<PathBuf>,
    /// Seconds between health checks.
    #[arg(long, default_value_t = 2)]
    interval: u64,
}

/// Set (to anything) to keep the host's `/dev/shm` for the daemon and the command.
pub const HOST_SHM_ENV: &str = "VGPU_MPS_HOST_SHM";

/// Whether the card's shm folder is the daemon's and the command's `/dev/shm`: where
/// this process may mount (`CAP_SYS_ADMIN`: root on a host, not root in an unprivileged
/// container), unless `VGPU_MPS_HOST_SHM` is set.
fn private_shm() -> bool {
    vgpu_contract::process::holds_cap_sys_admin() && std::env::var_os(HOST_SHM_ENV).is_none()
}

/// The card's folder name: the selector, checked to be one path component.
fn card_dirs(dir: &Path, card: &str) -> Result<CardDirs> {
    if card.is_empty() || card.contains('/') || card.starts_with('.') {
        bail!("--mps: `{card}` is not a card index or UUID");
    }
    Ok(CardDirs::new(dir, card))
}

fn options(control: Option<&Path>) -> DaemonOptions {
    let control = control.map(Path::to_path_buf).unwrap_or_else(|| {
        std::env::var_os("PATH")
            .into_iter()
            .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
            .map(|dir| dir.join("nvidia-cuda-mps-control"))
            .find(|candidate| candidate.is_file())
            .unwrap_or_else(|| PathBuf::from("nvidia-cuda-mps-control"))
    });
    let mut options = DaemonOptions::new(control);
    options.private_shm = private_shm();
    options
}

/// A card's daemon as `vgpu run` uses it: joined (someone else's) or owned (stopped
/// when this is dropped).
pub struct Client {
    dirs: CardDirs,
    _owned: Option<CardDaemon>,
}

impl Client {
    /// Joins the daemon of `card` under `dir`, or starts one; then sets the client env
    /// of `share` on `command`.
    pub fn connect(
        dir: &Path,
        card: &str,
        share: ClientShare,
        command: &mut Command,
    ) -> Result<Client> {
        let dirs = card_dirs(dir, card)?;
        let mut daemon = CardDaemon::new(card, dirs.clone(), options(None));
        let owned = if daemon.query("get_server_list").is_ok() {
            None
        } else {
            daemon
                .start()
                .map_err(|err| anyhow::anyhow!("--mps: {err}"))?;
            Some(daemon)
        };
        command.env_remove("CUDA_VISIBLE_DEVICES");
        for (key, value) in share.env(&dirs.pipe.to_string_lossy()) {
            command.env(key, value);
        }
        Ok(Client {
            dirs,
            _owned: owned,
        })
    }

    /// The folder to bind over the command's `/dev/shm` (see the module docs), else `None`.
    pub fn shm(&self) -> Option<&Path> {
        private_shm().then_some(self.dirs.shm.as_path())
    }
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn request_stop(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// `vgpu mps`: supervises the card's daemon until SIGINT or SIGTERM.
pub fn run(args: &MpsArgs) -> Result<()> {
    let dirs = card_dirs(&args.dir, &args.card)?;
    let daemon = CardDaemon::new(&args.card, dirs.clone(), options(args.control.as_deref()));
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(
            libc::SIGINT,
            request_stop as *const () as libc::sighandler_t,
        );
        libc::signal(
            libc::SIGTERM,
            request_stop as *const () as libc::sighandler_t,
        );
    }
    let mut supervisor = Supervisor::start(vec![daemon], Duration::from_secs(args.interval.max(1)))
        .context("cannot start the supervisor")?;
    let states = supervisor.states();
    let mut last: Option<Result<(), String>> = None;
    while !STOP.load(Ordering::SeqCst) {
        let now = states.lock().ok().and_then(|s| s.get(&args.card).cloned());
        if now != last {
            match &now {
                Some(Ok(())) => eprintln!(
                    "vgpu mps: card {} served; clients: CUDA_MPS_PIPE_DIRECTORY={}",
                    args.card,
                    dirs.pipe.display()
                ),
                Some(Err(why)) => eprintln!("vgpu mps: card {}: {why}", args.card),
                None => {}
            }
            last = now;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    supervisor.stop();
    eprintln!("vgpu mps: card {} stopped", args.card);
    Ok(())
}
