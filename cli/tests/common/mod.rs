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
