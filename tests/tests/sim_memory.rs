//! Issue 13, "memory quota with no hole", on the simulated driver: through the real
//! shims under `vgpu run --simulate`, with NVIDIA's cuda-bindings as the client
//! (`tests/clients/memory_check.py`). Each step compares what `cuMemGetInfo` says the
//! container holds with the driver's own figure for the process (the sim's NVML process
//! list), which must stay within the quota.

use std::os::unix::fs::{FileExt, FileTypeExt};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use serde_json::Value;
use vgpu_contract::snapshot::RegionSnapshot;
use vgpu_test_support::{Need, require};
use vgpu_tests::{SimHost, client, mib, result_json, shim_notices, steps};

const QUOTA_MIB: f64 = 1024.0;

fn memory_check(host: &SimHost, vgpu_args: &[&str], args: &[&str]) -> Value {
    host.python_result(vgpu_args, "memory_check.py", args)
}

/// The results of the steps named `prefix N`.
fn results(result: &Value, prefix: &str) -> Vec<String> {
    steps(result)
        .iter()
        .filter(|s| s["step"].as_str().is_some_and(|n| n.starts_with(prefix)))
        .map(|s| s["result"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// The driver's figure for the process never passed the quota, at any step.
fn driver_within_quota(result: &Value) {
    vgpu_tests::driver_within_quota(result, QUOTA_MIB);
}

#[test]
fn vmm_memory_is_counted_until_its_last_unmap_and_release() {
    require!(Need::Python(&["cuda.bindings.driver", "pynvml"]));
    let host = SimHost::new(1);
    let result = memory_check(&host, &["--memory", "1GiB"], &["vmm", "4", "300"]);
    // 64 MiB of context, then 3 x 300 MiB released while mapped: the fourth is refused.
    assert_eq!(
        results(&result, "create"),
        [
            "CUDA_SUCCESS",
            "CUDA_SUCCESS",
            "CUDA_SUCCESS",
            "CUDA_ERROR_OUT_OF_MEMORY"
        ],
        "{result}"
    );
    driver_within_quota(&result);
    let retained = &result["after_unmap_retained"];
    assert_eq!(
        mib(&retained["used_mib"]),
        964.0,
        "unmapped but retained: held {result}"
    );
    assert_eq!(mib(&retained["driver_mib"]), 964.0);
    assert_eq!(mib(&result["after_release"]["used_mib"]), 664.0, "{result}");
    assert_eq!(mib(&result["after_all"]["used_mib"]), 64.0, "{result}");
    assert_eq!(mib(&result["after_all"]["driver_mib"]), 64.0);
}

#[test]
fn pools_are_counted_by_what_they_keep_and_trimmed_before_a_refusal() {
    require!(Need::Python(&["cuda.bindings.driver", "pynvml"]));
    let host = SimHost::new(1);
    // Four pools that keep everything (release threshold UINT64_MAX), allocations held.
    let held = memory_check(&host, &["--memory", "1GiB"], &["pools", "4", "300"]);
    assert_eq!(
        results(&held, "alloc"),
        [
            "CUDA_SUCCESS",
            "CUDA_SUCCESS",
            "CUDA_SUCCESS",
            "CUDA_ERROR_OUT_OF_MEMORY"
        ],
        "{held}"
    );
    driver_within_quota(&held);
    // Freed and synchronised, the pools keep 900 MiB: still counted.
    assert_eq!(mib(&held["kept"]["used_mib"]), 964.0, "{held}");
    assert_eq!(mib(&held["kept"]["driver_mib"]), 964.0);
    // 600 MiB + 1 of cuMemAlloc fits only once the pools give back what they keep:
    // they are trimmed instead of refusing.
    assert_eq!(held["after_trim"]["result"], "CUDA_SUCCESS", "{held}");
    assert!(
        mib(&held["after_trim"]["driver_mib"]) <= QUOTA_MIB,
        "{held}"
    );

    // The cycle of the issue: alloc 300 MiB from a keeping pool, free, sync, four times.
    // The fourth fits because the earlier pools are trimmed for it; the driver never
    // holds more than the quota.
    let cycle = memory_check(&host, &["--memory", "1GiB"], &["pool-cycle", "4", "300"]);
    assert_eq!(results(&cycle, "alloc"), ["CUDA_SUCCESS"; 4], "{cycle}");
    driver_within_quota(&cycle);
    for step in steps(&cycle) {
        let (used, driver) = (mib(&step["used_mib"]), mib(&step["driver_mib"]));
        assert!(
            used >= driver && used - driver <= 2.0,
            "what the container counts is what the driver holds (cuMemAlloc in 2 MiB pages): {step}"
        );
    }
}

/// `vgpu run --simulate VGPU_ARGS... -- python3 tests/clients/SCRIPT ARGS...`, not run yet.
fn vgpu_python(host: &SimHost, vgpu_args: &[&str], script: &str, args: &[&str]) -> Command {
    let mut command = Command::new(vgpu_tests::vgpu());
    command
        .args(["run", "--simulate"])
        .args(vgpu_args)
        .args(["--", "python3", &client(script)])
        .args(args);
    host.apply(&mut command);
    command
}

/// A process of the container at `state` holding `mib` under a 1 GiB quota (until
/// killed), and its host PID.
fn holder(host: &SimHost, state: &Path, mib: &str, extra: &[&str]) -> (Child, i32) {
    let marker = state.with_extension(format!("{mib}.pid"));
    let _ = std::fs::remove_file(&marker);
    let mut args = vec![
        "--memory",
        "1GiB",
        "--state-dir",
        state.to_str().expect("utf-8"),
    ];
    args.extend_from_slice(extra);
    let child = vgpu_python(
        host,
        &args,
        "cuda_check.py",
        &["hold", mib, "120", marker.to_str().expect("utf-8")],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .expect("spawn the holder");
    let ns_pid = vgpu_tests::wait_for_pid(&marker);
    let pid = if extra.contains(&"--host-pid") {
        ns_pid
    } else {
        vgpu_tests::host_pid_of(child.id(), ns_pid).expect("the holder's host PID")
    };
    (child, pid)
}

fn kill(mut child: Child, pid: i32) {
    // SAFETY: signalling a process this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let _ = child.wait();
}

fn mkfifo(path: &Path) {
    let name = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: mkfifo on a NUL-terminated path of the test's own folder.
    assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
}

#[test]
fn driver_loaded_memory_is_reconciled_inside_a_pid_namespace() {
    require!(Need::Python(&["cuda.bindings.driver", "pynvml"]));
    let host = SimHost::new(1);
    // The driver puts 96 MiB of module code on the card after the context: seen only
    // through NVML's figure for the process, which inside the namespace (driver 580)
    // lists it under its own namespace PID.
    let output = vgpu_python(
        &host,
        &["--memory", "1GiB"],
        "memory_check.py",
        &["module", "900", "800"],
    )
    .env("VGPU_SIM_MODULE_OVERHEAD", "96MiB")
    .output()
    .expect("run");
    let result = result_json(&output);
    assert_ne!(result["pid"], serde_json::json!(std::process::id()));
    assert_eq!(
        result["pid"], 2,
        "the command is PID 1's child in its own namespace"
    );
    assert_eq!(
        result["results"],
        serde_json::json!(["CUDA_ERROR_OUT_OF_MEMORY", "CUDA_SUCCESS"]),
        "64 MiB context + 96 MiB module + 900 MiB passes 1 GiB: {result}"
    );
    driver_within_quota(&result);
    let step = &steps(&result)[0];
    assert!(mib(&step["used_mib"]) >= mib(&step["driver_mib"]), "{step}");
}

#[test]
fn a_killed_process_is_free_at_the_next_cu_mem_get_info() {
    require!(Need::Python(&["cuda.bindings.driver", "pynvml"]));
    let host = SimHost::new(1);
    // Host PID namespace: the holder's own vgpu run reaps it; the next process's
    // cuMemGetInfo reclaims its slot before answering.
    let state = host.dir.path().join("shared");
    let (child, pid) = holder(&host, &state, "768", &["--host-pid"]);
    kill(child, pid);
    let state_arg = state.to_str().expect("utf-8");
    let after = host.python_result(
        &["--memory", "1GiB", "--host-pid", "--state-dir", state_arg],
        "memory_check.py",
        &["getinfo"],
    );
    assert_eq!(
        mib(&steps(&after)[0]["used_mib"]),
        64.0,
        "only our context: {after}"
    );
    // One PID namespace: the holder is killed from inside, next to the asking process.
    let script = format!(
        "python3 {hold} hold 768 120 {marker} & \
         while [ ! -s {marker} ]; do sleep 0.05; done; kill -9 $!; wait; \
         python3 {check} getinfo",
        hold = client("cuda_check.py"),
        check = client("memory_check.py"),
        marker = host.dir.path().join("inside.pid").display(),
    );
    let output = host.run(&["--memory", "1GiB"], &["bash", "-c", &script]);
    let inside = result_json(&output);
    assert_eq!(mib(&steps(&inside)[0]["used_mib"]), 64.0, "{inside}");
}

#[test]
fn a_damaged_region_under_a_live_holder_is_refused_not_zeroed() {
    require!(Need::Python(&["cuda.bindings.driver"]));
    let host = SimHost::new(1);
    let state = host.dir.path().join("container");
    let (child, pid) = holder(&host, &state, "768", &[]);
    let region = state.join("usage.region");
    // Damage the header's checksum while the holder runs.
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&region)
        .expect("open");
    file.write_all_at(&[0x5a; 8], 32).expect("pwrite");
    let state_arg = state.to_str().expect("utf-8");
    let output = vgpu_python(
        &host,
        &["--memory", "1GiB", "--host-pid", "--state-dir", state_arg],
        "cuda_check.py",
        &["sequence", "64"],
    )
    .output()
    .expect("run");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("live processes still hold it"),
        "vgpu run refuses to rebuild it: {stderr}"
    );
    assert!(!output.status.success());
    // A process started without vgpu run's check (its shim alone) refuses every
    // allocation, with one line.
    let script = client("cuda_check.py");
    let output = host
        .direct(
            &state.join("vgpu.yaml"),
            &["python3", &script, "sequence", "64"],
        )
        .output()
        .expect("run");
    let result = result_json(&output);
    assert_eq!(
        result["results"],
        serde_json::json!(["CUDA_ERROR_OUT_OF_MEMORY"]),
        "{result}"
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    let notices = shim_notices(&stderr);
    assert_eq!(notices.len(), 1, "{stderr}");
    assert!(
        notices[0].contains("every allocation of this process is refused"),
        "{}",
        notices[0]
    );
    // The holder's usage is untouched: its slot still says 768 MiB + its context.
    let bytes = std::fs::read(&region).expect("read");
    assert_ne!(
        bytes[4096..].iter().filter(|b| **b != 0).count(),
        0,
        "slots not zeroed"
    );
    // Once the holder is gone nobody holds the region, and it is rebuilt.
    kill(child, pid);
    let output = vgpu_python(
        &host,
        &["--memory", "1GiB", "--state-dir", state_arg],
        "cuda_check.py",
        &["sequence", "768"],
    )
    .output()
    .expect("run");
    assert!(String::from_utf8_lossy(&output.stderr).contains("was rebuilt"));
    assert_eq!(
        result_json(&output)["results"],
        serde_json::json!(["CUDA_SUCCESS"])
    );
}

#[test]
fn a_new_quota_for_a_running_container_keeps_its_usage() {
    require!(Need::Python(&["cuda.bindings.driver"]));
    let host = SimHost::new(1);
    let state = host.dir.path().join("container");
    let (child, pid) = holder(&host, &state, "768", &[]);
    let state_arg = state.to_str().expect("utf-8");
    // 2 GiB now: the holder's 832 MiB are still counted, so 1100 MiB more fit (with our
    // own 64 MiB context) and 300 MiB more do not.
    let output = vgpu_python(
        &host,
        &["--memory", "2GiB", "--state-dir", state_arg],
        "cuda_check.py",
        &["sequence", "1100", "300"],
    )
    .output()
    .expect("run");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("its usage is kept"), "{stderr}");
    assert_eq!(
        result_json(&output)["results"],
        serde_json::json!(["CUDA_SUCCESS", "CUDA_ERROR_OUT_OF_MEMORY"])
    );
    let snapshot = RegionSnapshot::read(&state.join("usage.region")).expect("valid region");
    assert_eq!(snapshot.devices()[0].memory_limit, 2 << 30);
    assert!(
        snapshot.device_used(0) >= 832 << 20,
        "the holder's usage is there"
    );
    kill(child, pid);
}

#[test]
fn config_input_never_hangs_and_says_what_is_wrong() {
    require!(Need::Python(&["cuda.bindings.driver"]));
    let host = SimHost::new(1);
    let fifo = host.dir.path().join("fifo.yaml");
    mkfifo(&fifo);
    let empty = host.dir.path().join("empty.yaml");
    std::fs::write(&empty, "").expect("write");
    for (config, needle) in [(&fifo, "not a regular file"), (&empty, "empty")] {
        let script = client("cuda_check.py");
        let output = host
            .direct(config, &["timeout", "20", "python3", &script, "init-raw"])
            .output()
            .expect("run");
        assert_ne!(output.status.code(), Some(124), "{} hung", config.display());
        let result = result_json(&output);
        assert_eq!(
            result["cuInit"], 100,
            "fail closed: CUDA_ERROR_NO_DEVICE: {result}"
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        let notices = shim_notices(&stderr);
        assert_eq!(notices.len(), 1, "{stderr}");
        assert!(
            notices[0].contains(needle) && notices[0].contains("fail-closed"),
            "{}",
            notices[0]
        );
    }
    let output = host.run(&["--memory", "309485009821345068724781057.0TiB"], &["true"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("does not fit in 64 bits"), "{stderr}");
}

#[test]
fn each_vgpu_run_is_its_own_pid_namespace_and_nvml_sees_only_it() {
    require!(Need::Python(&["cuda.bindings.driver", "pynvml"]));
    let host = SimHost::new(1);
    // A neighbour on the same card, outside any container.
    let (mut neighbour, neighbour_pid) = host.neighbour("256", "60");
    // The driver's own process list (the bare sim's NVML, no shim), from inside.
    let list = "import json, os, pynvml; pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0); \
         print('RESULT ' + json.dumps({'me': os.getpid(), 'pids': [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)], \
         'proc': sorted(int(d) for d in os.listdir('/proc') if d.isdigit())}))";
    // The marker is removed first: the second run must not find the first run's marker
    // and list before its holder has printed (the holder's RESULT line would be last).
    let script = format!(
        "rm -f {inner}; python3 {hold} hold 64 30 {inner} & while [ ! -s {inner} ]; do sleep 0.05; done; \
         LD_LIBRARY_PATH={bare} python3 -c \"{list}\"; kill $!",
        hold = client("cuda_check.py"),
        inner = host.dir.path().join("inner.pid").display(),
        bare = host.bare_driver_dir().display(),
    );
    let inside = result_json(&host.run(&["--memory", "1GiB"], &["bash", "-c", &script]));
    let inner_pid = std::fs::read_to_string(host.dir.path().join("inner.pid")).expect("inner");
    assert_eq!(
        inside["pids"],
        serde_json::json!([inner_pid.trim().parse::<i32>().expect("pid")]),
        "only the container's process, under its namespace PID: {inside}"
    );
    assert!(
        inside["proc"].as_array().expect("proc").len() < 10,
        "/proc is the namespace's: {inside}"
    );
    // With --host-pid the same listing sees the neighbour.
    let host_view = result_json(&host.run(
        &["--memory", "1GiB", "--host-pid"],
        &["bash", "-c", &script],
    ));
    assert!(
        host_view["pids"]
            .as_array()
            .expect("pids")
            .contains(&serde_json::json!(neighbour_pid)),
        "{host_view}"
    );
    let _ = neighbour.kill();
    let _ = neighbour.wait();
}

#[test]
fn the_nvml_shim_reads_a_fifo_region_without_hanging() {
    require!(Need::Python(&["pynvml"]));
    let host = SimHost::new(1);
    let dir = host.dir.path().join("nvml");
    std::fs::create_dir_all(&dir).expect("dir");
    let fifo = dir.join("usage.region");
    mkfifo(&fifo);
    let config = dir.join("vgpu.yaml");
    std::fs::write(&config, "devices:\n  - index: 0\n    memory_limit: 1Gi\n").expect("config");
    let output = host
        .direct(&config, &[
        "timeout",
        "20",
        "python3",
        "-c",
        "import json, pynvml; pynvml.nvmlInit(); m = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)); print('RESULT ' + json.dumps({'total': m.total, 'used': m.used}))",
    ])
        .output()
        .expect("run");
    assert_ne!(output.status.code(), Some(124), "hung on the FIFO");
    let result = result_json(&output);
    assert_eq!(result["total"], 1u64 << 30, "{result}");
    assert_eq!(result["used"], 0, "{result}");
    assert!(
        std::fs::metadata(&fifo)
            .expect("stat")
            .file_type()
            .is_fifo(),
        "left as it is"
    );
}
