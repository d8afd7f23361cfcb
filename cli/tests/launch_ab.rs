//! The GPU suite's in-process launch measurement (`tests/gpu/limiter/streams.c
//! launch-ab`, judged as `launch-cost-in-process`) over the simulated driver: inside `vgpu
//! run` it must find the real driver beside the shim and time both, and without a shim
//! it must say that it measured nothing rather than compare the driver with itself; with
//! `AB_KERNELS=8` it takes eight kernels in turn, which no thread's tab covers. On
//! the H200 this is the figure issue 25's "a limited launch costs at most 1.05x a bare
//! one" is judged by, so the tool itself is tested here; the sim's figures say nothing
//! about a real launch's cost and are not judged.
//!
//! Needs root (`vgpu run`'s namespaces) and a C compiler; the shims and the sim driver
//! are built by `cargo test --workspace`.

use std::path::Path;
use std::process::Command;

mod common;

/// The JSON line `streams launch-ab` printed under `vgpu run --simulate` with `flags`.
fn launch_ab(dir: &Path, streams: &Path, flags: &[&str]) -> serde_json::Value {
    launch_ab_with(dir, streams, flags, &[])
}

/// [`launch_ab`] with `env` set for the run.
fn launch_ab_with(
    dir: &Path,
    streams: &Path,
    flags: &[&str],
    env: &[(&str, &Path)],
) -> serde_json::Value {
    let output = common::simulated_run(dir, flags, streams)
        .args(["launch-ab", "20000"])
        .envs(env.iter().copied())
        .output()
        .expect("run vgpu");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{flags:?}: {}\n{stdout}{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let line = stdout
        .lines()
        .rev()
        .find(|line| line.contains("\"launch-ab\""))
        .unwrap_or_else(|| panic!("{flags:?}: no launch-ab line in {stdout}"));
    serde_json::from_str(line).expect("a JSON line")
}

#[test]
fn launch_ab_times_the_shim_against_the_real_driver_in_one_process() {
    vgpu_test_support::require!(vgpu_test_support::Need::Root);
    let dir = tempfile::tempdir().expect("tempdir");
    let streams = vgpu_test_support::streams_workload(dir.path());
    for flags in [&["--memory", "1GiB", "--cores", "99"][..], &[][..]] {
        let found = launch_ab(dir.path(), &streams, flags);
        let (shim, real) = (found["shim"].as_str(), found["real"].as_str());
        // Both as their files resolve: the shim (libcuda.so.1 of an install, or the
        // build's libcuda_shim.so) and the simulated driver behind it.
        assert!(
            shim.is_some_and(|path| !path.ends_with("/libvgpu_sim.so")),
            "{flags:?}: {found}"
        );
        assert!(
            real.is_some_and(|path| path.ends_with("/libvgpu_sim.so")),
            "{flags:?}: the real driver is the sim, not the shim: {found}"
        );
        let (shim_ns, real_ns) = (found["shim_ns"].as_f64(), found["real_ns"].as_f64());
        assert!(
            shim_ns.is_some_and(|ns| ns > 0.0) && real_ns.is_some_and(|ns| ns > 0.0),
            "{flags:?}: {found}"
        );
        assert_eq!(found["blocks"], 40, "{found}");
    }
}

#[test]
fn launch_ab_with_eight_kernels_in_turn_leaves_the_threads_tab_out() {
    // A framework's launches change kernel every launch: `AB_KERNELS=8` times that case,
    // which a thread's tab (one kernel on one stream) cannot cover, so every launch the
    // shim times takes the per-launch fast path. With one kernel, most go on the tab.
    vgpu_test_support::require!(vgpu_test_support::Need::Root);
    let dir = tempfile::tempdir().expect("tempdir");
    let streams = vgpu_test_support::streams_workload(dir.path());
    for kernels in ["8", "1"] {
        let trace = dir.path().join(format!("kernels-{kernels}.trace"));
        let kernels_env = Path::new(kernels);
        let found = launch_ab_with(
            dir.path(),
            &streams,
            &["--memory", "1GiB", "--cores", "99"],
            &[("AB_KERNELS", kernels_env), ("VGPU_LIMITER_TRACE", &trace)],
        );
        assert_eq!(found["kernels"].to_string(), kernels, "{found}");
        let trace = common::LimiterTrace::read(&trace);
        let (launches, fast, tabbed) = (
            trace.counter("launches"),
            trace.counter("fast_path"),
            trace.counter("tabbed"),
        );
        let text = &trace.text;
        assert!(launches > 0 && fast * 10 >= launches * 9, "{text}");
        if kernels == "8" {
            assert_eq!(tabbed, 0, "eight kernels in turn went on a tab:\n{text}");
        } else {
            assert!(
                tabbed * 2 > launches,
                "one kernel stayed off the tab:\n{text}"
            );
        }
    }
}

#[test]
fn launch_ab_without_a_shim_says_it_measured_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let streams = vgpu_test_support::streams_workload(dir.path());
    // The sim driver alone, as the program's libcuda.so.1: one libcuda loaded.
    let sim = vgpu_test_support::built("libvgpu_sim.so")
        .expect("the sim driver (cargo test --workspace builds it)");
    let libs = dir.path().join("lib");
    std::fs::create_dir_all(&libs).expect("lib dir");
    std::os::unix::fs::symlink(&sim, libs.join("libcuda.so.1")).expect("link");
    let output = Command::new(&streams)
        .args(["launch-ab", "20000"])
        .env("LD_LIBRARY_PATH", &libs)
        .env("VGPU_SIM_STATE", dir.path().join("sim-state"))
        .output()
        .expect("run streams");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    let found: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON line");
    assert!(found["error"].as_str().is_some(), "{found}");
    assert!(found.get("ratio").is_none(), "{found}");
}
