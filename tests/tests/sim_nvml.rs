//! NVML virtualization through the real NVML shim over the simulated driver: NVIDIA's
//! nvidia-ml-py sees the container's one device, its quota, its usage and its own
//! processes only; `vgpu smi` renders the same.

use std::process::Command;

use vgpu_test_support::{Need, require};
use vgpu_tests::{GIB, SimHost, client, result_json};

/// The simulated cards' UUIDs, as the bare sim reports them.
fn sim_uuids(host: &SimHost) -> Vec<String> {
    let mut command = Command::new("python3");
    command.arg(client("nvml_check.py"));
    host.apply(&mut command);
    let output = command
        .env("LD_LIBRARY_PATH", host.bare_driver_dir())
        .output()
        .expect("run");
    let result = result_json(&output);
    result["devices"]
        .as_array()
        .expect("devices")
        .iter()
        .map(|d| d["uuid"].as_str().expect("uuid").to_string())
        .collect()
}

#[test]
fn pynvml_sees_the_quota_the_usage_and_only_its_own_processes() {
    require!(Need::Python(&["cuda.bindings.driver", "pynvml"]));
    let host = SimHost::new(4);
    let uuids = sim_uuids(&host);
    assert_eq!(uuids.len(), 4);

    // A neighbour outside the container uses the same simulated card 0.
    let (mut neighbour, neighbour_pid) = host.neighbour("512", "60");

    // In the container: a holder of 256 MiB, then pynvml and vgpu smi beside it.
    let holder_marker = host.dir.path().join("holder.pid");
    let script = format!(
        "python3 {cuda} hold 256 60 {marker} > {dir}/holder.out & \
         for i in $(seq 1 600); do [ -s {marker} ] && break; sleep 0.1; done; \
         HIDDEN_UUIDS='{hidden}' python3 {nvml}; {vgpu} smi > {dir}/smi.txt; kill %1",
        cuda = client("cuda_check.py"),
        nvml = client("nvml_check.py"),
        marker = holder_marker.display(),
        dir = host.dir.path().display(),
        hidden = uuids[1..].join(" "),
        vgpu = vgpu_tests::vgpu().display(),
    );
    let output = host.run(
        &["--memory", "1GiB", "--device", &uuids[0]],
        &["bash", "-c", &script],
    );
    let _ = neighbour.kill();
    let _ = neighbour.wait();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let seen = result_json(&output);
    let holder =
        std::fs::read_to_string(host.dir.path().join("holder.out")).expect("holder output");
    let holder: serde_json::Value = serde_json::from_str(
        holder
            .lines()
            .find_map(|l| l.strip_prefix("RESULT "))
            .expect("holder RESULT"),
    )
    .expect("json");
    let holder_pid = std::fs::read_to_string(&holder_marker)
        .expect("marker")
        .trim()
        .parse::<u64>()
        .expect("pid");

    assert_eq!(
        seen["count"], 1,
        "the sim has 4 GPUs, the config lists one: {seen}"
    );
    let device = &seen["devices"][0];
    assert_eq!(device["uuid"], uuids[0].as_str());
    assert_eq!(device["index"], 0);
    assert_eq!(device["total"], GIB, "total is the quota: {seen}");
    let holder_used = GIB - holder["mem_info"][0].as_u64().expect("free");
    assert_eq!(
        device["used"].as_u64(),
        Some(holder_used),
        "NVML's used is what libcuda-shim counted: {seen} vs {holder}"
    );
    assert!(holder_used >= 256 << 20);
    assert_eq!(device["free"].as_u64(), Some(GIB - holder_used));
    assert_eq!(
        device["pids"],
        serde_json::json!([holder_pid]),
        "own processes only (neighbour {neighbour_pid} hidden): {seen}"
    );
    for uuid in &uuids[1..] {
        assert!(
            seen["hidden"][uuid]
                .as_str()
                .is_some_and(|e| e.contains("Not Found")),
            "{uuid}: {seen}"
        );
    }

    let smi = std::fs::read_to_string(host.dir.path().join("smi.txt")).expect("vgpu smi output");
    assert!(
        smi.contains("/   1024MiB") || smi.contains("/  1024MiB") || smi.contains("/ 1024MiB"),
        "vgpu smi shows the quota:\n{smi}"
    );
    assert!(
        smi.contains(&holder_pid.to_string()),
        "vgpu smi lists the container's process:\n{smi}"
    );
    assert!(
        !smi.contains(&neighbour_pid.to_string()),
        "and not the neighbour's:\n{smi}"
    );
    assert_eq!(smi.matches("NVIDIA H200").count(), 1, "one GPU row:\n{smi}");
    assert!(!smi.contains("Function Not Found"));
}

#[test]
fn vgpu_smi_csv_reports_the_quota() {
    vgpu_test_support::require!(vgpu_test_support::Need::Namespaces);
    let host = SimHost::new(2);
    let vgpu = vgpu_tests::vgpu();
    let output = host.run(
        &["--memory", "1GiB", "--device", "1"],
        &[
            vgpu.to_str().expect("utf-8"),
            "smi",
            "--query-gpu=index,memory.total,memory.used",
            "--format=csv,noheader",
        ],
    );
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8_lossy(&output.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "one visible device: {text}");
    assert!(
        lines[0].starts_with("0, 1024 MiB, "),
        "renumbered from 0 with the quota as total: {text}"
    );
}
