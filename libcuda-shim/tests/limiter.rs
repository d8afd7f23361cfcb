//! End-to-end tests of the compute limiter: the real built shim
//! (`target/<profile>/libcuda_shim.so`) over the simulated driver
//! (`target/<profile>/libvgpu_sim.so`, build it first: `cargo build -p vgpu-sim-driver`),
//! whose kernels take the time their name says (`k_1ms`) on per-stream timelines and
//! hold one SM per block, so quarter-card kernels (33 blocks of 132 SMs) overlap four at
//! a time and queue beyond that.
//!
//! Each "container" is a child process (this test binary re-run as
//! `child_process_entry` with `LIMITER_ROLE` set) with its own shim config and usage
//! region; they share the simulated machine's state file. A child launches kernels on
//! its streams as fast as the shim lets it (keeping four queued per stream, as a program
//! that reads its results would) and reports, per 100 ms window, its throughput as a
//! share of what the same workload does on the bare card (launches x kernel time /
//! kernels that fit at once), and the card's busy fraction over its last second as the
//! simulated NVML counts it (the union of every kernel's run). Where coordination is
//! tested, the test process plays the host: it runs `vgpu_coordination::coordinator` over the
//! containers' regions and writes the card views they read.
//!
//! Judgements separate the limiter from the host's scheduler (CI has 2 cores, the other
//! one often busy): upper bounds are strict (a starved thread only lowers a share);
//! lower bounds are discounted by each launching thread's run-queue time per window
//! (`/proc/thread-self/schedstat`, `Starved`), or judged by the limiter's own account
//! (`VGPU_LIMITER_TRACE`) against the simulated card's.

use std::ffi::{CString, c_char, c_uint, c_void};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use vgpu_contract::CoreMode;
use vgpu_coordination::coordinator::{ContainerSpec, Coordinator, Entitlement};

const WINDOW_NS: u64 = 100_000_000;
/// The simulated card's UUID (GPU 0 of the sim's defaults).
const CARD: &str = "GPU-51d00000-0000-4000-8000-000000000001";
/// Blocks of a quarter-card kernel on the sim's 132 SMs.
const QUARTER: u32 = 33;

/// The timing tests run one at a time: on a small CI machine, children competing for
/// the CPU would measure the scheduler, not the limiter.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A library this build made (`cargo test` leaves them in `deps/`).
fn built(name: &str) -> PathBuf {
    vgpu_test_support::built(name)
        .unwrap_or_else(|| panic!("{name} is not built: run `cargo test --workspace`"))
}

fn monotonic_ns() -> u64 {
    vgpu_contract::clock::monotonic_ns()
}

/// A temp folder removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let path = std::env::temp_dir().join(format!(
            "vgpu-limiter-{name}-{}-{}",
            std::process::id(),
            monotonic_ns()
        ));
        std::fs::create_dir_all(&path).expect("scratch dir");
        Scratch(path)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A workload: `streams` streams of `kernel` with `blocks` blocks each, driven by one
/// thread per stream or (`threads: 1`) round-robin from one thread.
#[derive(Clone, Copy, Debug)]
struct Role {
    kernel: &'static str,
    run_ms: u64,
    streams: u32,
    threads: u32,
    blocks: u32,
    mode: &'static str,
    /// Host time the simulated driver's launch call takes (`VGPU_SIM_LAUNCH_CALL_NS`).
    launch_call_ns: u64,
    /// How long a kernel right after an event waits on the simulated card
    /// (`VGPU_SIM_KERNEL_AFTER_EVENT_NS`).
    after_event_ns: u64,
}

impl Role {
    fn plain(kernel: &'static str, run_ms: u64) -> Role {
        Role {
            kernel,
            run_ms,
            streams: 1,
            threads: 1,
            blocks: 1,
            mode: "plain",
            launch_call_ns: 0,
            after_event_ns: 0,
        }
    }

    fn launch_call(self, launch_call_ns: u64) -> Role {
        Role {
            launch_call_ns,
            ..self
        }
    }

    fn after_event(self, after_event_ns: u64) -> Role {
        Role {
            after_event_ns,
            ..self
        }
    }

    fn streams(self, streams: u32, threads: u32, blocks: u32) -> Role {
        Role {
            streams,
            threads,
            blocks,
            ..self
        }
    }

    fn mode(self, mode: &'static str) -> Role {
        Role { mode, ..self }
    }

    fn encode(&self) -> String {
        format!(
            "{}:{}:{}:{}:{}:{}",
            self.kernel, self.run_ms, self.streams, self.threads, self.blocks, self.mode
        )
    }
}

/// The simulated machine: a driver folder whose libcuda.so.1 is the simulator, the
/// simulator's cross-process state file, and the host's folder of card views.
struct Machine {
    scratch: Scratch,
}

impl Machine {
    fn new(name: &str) -> Machine {
        let sim = built("libvgpu_sim.so");
        built("libcuda_shim.so");
        let scratch = Scratch::new(name);
        let driver = scratch.0.join("driver");
        std::fs::create_dir_all(&driver).expect("driver dir");
        std::os::unix::fs::symlink(&sim, driver.join("libcuda.so.1")).expect("symlink");
        std::os::unix::fs::symlink(&sim, driver.join("libnvidia-ml.so.1")).expect("symlink");
        Machine { scratch }
    }

    fn cards(&self) -> PathBuf {
        self.scratch.0.join("cards")
    }

    /// A container config: `quota` is the YAML of device 0's compute settings. Its
    /// `container_id` is its name, and it reads the host's card views.
    fn container(&self, name: &str, quota: &str) -> PathBuf {
        let dir = self.scratch.0.join(name);
        std::fs::create_dir_all(&dir).expect("container dir");
        let config = dir.join("vgpu.yaml");
        let text = format!(
            "container_id: {name}\ncard_state_dir: {}\ndevices:\n  - index: 0\n    memory_limit: 8GiB\n{quota}",
            self.cards().display()
        );
        std::fs::write(&config, text).expect("config");
        config
    }

    /// Starts a child "container" with `role`.
    fn spawn(&self, config: &Path, role: Role) -> std::process::Child {
        self.command(config, role).spawn().expect("spawn child")
    }

    /// The command of a child "container".
    fn command(&self, config: &Path, role: Role) -> Command {
        let mut command = Command::new(std::env::current_exe().expect("exe"));
        command
            .args([
                "--exact",
                "child_process_entry",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("LIMITER_ROLE", role.encode())
            .env(
                "VGPU_SIM_WAVES",
                if matches!(role.mode, "torch" | "hostile" | "two-grids") {
                    "1"
                } else {
                    "0"
                },
            )
            .env("VGPU_CONFIG", config)
            .env("VGPU_DRIVER_DIR", self.scratch.0.join("driver"))
            .env("VGPU_SIM_STATE", self.scratch.0.join("sim.state"))
            .env("VGPU_SIM_GPUS", "1")
            .env("VGPU_SIM_SMS", "132")
            .env("VGPU_SIM_LAUNCH_CALL_NS", role.launch_call_ns.to_string())
            .env(
                "VGPU_SIM_KERNEL_AFTER_EVENT_NS",
                role.after_event_ns.to_string(),
            )
            .env_remove("VGPU_LOG")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        command
    }
}

/// What the host knows of a container in these tests.
fn spec(config: &Path, limit: u32, mode: CoreMode, ceiling: Option<u32>) -> ContainerSpec {
    let dir = config.parent().expect("container dir");
    ContainerSpec {
        id: dir
            .file_name()
            .and_then(|n| n.to_str())
            .expect("name")
            .to_string(),
        region: dir.join("usage.region"),
        devices: on_the_card(limit, mode, ceiling),
        ..ContainerSpec::default()
    }
}

/// What the host gave a container on the simulated card.
fn on_the_card(limit: u32, mode: CoreMode, ceiling: Option<u32>) -> Vec<Entitlement> {
    vec![Entitlement {
        uuid: CARD.into(),
        region_index: 0,
        core_limit: limit,
        mode,
        ceiling,
    }]
}

/// What the sim's NVML gives the host per process.
#[derive(Clone, Copy, Debug, PartialEq)]
enum CardSamples {
    /// One exact sample per busy process per query (its last second).
    Exact,
    /// As the H200 gives them: one now and then, swung far from the truth
    /// (`VGPU_SIM_NVML_SAMPLES=sparse`).
    Sparse,
}

/// The host side: a coordinator ticking every 50 ms, with its NVML meter over the
/// simulator's NVML, in a child process of its own (the simulator reads its machine's
/// config once per process) until stopped.
struct Host {
    child: Option<std::process::Child>,
    stop_file: PathBuf,
}

impl Host {
    fn start(machine: &Machine, containers: Vec<ContainerSpec>) -> Host {
        Host::start_with(machine, containers, CardSamples::Exact)
    }

    /// [`Host::start`], its NVML giving per-process samples as `samples` says.
    fn start_with(machine: &Machine, containers: Vec<ContainerSpec>, samples: CardSamples) -> Host {
        let encoded: Vec<String> = containers
            .iter()
            .map(|spec| {
                let device = &spec.devices[0];
                format!(
                    "{}|{}|{}|{}|{}",
                    spec.id,
                    spec.region.display(),
                    device.core_limit,
                    if device.mode == CoreMode::Soft {
                        "soft"
                    } else {
                        "hard"
                    },
                    device.ceiling.unwrap_or(0)
                )
            })
            .collect();
        let stop_file = machine
            .scratch
            .0
            .join(format!("host-stop-{}", monotonic_ns()));
        let mut command = machine.command(Path::new("/dev/null"), Role::plain("k_1ms", 0));
        command
            .env_remove("LIMITER_ROLE")
            .env("LIMITER_HOST", encoded.join(";"))
            .env("LIMITER_HOST_CARDS", machine.cards())
            .env("LIMITER_HOST_STOP", &stop_file);
        if samples == CardSamples::Sparse {
            command.env("VGPU_SIM_NVML_SAMPLES", "sparse");
        }
        let child = command.spawn().expect("spawn host");
        // Until its first views are written.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !machine.cards().join(format!("{CARD}.card")).exists()
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        Host {
            child: Some(child),
            stop_file,
        }
    }

    /// Stops it; what it refused or could not read.
    fn stop(mut self) -> Vec<String> {
        let _ = std::fs::write(&self.stop_file, b"");
        let Some(child) = self.child.take() else {
            return Vec::new();
        };
        let output = child.wait_with_output().expect("host output");
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|line| line.strip_prefix("LIMITER-PROBLEM "))
            .map(str::to_string)
            .collect()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.stop_file, b"");
        if let Some(mut child) = self.child.take() {
            let _ = child.wait();
        }
    }
}

/// The host child's side: the coordinator over the specs in `LIMITER_HOST`.
fn run_host(encoded: &str) {
    let containers: Vec<ContainerSpec> = encoded
        .split(';')
        .map(|spec| {
            let fields: Vec<&str> = spec.split('|').collect();
            let [id, region, limit, mode, ceiling] = fields.as_slice() else {
                panic!("bad host spec {spec}");
            };
            let ceiling: u32 = ceiling.parse().expect("ceiling");
            ContainerSpec {
                id: id.to_string(),
                region: PathBuf::from(region),
                devices: on_the_card(
                    limit.parse().expect("limit"),
                    if *mode == "soft" {
                        CoreMode::Soft
                    } else {
                        CoreMode::Hard
                    },
                    (ceiling > 0).then_some(ceiling),
                ),
                ..ContainerSpec::default()
            }
        })
        .collect();
    let driver = PathBuf::from(std::env::var("VGPU_DRIVER_DIR").expect("driver dir"));
    let meter = vgpu_coordination::cardmeter::NvmlMeter::open(&driver.join("libnvidia-ml.so.1"))
        .expect("the simulator's NVML");
    let cards = PathBuf::from(std::env::var("LIMITER_HOST_CARDS").expect("cards"));
    let stop = PathBuf::from(std::env::var("LIMITER_HOST_STOP").expect("stop file"));
    let mut coordinator = Coordinator::new(&cards)
        .expect("coordinator")
        .with_meter(Box::new(meter), Path::new("/proc"));
    let mut problems: Vec<String> = Vec::new();
    // `LIMITER_HOST_TRACE=FILE`: each tick's judgements, one line each (for diagnosis).
    let mut trace = std::env::var_os("LIMITER_HOST_TRACE").and_then(|path| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .ok()
    });
    let t0 = monotonic_ns();
    while !stop.exists() {
        let report = coordinator.tick(&containers);
        if let Some(file) = trace.as_mut() {
            use std::io::Write;
            let at_ms = (monotonic_ns() - t0) / 1_000_000;
            for judgement in &report.judgements {
                let _ = writeln!(file, "{at_ms} {}", judgement.render());
            }
        }
        for problem in report.problems {
            if !problems.contains(&problem) {
                problems.push(problem);
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for problem in problems {
        println!("LIMITER-PROBLEM {problem}");
    }
}

/// What a child reports.
#[derive(Debug)]
struct Report {
    t0: u64,
    launches: u64,
    /// Busy ns the usage region recorded for the child's slot at the end.
    region_busy_ns: u64,
    /// The simulated card's busy percent over the run's last second (NVML's union).
    card_util: u32,
    /// Throughput share (0-100) of each 100 ms window from t0.
    windows: Vec<f64>,
    /// Lines of mode-specific findings.
    notes: Vec<String>,
    /// What the container's region counts of launches waiting for the limit, ns (the
    /// counter block the host exports as `vgpu_container_throttled_seconds_total`), read
    /// after the child exited; 0 where the caller does not read it.
    container_throttled_ns: u64,
}

impl Report {
    fn mean(&self, from: usize, to: usize) -> f64 {
        let part = &self.windows[from.min(self.windows.len())..to.min(self.windows.len())];
        part.iter().sum::<f64>() / part.len().max(1) as f64
    }

    fn worst(&self, from: usize) -> f64 {
        self.windows[from.min(self.windows.len())..]
            .iter()
            .copied()
            .fold(0.0, f64::max)
    }

    /// Whether the mean of windows `from..to` is `target` within 5 points: never above
    /// (hard means hard; a starved thread only lowers it), and not below `target - 5`
    /// less what the host's scheduler took from the least starved launching thread in
    /// those windows (`starved`): the limiter cannot spend budget for a thread that has
    /// no CPU. The mean, or why not.
    fn near(&self, from: usize, to: usize, target: f64) -> Result<f64, String> {
        let mean = self.mean(from, to);
        let starved = self.starved(from, to);
        let least = (target - 5.0) * (1.0 - starved);
        if mean > target + 5.0 || mean < least {
            Err(format!(
                "{mean:.1}% of the card, not {target}% (+5, -5 and {:.0}% starved: at least {least:.1})",
                starved * 100.0
            ))
        } else {
            Ok(mean)
        }
    }

    /// The fraction of windows `from..to` its least starved launching thread spent
    /// waiting for a CPU (0 where the role does not measure it).
    fn starved(&self, from: usize, to: usize) -> f64 {
        let per_window: Vec<u64> = self
            .note("starved_ns")
            .map(|list| list.split(',').filter_map(|n| n.parse().ok()).collect())
            .unwrap_or_default();
        let part = &per_window[from.min(per_window.len())..to.min(per_window.len())];
        (part.iter().sum::<u64>() as f64 / (part.len().max(1) as u64 * WINDOW_NS) as f64).min(1.0)
    }

    fn note(&self, key: &str) -> Option<&str> {
        self.notes
            .iter()
            .find_map(|line| line.strip_prefix(key)?.strip_prefix('='))
    }
}

fn finish(child: std::process::Child) -> Report {
    let output = child.wait_with_output().expect("child output");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "child failed: {}\n{stdout}\n{stderr}",
        output.status
    );
    let line = stdout
        .lines()
        .find_map(|l| l.split_once("LIMITER-RESULT ").map(|(_, rest)| rest))
        .unwrap_or_else(|| panic!("no result:\n{stdout}\n{stderr}"));
    let fields: Vec<&str> = line.split_whitespace().collect();
    let number = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("bad result line {line}"))
    };
    Report {
        t0: number(0),
        launches: number(1),
        region_busy_ns: number(3),
        card_util: number(4) as u32,
        windows: fields[5..]
            .iter()
            .map(|f| f.parse().expect("window"))
            .collect(),
        notes: stdout
            .lines()
            .filter_map(|l| {
                l.split_once("LIMITER-NOTE ")
                    .map(|(_, note)| note.to_string())
            })
            .collect(),
        container_throttled_ns: 0,
    }
}

/// The limiter's own account of one run (`VGPU_LIMITER_TRACE`): counter name to value,
/// and its learned kernels' lines.
#[derive(Debug, Default)]
struct Trace(std::collections::HashMap<String, u64>, Vec<TracedKernel>);

/// One `kernel COST SAMPLES LAUNCHES CHARGED CLASS NAME` line of a trace.
#[derive(Debug)]
struct TracedKernel {
    cost_ns: u64,
    launches: u64,
    charged_ns: i64,
    class: u64,
    name: String,
}

impl Trace {
    /// The trace written at `path`, or an empty one where none was written.
    fn read(path: &Path) -> Trace {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let kernels = text
            .lines()
            .filter_map(|line| {
                let fields: Vec<&str> = line.strip_prefix("kernel ")?.split(' ').collect();
                let [cost, _samples, launches, charged, class, name] = fields.as_slice() else {
                    return None;
                };
                Some(TracedKernel {
                    cost_ns: cost.parse().ok()?,
                    launches: launches.parse().ok()?,
                    charged_ns: charged.parse().ok()?,
                    class: class.parse().ok()?,
                    name: name.to_string(),
                })
            })
            .collect();
        Trace(
            text.lines()
                .filter_map(|line| {
                    let (name, value) = line.split_once(' ')?;
                    Some((name.to_string(), value.parse().ok()?))
                })
                .collect(),
            kernels,
        )
    }

    fn get(&self, counter: &str) -> u64 {
        self.0.get(counter).copied().unwrap_or(0)
    }

    /// The learned cost of the traced kernel `name`, ns; 0 where it was not traced.
    fn cost_ns(&self, name: &str) -> f64 {
        self.1
            .iter()
            .find(|kernel| kernel.name == name)
            .map_or(0.0, |kernel| kernel.cost_ns as f64)
    }

    /// What the limiter charged for its launches, ns: its charges before the host's
    /// factor and its settled samples' corrections.
    fn charged_ns(&self) -> f64 {
        self.get("charged_ns") as f64 + self.get("corrected_up_ns") as f64
            - self.get("corrected_down_ns") as f64
    }

    /// What the limiter charged the bucket over a run of `run_ms` (its charges and its
    /// settled samples' corrections, after the host's factor), as a percent of the run.
    fn charged_percent(&self, run_ms: u64) -> f64 {
        let net = self.get("charged_scaled_ns") as f64 + self.get("corrected_up_ns") as f64
            - self.get("corrected_down_ns") as f64;
        net / (run_ms as f64 * 1e6) * 100.0
    }
}

/// `run_one` with the limiter's trace on: the report and what the limiter says it did.
fn run_traced(name: &str, quota: &str, role: Role) -> (Report, Trace) {
    run_traced_with(name, quota, role, &[])
}

/// `run_traced` with `env` set for the child.
fn run_traced_with(name: &str, quota: &str, role: Role, env: &[(&str, &str)]) -> (Report, Trace) {
    let _serial = serial();
    let machine = Machine::new(name);
    let config = machine.container("a", quota);
    let trace = machine.scratch.0.join("limiter.trace");
    let child = machine
        .command(&config, role)
        .env("VGPU_LIMITER_TRACE", &trace)
        .envs(env.iter().copied())
        .spawn()
        .expect("spawn child");
    let mut report = finish(child);
    report.container_throttled_ns = throttled_ns_of(&config);
    let trace = Trace::read(&trace);
    eprintln!(
        "{name}: {role:?} under `{}`: {report:?}\n{trace:?}",
        quota.trim()
    );
    (report, trace)
}

/// The time the container's launches waited for its limit, from its usage region's
/// container-wide counter (what the plugin exports as throttled seconds).
fn throttled_ns_of(config: &Path) -> u64 {
    let region = config.with_file_name("usage.region");
    vgpu_contract::snapshot::RegionSnapshot::read(&region)
        .map(|copy| copy.counters(0).throttled_ns)
        .expect("the container's region")
}

fn run_one(name: &str, quota: &str, role: Role) -> Report {
    let _serial = serial();
    let machine = Machine::new(name);
    let config = machine.container("a", quota);
    let mut report = finish(machine.spawn(&config, role));
    report.container_throttled_ns = throttled_ns_of(&config);
    eprintln!(
        "{name}: {role:?} under `{}`: share {:.1}% (after warm-up {:.1}%), worst 100 ms {:.1}%, card busy {}%, {} launches, windows {:?}",
        quota.trim().replace('\n', ","),
        report.mean(0, usize::MAX),
        report.mean(2, usize::MAX),
        report.worst(2),
        report.card_util,
        report.launches,
        report.windows
    );
    report
}

#[test]
fn hard_30_with_1ms_kernels_holds_30_percent() {
    let report = run_one(
        "hard30-1ms",
        "    core_limit: 30\n",
        Role::plain("k_1ms", 1000),
    );
    let mean = report
        .near(0, usize::MAX, 30.0)
        .unwrap_or_else(|wrong| panic!("{wrong}: {report:?}"));
    assert!(
        report.worst(0) <= 40.0,
        "a 100 ms window above 40%: {report:?}"
    );
    // The usage region got the measured busy time (within a few ms of the timeline's).
    let timeline_ns = (mean / 100.0 * 1e9) as u64;
    assert!(
        report.region_busy_ns.abs_diff(timeline_ns) < 60_000_000,
        "region {} ns vs timeline {timeline_ns} ns",
        report.region_busy_ns
    );
    // Held to 30 % for 1 s, the launches waited most of the other 70 %; the container's
    // counter outlives the process that waited.
    assert!(
        (300_000_000..=1_100_000_000).contains(&report.container_throttled_ns),
        "throttled {} ns",
        report.container_throttled_ns
    );
}

#[test]
fn hard_30_with_100us_kernels_holds_30_percent() {
    let report = run_one(
        "hard30-100us",
        "    core_limit: 30\n",
        Role::plain("k_100us", 1000),
    );
    if let Err(wrong) = report.near(0, usize::MAX, 30.0) {
        panic!("{wrong}: {report:?}");
    }
    assert!(
        report.worst(0) <= 40.0,
        "a 100 ms window above 40%: {report:?}"
    );
    assert!(report.launches > 1000, "{report:?}");
}

/// A launch the driver refuses ran nothing and costs the container nothing, on the fast
/// path as on the slow. Charged, the four refused launches of a known kernel before each
/// real one would hold the container to a fraction of its 30 (9 %, measured with a fast
/// path that kept the charge of a refused launch).
///
/// Nor does it take a due sample from the real launches: the first launch after each
/// wait is a refused one here, and when it spent the sample (and started the gap before
/// the next) the real launches got 6 samples in a second, the estimate stayed at its
/// first sample (81-87 us of the 100 us kernel) and the container ran at 34-37 % of the
/// card. Judged: within 2 points of its 30 (30.3-30.7 since) and at least 100 samples.
#[test]
fn a_refused_launch_costs_the_container_nothing() {
    let (report, trace) = run_traced(
        "hard30-refused",
        "    core_limit: 30\n",
        Role::plain("k_100us", 1000).mode("refused"),
    );
    if let Err(wrong) = report.near(0, usize::MAX, 30.0) {
        panic!("{wrong}: {report:?}");
    }
    assert!(
        report.mean(0, usize::MAX) <= 32.0 && trace.get("sampled") >= 100,
        "over its 30, or its samples spent on refused launches: {report:?} {trace:?}"
    );
    let refused: u64 = report
        .notes
        .iter()
        .find_map(|note| note.strip_prefix("refused=")?.parse().ok())
        .unwrap_or(0);
    assert!(
        refused > 1000 && trace.get("launches") >= refused,
        "{refused} refused launches, all through the limiter: {trace:?}"
    );
}

/// A loop whose samples agree with its kernel's estimate is sampled every 4 ms, not every
/// 1 ms (`duty::sample_gap_ns`: on a slower H100 the 1 ms gap's events and settles cost
/// about 55 ns of a 4.4 us launch, BENCHMARKS run 26); when its kernel's run then grows
/// tenfold (the same function and grid, `Role::mode("grows")`), the first sample that
/// disagrees brings the 1 ms gap back, the estimate follows, and the container stays
/// held. Judged by the trace (quiet gaps taken, far fewer samples than 1 ms gaps give,
/// the grown cost learned) and by the card's share after the growth.
#[test]
fn a_loop_whose_samples_agree_is_sampled_less_often_and_still_follows_its_kernel() {
    let run_ms = 3000;
    let (report, trace) = run_traced(
        "quiet-then-grows",
        "    core_limit: 30\n",
        Role::plain("k_scaled_20us", run_ms).mode("grows"),
    );
    let (sampled, quiet) = (trace.get("sampled"), trace.get("quiet_gaps"));
    let learned = trace.cost_ns("k_scaled_20us");
    let grown = (kernel_ns("k_scaled_20us") * u64::from(GROWN_TIMES)) as f64;
    let line = format!(
        "{sampled} samples, {quiet} of them followed by the quiet gap; learned {learned:.0} ns of a grown {grown:.0}; after the growth {:.1} % of the card: {report:?}\n{trace:?}",
        report.mean(12, usize::MAX)
    );
    eprintln!("{line}");
    // 1 ms gaps would give about one sample a ms once the kernel is settled.
    assert!(quiet >= 50, "quiet gaps taken: {line}");
    assert!(
        sampled * 2 <= run_ms,
        "sampled as often as the 1 ms gap: {line}"
    );
    assert!(
        (learned / grown - 1.0).abs() <= 0.15,
        "the estimate followed the grown kernel: {line}"
    );
    if let Err(wrong) = report.near(12, usize::MAX, 30.0) {
        panic!("after the growth {wrong}: {line}");
    }
    // The growth (at window 10) overruns that window's estimates until the samples catch
    // it, so they must catch it at once: the first that disagrees brings the 1 ms gap
    // back as it settles. With another core busy, windows 10 and 11 ran 52.4-54.2 and
    // 31.4-32.0 (with 1 ms gaps throughout, before the quiet gap: 52.0-53.6 and
    // 31.4-31.6; with the 1 ms gap back only after the next quiet gap, 53.2-55.8 and
    // 31.6-31.8); with the quiet gap kept after samples that disagreed, the estimate
    // crept up at one sample in 4 ms and they ran 64.8-66.8 and 34.0-34.2.
    assert!(
        report.mean(10, 12) <= 46.5,
        "the growth's first 200 ms: {line}"
    );
}

/// A loop of short kernels below its limit runs on its thread's tabs (`limiter::tab`):
/// most launches then touch no line the container shares, and paying each tab still
/// charges the bucket, and tells the region, what the per-launch path would have. The
/// same loop with `VGPU_LIMITER_TABS=off` is the judge. A tab paid with the wrong sign,
/// or never, shows as a charge far from that; a tab that never opens, as launches off
/// it.
#[test]
fn a_loop_below_its_limit_runs_on_tabs_and_is_charged_as_without_them() {
    // Below, not far below: the bucket lends each tab its credit, and a tab that kept
    // it would hold the loop. Launch calls of 26 us hold it to about 75 % of the card.
    let quota = "    core_limit: 90\n";
    let role = || Role::plain("k_20us", 1000).launch_call(26_000);
    let (tabs, tabs_trace) = run_traced("tabs-on", quota, role());
    let (per_launch, per_launch_trace) =
        run_traced_with("tabs-off", quota, role(), &[("VGPU_LIMITER_TABS", "off")]);
    let (launches, tabbed) = (tabs_trace.get("launches"), tabs_trace.get("tabbed"));
    assert!(
        tabbed * 10 >= launches * 8,
        "{tabbed} of {launches} launches on tabs: {tabs_trace:?}"
    );
    assert_eq!(per_launch_trace.get("tabbed"), 0, "{per_launch_trace:?}");
    assert_not_held_by_tabs((&tabs, &tabs_trace), (&per_launch, &per_launch_trace));
    // Charged, and recorded in the region, per completed launch, in the run's own learned
    // cost of the kernel: within 5 % of the per-launch path's, and each within 10 % of
    // one cost a launch. Each run learns the cost from its own samples, and what they
    // measure moves with the host's load: two runs back to back in CI learned 16.8 us on
    // tabs and 19.3 without, which put the charges 13 % apart although each paid its
    // own cost to within 1 %. A tab paid with the wrong sign, or never, moves its run's
    // charge off its cost.
    let (tabs_cost, per_launch_cost) = (
        tabs_trace.cost_ns("k_20us"),
        per_launch_trace.cost_ns("k_20us"),
    );
    assert!(
        tabs_cost > 0.0 && per_launch_cost > 0.0,
        "the kernel's learned cost, traced:\n{tabs_trace:?}\n{per_launch_trace:?}"
    );
    let per_cost =
        |ns: u64, report: &Report, cost: f64| ns as f64 / report.launches.max(1) as f64 / cost;
    for (what, with, without) in [
        (
            "charged",
            per_cost(tabs_trace.get("charged_scaled_ns"), &tabs, tabs_cost),
            per_cost(
                per_launch_trace.get("charged_scaled_ns"),
                &per_launch,
                per_launch_cost,
            ),
        ),
        (
            "recorded",
            per_cost(tabs.region_busy_ns, &tabs, tabs_cost),
            per_cost(per_launch.region_busy_ns, &per_launch, per_launch_cost),
        ),
    ] {
        assert!(
            (with / without - 1.0).abs() <= 0.05
                && (with - 1.0).abs() <= 0.10
                && (without - 1.0).abs() <= 0.10,
            "{what}: {with:.3} of its learned cost a launch on tabs ({tabs_cost:.0} ns), {without:.3} without ({per_launch_cost:.0} ns):\n{tabs:?} {tabs_trace:?}\n{per_launch:?} {per_launch_trace:?}"
        );
    }
}

/// A thread descheduled between a sampled launch's return and its end event's record
/// (a busy host, a container's CPU quota) records that event after its kernel ended:
/// the event fires at its record, and the sample times the stall as the kernel's run.
/// Such a sample teaches nothing (`duty::is_doubtful`), and the loop is charged its
/// kernels, not its thread's stalls. The sim's `VGPU_SIM_RECORD_STALL` sleeps 500 us
/// before one event record in 13: before the rule, the 20 us kernel was taught 52.3 us
/// and recorded at 52.9 us a launch; with it, 19.4 and 19.5.
#[test]
fn a_sample_whose_end_event_was_recorded_late_does_not_teach_its_kernel_the_delay() {
    let (report, trace) = run_traced_with(
        "late-end",
        "    core_limit: 90\n",
        Role::plain("k_20us", 1000).launch_call(26_000),
        &[("VGPU_SIM_RECORD_STALL", "13:500000")],
    );
    let truth = kernel_ns("k_20us") as f64;
    let learned = trace.cost_ns("k_20us");
    let recorded = report.region_busy_ns as f64 / report.launches.max(1) as f64;
    assert!(
        (learned / truth - 1.0).abs() <= 0.15 && (recorded / truth - 1.0).abs() <= 0.15,
        "learned {learned:.0} ns and recorded {recorded:.0} ns a launch of a {truth:.0} ns kernel:\n{report:?}\n{trace:?}"
    );
    assert!(
        trace.get("doubtful_samples") >= 10,
        "the late samples were not told apart:\n{trace:?}"
    );
}

/// A tab serves a run of one kernel, so it opens only for a launch that repeats the
/// thread's last: kernels that take turns (the training-like program's 120, each
/// launched once in a row) open none, where each fast-path launch opened one before
/// (1027 tabs for 30721 launches and none used: a borrow and a pay per launch for
/// nothing, `limiter::tab`). A loop of one kernel still runs on tabs
/// (`a_loop_below_its_limit_runs_on_tabs_and_is_charged_as_without_them`).
#[test]
fn kernels_that_take_turns_open_no_tabs() {
    let (report, trace) = run_traced(
        "turns-no-tabs",
        "    core_limit: 90\n",
        Role::plain("k_1ms", 1000).mode("torch"),
    );
    let (launches, opened) = (trace.get("launches"), trace.get("tabs_opened"));
    assert!(
        launches > 1000 && opened * 1000 <= launches,
        "{opened} tabs opened for {launches} launches:\n{report:?}\n{trace:?}"
    );
}

/// A thread's tab is paid when the thread exits: short-lived threads that each launch
/// a burst of short kernels (fewer than one tab holds) and exit have every launch
/// recorded in the region, as on the per-launch path, and are not held by credit they
/// kept. Left unpaid, each thread's launches on its tab would never reach the region
/// (checked: the region recorded 18042 of 31841 launches) and its credit would stay
/// charged. Judged by launches, not busy time: what a launch is charged follows each
/// run's estimate, 15.5-19.7 us for the sim's 20 us kernel from one run to the next
/// (busy time a launch within 15 % of the per-launch run's failed once in 8).
#[test]
fn a_thread_that_exits_pays_its_tab() {
    let quota = "    core_limit: 90\n";
    let role = || Role::plain("k_20us", 1000).mode("bursts");
    let (tabs, tabs_trace) = run_traced("bursts-tabs-on", quota, role());
    let (per_launch, per_launch_trace) = run_traced_with(
        "bursts-tabs-off",
        quota,
        role(),
        &[("VGPU_LIMITER_TABS", "off")],
    );
    // A thread's first launch and its sampled ones go per launch: 45 % on tabs here.
    assert!(
        tabs_trace.get("tabbed") * 3 >= tabs_trace.get("launches"),
        "a third of the launches or more on tabs: {tabs_trace:?}"
    );
    // Every launch reaches the region, on tabs as without (all but those after the last
    // publish tick, and the run's one more launch after it publishes).
    for (what, report, trace) in [
        ("on tabs", &tabs, &tabs_trace),
        ("per launch", &per_launch, &per_launch_trace),
    ] {
        let recorded = report
            .note("region_launches")
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        let launches = trace.get("launches");
        assert!(
            recorded * 100 >= launches * 98,
            "{what}: the region recorded {recorded} of {launches} launches:\n{report:?} {trace:?}"
        );
    }
    assert_not_held_by_tabs((&tabs, &tabs_trace), (&per_launch, &per_launch_trace));
}

/// Judges a run on tabs against the same run per launch (`VGPU_LIMITER_TABS=off`): the
/// limiter held the tabs' run no longer than the other, within 50 ms of its second
/// (credit a tab kept, or paid back with the wrong sign, holds its launches in
/// `wait_turn`, whose sleeps the trace adds up as `waited_ns`; a tab that never gave
/// its unused credit back made the bursts' run wait 248 ms against 0.5). Their shares
/// are no judge on a loaded host: both loops are bound by their CPU there, and with
/// two busy loops beside them the same pair came out up to 8 points apart either way
/// (one CI run failed the 5-point judge this replaces).
fn assert_not_held_by_tabs(tabs: (&Report, &Trace), per_launch: (&Report, &Trace)) {
    let (waited, waited_per_launch) = (tabs.1.get("waited_ns"), per_launch.1.get("waited_ns"));
    assert!(
        waited <= waited_per_launch + 50_000_000,
        "held by its tabs: waited {:.1} ms on tabs, {:.1} ms per launch:\n{:?} {:?}\n{:?} {:?}",
        waited as f64 / 1e6,
        waited_per_launch as f64 / 1e6,
        tabs.0,
        tabs.1,
        per_launch.0,
        per_launch.1
    );
}

/// Short kernels launched back to back are charged what they kept the card busy, not
/// what their samples timed: a sample's two events time the kernel's set-up as well
/// (on the sim, 5 us behind each event here, `VGPU_SIM_KERNEL_AFTER_EVENT_NS`; a real
/// card sets a kernel up while the one before it runs, but not behind an event), so a
/// 20 us kernel looks 25 us long, and charged that a hard 80 of them gets 64 % of the
/// card (with 10 us, a hard 60 got 40.5 %; on one H100 the same held a `--cores 99`
/// launch loop to 0.65x of bare, BENCHMARKS run 14). Samples of two launches
/// (`limiter::pair`) show the set-up, and launches behind queued work are charged
/// without it: 77-79 % here. With `VGPU_LIMITER_PAIRS=off` the same loop is judged to
/// get less than 70 %, so the test can fail. Judged from 72 (the set-up behind the
/// samples is charged, and the card really spends it) and never above the limit + 2.
#[test]
fn short_kernels_back_to_back_are_charged_what_the_card_ran_not_what_samples_timed() {
    let role = || {
        Role::plain("k_20us", 1000)
            .mode("back-to-back")
            .after_event(5_000)
    };
    let quota = "    core_limit: 80\n";
    let (report, trace) = run_traced("hard80-back-to-back", quota, role());
    let share = report.mean(2, usize::MAX);
    let least = 72.0 * (1.0 - report.starved(2, usize::MAX));
    assert!(
        (least..=82.0).contains(&share),
        "{share:.1}% of the card under a hard 80 (at least {least:.1}): {report:?}\n{trace:?}"
    );
    assert!(
        trace.get("pairs_taught") > 10,
        "the set-up was learned from pairs: {trace:?}"
    );
    let (single, single_trace) = run_traced_with(
        "hard80-back-to-back-single",
        quota,
        role(),
        &[("VGPU_LIMITER_PAIRS", "off")],
    );
    let single_share = single.mean(2, usize::MAX);
    assert!(
        single_share < 70.0 && single_trace.get("paired") == 0,
        "without pairs the loop is charged its samples' set-up: {single_share:.1}%\n{single:?}\n{single_trace:?}"
    );
}

/// A host-bound loop that launches each 20 us kernel into an idle stream and waits for
/// it, on a card that starts work submitted to an idle stream 10 us after the submitting
/// call returns, without being busy meanwhile (`VGPU_SIM_IDLE_SUBMIT_NS`; a real card
/// fetches and sets the work up first: about 3.8 us from an empty kernel's launch to its
/// end event on an H100, where a `--cores 99` launch loop was held to 1.13-1.23x of
/// bare, BENCHMARKS run 17). Every sample's start event fires that latency after its
/// record, and the kernel that long after its launch returned. With the start event
/// placed by its firing time (the reference event's query loop's guess), the idle gap
/// left the latency in: 23.8 us charged a launch and 12.6 % of the card at a hard 15.
/// Judged by what a launch was charged (18-22 us) and by fixed work: 15 within -1.5/+2,
/// the least allowing for the time its thread had no CPU. (The loop alone runs at about
/// 21 % of the card, held by its host.)
#[test]
fn a_loop_that_waits_for_each_kernel_is_charged_its_kernels_not_their_submission() {
    let (report, _) = one_at_a_time_charged_its_20us_kernels("hard15-one-at-a-time", 15, 1000, &[]);
    let share = report.mean(2, usize::MAX);
    let least = 13.5 * (1.0 - report.starved(2, usize::MAX));
    eprintln!("one at a time at 15: {share:.1}% of the card");
    assert!(
        (least..=17.0).contains(&share),
        "{share:.1}% of the card under a hard 15 (at least {least:.1}): {report:?}"
    );
}

/// Runs `k_20us` one at a time into an idle stream for `run_ms` at a hard `limit` (3 us
/// launch calls; the card starts work on an idle stream 10 us after its submission, with
/// `env` besides), and checks what a launch was charged: 18-22 us, from at least 20
/// samples on the idle stream.
fn one_at_a_time_charged_its_20us_kernels(
    name: &str,
    limit: u32,
    run_ms: u64,
    env: &[(&str, &str)],
) -> (Report, Trace) {
    let role = Role::plain("k_20us", run_ms)
        .mode("one-at-a-time")
        .launch_call(3_000);
    let env: Vec<(&str, &str)> = [("VGPU_SIM_IDLE_SUBMIT_NS", "10000")]
        .into_iter()
        .chain(env.iter().copied())
        .collect();
    let (report, trace) = run_traced_with(name, &format!("    core_limit: {limit}\n"), role, &env);
    let per_launch = trace.charged_ns() / trace.get("launches").max(1) as f64;
    eprintln!(
        "{name}: charged {per_launch:.0} ns a launch, {} doubtful samples",
        trace.get("doubtful_samples")
    );
    assert!(
        trace.get("settled_idle") >= 20,
        "too few idle samples to judge: {trace:?}"
    );
    assert!(
        (18_000.0..=22_000.0).contains(&per_launch),
        "charged {per_launch:.0} ns a 20 us launch: {report:?}\n{trace:?}"
    );
    (report, trace)
}

/// A kernel whose first launch call loads its code (20 ms of host time in the call,
/// `VGPU_SIM_FIRST_LAUNCH_NS`; CUDA 12 loads lazily, and PyTorch's first launches took
/// a millisecond or more on an H100, BENCHMARKS run 20), launched one at a time into an
/// idle stream at a hard 50. The first sample's events span the loading: its kernel
/// was taught a quarter of that (5 ms for 20 us), and every launch after it was charged
/// from an estimate that decayed only a quarter, then a sixteenth, a sample (40 us a
/// launch here over half a second; training at 50 on an H100 was charged 1.2x what its
/// kernels ran, its once-a-step ones up to 37x the profiler's time). A sample that
/// measured its launch call rather than its kernel teaches nothing
/// (`duty::is_doubtful`): judged by what a launch was charged, 18-22 us, as for the
/// same loop without the loading.
#[test]
fn a_kernel_is_not_taught_the_launch_call_that_loaded_its_code() {
    let (_, trace) = one_at_a_time_charged_its_20us_kernels(
        "hard50-first-launch",
        50,
        500,
        &[("VGPU_SIM_FIRST_LAUNCH_NS", "20000000")],
    );
    assert!(
        trace.get("doubtful_samples") >= 1,
        "the loading's sample was doubtful: {trace:?}"
    );
}

/// A kernel's cost is learned per class of grid (`limiter::Work::key`): one function
/// launched in turn with ten waves (200 us) and one wave (20 us), waited for each time,
/// at a hard 50. Which launch its samples time follows the loop's rhythm, not the work:
/// learned per function, both launches were charged the one-wave launch's cost here (47
/// us a pair for 220 us of work, and the loop took 75.8 % of the card at a hard 50); on
/// an H100 PyTorch's optimizer kernels were charged their full grid's (run 18). Judged by
/// the charge per pair of launches (220 us within 15 %) and by fixed work: 50 within
/// -5/+2.
#[test]
fn a_kernel_launched_with_two_grids_is_charged_each_its_own() {
    let role = Role::plain("k_20us", 1000)
        .streams(1, 1, 132 * 10)
        .mode("two-grids");
    let (report, trace) = run_traced("hard50-two-grids", "    core_limit: 50\n", role);
    let share = report.mean(2, usize::MAX);
    let charged = trace.charged_ns();
    let per_pair = charged / (trace.get("launches") / 2).max(1) as f64;
    eprintln!("two grids at 50: {share:.1}% of the card, charged {per_pair:.0} ns a pair");
    // The trace names the kernel once for each class of grid, with what each learned and
    // how often it ran (the first measurements were of the one-wave grid, the ten-wave
    // grid's are 200 us; each ran as often as the other).
    // The harness's last launch (one block on a stream of its own, `child_process_entry`) is
    // learned too where its sample settles before the exit, never counted as launched.
    let lines: Vec<&TracedKernel> = trace
        .1
        .iter()
        .filter(|k| k.name == "k_20us" && k.launches > 0)
        .collect();
    let (long, short) = (
        lines
            .iter()
            .find(|k| (180_000..=220_000).contains(&k.cost_ns)),
        lines
            .iter()
            .find(|k| (15_000..=25_000).contains(&k.cost_ns)),
    );
    assert!(
        lines.len() == 2
            && long.zip(short).is_some_and(|(l, s)| {
                l.class != s.class && l.launches.abs_diff(s.launches) <= 2 && l.launches > 100
            }),
        "the trace's kernels: {:?}",
        trace.1
    );
    assert!(
        (187_000.0..=253_000.0).contains(&per_pair),
        "charged {per_pair:.0} ns for 220 us of work: {report:?}\n{trace:?}"
    );
    // What each kernel and class was charged adds up to what the process was.
    let by_kernel: i64 = trace.1.iter().map(|k| k.charged_ns).sum();
    assert!(
        (by_kernel as f64 - charged).abs() <= charged * 0.02,
        "charged {by_kernel} ns by kernel, {charged:.0} in all: {:?}",
        trace.1
    );
    assert!(
        (45.0..=52.0).contains(&share),
        "{share:.1}% of the card under a hard 50: {report:?}\n{trace:?}"
    );
}

/// A kernel's first launch with a grid of a class not learned yet, where its function
/// is known with a grid within an octave, is charged a seed from that and then what it
/// ran (`Charged::Seed`), instead of waiting for another first measurement under way:
/// a 100 us kernel taught with 264 blocks, then launched back to back with eight grids
/// new to it (the sim runs 100 us whatever the grid, so every seed is 1.1-2x too much).
/// Without seeds each of the eight launches waits in 100 us sleeps for the one before's
/// first measurement, so the card ends each kernel before the next is even launched:
/// 14 sleeps, and 2.4 ms in the eight launch calls (with seeds, 0.15-0.17 ms).
/// Judged by those sleeps (none), the seeds (eight) and the charge: 1.2 ms within 10 %
/// (uncorrected seeds would charge 1.6 ms). The charged seeds may hold the launches
/// for the limit (at 90, 1.2 ms of kernels launched at once), as known kernels'
/// estimates would.
#[test]
fn a_kernel_with_a_new_grid_goes_out_charged_a_seed_not_waiting_for_another_measurement() {
    let role = Role::plain("k_100us", 300)
        .streams(1, 1, 264)
        .mode("new-grids");
    let (report, trace) = run_traced("hard90-new-grids", "    core_limit: 90\n", role);
    let charged = trace.charged_ns();
    let work = ((NEW_GRIDS_TEACHING + NEW_GRIDS.len()) * 100_000) as f64;
    let calls_ns: u64 = report
        .note("new_grid_calls_ns")
        .and_then(|ns| ns.parse().ok())
        .expect("the launch calls' time");
    eprintln!(
        "new grids: {} seeded, {} sleeps for first measurements ({} in all), launch calls {calls_ns} ns, charged {charged:.0} ns for {work:.0}",
        trace.get("seeded"),
        trace.get("first_measurement_waits"),
        trace.get("waits"),
    );
    assert_eq!(
        trace.get("seeded"),
        NEW_GRIDS.len() as u64,
        "every new grid seeded: {trace:?}"
    );
    assert_eq!(
        trace.get("first_measurement_waits"),
        0,
        "no launch waited for another's first measurement: {trace:?}"
    );
    assert!(
        (work * 0.9..=work * 1.1).contains(&charged),
        "charged {charged:.0} ns for {work:.0} ns of kernels: {trace:?}"
    );
}

/// An unknown kernel launched while another's first measurement is under way waits for
/// it, and the trace gives that part of a launch's wait apart from the bucket's
/// (`longest_first_measurement_wait_ns`), so that a long wait on a card says what it
/// was: a 10 ms kernel never measured, then a 20 us one, back to back, under a limit of
/// 90. The second launch waits for the first's measurement (its sleeps are all of them
/// there are), and then for the bucket, which that measurement charged the 10 ms (a new
/// container's bucket starts empty). In the sim the launch calls took 22 ms: 5.3 ms of
/// sleeps for the measurement (53 of 100 us, longer on the host's clock) and 11.1 ms
/// for the bucket.
#[test]
fn a_wait_for_another_kernels_first_measurement_is_traced_apart_from_the_buckets() {
    let role = Role::plain("k_10ms", 100).mode("unknown-behind-unknown");
    let (report, trace) = run_traced(
        "hard90-unknown-behind-unknown",
        "    core_limit: 90\n",
        role,
    );
    let calls_ns: u64 = report
        .note("two_unknown_calls_ns")
        .and_then(|ns| ns.parse().ok())
        .expect("the launch calls' time");
    let (longest, for_measurement, sleeps) = (
        trace.get("longest_wait_ns"),
        trace.get("longest_first_measurement_wait_ns"),
        trace.get("first_measurement_waits"),
    );
    eprintln!(
        "two unknown kernels: launch calls {calls_ns} ns; longest wait {longest} ns, of it {for_measurement} ns ({sleeps} sleeps) for the measurement"
    );
    assert!(sleeps > 0, "the second kernel did not wait: {trace:?}");
    assert_eq!(
        for_measurement,
        sleeps * 100_000,
        "one launch waited, in 100 us sleeps, for the measurement: {trace:?}"
    );
    assert!(
        longest > for_measurement,
        "the bucket, in debt by the 10 ms once measured, held the second launch too: {trace:?}"
    );
    assert!(
        calls_ns >= longest,
        "the launch calls ({calls_ns} ns) took less than their traced wait ({longest} ns)"
    );
}

/// The trace names a kernel launched by its library handle (as cudart 12 and later, so
/// PyTorch, launch theirs), which `cuFuncGetName` refuses: `cuKernelGetName` names it.
/// Without it the trace said only handles for every kernel of a PyTorch run (run 19).
#[test]
fn the_trace_names_a_kernel_launched_by_its_library_handle() {
    let role = Role::plain("k_100us", 300).mode("one-at-a-time");
    let (_, trace) = run_traced_with(
        "hard50-library-kernel",
        "    core_limit: 50\n",
        role,
        &[(LAUNCH_LIBRARY_KERNELS, "1")],
    );
    assert!(
        trace.1.iter().any(|kernel| kernel.name == "k_100us"),
        "the trace's kernels: {:?}",
        trace.1
    );
}

#[test]
fn hard_limits_hold_in_every_window_with_10ms_kernels() {
    for limit in [10u32, 50, 70] {
        let report = run_one(
            &format!("hard{limit}-10ms"),
            &format!("    core_limit: {limit}\n"),
            Role::plain("k_10ms", 1000),
        );
        if let Err(wrong) = report.near(0, usize::MAX, limit as f64) {
            panic!("limit {limit}: {wrong}: {report:?}");
        }
        assert!(
            report.worst(0) <= limit as f64 + 10.0,
            "limit {limit}: a window above limit+10: {report:?}"
        );
    }
}

/// Concurrent streams of quarter-card kernels: the card is busy the limit's share of the
/// time (the union is charged, not the sum), and their throughput is about that share
/// of what they do bare, also with eight streams, where half the kernels wait for SMs
/// behind the other half.
///
/// What the limiter decides is judged apart from what the host's scheduler does to the
/// child's launching threads (each thread's run-queue time, from its schedstat):
/// - Hard means hard: neither the card's busy time nor the throughput goes above the
///   limit (+5). A starved thread can only lower them.
/// - The limiter spends the budget the host lets it spend: its own account of what it
///   charged is at least the limit (-5) over the time its least starved thread was not
///   waiting for a CPU.
/// - The card ran what it charged (the union of the streams' kernels is charged, not
///   their sum): with one thread driving every stream round-robin, four deep, the
///   streams' kernels are queued side by side whenever it runs, so the card's busy time
///   is within 5 of the limiter's account, and the throughput share is the busy time
///   (-5).
/// - With a thread per stream, how far the kernels overlap on the card is the
///   scheduler's (threads on a 2-core machine launch out of step), and the limiter's
///   projections follow it only in part: a kernel is projected from the clock read as
///   its launch call began, and a kernel that waits for SMs behind the container's own
///   (eight quarter-card streams) is learned with that wait. Open, and on the safe side:
///   over 23 runs idle and loaded, the card was busy 0.70-1.0 of what the limiter
///   charged (one thread: 0.91-1.0), the throughput 0.57-1.0 of the busy time. Judged:
///   the card at least half the charge (the sum charged instead of the union leaves
///   0.26-0.36 with four and eight threads), the throughput a third of the busy time (a
///   limiter that let one thread's kernels through at a time would leave a quarter with
///   four streams).
///
/// A limiter that charges the sum of the streams' kernels instead of their union (each
/// stream then gets a fraction of the share) fails the card's account.
#[test]
fn concurrent_streams_get_their_share_not_a_fraction_of_it() {
    // (streams, threads, limit, kernel, launch call us): slow launch calls from one
    // thread on a card it keeps full once let every launch ride along (CI of cea03dc:
    // the card at 100 % for 0.7 s; `limiter::model` judges that rule in virtual time).
    let cases = [
        (1, 1, 30, "k_100us", 0),
        (4, 1, 30, "k_100us", 0),
        (8, 1, 30, "k_100us", 0),
        (8, 1, 30, "k_100us", 10),
        (2, 2, 30, "k_100us", 0),
        (4, 4, 30, "k_100us", 0),
        (8, 8, 30, "k_100us", 0),
        (4, 1, 70, "k_1ms", 0),
        (8, 8, 70, "k_1ms", 0),
    ];
    const RUN_MS: u64 = 1500;
    let mut failures = Vec::new();
    for (streams, threads, limit, kernel, call_us) in cases {
        let (report, trace) = run_traced(
            &format!("streams{streams}x{threads}-{limit}-{kernel}-call{call_us}us"),
            &format!("    core_limit: {limit}\n"),
            Role::plain(kernel, RUN_MS)
                .streams(streams, threads, QUARTER)
                .launch_call(call_us * 1_000),
        );
        let share = report.mean(2, usize::MAX);
        let busy = report.card_util as f64;
        let charged = trace.charged_percent(RUN_MS);
        let limit = limit as f64;
        let least_starved = report.starved(0, usize::MAX);
        let median_call_ns: f64 = report
            .note("median_call_ns")
            .and_then(|ns| ns.parse().ok())
            .unwrap_or(0.0);
        let (card_least, mut share_least) = if threads == 1 {
            // A thread that waited for a CPU launches out of the rhythm its costs were
            // learned in: its kernels overlap less than projected (the card below the
            // charge) and pack less (throughput below the card's busy time). Lower
            // bounds only, discounted as the others are. And one thread's launch calls
            // are the host's pace: the kernels of a round that fit on the card side by
            // side start a call apart, so the card runs them together for only
            // `kernel / (kernel + (fit - 1) * call)` of their union. On an AMD EPYC
            // host a debug build's call (the shim and the sim) took 14-15 us (median),
            // and with four 100 us kernels the throughput was 0.70-0.81 of the busy
            // time: the bound of busy - 5 alone failed every run there, at d126fb5 and
            // at bddc3ae alike.
            let kept = 1.0 - least_starved;
            let kernel = kernel_ns(kernel) as f64;
            let fit = streams.min(132 / QUARTER) as f64;
            let together = kernel / (kernel + (fit - 1.0) * median_call_ns);
            ((charged - 5.0) * kept, (busy - 5.0) * kept * together)
        } else {
            (charged / 2.0, busy / 3.0)
        };
        if call_us > 0 {
            // Slow calls stagger the kernels the card runs together, so its busy time
            // (what is charged) holds fewer of them at once: the host's pace, not the
            // limiter's, sets the throughput then.
            share_least = 0.0;
        }
        let line = format!(
            "{streams} streams ({threads} threads, launch calls of {call_us} us) of {kernel} at {limit}: share {share:.1}%, card busy {busy}%, the limiter charged {charged:.1}%, least starved thread {:.0}% in the run queue, a launch call {:.1} us (median)",
            least_starved * 100.0,
            median_call_ns / 1000.0
        );
        eprintln!("{line}");
        let mut wrong = Vec::new();
        if busy > limit + 5.0 || share > limit + 5.0 {
            wrong.push("above the limit");
        }
        if charged < (limit - 5.0) * (1.0 - least_starved) {
            wrong.push("budget left unspent");
        }
        if busy < card_least || busy > charged + 5.0 {
            wrong.push("the card's account is not what was charged");
        }
        if share < share_least {
            wrong.push("throughput below the card's busy time");
        }
        if !wrong.is_empty() {
            failures.push(format!("{line}: {}", wrong.join(", ")));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Judged by the limiter's own account, not by the wall clock (a launch call or a
/// window of a child descheduled on a busy 2-core machine says nothing about the
/// limiter): with no limit, or a limit of 100, no launch goes through the limiter, no
/// hold is decided and nothing waits. The same account of a limited run shows launches,
/// holds and waits, so the check can fail.
#[test]
fn no_limit_means_no_delay() {
    for (name, quota) in [("nolimit", ""), ("limit100", "    core_limit: 100\n")] {
        for kernel in ["k_1ms", "k_100us"] {
            let (report, trace) = run_traced(name, quota, Role::plain(kernel, 500));
            assert!(report.launches > 0, "{report:?}");
            for counter in ["launches", "waits", "waited_ns"] {
                assert_eq!(
                    trace.get(counter),
                    0,
                    "{counter} with `{quota}` and {kernel}: {trace:?}"
                );
            }
            assert_eq!(
                report.container_throttled_ns, 0,
                "nothing waited: {report:?}"
            );
        }
    }
    let (report, limited) =
        run_traced("limit30", "    core_limit: 30\n", Role::plain("k_1ms", 500));
    for counter in ["launches", "waits", "waited_ns"] {
        assert!(limited.get(counter) > 0, "{counter}: {limited:?}");
    }
    assert!(report.container_throttled_ns > 0, "{report:?}");
}

#[test]
fn cuda_graphs_are_limited() {
    // Each graph is four 1 ms kernels captured from one stream.
    let report = run_one(
        "graphs",
        "    core_limit: 30\n",
        Role::plain("k_1ms", 1500).mode("graph"),
    );
    let share = report.mean(2, usize::MAX);
    assert!(
        (share - 30.0).abs() <= 5.0,
        "graphs at 30: {share:.1}%: {report:?}"
    );
    assert!((report.card_util as f64 - 30.0).abs() <= 5.0, "{report:?}");
}

/// Judged by the limiter's own account and by time the capturing thread spent in its
/// launch calls other than waiting for a CPU (its schedstat's run-queue time is taken
/// off each call): a captured launch that waited for the limit would sleep, which no
/// run queue explains.
#[test]
fn captured_launches_are_neither_delayed_nor_timed_and_captures_survive() {
    // One thread captures (global mode) while another launches throttled, always-sampled
    // 1 ms kernels at 10%: the limiter's event calls must not invalidate the capture,
    // and the captured launches must not wait on the limit.
    let (report, trace) = run_traced(
        "capture",
        "    core_limit: 10\n",
        Role::plain("k_1ms", 800).mode("capture"),
    );
    assert_eq!(report.note("capture"), Some("ok"), "{report:?}");
    assert_eq!(
        trace.get("captured"),
        CAPTURED_LAUNCHES,
        "every captured launch took the limiter's capture path: {trace:?}"
    );
    let slowest: u64 = report
        .note("captured_max_call_ns")
        .and_then(|v| v.parse().ok())
        .expect("captured launch timing");
    assert!(
        slowest < 2_000_000,
        "a captured launch spent {slowest} ns in the call, not waiting for a CPU"
    );
    assert!(
        (report.mean(2, usize::MAX) - 10.0).abs() <= 5.0,
        "the other thread is still limited: {report:?}"
    );
}

/// A capture that begins on a stream while the thread's tab covers it: the launches it
/// records ran nothing, so none is charged on the tab (`limiter::tab` asks about
/// captures again once `lifecycle::sole_device` stops vouching for the launch).
#[test]
fn a_capture_that_begins_under_an_open_tab_charges_none_of_its_launches() {
    let (report, trace) = run_traced(
        "capture-on-tab",
        "    core_limit: 90\n",
        Role::plain("k_20us", 600).mode("capture-on-tab"),
    );
    assert_eq!(report.note("capture"), Some("ok"), "{report:?}");
    let captured: u64 = report
        .note("captured_launches")
        .and_then(|v| v.parse().ok())
        .expect("captured launches");
    assert!(captured >= 4 * CAPTURED_PER_ROUND, "{report:?}");
    assert!(trace.get("tabbed") > 0, "the rounds ran on tabs: {trace:?}");
    assert_eq!(
        trace.get("captured"),
        captured,
        "every captured launch took the limiter's capture path: {trace:?}"
    );
}

#[test]
fn soft_mode_alone_uses_the_idle_card() {
    let _serial = serial();
    let machine = Machine::new("soft-alone");
    let soft = machine.container("soft", "    core_limit: 30\n    core_mode: soft\n");
    let capped = machine.container(
        "capped",
        "    core_limit: 30\n    core_mode: soft\n    core_ceiling: 50\n",
    );
    let host = Host::start(
        &machine,
        vec![
            spec(&soft, 30, CoreMode::Soft, None),
            spec(&capped, 30, CoreMode::Soft, Some(50)),
        ],
    );
    let alone = finish(machine.spawn(&soft, Role::plain("k_1ms", 1000)));
    let ceiling = finish(machine.spawn(&capped, Role::plain("k_1ms", 1000)));
    // The only complaint: a region that did not exist yet (its container not started).
    let problems = host.stop();
    assert!(
        problems.iter().all(|p| p.contains("No such file")),
        "{problems:?}"
    );
    assert!(
        alone.mean(2, usize::MAX) >= 80.0 * (1.0 - alone.starved(2, usize::MAX)),
        "soft mode alone stayed at {:.1}% ({:.0}% starved): {alone:?}",
        alone.mean(2, usize::MAX),
        alone.starved(2, usize::MAX) * 100.0
    );
    if let Err(wrong) = ceiling.near(2, usize::MAX, 50.0) {
        panic!("soft with ceiling 50: {wrong}: {ceiling:?}");
    }
}

#[test]
fn soft_mode_without_a_fresh_view_keeps_to_its_limit() {
    // No coordinator runs: the view is missing, which means "assume contended".
    let report = run_one(
        "soft-no-view",
        "    core_limit: 30\n    core_mode: soft\n",
        Role::plain("k_1ms", 1000),
    );
    if let Err(wrong) = report.near(0, usize::MAX, 30.0) {
        panic!("{wrong}: {report:?}");
    }
}

/// The soft container's rate in force (its region's shared `RATE_PPM` word, what its
/// processes last read from the host's view), polled by the test every 20 ms while
/// `running`: (when, rate ppm; 0 is unset, which means its limit).
fn poll_rate(
    region: PathBuf,
    running: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Vec<(u64, u64)>> {
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        while running.load(Ordering::Relaxed) {
            if let Ok(snapshot) = vgpu_contract::snapshot::RegionSnapshot::read(&region) {
                let words = snapshot.container_limiter(0);
                seen.push((
                    monotonic_ns(),
                    words[vgpu_contract::limiter_words::container::RATE_PPM],
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        seen
    })
}

/// Judged by what the limiter decided (the rate in force, from the container's own
/// region) and, for what it let through, by the simulated card's own account (windows
/// count kernels where they ended on the card's timeline). Nothing here needs the host
/// to keep up: on a busy 2-core machine a starved child leaves the card idle, which can
/// only lower its windows, and the upper bounds are what a limiter can break. Where the
/// limiter decides wrong (no ceiling alone, no fall back, or a fall back later than a
/// second) it fails, whatever the machine's load.
#[test]
fn soft_mode_falls_back_within_a_second_when_another_container_is_busy() {
    let _serial = serial();
    let machine = Machine::new("soft-contended");
    let soft = machine.container("soft", "    core_limit: 30\n    core_mode: soft\n");
    let other = machine.container("other", "    core_limit: 60\n");
    let host = Host::start(
        &machine,
        vec![
            spec(&soft, 30, CoreMode::Soft, None),
            spec(&other, 60, CoreMode::Hard, None),
        ],
    );
    let running = Arc::new(AtomicBool::new(true));
    let first = machine.spawn(&soft, Role::plain("k_1ms", 3000));
    let rates = poll_rate(soft.with_file_name("usage.region"), running.clone());
    std::thread::sleep(Duration::from_millis(1000));
    let second = machine.spawn(&other, Role::plain("k_1ms", 1800));
    let (soft, other) = (finish(first), finish(second));
    running.store(false, Ordering::Relaxed);
    let rates = rates.join().expect("poller");
    drop(host);
    let other_end = other.t0 + 1800 * 1_000_000;
    let second_starts = ((other.t0.saturating_sub(soft.t0)) / WINDOW_NS) as usize;
    eprintln!(
        "soft windows {:?}\nsecond starts at window {second_starts}; its windows {:?}\nrates {:?}",
        soft.windows,
        other.windows,
        rates
            .iter()
            .map(|(at, ppm)| (at.saturating_sub(soft.t0) / 1_000_000, ppm / 10_000))
            .collect::<Vec<_>>()
    );
    // Alone (from its first view on), its limiter allows the ceiling: the whole card.
    let alone: Vec<u64> = rates
        .iter()
        .filter(|(at, _)| (soft.t0 + 500_000_000..other.t0).contains(at))
        .map(|(_, ppm)| *ppm)
        .collect();
    assert!(
        !alone.is_empty() && alone.iter().all(|ppm| *ppm == 1_000_000),
        "alone it should be allowed the idle card: {alone:?}"
    );
    // From a second after the other container started until it stops: its limit. Not
    // where the other's launching thread had no CPU for half of a window in the 300 ms
    // before (its activity is judged over 200 ms; a host that starves it makes it idle,
    // and the idle card is the soft container's to use).
    let other_starved = |at: u64| {
        let window = (at.saturating_sub(other.t0) / WINDOW_NS) as usize;
        (window.saturating_sub(3)..=window).any(|w| other.starved(w, w + 1) >= 0.5)
    };
    let during: Vec<(u64, u64)> = rates
        .iter()
        .copied()
        .filter(|(at, _)| (other.t0 + 1_000_000_000..other_end).contains(at))
        .collect();
    assert!(
        !during.is_empty(),
        "no rate read while the other ran: {rates:?}"
    );
    let contended: Vec<u64> = during
        .iter()
        .filter(|(at, _)| !other_starved(*at))
        .map(|(_, ppm)| *ppm)
        .collect();
    if contended.is_empty() {
        // Every reading fell where the host starved the other container: its idleness
        // was real then, and the card the soft one's to use. The bounds below still judge.
        eprintln!(
            "soft fall-back: the other container was starved at every reading; the rate is not judged"
        );
    }
    assert!(
        contended.iter().all(|ppm| *ppm == 300_000),
        "not back to 30% within a second of the other's start: {contended:?}"
    );
    // What it took meanwhile, by the card's timeline: never above its share.
    let settled = second_starts + 10;
    let fallback_end = second_starts + 17;
    // The mean is the share; a single 100 ms window may stand out while the host's
    // correction still converges (it is computed over a second in which the soft
    // container ran alone; single windows of 41-43 were seen 1.3-1.5 s in, about one
    // run in ten, the idle machine included; the limiter's rate was 30 throughout).
    // Open in issue 25: the correction's convergence. Never twice its share.
    let mean = soft.mean(settled, fallback_end);
    assert!(mean <= 35.0, "under contention: {mean:.1}%: {soft:?}");
    assert!(
        soft.windows[settled..fallback_end]
            .iter()
            .all(|w| *w <= 45.0),
        "{soft:?}"
    );
    // The fall back itself is quick: within 300 ms of the other container's start.
    assert!(
        soft.mean(second_starts + 3, settled) <= 40.0,
        "slow fallback: {soft:?}"
    );
    // And the other (hard 60) never took more than its share.
    let other_mean = other.mean(0, 17);
    assert!(
        other_mean <= 65.0,
        "hard 60 beside soft 30: {other_mean:.1}%"
    );
}

#[test]
fn two_containers_at_30_and_60_each_get_their_share() {
    let _serial = serial();
    let machine = Machine::new("pair");
    let a = machine.container("a", "    core_limit: 30\n");
    let b = machine.container("b", "    core_limit: 60\n");
    let host = Host::start(
        &machine,
        vec![
            spec(&a, 30, CoreMode::Hard, None),
            spec(&b, 60, CoreMode::Hard, None),
        ],
    );
    let first = machine.spawn(&a, Role::plain("k_1ms", 3000));
    let second = machine.spawn(&b, Role::plain("k_1ms", 3000));
    let (a, b) = (finish(first), finish(second));
    let problems = host.stop();
    eprintln!(
        "two containers at 30 and 60 on a time-sliced card: {:.1}% and {:.1}% (from 1.5 s in), card busy {}%\n{:?}\n{:?}\n{problems:?}",
        a.mean(15, usize::MAX),
        b.mean(15, usize::MAX),
        b.card_util,
        a.windows,
        b.windows
    );
    // Once the host's correction has settled (its window is a second).
    let (a, b) = (a.near(15, usize::MAX, 30.0), b.near(15, usize::MAX, 60.0));
    assert!(
        a.is_ok() && b.is_ok(),
        "{a:?} and {b:?} (each is charged the other's time slices without the host's correction)"
    );
}

/// A neighbour of a hard container on the card.
#[derive(Clone, Copy, Debug)]
enum Neighbour {
    /// Soft 30, default ceiling (the whole idle card).
    Soft30,
    /// Hard 30.
    Hard30,
    /// No compute limit: the host does not coordinate it, only the card sees it.
    Unlimited,
}

/// A hard container at `limit` beside `neighbour`, both busy with 1 ms kernels: the
/// neighbour starts first (a soft one has the whole idle card), the hard one a second
/// later. Both reports, their windows from the hard one's start.
fn hard_beside(limit: u32, neighbour: Neighbour) -> (Report, Report) {
    hard_beside_with(limit, neighbour, CardSamples::Exact)
}

fn hard_beside_with(limit: u32, neighbour: Neighbour, samples: CardSamples) -> (Report, Report) {
    let _serial = serial();
    let machine = Machine::new(&format!("hard{limit}-beside-{neighbour:?}-{samples:?}"));
    let hard = machine.container("hard", &format!("    core_limit: {limit}\n"));
    let (quota, entitled) = match neighbour {
        Neighbour::Soft30 => (
            "    core_limit: 30\n    core_mode: soft\n",
            Some((30, CoreMode::Soft)),
        ),
        Neighbour::Hard30 => ("    core_limit: 30\n", Some((30, CoreMode::Hard))),
        Neighbour::Unlimited => ("", None),
    };
    let other = machine.container("other", quota);
    let mut specs = vec![spec(&hard, limit, CoreMode::Hard, None)];
    specs.extend(entitled.map(|(limit, mode)| spec(&other, limit, mode, None)));
    let host = Host::start_with(&machine, specs, samples);
    let first = machine.spawn(&other, Role::plain("k_1ms", 4000));
    std::thread::sleep(Duration::from_millis(1000));
    let second = machine.spawn(&hard, Role::plain("k_1ms", 2500));
    let (mut other, hard) = (finish(first), finish(second));
    drop(host);
    // The neighbour's windows from the hard one's start.
    let skip = (hard.t0.saturating_sub(other.t0) / WINDOW_NS) as usize;
    other.windows.drain(..skip.min(other.windows.len()));
    for note in other.notes.iter_mut() {
        if let Some(list) = note.strip_prefix("starved_ns=") {
            let kept: Vec<&str> = list.split(',').skip(skip).collect();
            *note = format!("starved_ns={}", kept.join(","));
        }
    }
    (hard, other)
}

impl Report {
    /// The highest mean of 10 consecutive 100 ms windows (a second) within `from..to`.
    fn worst_second(&self, from: usize, to: usize) -> f64 {
        let windows = &self.windows[from.min(self.windows.len())..to.min(self.windows.len())];
        windows
            .windows(10)
            .map(|second| second.iter().sum::<f64>() / 10.0)
            .fold(0.0, f64::max)
    }
}

/// Issue 25: a hard limit is hard whatever runs beside it. A hard 30, 40 and 60 beside
/// a soft 30 (default ceiling: it has the whole idle card when the hard one starts), a
/// hard 30 and an unlimited neighbour, all busy with 1 ms kernels on a card that
/// time-slices between them, the host coordinating over the sim's NVML.
///
/// Judged by the card's own timeline (each kernel counts in the 100 ms window where it
/// ended on the simulated card); a starved thread or a late host only lowers a share:
/// - Its start (every second that begins in its first half second): never above its
///   limit + 2. Before, the coordinator set the card's one-second figure against half a
///   second of the starting container's own and kept a discount earned while a soft
///   neighbour still ran at its ceiling: 100 ms windows of 70-93 % at 60, and seconds
///   of 62.3 at 60 and 44.1 at 40 beside the soft 30. Then its bucket started full, a
///   window's burst on top of its rate: first seconds of 61.5-63.0 at 60 (CI of
///   bddc3ae: 63.0 beside a hard 30); it starts empty now (60.1-60.6). Open (issue
///   25): with the other core busy (a shell loop), 2 of 4 runs had starts of 62.5-63.3
///   at 60 beside the soft 30 (100 ms windows of 70, 69, 64, 63 after the first) and
///   one of 42.3 at 40 beside the unlimited neighbour, while the limiter charged its
///   launches within 0.3 % of their estimates (1498 ms for 1508 launches of 1 ms):
///   what lets the card run more than was charged in that second is not found.
/// - Any second of its run: never above its limit + 5. Open (issue 25): on this
///   project's loaded 2-core machine about one run in three has a second 2-4 points
///   over, with every neighbour kind (a neighbour's pause shorter than the host's tick
///   leaves a discount for slices that are not there).
/// - Settled (1.5-2.5 s in), it and a limited neighbour hold their shares within 5.
///   Beside an unlimited neighbour that always has work queued, the card alternates
///   turns, so a hard container gets at most half of it: its share there is
///   `min(limit, 50)`.
/// - An unlimited neighbour is not the host's: only the card's one-second figures tell
///   when it pauses, and a discount earned beside it outlives a pause by up to a second
///   (open). Its pauses here are the host's scheduler's: the hard container is judged
///   beside it only where it was starved less than 3 % of the run.
#[test]
fn hard_limits_hold_beside_any_neighbour() {
    let mut failures = Vec::new();
    for neighbour in [Neighbour::Soft30, Neighbour::Hard30, Neighbour::Unlimited] {
        for limit in [30u32, 40, 60] {
            let (hard, other) = hard_beside(limit, neighbour);
            let (start, worst) = (hard.worst_second(0, 15), hard.worst_second(0, 25));
            let share = match neighbour {
                Neighbour::Unlimited => limit.min(50),
                _ => limit,
            };
            let neighbour_starved = other.starved(0, 25);
            let line = format!(
                "hard {limit} beside {neighbour:?}: worst second {worst:.1}, at its start {start:.1}, settled {:.1} (neighbour {:.1}, starved {:.0}%)",
                hard.mean(15, 25),
                other.mean(15, 25),
                neighbour_starved * 100.0
            );
            eprintln!(
                "{line}\n  hard {:?}\n  neighbour {:?}",
                hard.windows, other.windows
            );
            let mut wrong = Vec::new();
            let unseen_pauses =
                matches!(neighbour, Neighbour::Unlimited) && neighbour_starved >= 0.03;
            if unseen_pauses {
                eprintln!("  the bounds not judged: the unlimited neighbour paused");
            } else {
                if start > limit as f64 + 2.0 {
                    wrong.push("a second of its start above the limit + 2".to_string());
                }
                if worst > limit as f64 + 5.0 {
                    wrong.push("a second above the limit + 5".to_string());
                }
            }
            if !unseen_pauses && let Err(why) = hard.near(15, 25, share as f64) {
                wrong.push(format!("hard: {why}"));
            }
            if !matches!(neighbour, Neighbour::Unlimited)
                && let Err(why) = other.near(15, 25, 30.0)
            {
                wrong.push(format!("neighbour: {why}"));
            }
            if !wrong.is_empty() {
                failures.push(format!("{line}: {}", wrong.join(", ")));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Issue 25, with the card's per-process figures as the H200 gives them: one sample
/// per process every 0.2-1 s, swung far from the truth, now and then none for a second
/// (`VGPU_SIM_NVML_SAMPLES=sparse`). A factor that followed them let a hard 40 and 60
/// beside a limited neighbour run at 45.7-68.4 in single seconds here. The coordinator
/// now uses them only where the containers' own figures sum beyond the card's
/// utilization (their events timing each other's slices).
///
/// Judged by the card's timeline, the bounds of `hard_limits_hold_beside_any_neighbour`
/// for the hard container (its start: every second within limit + 2; any second within
/// limit + 5). The neighbour's share is not judged here: the band of the sparse samples
/// cannot show it.
///
/// With events that wait for their turn, as the H200's appear to (BENCHMARKS run 11: the
/// containers' own figures summed below the card's), each container's own figure is
/// what it got: worst seconds of 40.7-40.9 at 40 and 61.1-61.3 at 60 in two runs (with
/// the per-process rule applied regardless, 40.9-44.4 and 62.1-65.7, a start of 64.5 at
/// 60 failing the bound; with a split of the card by the containers' own figures,
/// 42.6-44.4 and 56.5-72.5 when events fired at their record).
#[test]
fn hard_limits_hold_beside_limited_neighbours_when_the_cards_samples_are_sparse() {
    let mut failures = Vec::new();
    for neighbour in [Neighbour::Soft30, Neighbour::Hard30] {
        for limit in [40u32, 60] {
            let (hard, other) = hard_beside_with(limit, neighbour, CardSamples::Sparse);
            let (start, worst) = (hard.worst_second(0, 15), hard.worst_second(0, 25));
            let line = format!(
                "hard {limit} beside {neighbour:?}, sparse samples: worst second {worst:.1}, at its start {start:.1}, settled {:.1} (neighbour {:.1})",
                hard.mean(15, 25),
                other.mean(15, 25)
            );
            eprintln!("{line}\n  hard {:?}", hard.windows);
            if start > limit as f64 + 2.0 || worst > limit as f64 + 5.0 {
                failures.push(line);
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Issue 25, a hostile tenant: beside a busy neighbour, a sample of a launch into an idle
/// stream may time the neighbour's turn on the card too, so the limiter charges it no
/// more than its kernel's estimate and lets it teach only a run near the estimate
/// (`duty::idle_sample_may_time_a_neighbour`). A tenant that teaches its kernel short
/// (one wave, queued back to back) and then launches it ten waves long, one launch at a
/// time into an idle stream, is charged a tenth of what it runs. The card's own account
/// catches it: the host charges a container the card sees at twice what it counted (and
/// 10 points more) for two seconds what the card saw, and reports it
/// (`coordinator::escape_ratio`).
///
/// A hard 30 doing that beside a busy hard 30 (1 ms kernels), the host coordinating;
/// judged by the card's timeline from 3.5 s in (its own figure is judged from a second
/// in, the escape believed two seconds later): the hostile container's worst second
/// within its limit + 5, the neighbour its share within 5, and the host's report names
/// it. Before: 64.5-65.5 % of the card throughout; now 30.2-30.5 from 3.5 s in (63.7-64.5
/// before the host's judgement).
#[test]
fn a_tenant_that_teaches_its_kernel_short_is_held_beside_a_neighbour_by_the_cards_account() {
    let (hostile, other, problems) = hostile_beside_a_busy_30(CardSamples::Exact, 5000);
    let skip = (hostile.t0.saturating_sub(other.t0) / WINDOW_NS) as usize;
    let line = format!(
        "hostile 30 beside a hard 30: before the host's judgement {:.1}, after {:.1}, its worst second {:.1} (neighbour {:.1}); host: {problems:?}",
        hostile.mean(5, 25),
        hostile.mean(35, 50),
        hostile.worst_second(35, 50),
        other.mean(skip + 35, skip + 50)
    );
    eprintln!(
        "{line}\n  hostile {:?}\n  neighbour {:?}",
        hostile.windows, other.windows
    );
    assert!(hostile.worst_second(35, 50) <= 35.0, "{line}");
    assert!(
        (other.mean(skip + 35, skip + 50) - 30.0).abs() <= 5.0,
        "{line}"
    );
    assert!(
        problems
            .iter()
            .any(|problem| problem.contains("container hostile")),
        "the host reports the escape: {line}"
    );
}

/// The same hostile tenant with the card's per-process figures as the real cards give
/// them (`VGPU_SIM_NVML_SAMPLES=sparse`: now and then, swung far from the truth). On an
/// H100 (BENCHMARKS run 15) the host caught it, then let the factor go on a reading of
/// 11 % against a count of 2 %, and then followed each reading down to a third of its
/// factor: 45.0 % and then a worst second of 47.4 after the host's judgement. Judged
/// from 5 s in (the escape believed once the sparse figures have shown it for two
/// seconds): its worst second within its limit + 5, and the host reports it.
#[test]
fn a_tenant_that_teaches_its_kernel_short_is_held_when_the_cards_samples_are_sparse() {
    let (hostile, _, problems) = hostile_beside_a_busy_30(CardSamples::Sparse, 9000);
    let line = format!(
        "hostile 30 beside a hard 30, sparse samples: before the host's judgement {:.1}, from 5 s {:.1}, its worst second {:.1}; host: {problems:?}",
        hostile.mean(5, 25),
        hostile.mean(50, 90),
        hostile.worst_second(50, 90),
    );
    eprintln!("{line}\n  hostile {:?}", hostile.windows);
    assert!(hostile.worst_second(50, 90) <= 35.0, "{line}");
    assert!(
        problems
            .iter()
            .any(|problem| problem.contains("container hostile")),
        "the host reports the escape: {line}"
    );
}

/// The hostile tenant of the two tests above (a hard 30 whose kernel is taught from
/// one-wave launches and launched ten waves long, for `run_ms`) beside a busy hard 30
/// (1 ms kernels, started a second before), the host coordinating with `samples`: the
/// hostile container's report, its neighbour's, and the host's problems.
fn hostile_beside_a_busy_30(samples: CardSamples, run_ms: u64) -> (Report, Report, Vec<String>) {
    let _serial = serial();
    let machine = Machine::new(&format!("hostile-{samples:?}"));
    let hostile = machine.container("hostile", "    core_limit: 30\n");
    let other = machine.container("other", "    core_limit: 30\n");
    let host = Host::start_with(
        &machine,
        vec![
            spec(&hostile, 30, CoreMode::Hard, None),
            spec(&other, 30, CoreMode::Hard, None),
        ],
        samples,
    );
    let first = machine.spawn(&other, Role::plain("k_1ms", run_ms + 1500));
    std::thread::sleep(Duration::from_millis(1000));
    let second = machine.spawn(
        &hostile,
        Role::plain("k_scaled_100us", run_ms)
            .streams(1, 1, 132)
            .mode("hostile"),
    );
    let (other, hostile) = (finish(first), finish(second));
    (hostile, other, host.stop())
}

/// A batch-1 decode loop (steps of `DECODE_KERNELS` 100 us kernels on one stream, each
/// step waited for) at `decode_limit` beside a busy hard neighbour at `busy_limit`
/// (1 ms kernels), the host coordinating, the sim's `VGPU_SIM_EVENT_TURNS` as given:
/// the decode loop's report and its limiter's trace.
fn decode_beside_a_busy_neighbour(
    decode_limit: u32,
    busy_limit: u32,
    event_turns: &str,
) -> (Report, Trace) {
    decode_with_launch_calls_beside_a_busy_neighbour(decode_limit, busy_limit, event_turns, 0)
}

/// `decode_beside_a_busy_neighbour` with the loop's launch calls taking `launch_call_ns`
/// of host time each (`Role::launch_call`).
fn decode_with_launch_calls_beside_a_busy_neighbour(
    decode_limit: u32,
    busy_limit: u32,
    event_turns: &str,
    launch_call_ns: u64,
) -> (Report, Trace) {
    let _serial = serial();
    let machine = Machine::new(&format!(
        "decode{decode_limit}-beside-busy{busy_limit}-turns{event_turns}"
    ));
    let decode = machine.container("decode", &format!("    core_limit: {decode_limit}\n"));
    let busy = machine.container("busy", &format!("    core_limit: {busy_limit}\n"));
    let host = Host::start(
        &machine,
        vec![
            spec(&decode, decode_limit, CoreMode::Hard, None),
            spec(&busy, busy_limit, CoreMode::Hard, None),
        ],
    );
    let neighbour = machine
        .command(&busy, Role::plain("k_1ms", 3000))
        .env("VGPU_SIM_EVENT_TURNS", event_turns)
        .spawn()
        .expect("spawn neighbour");
    let trace = machine.scratch.0.join("decode.trace");
    let looped = machine
        .command(
            &decode,
            Role::plain("k_100us", 2500)
                .mode("decode")
                .launch_call(launch_call_ns),
        )
        .env("VGPU_LIMITER_TRACE", &trace)
        .env("VGPU_SIM_EVENT_TURNS", event_turns)
        .spawn()
        .expect("spawn decode loop");
    let (report, _) = (finish(looped), finish(neighbour));
    drop(host);
    (report, Trace::read(&trace))
}

/// Issue 25, "no stalls": a latency-bound loop on one stream beside a busy neighbour
/// waits for its debt, not for the 15 ms refill that lets many streams resume together.
/// On the H200 (BENCHMARKS run 11) a decode loop beside a busy neighbour had steps of
/// 35 ms at 50/50 with the refill and 4.8 ms without it (time-slicing alone: 2.7).
///
/// Judged by the limiter's own account, not the wall clock (a busy machine stretches
/// steps on its own): the longest any one launch of the loop waited on the bucket. A
/// launch's debt is at most a few of its kernels' measured cost over its rate, so the
/// bound is 10 ms; with the refill every hold lasts at least 15 ms. The step times are
/// printed, for the record.
///
/// Twice: with the sim's events waiting for their process's turn
/// (`VGPU_SIM_EVENT_TURNS=1`), each kernel's measured cost is its own and the loop,
/// within its limit, is hardly held at all; with `VGPU_SIM_EVENT_TURNS=0` (the sim's
/// default, as the H200 does: BENCHMARKS run 12) its events time the neighbour's turns
/// too, its kernels look long and the bucket holds it often, as the H200's stalls say it
/// is held there. The second is where the refill shows (15.5-16.4 ms longest waits with it,
/// 0.9-6.1 ms without), and the loop must have been held there for the test to judge.
#[test]
fn a_one_stream_loop_beside_a_busy_neighbour_waits_for_its_debt_not_a_refill() {
    let mut failures = Vec::new();
    for (decode_limit, busy_limit, event_turns) in [
        (50u32, 50u32, "1"),
        (70, 30, "1"),
        (50, 50, "0"),
        (70, 30, "0"),
    ] {
        let (report, trace) = decode_beside_a_busy_neighbour(decode_limit, busy_limit, event_turns);
        let note = |name: &str| {
            report
                .notes
                .iter()
                .find_map(|n| n.strip_prefix(&format!("{name}=")))
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        let longest = trace.get("longest_wait_ns");
        let line = format!(
            "decode at {decode_limit} beside a busy {busy_limit}, event turns {event_turns}: longest wait {:.2} ms over {} waits; steps {} p50 {:.2} p99 {:.2} max {:.2} ms (wall)",
            longest as f64 / 1e6,
            trace.get("waits"),
            note("steps"),
            note("step_p50_ns") as f64 / 1e6,
            note("step_p99_ns") as f64 / 1e6,
            note("step_max_ns") as f64 / 1e6,
        );
        eprintln!("{line}\n  {trace:?}");
        if trace.get("launches") == 0 {
            failures.push(format!("{line}: no trace (or no limit)"));
        } else if event_turns == "0" && trace.get("waits") == 0 {
            failures.push(format!("{line}: never held, so nothing judged"));
        } else if longest > 10_000_000 {
            failures.push(line);
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Issue 25, "no stalls": a one-stream loop beside a busy neighbour is charged what its
/// own kernels ran, not the neighbour's turns that its samples timed. On a time-sliced
/// card an event recorded on an idle stream fires at once although another context holds
/// the card (the H200: BENCHMARKS run 12, `event_turns.py`), so a sample of the first
/// kernel of a step times the wait for the neighbour's slice too; a loop's estimate of
/// a 10 us kernel grew to 54-93 us on the H200 (run 12) and its steps stalled. The sim's
/// `VGPU_SIM_EVENT_TURNS=0` is that card: a step's first kernel waits for the
/// neighbour's 1 ms kernel. Before, a loop at 70 beside a busy 30 was charged 1.70x
/// what it ran (its estimate 1.5-4.6x the kernel's 100 us) and waited 1.0 s of 2.5.
///
/// Twice: with launch calls as fast as the sim's, and with each launch call taking 200 us
/// of host time, longer than the kernel (a slow or loaded host: then every sample starts
/// on an idle stream, and only those can correct an estimate). In CI's run of bddc3ae
/// the first read 1.75x: the samples taken before the host's view named the neighbour
/// taught the kernel 750 us, and the set-aside samples that would have brought it down
/// taught nothing (the same with 200 us launch calls here: 1.45-2.03x, the estimate held
/// at 144 us). Set-aside samples near the estimate now teach it
/// (`duty::set_aside_sample_teaches`): 0.97-1.01x at both speeds.
///
/// Judged by the limiter's own account, not by the wall clock: most of its samples on an
/// idle stream taken to time a neighbour (at least two thirds: 819-1040 of 830-1042 here;
/// with 200 us launch calls and the other core busy 1003-1281 of 1250-1306, 77.8 % and
/// 79.2 % in 2 runs of 14, where the bound of 80 % failed them with the charge at
/// 1.07-1.09x; the old code took none), and what it charged as measured (launches' charges and settled
/// corrections, before the host's factor) over what its launches ran (each runs 100 us
/// on the sim's card) within 0.9 and 1.3 (1.01-1.12 with the fast calls in 30 release
/// runs before the band, 1.39 once under CI's load; the old code 1.70-1.84).
///
/// Not judged at 50 beside a busy 50: the sim's turns are a kernel long, so there the
/// neighbour's kernels also run between the loop's own within a step and its samples
/// behind queued work time them too (1.8-2.4x); on a card whose slices last longer than
/// a step that happens only where a slice ends within one.
#[test]
fn a_one_stream_loop_is_charged_its_kernels_not_the_slices_its_idle_samples_waited_for() {
    let mut failures = Vec::new();
    for launch_call_ns in [0u64, 200_000] {
        let (report, trace) =
            decode_with_launch_calls_beside_a_busy_neighbour(70, 30, "0", launch_call_ns);
        let ran = trace.get("launches") as f64 * 100_000.0;
        let charged = trace.charged_ns();
        let ratio = charged / ran.max(1.0);
        let step_max_ns = report
            .note("step_max_ns")
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0);
        let line = format!(
            "decode at 70 beside a busy 30, launch calls of {} us: charged {:.3} s for {:.3} s of its kernels ({ratio:.2}x); {} idle samples discounted of {}; waited {:.0} ms, longest {:.2} ms; step max {:.2} ms (wall)",
            launch_call_ns / 1000,
            charged / 1e9,
            ran / 1e9,
            trace.get("settled_idle_discounted"),
            trace.get("settled_idle"),
            trace.get("waited_ns") as f64 / 1e6,
            trace.get("longest_wait_ns") as f64 / 1e6,
            step_max_ns / 1e6,
        );
        eprintln!("{line}\n  {trace:?}");
        if trace.get("launches") == 0 || trace.get("settled_idle") == 0 {
            failures.push(format!("{line}: no idle samples, nothing judged"));
        } else if trace.get("settled_idle_discounted") * 3 < trace.get("settled_idle") * 2 {
            failures.push(format!("{line}: its idle samples were learned and charged"));
        } else if !(0.9..=1.3).contains(&ratio) {
            failures.push(line);
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The other side of the rule above: a one-stream loop that the host's card view shows
/// alone on the card learns from its idle-stream samples (no neighbour's slice can be in
/// them). Judged by the limiter's trace: of its samples on an idle stream, at most a
/// tenth taken to time a neighbour (room for those before the host's first view names
/// it alone; none in practice: 0 of 508-520); with the view not read, 484 of 485 were.
#[test]
fn a_one_stream_loop_alone_on_the_card_learns_from_its_idle_samples() {
    let _serial = serial();
    let machine = Machine::new("decode-alone");
    let decode = machine.container("decode", "    core_limit: 50\n");
    let host = Host::start(&machine, vec![spec(&decode, 50, CoreMode::Hard, None)]);
    let trace = machine.scratch.0.join("decode.trace");
    let looped = machine
        .command(&decode, Role::plain("k_100us", 2500).mode("decode"))
        .env("VGPU_LIMITER_TRACE", &trace)
        .spawn()
        .expect("spawn decode loop");
    finish(looped);
    drop(host);
    let trace = Trace::read(&trace);
    let (idle, discounted) = (
        trace.get("settled_idle"),
        trace.get("settled_idle_discounted"),
    );
    eprintln!("decode alone at 50: {discounted} of {idle} idle samples discounted\n  {trace:?}");
    assert!(idle >= 50, "too few idle samples to judge: {trace:?}");
    assert!(
        discounted * 10 <= idle,
        "{discounted} of {idle} idle samples taken to time a neighbour, alone"
    );
}

/// A one-stream container's kernels that wait for a neighbour's slice on the time-sliced
/// card are not charged as its own busy time: a hard 30 on one stream of 1 ms kernels
/// beside a hard 60 of four streams (whose refills hold the card for stretches of
/// kernels at a time), the host coordinating. Before, a sample that ran later than its
/// projection was charged its real run on top of its projection, so the waits counted
/// twice (a soft 30 on one stream beside a hard 60 got 24.3 % of the card in one run of
/// four of `hard_limits_hold_beside_any_neighbour`); and a split of the card by the
/// containers' own figures handed the four-stream union's overstatement to the one
/// stream as a discount of 15 % (32.4-34.9 % of the card). Judged by the card's timeline
/// once the host's correction has settled.
#[test]
fn a_one_stream_container_is_not_charged_for_its_neighbours_turns() {
    let _serial = serial();
    let machine = Machine::new("one-stream-beside-bursts");
    let single = machine.container("single", "    core_limit: 30\n");
    let bursty = machine.container("bursty", "    core_limit: 60\n");
    let host = Host::start(
        &machine,
        vec![
            spec(&single, 30, CoreMode::Hard, None),
            spec(&bursty, 60, CoreMode::Hard, None),
        ],
    );
    let neighbour = machine.spawn(&bursty, Role::plain("k_1ms", 3000).streams(4, 1, QUARTER));
    let trace = machine.scratch.0.join("single.trace");
    let child = machine
        .command(&single, Role::plain("k_1ms", 3000))
        .env("VGPU_LIMITER_TRACE", &trace)
        .spawn()
        .expect("spawn");
    let (report, other) = (finish(child), finish(neighbour));
    drop(host);
    let trace = Trace::read(&trace);
    let (got, charged) = (report.mean(15, 30), trace.charged_percent(3000));
    eprintln!(
        "one stream at 30 beside four at 60: {got:.1}% of the card (from 1.5 s), charged {charged:.1}% over the run; neighbour {:.1}%\n  {:?}\n  {trace:?}",
        other.mean(15, 30),
        report.windows
    );
    let starved = report.starved(15, 30);
    assert!(
        got >= 25.0 * (1.0 - starved) && got <= 32.0,
        "a hard 30 got {got:.1}% ({:.0}% starved)",
        starved * 100.0
    );
}

/// Two processes of one container, four streams each, at 30: one budget and one union
/// horizon for both.
///
/// The sim's events fire at their record here (`VGPU_SIM_EVENT_TURNS=0`), as the H200's
/// do (BENCHMARKS run 12, `event_turns.py`), so each kernel's measured interval spans the
/// other process's turns as on the card, and the union of the two processes' intervals
/// is the wall time the container held work. (With the sim's default model, events that
/// wait for their turn, each process times only its own turns and the union undercounts:
/// 36 % here. On the H200, a horizon per process, summed, gave 18.8 % of the bare pair
/// and the shared one 31.2 %.)
#[test]
fn two_processes_of_one_container_share_its_limit() {
    let _serial = serial();
    let machine = Machine::new("one-container-two-processes");
    let config = machine.container("shared", "    core_limit: 30\n");
    let role = Role::plain("k_100us", 2000).streams(4, 4, QUARTER);
    let spawn = || {
        machine
            .command(&config, role)
            .env("VGPU_SIM_EVENT_TURNS", "0")
            .spawn()
            .expect("spawn child")
    };
    let (first, second) = (spawn(), spawn());
    let (first, second) = (finish(first), finish(second));
    // After both have started (a few windows in), until the end. The sim time-slices
    // the two processes as a real card does; the container's one budget holds the
    // union of their work on the card: 30%.
    let (a, b) = (first.mean(4, 18), second.mean(4, 18));
    eprintln!(
        "one container, two processes of 4 streams: {a:.1}% and {b:.1}% of their bare throughput, card busy {}%\n{:?}\n{:?}",
        second.card_util, first.windows, second.windows
    );
    // The card's busy time over the run's last second, less what the host's scheduler
    // took from the less starved of the two processes' launching threads then (either
    // can spend the container's budget).
    let starved = first.starved(10, 20).min(second.starved(10, 20));
    let busy = second.card_util as f64;
    assert!(
        busy <= 35.0 && busy >= 25.0 * (1.0 - starved),
        "the container kept the card {busy}% busy under a limit of 30 ({:.0}% starved)",
        starved * 100.0
    );
    // Neither process starves (each gets at least half of what the other gets; over the
    // time-slicing sim each lands near 5.5% of its bare throughput, so a fixed floor of 5
    // failed on a loaded machine at 4.8 and 5.7), and neither takes the whole budget.
    let (least, most) = (a.min(b), a.max(b));
    assert!(
        least >= 2.0 && least >= most / 2.0 && most <= 35.0,
        "{a:.1}% and {b:.1}%"
    );
}

#[test]
fn a_forked_child_of_a_throttled_process_neither_hangs_nor_crashes() {
    let _serial = serial();
    let machine = Machine::new("fork");
    let config = machine.container("a", "    core_limit: 20\n");
    let mut command = machine.command(&config, Role::plain("k_1ms", 300).mode("fork"));
    let output = command.output().expect("child");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("LIMITER-NOTE fork=ok"), "{stdout}");
}

/// One "pod" of the deployed layout: the host's allocation folder (config, region) and
/// what the container sees at the one path every pod has (`<scratch>/pod`, a bind mount
/// in the child's own mount namespace), with the host's card views read-only beneath.
struct Pod {
    host_dir: PathBuf,
    spec: ContainerSpec,
}

impl Machine {
    /// The path every pod sees its files at.
    fn pod_path(&self) -> PathBuf {
        self.scratch.0.join("pod")
    }

    fn pod(&self, id: &str, limit: u32, mode: CoreMode, ceiling: Option<u32>) -> Pod {
        let host_dir = self.scratch.0.join(format!("alloc-{id}"));
        std::fs::create_dir_all(host_dir.join("cards")).expect("alloc dir");
        std::fs::create_dir_all(self.pod_path()).expect("mount point");
        std::fs::create_dir_all(self.cards()).expect("cards");
        let inside = self.pod_path();
        let mode_line = match mode {
            CoreMode::Hard => String::new(),
            CoreMode::Soft => "    core_mode: soft\n".to_string(),
        };
        let ceiling_line = ceiling
            .map(|c| format!("    core_ceiling: {c}\n"))
            .unwrap_or_default();
        std::fs::write(
            host_dir.join("vgpu.yaml"),
            format!(
                "container_id: {id}\ncard_state_dir: {}\ndevices:\n  - uuid: {CARD}\n    memory_limit: 8GiB\n    core_limit: {limit}\n{mode_line}{ceiling_line}",
                inside.join("cards").display()
            ),
        )
        .expect("config");
        Pod {
            spec: ContainerSpec {
                id: id.into(),
                region: host_dir.join("usage.region"),
                devices: on_the_card(limit, mode, ceiling),
                ..ContainerSpec::default()
            },
            host_dir,
        }
    }

    /// Starts `pod`'s container: its own mount namespace, its folder at the pod path,
    /// the host's card views read-only inside it.
    fn spawn_pod(&self, pod: &Pod, role: Role) -> std::process::Child {
        use std::os::unix::process::CommandExt;
        let inside = self.pod_path();
        let mut command = self.command(&inside.join("vgpu.yaml"), role);
        let c = |path: &Path| CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
        let (source, target) = (c(&pod.host_dir), c(&inside));
        let (cards, cards_target) = (c(&self.cards()), c(&inside.join("cards")));
        // SAFETY: only async-signal-safe syscalls between fork and exec, on strings made
        // before the fork.
        unsafe {
            command.pre_exec(move || {
                let fail = || Err(std::io::Error::last_os_error());
                if libc::unshare(libc::CLONE_NEWNS) != 0 {
                    return fail();
                }
                let none = std::ptr::null();
                if libc::mount(
                    c"none".as_ptr(),
                    c"/".as_ptr(),
                    none,
                    libc::MS_REC | libc::MS_PRIVATE,
                    none.cast(),
                ) != 0
                    || libc::mount(
                        source.as_ptr(),
                        target.as_ptr(),
                        none,
                        libc::MS_BIND,
                        none.cast(),
                    ) != 0
                    || libc::mount(
                        cards.as_ptr(),
                        cards_target.as_ptr(),
                        none,
                        libc::MS_BIND,
                        none.cast(),
                    ) != 0
                    || libc::mount(
                        none,
                        cards_target.as_ptr(),
                        none,
                        libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY,
                        none.cast(),
                    ) != 0
                {
                    return fail();
                }
                Ok(())
            });
        }
        command.env("LIMITER_CARDS_CHECK", inside.join("cards"));
        command.spawn().expect("spawn pod")
    }
}

/// Issue 12's deployed layout: every pod's config, region and card views at the same
/// paths, its identity only its `container_id`, the views host-owned and read-only.
/// A hard-40 pod and two soft pods (25, ceiling 60) on one card that time-slices
/// between them: the hard limit holds and the soft pods fall back to their share
/// (before: 40 + 60 + 60, with soft 30s). Then a tenant
/// that claims absurd figures in its own region cannot push a soft neighbour below its
/// share, nor keep it from the idle card with claims that cannot be true.
#[test]
fn pods_on_one_card_coordinate_through_the_hosts_views_only() {
    // Mount namespaces, for the views at the same paths in every pod.
    vgpu_test_support::require!(vgpu_test_support::Need::Root);
    let _serial = serial();
    let machine = Machine::new("deployed");
    let hard = machine.pod("hard-40", 40, CoreMode::Hard, None);
    let soft_a = machine.pod("soft-a", 25, CoreMode::Soft, Some(60));
    let soft_b = machine.pod("soft-b", 25, CoreMode::Soft, Some(60));
    let hostile = machine.pod("hostile", 10, CoreMode::Hard, None);
    // The hostile tenant's region, written as a tenant can (it is in its container).
    let (region, _) = vgpu_contract::region::Region::open(
        &hostile.spec.region,
        &[vgpu_contract::region::RegionDevice {
            id: CARD.into(),
            memory_limit: 8 << 30,
            core_limit: 10,
            core_mode: 0,
        }],
    )
    .expect("hostile region");
    let slot = region
        .attach(&vgpu_contract::process::current())
        .expect("hostile slot");
    let claim = |active_ns: u64| {
        region.slot_limiter(slot, 0)[vgpu_contract::limiter_words::slot::ACTIVE_NS]
            .store(active_ns, Ordering::SeqCst);
    };
    claim(monotonic_ns() + 3600 * 1_000_000_000);
    region.add_busy(slot, 0, u64::MAX / 4, 0);
    let host = Host::start(
        &machine,
        vec![
            hard.spec.clone(),
            soft_a.spec.clone(),
            soft_b.spec.clone(),
            hostile.spec.clone(),
        ],
    );
    let role = Role::plain("k_1ms", 3500);
    let children = [
        machine.spawn_pod(&hard, role),
        machine.spawn_pod(&soft_a, role),
        machine.spawn_pod(&soft_b, role),
    ];
    let [hard_run, a_run, b_run] = children.map(finish);
    for run in [&hard_run, &a_run, &b_run] {
        assert_eq!(run.note("cards_writable"), Some("no"), "{run:?}");
    }
    // Once the host's correction of each one's time-slice waits has settled.
    let (h, a, b) = (
        hard_run.near(15, 35, 40.0),
        a_run.near(15, 35, 25.0),
        b_run.near(15, 35, 25.0),
    );
    eprintln!(
        "hard 40: {:.1}%, soft 25/60: {:.1}% and {:.1}%, card busy {}%",
        hard_run.mean(15, 35),
        a_run.mean(15, 35),
        b_run.mean(15, 35),
        b_run.card_util
    );
    assert!(h.is_ok(), "the hard limit holds: {h:?}");
    assert!(
        a.is_ok() && b.is_ok(),
        "soft pods at their share: {a:?} and {b:?}"
    );
    // Alone but for the hostile tenant, whose activity claims lie in the future: not
    // believed, so the soft pod uses the idle card up to its ceiling. Then the tenant
    // claims activity now: believed, and the soft pod drops to its share, not below.
    let alone = machine.spawn_pod(&soft_a, Role::plain("k_1ms", 2400));
    std::thread::sleep(Duration::from_millis(1200));
    let claiming = Arc::new(AtomicBool::new(true));
    std::thread::scope(|scope| {
        let flag = claiming.clone();
        let claim = &claim;
        scope.spawn(move || {
            while flag.load(Ordering::Relaxed) {
                claim(monotonic_ns());
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let alone = finish(alone);
        claiming.store(false, Ordering::Relaxed);
        eprintln!(
            "soft 25/60 beside a hostile tenant: {:.1}% while its claims lie, {:.1}% once it claims work now",
            alone.mean(3, 11),
            alone.mean(16, 24)
        );
        if let Err(wrong) = alone.near(3, 11, 60.0) {
            panic!("claims from the future ignored: {wrong}: {alone:?}");
        }
        if let Err(wrong) = alone.near(16, 24, 25.0) {
            panic!("never below its share: {wrong}: {alone:?}");
        }
    });
    let problems = host.stop();
    assert!(
        problems
            .iter()
            .any(|p| p.contains("hostile") && p.contains("future")),
        "{problems:?}"
    );
}

// --- the child side -------------------------------------------------------------------

type H = *mut c_void;
type Launch = unsafe extern "C" fn(
    H,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    H,
    *mut *mut c_void,
    *mut *mut c_void,
) -> u32;

/// The driver API as an application sees it: through the shim.
struct Cuda {
    _lib: libloading::Library,
    init: unsafe extern "C" fn(u32) -> u32,
    device_get: unsafe extern "C" fn(*mut i32, i32) -> u32,
    retain: unsafe extern "C" fn(*mut H, i32) -> u32,
    set_current: unsafe extern "C" fn(H) -> u32,
    load_data: unsafe extern "C" fn(*mut H, *const c_void) -> u32,
    get_function: unsafe extern "C" fn(*mut H, H, *const c_char) -> u32,
    library_load_data: unsafe extern "C" fn(
        *mut H,
        *const c_void,
        *mut i32,
        *mut H,
        u32,
        *mut i32,
        *mut H,
        u32,
    ) -> u32,
    library_get_kernel: unsafe extern "C" fn(*mut H, H, *const c_char) -> u32,
    stream_create: unsafe extern "C" fn(*mut H, u32) -> u32,
    synchronize: unsafe extern "C" fn(H) -> u32,
    ctx_synchronize: unsafe extern "C" fn() -> u32,
    event_create: unsafe extern "C" fn(*mut H, u32) -> u32,
    event_record: unsafe extern "C" fn(H, H) -> u32,
    event_synchronize: unsafe extern "C" fn(H) -> u32,
    elapsed: unsafe extern "C" fn(*mut f32, H, H) -> u32,
    begin_capture: unsafe extern "C" fn(H, u32) -> u32,
    end_capture: unsafe extern "C" fn(H, *mut H) -> u32,
    instantiate: unsafe extern "C" fn(*mut H, H, u64) -> u32,
    graph_launch: unsafe extern "C" fn(H, H) -> u32,
    launch: Launch,
}

// SAFETY: function pointers and a library handle, usable from any thread.
unsafe impl Sync for Cuda {}

impl Cuda {
    fn load() -> Cuda {
        // SAFETY: loading the shim under test; its constructor loads the simulator.
        let lib =
            unsafe { libloading::Library::new(built("libcuda_shim.so")) }.expect("dlopen shim");
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the C signature of the driver API function.
                *unsafe { lib.get($name) }.unwrap_or_else(|err| panic!("dlsym: {err}"))
            };
        }
        Cuda {
            init: sym!(b"cuInit"),
            device_get: sym!(b"cuDeviceGet"),
            retain: sym!(b"cuDevicePrimaryCtxRetain"),
            set_current: sym!(b"cuCtxSetCurrent"),
            load_data: sym!(b"cuModuleLoadData"),
            get_function: sym!(b"cuModuleGetFunction"),
            library_load_data: sym!(b"cuLibraryLoadData"),
            library_get_kernel: sym!(b"cuLibraryGetKernel"),
            stream_create: sym!(b"cuStreamCreate"),
            synchronize: sym!(b"cuStreamSynchronize"),
            ctx_synchronize: sym!(b"cuCtxSynchronize"),
            event_create: sym!(b"cuEventCreate"),
            event_record: sym!(b"cuEventRecord"),
            event_synchronize: sym!(b"cuEventSynchronize"),
            elapsed: sym!(b"cuEventElapsedTime"),
            begin_capture: sym!(b"cuStreamBeginCapture_v2"),
            end_capture: sym!(b"cuStreamEndCapture"),
            instantiate: sym!(b"cuGraphInstantiateWithFlags"),
            graph_launch: sym!(b"cuGraphLaunch"),
            launch: sym!(b"cuLaunchKernel"),
            _lib: lib,
        }
    }

    /// cuInit, the primary context current, and `kernel` loaded: (context, function).
    fn start(&self, kernel: &str) -> (H, H) {
        let image = KERNELS_PTX;
        let name = CString::new(kernel).expect("name");
        let (mut device, mut context, mut module, mut function) = (
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        );
        // SAFETY: driver API calls with valid out-pointers, in order.
        unsafe {
            assert_eq!((self.init)(0), 0, "cuInit");
            assert_eq!((self.device_get)(&mut device, 0), 0, "cuDeviceGet");
            assert_eq!((self.retain)(&mut context, device), 0, "retain");
            assert_eq!((self.set_current)(context), 0, "cuCtxSetCurrent");
            if std::env::var_os(LAUNCH_LIBRARY_KERNELS).is_some() {
                // As cudart 12 and later do: the kernel's library handle goes to
                // cuLaunchKernel in place of a function.
                let null: *mut H = std::ptr::null_mut();
                assert_eq!(
                    (self.library_load_data)(
                        &mut module,
                        image.as_ptr().cast(),
                        null.cast(),
                        null,
                        0,
                        null.cast(),
                        null,
                        0
                    ),
                    0,
                    "cuLibraryLoadData"
                );
                assert_eq!(
                    (self.library_get_kernel)(&mut function, module, name.as_ptr()),
                    0,
                    "cuLibraryGetKernel"
                );
            } else {
                function = self.load_kernel(kernel);
            }
        }
        (context, function)
    }

    /// One of `KERNELS_PTX`'s kernels, from a module of its own (the context is
    /// current): each call a function the limiter has not seen.
    fn load_kernel(&self, kernel: &str) -> H {
        let name = CString::new(kernel).expect("name");
        let (mut module, mut function) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: valid out-pointers and a NUL-terminated image and name; a context is
        // current.
        unsafe {
            assert_eq!(
                (self.load_data)(&mut module, KERNELS_PTX.as_ptr().cast()),
                0,
                "cuModuleLoadData"
            );
            assert_eq!(
                (self.get_function)(&mut function, module, name.as_ptr()),
                0,
                "cuModuleGetFunction"
            );
        }
        function
    }

    fn stream(&self) -> H {
        let mut stream = std::ptr::null_mut();
        assert_eq!(
            // SAFETY: valid out-pointer; a context is current.
            unsafe { (self.stream_create)(&mut stream, 1) },
            0,
            "cuStreamCreate"
        );
        stream
    }

    fn event(&self) -> H {
        let mut event = std::ptr::null_mut();
        assert_eq!(
            // SAFETY: valid out-pointer; a context is current. Timing off: only for waiting.
            unsafe { (self.event_create)(&mut event, 2) },
            0,
            "cuEventCreate"
        );
        event
    }

    /// An event with timing on: the simulator stamps it with the time its stream reached
    /// it on the card's timeline.
    fn timed_event(&self) -> H {
        let mut event = std::ptr::null_mut();
        assert_eq!(
            // SAFETY: valid out-pointer; a context is current.
            unsafe { (self.event_create)(&mut event, 0) },
            0,
            "cuEventCreate"
        );
        event
    }

    /// When `event` (complete, timed) fired on the card, on the host's monotonic clock.
    fn fired_ns(&self, origin: Origin, event: H) -> u64 {
        let mut ms = 0f32;
        // SAFETY: valid out-pointer; two complete timed events of one context.
        let status = unsafe { (self.elapsed)(&mut ms, origin.event, event) };
        assert_eq!(status, 0, "cuEventElapsedTime");
        origin
            .host_ns
            .saturating_add_signed((ms as f64 * 1e6) as i64)
    }

    /// A launch of a `_scaled_` kernel with `times` its named work (the sim reads the
    /// first parameter).
    fn kernel_times(&self, function: H, blocks: u32, stream: H, times: u32) -> u32 {
        let mut times = times;
        let mut params = [(&raw mut times).cast::<std::ffi::c_void>()];
        self.launch_with(function, blocks, stream, params.as_mut_ptr().cast())
    }

    fn kernel(&self, function: H, blocks: u32, stream: H) -> u32 {
        self.launch_with(function, blocks, stream, std::ptr::null_mut())
    }

    /// `blocks` blocks of 32 threads of `function` on `stream`, with `params`.
    fn launch_with(&self, function: H, blocks: u32, stream: H, params: *mut H) -> u32 {
        // SAFETY: a valid function and stream of the current context; `params` is null
        // or the kernel's parameters, alive for the call.
        unsafe {
            (self.launch)(
                function,
                blocks,
                1,
                1,
                32,
                1,
                1,
                0,
                stream,
                params.cast(),
                std::ptr::null_mut(),
            )
        }
    }
}

/// Until `deadline`: `launch` (one step's launches on `stream`), then the host waits for
/// the stream. When each step ended, and the longest step's launch calls.
fn each_waited_for(
    cuda: &Cuda,
    stream: H,
    deadline: u64,
    mut launch: impl FnMut(),
) -> (Vec<u64>, u64) {
    let (mut times, mut max_call) = (Vec::new(), 0);
    while monotonic_ns() < deadline {
        let before = monotonic_ns();
        launch();
        max_call = max_call.max(monotonic_ns() - before);
        // SAFETY: our stream.
        assert_eq!(unsafe { (cuda.synchronize)(stream) }, 0);
        times.push(monotonic_ns());
    }
    (times, max_call)
}

/// Kernels a lane keeps queued at most, as a program that reads its results would.
const DEPTH: usize = 4;
/// Launches the capturing thread of `Role::mode("capture")` records into its graph.
const CAPTURED_LAUNCHES: u64 = 200;
/// Launches of each round of `Role::mode("capture-on-tab")` before its capture, and
/// the launches each capture records.
const TAB_ROUND_LAUNCHES: usize = 20;
const CAPTURED_PER_ROUND: u64 = 8;
/// Kernels of one step of the decode loop (`Role::mode("decode")`).
const DECODE_KERNELS: usize = 8;
/// Kernels each short-lived thread of `Role::mode("bursts")` launches.
const BURST_KERNELS: usize = 16;
/// The module of every kernel the children launch: the sim runs each for the time its
/// name says (`k_scaled_100us` its parameter times 100 us, `k_scaled_20us` times 20).
const KERNELS_PTX: &[u8] = b".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry k_20us()\n{\n ret;\n}\n.visible .entry k_100us()\n{\n ret;\n}\n.visible .entry k_1ms()\n{\n ret;\n}\n.visible .entry k_10ms()\n{\n ret;\n}\n.visible .entry k_0ns()\n{\n ret;\n}\n.visible .entry k_scaled_100us(.param .u32 times)\n{\n ret;\n}\n.visible .entry k_scaled_20us(.param .u32 times)\n{\n ret;\n}\n\0";

/// Set for a child: its kernel is launched by its library kernel handle
/// (`cuLibraryGetKernel`), as cudart 12 and later launch theirs, not a module's function.
const LAUNCH_LIBRARY_KERNELS: &str = "LIMITER_LAUNCH_LIBRARY_KERNELS";
/// Waited-for launches with its own grid that teach `Role::mode("new-grids")`'s kernel.
const NEW_GRIDS_TEACHING: usize = 4;
/// The grids `Role::mode("new-grids")` then launches its kernel with, taught with 264
/// blocks (class 49, `duty::grid_class`): the eight classes above it, each within an
/// octave, so seeded at 1.1-2x the taught cost.
const NEW_GRIDS: [u32; 8] = [293, 325, 357, 389, 421, 453, 485, 517];
/// Launches of its work once that teach `Role::mode("hostile")`'s kernel short before
/// its long ones.
const HOSTILE_TEACHING_LAUNCHES: usize = 200;
/// How many times its taught work `Role::mode("hostile")` then launches.
const HOSTILE_TIMES: u32 = 10;
/// How long `Role::mode("grows")` launches its kernel's work once, and how many times
/// its work it launches after that.
const GROWS_AFTER_NS: u64 = 1_000_000_000;
const GROWN_TIMES: u32 = 10;
/// Launches the driver refuses (a grid of 0 blocks) before each one it runs, in
/// `Role::mode("refused")`.
const REFUSED_PER_LAUNCH: usize = 4;

/// A timed event recorded on an idle stream at `host_ns`: the card's timeline of every
/// other event is read against it (`Cuda::fired_ns`).
#[derive(Clone, Copy)]
struct Origin {
    event: H,
    host_ns: u64,
}

// SAFETY: a driver handle, valid from any thread of the process.
unsafe impl Send for Origin {}
// SAFETY: as above; it is only read.
unsafe impl Sync for Origin {}

impl Origin {
    fn record(cuda: &Cuda) -> Origin {
        let stream = cuda.stream();
        let event = cuda.timed_event();
        let before = monotonic_ns();
        // SAFETY: our event on our idle stream.
        assert_eq!(unsafe { (cuda.event_record)(event, stream) }, 0);
        let host_ns = before / 2 + monotonic_ns() / 2;
        // SAFETY: our stream.
        unsafe { (cuda.synchronize)(stream) };
        Origin { event, host_ns }
    }
}

/// One stream with a ring of "done" events, so that at most `DEPTH` kernels are queued.
struct Lane {
    stream: H,
    ring: [H; DEPTH],
    launched: u64,
}

// SAFETY: driver handles, valid from any thread of the process.
unsafe impl Send for Lane {}

/// Launches on `lanes` as fast as allowed until `deadline`; returns when each kernel
/// counts and the longest launch call. With `wait`, a "done" event follows every
/// `every`-th kernel, at most `DEPTH` of them are queued per lane, and a kernel counts
/// when its done event fired on the simulated card's timeline: the sim's own account,
/// which a host thread descheduled by a busy machine can delay but never bunch up into
/// a window. Without, when its launch
/// call returned (the limit alone keeps the queue short).
///
/// It also keeps what the scheduler did to it: its run-queue time in each 100 ms window
/// from `t0` (`Starved`).
fn drive(
    cuda: &Cuda,
    function: H,
    blocks: u32,
    lanes: &mut [Lane],
    (t0, deadline): (u64, u64),
    wait: Option<Origin>,
    every: u64,
) -> Driven {
    let mut times = Vec::new();
    let mut calls = Vec::new();
    let mut next = 0;
    let mut starved = Starved::new(t0, deadline);
    while monotonic_ns() < deadline {
        starved.observe(monotonic_ns());
        let lane = &mut lanes[next % lanes.len()];
        next += 1;
        let mark = lane.launched / every;
        let slot = (mark % DEPTH as u64) as usize;
        if let Some(origin) = wait
            && lane.launched.is_multiple_of(every)
            && mark >= DEPTH as u64
        {
            // SAFETY: an event we recorded on this lane's stream.
            unsafe { (cuda.event_synchronize)(lane.ring[slot]) };
            let fired = cuda.fired_ns(origin, lane.ring[slot]);
            times.extend(std::iter::repeat_n(fired, every as usize));
        }
        let before = monotonic_ns();
        assert_eq!(
            cuda.kernel(function, blocks, lane.stream),
            0,
            "cuLaunchKernel"
        );
        let after = monotonic_ns();
        calls.push(after - before);
        if wait.is_some() {
            if (lane.launched + 1).is_multiple_of(every) {
                // SAFETY: our event, our stream.
                unsafe { (cuda.event_record)(lane.ring[slot], lane.stream) };
            }
        } else {
            times.push(after);
        }
        lane.launched += 1;
    }
    if let Some(origin) = wait {
        // The kernels still queued count where they end (past the deadline: nowhere).
        for lane in lanes.iter() {
            let marks = lane.launched / every;
            for queued in marks.saturating_sub(DEPTH as u64)..marks {
                let event = lane.ring[(queued % DEPTH as u64) as usize];
                // SAFETY: an event we recorded on this lane's stream.
                unsafe { (cuda.event_synchronize)(event) };
                let fired = cuda.fired_ns(origin, event);
                times.extend(std::iter::repeat_n(fired, every as usize));
            }
        }
    }
    starved.observe(deadline);
    Driven {
        times,
        starved,
        calls,
    }
}

/// What one thread of `drive` did.
struct Driven {
    /// When each kernel ended on the card (or its launch returned, without an origin).
    times: Vec<u64>,
    /// What the host's scheduler took from it.
    starved: Starved,
    /// Each launch call's time, ns (those the limiter held included).
    calls: Vec<u64>,
}

impl Driven {
    /// Its longest launch call, ns.
    fn max_call(&self) -> u64 {
        self.calls.iter().copied().max().unwrap_or(0)
    }
}

/// The median of `calls` (0 if none): what a launch call takes the host when the
/// limiter does not hold it (most launches are not held).
fn median_call_ns(calls: &mut [u64]) -> u64 {
    if calls.is_empty() {
        return 0;
    }
    let middle = calls.len() / 2;
    *calls.select_nth_unstable(middle).1
}

/// One thread's run-queue time (runnable, but without a CPU) in each 100 ms window of a
/// run, from its schedstat: what a busy host took from it, which no limiter decided.
#[derive(Clone, Debug)]
struct Starved {
    t0: u64,
    window: usize,
    last: Sched,
    per_window_ns: Vec<u64>,
}

impl Starved {
    fn new(t0: u64, deadline: u64) -> Starved {
        Starved {
            t0,
            window: 0,
            last: Sched::of_this_thread(),
            per_window_ns: vec![0; (deadline.saturating_sub(t0) / WINDOW_NS) as usize],
        }
    }

    /// At `now_ns`: once a window has passed, its run-queue time is read (one small
    /// file read per window).
    fn observe(&mut self, now_ns: u64) {
        let window = (now_ns.saturating_sub(self.t0) / WINDOW_NS) as usize;
        if window <= self.window {
            return;
        }
        let now = Sched::of_this_thread();
        if let Some(slot) = self.per_window_ns.get_mut(self.window) {
            *slot += now.since(self.last).runq_ns;
        }
        self.last = now;
        self.window = window;
    }

    /// Per window, the least any of `threads` was starved: while one thread of a
    /// container runs, it can spend the container's budget.
    fn least(threads: &[Starved]) -> Vec<u64> {
        let windows = threads
            .iter()
            .map(|t| t.per_window_ns.len())
            .max()
            .unwrap_or(0);
        (0..windows)
            .map(|w| {
                threads
                    .iter()
                    .map(|t| t.per_window_ns.get(w).copied().unwrap_or(0))
                    .min()
                    .unwrap_or(0)
            })
            .collect()
    }
}

/// A driver-API program that launches as PyTorch training does through cudart: one
/// primary context, made current on a second thread (autograd's) by a call the shim
/// does not see (cudart reaches the driver through paths of its own); 120 distinct
/// kernels on the legacy default stream, forward and optimizer from the main thread,
/// backward from the other, each launched four times a step on tensors of different
/// sizes (three small, one six times larger: the simulator's `VGPU_SIM_WAVES` makes a
/// kernel's cost grow with its grid, as a real one's does), so that what one launch of a
/// kernel costs says little about the next; the host runs ahead of the GPU and
/// synchronises every four steps.
struct TorchLike {
    forward: Vec<H>,
    backward: Vec<H>,
    optimizer: Vec<H>,
    /// The GPU time of one step (the kernels take the whole card, one after the other).
    step_ns: u64,
}

// SAFETY: function handles of the process's one context, usable from any thread.
unsafe impl Sync for TorchLike {}

/// Steps queued ahead of the GPU before the host synchronises.
const TORCH_SYNC_EVERY: u64 = 4;
/// The grid of each of a kernel's launches in a step, in waves of the card's SMs.
const TORCH_SIZES: [u64; 4] = [1, 1, 1, 6];

impl TorchLike {
    fn load(cuda: &Cuda) -> TorchLike {
        // Durations per wave from a fixed pseudo-random sequence: 2-50 us.
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut names = Vec::new();
        let mut ptx = String::from(".version 8.0\n.target sm_90\n.address_size 64\n");
        for index in 0..120 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let us = 2 + seed % 49;
            let name = format!("op{index}_{us}us");
            ptx.push_str(&format!(".visible .entry {name}()\n{{\n ret;\n}}\n"));
            names.push((name, us * 1000));
        }
        ptx.push('\0');
        let mut module = std::ptr::null_mut();
        // SAFETY: valid out-pointer and NUL-terminated PTX; a context is current.
        let loaded = unsafe { (cuda.load_data)(&mut module, ptx.as_ptr().cast()) };
        assert_eq!(loaded, 0, "cuModuleLoadData");
        let functions: Vec<H> = names
            .iter()
            .map(|(name, _)| {
                let name = CString::new(name.as_str()).expect("name");
                let mut function = std::ptr::null_mut();
                // SAFETY: valid out-pointer; a NUL-terminated name of the loaded module.
                let found = unsafe { (cuda.get_function)(&mut function, module, name.as_ptr()) };
                assert_eq!(found, 0, "cuModuleGetFunction");
                function
            })
            .collect();
        let waves: u64 = TORCH_SIZES.iter().sum();
        TorchLike {
            forward: functions[..40].to_vec(),
            backward: functions[40..100].to_vec(),
            optimizer: functions[100..].to_vec(),
            step_ns: names.iter().map(|(_, ns)| ns * waves).sum(),
        }
    }

    /// One pass over `kernels`: each launched once per size, the sizes interleaved as
    /// a model's layers are.
    fn launch_all(cuda: &Cuda, kernels: &[H]) {
        for size in TORCH_SIZES {
            for &kernel in kernels {
                assert_eq!(
                    cuda.kernel(kernel, 132 * size as u32, std::ptr::null_mut()),
                    0,
                    "cuLaunchKernel"
                );
            }
        }
    }

    /// Trains until `deadline`; returns when each step's work was done on the GPU (as
    /// far as the host knows: at each synchronisation, for the steps it covers) and the
    /// longest launch call.
    fn train(&self, cuda: &Cuda, context: H, deadline: u64) -> (Vec<u64>, u64) {
        let driver = PathBuf::from(std::env::var("VGPU_DRIVER_DIR").expect("driver dir"));
        // SAFETY: the real driver the shim loaded already (the same file).
        let real =
            unsafe { libloading::Library::new(driver.join("libcuda.so.1")) }.expect("real driver");
        let real_set_current: libloading::Symbol<unsafe extern "C" fn(H) -> u32> =
            // SAFETY: as above.
            unsafe { real.get(b"cuCtxSetCurrent") }.expect("cuCtxSetCurrent");
        let (to_autograd, backward_queue) = std::sync::mpsc::channel::<()>();
        let (backward_done, from_autograd) = std::sync::mpsc::channel::<()>();
        let context = context as usize;
        std::thread::scope(|scope| {
            let real_set_current = &real_set_current;
            scope.spawn(move || {
                // SAFETY: the process's primary context, made current behind the shim.
                assert_eq!(unsafe { real_set_current(context as H) }, 0);
                while backward_queue.recv().is_ok() {
                    TorchLike::launch_all(cuda, &self.backward);
                    if backward_done.send(()).is_err() {
                        return;
                    }
                }
            });
            let mut done = Vec::new();
            let mut steps = 0u64;
            let mut max_call = 0;
            while monotonic_ns() < deadline {
                let before = monotonic_ns();
                TorchLike::launch_all(cuda, &self.forward);
                to_autograd.send(()).expect("autograd thread");
                from_autograd.recv().expect("autograd thread");
                TorchLike::launch_all(cuda, &self.optimizer);
                max_call = max_call.max(monotonic_ns() - before);
                steps += 1;
                if steps.is_multiple_of(TORCH_SYNC_EVERY) {
                    // SAFETY: a context is current on this thread.
                    assert_eq!(unsafe { (cuda.ctx_synchronize)() }, 0);
                    let now = monotonic_ns();
                    done.extend(std::iter::repeat_n(now, TORCH_SYNC_EVERY as usize));
                }
            }
            drop(to_autograd);
            (done, max_call)
        })
    }
}

/// What the scheduler did to one thread (`/proc/thread-self/schedstat`, cumulative):
/// the time it was runnable but waited for a CPU. Missing schedstats read 0 (nothing
/// is then discounted).
#[derive(Clone, Copy, Debug, Default)]
struct Sched {
    runq_ns: u64,
}

impl Sched {
    fn of_this_thread() -> Sched {
        let text = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
        Sched {
            runq_ns: text
                .split_whitespace()
                .nth(1)
                .and_then(|field| field.parse().ok())
                .unwrap_or(0),
        }
    }

    fn since(self, before: Sched) -> Sched {
        Sched {
            runq_ns: self.runq_ns.saturating_sub(before.runq_ns),
        }
    }
}

fn kernel_ns(kernel: &str) -> u64 {
    match kernel {
        "k_20us" => 20_000,
        "k_100us" => 100_000,
        "k_1ms" => 1_000_000,
        "k_10ms" => 10_000_000,
        "k_0ns" => 0,
        "k_scaled_100us" => 100_000,
        "k_scaled_20us" => 20_000,
        other => panic!("unknown kernel {other}"),
    }
}

/// The child side: loads the shim like an application would, runs its role, and prints
/// its throughput share per window.
#[test]
fn child_process_entry() {
    if let Ok(encoded) = std::env::var("LIMITER_HOST") {
        run_host(&encoded);
        return;
    }
    let Ok(role) = std::env::var("LIMITER_ROLE") else {
        return;
    };
    let parts: Vec<&str> = role.split(':').collect();
    let [kernel, run_ms, streams, threads, blocks, mode] = parts.as_slice() else {
        panic!("bad role {role}");
    };
    let run_ns: u64 = run_ms.parse::<u64>().expect("ms") * 1_000_000;
    let streams: usize = streams.parse().expect("streams");
    let threads: usize = threads.parse().expect("threads");
    let blocks: u32 = blocks.parse().expect("blocks");
    let duration_ns = kernel_ns(kernel);
    let cuda = Cuda::load();
    let (context, function) = cuda.start(kernel);
    let mut notes = Vec::new();
    // Kernels that fit on the card at once (132 SMs).
    let mut fit = (streams as u64).min((132 / blocks.max(1)) as u64).max(1);
    let mut per_launch_ns = duration_ns;
    let t0 = monotonic_ns();
    let deadline = t0 + run_ns;
    let (times, max_call) = match *mode {
        "graph" => {
            // Four kernels captured from one stream make one graph.
            let stream = cuda.stream();
            let (mut graph, mut exec) = (std::ptr::null_mut(), std::ptr::null_mut());
            // SAFETY: capture calls on our stream with valid out-pointers.
            unsafe {
                assert_eq!((cuda.begin_capture)(stream, 2), 0, "begin capture");
                for _ in 0..4 {
                    assert_eq!(cuda.kernel(function, 1, stream), 0);
                }
                assert_eq!((cuda.end_capture)(stream, &mut graph), 0, "end capture");
                assert_eq!((cuda.instantiate)(&mut exec, graph, 0), 0, "instantiate");
            }
            per_launch_ns = 4 * duration_ns;
            fit = 1;
            let ring: [H; DEPTH] = std::array::from_fn(|_| cuda.event());
            let (mut times, mut max_call, mut launched) = (Vec::new(), 0, 0u64);
            while monotonic_ns() < deadline {
                let slot = (launched % DEPTH as u64) as usize;
                if launched >= DEPTH as u64 {
                    // SAFETY: our event.
                    unsafe { (cuda.event_synchronize)(ring[slot]) };
                }
                let before = monotonic_ns();
                assert_eq!(
                    // SAFETY: our graph and stream.
                    unsafe { (cuda.graph_launch)(exec, stream) },
                    0,
                    "cuGraphLaunch"
                );
                let after = monotonic_ns();
                max_call = max_call.max(after - before);
                // SAFETY: our event and stream.
                unsafe { (cuda.event_record)(ring[slot], stream) };
                launched += 1;
                times.push(after);
            }
            (times, max_call)
        }
        "decode" => {
            // A batch-1 decode loop: a step of `DECODE_KERNELS` kernels on one stream,
            // then the host waits for them (it needs the token for the next step).
            let stream = cuda.stream();
            per_launch_ns = DECODE_KERNELS as u64 * duration_ns;
            fit = 1;
            let (mut times, mut steps) = (Vec::new(), Vec::new());
            while monotonic_ns() < deadline {
                let began = monotonic_ns();
                for _ in 0..DECODE_KERNELS {
                    assert_eq!(cuda.kernel(function, blocks, stream), 0, "cuLaunchKernel");
                }
                // SAFETY: our stream.
                assert_eq!(unsafe { (cuda.synchronize)(stream) }, 0);
                let ended = monotonic_ns();
                steps.push(ended - began);
                times.push(ended);
            }
            steps.sort_unstable();
            let at = |q: f64| steps[((steps.len() - 1) as f64 * q) as usize];
            notes.push(format!("steps={}", steps.len()));
            notes.push(format!("step_p50_ns={}", at(0.5)));
            notes.push(format!("step_p99_ns={}", at(0.99)));
            notes.push(format!("step_max_ns={}", at(1.0)));
            (times, 0)
        }
        "bursts" => {
            // Short-lived threads, one after another: each makes the context current,
            // launches `BURST_KERNELS` kernels on the legacy stream, waits for them and
            // exits (as a pool of request threads does). A thread's tab must be paid
            // when it exits, or its launches are never published.
            per_launch_ns = BURST_KERNELS as u64 * duration_ns;
            fit = 1;
            let mut times = Vec::new();
            while monotonic_ns() < deadline {
                let (cuda, context, function) = (&cuda, context as usize, function as usize);
                std::thread::scope(|scope| {
                    scope.spawn(move || {
                        // SAFETY: making our context current on this thread.
                        unsafe { (cuda.set_current)(context as H) };
                        for _ in 0..BURST_KERNELS {
                            let legacy = std::ptr::null_mut();
                            assert_eq!(cuda.kernel(function as H, blocks, legacy), 0);
                        }
                        // SAFETY: our context is current.
                        assert_eq!(unsafe { (cuda.ctx_synchronize)() }, 0);
                    });
                });
                times.push(monotonic_ns());
            }
            (times, 0)
        }
        "refused" => {
            // One stream; before each launch that runs, launches of the same (known)
            // kernel that the driver refuses, which the limiter charges ahead on its
            // fast path and must take back.
            let stream = cuda.stream();
            fit = 1;
            let ring: [H; DEPTH] = std::array::from_fn(|_| cuda.event());
            let (mut times, mut max_call, mut launched, mut refused) = (Vec::new(), 0, 0u64, 0u64);
            while monotonic_ns() < deadline {
                let slot = (launched % DEPTH as u64) as usize;
                if launched >= DEPTH as u64 {
                    // SAFETY: our event.
                    unsafe { (cuda.event_synchronize)(ring[slot]) };
                }
                for _ in 0..REFUSED_PER_LAUNCH {
                    assert_ne!(cuda.kernel(function, 0, stream), 0, "a grid of 0 blocks");
                    refused += 1;
                }
                let before = monotonic_ns();
                assert_eq!(cuda.kernel(function, blocks, stream), 0, "cuLaunchKernel");
                let after = monotonic_ns();
                max_call = max_call.max(after - before);
                // SAFETY: our event and stream.
                unsafe { (cuda.event_record)(ring[slot], stream) };
                launched += 1;
                times.push(after);
            }
            notes.push(format!("refused={refused}"));
            (times, max_call)
        }
        "hostile" => {
            // A tenant that games the rule for samples that may time a neighbour: its
            // kernel is taught short, from launches of its work once queued back to
            // back, and then launched with `HOSTILE_TIMES` its work (the same function
            // and grid: a loop count in its argument, `k_scaled_100us`) into an idle
            // stream, the host waiting for each, where every sample beside a busy
            // neighbour starts idle and is set aside.
            let stream = cuda.stream();
            fit = 1;
            per_launch_ns = duration_ns * u64::from(HOSTILE_TIMES);
            for _ in 0..HOSTILE_TEACHING_LAUNCHES {
                assert_eq!(
                    cuda.kernel_times(function, blocks, stream, 1),
                    0,
                    "cuLaunchKernel"
                );
            }
            // SAFETY: our stream.
            assert_eq!(unsafe { (cuda.synchronize)(stream) }, 0);
            each_waited_for(&cuda, stream, deadline, || {
                assert_eq!(
                    cuda.kernel_times(function, blocks, stream, HOSTILE_TIMES),
                    0,
                    "cuLaunchKernel"
                );
            })
        }
        "grows" => {
            // A one-stream loop whose kernel's run grows by `GROWN_TIMES` after
            // `GROWS_AFTER_NS` (the same function and grid, a loop count in its
            // argument: `k_scaled_20us`), each launch waited for. Its times count units of
            // its kernel's named work, so that its windows show the card's share.
            let stream = cuda.stream();
            fit = 1;
            let grows_at = t0 + GROWS_AFTER_NS;
            let mut works = Vec::new();
            let (done, max_call) = each_waited_for(&cuda, stream, deadline, || {
                let work = if monotonic_ns() < grows_at {
                    1
                } else {
                    GROWN_TIMES
                };
                assert_eq!(
                    cuda.kernel_times(function, blocks, stream, work),
                    0,
                    "cuLaunchKernel"
                );
                works.push(work);
            });
            let times = done
                .iter()
                .zip(&works)
                .flat_map(|(&at, &work)| std::iter::repeat_n(at, work as usize))
                .collect();
            (times, max_call)
        }
        "two-grids" => {
            // One function launched with two grids in turn, a full one of `blocks`
            // blocks (several waves, `VGPU_SIM_WAVES=1`) and then one wave, and waited
            // for (as PyTorch's optimizer launches each `multi_tensor_apply` kernel: the
            // bulk of its tensors, then the rest). Which of the two a due sample falls
            // on follows the loop's rhythm.
            let stream = cuda.stream();
            fit = 1;
            per_launch_ns = duration_ns * (u64::from(blocks.div_ceil(132).max(1)) + 1);
            each_waited_for(&cuda, stream, deadline, || {
                assert_eq!(cuda.kernel(function, blocks, stream), 0, "cuLaunchKernel");
                assert_eq!(cuda.kernel(function, 132, stream), 0, "cuLaunchKernel");
            })
        }
        "new-grids" => {
            // A function taught with one grid (each launch waited for), and then launched
            // once with each of `NEW_GRIDS`, every one a class of grid it has not run
            // with, back to back (as a program whose shapes change does: a new sequence
            // length, a new batch), and waited for together. `VGPU_SIM_WAVES=0`: every
            // grid runs the kernel's named time.
            let stream = cuda.stream();
            fit = 1;
            for _ in 0..NEW_GRIDS_TEACHING {
                assert_eq!(cuda.kernel(function, blocks, stream), 0, "cuLaunchKernel");
                // SAFETY: our stream.
                assert_eq!(unsafe { (cuda.synchronize)(stream) }, 0);
                // Past the limiter's settling cadence: the next launch reads the first
                // measurement back before it would wait for it.
                std::thread::sleep(Duration::from_millis(1));
            }
            let before = monotonic_ns();
            for grid in NEW_GRIDS {
                assert_eq!(cuda.kernel(function, grid, stream), 0, "cuLaunchKernel");
            }
            let calls = monotonic_ns() - before;
            notes.push(format!("new_grid_calls_ns={calls}"));
            // SAFETY: our stream.
            assert_eq!(unsafe { (cuda.synchronize)(stream) }, 0);
            (vec![monotonic_ns()], calls)
        }
        "unknown-behind-unknown" => {
            // Two kernels the limiter has never measured, launched back to back: the
            // second waits for the first's measurement (in 100 us sleeps, at most
            // `FIRST_MEASURE_PATIENCE_NS`) before it goes. The role's kernel first, then
            // `k_20us` of a module of its own.
            let stream = cuda.stream();
            fit = 1;
            let second = cuda.load_kernel("k_20us");
            let before = monotonic_ns();
            assert_eq!(cuda.kernel(function, blocks, stream), 0, "cuLaunchKernel");
            assert_eq!(cuda.kernel(second, blocks, stream), 0, "cuLaunchKernel");
            let calls = monotonic_ns() - before;
            notes.push(format!("two_unknown_calls_ns={calls}"));
            // SAFETY: our stream.
            assert_eq!(unsafe { (cuda.synchronize)(stream) }, 0);
            (vec![monotonic_ns()], calls)
        }
        "one-at-a-time" => {
            // A host-bound loop: each kernel is launched into an idle stream and waited
            // for before the next (a sampler, a batch-1 step of one kernel), so every
            // sample of it starts on an idle stream and times the card's fetch of the
            // kernel too (`VGPU_SIM_IDLE_SUBMIT_NS`).
            let stream = cuda.stream();
            fit = 1;
            let mut starved = Starved::new(t0, deadline);
            let driven = each_waited_for(&cuda, stream, deadline, || {
                starved.observe(monotonic_ns());
                assert_eq!(cuda.kernel(function, blocks, stream), 0, "cuLaunchKernel");
            });
            starved.observe(deadline);
            notes.push(format!(
                "starved_ns={}",
                Starved::least(&[starved])
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            ));
            driven
        }
        "torch" => {
            let step = TorchLike::load(&cuda);
            per_launch_ns = step.step_ns;
            fit = 1;
            step.train(&cuda, context, deadline)
        }
        "capture-on-tab" => {
            // Rounds of one short kernel launched back to back on one stream, each then
            // captured on that stream at once: the round leaves the thread's tab open
            // when its capture begins, so the first captured launch is one the tab
            // covers.
            let stream = cuda.stream();
            let (mut times, mut rounds, mut failed) = (Vec::new(), 0u64, Vec::new());
            while monotonic_ns() < deadline {
                for _ in 0..TAB_ROUND_LAUNCHES {
                    assert_eq!(cuda.kernel(function, 1, stream), 0, "launch");
                    times.push(monotonic_ns());
                }
                let mut graph = std::ptr::null_mut();
                // SAFETY: capture calls on our stream with valid out-pointers.
                let (began, captured, ended) = unsafe {
                    let began = (cuda.begin_capture)(stream, 2);
                    let captured = (0..CAPTURED_PER_ROUND)
                        .map(|_| cuda.kernel(function, 1, stream))
                        .find(|&result| result != 0)
                        .unwrap_or(0);
                    (began, captured, (cuda.end_capture)(stream, &mut graph))
                };
                if (began, captured, ended) != (0, 0, 0) {
                    failed.push(format!("{began}/{captured}/{ended}"));
                }
                // SAFETY: our stream.
                assert_eq!(unsafe { (cuda.synchronize)(stream) }, 0);
                rounds += 1;
            }
            notes.push(format!(
                "capture={}",
                if failed.is_empty() {
                    "ok".to_string()
                } else {
                    failed.join(",")
                }
            ));
            notes.push(format!("captured_launches={}", rounds * CAPTURED_PER_ROUND));
            (times, 0)
        }
        "capture" => {
            let capturing = cuda.stream();
            let worker = cuda.stream();
            let outcome = std::thread::scope(|scope| {
                let (context, function, capturing) =
                    (context as usize, function as usize, capturing as usize);
                let cuda = &cuda;
                let capturer = scope.spawn(move || {
                    let (context, function, capturing) =
                        (context as H, function as H, capturing as H);
                    // SAFETY: as in `start`.
                    unsafe { (cuda.set_current)(context) };
                    std::thread::sleep(Duration::from_millis(150));
                    // SAFETY: capture calls on our stream with valid out-pointers.
                    let began = unsafe { (cuda.begin_capture)(capturing, 0) };
                    let mut slowest = 0;
                    for _ in 0..CAPTURED_LAUNCHES {
                        let sched = Sched::of_this_thread();
                        let before = monotonic_ns();
                        assert_eq!(cuda.kernel(function, 1, capturing), 0, "captured launch");
                        let call = monotonic_ns() - before;
                        // Less the time it was runnable but had no CPU.
                        let starved = Sched::of_this_thread().since(sched).runq_ns;
                        slowest = slowest.max(call.saturating_sub(starved));
                        std::thread::sleep(Duration::from_micros(500));
                    }
                    let mut graph = std::ptr::null_mut();
                    // SAFETY: as above.
                    let ended = unsafe { (cuda.end_capture)(capturing, &mut graph) };
                    (began, ended, slowest)
                });
                let mut lanes = [Lane {
                    stream: worker,
                    ring: std::array::from_fn(|_| cuda.event()),
                    launched: 0,
                }];
                // No waits of its own: an application's event synchronisation on this
                // thread would break a global-mode capture by itself.
                let driven = drive(
                    cuda,
                    function as H,
                    blocks,
                    &mut lanes,
                    (t0, deadline),
                    None,
                    1,
                );
                let max_call = driven.max_call();
                ((driven.times, max_call), capturer.join().expect("capturer"))
            });
            let (driven, (began, ended, slowest)) = outcome;
            notes.push(format!(
                "capture={}",
                if began == 0 && ended == 0 {
                    "ok".to_string()
                } else {
                    format!("begin {began} end {ended}")
                }
            ));
            notes.push(format!("captured_max_call_ns={slowest}"));
            driven
        }
        _ => {
            // "back-to-back": a done event after every 64th kernel only, so the kernels
            // between run back to back as a launch loop's do.
            let every = if *mode == "back-to-back" { 64 } else { 1 };
            let origin = Origin::record(&cuda);
            let lanes: Vec<Lane> = (0..streams)
                .map(|_| Lane {
                    stream: cuda.stream(),
                    ring: std::array::from_fn(|_| cuda.timed_event()),
                    launched: 0,
                })
                .collect();
            let per_thread = lanes.len().div_ceil(threads.max(1));
            let mut lanes = lanes;
            let results: Vec<Driven> = std::thread::scope(|scope| {
                let handles: Vec<_> = lanes
                    .chunks_mut(per_thread)
                    .map(|chunk| {
                        let cuda = &cuda;
                        let (context, function) = (context as usize, function as usize);
                        scope.spawn(move || {
                            // SAFETY: making our context current on this thread.
                            unsafe { (cuda.set_current)(context as H) };
                            drive(
                                cuda,
                                function as H,
                                blocks,
                                chunk,
                                (t0, deadline),
                                Some(origin),
                                every,
                            )
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().expect("thread"))
                    .collect()
            });
            let max_call = results.iter().map(Driven::max_call).max().unwrap_or(0);
            let starved: Vec<Starved> = results.iter().map(|d| d.starved.clone()).collect();
            let mut calls: Vec<u64> = results.iter().flat_map(|d| d.calls.clone()).collect();
            notes.push(format!("median_call_ns={}", median_call_ns(&mut calls)));
            notes.push(format!(
                "starved_ns={}",
                Starved::least(&starved)
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            ));
            (
                results.into_iter().flat_map(|d| d.times).collect(),
                max_call,
            )
        }
    };
    // The card's busy fraction over the last second, before the queues drain.
    let card_util = sim_card_util();
    let windows: Vec<String> = (0..run_ns / WINDOW_NS)
        .map(|w| {
            let (from, to) = (t0 + w * WINDOW_NS, t0 + (w + 1) * WINDOW_NS);
            let launched = times.iter().filter(|t| (from..to).contains(*t)).count() as u64;
            format!(
                "{:.1}",
                (launched * per_launch_ns) as f64 * 100.0 / (fit * WINDOW_NS) as f64
            )
        })
        .collect();
    std::thread::sleep(Duration::from_millis(30));
    // One more (cheap) launch lets the shim settle its last measurements.
    let tail = cuda.stream();
    cuda.kernel(function, 1, tail);
    // SAFETY: our stream.
    unsafe { (cuda.synchronize)(tail) };
    let (region_busy, region_launches) =
        region_counts(&std::env::var("VGPU_CONFIG").expect("config"));
    notes.push(format!("region_launches={region_launches}"));
    if *mode == "fork" {
        notes.push(format!("fork={}", fork_and_launch(&cuda, kernel)));
    }
    if let Some(cards) = std::env::var_os("LIMITER_CARDS_CHECK") {
        // A tenant can neither write a view nor add one.
        let probe = PathBuf::from(cards).join(format!("{CARD}.card"));
        let writable = std::fs::OpenOptions::new().write(true).open(&probe).is_ok()
            || std::fs::write(probe.with_extension("forged"), b"x").is_ok();
        notes.push(format!(
            "cards_writable={}",
            if writable { "yes" } else { "no" }
        ));
    }
    for note in notes {
        println!("LIMITER-NOTE {note}");
    }
    println!(
        "LIMITER-RESULT {t0} {} {max_call} {region_busy} {card_util} {}",
        times.len(),
        windows.join(" ")
    );
}

/// A forked child of a throttled process starts CUDA afresh, as CUDA wants, and
/// launches throttled kernels; it must neither hang on state the parent's threads held
/// at the fork nor crash. The parent gives it 10 s.
fn fork_and_launch(cuda: &Cuda, kernel: &str) -> &'static str {
    // SAFETY: fork in a test process; the child only calls the driver API and exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let (_, function) = cuda.start(kernel);
            let stream = cuda.stream();
            let mut ok = true;
            for _ in 0..50 {
                ok &= cuda.kernel(function, 1, stream) == 0;
            }
            // SAFETY: our stream.
            ok && unsafe { (cuda.synchronize)(stream) } == 0
        }))
        .unwrap_or(false);
        // SAFETY: _exit skips the parent's atexit handlers.
        unsafe { libc::_exit(if ok { 0 } else { 3 }) };
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut status = 0;
    loop {
        // SAFETY: waiting for our own child.
        if unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == pid {
            break;
        }
        if std::time::Instant::now() > deadline {
            // SAFETY: our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            return "hung";
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
        "ok"
    } else {
        "failed"
    }
}

/// The simulated card's NVML utilization (percent over the last second), read straight
/// from the simulator.
fn sim_card_util() -> u32 {
    let driver = PathBuf::from(std::env::var("VGPU_DRIVER_DIR").expect("driver dir"));
    // SAFETY: the simulator's own NVML entry points, with their C signatures.
    unsafe {
        let Ok(lib) = libloading::Library::new(driver.join("libnvidia-ml.so.1")) else {
            return 0;
        };
        let init: libloading::Symbol<unsafe extern "C" fn() -> u32> =
            lib.get(b"nvmlInit_v2").expect("nvmlInit_v2");
        let by_index: libloading::Symbol<unsafe extern "C" fn(u32, *mut H) -> u32> =
            lib.get(b"nvmlDeviceGetHandleByIndex_v2").expect("handle");
        let utilization: libloading::Symbol<unsafe extern "C" fn(H, *mut [u32; 2]) -> u32> = lib
            .get(b"nvmlDeviceGetUtilizationRates")
            .expect("utilization");
        let mut device = std::ptr::null_mut();
        let mut rates = [0u32; 2];
        if init() != 0 || by_index(0, &mut device) != 0 || utilization(device, &mut rates) != 0 {
            return 0;
        }
        rates[0]
    }
}

/// The busy time recorded in the usage region beside the config, for this process.
/// What this process's slots of the container's region record on the first device:
/// busy ns and launches (0 and 0 without a region).
fn region_counts(config: &str) -> (u64, u64) {
    let region_path = Path::new(config).with_file_name("usage.region");
    let Ok(region) = vgpu_contract::snapshot::RegionSnapshot::read(&region_path) else {
        return (0, 0);
    };
    let me = std::process::id() as i32;
    region
        .processes()
        .iter()
        .filter(|p| p.pid == me)
        .map(|p| {
            let first = |counts: &[u64]| counts.first().copied().unwrap_or(0);
            (first(&p.busy_ns), first(&p.launches))
        })
        .fold((0, 0), |(busy, launches), (b, l)| (busy + b, launches + l))
}

/// Issue 14 on the H200: PyTorch training at 50 ran at 102% of bare. The same shape of
/// launches over the sim (`TorchLike`, kernels whose cost grows with their grid): at 50
/// it runs at half its bare speed, and the card is never more than 3 points over.
///
/// Judged by the card's busy time over the last second (the sim's own account) and by
/// steps, counted where the program synchronises: each count may be off by one sync's
/// `TORCH_SYNC_EVERY` steps, so the ratio is judged as the range those allow. Was open
/// at 58-59% of bare (the card 53-55% busy) while the limiter charged 48.9%: its
/// estimates of grid-varying launches came out ~15% low; now 52-56% of bare steps, the card
/// 50-52% busy.
#[test]
fn training_like_pytorch_is_held_to_its_limit() {
    let role = Role::plain("k_1ms", 3000).mode("torch");
    let bare = run_one("torch-bare", "", role);
    let limited = run_one("torch-50", "    core_limit: 50\n", role);
    let (bare_steps, steps) = (bare.launches as f64, limited.launches as f64);
    let slack = TORCH_SYNC_EVERY as f64;
    let (least, most) = (
        (steps - slack) / (bare_steps + slack) * 100.0,
        (steps + slack) / (bare_steps - slack).max(1.0) * 100.0,
    );
    eprintln!(
        "torch-like: bare {bare_steps} steps (the card {}% busy), at 50: {steps} steps ({least:.1}-{most:.1}% of bare), the card {}% busy",
        bare.card_util, limited.card_util
    );
    assert!(
        bare_steps > 4.0 * slack && bare.card_util >= 90,
        "the bare run kept the card busy: {bare:?}"
    );
    assert!(
        limited.card_util <= 53,
        "at 50 the card was {}% busy",
        limited.card_util
    );
    assert!(
        most >= 45.0 && least <= 55.0,
        "at 50: {least:.1}-{most:.1}% of bare steps"
    );
}
