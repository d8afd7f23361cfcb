//! End-to-end tests of the compute limiter: the real built shim
//! (`target/<profile>/libcuda_shim.so`) over the simulated driver
//! (`target/<profile>/libvgpu_sim.so`, build it first: `cargo build -p vgpu-sim-driver`),
//! whose kernels take the time their name says (`k_1ms`) on per-stream timelines.
//!
//! Each "container" is a child process (this test binary re-run as
//! `child_process_entry` with `LIMITER_ROLE` set) with its own shim config and usage
//! region; they share the simulated machine's state file and the card state folder. A
//! child launches kernels as fast as the shim lets it for a while and prints its
//! simulated busy fraction per 100 ms window, computed from its own kernel timeline
//! (start = max(launch, previous end), as the simulator schedules a stream).

use std::ffi::{CString, c_char, c_uint, c_void};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const WINDOW_NS: u64 = 100_000_000;

fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .to_path_buf()
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
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

/// The simulated machine: a driver folder whose libcuda.so.1 is the simulator, and the
/// simulator's cross-process state file.
struct Machine {
    scratch: Scratch,
}

impl Machine {
    fn new(name: &str) -> Machine {
        let sim = profile_dir().join("libvgpu_sim.so");
        assert!(
            sim.exists(),
            "{} missing: run `cargo build -p vgpu-sim-driver` first",
            sim.display()
        );
        assert!(
            profile_dir().join("libcuda_shim.so").exists(),
            "libcuda_shim.so missing: run `cargo build -p libcuda-shim`"
        );
        let scratch = Scratch::new(name);
        let driver = scratch.0.join("driver");
        std::fs::create_dir_all(&driver).expect("driver dir");
        std::os::unix::fs::symlink(&sim, driver.join("libcuda.so.1")).expect("symlink");
        std::fs::create_dir_all(scratch.0.join("cards")).expect("cards dir");
        Machine { scratch }
    }

    /// A container config: `quota` is the YAML of device 0's compute settings.
    fn container(&self, name: &str, quota: &str) -> PathBuf {
        let dir = self.scratch.0.join(name);
        std::fs::create_dir_all(&dir).expect("container dir");
        let config = dir.join("vgpu.yaml");
        let text = format!(
            "card_state_dir: {}\ndevices:\n  - index: 0\n    memory_limit: 8GiB\n{quota}",
            self.scratch.0.join("cards").display()
        );
        std::fs::write(&config, text).expect("config");
        config
    }

    /// Starts a child "container" running `kernel` for `run_ms`.
    fn spawn(&self, config: &Path, kernel: &str, run_ms: u64) -> std::process::Child {
        self.command(config, kernel, run_ms)
            .spawn()
            .expect("spawn child")
    }

    /// The command of a child "container".
    fn command(&self, config: &Path, kernel: &str, run_ms: u64) -> Command {
        let mut command = Command::new(std::env::current_exe().expect("exe"));
        command
            .args([
                "--exact",
                "child_process_entry",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("LIMITER_ROLE", format!("{kernel}:{run_ms}"))
            .env("VGPU_CONFIG", config)
            .env("VGPU_DRIVER_DIR", self.scratch.0.join("driver"))
            .env("VGPU_SIM_STATE", self.scratch.0.join("sim.state"))
            .env("VGPU_SIM_GPUS", "1")
            .env_remove("VGPU_LOG")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        command
    }
}

/// What a child reports.
#[derive(Debug)]
struct Report {
    t0: u64,
    launches: u64,
    /// The longest time one launch call took, ns.
    max_call_ns: u64,
    /// Busy fraction (0-100) of each 100 ms window from t0.
    windows: Vec<f64>,
    /// Busy ns the usage region recorded for the child's slot at the end.
    region_busy_ns: u64,
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
        max_call_ns: number(2),
        region_busy_ns: number(3),
        windows: fields[4..]
            .iter()
            .map(|f| f.parse().expect("window"))
            .collect(),
    }
}

fn run_one(name: &str, quota: &str, kernel: &str, run_ms: u64) -> Report {
    let machine = Machine::new(name);
    let config = machine.container("a", quota);
    let report = finish(machine.spawn(&config, kernel, run_ms));
    eprintln!(
        "{name}: {kernel} under `{}`: mean {:.1}%, worst 100 ms window {:.1}%, {} launches, windows {:?}",
        quota.trim().replace('\n', ","),
        report.mean(0, usize::MAX),
        report.worst(0),
        report.launches,
        report.windows
    );
    report
}

#[test]
fn hard_30_with_1ms_kernels_holds_30_percent() {
    let report = run_one("hard30-1ms", "    core_limit: 30\n", "k_1ms", 1000);
    let mean = report.mean(0, usize::MAX);
    assert!((mean - 30.0).abs() <= 5.0, "mean {mean:.1}%: {report:?}");
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
}

#[test]
fn hard_30_with_100us_kernels_holds_30_percent() {
    let report = run_one("hard30-100us", "    core_limit: 30\n", "k_100us", 1000);
    let mean = report.mean(0, usize::MAX);
    assert!((mean - 30.0).abs() <= 5.0, "mean {mean:.1}%: {report:?}");
    assert!(
        report.worst(0) <= 40.0,
        "a 100 ms window above 40%: {report:?}"
    );
    assert!(report.launches > 1000, "{report:?}");
}

#[test]
fn hard_limits_hold_in_every_window_with_10ms_kernels() {
    for limit in [10u32, 50, 70] {
        let report = run_one(
            &format!("hard{limit}-10ms"),
            &format!("    core_limit: {limit}\n"),
            "k_10ms",
            1000,
        );
        let mean = report.mean(0, usize::MAX);
        assert!(
            (mean - limit as f64).abs() <= 5.0,
            "limit {limit}: mean {mean:.1}%: {report:?}"
        );
        assert!(
            report.worst(0) <= limit as f64 + 10.0,
            "limit {limit}: a window above limit+10: {report:?}"
        );
    }
}

#[test]
fn no_limit_means_no_delay() {
    let report = run_one("nolimit", "", "k_100us", 500);
    // Under a loaded CI machine the launch loop itself costs a little of the timeline;
    // any throttling would show as a drop far below this.
    assert!(report.mean(1, usize::MAX) >= 95.0, "{report:?}");
    assert!(
        report.max_call_ns < 2_000_000,
        "a launch call took {} ns with no limit",
        report.max_call_ns
    );
    let limit_100 = run_one("limit100", "    core_limit: 100\n", "k_100us", 500);
    assert!(limit_100.mean(1, usize::MAX) >= 95.0, "{limit_100:?}");
    assert!(limit_100.max_call_ns < 2_000_000, "{limit_100:?}");
}

#[test]
fn soft_mode_alone_uses_the_idle_card() {
    let report = run_one(
        "soft-alone",
        "    core_limit: 30\n    core_mode: soft\n",
        "k_1ms",
        1000,
    );
    assert!(
        report.mean(0, usize::MAX) >= 80.0,
        "soft mode alone stayed at {:.1}%: {report:?}",
        report.mean(0, usize::MAX)
    );
    let capped = run_one(
        "soft-ceiling",
        "    core_limit: 30\n    core_mode: soft\n    core_ceiling: 50\n",
        "k_1ms",
        1000,
    );
    let mean = capped.mean(0, usize::MAX);
    assert!(
        (mean - 50.0).abs() <= 5.0,
        "soft with ceiling 50: {mean:.1}%: {capped:?}"
    );
}

#[test]
fn soft_mode_falls_back_within_a_second_when_another_container_is_busy() {
    let machine = Machine::new("soft-contended");
    let soft = machine.container("soft", "    core_limit: 30\n    core_mode: soft\n");
    let other = machine.container("other", "    core_limit: 60\n");
    let first = machine.spawn(&soft, "k_1ms", 3000);
    std::thread::sleep(Duration::from_millis(1000));
    let second = machine.spawn(&other, "k_1ms", 1800);
    let (soft, other) = (finish(first), finish(second));
    // Windows of the soft container, aligned to the second one's start.
    let second_starts = ((other.t0.saturating_sub(soft.t0)) / WINDOW_NS) as usize;
    eprintln!(
        "soft windows {:?}\nsecond starts at window {second_starts}; its windows {:?}",
        soft.windows, other.windows
    );
    assert!(
        soft.mean(2, second_starts) >= 80.0,
        "alone it should use the idle card: {soft:?}"
    );
    // From one second after the other container started until it stops, at its share.
    let settled = second_starts + 10;
    let fallback_end = second_starts + 17;
    let mean = soft.mean(settled, fallback_end);
    assert!(
        (mean - 30.0).abs() <= 5.0,
        "under contention: {mean:.1}%: {soft:?}"
    );
    assert!(
        soft.windows[settled..fallback_end]
            .iter()
            .all(|w| *w <= 40.0),
        "{soft:?}"
    );
    // The fall back itself is quick: within 300 ms of the other container's start.
    assert!(
        soft.mean(second_starts + 3, settled) <= 40.0,
        "slow fallback: {soft:?}"
    );
    // And the other (hard 60) got its share meanwhile.
    let other_mean = other.mean(0, 17);
    assert!(
        (other_mean - 60.0).abs() <= 5.0,
        "hard 60 beside soft 30: {other_mean:.1}%"
    );
}

#[test]
fn two_processes_of_one_container_share_its_limit() {
    let machine = Machine::new("one-container-two-processes");
    let config = machine.container("shared", "    core_limit: 30\n");
    let first = machine.spawn(&config, "k_1ms", 2000);
    let second = machine.spawn(&config, "k_1ms", 2000);
    let (first, second) = (finish(first), finish(second));
    // After both have started and published (a few windows in), until the end.
    let (a, b) = (first.mean(5, 18), second.mean(5, 18));
    eprintln!(
        "one container, two processes: {a:.1}% + {b:.1}% = {:.1}%\n{:?}\n{:?}",
        a + b,
        first.windows,
        second.windows
    );
    assert!(
        (a + b - 30.0).abs() <= 5.0,
        "the container took {:.1}% under a limit of 30",
        a + b
    );
    assert!(
        (a - 15.0).abs() <= 5.0 && (b - 15.0).abs() <= 5.0,
        "an even split: {a:.1}% and {b:.1}%"
    );
}

#[test]
fn a_forked_child_of_a_throttled_process_neither_hangs_nor_crashes() {
    let machine = Machine::new("fork");
    let config = machine.container("a", "    core_limit: 20\n");
    let mut command = machine.command(&config, "k_1ms", 300);
    let output = command.env("LIMITER_FORK", "1").output().expect("child");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("FORK-OK"), "{stdout}");
}

/// The child side: loads the shim like an application would, launches `kernel` on its
/// own stream as fast as allowed for the run time, and prints its timeline's windows.
#[test]
fn child_process_entry() {
    let Ok(role) = std::env::var("LIMITER_ROLE") else {
        return;
    };
    let (kernel, run_ms) = role.split_once(':').expect("role kernel:ms");
    let run_ns: u64 = run_ms.parse::<u64>().expect("ms") * 1_000_000;
    let duration_ns = match kernel {
        "k_100us" => 100_000,
        "k_1ms" => 1_000_000,
        "k_10ms" => 10_000_000,
        other => panic!("unknown kernel {other}"),
    };
    // SAFETY: loading the shim under test; its constructor loads the simulator.
    let lib = unsafe { libloading::Library::new(profile_dir().join("libcuda_shim.so")) }
        .expect("dlopen shim");
    macro_rules! sym {
        ($name:literal as $ty:ty) => {
            // SAFETY: the C signature of the driver API function.
            *unsafe { lib.get::<$ty>($name) }.unwrap_or_else(|err| panic!("dlsym: {err}"))
        };
    }
    type H = *mut c_void;
    let cu_init: unsafe extern "C" fn(u32) -> u32 = sym!(b"cuInit" as _);
    let device_get: unsafe extern "C" fn(*mut i32, i32) -> u32 = sym!(b"cuDeviceGet" as _);
    let retain: unsafe extern "C" fn(*mut H, i32) -> u32 = sym!(b"cuDevicePrimaryCtxRetain" as _);
    let set_current: unsafe extern "C" fn(H) -> u32 = sym!(b"cuCtxSetCurrent" as _);
    let load_data: unsafe extern "C" fn(*mut H, *const c_void) -> u32 =
        sym!(b"cuModuleLoadData" as _);
    let get_function: unsafe extern "C" fn(*mut H, H, *const c_char) -> u32 =
        sym!(b"cuModuleGetFunction" as _);
    let stream_create: unsafe extern "C" fn(*mut H, u32) -> u32 = sym!(b"cuStreamCreate" as _);
    let synchronize: unsafe extern "C" fn(H) -> u32 = sym!(b"cuStreamSynchronize" as _);
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
    let launch: Launch = sym!(b"cuLaunchKernel" as _);
    let (mut device, mut context, mut module, mut function, mut stream) = (
        0,
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        std::ptr::null_mut(),
    );
    let image: &[u8] = b".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry k_100us()\n{\n ret;\n}\n.visible .entry k_1ms()\n{\n ret;\n}\n.visible .entry k_10ms()\n{\n ret;\n}\n\0";
    let name = CString::new(kernel).expect("name");
    // SAFETY: driver API calls with valid out-pointers, in order.
    unsafe {
        assert_eq!(cu_init(0), 0, "cuInit");
        assert_eq!(device_get(&mut device, 0), 0, "cuDeviceGet");
        assert_eq!(retain(&mut context, device), 0, "cuDevicePrimaryCtxRetain");
        assert_eq!(set_current(context), 0, "cuCtxSetCurrent");
        assert_eq!(
            load_data(&mut module, image.as_ptr().cast()),
            0,
            "cuModuleLoadData"
        );
        assert_eq!(
            get_function(&mut function, module, name.as_ptr()),
            0,
            "cuModuleGetFunction"
        );
        assert_eq!(stream_create(&mut stream, 1), 0, "cuStreamCreate");
    }
    let t0 = monotonic_ns();
    let (mut gpu_free, mut launches, mut max_call) = (0u64, 0u64, 0u64);
    let mut kernels: Vec<(u64, u64)> = Vec::new();
    loop {
        let before = monotonic_ns();
        if before >= t0 + run_ns {
            break;
        }
        // SAFETY: a valid function and stream of the current context; no parameters.
        let result = unsafe {
            launch(
                function,
                1,
                1,
                1,
                32,
                1,
                1,
                0,
                stream,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        assert_eq!(result, 0, "cuLaunchKernel");
        let after = monotonic_ns();
        max_call = max_call.max(after - before);
        let start = gpu_free.max(after.min(before + 50_000));
        gpu_free = start + duration_ns;
        kernels.push((start, gpu_free));
        launches += 1;
        // Keep the queue short, as a real program that reads results would.
        if gpu_free > after + 20 * duration_ns.max(1_000_000) {
            // SAFETY: the stream is ours.
            unsafe { synchronize(stream) };
        }
    }
    let windows: Vec<String> = (0..run_ns / WINDOW_NS)
        .map(|w| {
            let (from, to) = (t0 + w * WINDOW_NS, t0 + (w + 1) * WINDOW_NS);
            let busy: u64 = kernels
                .iter()
                .map(|&(s, e)| e.min(to).saturating_sub(s.max(from)))
                .sum();
            format!("{:.1}", busy as f64 * 100.0 / WINDOW_NS as f64)
        })
        .collect();
    // SAFETY: the stream is ours.
    unsafe { synchronize(stream) };
    std::thread::sleep(Duration::from_millis(5));
    // One more (cheap) launch lets the shim settle its last measurements.
    // SAFETY: as above.
    unsafe {
        launch(
            function,
            1,
            1,
            1,
            32,
            1,
            1,
            0,
            stream,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    let region_busy = region_busy_ns(&std::env::var("VGPU_CONFIG").expect("config"));
    if std::env::var_os("LIMITER_FORK").is_some() {
        // A forked child of a throttled process: it starts CUDA afresh, as CUDA wants,
        // and launches throttled kernels; it must neither hang on state the parent's
        // threads held at the fork nor crash. The parent gives it 10 s.
        // SAFETY: fork in a test process; the child only calls the driver API and exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork");
        if pid == 0 {
            // SAFETY: driver API calls with valid out-pointers, in order; _exit skips
            // the parent's atexit handlers.
            unsafe {
                let mut ok = cu_init(0) == 0
                    && device_get(&mut device, 0) == 0
                    && retain(&mut context, device) == 0
                    && set_current(context) == 0
                    && load_data(&mut module, image.as_ptr().cast()) == 0
                    && get_function(&mut function, module, name.as_ptr()) == 0
                    && stream_create(&mut stream, 1) == 0;
                for _ in 0..50 {
                    ok &= launch(
                        function,
                        1,
                        1,
                        1,
                        32,
                        1,
                        1,
                        0,
                        stream,
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                    ) == 0;
                }
                ok &= synchronize(stream) == 0;
                libc::_exit(if ok { 0 } else { 3 });
            }
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut status = 0;
        loop {
            // SAFETY: waiting for our own child.
            let done = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if done == pid {
                break;
            }
            if std::time::Instant::now() > deadline {
                // SAFETY: our own child.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                panic!("the forked child hung");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "forked child failed: status {status}"
        );
        println!("FORK-OK");
    }
    println!(
        "LIMITER-RESULT {t0} {launches} {max_call} {region_busy} {}",
        windows.join(" ")
    );
}

/// The busy time recorded in the usage region beside the config, for this process.
fn region_busy_ns(config: &str) -> u64 {
    let region_path = Path::new(config).with_file_name("usage.region");
    let Ok(region) = vgpu_common::region::Region::open_existing(&region_path) else {
        return 0;
    };
    let me = std::process::id() as i32;
    region
        .processes()
        .iter()
        .filter(|p| p.pid == me)
        .map(|p| p.busy_ns.first().copied().unwrap_or(0))
        .sum()
}
