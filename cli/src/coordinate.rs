//! Compute coordination for `vgpu run`: the runs of one host that share cards keep one
//! another to their shares.
//!
//! Each run with a compute limit registers its container in the host folder
//! (`<host>/containers/<container_id>.<pid>.json`: its region and what it is entitled
//! to on which card) and, in a thread, tries every tick to take `<host>/coordinator.lock`
//! (`flock`, released by the kernel when its holder exits). The run that holds it runs
//! the node's one coordination loop ([`vgpu_coordination::tick`]) over every
//! registration whose owner is alive, which writes the card views into `<host>/cards`
//! (every container's config names it as its `card_state_dir`); when that run ends,
//! another takes over within a tick. The host folder is `$VGPU_HOST_DIR`, else
//! `/run/vgpu` for root, else a folder of the user's.
//!
//! The coordinator checks what each container measured against the card's own
//! per-process utilization, through the real NVML
//! ([`vgpu_coordination::cardmeter::NvmlMeter`]). NVML loads `libcuda.so.1`, which in
//! this mount namespace is our shim bound over the public driver: [`pin_real_driver`]
//! loads the real one first, so the host side never runs the shim (which, without a
//! config, would say it cannot find the real driver).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use vgpu_contract::CoreMode;
use vgpu_contract::OverQuota;
use vgpu_contract::config::DRIVER_DIR_ENV;
use vgpu_contract::process;
use vgpu_coordination::coordinator::{ContainerSpec, Entitlement, MemoryEntitlement, TickReport};
use vgpu_coordination::tick;

/// Env var naming the host folder.
pub const HOST_DIR_ENV: &str = "VGPU_HOST_DIR";
/// Env var naming a file the elected coordinator appends what it judged to, every tick
/// (off when unset): how a charge factor came about, for an operator who doubts one.
pub const TRACE_ENV: &str = "VGPU_COORDINATOR_TRACE";

/// The host folder: `$VGPU_HOST_DIR`, else `/run/vgpu` (root), else
/// `$XDG_RUNTIME_DIR/vgpu`, else `/tmp/vgpu-<uid>`.
pub fn host_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os(HOST_DIR_ENV).filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    if uid == 0 {
        return PathBuf::from("/run/vgpu");
    }
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(dir) => PathBuf::from(dir).join("vgpu"),
        None => std::env::temp_dir().join(format!("vgpu-{uid}")),
    }
}

/// The folder of card views under a host folder (the containers' `card_state_dir`).
pub fn cards_dir(host: &Path) -> PathBuf {
    host.join("cards")
}

/// A registration file.
#[derive(Serialize, Deserialize)]
struct Registration {
    id: String,
    region: PathBuf,
    devices: Vec<RegisteredDevice>,
    /// Memory quotas by card UUID (with the card's place in the region), for the
    /// backstop.
    #[serde(default)]
    memory: Vec<(String, usize, u64)>,
    #[serde(default)]
    over_quota: OverQuota,
    pid: i32,
    start_time: u64,
}

#[derive(Serialize, Deserialize)]
struct RegisteredDevice {
    uuid: String,
    region_index: usize,
    core_limit: u32,
    soft: bool,
    ceiling: Option<u32>,
}

impl Registration {
    fn of(spec: &ContainerSpec) -> Registration {
        let me = process::current();
        Registration {
            id: spec.id.clone(),
            region: spec.region.clone(),
            devices: spec
                .devices
                .iter()
                .map(|device| RegisteredDevice {
                    uuid: device.uuid.clone(),
                    region_index: device.region_index,
                    core_limit: device.core_limit,
                    soft: device.mode == CoreMode::Soft,
                    ceiling: device.ceiling,
                })
                .collect(),
            memory: spec
                .memory
                .iter()
                .map(|quota| (quota.uuid.clone(), quota.region_index, quota.memory_limit))
                .collect(),
            over_quota: spec.over_quota,
            pid: me.pid,
            start_time: me.start_time,
        }
    }

    fn spec(&self) -> ContainerSpec {
        ContainerSpec {
            id: self.id.clone(),
            region: self.region.clone(),
            devices: self
                .devices
                .iter()
                .map(|device| Entitlement {
                    uuid: device.uuid.clone(),
                    region_index: device.region_index,
                    core_limit: device.core_limit,
                    mode: if device.soft {
                        CoreMode::Soft
                    } else {
                        CoreMode::Hard
                    },
                    ceiling: device.ceiling,
                })
                .collect(),
            memory: self
                .memory
                .iter()
                .map(|(uuid, region_index, memory_limit)| MemoryEntitlement {
                    uuid: uuid.clone(),
                    region_index: *region_index,
                    memory_limit: *memory_limit,
                })
                .collect(),
            over_quota: self.over_quota,
        }
    }
}

/// This run's part in the host's coordination; ends it on drop.
pub struct Coordination {
    registration: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Coordination {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let _ = std::fs::remove_file(&self.registration);
    }
}

/// Creates `dir` (and parents) with mode 0755: the host's, readable by containers.
fn host_folder(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
        .with_context(|| format!("chmod {}", dir.display()))
}

/// Loads the real `libcuda.so.1` of `driver_dir` into this process for good (where it
/// exists), so that a later `dlopen("libcuda.so.1")` (NVML's) finds it by its soname
/// instead of mapping what the public path now holds (our shim); and names
/// `driver_dir` in `VGPU_DRIVER_DIR`, so that a shim loaded by any other name still
/// finds the real driver and only forwards. Call it while the process has one thread
/// (it changes the environment); the command's own environment is set explicitly.
pub fn pin_real_driver(driver_dir: &Path) {
    let real = driver_dir.join("libcuda.so.1");
    // SAFETY: loading the real driver library runs its initialisers, which set up
    // nothing but its own state (the driver starts threads at cuInit, not at load).
    match unsafe {
        libloading::os::unix::Library::open(
            Some(&real),
            libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL,
        )
    } {
        // Never unloaded: NVML may load it again by name at any time.
        Ok(library) => std::mem::forget(library),
        Err(_) => return,
    }
    // SAFETY: called while this process has one thread (before the coordinator's
    // thread starts), so nothing reads the environment concurrently.
    unsafe { std::env::set_var(DRIVER_DIR_ENV, driver_dir) };
}

/// Registers `spec` under `host` and takes part in electing the host's coordinator,
/// which checks the containers' figures against the NVML at `nvml`.
pub fn start(host: &Path, spec: &ContainerSpec, nvml: &Path) -> Result<Coordination> {
    let containers = host.join("containers");
    host_folder(host)?;
    host_folder(&containers)?;
    host_folder(&cards_dir(host))?;
    let registration = Registration::of(spec);
    let path = containers.join(format!("{}.{}.json", spec.id, registration.pid));
    let staging = containers.join(format!(".{}.{}.tmp", spec.id, registration.pid));
    let text = serde_json::to_string(&registration).context("registration")?;
    std::fs::write(&staging, text).with_context(|| format!("write {}", staging.display()))?;
    std::fs::rename(&staging, &path).with_context(|| format!("write {}", path.display()))?;
    let lock = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(host.join("coordinator.lock"))
        .with_context(|| format!("open {}", host.join("coordinator.lock").display()))?;
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let host = host.to_path_buf();
    let nvml = nvml.to_path_buf();
    let thread = std::thread::Builder::new()
        .name("vgpu-coordinator".into())
        .spawn(move || elect_and_coordinate(&host, &nvml, &lock, &flag))
        .context("start the coordinator thread")?;
    Ok(Coordination {
        registration: path,
        stop,
        thread: Some(thread),
    })
}

/// Every tick: take the lock if nobody holds it; while holding it, coordinate (with
/// the card's own figures from the NVML at `nvml`, where it loads): the one loop of
/// [`tick::run`], elected by the lock, over the registrations, into the trace.
fn elect_and_coordinate(host: &Path, nvml: &Path, lock: &File, stop: &AtomicBool) {
    let settings = tick::Settings {
        cards_dir: cards_dir(host),
        nvml: Some(nvml.to_path_buf()),
        host_proc: PathBuf::from("/proc"),
        refresh: Duration::ZERO,
    };
    let containers = host.join("containers");
    let inputs = tick::Loop {
        // SAFETY: flock on a descriptor we hold open for the thread's life.
        elect: &mut || unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0,
        containers: &mut || registered(&containers),
        stop: &|| stop.load(Ordering::Relaxed),
    };
    tick::run(&settings, inputs, &mut Trace::from_env());
}

/// The opt-in trace of [`TRACE_ENV`]: lines stamped with milliseconds since the thread
/// started; a file that cannot be written turns it off.
struct Trace {
    file: Option<File>,
    started: std::time::Instant,
}

impl Trace {
    fn from_env() -> Trace {
        let file = std::env::var_os(TRACE_ENV)
            .filter(|path| !path.is_empty())
            .and_then(|path| File::options().create(true).append(true).open(path).ok());
        Trace {
            file,
            started: std::time::Instant::now(),
        }
    }

    fn line(&mut self, text: &str) {
        use std::io::Write;
        if let Some(file) = self.file.as_mut() {
            let ms = self.started.elapsed().as_millis();
            if writeln!(file, "{ms} {text}").is_err() {
                self.file = None;
            }
        }
    }
}

impl tick::Watch for Trace {
    fn without_meter(&mut self, nvml: &Path, error: &str) {
        self.line(&format!("meter none: {}: {error}", nvml.display()));
    }

    fn ticked(&mut self, report: &TickReport) {
        for judgement in &report.judgements {
            self.line(&judgement.render());
        }
        for problem in &report.problems {
            self.line(&format!("problem {problem}"));
        }
    }
}

/// The specs of every registration whose owner runs (the files of those that do not
/// are removed), one per container.
fn registered(dir: &Path) -> Vec<ContainerSpec> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut specs: Vec<ContainerSpec> = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let Some(registration) = std::fs::read(&path)
            .ok()
            .and_then(|bytes| serde_json::from_slice::<Registration>(&bytes).ok())
        else {
            continue;
        };
        if !process::is_alive(registration.pid, registration.start_time) {
            let _ = std::fs::remove_file(&path);
            continue;
        }
        if !specs.iter().any(|spec| spec.id == registration.id) {
            specs.push(registration.spec());
        }
    }
    specs
}

/// The UUIDs of host devices by index, from the NVML library at `nvml` (the real one,
/// or the simulator's): what `index:` selectors name, in NVML's (PCI) order.
pub fn uuid_by_index(nvml: &Path) -> impl Fn(u32) -> Option<String> + use<> {
    let loaded = nvml_wrapper::Nvml::builder()
        .lib_path(nvml.as_os_str())
        .init()
        .ok();
    let uuids: Vec<String> = loaded
        .map(|nvml| {
            let count = nvml.device_count().unwrap_or(0);
            (0..count)
                .map(|index| {
                    nvml.device_by_index(index)
                        .and_then(|device| device.uuid())
                        .unwrap_or_default()
                })
                .collect()
        })
        .unwrap_or_default();
    move |index| {
        uuids
            .get(index as usize)
            .filter(|uuid| !uuid.is_empty())
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(dir: &Path, id: &str) -> ContainerSpec {
        ContainerSpec {
            id: id.into(),
            region: dir.join(format!("{id}.region")),
            devices: vec![Entitlement {
                uuid: "GPU-1".into(),
                region_index: 0,
                core_limit: 30,
                mode: CoreMode::Soft,
                ceiling: Some(60),
            }],
            ..ContainerSpec::default()
        }
    }

    #[test]
    fn runs_register_and_one_of_them_writes_the_views() {
        let dir = tempfile::tempdir().expect("tempdir");
        let host = dir.path().join("host");
        let no_nvml = dir.path().join("no-libnvidia-ml.so.1");
        let first = start(&host, &spec(dir.path(), "a"), &no_nvml).expect("first");
        let second = start(&host, &spec(dir.path(), "b"), &no_nvml).expect("second");
        let view = host.join("cards/GPU-1.card");
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let listed = |text: &str| text.contains("container a ") && text.contains("container b ");
        while !std::fs::read_to_string(&view).is_ok_and(|t| listed(&t)) {
            assert!(std::time::Instant::now() < deadline, "no view naming both");
            std::thread::sleep(Duration::from_millis(20));
        }
        let mode = std::fs::metadata(host.join("cards"))
            .expect("cards")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755);
        // A registration left by a process that is gone is removed, not believed.
        let ghost = Registration {
            pid: i32::MAX - 1,
            ..Registration::of(&spec(dir.path(), "ghost"))
        };
        let ghost_path = host.join("containers/ghost.1.json");
        std::fs::write(&ghost_path, serde_json::to_string(&ghost).expect("json")).expect("write");
        let specs = registered(&host.join("containers"));
        assert_eq!(specs.len(), 2);
        assert!(!ghost_path.exists());
        // The runs end: their registrations go.
        drop(first);
        drop(second);
        assert!(registered(&host.join("containers")).is_empty());
    }
}
