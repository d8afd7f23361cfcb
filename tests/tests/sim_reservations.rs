//! Issue 24, "what the driver reserves on its own", on the simulated driver: through the
//! real shims under `vgpu run --simulate --memory 1GiB`, with NVIDIA's cuda-bindings as
//! the client (`tests/clients/reserve_check.py`). The sim reserves what the H200 showed
//! (BENCHMARKS.md): module static data (PTX `.global`, a cubin's global sections) at the
//! load, a library's at its first use, the stack for every resident thread, the heap at
//! the next launch, local memory past the stack at a kernel's launch, and (a stand-in
//! for what nobody can price) the device runtime's pending launches; each path must be
//! refused at its call, or held, with the driver's own figure for the process never
//! past the quota.

use serde_json::Value;
use vgpu_test_support::{Need, require};
use vgpu_tests::{SimHost, mib, steps};

const QUOTA_MIB: f64 = 1024.0;

/// `reserve_check.py ARGS...` under a 1 GiB quota, with extra environment.
fn reserve_check(host: &SimHost, env: &[(&str, &str)], args: &[&str]) -> Value {
    let script = vgpu_tests::client("reserve_check.py");
    let mut command = std::process::Command::new(vgpu_tests::vgpu());
    command
        .args([
            "run",
            "--simulate",
            "--memory",
            "1GiB",
            "--",
            "python3",
            &script,
        ])
        .args(args);
    host.apply(&mut command);
    for (key, value) in env {
        command.env(key, value);
    }
    let output = command.output().expect("spawn vgpu run");
    assert!(
        output.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    vgpu_tests::result_json(&output)
}

/// The driver's figure for the process never passed the quota, at any step.
fn driver_within_quota(result: &Value) {
    vgpu_tests::driver_within_quota(result, QUOTA_MIB);
}

/// The step named `name`.
fn step(result: &Value, name: &str) -> Value {
    steps(result)
        .into_iter()
        .find(|s| s["step"] == name)
        .unwrap_or_else(|| panic!("no step {name}: {result}"))
}

fn refused_load(result: &Value) {
    assert_eq!(result["load"], "CUDA_ERROR_OUT_OF_MEMORY", "{result}");
    driver_within_quota(result);
}

#[test]
fn ptx_global_data_past_the_quota_is_refused_at_cu_module_load_data() {
    require!(Need::Python(&["cuda.bindings.driver", "pynvml"]));
    let host = SimHost::new(1);
    // Lazy (the default): the data would only arrive at the first function.
    refused_load(&reserve_check(
        &host,
        &[],
        &["module", "data", "gen-ptx:1536"],
    ));
    // Eager: it would arrive with the load.
    let eager = [("CUDA_MODULE_LOADING", "EAGER")];
    refused_load(&reserve_check(
        &host,
        &eager,
        &["module", "data", "gen-ptx:1536"],
    ));
}

#[test]
fn a_cubin_global_section_past_the_quota_is_refused_at_cu_module_load() {
    require!(Need::Python(&["cuda.bindings.driver", "pynvml"]));
    let host = SimHost::new(1);
    let eager = [("CUDA_MODULE_LOADING", "EAGER")];
    refused_load(&reserve_check(
        &host,
        &eager,
        &["module", "file", "gen-cubin:1536"],
    ));
}

#[test]
fn a_fatbin_is_priced_from_its_entries_at_cu_module_load_fat_binary() {
    require!(Need::Python(&["cuda.bindings.driver", "pynvml"]));
    let host = SimHost::new(1);
    refused_load(&reserve_check(
        &host,
        &[],
        &["module", "fatbin", "gen-fatbin:1536"],
    ));
}

#[test]
fn a_library_past_the_quota_is_refused_at_cu_library_load_data() {
    require!(Need::Python(&["cuda.bindings.driver", "pynvml"]));
    let host = SimHost::new(1);
    // Lazy: the sim loads it into the context at cuKernelGetFunction.
    refused_load(&reserve_check(
        &host,
        &[],
        &["module", "library", "gen-ptx:1536"],
    ));
}

#[test]
fn lazily_loaded_static_data_that_fits_is_counted_from_the_load_until_the_unload() {
    require!(Need::Python(&["cuda.bindings.driver", "pynvml"]));
    let host = SimHost::new(1);
    // A library (lazy, as on the H200: its data arrives at cuKernelGetFunction).
    let result = reserve_check(
        &host,
        &[],
        &["module", "library", "gen-ptx:300", "touch", "700"],
    );
    assert_eq!(result["load"], "CUDA_SUCCESS", "{result}");
    assert_eq!(result["launch"], "CUDA_SUCCESS", "{result}");
    assert_eq!(
        mib(&step(&result, "loaded")["driver_mib"]),
        64.0,
        "lazy: {result}"
    );
    // 64 MiB of context and 300 of static data, counted at the load though the driver
    // takes them at the first function.
    assert_eq!(mib(&step(&result, "loaded")["used_mib"]), 364.0, "{result}");
    assert_eq!(
        mib(&step(&result, "function")["driver_mib"]),
        364.0,
        "{result}"
    );
    assert_eq!(
        result["alloc"], "CUDA_ERROR_OUT_OF_MEMORY",
        "64 + 300 + 700 MiB pass 1 GiB: {result}"
    );
    assert_eq!(
        mib(&step(&result, "unloaded")["used_mib"]),
        64.0,
        "{result}"
    );
    driver_within_quota(&result);
}

#[test]
fn a_stack_backed_for_every_resident_thread_past_the_quota_is_refused() {
    require!(Need::Python(&["cuda.bindings.driver", "pynvml"]));
    let host = SimHost::new(1);
    // 32 KiB × 132 SMs × 2048 threads is 8.25 GiB.
    let result = reserve_check(&host, &[], &["limit", "stack", "32768"]);
    assert_eq!(result["set"], "CUDA_ERROR_OUT_OF_MEMORY", "{result}");
    assert_eq!(
        result["after"], 1024,
        "the limit is left as it was: {result}"
    );
    driver_within_quota(&result);
    // 2 KiB (264 MiB more) fits and is counted.
    let fits = reserve_check(&host, &[], &["limit", "stack", "2048"]);
    assert_eq!(fits["set"], "CUDA_SUCCESS", "{fits}");
    assert_eq!(mib(&step(&fits, "set")["used_mib"]), 64.0 + 264.0, "{fits}");
    assert_eq!(
        mib(&step(&fits, "set")["driver_mib"]),
        64.0 + 264.0,
        "{fits}"
    );
}

#[test]
fn a_malloc_heap_past_the_quota_is_refused_at_cu_ctx_set_limit() {
    require!(Need::Python(&["cuda.bindings.driver", "pynvml"]));
    let host = SimHost::new(1);
    let huge = reserve_check(
        &host,
        &[],
        &["limit", "heap", "1610612736", "gen-ptx:0", "touch"],
    );
    assert_eq!(huge["set"], "CUDA_ERROR_OUT_OF_MEMORY", "{huge}");
    assert_eq!(huge["after"], 8 << 20, "{huge}");
    assert_eq!(huge["launch"], "CUDA_SUCCESS", "{huge}");
    driver_within_quota(&huge);
    // 256 MiB fits (248 beyond the default 8): counted at the call though the driver
    // takes it at the launch, so 720 MiB more is refused.
    let fits = reserve_check(
        &host,
        &[],
        &[
            "limit",
            "heap",
            "268435456",
            "gen-ptx:0",
            "touch",
            "0",
            "720",
        ],
    );
    assert_eq!(fits["set"], "CUDA_SUCCESS", "{fits}");
    assert_eq!(mib(&step(&fits, "set")["used_mib"]), 64.0 + 248.0, "{fits}");
    assert_eq!(fits["alloc"], "CUDA_ERROR_OUT_OF_MEMORY", "{fits}");
    driver_within_quota(&fits);
}

#[test]
fn a_printf_fifo_in_host_memory_is_not_refused() {
    require!(Need::Python(&["cuda.bindings.driver", "pynvml"]));
    let host = SimHost::new(1);
    // On the H200 (driver 580) a 1.5 GiB FIFO added no device memory, and the sim keeps
    // it in host memory too: the shim settles it from the driver's figure instead of
    // refusing what costs the card nothing.
    let result = reserve_check(
        &host,
        &[],
        &["limit", "printf", "1610612736", "gen-ptx:0", "touch"],
    );
    assert_eq!(result["set"], "CUDA_SUCCESS", "{result}");
    assert_eq!(result["after"], 1610612736u64, "{result}");
    assert_eq!(
        mib(&step(&result, "launched")["used_mib"]),
        64.0,
        "{result}"
    );
    driver_within_quota(&result);
}

#[test]
fn a_limit_the_shim_cannot_price_is_settled_right_after_the_call_and_set_back() {
    require!(Need::Python(&["cuda.bindings.driver", "pynvml"]));
    let host = SimHost::new(1);
    // The device runtime's pending launches: priced by nobody before the call; the
    // sim takes 2 KiB each beyond 2048, so a million pass 1 GiB.
    let result = reserve_check(&host, &[], &["limit", "pending-launches", "1000000"]);
    assert_eq!(result["set"], "CUDA_ERROR_OUT_OF_MEMORY", "{result}");
    assert_eq!(result["after"], 2048, "set back: {result}");
    driver_within_quota(&result);
    // 100000 (about 191 MiB) fits, and is counted right after the call.
    let fits = reserve_check(&host, &[], &["limit", "pending-launches", "100000"]);
    assert_eq!(fits["set"], "CUDA_SUCCESS", "{fits}");
    let set = step(&fits, "set");
    assert!(mib(&set["used_mib"]) >= mib(&set["driver_mib"]), "{fits}");
    assert!(mib(&set["driver_mib"]) > 250.0, "{fits}");
}

#[test]
fn a_kernel_whose_local_memory_passes_the_stack_is_backed_and_counted_before_its_launch() {
    require!(Need::Python(&["cuda.bindings.driver", "pynvml"]));
    let host = SimHost::new(1);
    // 16 KiB of local memory per thread: its first launch would grow the local memory
    // to 15 KiB more for 270336 threads (3960 MiB), where no call is hooked; the shim
    // raises the stack at cuModuleGetFunction instead, which does not fit.
    let result = reserve_check(
        &host,
        &[],
        &["module", "data", "gen-ptx:0:big_local16k", "big_local16k"],
    );
    assert_eq!(result["load"], "CUDA_SUCCESS", "{result}");
    assert_eq!(result["function"], "CUDA_ERROR_OUT_OF_MEMORY", "{result}");
    driver_within_quota(&result);
    // 2 KiB fits (264 MiB more), counted from the first function on.
    let fits = reserve_check(
        &host,
        &[],
        &["module", "data", "gen-ptx:0:small_local2k", "small_local2k"],
    );
    assert_eq!(fits["launch"], "CUDA_SUCCESS", "{fits}");
    assert_eq!(
        mib(&step(&fits, "function")["used_mib"]),
        64.0 + 264.0,
        "{fits}"
    );
    assert_eq!(
        mib(&step(&fits, "launched")["driver_mib"]),
        64.0 + 264.0,
        "{fits}"
    );
}
