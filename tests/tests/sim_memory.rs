//! Issue 13, "memory quota with no hole", on the simulated driver: through the real
//! shims under `vgpu run --simulate`, with NVIDIA's cuda-bindings as the client
//! (`tests/clients/memory_check.py`). Each step compares what `cuMemGetInfo` says the
//! container holds with the driver's own figure for the process (the sim's NVML process
//! list), which must stay within the quota.

use serde_json::Value;
use vgpu_tests::{SimHost, require_python};

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

fn steps(result: &Value) -> Vec<Value> {
    result["steps"].as_array().cloned().unwrap_or_default()
}

fn mib(value: &Value) -> f64 {
    value
        .as_f64()
        .unwrap_or_else(|| panic!("not a figure: {value}"))
}

/// The driver's figure for the process never passed the quota, at any step.
fn driver_within_quota(result: &Value) {
    for step in steps(result) {
        assert!(
            mib(&step["driver_mib"]) <= QUOTA_MIB,
            "the driver held more than the quota: {step}"
        );
    }
}

#[test]
fn vmm_memory_is_counted_until_its_last_unmap_and_release() {
    require_python(&["cuda.bindings.driver", "pynvml"]);
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
    require_python(&["cuda.bindings.driver", "pynvml"]);
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
