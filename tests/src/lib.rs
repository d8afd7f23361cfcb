//! Shared helpers for the integration tests: where the built artifacts are, a sim
//! "host" (state file and GPU count) per test, and running commands under `vgpu run`.
//!
//! The tests drive the real built shims and the real simulated driver, never a mock:
//! `tests/run.sh` (the CI command) builds the whole workspace before `cargo test`.

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use vgpu_test_support::repo_root;

/// `target/<profile>`, found from the test executable (`target/<profile>/deps/…`).
pub fn target_dir() -> PathBuf {
    vgpu_test_support::profile_dir()
}

/// A built artifact in the target folder (or its `deps/`, where `cargo test` leaves
/// the shims and the sim driver); panics with the build command if missing.
pub fn artifact(name: &str) -> PathBuf {
    vgpu_test_support::built(name).unwrap_or_else(|| {
        panic!(
            "{} is not built: run `cargo test --workspace` or `cargo build --workspace`",
            target_dir().join(name).display()
        )
    })
}

/// The `vgpu` CLI of this build.
pub fn vgpu() -> PathBuf {
    artifact("vgpu")
}

/// A simulated host: its own sim state file and GPU count, so tests never share a card.
pub struct SimHost {
    /// The host's private folder: the sim state file, marker files and whatever a test
    /// writes; removed when the host is dropped.
    pub dir: tempfile::TempDir,
    /// `VGPU_SIM_GPUS`: how many cards the sim driver reports.
    gpus: u32,
    /// `VGPU_SIM_MEMORY`: each simulated card's total memory, in the sim's size syntax.
    memory: &'static str,
}

impl SimHost {
    /// A host of `gpus` simulated 80 GiB cards, in a fresh temporary folder.
    pub fn new(gpus: u32) -> SimHost {
        SimHost {
            dir: tempfile::tempdir().expect("tempdir"),
            gpus,
            memory: "80GiB",
        }
    }

    /// Applies the sim's env to a command.
    pub fn apply<'a>(&self, command: &'a mut Command) -> &'a mut Command {
        command
            .env("VGPU_SIM_GPUS", self.gpus.to_string())
            .env("VGPU_SIM_MEMORY", self.memory)
            .env("VGPU_SIM_STATE", self.dir.path().join("sim.state"))
            // Small enough that a 1 GiB quota still holds 768 MiB next to the context.
            .env("VGPU_SIM_CONTEXT_OVERHEAD", "64MiB")
            .env_remove("VGPU_CONFIG")
            .env_remove("VGPU_DRIVER_DIR")
    }

    /// A `vgpu install` folder of this build's artifacts in the host's folder, as the GPU
    /// suite's scripts get one.
    pub fn install(&self) -> PathBuf {
        let prefix = self.dir.path().join("prefix");
        let output = Command::new(vgpu())
            .args(["install", "--prefix"])
            .arg(&prefix)
            .output()
            .expect("run vgpu install");
        assert!(
            output.status.success(),
            "vgpu install: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        prefix
    }

    /// `vgpu run --simulate ARGS... -- CMD...`
    pub fn run(&self, vgpu_args: &[&str], command: &[&str]) -> Output {
        let mut cmd = Command::new(vgpu());
        cmd.arg("run")
            .arg("--simulate")
            .args(vgpu_args)
            .arg("--")
            .args(command);
        self.apply(&mut cmd).output().expect("spawn vgpu run")
    }

    /// `vgpu run --simulate ARGS... -- python3 tests/clients/SCRIPT CLIENT_ARGS...`, which
    /// must succeed; its `RESULT` object.
    pub fn python_result(
        &self,
        vgpu_args: &[&str],
        script: &str,
        client_args: &[&str],
    ) -> serde_json::Value {
        let script = client(script);
        let mut command = vec!["python3", script.as_str()];
        command.extend_from_slice(client_args);
        let output = self.run(vgpu_args, &command);
        assert!(
            output.status.success(),
            "stderr: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        result_json(&output)
    }

    /// A "neighbour": `cuda_check.py hold MIB SECONDS` on the bare sim, outside any
    /// container, and its PID once it holds the memory.
    pub fn neighbour(&self, mib: &str, seconds: &str) -> (std::process::Child, i32) {
        let marker = self.dir.path().join(format!("neighbour-{mib}.pid"));
        let mut command = Command::new("python3");
        command.args([
            &client("cuda_check.py"),
            "hold",
            mib,
            seconds,
            marker.to_str().expect("utf-8"),
        ]);
        self.apply(&mut command);
        let child = command
            .env("LD_LIBRARY_PATH", self.bare_driver_dir())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("neighbour");
        (child, wait_for_pid(&marker))
    }

    /// A folder with `libcuda.so.1` (or `libnvidia-ml.so.1`) linked to the built shim,
    /// for running a client on the shim directly (no `vgpu run`).
    pub fn shim_dir(&self) -> PathBuf {
        let dir = self.dir.path().join("direct");
        std::fs::create_dir_all(&dir).expect("create");
        for (name, shim) in [
            ("libcuda.so.1", "libcuda_shim.so"),
            ("libnvidia-ml.so.1", "libnvml_shim.so"),
        ] {
            let link = dir.join(name);
            if !link.exists() {
                std::os::unix::fs::symlink(artifact(shim), link).expect("link");
            }
        }
        dir
    }

    /// `COMMAND...` on the shims directly, with `config` as `VGPU_CONFIG` and the bare
    /// sim as the real driver; not run yet.
    pub fn direct(&self, config: &Path, command: &[&str]) -> Command {
        let mut direct = Command::new(command[0]);
        direct.args(&command[1..]);
        self.apply(&mut direct);
        direct
            .env("LD_LIBRARY_PATH", self.shim_dir())
            .env("VGPU_CONFIG", config)
            .env("VGPU_DRIVER_DIR", self.bare_driver_dir());
        direct
    }

    /// A sim driver folder outside any container (for a "neighbour" process).
    pub fn bare_driver_dir(&self) -> PathBuf {
        let dir = self.dir.path().join("bare-driver");
        std::fs::create_dir_all(&dir).expect("create");
        for name in ["libcuda.so.1", "libnvidia-ml.so.1"] {
            let link = dir.join(name);
            if !link.exists() {
                std::os::unix::fs::symlink(artifact("libvgpu_sim.so"), link).expect("link");
            }
        }
        dir
    }
}

/// The PID written into `path` (a client's marker), waiting up to a minute for it.
pub fn wait_for_pid(path: &Path) -> i32 {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        if let Ok(text) = std::fs::read_to_string(path)
            && let Ok(pid) = text.trim().parse()
        {
            return pid;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("{} never appeared", path.display());
}

/// The CUDA shim's own stderr lines.
pub fn shim_notices(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|line| line.starts_with("vgpu-shim[cuda]"))
        .collect()
}

/// The host PID of the process that is `ns_pid` in its own PID namespace, among the
/// descendants of `ancestor` (a `vgpu run` this test started: its command runs in a new
/// PID namespace, so the PID it reports is not the one to signal from here).
pub fn host_pid_of(ancestor: u32, ns_pid: i32) -> Option<i32> {
    let proc_root = Path::new("/proc");
    let parent_of = |pid: i32| -> Option<i32> {
        let stat = std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")).ok()?;
        stat[stat.rfind(')')? + 1..]
            .split_ascii_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    let descends = |mut pid: i32| {
        while pid > 1 {
            if pid == ancestor as i32 {
                return true;
            }
            match parent_of(pid) {
                Some(parent) => pid = parent,
                None => return false,
            }
        }
        false
    };
    std::fs::read_dir(proc_root)
        .ok()?
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .find(|&pid| {
            vgpu_contract::process::ns_pids_in(proc_root, pid)
                .and_then(|levels| levels.last().copied())
                == Some(ns_pid)
                && descends(pid)
        })
}

/// The JSON object printed on the last line starting with `RESULT `.
pub fn result_json(output: &Output) -> serde_json::Value {
    let line = vgpu_test_support::result_line(output);
    serde_json::from_str(&line).unwrap_or_else(|err| panic!("bad RESULT json {line}: {err}"))
}

/// A script under tests/clients/.
pub fn client(name: &str) -> String {
    repo_root()
        .join("tests/clients")
        .join(name)
        .display()
        .to_string()
}

/// One mebibyte, in bytes (the unit of quotas and client arguments).
pub const MIB: u64 = 1 << 20;
/// One gibibyte, in bytes.
pub const GIB: u64 = 1 << 30;

/// The `steps` of a client's `RESULT` (each with `used_mib` and `driver_mib`).
pub fn steps(result: &serde_json::Value) -> Vec<serde_json::Value> {
    result["steps"].as_array().cloned().unwrap_or_default()
}

/// A figure of a client's `RESULT`; panics on anything else.
pub fn mib(value: &serde_json::Value) -> f64 {
    value
        .as_f64()
        .unwrap_or_else(|| panic!("not a figure: {value}"))
}

/// Panics unless the driver's own figure for the process (`driver_mib`) stayed within
/// `quota_mib` at every step of `result`.
pub fn driver_within_quota(result: &serde_json::Value, quota_mib: f64) {
    for step in steps(result) {
        assert!(
            mib(&step["driver_mib"]) <= quota_mib,
            "the driver held more than the quota: {step}"
        );
    }
}
