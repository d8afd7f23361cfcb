//! `vgpu run`: run one command as a container would see the GPU.
//!
//! It writes a quota config and usage region into a private work folder, enters a new
//! mount namespace (as root, or in a user namespace), binds the real driver libraries to
//! private paths (so the shims can still reach them once their public paths are
//! covered), bind-mounts the shims over every path where the dynamic loader finds
//! `libcuda.so.1` and `libnvidia-ml.so.1` (LD_LIBRARY_PATH folders and ld.so.cache
//! entries, exactly what the device plugin's mounts cover in a container), then runs the
//! command in a new PID namespace of its own, as a pod's container has (`pidns`; opt out
//! with `--host-pid`), waits for it and removes the work folder.
//!
//! The usage region is created (or, for a running container sharing `--state-dir`,
//! updated: a new quota keeps every process's usage) with file I/O only, never a
//! mapping, like the device plugin does.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sched::{CloneFlags, unshare};
use nix::unistd::{getegid, geteuid};
use vgpu_contract::region::{OpenOutcome, Region};
use vgpu_contract::{ByteSize, Config, CoreMode, DeviceQuota, OverQuota};

use crate::artifacts::{Artifacts, sim_driver_folder};

#[derive(clap::Args)]
pub struct RunArgs {
    /// Forward to the simulated driver instead of the host's real one.
    #[arg(long)]
    simulate: bool,
    /// Memory quota per device (bytes, or 4GiB, 7680MiB, ...).
    #[arg(long)]
    memory: Option<ByteSize>,
    /// Compute quota per device, percent of one card (1-100).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100))]
    cores: Option<u32>,
    /// `hard` (never above --cores) or `soft` (may use idle capacity).
    #[arg(long, default_value = "hard", value_parser = parse_core_mode)]
    core_mode: CoreMode,
    /// A device the command may use: a host index or a UUID, optionally with its own
    /// quota, e.g. `1:memory=2GiB,cores=30`. Repeat for several; default: device 0.
    #[arg(long = "device", value_name = "SEL[:memory=SIZE,cores=N]")]
    devices: Vec<String>,
    /// The real driver folder (holding libcuda.so.1 and libnvidia-ml.so.1) instead of the
    /// one the loader finds.
    #[arg(long)]
    driver_dir: Option<PathBuf>,
    /// Work folder for the config and usage region (default: a new folder under /tmp).
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Keep the work folder afterwards.
    #[arg(long)]
    keep: bool,
    /// Run the command in vgpu run's own PID namespace instead of a new one (by
    /// default it gets its own, as in a pod, and sees only its own processes).
    #[arg(long)]
    host_pid: bool,
    /// The shims write one warning line to stderr at each allocation refused at the
    /// quota (at most one a second per process), whatever VGPU_LOG says (the config's
    /// `warn_on_refusal`).
    #[arg(long)]
    warn_on_refusal: bool,
    /// What the host's backstop does when the card says the command's processes hold
    /// more than the memory quota: `report` (a line in VGPU_COORDINATOR_TRACE and the
    /// record `over-quota.yaml` beside the card views) or `kill` its newest process.
    #[arg(long, default_value = "report", value_parser = parse_over_quota)]
    over_quota: OverQuota,
    /// Run the command as an MPS client of its card's MPS control daemon (joined when one
    /// answers in --mps-dir, else started for this run): `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`
    /// from --cores, `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` from --memory; the shims keep the
    /// memory quota, and compute is left to MPS unless --mps-limiter. One device only.
    #[arg(long)]
    mps: bool,
    /// The folder of the per-card MPS folders (shared with `vgpu mps`).
    #[arg(long, default_value = crate::mps::DEFAULT_DIR, requires = "mps")]
    mps_dir: PathBuf,
    /// With --mps: keep the shims' time-based compute limiter on top of MPS.
    #[arg(long, requires = "mps")]
    mps_limiter: bool,
    /// The command and its arguments.
    #[arg(trailing_var_arg = true, required = true, allow_hyphen_values = true)]
    command: Vec<String>,
}

fn parse_over_quota(text: &str) -> Result<OverQuota, String> {
    match text {
        "report" => Ok(OverQuota::Report),
        "kill" => Ok(OverQuota::Kill),
        other => Err(format!("`{other}`: expected report or kill")),
    }
}

fn parse_core_mode(text: &str) -> Result<CoreMode, String> {
    match text {
        "hard" => Ok(CoreMode::Hard),
        "soft" => Ok(CoreMode::Soft),
        other => Err(format!("`{other}`: expected hard or soft")),
    }
}

/// One `--device` argument.
fn parse_device(
    text: &str,
    memory: Option<ByteSize>,
    cores: Option<u32>,
    core_mode: CoreMode,
) -> Result<DeviceQuota> {
    let (selector, options) = match text.split_once(':') {
        Some((selector, options)) => (selector, Some(options)),
        None => (text, None),
    };
    let mut quota = DeviceQuota::unlimited_index(0);
    if !selector.is_empty() && selector.bytes().all(|b| b.is_ascii_digit()) {
        quota.index = Some(
            selector
                .parse()
                .with_context(|| format!("--device {text}: bad index"))?,
        );
    } else if !selector.is_empty() {
        quota.index = None;
        quota.uuid = Some(selector.to_string());
    } else {
        bail!("--device {text}: empty selector");
    }
    quota.memory_limit = memory;
    quota.core_limit = cores;
    quota.core_mode = core_mode;
    for option in options.unwrap_or("").split(',').filter(|o| !o.is_empty()) {
        match option.split_once('=') {
            Some(("memory", value)) => {
                quota.memory_limit =
                    Some(value.parse().with_context(|| format!("--device {text}"))?)
            }
            Some(("cores", value)) => {
                quota.core_limit = Some(
                    value
                        .parse()
                        .with_context(|| format!("--device {text}: bad cores"))?,
                )
            }
            _ => bail!("--device {text}: unknown option `{option}` (use memory=SIZE or cores=N)"),
        }
    }
    Ok(quota)
}

/// The work folder, removed on drop unless kept.
struct WorkDir {
    path: PathBuf,
    keep: bool,
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// The real libraries to forward to, and the public paths to cover.
struct Plan {
    driver_dir: PathBuf,
    /// (real file, private path it is bound to)
    private_binds: Vec<(PathBuf, PathBuf)>,
    /// (shim, public path to cover)
    covers: Vec<(PathBuf, PathBuf)>,
    /// A folder of shim links to put first on LD_LIBRARY_PATH, when the loader would
    /// find no libcuda.so.1 / libnvidia-ml.so.1 to cover.
    fallback_lib_dir: Option<PathBuf>,
}

const LIBS: [&str; 2] = ["libcuda.so.1", "libnvidia-ml.so.1"];

fn plan(args: &RunArgs, artifacts: &Artifacts, work: &Path) -> Result<Plan> {
    let cache = vgpu_ldconfig::read_cache(Path::new("/etc/ld.so.cache")).unwrap_or_default();
    let ld_library_path = std::env::var("LD_LIBRARY_PATH").ok();
    let shims = [&artifacts.cuda_shim, &artifacts.nvml_shim];
    let mut private_binds = Vec::new();
    let mut covers = Vec::new();
    let mut uncovered = Vec::new();
    let driver_dir = if args.simulate {
        let sim = artifacts.require_sim()?;
        let dir = work.join("sim");
        sim_driver_folder(&dir, sim)?;
        dir
    } else {
        work.join("driver")
    };
    if !args.simulate {
        std::fs::create_dir_all(&driver_dir)
            .with_context(|| format!("create {}", driver_dir.display()))?;
    }
    for (name, shim) in LIBS.iter().zip(shims) {
        let public: Vec<PathBuf> =
            vgpu_ldconfig::loader_paths(name, &cache, ld_library_path.as_deref());
        if !args.simulate {
            let real = match &args.driver_dir {
                Some(dir) => dir.join(name),
                None => public.first().cloned().with_context(|| {
                    format!("the loader finds no real {name} on this host: use --simulate, or --driver-dir DIR")
                })?,
            };
            let real = std::fs::canonicalize(&real)
                .with_context(|| format!("real driver library {}", real.display()))?;
            let private = driver_dir.join(name);
            std::fs::write(&private, b"")
                .with_context(|| format!("create {}", private.display()))?;
            private_binds.push((real, private));
        }
        let mut seen = Vec::new();
        for path in public {
            let Ok(target) = std::fs::canonicalize(&path) else {
                continue;
            };
            if !seen.contains(&target) {
                seen.push(target);
                covers.push((shim.to_path_buf(), path));
            }
        }
        if seen.is_empty() {
            uncovered.push((*name, shim));
        }
    }
    let fallback_lib_dir = if uncovered.is_empty() {
        None
    } else {
        let dir = work.join("lib");
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        for (name, shim) in uncovered {
            crate::artifacts::replace_symlink(shim, &dir.join(name))?;
        }
        Some(dir)
    };
    Ok(Plan {
        driver_dir,
        private_binds,
        covers,
        fallback_lib_dir,
    })
}

fn bind(source: &Path, target: &Path) -> Result<()> {
    mount(
        Some(source),
        target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .with_context(|| format!("bind {} over {}", source.display(), target.display()))
}

/// A private mount namespace: directly with `CAP_SYS_ADMIN` (root on a host), else
/// inside a new user namespace that maps the caller to itself (any other user, and root
/// in an unprivileged container, which has the uid but not the capability).
fn enter_mount_namespace() -> Result<()> {
    let (uid, gid) = (geteuid(), getegid());
    let direct = vgpu_contract::process::holds_cap_sys_admin();
    let flags = if direct {
        CloneFlags::CLONE_NEWNS
    } else {
        CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS
    };
    unshare(flags).map_err(|error| {
        anyhow::anyhow!(
            "cannot enter a mount namespace ({error}): vgpu run needs root, or unprivileged user namespaces \
             (sysctl kernel.unprivileged_userns_clone=1 / user.max_user_namespaces > 0)"
        )
    })?;
    if !direct {
        std::fs::write("/proc/self/setgroups", "deny").context("user namespace: setgroups")?;
        std::fs::write("/proc/self/uid_map", format!("{uid} {uid} 1"))
            .context("user namespace: uid_map")?;
        std::fs::write("/proc/self/gid_map", format!("{gid} {gid} 1"))
            .context("user namespace: gid_map")?;
    }
    // Every mount private to this namespace, so nothing leaks to the host.
    mount(
        Some("none"),
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .context("make mounts private")?;
    Ok(())
}

extern "C" fn ignore_signal(_: libc::c_int) {}

pub fn run(args: &RunArgs) -> Result<i32> {
    let artifacts = Artifacts::locate()?;
    let path = match &args.state_dir {
        Some(dir) => dir.clone(),
        None => std::env::temp_dir().join(format!("vgpu-run-{}", std::process::id())),
    };
    std::fs::create_dir_all(&path).with_context(|| format!("create {}", path.display()))?;
    let work = WorkDir {
        path,
        keep: args.keep || args.state_dir.is_some(),
    };
    let plan = plan(args, &artifacts, &work.path)?;

    let quota_given = args.memory.is_some() || args.cores.is_some() || !args.devices.is_empty();
    let mut region = None;
    // With a compute limit: the config and region the host's coordinator needs.
    let mut coordinated = None;
    let mut command = Command::new(&args.command[0]);
    command.args(&args.command[1..]);
    if quota_given {
        let selectors = if args.devices.is_empty() {
            vec!["0".to_string()]
        } else {
            args.devices.clone()
        };
        let mut devices = selectors
            .iter()
            .map(|text| parse_device(text, args.memory, args.cores, args.core_mode))
            .collect::<Result<Vec<_>>>()?;
        if args.mps && !args.mps_limiter {
            // Compute is MPS's thread percentage; the memory quota and NVML view stay.
            for device in &mut devices {
                device.core_limit = None;
                device.core_ceiling = None;
                device.core_mode = CoreMode::Hard;
            }
        }
        let region_path = work.path.join("usage.region");
        let compute = devices.iter().any(|d| d.effective_core_limit().is_some());
        let host = crate::coordinate::host_dir();
        let config = Config {
            container_id: Some(container_id(args.state_dir.as_deref(), &work.path)),
            driver_dir: Some(plan.driver_dir.clone()),
            usage_region: Some(region_path.clone()),
            card_state_dir: compute.then(|| crate::coordinate::cards_dir(&host)),
            warn_on_refusal: args.warn_on_refusal,
            over_quota: args.over_quota,
            devices,
            ..Config::default()
        };
        config
            .validate()
            .map_err(|message| anyhow::anyhow!("quota: {message}"))?;
        // Before the config: a region that live processes hold but cannot keep (other
        // devices, damage) is refused here, and the running container is left as it is.
        match Region::create_file(&region_path, &config.region_devices())? {
            OpenOutcome::Rebuilt(reason) => eprintln!(
                "vgpu run: usage region {} was rebuilt (no live process held it): {reason}",
                region_path.display()
            ),
            OpenOutcome::LimitsUpdated => eprintln!(
                "vgpu run: new limits for the running container in {}; its usage is kept",
                work.path.display()
            ),
            OpenOutcome::Created | OpenOutcome::Attached => {}
        }
        region = Some(region_path);
        let config_path = work.path.join("vgpu.yaml");
        // Through a rename: other processes of a shared --state-dir may be reading it.
        let staging = work
            .path
            .join(format!(".vgpu.yaml.{}.tmp", std::process::id()));
        std::fs::write(&staging, config.to_yaml())
            .with_context(|| format!("write {}", staging.display()))?;
        std::fs::rename(&staging, &config_path)
            .with_context(|| format!("write {}", config_path.display()))?;
        command
            .env("VGPU_CONFIG", &config_path)
            .env_remove("VGPU_DRIVER_DIR");
        // Compute limits, and the memory backstop, are coordinated on the host.
        coordinated = Some((config, host));
    } else {
        // No quota: the shims forward only.
        command
            .env("VGPU_DRIVER_DIR", &plan.driver_dir)
            .env_remove("VGPU_CONFIG");
    }
    if let Some(dir) = &plan.fallback_lib_dir {
        let old = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
        let joined = if old.is_empty() {
            dir.display().to_string()
        } else {
            format!("{}:{old}", dir.display())
        };
        command.env("LD_LIBRARY_PATH", joined);
    }

    // Before the namespace: the daemon and its servers must load the real driver, not
    // the shims the namespace covers it with.
    let mps_client = if args.mps {
        let (card, share) = mps_share(args)?;
        Some(crate::mps::Client::connect(
            &args.mps_dir,
            &card,
            share,
            &mut command,
        )?)
    } else {
        None
    };
    enter_mount_namespace()?;
    if let Some(shm) = mps_client.as_ref().and_then(crate::mps::Client::shm) {
        bind(shm, Path::new("/dev/shm"))?;
    }
    for (real, private) in &plan.private_binds {
        bind(real, private)?;
    }
    for (shim, public) in &plan.covers {
        bind(shim, public)?;
    }
    // After the binds (a thread would stop the namespace change): register with the
    // host's compute coordination, resolving index selectors through the real NVML.
    let _coordination = match &coordinated {
        Some((config, host)) => {
            // Still one thread: the real driver pinned before any NVML of ours loads.
            crate::coordinate::pin_real_driver(&plan.driver_dir);
            let nvml = plan.driver_dir.join(LIBS[1]);
            let uuid_of = crate::coordinate::uuid_by_index(&nvml);
            let region = work.path.join("usage.region");
            let spec = vgpu_coordination::coordinator::ContainerSpec::from_config(
                config, &region, uuid_of,
            );
            match spec.map(|spec| crate::coordinate::start(host, &spec, &nvml)) {
                Some(Ok(coordination)) => Some(coordination),
                Some(Err(error)) => {
                    eprintln!("vgpu: {error:#}; containers on these cards do not coordinate");
                    None
                }
                None => None,
            }
        }
        None => None,
    };

    let status = if args.host_pid {
        run_here(&mut command, &args.command[0])
    } else {
        crate::pidns::run(command, region)
    };
    // Mount points cannot be removed: detach our private binds before the work folder goes.
    for (_, private) in &plan.private_binds {
        // Failure only leaves it to the namespace's end.
        let _ = umount2(private, MntFlags::MNT_DETACH);
    }
    status
}

/// The card and share of `--mps`: the one `--device` (default 0) with its quota.
fn mps_share(args: &RunArgs) -> Result<(String, vgpu_mps::ClientShare)> {
    if args.devices.len() > 1 {
        bail!("--mps: one device only (one MPS daemon serves one card)");
    }
    let text = args.devices.first().map_or("0", String::as_str);
    let quota = parse_device(text, args.memory, args.cores, args.core_mode)?;
    let card = match (&quota.uuid, quota.index) {
        (Some(uuid), _) => uuid.clone(),
        (None, Some(index)) => index.to_string(),
        (None, None) => "0".to_string(),
    };
    Ok((
        card,
        vgpu_mps::ClientShare {
            cores: quota.core_limit,
            memory: quota.memory_limit.map(|limit| limit.bytes()),
        },
    ))
}

/// Runs the command in this PID namespace (`--host-pid`), waits for it and returns its
/// exit code.
fn run_here(command: &mut Command, program: &str) -> Result<i32> {
    // SAFETY: installing a handler (not SIG_IGN, which exec would inherit) so that ^C
    // reaches the command while we stay to clean up.
    unsafe {
        libc::signal(
            libc::SIGINT,
            ignore_signal as *const () as libc::sighandler_t,
        );
        libc::signal(
            libc::SIGQUIT,
            ignore_signal as *const () as libc::sighandler_t,
        );
    }
    let status = command
        .status()
        .with_context(|| format!("cannot run {program}"))?;
    Ok(status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)))
}

/// The container's `container_id`: from `--state-dir` (its last component, made of the
/// allowed characters, and a hash of the whole path, so two runs sharing the folder are
/// one container and two folders of one name are two), else from the fresh work folder.
fn container_id(state_dir: Option<&Path>, work: &Path) -> String {
    let path = state_dir.unwrap_or(work);
    let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let hash = vgpu_contract::mapped::fnv1a(
        canonical.as_os_str().as_encoded_bytes(),
        vgpu_contract::mapped::FNV_OFFSET,
    );
    let name: String = canonical
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .take(40)
        .collect();
    format!("run-{name}-{hash:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_arguments() {
        let quota = parse_device(
            "1:memory=2GiB,cores=30",
            Some(ByteSize::gib(4)),
            None,
            CoreMode::Hard,
        )
        .expect("parses");
        assert_eq!(quota.index, Some(1));
        assert_eq!(quota.memory_limit, Some(ByteSize::gib(2)));
        assert_eq!(quota.core_limit, Some(30));
        let quota = parse_device("GPU-abc", Some(ByteSize::gib(4)), Some(50), CoreMode::Soft)
            .expect("parses");
        assert_eq!(quota.uuid.as_deref(), Some("GPU-abc"));
        assert_eq!(quota.memory_limit, Some(ByteSize::gib(4)));
        assert_eq!(quota.core_mode, CoreMode::Soft);
        assert!(parse_device("0:color=red", None, None, CoreMode::Hard).is_err());
        assert!(parse_device("", None, None, CoreMode::Hard).is_err());
        assert!(parse_device("0:memory=lots", None, None, CoreMode::Hard).is_err());
    }

    #[test]
    fn container_ids_follow_the_state_dir_and_are_valid() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = dir.path().join("my pod!");
        let b = dir.path().join("other");
        std::fs::create_dir_all(&a).expect("mkdir");
        std::fs::create_dir_all(&b).expect("mkdir");
        let id = container_id(Some(&a), &b);
        assert!(id.starts_with("run-my_pod_-"), "{id}");
        assert_eq!(
            id,
            container_id(Some(&a), Path::new("/tmp/elsewhere")),
            "one folder, one id"
        );
        assert_ne!(id, container_id(Some(&b), &b));
        assert_eq!(container_id(None, &b), container_id(Some(&b), &a));
        let long = dir.path().join("x".repeat(200));
        std::fs::create_dir_all(&long).expect("mkdir");
        for id in [id, container_id(Some(&long), &a)] {
            vgpu_contract::config::validate_container_id(&id).expect("valid");
        }
    }
}
