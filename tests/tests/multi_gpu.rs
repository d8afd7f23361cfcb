//! Several GPUs, on the simulated driver with four cards: a container given two cards
//! with different quotas sees exactly those, renumbered 0 and 1 in config order, each
//! with its own quota; a container given one card cannot see or use the others; and two
//! cards' usage is counted apart. (The same on real H200s is issue 8's run, which needs
//! a multi-GPU machine.)

use vgpu_test_support::{Need, require};
use vgpu_tests::{GIB, SimHost, client, result_json};

/// Host card `index`'s UUID without dashes (as cuDeviceGetUuid's 16 bytes in hex): the
/// sim numbers its cards' UUIDs from 1.
fn sim_uuid_hex(index: usize) -> String {
    format!("51d00000000040008000{:012x}", index + 1)
}

fn sim_uuid(index: usize) -> String {
    let hex = sim_uuid_hex(index);
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

#[test]
fn two_cards_with_their_own_quotas_renumbered_in_config_order() {
    require!(Need::Python(&["cuda.bindings.driver", "pynvml"]));
    let host = SimHost::new(4);
    let first = format!("{}:memory=1GiB", sim_uuid(2));
    let script = client("cuda_check.py");
    let output = host.run(
        &["--device", &first, "--device", "0:memory=2GiB"],
        &["python3", &script, "devices", "1536"],
    );
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let seen = result_json(&output);
    assert_eq!(seen["count"], 2, "{seen}");
    let devices = seen["devices"].as_array().expect("devices");
    assert_eq!(
        devices[0]["uuid"],
        sim_uuid_hex(2),
        "ordinal 0 is the first config entry (host card 2): {seen}"
    );
    assert_eq!(
        devices[1]["uuid"],
        sim_uuid_hex(0),
        "ordinal 1 is host card 0: {seen}"
    );
    assert_eq!(devices[0]["total_mem"], GIB);
    assert_eq!(devices[0]["mem_info_total"], GIB);
    assert_eq!(devices[1]["total_mem"], 2 * GIB);
    assert_eq!(devices[1]["mem_info_total"], 2 * GIB);
    assert_eq!(
        devices[0]["alloc"], "CUDA_ERROR_OUT_OF_MEMORY",
        "1.5 GiB does not fit a 1 GiB quota: {seen}"
    );
    assert_eq!(
        devices[1]["alloc"], "CUDA_SUCCESS",
        "but fits the 2 GiB one: {seen}"
    );
    assert_eq!(seen["beyond"], "CUDA_ERROR_INVALID_DEVICE");

    let nvml = host.run(
        &["--device", &first, "--device", "0:memory=2GiB"],
        &["python3", &client("nvml_check.py")],
    );
    let nvml = result_json(&nvml);
    assert_eq!(nvml["count"], 2, "{nvml}");
    assert_eq!(nvml["devices"][0]["uuid"], sim_uuid(2).as_str());
    assert_eq!(nvml["devices"][0]["total"], GIB);
    assert_eq!(nvml["devices"][1]["uuid"], sim_uuid(0).as_str());
    assert_eq!(nvml["devices"][1]["total"], 2 * GIB);
    assert_eq!(
        nvml["devices"][1]["index"], 1,
        "NVML indices renumbered too: {nvml}"
    );
}

#[test]
fn a_container_given_card_one_cannot_see_or_use_card_zero() {
    require!(Need::Python(&["cuda.bindings.driver", "pynvml"]));
    let host = SimHost::new(2);
    let script = client("cuda_check.py");
    let output = host.run(
        &["--device", "1", "--memory", "1GiB"],
        &["python3", &script, "devices", "256"],
    );
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let seen = result_json(&output);
    assert_eq!(seen["count"], 1, "{seen}");
    assert_eq!(seen["devices"][0]["uuid"], sim_uuid_hex(1));
    assert_eq!(
        seen["beyond"], "CUDA_ERROR_INVALID_DEVICE",
        "ordinal 1 does not exist in the container"
    );
    let hidden = sim_uuid(0);
    let mut command = std::process::Command::new(vgpu_tests::vgpu());
    command.args([
        "run",
        "--simulate",
        "--device",
        "1",
        "--memory",
        "1GiB",
        "--",
        "python3",
        &client("nvml_check.py"),
    ]);
    host.apply(&mut command).env("HIDDEN_UUIDS", &hidden);
    let nvml = result_json(&command.output().expect("run"));
    assert_eq!(nvml["count"], 1, "{nvml}");
    assert!(
        nvml["hidden"][&hidden]
            .as_str()
            .is_some_and(|e| e.contains("Not Found")),
        "{nvml}"
    );
}
