//! Runs `clients/check_sim.py` (NVIDIA's cuda-bindings and nvidia-ml-py against the sim)
//! with LD_LIBRARY_PATH at a sim driver folder made here. Needs python3 with those
//! modules (`python3 -m pip install 'cuda-bindings>=13,<14' nvidia-ml-py`): by
//! vgpu-test-support's policy a skip outside CI, a failure in CI.

mod common;

use std::process::Command;

#[test]
fn cuda_bindings_and_pynvml_against_the_sim() {
    vgpu_test_support::require!(vgpu_test_support::Need::Python(&[
        "cuda.bindings.driver",
        "pynvml"
    ]));
    let library = common::library_path();
    let folder = tempfile::tempdir().unwrap();
    for name in ["libcuda.so.1", "libnvidia-ml.so.1"] {
        std::os::unix::fs::symlink(&library, folder.path().join(name)).unwrap();
    }
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/check_sim.py");
    let output = Command::new("python3")
        .arg(&script)
        .env("LD_LIBRARY_PATH", folder.path())
        .env("VGPU_SIM_STATE", folder.path().join("state"))
        .env("VGPU_SIM_GPUS", "2")
        .env("VGPU_SIM_MEMORY", "8GiB")
        .env("VGPU_SIM_CONTEXT_OVERHEAD", "256MiB")
        .env_remove("VGPU_SIM_CONFIG")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "check_sim.py failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("check_sim: all checks passed"), "{stdout}");
    assert!(stdout.contains("nvml: used 1342177280"), "{stdout}");
}
