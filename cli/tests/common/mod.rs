//! What the cli tests that run a workload under `vgpu run --simulate` share: the command,
//! with its host folder and the sim's state in the test's own folder and nothing of the
//! caller's config or log settings.

use std::path::Path;
use std::process::Command;

/// `vgpu run --simulate FLAGS -- PROGRAM`, its host folder and the sim's state under `dir`.
pub fn simulated_run(dir: &Path, flags: &[&str], program: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_vgpu"));
    command
        .args(["run", "--simulate"])
        .args(flags)
        .arg("--")
        .arg(program)
        .env("VGPU_HOST_DIR", dir.join("host"))
        .env("VGPU_SIM_STATE", dir.join("sim-state"))
        .env_remove("VGPU_CONFIG")
        .env_remove("VGPU_LOG");
    command
}

/// Fails the test with the run's status and output unless it succeeded.
// Each test binary compiles this module; not every one asks for every helper.
#[allow(dead_code)]
pub fn assert_succeeded(output: &std::process::Output) {
    assert!(
        output.status.success(),
        "{}\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The limiter's trace a run wrote (`VGPU_LIMITER_TRACE`): `name value` lines.
#[allow(dead_code)]
pub struct LimiterTrace {
    pub text: String,
}

#[allow(dead_code)]
impl LimiterTrace {
    /// Reads the trace at `path`; panics when the run wrote none.
    pub fn read(path: &Path) -> LimiterTrace {
        let text = std::fs::read_to_string(path).expect("the limiter's trace");
        LimiterTrace { text }
    }

    /// Counter `name`; panics when the trace has no such line.
    pub fn counter(&self, name: &str) -> u64 {
        self.text
            .lines()
            .find_map(|line| line.strip_prefix(&format!("{name} ")))
            .and_then(|value| value.trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no {name} in {}", self.text))
    }
}
