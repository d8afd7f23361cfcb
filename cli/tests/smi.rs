//! End-to-end tests of `vgpu smi`: the built binary run against the simulated driver
//! (`libvgpu_sim.so` of crate `vgpu-sim-driver`, loaded through `VGPU_NVML_LIBRARY`),
//! plus the error paths that need no NVML at all.
//!
//! The simulated-driver tests need `cargo build -p vgpu-sim-driver` first (same
//! profile); they fail with that instruction when the library is missing.

use std::ffi::{c_int, c_uint, c_void};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const SIM_UUID_0: &str = "GPU-51d00000-0000-4000-8000-000000000001";
const SIM_UUID_1: &str = "GPU-51d00000-0000-4000-8000-000000000002";

/// `target/<profile>/libvgpu_sim.so`, next to the `vgpu` binary under test.
fn sim_library() -> PathBuf {
    let binary = Path::new(env!("CARGO_BIN_EXE_vgpu"));
    let profile_dir = binary.parent().expect("the vgpu binary lives in a folder");
    vgpu_test_support::in_profile_dir(profile_dir, "libvgpu_sim.so").unwrap_or_else(|| {
        panic!(
            "the simulated driver is not built (libvgpu_sim.so missing in {}): run `cargo test --workspace`",
            profile_dir.display()
        )
    })
}

/// A simulated machine: its env for `vgpu smi`, with a private state file.
struct SimMachine {
    state_dir: tempfile::TempDir,
    gpus: u32,
    memory: &'static str,
    name: &'static str,
}

impl SimMachine {
    fn new(gpus: u32, memory: &'static str, name: &'static str) -> SimMachine {
        SimMachine {
            state_dir: tempfile::tempdir().expect("temp dir"),
            gpus,
            memory,
            name,
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_vgpu"));
        command
            .arg("smi")
            .args(args)
            .env("VGPU_NVML_LIBRARY", sim_library())
            .env("VGPU_SIM_GPUS", self.gpus.to_string())
            .env("VGPU_SIM_MEMORY", self.memory)
            .env("VGPU_SIM_NAME", self.name)
            .env("VGPU_SIM_STATE", self.state_dir.path().join("state"))
            .env_remove("VGPU_SIM_CONFIG")
            .env_remove("VGPU_LOG");
        command
    }

    fn smi(&self, args: &[&str]) -> Output {
        run_with_deadline(self.command(args))
    }

    /// Starts a process (this test binary, running `simulated_memory_holder`) that
    /// opens a context on GPU 0 of this machine and allocates 1 GiB, and waits until it
    /// holds it.
    fn start_memory_holder(&self) -> Child {
        let mut child = Command::new(std::env::current_exe().expect("test binary path"))
            .args([
                "--exact",
                "simulated_memory_holder",
                "--include-ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(HOLDER_ENV, sim_library())
            .env("VGPU_SIM_GPUS", self.gpus.to_string())
            .env("VGPU_SIM_MEMORY", self.memory)
            .env("VGPU_SIM_NAME", self.name)
            .env("VGPU_SIM_STATE", self.state_dir.path().join("state"))
            .env_remove("VGPU_SIM_CONFIG")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the memory holder");
        let stdout = child.stdout.take().expect("holder stdout");
        let mut lines = BufReader::new(stdout).lines();
        loop {
            match lines.next() {
                // libtest prints "test NAME ... " before the test's own output, on one line.
                Some(Ok(line)) if line.ends_with(HOLDING_LINE) => break,
                Some(Ok(_)) => continue,
                other => {
                    let _ = child.kill();
                    panic!("the memory holder stopped before holding memory: {other:?}");
                }
            }
        }
        child
    }
}

/// Env var telling `simulated_memory_holder` which simulated driver to load.
const HOLDER_ENV: &str = "VGPU_SMI_TEST_HOLDER_LIBRARY";
const HOLDING_LINE: &str = "vgpu-smi-test: holding 1 GiB";
const HOLDER_BYTES: usize = 1 << 30;

/// Runs a command, killing it if it takes more than 20 s (a hang is a failure).
fn run_with_deadline(mut command: Command) -> Output {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn vgpu");
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().expect("wait for vgpu").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("vgpu smi did not finish within 20 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("collect vgpu output")
}

fn stdout_of(output: &Output) -> String {
    assert!(
        output.status.success(),
        "vgpu smi failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).expect("utf-8 output")
}

#[test]
fn table_shows_every_simulated_gpu() {
    let machine = SimMachine::new(2, "4GiB", "Tesla Sim");
    let table = stdout_of(&machine.smi(&[]));
    let lines: Vec<&str> = table.lines().collect();

    assert!(lines[2].starts_with("| VGPU-SMI "), "{table}");
    assert!(lines[2].contains("Driver Version: 580.159.04"), "{table}");
    assert!(lines[2].contains("CUDA Version: 13.0"), "{table}");
    let gpu_rows: Vec<&&str> = lines
        .iter()
        .filter(|line| line.contains("Tesla Sim"))
        .collect();
    assert_eq!(gpu_rows.len(), 2, "{table}");
    assert!(gpu_rows[0].starts_with("|   0  Tesla Sim "), "{table}");
    assert!(gpu_rows[1].starts_with("|   1  Tesla Sim "), "{table}");
    assert!(gpu_rows[0].contains("00000000:11:00.0"), "{table}");
    assert!(gpu_rows[1].contains("00000000:12:00.0"), "{table}");
    let memory_cells = lines
        .iter()
        .filter(|line| line.contains(" /   4096MiB |"))
        .count();
    assert_eq!(memory_cells, 2, "{table}");
    assert!(table.contains("|  No running processes found "), "{table}");
    for line in lines.iter().skip(1).filter(|line| !line.is_empty()) {
        assert_eq!(line.chars().count(), 91, "{line:?}");
    }
    assert!(
        !table.contains("Not Found") && !table.contains("rror"),
        "{table}"
    );
}

#[test]
fn list_gpus_prints_names_and_uuids() {
    let machine = SimMachine::new(2, "4GiB", "Tesla Sim");
    let listing = stdout_of(&machine.smi(&["-L"]));
    assert_eq!(
        listing,
        format!("GPU 0: Tesla Sim (UUID: {SIM_UUID_0})\nGPU 1: Tesla Sim (UUID: {SIM_UUID_1})\n")
    );
}

#[test]
fn installed_as_nvidia_smi_it_is_vgpu_smi() {
    // tests/k8s/cluster.sh installs vgpu as the simulated node's nvidia-smi.
    let machine = SimMachine::new(2, "4GiB", "Tesla Sim");
    let folder = tempfile::tempdir().expect("temp dir");
    let nvidia_smi = folder.path().join("nvidia-smi");
    // A link, not a copy: writing an executable while another test thread forks can
    // leave the new file open in that child, and exec then fails with ETXTBSY.
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_vgpu"), &nvidia_smi).expect("link vgpu");
    let command = machine.command(&["-L"]);
    let mut as_smi = Command::new(&nvidia_smi);
    as_smi.arg("-L");
    for (key, value) in command.get_envs() {
        match value {
            Some(value) => as_smi.env(key, value),
            None => as_smi.env_remove(key),
        };
    }
    let listing = stdout_of(&run_with_deadline(as_smi));
    assert_eq!(
        listing,
        format!("GPU 0: Tesla Sim (UUID: {SIM_UUID_0})\nGPU 1: Tesla Sim (UUID: {SIM_UUID_1})\n")
    );
}

#[test]
fn query_gpu_csv_reports_memory_total() {
    let machine = SimMachine::new(3, "80GiB", "NVIDIA H200 (simulated)");
    let csv = stdout_of(&machine.smi(&[
        "--query-gpu=index,name,uuid,memory.total,count",
        "--format=csv",
    ]));
    let rows: Vec<&str> = csv.lines().collect();
    assert_eq!(rows[0], "index, name, uuid, memory.total [MiB], count");
    assert_eq!(rows.len(), 4, "{csv}");
    assert_eq!(
        rows[1],
        format!("0, NVIDIA H200 (simulated), {SIM_UUID_0}, 81920 MiB, 3")
    );

    let bare = stdout_of(&machine.smi(&[
        "--query-gpu=memory.total,memory.used",
        "--format=csv,noheader,nounits",
    ]));
    for row in bare.lines() {
        let cells: Vec<&str> = row.split(", ").collect();
        assert_eq!(cells[0], "81920", "{bare}");
        let used: u64 = cells[1]
            .parse()
            .unwrap_or_else(|_| panic!("memory.used is a number: {bare}"));
        assert!(used < 81920, "{bare}");
    }
}

#[test]
fn id_picks_one_gpu_by_index_or_uuid() {
    let machine = SimMachine::new(2, "4GiB", "Tesla Sim");
    let by_index = stdout_of(&machine.smi(&["-L", "-i", "1"]));
    assert_eq!(by_index, format!("GPU 1: Tesla Sim (UUID: {SIM_UUID_1})\n"));
    let by_uuid = stdout_of(&machine.smi(&[
        "--query-gpu=index",
        "--format=csv,noheader",
        "--id",
        SIM_UUID_1,
    ]));
    assert_eq!(by_uuid, "1\n");
    let table = stdout_of(&machine.smi(&["-i", "0"]));
    assert_eq!(
        table
            .lines()
            .filter(|line| line.contains("Tesla Sim"))
            .count(),
        1,
        "{table}"
    );

    let missing = machine.smi(&["-L", "-i", "7"]);
    assert!(!missing.status.success());
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(stderr.contains("no GPU has index 7"), "{stderr}");
}

#[test]
fn compute_apps_without_processes_is_only_the_header() {
    let machine = SimMachine::new(1, "4GiB", "Tesla Sim");
    let csv = stdout_of(&machine.smi(&[
        "--query-compute-apps=pid,process_name,used_memory,gpu_uuid",
        "--format=csv",
    ]));
    assert_eq!(csv, "pid, process_name, used_gpu_memory [MiB], gpu_uuid\n");
}

#[test]
fn unknown_field_fails_naming_it() {
    let mut command = Command::new(env!("CARGO_BIN_EXE_vgpu"));
    command.args(["smi", "--query-gpu=name,clocks.bogus", "--format=csv"]);
    let output = run_with_deadline(command);
    assert!(!output.status.success());
    assert!(output.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("Field \"clocks.bogus\" is not a valid field to query."),
        "{stderr}"
    );
}

#[test]
fn bad_format_fails_naming_the_modifier() {
    let mut command = Command::new(env!("CARGO_BIN_EXE_vgpu"));
    command.args(["smi", "--query-gpu=name", "--format=xml"]);
    let output = run_with_deadline(command);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("\"xml\""), "{stderr}");
}

#[test]
fn missing_nvml_library_is_a_clear_error() {
    let mut command = Command::new(env!("CARGO_BIN_EXE_vgpu"));
    command
        .args(["smi", "-L"])
        .env("VGPU_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1");
    let output = run_with_deadline(command);
    assert!(!output.status.success());
    assert!(output.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("could not initialize NVML through /nonexistent/libnvidia-ml.so.1"),
        "{stderr}"
    );
}

/// Not a test on its own: the helper process of `processes_of_other_programs_are_listed`.
/// It loads the simulated driver, allocates 1 GiB on GPU 0, says so on stdout and holds
/// it until its stdin closes (the parent test ends or dies).
#[test]
#[ignore = "helper process, started by processes_of_other_programs_are_listed"]
fn simulated_memory_holder() {
    type CuInit = unsafe extern "C" fn(c_uint) -> c_int;
    type CuDeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> c_int;
    type CuCtxCreate = unsafe extern "C" fn(*mut *mut c_void, c_uint, c_int) -> c_int;
    type CuMemAlloc = unsafe extern "C" fn(*mut u64, usize) -> c_int;

    let library = std::env::var_os(HOLDER_ENV)
        .unwrap_or_else(|| panic!("{HOLDER_ENV} is unset: this helper is started by another test"));
    // SAFETY: test-only; the simulated driver is a Rust cdylib whose exports have the
    // CUDA driver API signatures spelled out by the types above, and every pointer
    // passed points to a live local.
    unsafe {
        let sim = libloading::Library::new(&library).expect("load the simulated driver");
        let cu_init = sim.get::<CuInit>(b"cuInit\0").expect("cuInit");
        let cu_device_get = sim
            .get::<CuDeviceGet>(b"cuDeviceGet\0")
            .expect("cuDeviceGet");
        let cu_ctx_create = sim
            .get::<CuCtxCreate>(b"cuCtxCreate_v2\0")
            .expect("cuCtxCreate_v2");
        let cu_mem_alloc = sim
            .get::<CuMemAlloc>(b"cuMemAlloc_v2\0")
            .expect("cuMemAlloc_v2");
        assert_eq!(cu_init(0), 0, "cuInit");
        let mut device: c_int = -1;
        assert_eq!(cu_device_get(&mut device, 0), 0, "cuDeviceGet");
        let mut context: *mut c_void = std::ptr::null_mut();
        assert_eq!(cu_ctx_create(&mut context, 0, device), 0, "cuCtxCreate_v2");
        let mut pointer: u64 = 0;
        assert_eq!(cu_mem_alloc(&mut pointer, HOLDER_BYTES), 0, "cuMemAlloc_v2");
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "{HOLDING_LINE}").expect("tell the parent");
        stdout.flush().expect("tell the parent");
        let mut rest = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut rest);
    }
}

#[test]
fn processes_of_other_programs_are_listed() {
    let machine = SimMachine::new(2, "8GiB", "Tesla Sim");
    let mut holder = machine.start_memory_holder();
    let pid = holder.id().to_string();

    let csv_output = machine.smi(&[
        "--query-compute-apps=pid,used_memory,gpu_uuid",
        "--format=csv,noheader,nounits",
    ]);
    let table_output = machine.smi(&[]);
    let used_output = machine.smi(&[
        "--query-gpu=memory.used",
        "--format=csv,noheader,nounits",
        "-i",
        "0",
    ]);
    drop(holder.stdin.take());
    let _ = holder.kill();
    let _ = holder.wait();

    let csv = stdout_of(&csv_output);
    let row = csv
        .lines()
        .find(|row| row.starts_with(&format!("{pid}, ")))
        .unwrap_or_else(|| panic!("no row for holder pid {pid}: {csv:?}"));
    let cells: Vec<&str> = row.split(", ").collect();
    let used_mib: u64 = cells[1]
        .parse()
        .unwrap_or_else(|_| panic!("used_memory is a number: {row}"));
    assert!(used_mib >= 1024, "{row}");
    assert_eq!(cells[2], SIM_UUID_0, "{row}");

    let table = stdout_of(&table_output);
    let process_row = table
        .lines()
        .find(|line| line.split_whitespace().nth(4) == Some(pid.as_str()))
        .unwrap_or_else(|| panic!("no table row for pid {pid}: {table}"));
    assert!(
        process_row.starts_with("|    0   N/A  N/A "),
        "{process_row}"
    );
    assert!(
        process_row.ends_with(&format!("{used_mib:>6}MiB |")),
        "{process_row}"
    );
    assert!(process_row.contains("      C   "), "{process_row}");
    assert!(!table.contains("No running processes found"), "{table}");

    let used: u64 = stdout_of(&used_output)
        .trim()
        .parse()
        .expect("memory.used is a number");
    assert!(used >= 1024, "memory.used {used}");
}
