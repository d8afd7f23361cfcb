//! The GPU suite's limiter scripts (`tests/gpu/limiter/run_limiter.sh` and
//! `contention.sh`) over the simulated driver (`SIMULATE=1`), as CI can run them. The
//! H200 is lent 30 minutes a session, so a script or judge that breaks must break here
//! first: these tests judge the scripts' plumbing (every check the judges write is
//! there with a verdict, what cannot run here is skipped rather than failed, and no step
//! died without a result), not the sim's figures, which the limiter's own tests judge
//! (`libcuda-shim/tests/limiter.rs`). One rule of a judge's own, which the sim's card
//! cannot reach (its turns cost no work), is judged over made-up logs, and so is the
//! per-cycle math of the host-bound loops' rounds. Those rounds (part `torch`:
//! persistent processes served by `rounds.py`, coordinated by `interleave.py`) run here
//! with `standin.py` in PyTorch's place, healthy and with broken runs. So do the launch
//! cost's interleaved pairs (part `launch`: `streams launch-serve` processes coordinated
//! by `pairs.py`), healthy and with broken sides, and their median math over made-up
//! logs. `calls.sh`, which runs those parts in two device calls, is run here too.
//!
//! Needs root (`vgpu run`'s namespaces), a C compiler and python3.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use vgpu_test_support::{Need, repo_root, require};
use vgpu_tests::SimHost;

/// The checks `records.tsv` holds: name -> (verdict, figure).
fn records(out: &Path) -> BTreeMap<String, (String, String)> {
    let text = std::fs::read_to_string(out.join("records.tsv")).expect("records.tsv written");
    text.lines()
        .map(|line| {
            let (name, fragment) = line.split_once('\t').expect("NAME<TAB>JSON");
            let value: serde_json::Value =
                serde_json::from_str(&format!("{{{fragment}}}")).expect("a JSON fragment");
            let field = |key: &str| value[key].as_str().unwrap_or_default().to_string();
            (name.to_string(), (field("verdict"), field("figure")))
        })
        .collect()
}

/// Runs `script PREFIX OUT` with `env` over a sim host of its own; returns OUT's
/// records, or `None` where a prerequisite is missing (the test is skipped).
fn dry_run(script: &str, env: &[(&str, &str)]) -> Option<BTreeMap<String, (String, String)>> {
    dry_run_of(script, 1, env)
}

/// [`dry_run`] of a script that takes `builds` install folders before OUT (one sim
/// install, named each time).
fn dry_run_of(
    script: &str,
    builds: usize,
    env: &[(&str, &str)],
) -> Option<BTreeMap<String, (String, String)>> {
    require!(
        return None;
        Need::Root,
        Need::program("python3", "apt-get install python3")
    );
    let host = SimHost::new(1);
    let prefix = host.install();
    let out = host.dir.path().join(script.replace('.', "-"));
    let mut command = Command::new("bash");
    command
        .arg(repo_root().join("tests/gpu/limiter").join(script))
        .args(std::iter::repeat_n(&prefix, builds))
        .arg(&out)
        .env("SIMULATE", "1")
        .envs(env.iter().copied());
    let output = host.apply(&mut command).output().expect("run the script");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert!(
        out.join("records.tsv").exists(),
        "{script}: {}\n{stdout}\n{stderr}",
        output.status
    );
    Some(records(&out))
}

/// Every check is named and judged; those that need a real GPU's software (PyTorch,
/// nvcc) are skipped, not failed; no check lost its step (`rc=...`: the run gave no
/// result line, which is how a script or workload error shows).
fn assert_plumbing(
    script: &str,
    found: &BTreeMap<String, (String, String)>,
    expected: &[String],
    skipped: &[&str],
) {
    let names: Vec<&String> = found.keys().collect();
    let mut wanted: Vec<&String> = expected.iter().collect();
    wanted.sort();
    assert_eq!(names, wanted, "{script}: the checks written");
    for (name, (verdict, figure)) in found {
        assert!(
            ["PASS", "FAIL", "SKIP", "INFO"].contains(&verdict.as_str()),
            "{script}: {name}: verdict {verdict:?}"
        );
        assert_eq!(
            verdict == "SKIP",
            skipped.contains(&name.as_str()),
            "{script}: {name}: {verdict} {figure}"
        );
        assert!(
            !figure.starts_with("rc="),
            "{script}: {name}: a step gave no result: {figure}"
        );
    }
}

#[test]
fn the_limiter_section_runs_and_judges_every_check_over_the_sim() {
    let Some(found) = dry_run("run_limiter.sh", &[("CASE_S", "0.5")]) else {
        return;
    };
    let mut expected: Vec<String> = Vec::new();
    for kernel in ["100us", "1ms"] {
        for streams in [1, 2, 4, 8] {
            for limit in [30, 70] {
                expected.push(format!("streams-{streams}x{kernel}-at-{limit}"));
            }
        }
    }
    expected.extend(
        [
            "streams-all",
            "single-100us-at-30",
            "single-100us-at-70",
            "single-10ms-at-30",
            "single-10ms-at-70",
            "graphs-at-30",
            "one-container-two-processes-at-30",
            "two-containers-30",
            "two-containers-60",
            "soft-falls-back",
            "launch-cost-launch",
            "launch-cost-in-process",
            "launch-cost-in-process-kernels",
            "launch-cost-cudart",
            "event-on-an-idle-stream-beside-a-busy-process",
            "decode-bare",
            "decode-30",
            "decode-60",
            "training-at-50",
            "decode-without-a-limit",
            "decode-at-99",
            "training-without-a-limit",
        ]
        .map(String::from),
    );
    let skipped = [
        "launch-cost-cudart",
        "event-on-an-idle-stream-beside-a-busy-process",
        "decode-bare",
        "decode-30",
        "decode-60",
        "training-at-50",
        "decode-without-a-limit",
        "decode-at-99",
        "training-without-a-limit",
    ];
    assert_plumbing("run_limiter.sh", &found, &expected, &skipped);
    let (_, figure) = &found["launch-cost-in-process"];
    assert!(
        figure.contains("the shim's cuLaunchKernel") && figure.contains("the real driver's"),
        "the in-process launch measurement found the real driver: {figure}"
    );
    let (verdict, figure) = &found["launch-cost-in-process-kernels"];
    assert!(
        verdict == "INFO" && figure.contains("8 kernels in turn"),
        "the in-process measurement took eight kernels in turn: {verdict} {figure}"
    );
    // The limiter's trace of the timed run reaches the figure, with the fast path's own
    // time and which clock it read.
    let (_, figure) = &found["launch-cost-launch"];
    assert!(
        figure.contains("ns of its own each, the counter's clock)")
            || figure.contains("ns of its own each, the vDSO's clock)"),
        "the launch cost's figure carries the trace: {figure}"
    );
}

/// A sim host for calls.sh: the host, its `vgpu install` prefix, and where the calls'
/// results go (not made yet).
fn calls_host() -> (SimHost, std::path::PathBuf, std::path::PathBuf) {
    let host = SimHost::new(1);
    let prefix = host.install();
    let out = host.dir.path().join("calls");
    (host, prefix, out)
}

/// `calls.sh PREFIX ARGS...` with OUT at `out`, which must refuse in one stderr line
/// containing `says` (exit 2) and make nothing.
fn assert_calls_refused(prefix: &Path, out: &Path, args: &[&str], says: &str) {
    let refused = Command::new("bash")
        .arg(repo_root().join("tests/gpu/limiter/calls.sh"))
        .arg(prefix)
        .args(args)
        .env("OUT", out)
        .output()
        .expect("run calls.sh");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.lines().count() == 1 && stderr.contains(says),
        "one line saying {says:?}: {stderr}"
    );
    assert!(!out.exists(), "a refused call made {}", out.display());
}

/// `calls.sh PREFIX ARGS...` over the sim (`SIMULATE=1`) on `host`, OUT at `out`, with
/// `env`: its stdout, and everything it printed with its status for a failure's message.
fn run_calls(
    host: &SimHost,
    prefix: &Path,
    out: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> (String, String) {
    let mut command = Command::new("bash");
    command
        .arg(repo_root().join("tests/gpu/limiter/calls.sh"))
        .arg(prefix)
        .args(args)
        .env("OUT", out)
        .env("SIMULATE", "1")
        .envs(env.iter().copied());
    let output = host.apply(&mut command).output().expect("run calls.sh");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let shown = format!(
        "{}\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{shown}");
    (stdout, shown)
}

/// The names in the archive `tgz` (`tar tzf`).
fn packed_names(tgz: &Path) -> String {
    let listing = Command::new("tar")
        .arg("tzf")
        .arg(tgz)
        .output()
        .expect("tar");
    String::from_utf8_lossy(&listing.stdout).into_owned()
}

/// `calls.sh`, the limiter's figures in two device calls: an unknown call is refused
/// before anything is made, and a call runs its parts, prints each part's records after
/// it and packs their folders into one archive beside the parts' outputs.
#[test]
fn the_two_calls_script_runs_its_parts_and_packs_their_folders() {
    require!(
        Need::Root,
        Need::program("python3", "apt-get install python3")
    );
    let (host, prefix, out) = calls_host();
    assert_calls_refused(&prefix, &out, &["everything"], "'everything'");
    let (stdout, shown) = run_calls(&host, &prefix, &out, &["alone"], &[("CASE_S", "0.5")]);
    assert!(stdout.contains("== alone: rc 0 "), "{shown}");
    // The part's records follow it: the streams' summary and the two-container checks.
    for check in [
        "\nstreams-all\t",
        "\ntwo-containers-60\t",
        "\ngraphs-at-30\t",
    ] {
        assert!(stdout.contains(check), "{check:?} not printed: {shown}");
    }
    // The parts this call leaves out are "not run", not failures of the limiter.
    for (check, part) in [
        ("launch-cost-launch", "launch"),
        ("launch-cost-in-process", "launch"),
        ("launch-cost-cudart", "cudart"),
    ] {
        let line = format!(
            "\n{check}\t\"verdict\": \"SKIP\", \"figure\": \"part {part} not run (PARTS=streams pair two torch)\""
        );
        assert!(stdout.contains(&line), "{line:?} not printed: {shown}");
    }
    let table = std::fs::read_to_string(out.join("alone.txt")).expect("alone.txt");
    assert!(
        table.contains(" in parts not run\n") && !table.contains("rc=None"),
        "the summary counts the left-out checks apart: {table}"
    );
    for file in ["env.txt", "alone.txt", "parts.tgz"] {
        assert!(out.join(file).is_file(), "{file} missing: {shown}");
    }
    let listing = packed_names(&out.join("parts.tgz"));
    for packed in ["./alone/records.tsv", "./alone/limiter.json"] {
        assert!(
            listing.lines().any(|line| line == packed),
            "{packed} not packed: {listing}"
        );
    }
    assert!(
        !listing.lines().any(|line| line.ends_with("/streams")),
        "the compiled workload was packed: {listing}"
    );
}

/// `calls.sh PREFIX compare OLD`: refused in one line without an OLD build, and with one
/// runs compare_launch.sh for both builds, prints both builds' launch checks named by
/// build, and packs both runs' folders.
#[test]
fn the_calls_script_compares_two_builds_and_prints_both_launch_checks() {
    require!(
        Need::Root,
        Need::program("python3", "apt-get install python3")
    );
    let (host, prefix, out) = calls_host();
    assert_calls_refused(&prefix, &out, &["compare"], "compare needs OLD");
    let old = prefix.to_str().expect("a UTF-8 prefix");
    let (stdout, shown) = run_calls(
        &host,
        &prefix,
        &out,
        &["compare", old],
        &[
            ("LAUNCH_PAIRS", "2"),
            ("LAUNCH_CYCLES", "4"),
            ("LAUNCH_ROUND", "1000"),
        ],
    );
    assert!(stdout.contains("== compare: rc 0 "), "{shown}");
    for build in ["new-1", "old-1"] {
        for check in ["launch-cost-launch", "launch-cost-in-process"] {
            let line = format!("\n{check}@{build}\t\"verdict\": ");
            assert!(stdout.contains(&line), "{line:?} not printed: {shown}");
        }
    }
    assert!(
        !stdout.contains("\nstreams-all"),
        "only the launch checks are printed: {shown}"
    );
    let listing = packed_names(&out.join("parts.tgz"));
    for packed in [
        "./compare/records.tsv",
        "./compare/new-1/records.tsv",
        "./compare/old-1/records.tsv",
    ] {
        assert!(
            listing.lines().any(|line| line == packed),
            "{packed} not packed: {listing}"
        );
    }
}

/// `compare_launch.sh` (two builds' launch cost on one machine) runs the launch parts
/// for each build and keeps each one's records apart, named by build and round.
#[test]
fn the_launch_comparison_judges_each_builds_launch_cost_apart() {
    let Some(found) = dry_run_of("compare_launch.sh", 2, &[("ROUNDS", "1")]) else {
        return;
    };
    for build in ["new-1", "old-1"] {
        for check in ["launch-cost-launch", "launch-cost-in-process"] {
            let name = format!("{check}@{build}");
            let Some((verdict, figure)) = found.get(&name) else {
                panic!("{name} missing: {:?}", found.keys().collect::<Vec<_>>());
            };
            assert!(
                ["PASS", "FAIL"].contains(&verdict.as_str()) && figure.contains("ns"),
                "{name}: {verdict} {figure}"
            );
        }
        let name = format!("launch-cost-cudart@{build}");
        assert_eq!(found[&name].0, "SKIP", "no nvcc over the sim: {name}");
    }
    assert!(
        found
            .keys()
            .all(|name| name.ends_with("@new-1") || name.ends_with("@old-1")),
        "every record names its build: {:?}",
        found.keys().collect::<Vec<_>>()
    );
}

#[test]
fn the_contention_part_runs_and_judges_every_check_over_the_sim() {
    let Some(found) = dry_run("contention.sh", &[("PAIR_S", "1")]) else {
        return;
    };
    let mut expected: Vec<String> = Vec::new();
    for limit in [30, 40, 60] {
        for neighbour in ["soft30", "unlimited"] {
            for kernel in ["f1ms", "w1ms"] {
                expected.push(format!("hard{limit}-{neighbour}-{kernel}"));
            }
        }
    }
    for kernel in ["w1ms", "f1ms"] {
        expected.push(format!("two-bare-{kernel}"));
        expected.push(format!("two30-60-{kernel}"));
        expected.push(format!("two50-50-{kernel}"));
    }
    expected.push("hostile30-hard30".into());
    let decode = ["decode-beside-neighbour", "decode-50-50", "decode-70-30"];
    expected.extend(decode.map(String::from));
    assert_plumbing("contention.sh", &found, &expected, &decode);
    // Two unlimited containers say what the card gives busy neighbours, which the hard
    // pairs are judged against.
    for kernel in ["w1ms", "f1ms"] {
        let (verdict, figure) = &found[&format!("two-bare-{kernel}")];
        assert_eq!(verdict, "INFO", "two-bare-{kernel}: {figure}");
        assert!(
            figure.contains("the card shared: ") && !figure.contains("the card shared: -"),
            "two-bare-{kernel} measured the card shared: {figure}"
        );
    }
    // Over the sim, too, the hostile tenant escapes until the host sees it on the card.
    let (verdict, figure) = &found["hostile30-hard30"];
    assert_eq!(verdict, "PASS", "the hostile tenant over the sim: {figure}");
}

/// Runs the judge `script` of tests/gpu/limiter over the run folder `out` (its logs/)
/// with `args`; fails the test where the judge itself fails.
fn run_judge(script: &str, out: &Path, args: &[&str]) {
    let output = Command::new("python3")
        .arg(repo_root().join("tests/gpu/limiter").join(script))
        .arg(out)
        .args(args)
        .output()
        .unwrap_or_else(|error| panic!("run {script}: {error}"));
    assert!(
        output.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// contention.py's records for the `two` part over made-up logs: a bare fixed-work run
/// of 100 % a window, and for each of `runs` (name, side a's and side b's 100 ms windows),
/// both sides started together and busy 4 s.
fn judge_two(runs: &[(&str, f64, f64)]) -> Option<BTreeMap<String, (String, String)>> {
    require!(
        return None;
        Need::program("python3", "apt-get install python3")
    );
    let out = tempfile::tempdir().expect("a temporary folder");
    let logs = out.path().join("logs");
    std::fs::create_dir(&logs).expect("logs/");
    let write = |name: &str, line: String| {
        std::fs::write(logs.join(format!("{name}.out")), line + "\n").expect("a run's .out");
        std::fs::write(logs.join(format!("{name}.rc")), "0\n").expect("a run's .rc");
    };
    write(
        "bare-w1ms",
        r#"{"case": "w1ms", "per_s": 1000.0, "work_s": 0.001, "fit": 1, "t0": 10.0}"#.into(),
    );
    for (name, a, b) in runs {
        for (side, share) in [("a", a), ("b", b)] {
            let windows = vec![format!("{share:.1}"); 40].join(", ");
            write(
                &format!("{name}-{side}"),
                format!(
                    r#"{{"case": "w1ms", "per_s": 1.0, "work_s": 0.001, "fit": 1, "t0": 20.0, "windows": [{windows}]}}"#
                ),
            );
        }
    }
    run_judge("contention.py", out.path(), &["two"]);
    Some(records(out.path()))
}

/// Two busy containers lose the card's switches between their slices (on H100s two
/// unlimited ones of fixed-work kernels got about 45 % of bare each): hard limits that
/// ask for the whole card are judged by their parts of what two unlimited ones got in
/// the same call, limits that fit in it by themselves, and a hard limit's worst second
/// by its limit whatever the card gave.
#[test]
fn limits_that_fill_the_card_are_judged_by_what_two_busy_unlimited_containers_got() {
    let Some(found) = judge_two(&[
        ("two-bare-w1ms", 45.0, 45.0),
        ("two50-50-w1ms", 44.0, 46.0),
        ("two30-60-w1ms", 30.0, 59.0),
    ]) else {
        return;
    };
    let verdict = |name: &str| (found[name].0.as_str(), found[name].1.as_str());
    let (bare, figure) = verdict("two-bare-w1ms");
    assert_eq!(bare, "INFO", "{figure}");
    assert!(figure.contains("the card shared: 90.0%"), "{figure}");
    let (fill, figure) = verdict("two50-50-w1ms");
    assert_eq!(fill, "PASS", "{figure}");
    assert!(
        figure.contains("its limit's part of the 90.0% two busy unlimited ones got (45.0/45.0)"),
        "{figure}"
    );
    let (fit, figure) = verdict("two30-60-w1ms");
    assert_eq!(fit, "PASS", "{figure}");
    assert!(
        figure.contains("each busy: limit+-5"),
        "limits that fit: {figure}"
    );

    let Some(found) = judge_two(&[
        ("two-bare-w1ms", 45.0, 45.0),
        ("two50-50-w1ms", 39.0, 39.0),
        ("two30-60-w1ms", 30.0, 63.0),
    ]) else {
        return;
    };
    assert_eq!(
        found["two50-50-w1ms"].0, "FAIL",
        "more than 5 under 45: {:?}",
        found["two50-50-w1ms"]
    );
    assert_eq!(
        found["two30-60-w1ms"].0, "FAIL",
        "a worst second over 62: {:?}",
        found["two30-60-w1ms"]
    );

    // Without the unlimited pair's figure, the limits themselves.
    let Some(found) = judge_two(&[("two50-50-w1ms", 44.0, 44.0)]) else {
        return;
    };
    assert_eq!(
        found["two50-50-w1ms"].0, "FAIL",
        "{:?}",
        found["two50-50-w1ms"]
    );
    assert!(
        found["two-bare-w1ms"].0 == "FAIL",
        "the missing unlimited pair fails: {:?}",
        found["two-bare-w1ms"]
    );
}

/// A finished dry run of `run_limiter.sh` (part `torch` with standin.py in the loops'
/// place, or part `launch`): its records, its OUT, and the sim host (whose folder holds
/// OUT) kept alive.
struct RoundsRun {
    _host: SimHost,
    out: std::path::PathBuf,
    found: BTreeMap<String, (String, String)>,
    took: std::time::Duration,
}

impl RoundsRun {
    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.out.join("logs").join(name)).unwrap_or_default()
    }

    /// interleave.py's account of run `name` in rounds.json.
    fn state(&self, name: &str) -> serde_json::Value {
        let text = self.log("rounds.json");
        let state: serde_json::Value = serde_json::from_str(&text).expect("rounds.json");
        state["runs"][name].clone()
    }

    /// The cycles of run `name`'s RESULT lines, in order.
    fn cycles(&self, name: &str) -> Vec<u64> {
        self.log(&format!("{name}.out"))
            .lines()
            .filter_map(|line| line.strip_prefix("RESULT "))
            .map(|json| {
                let value: serde_json::Value = serde_json::from_str(json).expect("a RESULT");
                value["cycle"].as_u64().expect("a round's cycle")
            })
            .collect()
    }

    fn rc(&self, name: &str) -> Option<i32> {
        self.log(&format!("{name}.rc")).trim().parse().ok()
    }

    fn has_trace(&self, name: &str) -> bool {
        std::fs::read_dir(self.out.join("logs"))
            .expect("logs/")
            .any(|entry| {
                let file = entry.expect("an entry").file_name();
                file.to_string_lossy()
                    .starts_with(&format!("{name}.trace."))
            })
    }
}

const LOOP_RUNS: [&str; 8] = [
    "decode-bare",
    "decode-30",
    "decode-60",
    "decode-unlimited",
    "decode-99",
    "train-bare",
    "train-50",
    "train-unlimited",
];
/// The checks part `torch` writes.
const LOOP_CHECKS: [&str; 8] = [
    "event-on-an-idle-stream-beside-a-busy-process",
    "decode-bare",
    "decode-30",
    "decode-60",
    "training-at-50",
    "decode-without-a-limit",
    "decode-at-99",
    "training-without-a-limit",
];
/// What every part-`torch` dry run is given: 4 cycles of short rounds (a lead-in of 0.1 s
/// and 0.2 s or 0.3 s measured: about 11 s of rounds).
const SHORT_ROUNDS: [(&str, &str); 7] = [
    ("PARTS", "torch"),
    ("TORCH_STANDIN", "1"),
    ("ROUND_CYCLES", "4"),
    ("ROUND_LEAD_S", "0.1"),
    ("DECODE_ROUND_S", "0.2"),
    ("TRAIN_ROUND_S", "0.3"),
    ("STANDIN_FAULTS", ""),
];

/// `run_limiter.sh` with `PARTS=torch` and standin.py over the sim, with `env` on top
/// of [`SHORT_ROUNDS`]; killed (and the test failed) if it takes longer than `limit`:
/// nothing in it may hang.
fn rounds_run(env: &[(&str, &str)], limit: std::time::Duration) -> Option<RoundsRun> {
    limiter_run(&[&SHORT_ROUNDS, env], limit)
}

/// `run_limiter.sh` over the sim with `envs` (each on top of the one before); killed
/// (and the test failed) if it takes longer than `limit`.
fn limiter_run(envs: &[&[(&str, &str)]], limit: std::time::Duration) -> Option<RoundsRun> {
    require!(
        return None;
        Need::Root,
        Need::program("python3", "apt-get install python3")
    );
    let host = SimHost::new(1);
    let prefix = host.install();
    let out = host.dir.path().join("limiter");
    let mut command = Command::new("bash");
    command
        .arg(repo_root().join("tests/gpu/limiter/run_limiter.sh"))
        .arg(&prefix)
        .arg(&out)
        .env("SIMULATE", "1");
    for env in envs {
        command.envs(env.iter().copied());
    }
    command
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(host.dir.path().join("run.txt")).expect("run.txt"));
    let began = std::time::Instant::now();
    let mut child = host.apply(&mut command).spawn().expect("run the script");
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the script") {
            break status;
        }
        if began.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "run_limiter.sh still running after {limit:?}:\n{}",
                std::fs::read_to_string(host.dir.path().join("run.txt")).unwrap_or_default()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let took = began.elapsed();
    assert!(
        out.join("records.tsv").exists(),
        "{status}: {}",
        std::fs::read_to_string(host.dir.path().join("run.txt")).unwrap_or_default()
    );
    let found = records(&out);
    Some(RoundsRun {
        _host: host,
        out,
        found,
        took,
    })
}

/// Part `torch` (the host-bound loops) as interleaved rounds of eight persistent
/// processes: every run is served every cycle's round under its own wrapper, ends on
/// `quit` (the limited ones leave their limiter trace), and each comparison is judged by
/// its per-cycle ratios. standin.py stands in for PyTorch; its figures over the sim are
/// not judged here.
#[test]
fn the_loops_run_in_interleaved_rounds_over_the_sim() {
    let Some(run) = rounds_run(&[], std::time::Duration::from_secs(240)) else {
        return;
    };
    for check in LOOP_CHECKS {
        let Some((verdict, figure)) = run.found.get(check) else {
            panic!(
                "{check} missing: {:?}",
                run.found.keys().collect::<Vec<_>>()
            );
        };
        if check.starts_with("event-") {
            assert_eq!(verdict, "SKIP", "{check}: {figure}");
            continue;
        }
        assert!(
            ["PASS", "FAIL", "INFO"].contains(&verdict.as_str()),
            "{check}: {verdict} {figure}"
        );
        assert!(
            !figure.contains("given up") && !figure.starts_with("rc="),
            "{check}: {figure}"
        );
        if check != "decode-bare" {
            assert!(
                figure.contains("median of 4 cycles' ratios"),
                "{check} is judged by its per-cycle ratios: {figure}"
            );
        }
        if ["decode-bare", "decode-30", "decode-60"].contains(&check) {
            assert!(
                figure.contains(" ms, max "),
                "{check} gives its longest step (issue 25's stalls): {figure}"
            );
        }
    }
    for name in LOOP_RUNS {
        assert_eq!(
            run.cycles(name),
            [0, 1, 2, 3],
            "{name}: every cycle's round"
        );
        assert_eq!(run.rc(name), Some(0), "{name}: ended on quit");
        let state = run.state(name);
        assert_eq!(state["rounds"], 4, "{name}: {state}");
        assert!(
            state["failed"].is_null() && state["exit"].is_null(),
            "{name}: {state}"
        );
        let limited = ["30", "60", "99", "50"]
            .iter()
            .any(|limit| name.ends_with(limit));
        assert_eq!(
            run.has_trace(name),
            limited,
            "{name}: a limiter trace where (and only where) it ran limited"
        );
    }
    // The order changes from cycle to cycle, and every cycle runs every run once.
    let state: serde_json::Value =
        serde_json::from_str(&run.log("rounds.json")).expect("rounds.json");
    let orders: Vec<Vec<String>> =
        serde_json::from_value(state["order"].clone()).expect("each cycle's order");
    assert_eq!(orders.len(), 4);
    for order in &orders {
        let mut sorted = order.clone();
        sorted.sort();
        let mut all: Vec<String> = LOOP_RUNS.iter().map(|s| s.to_string()).collect();
        all.sort();
        assert_eq!(sorted, all, "one round of each run a cycle: {order:?}");
    }
    assert!(
        orders.windows(2).all(|pair| pair[0] != pair[1]),
        "{orders:?}"
    );
    // 8 runs x 4 cycles of rounds of 0.3-0.4 s are 11 s; start-up and judging a few more.
    assert!(
        run.took < std::time::Duration::from_secs(120),
        "part torch took {:?}",
        run.took
    );
}

/// Runs that fail to start, never get ready, die mid-way or stall in a round become FAIL
/// records with their reason; the others get every round, and nothing waits for a
/// broken run longer than its deadline.
#[test]
fn broken_loop_runs_are_failed_with_their_reason_and_nothing_hangs() {
    let faults = "decode-60:exit decode-99:hang train-50:die@2 decode-unlimited:stall@1";
    let Some(run) = rounds_run(
        &[
            ("STANDIN_FAULTS", faults),
            ("ROUNDS_READY_S", "20"),
            ("ROUNDS_GRACE_S", "10"),
        ],
        std::time::Duration::from_secs(240),
    ) else {
        return;
    };
    let figure = |check: &str| -> (&str, &str) {
        let (verdict, figure) = &run.found[check];
        (verdict.as_str(), figure.as_str())
    };
    for (check, why) in [
        ("decode-60", "ended before it was ready (rc=1)"),
        ("decode-60", "told to fail before it starts"),
        ("decode-at-99", "not ready within 20 s"),
        ("training-at-50", "ended in cycle 2's round (2 rounds done)"),
        ("decode-without-a-limit", "cycle 1's round not done within"),
    ] {
        let (verdict, text) = figure(check);
        assert_eq!(verdict, "FAIL", "{check}: {text}");
        assert!(text.contains(why), "{check}: wanted {why:?} in {text}");
    }
    // The healthy runs were served every round and judged as usual.
    for name in ["decode-bare", "decode-30", "train-bare", "train-unlimited"] {
        assert_eq!(run.cycles(name), [0, 1, 2, 3], "{name}");
        assert_eq!(run.rc(name), Some(0), "{name}");
    }
    assert_eq!(
        figure("decode-bare").0,
        "PASS",
        "{:?}",
        figure("decode-bare")
    );
    assert!(
        figure("decode-30").1.contains("median of 4 cycles' ratios"),
        "{:?}",
        figure("decode-30")
    );
    assert_eq!(figure("training-without-a-limit").0, "INFO");
    // The broken ones ended (each process's wrapper wrote its status) with what they did.
    assert_eq!(run.rc("decode-60"), Some(1));
    assert_eq!(
        run.rc("decode-99"),
        Some(3),
        "ended once given up while starting"
    );
    assert_eq!(run.rc("train-50"), Some(7));
    assert_eq!(
        run.rc("decode-unlimited"),
        Some(0),
        "its cut round ended it"
    );
    assert_eq!(run.cycles("train-50"), [0, 1]);
    assert_eq!(run.cycles("decode-unlimited"), [0]);
    // The ready wait (20 s) and the stalled round's (10 s) are what the breakage cost.
    assert!(
        run.took < std::time::Duration::from_secs(150),
        "part torch took {:?}",
        run.took
    );
}

/// judge.py's records of part `torch` over made-up logs of rounds: `runs` are (name,
/// each round's card figure, each cycle's steps/s or None for a cycle without its
/// round); `given_up` are interleave.py's reasons. Returns the records and
/// limiter.json's figures of each check.
#[allow(clippy::type_complexity)]
fn judge_rounds(
    runs: &[(&str, f64, &[Option<f64>])],
    given_up: &[(&str, &str)],
) -> Option<(BTreeMap<String, (String, String)>, serde_json::Value)> {
    require!(
        return None;
        Need::program("python3", "apt-get install python3")
    );
    let out = tempfile::tempdir().expect("a temporary folder");
    let logs = out.path().join("logs");
    std::fs::create_dir(&logs).expect("logs/");
    let mut states = serde_json::Map::new();
    for (name, card_util, cycles) in runs {
        let mut text = format!("READY {{\"name\": \"{name}\"}}\n");
        for (cycle, steps_per_s) in cycles.iter().enumerate() {
            let Some(per_s) = steps_per_s else { continue };
            let result = serde_json::json!({
                "steps_per_s": per_s, "steps": (per_s * 0.6).round(), "wall_s": 0.6,
                "t0": 100.0 + cycle as f64, "card_util": card_util, "p50_ms": 1.0,
                "p99_ms": 1.5, "max_ms": 2.0, "cycle": cycle, "lead_s": 0.25,
            });
            text += &format!("ROUND {cycle}\nRESULT {result}\n");
        }
        std::fs::write(logs.join(format!("{name}.out")), text).expect("a run's .out");
        std::fs::write(logs.join(format!("{name}.rc")), "0\n").expect("a run's .rc");
        let failed = given_up
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, why)| why.to_string());
        states.insert(
            name.to_string(),
            serde_json::json!({"ready": true, "rounds": cycles.iter().flatten().count(),
                               "failed": failed, "rc": 0}),
        );
    }
    let state = serde_json::json!({"cycles": 6, "lead_s": 0.25, "order": [], "runs": states});
    std::fs::write(logs.join("rounds.json"), state.to_string()).expect("rounds.json");
    run_judge("judge.py", out.path(), &["0.5", "1"]);
    let figures: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.path().join("limiter.json")).expect("limiter.json"),
    )
    .expect("limiter.json's JSON");
    Some((records(out.path()), figures["checks"].clone()))
}

/// Each limited run is judged by the median of its ratios to the bare run's round of the
/// same cycle: the host's drift from cycle to cycle cancels, and one cycle that a stall
/// hit (the bare round at 400 steps/s, a ratio of 1.5) moves neither the verdict nor the
/// figure, where the mean of the ratios (0.75: 37.5 % of the card for a limit of 30)
/// would fail it. A limit missed in every cycle fails; a run with too few cycles in
/// common, or one interleave.py gave up on, fails with the reason.
#[test]
fn the_loops_are_judged_by_the_median_of_their_per_cycle_ratios() {
    let bare = [1000.0, 1300.0, 400.0, 1200.0, 900.0, 1100.0];
    let times = |factor: f64| bare.map(|b| Some(b * factor));
    let mut at_30 = times(0.6);
    at_30[2] = Some(600.0);
    let train_bare = [60.0, 75.0, 63.0, 70.0, 66.0, 80.0];
    let mut at_50 = train_bare.map(|b| Some(b * 0.5));
    at_50[4] = Some(66.0 * 0.9);
    let bare = bare.map(Some);
    let train_bare = train_bare.map(Some);
    let Some((found, figures)) = judge_rounds(
        &[
            ("decode-bare", 50.0, &bare),
            ("decode-30", 30.0, &at_30),
            ("decode-60", 40.0, &times(0.8)),
            ("decode-unlimited", 50.0, &times(0.97)),
            ("decode-99", 50.0, &times(0.95)),
            ("train-bare", 100.0, &train_bare),
            ("train-50", 50.0, &at_50),
            (
                "train-unlimited",
                100.0,
                &[Some(60.0), None, None, Some(70.0), None, None],
            ),
        ],
        &[("decode-99", "ended in cycle 5's round (5 rounds done)")],
    ) else {
        return;
    };
    let verdict = |name: &str| (found[name].0.as_str(), found[name].1.as_str());

    let (held, figure) = verdict("decode-30");
    assert_eq!(held, "PASS", "{figure}");
    assert!(
        figure.contains("0.60x bare (median of 6 cycles' ratios, 0.60-1.50")
            && figure.contains("this run took 30.0% of it, target 30.0+-5"),
        "{figure}"
    );
    let checked = &figures["decode-30"];
    assert_eq!(checked["ratio"], 0.6, "{checked}");
    assert_eq!(
        checked["ratio_spread"],
        serde_json::json!([0.6, 1.5]),
        "{checked}"
    );
    assert_eq!(checked["cycle_ratios"]["2"], 1.5, "{checked}");
    assert_eq!(checked["bare_card_util"], 50.0, "{checked}");

    // 0.8 of bare in every cycle: 40 % of a card bare keeps 50 % busy, for a limit of 60.
    let (missed, figure) = verdict("decode-60");
    assert_eq!(missed, "FAIL", "{figure}");
    assert!(
        figure.contains("0.80x bare (median of 6 cycles' ratios, 0.80-0.80"),
        "{figure}"
    );

    let (trained, figure) = verdict("training-at-50");
    assert_eq!(trained, "PASS", "{figure}");
    assert!(
        figure.contains("50.0% of bare (median of 6 cycles' ratios, 0.50-0.90"),
        "{figure}"
    );

    let (info, figure) = verdict("decode-without-a-limit");
    assert_eq!(info, "INFO", "{figure}");
    assert!(figure.contains("0.97x bare"), "{figure}");

    let (gone, figure) = verdict("decode-at-99");
    assert_eq!(gone, "FAIL", "{figure}");
    assert!(
        figure.contains("ended in cycle 5's round (5 rounds done)"),
        "{figure}"
    );

    // Two cycles in common of six planned: fewer than half.
    let (few, figure) = verdict("training-without-a-limit");
    assert_eq!(few, "FAIL", "{figure}");
    assert!(figure.contains("only 2 cycles in common"), "{figure}");
}

/// `streams launch-serve N` (parts `launch`'s server, driven by pairs.py) over the sim:
/// ready once set up, one round of N launches a line, ended by `quit` or the end of its
/// input with status 0, and by a reader gone away with 3 rather than waiting.
#[test]
fn launch_serve_answers_a_round_a_line_and_ends_on_quit_eof_or_a_gone_reader() {
    use std::io::{BufRead, Write};
    require!(Need::Root);
    let host = SimHost::new(1);
    let streams = vgpu_test_support::streams_workload(host.dir.path());
    let serve = || {
        let mut command = Command::new(vgpu_tests::vgpu());
        command
            .args(["run", "--simulate", "--"])
            .arg(&streams)
            .args(["launch-serve", "1000"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .env("VGPU_HOST_DIR", host.dir.path().join("host"));
        host.apply(&mut command).spawn().expect("run streams")
    };
    let lines = |output: &std::process::Output| -> Vec<serde_json::Value> {
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .map(|line| serde_json::from_str(line).expect("a JSON line"))
            .collect()
    };
    for (input, rounds) in [("round 0\nround 1\nquit\nround 2\n", 2), ("round 0\n", 1)] {
        let mut child = serve();
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input.as_bytes())
            .expect("write the rounds");
        // Its stdin dropped: after the rounds, the end of its input.
        let output = wait_within(child, std::time::Duration::from_secs(60));
        assert_eq!(output.status.code(), Some(0), "{input:?}: {output:?}");
        let found = lines(&output);
        assert_eq!(found.len(), 1 + rounds, "{input:?}: {found:?}");
        assert_eq!(found[0]["ready"], true, "{found:?}");
        assert_eq!(found[0]["n"], 1000, "{found:?}");
        for (round, line) in found[1..].iter().enumerate() {
            assert_eq!(line["round"], round, "{line}");
            assert!(
                line["per_launch_ns"].as_f64().is_some_and(|ns| ns > 0.0),
                "{line}"
            );
        }
    }
    // The reader goes away once it is ready: the next round's line cannot be written.
    let mut child = serve();
    let mut stdout = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let mut ready = String::new();
    stdout.read_line(&mut ready).expect("its ready line");
    assert!(ready.contains("\"ready\": true"), "{ready}");
    drop(stdout);
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(b"round 0\n").expect("ask a round");
    let output = wait_within(child, std::time::Duration::from_secs(60));
    drop(stdin);
    assert_eq!(output.status.code(), Some(3), "{output:?}");
}

/// Waits for `child` at most `limit` (then kills it and fails the test); its output.
fn wait_within(mut child: std::process::Child, limit: std::time::Duration) -> std::process::Output {
    let began = std::time::Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if began.elapsed() > limit {
            let _ = child.kill();
            panic!(
                "still running after {limit:?}: {:?}",
                child.wait_with_output()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child.wait_with_output().expect("its output")
}

/// The rounds side `run` of a pairs.py run served: its .out lines with a cycle.
fn side_rounds(logs: &Path, run: &str) -> Vec<serde_json::Value> {
    std::fs::read_to_string(logs.join(format!("{run}.out")))
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|value| value.get("cycle").is_some())
        .collect()
}

/// Part `launch` over the sim: the launch cost by five pairs of persistent processes
/// (pairs.py and `streams launch-serve`), each side served every cycle's round in the
/// alternating order and ended on `quit`, the limited ones untraced; the check is judged
/// by the median of the pairs' ratios with every pair's figures, and the other launch
/// checks are there as before. The sim's figures are not judged.
#[test]
fn the_launch_cost_runs_as_interleaved_pairs_of_processes_over_the_sim() {
    let short = [
        ("PARTS", "launch"),
        ("LAUNCH_CYCLES", "6"),
        ("LAUNCH_ROUND", "2000"),
    ];
    let Some(run) = limiter_run(&[&short], std::time::Duration::from_secs(300)) else {
        return;
    };
    let (verdict, figure) = &run.found["launch-cost-launch"];
    assert!(
        ["PASS", "FAIL"].contains(&verdict.as_str()),
        "{verdict} {figure}"
    );
    assert!(
        figure.contains("the median of 5 process pairs' ratios (")
            && figure.contains("each the median over its 6 cycles (a round of 2000 launches")
            && figure.contains("per pair ns a launch bare / --cores 99")
            && !figure.contains("FAILED"),
        "{figure}"
    );
    // The traced run's figures still reach it.
    assert!(figure.contains("[launch-99-trace: "), "{figure}");
    for check in ["launch-cost-in-process", "launch-cost-in-process-kernels"] {
        assert!(
            run.found.contains_key(check),
            "{check}: {:?}",
            run.found.keys()
        );
    }
    let figures: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(run.out.join("limiter.json")).expect("limiter.json"),
    )
    .expect("limiter.json's JSON");
    let checked = &figures["checks"]["launch-cost-launch"];
    let pairs = checked["pairs"].as_array().expect("each pair's figures");
    assert_eq!(pairs.len(), 5, "{checked}");
    for pair in pairs {
        assert_eq!(pair["cycles"], 6, "{pair}");
        assert!(pair["ratio"].as_f64().is_some_and(|r| r > 0.0), "{pair}");
    }
    assert_eq!(checked["failed"], serde_json::json!([]), "{checked}");

    let logs = run.out.join("logs");
    let state: serde_json::Value =
        serde_json::from_str(&run.log("launch-pairs.json")).expect("launch-pairs.json");
    for pair in 1..=5 {
        for side in ["bare", "limited"] {
            let name = format!("launch-pair{pair}-{side}");
            let rounds = side_rounds(&logs, &name);
            let cycles: Vec<u64> = rounds
                .iter()
                .map(|r| r["cycle"].as_u64().unwrap())
                .collect();
            assert_eq!(cycles, [0, 1, 2, 3, 4, 5], "{name}");
            for round in &rounds {
                // Bare first in even cycles, limited first in odd ones.
                let even = round["cycle"].as_u64().unwrap() % 2 == 0;
                assert_eq!(round["first"], (side == "bare") == even, "{name}: {round}");
                assert!(round["per_launch_ns"].as_f64().is_some_and(|ns| ns > 0.0));
                assert_eq!(round["n"], 2000, "{round}");
            }
            assert_eq!(run.rc(&name), Some(0), "{name}: ended on quit");
            let entry = &state["runs"][&name];
            assert!(
                entry["failed"].is_null() && entry["rounds"] == 6 && entry["rc"] == 0,
                "{name}: {entry}"
            );
            assert!(
                !run.has_trace(&name),
                "{name}: the timed pairs are untraced"
            );
        }
    }
}

/// A launch-serve stand-in for the limited side that breaks after two rounds: `die`
/// exits 7, `stall` never answers the third round.
const BROKEN_SERVER: &str = r#"echo '{"case": "launch-serve", "ready": true, "n": 1}'
n=0
while read -r line; do
    [ "$line" = quit ] && exit 0
    if [ "$n" -ge 2 ]; then
        [ "$1" = die ] && exit 7
        sleep 600
    fi
    echo '{"case": "launch-serve", "round": '"$n"', "n": 1, "per_launch_ns": 1000.0}'
    n=$((n + 1))
done"#;

/// Sides that cannot start, never get ready, die mid-way or stall in a round fail their
/// pair with the reason, within the deadlines, and judge.py fails the launch cost with
/// it; the healthy side (streams over the sim) ends on `quit` all the same, and the next
/// pair runs. Each case is one pairs.py call; they run side by side.
#[test]
fn broken_launch_pairs_fail_with_their_reason_and_nothing_hangs() {
    require!(
        Need::Root,
        Need::program("python3", "apt-get install python3")
    );
    let host = SimHost::new(1);
    let streams = vgpu_test_support::streams_workload(host.dir.path());
    let server = host.dir.path().join("broken.sh");
    std::fs::write(&server, BROKEN_SERVER).expect("broken.sh");
    let server = server.display().to_string();
    let vgpu = vgpu_tests::vgpu().display().to_string();
    let streams = streams.display().to_string();
    // (case, the limited side's command, pairs, what the check's figure says)
    let cases: [(&str, Vec<&str>, u32, &[&str]); 4] = [
        (
            "no-start",
            vec!["/nonexistent/streams", "launch-serve", "500"],
            2,
            &[
                "pair 1 limited: ended before it was ready; rc=127",
                "pair 2 limited: ended",
            ],
        ),
        (
            "never-ready",
            vec!["sleep", "600"],
            1,
            &["pair 1 limited: not ready within 30 s"],
        ),
        (
            "dies",
            vec!["sh", &server, "die"],
            2,
            &["pair 1 limited: ended in cycle 2's round (2 rounds done); rc=7"],
        ),
        (
            "stalls",
            vec!["sh", &server, "stall"],
            2,
            &["pair 2 limited: cycle 2's round not done within 5 s (2 rounds done)"],
        ),
    ];
    let began = std::time::Instant::now();
    std::thread::scope(|scope| {
        for (case, limited, pairs, reasons) in &cases {
            let (host, vgpu, streams) = (&host, &vgpu, &streams);
            scope.spawn(move || {
                let out = host.dir.path().join(case);
                let logs = out.join("logs");
                std::fs::create_dir_all(&logs).expect("logs/");
                let mut command = Command::new("python3");
                command
                    .arg(repo_root().join("tests/gpu/limiter/pairs.py"))
                    .arg("launch")
                    .arg(&logs)
                    .args(["--pairs", &pairs.to_string(), "--cycles", "4"])
                    .args(["--ready-s", "30", "--round-s", "5"])
                    .args(["bare:", vgpu, "run", "--simulate", "--", streams])
                    .args(["launch-serve", "500", "limited:"])
                    .args(limited)
                    .env("VGPU_HOST_DIR", out.join("host"))
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::piped());
                let child = host.apply(&mut command).spawn().expect("run pairs.py");
                let output = wait_within(child, std::time::Duration::from_secs(200));
                let stderr = String::from_utf8_lossy(&output.stderr);
                assert_eq!(
                    output.status.code(),
                    Some(1),
                    "{case}: a pair failed: {stderr}"
                );
                let state: serde_json::Value = serde_json::from_str(
                    &std::fs::read_to_string(logs.join("launch-pairs.json")).expect("state"),
                )
                .expect("launch-pairs.json");
                for pair in 1..=*pairs {
                    let bare = format!("launch-pair{pair}-bare");
                    let limited = format!("launch-pair{pair}-limited");
                    // The healthy side was told to quit and did.
                    assert_eq!(state["runs"][&bare]["failed"], serde_json::Value::Null);
                    assert_eq!(state["runs"][&bare]["rc"], 0, "{case} {bare}: {stderr}");
                    assert!(
                        state["runs"][&limited]["failed"].is_string(),
                        "{case}: {state}"
                    );
                }
                run_judge("judge.py", &out, &["0.5", "0"]);
                let (verdict, figure) = &records(&out)["launch-cost-launch"];
                assert_eq!(verdict, "FAIL", "{case}: {figure}");
                for reason in *reasons {
                    assert!(
                        figure.contains(reason),
                        "{case}: wanted {reason:?} in {figure}"
                    );
                }
            });
        }
    });
    // The waits that cost time: the never-ready side's 30 s, a stall's 5 s a pair; on a
    // busy machine start-ups take longer, but nothing waits without a deadline.
    assert!(
        began.elapsed() < std::time::Duration::from_secs(200),
        "{:?}",
        began.elapsed()
    );
}

/// Writes pairs.py's logs for check KIND: `pairs` of (bare, limited) per-launch ns by
/// cycle, and each side's reason for failing (None: it did all its rounds).
fn made_up_pairs(logs: &Path, kind: &str, pairs: &[(&[f64], &[f64])], failed: &[(&str, &str)]) {
    let mut runs = serde_json::Map::new();
    for (index, (bare, limited)) in pairs.iter().enumerate() {
        let pair = index + 1;
        for (side, rounds) in [("bare", bare), ("limited", limited)] {
            let name = format!("{kind}-pair{pair}-{side}");
            let mut text =
                String::from("{\"case\": \"launch-serve\", \"ready\": true, \"n\": 5000}\n");
            for (cycle, ns) in rounds.iter().enumerate() {
                let first = (side == "bare") == (cycle % 2 == 0);
                text += &format!(
                    "{}\n",
                    serde_json::json!({"case": "launch-serve", "round": cycle, "n": 5000,
                                       "per_launch_ns": ns, "cycle": cycle, "first": first})
                );
            }
            std::fs::write(logs.join(format!("{name}.out")), text).expect("a side's .out");
            std::fs::write(logs.join(format!("{name}.rc")), "0\n").expect("a side's .rc");
            let why = failed.iter().find(|(n, _)| *n == name).map(|(_, why)| *why);
            runs.insert(
                name,
                serde_json::json!({"pair": pair, "side": side, "ready": true,
                                   "rounds": rounds.len(), "failed": why, "rc": 0}),
            );
        }
    }
    let state = serde_json::json!({"name": kind, "pairs": pairs.len(), "cycles": 7, "runs": runs});
    std::fs::write(logs.join(format!("{kind}-pairs.json")), state.to_string()).expect("state");
}

/// judge.py's launch-cost checks over made-up pairs: each pair's ratio is the median of
/// its cycles' limited / bare, the check's the median of the pairs' ratios. A cycle a
/// stall hit (limited at 2x in one cycle, bare at 2x in another) and one pair of slow
/// processes (1.20 in every cycle) move neither the verdict nor the figure, where a mean
/// (of the cycles' ratios, 1.18 for the first pair; of the pairs', 1.09) or pooled rounds
/// (1.20 for the first pair) would fail it. A pair given up on fails the check with its
/// reason, whatever the others measured.
#[test]
fn the_launch_cost_is_the_median_of_the_pairs_median_cycle_ratios() {
    require!(Need::program("python3", "apt-get install python3"));
    // The host's pace drifts from cycle to cycle; both sides of a cycle drift alike.
    let drift = [3000.0, 3300.0, 2700.0, 3600.0, 2400.0, 3000.0, 3150.0];
    let times = |factor: f64| drift.map(|b| (b * factor * 10.0).round() / 10.0);
    let mut stalled = times(1.04);
    stalled[3] = 7200.0;
    let mut bare_stalled = drift;
    bare_stalled[5] = 6000.0;
    let slow = times(1.20);
    let pairs: [(&[f64], &[f64]); 3] = [
        (&drift, &stalled),
        (&bare_stalled, &times(1.03)),
        (&drift, &slow),
    ];
    let judge = |pairs: &[(&[f64], &[f64])], failed: &[(&str, &str)]| {
        let out = tempfile::tempdir().expect("a temporary folder");
        let logs = out.path().join("logs");
        std::fs::create_dir(&logs).expect("logs/");
        made_up_pairs(&logs, "launch", pairs, failed);
        made_up_pairs(&logs, "cudart", pairs, failed);
        run_judge("judge.py", out.path(), &["0.5", "0", "cudart"]);
        let figures: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(out.path().join("limiter.json")).expect("limiter.json"),
        )
        .expect("limiter.json's JSON");
        (records(out.path()), figures["checks"].clone())
    };

    let (found, figures) = judge(&pairs, &[]);
    for check in ["launch-cost-launch", "launch-cost-cudart"] {
        let (verdict, figure) = &found[check];
        assert_eq!(verdict, "PASS", "{check}: {figure}");
        assert!(
            figure.contains("1.040x, the median of 3 process pairs' ratios (1.040, 1.030, 1.200)")
                && figure.contains("each the median over its 7 cycles (a round of 5000 launches")
                && figure.contains("3000 / 3120, 3150 / 3090, 3000 / 3600")
                && figure.contains("medians bare 3.000 us, --cores 99 3.120 us")
                // Seven cycles are only enough for the whole spread as the interval.
                && figure.contains(
                    "each pair's median within 1.040-2.000, 0.515-1.030, 1.200-1.200 (95 %"
                ),
            "{check}: {figure}"
        );
        let checked = &figures[check];
        assert_eq!(checked["ratio"], 1.04, "{checked}");
        assert_eq!(checked["bare_us"], 3.0, "{checked}");
        assert_eq!(checked["limited_us"], 3.12, "{checked}");
        let each = &checked["pairs"];
        assert_eq!(each[0]["ratio"], 1.04, "{checked}");
        assert_eq!(
            each[0]["spread"],
            serde_json::json!([1.04, 2.0]),
            "{checked}"
        );
        assert_eq!(each[1]["ratio"], 1.03, "{checked}");
        assert_eq!(
            each[1]["spread"],
            serde_json::json!([0.515, 1.03]),
            "{checked}"
        );
        assert_eq!(each[2]["ratio"], 1.2, "{checked}");
        assert_eq!(each[2]["cycles"], 7, "{checked}");
    }

    // Two pairs of slow processes: the median is theirs.
    let (found, _) = judge(&[pairs[0], pairs[2], pairs[2]], &[]);
    let (verdict, figure) = &found["launch-cost-launch"];
    assert_eq!(verdict, "FAIL", "{figure}");
    assert!(figure.contains("1.200x, the median of 3"), "{figure}");

    // Thirty cycles, whose ratios are 1.00, 1.01, ... 1.29 in a scrambled order: the
    // median's interval is the 10th and 21st of them; five cycles give none.
    let bare30: Vec<f64> = (0..30).map(|c| 3000.0 + 100.0 * (c % 7) as f64).collect();
    let limited30: Vec<f64> = (0..30)
        .map(|c| bare30[c] * (1.0 + ((c * 7) % 30) as f64 / 100.0))
        .collect();
    let (found, figures) = judge(
        &[
            (&bare30, &limited30),
            (&bare30[..5], &limited30[..5]),
            (&bare30, &limited30),
        ],
        &[],
    );
    let (_, figure) = &found["launch-cost-launch"];
    assert!(
        figure.contains("each pair's median within 1.090-1.200, -, 1.090-1.200 (95 %"),
        "{figure}"
    );
    let each = &figures["launch-cost-launch"]["pairs"];
    assert_eq!(
        each[0]["interval"],
        serde_json::json!([1.09, 1.2]),
        "{each}"
    );
    assert_eq!(each[1]["interval"], serde_json::Value::Null, "{each}");

    // A pair given up on: its reason, and the check fails though the rest pass.
    let (found, _) = judge(
        &[pairs[0], (&drift[..4], &times(1.03)[..3]), pairs[1]],
        &[(
            "launch-pair2-limited",
            "ended in cycle 3's round (3 rounds done)",
        )],
    );
    let (verdict, figure) = &found["launch-cost-launch"];
    assert_eq!(verdict, "FAIL", "{figure}");
    assert!(
        figure.contains("FAILED: pair 2 limited: ended in cycle 3's round (3 rounds done); rc=0")
            && figure.contains("(1.040, 1.030, 1.030)"),
        "{figure}"
    );
}
