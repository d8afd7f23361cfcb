//! The compatibility matrix on CI: `tests/compat/run.sh --simulate` (the very script the
//! GPU machine runs) over the simulated driver, for the clients that need no GPU
//! (cuda-bindings, nvidia-ml-py), asserting every cell; its verdict unit tests; and the
//! export check of the built shims against every driver export list in `symbols/`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use vgpu_test_support::repo_root;
use vgpu_test_support::{Need, require};
use vgpu_tests::{SimHost, artifact};

/// `tests/compat/run.sh PREFIX OUT --simulate ARGS...` with the host's sim env.
fn run_matrix(host: &SimHost, out: &Path, args: &[&str]) -> (Output, serde_json::Value) {
    let prefix = host.install();
    let mut command = Command::new(repo_root().join("tests/compat/run.sh"));
    command.arg(&prefix).arg(out).arg("--simulate").args(args);
    let output = host
        .apply(&mut command)
        .output()
        .expect("run tests/compat/run.sh");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "run.sh failed\nstdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let json = std::fs::read_to_string(out.join("compat.json")).expect("compat.json written");
    (
        output,
        serde_json::from_str(&json).expect("compat.json is JSON"),
    )
}

fn row<'a>(report: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    report["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .find(|r| r["row"] == name)
        .unwrap_or_else(|| panic!("no row {name}: {report}"))
}

fn status(row: &serde_json::Value, column: &str) -> String {
    row["cells"][column]["status"]
        .as_str()
        .unwrap_or_else(|| panic!("no {column} cell: {row}"))
        .to_string()
}

fn note(row: &serde_json::Value, column: &str) -> String {
    row["cells"][column]["note"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn sim_matrix_passes_every_cell_a_gpu_free_client_can_judge() {
    require!(Need::Python(&["cuda.bindings.driver", "pynvml"]));
    let host = SimHost::new(1);
    let out = host.dir.path().join("out");
    // A runtime that cannot load comes first: it must fail alone, with its cause.
    let (output, report) = run_matrix(
        &host,
        &out,
        &[
            "--measure",
            "1.5",
            "--rows",
            "cudart:/nonexistent/libcudart.so.12",
            "cuda-bindings",
            "nvidia-ml-py",
        ],
    );

    let broken = row(&report, "cudart libcudart.so.12");
    for column in ["quota", "oom", "limit", "smi"] {
        assert_eq!(status(broken, column), "FAIL", "{broken}");
        assert!(
            note(broken, column).contains("/nonexistent/libcudart.so.12"),
            "the cause is named: {broken}"
        );
    }

    let bindings = row(&report, "cuda-bindings");
    for column in ["quota", "oom", "limit", "smi"] {
        assert_eq!(
            status(bindings, column),
            "PASS",
            "{column}: {}",
            note(bindings, column)
        );
    }
    assert_eq!(bindings["shim"]["quota"]["total"], 4u64 << 30);
    let memory = &bindings["shim"]["memory"];
    assert_eq!(
        memory["steps"]
            .as_array()
            .expect("steps")
            .last()
            .expect("a refusal"),
        "OOM: CUDA_ERROR_OUT_OF_MEMORY"
    );
    assert!(
        memory["held_bytes"].as_u64().expect("held") <= 4 << 30,
        "{memory}"
    );
    assert_eq!(memory["again"], "OOM: CUDA_ERROR_OUT_OF_MEMORY");
    assert_eq!(memory["realloc"], "ok", "freed memory comes back: {memory}");
    let outside = bindings["outside_mib"]
        .as_u64()
        .expect("the card's own count was read while the row held its peak");
    assert!(
        (3 * 1024..=4096).contains(&outside),
        "outside view {outside} MiB"
    );
    let ratio = bindings["shim"]["launch"]["rate"].as_f64().expect("rate")
        / bindings["bare"]["launch"]["rate"]
            .as_f64()
            .expect("bare rate");
    assert!(
        (0.35..=0.65).contains(&ratio),
        "--cores 50 holds on the simulated kernels: {ratio}"
    );
    assert!(
        bindings["shim"]["smi"]["stdout"]
            .as_str()
            .expect("smi")
            .starts_with("4096, "),
        "{bindings}"
    );

    let nvml = row(&report, "nvidia-ml-py");
    assert_eq!(status(nvml, "quota"), "PASS", "{nvml}");
    assert_eq!(status(nvml, "smi"), "PASS", "{nvml}");
    assert_eq!(
        (status(nvml, "oom"), note(nvml, "oom")),
        ("n/a".to_string(), "NVML does not allocate".to_string())
    );
    assert_eq!(
        (status(nvml, "limit"), note(nvml, "limit")),
        (
            "n/a".to_string(),
            "NVML does not launch kernels".to_string()
        )
    );

    let markdown = std::fs::read_to_string(out.join("compat.md")).expect("compat.md written");
    assert!(markdown.contains("| runtime / framework | versions | quota reported | OOM enforced | limit held | nvidia-smi virtual |"), "{markdown}");
    assert!(
        markdown
            .lines()
            .any(|l| l.starts_with("| cuda-bindings |")
                && l.ends_with("| PASS | PASS | PASS | PASS |")),
        "{markdown}"
    );
    assert!(
        markdown
            .contains("| cudart libcudart.so.12 |  | FAIL [1] | FAIL [1] | FAIL [1] | FAIL [1] |"),
        "{markdown}"
    );
    assert!(
        markdown.contains("[1] cudart libcudart.so.12: initialization: OSError"),
        "{markdown}"
    );
    assert!(
        String::from_utf8_lossy(&output.stdout)
            .contains("row cuda-bindings: quota=PASS oom=PASS limit=PASS smi=PASS")
    );
    for raw in [
        "cuda-bindings.shim.txt",
        "cuda-bindings.bare.txt",
        "nvidia-ml-py.shim.txt",
    ] {
        assert!(out.join("compat").join(raw).exists(), "raw output {raw}");
    }
}

#[test]
fn a_row_past_its_timeout_is_cut_keeps_its_results_and_the_next_row_runs() {
    require!(Need::Python(&["cuda.bindings.driver", "pynvml"]));
    let host = SimHost::new(1);
    let out = host.dir.path().join("out");
    let started = Instant::now();
    // A 30 s kernel loop under a 5 s row timeout (and a 3 s bare one).
    let (_, report) = run_matrix(
        &host,
        &out,
        &[
            "--measure",
            "30",
            "--row-timeout",
            "5",
            "--bare-timeout",
            "3",
            "--rows",
            "cuda-bindings",
            "nvidia-ml-py",
        ],
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the timeouts held: {:?}",
        started.elapsed()
    );
    let bindings = row(&report, "cuda-bindings");
    assert_eq!(bindings["shim_run"], "timeout after 5 s", "{bindings}");
    assert_eq!(bindings["bare_run"], "timeout after 3 s", "{bindings}");
    assert_eq!(
        status(bindings, "quota"),
        "PASS",
        "what ran before the cut is kept: {bindings}"
    );
    assert_eq!(status(bindings, "oom"), "PASS", "{bindings}");
    assert_eq!(status(bindings, "limit"), "FAIL");
    assert!(
        note(bindings, "limit").contains("timeout after 5 s"),
        "{}",
        note(bindings, "limit")
    );
    assert_eq!(status(row(&report, "nvidia-ml-py"), "quota"), "PASS");
}

#[test]
fn matrix_verdicts_unit_tests() {
    require!(Need::program("python3", "apt-get install python3"));
    let output = Command::new("python3")
        .args(["-m", "unittest", "discover", "-s"])
        .arg(repo_root().join("tests/compat"))
        .args(["-p", "test_*.py"])
        .output()
        .expect("run python3");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("OK"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The driver export lists in symbols/ for one library (`libcuda.so.` or `libnvidia-ml.so.`).
fn export_lists(prefix: &str) -> Vec<PathBuf> {
    let mut lists: Vec<PathBuf> = std::fs::read_dir(repo_root().join("symbols"))
        .expect("symbols/")
        .map(|entry| entry.expect("entry").path())
        .filter(|path| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix) && n.ends_with(".txt"))
        })
        .collect();
    lists.sort();
    lists
}

#[test]
fn shims_pass_the_export_check_against_every_driver_list() {
    let checker = artifact("vgpu-ldconfig");
    for (prefix, shim) in [
        ("libcuda.so.", "libcuda_shim.so"),
        ("libnvidia-ml.so.", "libnvml_shim.so"),
    ] {
        let lists = export_lists(prefix);
        let names: Vec<_> = lists
            .iter()
            .filter_map(|p| p.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .collect();
        assert!(
            names.iter().any(|n| n.contains(".535.")) && names.iter().any(|n| n.contains(".580.")),
            "535 and 580 lists: {names:?}"
        );
        for list in &lists {
            let output = Command::new(&checker)
                .args(["check", "--real-list"])
                .arg(list)
                .arg("--shim")
                .arg(artifact(shim))
                .output()
                .expect("run vgpu-ldconfig");
            assert_eq!(
                output.status.code(),
                Some(0),
                "{} vs {shim}:\n{}{}",
                list.display(),
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }
    // And the check can fail: the NVML shim lacks every CUDA name.
    let cuda_list = &export_lists("libcuda.so.")[0];
    let output = Command::new(&checker)
        .args(["check", "--real-list"])
        .arg(cuda_list)
        .arg("--shim")
        .arg(artifact("libnvml_shim.so"))
        .output()
        .expect("run");
    assert_eq!(output.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .any(|l| l.trim() == "cuInit")
    );
}
