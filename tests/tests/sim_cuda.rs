//! Forwarding and the hard memory quota, through the real shims over the simulated
//! driver, with NVIDIA's cuda-bindings as the client, under `vgpu run --simulate`.

use std::process::{Command, Stdio};

use vgpu_contract::region::Region;
use vgpu_test_support::{Need, require};
use vgpu_tests::{GIB, MIB, SimHost, artifact, client, result_json, shim_notices};

fn cuda(host: &SimHost, vgpu_args: &[&str], mode_and_args: &[&str]) -> serde_json::Value {
    host.python_result(vgpu_args, "cuda_check.py", mode_and_args)
}

#[test]
fn cuda_bindings_forward_through_the_shim_with_no_quota() {
    require!(Need::Python(&["cuda.bindings.driver"]));
    let host = SimHost::new(2);
    let result = cuda(&host, &[], &["basic"]);
    assert_eq!(result["count"], 2, "{result}");
    assert_ne!(result["pointer"], 0);
    let total = result["mem_info"][1].as_u64().expect("total");
    assert_eq!(total, 80 * GIB, "no quota: the card's own memory");
    let free_during = result["mem_info"][0].as_u64().expect("free");
    let free_after = result["mem_info_after_free"][0].as_u64().expect("free");
    assert_eq!(
        free_after - free_during,
        64 * MIB,
        "the simulated card counts the allocation"
    );
}

#[test]
fn quota_refuses_what_would_pass_it_and_reports_it_as_total() {
    require!(Need::Python(&["cuda.bindings.driver"]));
    let host = SimHost::new(1);
    let result = cuda(
        &host,
        &["--memory", "1GiB"],
        &["sequence", "768", "512", "128"],
    );
    assert_eq!(result["total"], GIB, "{result}");
    let results: Vec<&str> = result["results"]
        .as_array()
        .expect("results")
        .iter()
        .filter_map(|r| r.as_str())
        .collect();
    assert_eq!(
        results[..2],
        ["CUDA_SUCCESS", "CUDA_ERROR_OUT_OF_MEMORY"],
        "{result}"
    );
    let free = result["mem_info"][0].as_u64().expect("free");
    assert!(
        free < GIB
            - 768 * MIB
            - if results[2] == "CUDA_SUCCESS" {
                128 * MIB
            } else {
                0
            }
            + 1,
        "free {free} reflects the allocations"
    );
}

#[test]
fn quota_holds_through_cu_get_proc_address_pointers() {
    require!(Need::Python(&["cuda.bindings.driver"]));
    let host = SimHost::new(1);
    let result = cuda(&host, &["--memory", "1GiB"], &["procaddress", "768", "512"]);
    assert_eq!(result["info_rc"], 0, "{result}");
    assert_eq!(result["total"], GIB, "{result}");
    assert_eq!(
        result["results"],
        serde_json::json!([0, 2]),
        "768 MiB fits, 512 MiB more is CUDA_ERROR_OUT_OF_MEMORY: {result}"
    );
    assert_eq!(
        result["procaddress_alloc"], result["exported_alloc"],
        "cuGetProcAddress hands out the shim's hook"
    );
}

#[test]
fn export_the_sim_lacks_returns_not_supported() {
    require!(Need::Python(&["cuda.bindings.driver"]));
    let host = SimHost::new(1);
    let result = cuda(&host, &[], &["missing"]);
    assert_eq!(result["rc"], 801, "CUDA_ERROR_NOT_SUPPORTED: {result}");
}

/// Spawns `vgpu run --state-dir DIR` (one container shared by several processes).
fn spawn_in(host: &SimHost, state: &std::path::Path, args: &[&str]) -> std::process::Child {
    let script = client("cuda_check.py");
    let mut command = Command::new(vgpu_tests::vgpu());
    command
        .args(["run", "--simulate", "--memory", "1GiB", "--state-dir"])
        .arg(state)
        .arg("--")
        .args(["python3", &script])
        .args(args);
    host.apply(&mut command)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn")
}

#[test]
fn two_processes_share_one_quota_and_a_killed_ones_usage_is_reclaimed() {
    require!(Need::Python(&["cuda.bindings.driver"]));
    let host = SimHost::new(1);
    let state = host.dir.path().join("container");
    let marker = host.dir.path().join("holder.pid");
    let mut holder = spawn_in(
        &host,
        &state,
        &["hold", "768", "60", marker.to_str().expect("utf-8")],
    );
    let holder_pid = vgpu_tests::host_pid_of(holder.id(), vgpu_tests::wait_for_pid(&marker))
        .expect("the holder's host PID");

    let second = spawn_in(&host, &state, &["sequence", "512", "128"])
        .wait_with_output()
        .expect("second");
    let second = result_json(&second);
    assert_eq!(
        second["results"],
        serde_json::json!(["CUDA_ERROR_OUT_OF_MEMORY", "CUDA_SUCCESS"]),
        "{second}"
    );

    // SAFETY: signalling a child process we started.
    assert_eq!(unsafe { libc::kill(holder_pid, libc::SIGKILL) }, 0);
    let _ = holder.wait();
    let third = spawn_in(&host, &state, &["sequence", "768"])
        .wait_with_output()
        .expect("third");
    let third = result_json(&third);
    assert_eq!(
        third["results"],
        serde_json::json!(["CUDA_SUCCESS"]),
        "the killed holder's 768 MiB came back: {third}"
    );
}

#[test]
fn many_processes_and_threads_leave_exactly_zero_usage() {
    require!(Need::Python(&["cuda.bindings.driver"]));
    let host = SimHost::new(1);
    let state = host.dir.path().join("container");
    let children: Vec<_> = (0..8)
        .map(|seed| spawn_in(&host, &state, &["stress", "10", &seed.to_string()]))
        .collect();
    let mut allocations = 0;
    let mut refusals = 0;
    for child in children {
        let output = child.wait_with_output().expect("stress process");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let result = result_json(&output);
        allocations += result["ok"].as_u64().expect("ok");
        refusals += result["oom"].as_u64().expect("oom");
    }
    assert!(
        allocations > 1000,
        "the stress really ran: {allocations} allocations"
    );
    assert!(
        refusals > 0,
        "and really pressed on the 1 GiB quota: {refusals} refusals"
    );
    let region = Region::open_existing(&state.join("usage.region")).expect("usage region");
    assert_eq!(
        region.device_used(0),
        0,
        "8 processes x 16 threads left usage behind"
    );
    assert!(
        region.processes().is_empty(),
        "every process gave its slot back"
    );
}

#[test]
fn a_missing_real_driver_is_one_line_and_not_initialized() {
    require!(Need::Python(&["cuda.bindings.driver"]));
    let dir = tempfile::tempdir().expect("tempdir");
    std::os::unix::fs::symlink(artifact("libcuda_shim.so"), dir.path().join("libcuda.so.1"))
        .expect("link");
    let output = Command::new("python3")
        .args([&client("cuda_check.py"), "init-raw"])
        .env("LD_LIBRARY_PATH", dir.path())
        .env("VGPU_DRIVER_DIR", "/nonexistent/driver")
        .env_remove("VGPU_CONFIG")
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let result = result_json(&output);
    assert_eq!(result["cuInit"], 3, "CUDA_ERROR_NOT_INITIALIZED: {result}");
    assert_eq!(result["cuDeviceGetCount"], 3, "{result}");
    let notices = shim_notices(&stderr);
    assert_eq!(notices.len(), 1, "exactly one line: {stderr}");
    assert!(
        notices[0].contains("/nonexistent/driver/libcuda.so.1"),
        "{}",
        notices[0]
    );
}

#[test]
fn a_broken_config_is_one_line_and_hides_every_gpu() {
    require!(Need::Python(&["cuda.bindings.driver"]));
    let host = SimHost::new(1);
    let output = with_config(
        &host,
        "devices:\n  - index: 0\n    memory_limt: 1GiB\n",
        &["basic"],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("cuInit failed: CUDA_ERROR_NO_DEVICE"),
        "{stderr}"
    );
    let notices = shim_notices(&stderr);
    assert_eq!(notices.len(), 1, "{stderr}");
    assert!(
        notices[0].contains("memory_limt") && notices[0].contains("fail-closed"),
        "{}",
        notices[0]
    );
}

/// Runs cuda_check.py MODE ARGS with the shim over the sim and `config` as VGPU_CONFIG.
fn with_config(host: &SimHost, config: &str, args: &[&str]) -> std::process::Output {
    let dir = host.dir.path().join("direct");
    std::fs::create_dir_all(&dir).expect("dir");
    let link = dir.join("libcuda.so.1");
    if !link.exists() {
        std::os::unix::fs::symlink(artifact("libcuda_shim.so"), &link).expect("link");
    }
    let config_path = dir.join("vgpu.yaml");
    std::fs::write(&config_path, config).expect("write config");
    let mut command = Command::new("python3");
    command.arg(client("cuda_check.py")).args(args);
    host.apply(&mut command);
    command
        .env("LD_LIBRARY_PATH", &dir)
        .env("VGPU_CONFIG", &config_path)
        .env("VGPU_DRIVER_DIR", host.bare_driver_dir())
        .output()
        .expect("run")
}

#[test]
fn an_unopenable_usage_region_still_enforces_the_quota_in_the_process() {
    require!(Need::Python(&["cuda.bindings.driver"]));
    let host = SimHost::new(1);
    let output = with_config(
        &host,
        "usage_region: /proc/no-such-dir/usage.region\ndevices:\n  - index: 0\n    memory_limit: 1GiB\n",
        &["sequence", "768", "512"],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    let result = result_json(&output);
    assert_eq!(
        result["results"],
        serde_json::json!(["CUDA_SUCCESS", "CUDA_ERROR_OUT_OF_MEMORY"]),
        "{result}\n{stderr}"
    );
    let notices = shim_notices(&stderr);
    assert_eq!(notices.len(), 1, "{stderr}");
    assert!(
        notices[0].contains("for this process alone"),
        "{}",
        notices[0]
    );
}

#[test]
fn a_config_device_missing_from_the_host_is_one_line_and_stays_hidden() {
    require!(Need::Python(&["cuda.bindings.driver"]));
    let host = SimHost::new(2);
    let output = with_config(
        &host,
        "devices:\n  - uuid: GPU-00000000-dead-beef-0000-000000000000\n  - index: 1\n    memory_limit: 1GiB\n",
        &["devices", "64"],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    let result = result_json(&output);
    assert_eq!(result["count"], 1, "only the device that exists: {result}");
    assert_eq!(result["devices"][0]["total_mem"], GIB, "{result}");
    let notices = shim_notices(&stderr);
    assert_eq!(notices.len(), 1, "{stderr}");
    assert!(
        notices[0].contains("GPU-00000000-dead-beef") && notices[0].contains("not on this host"),
        "{}",
        notices[0]
    );
}
