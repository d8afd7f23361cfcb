//! The GPU suite's limiter scripts (`tests/gpu/limiter/run_limiter.sh` and
//! `contention.sh`) over the simulated driver (`SIMULATE=1`), as CI can run them. The
//! H200 is lent 30 minutes a session, so a script or judge that breaks must break here
//! first: these tests judge the scripts' plumbing (every check the judges write is
//! there with a verdict, what cannot run here is skipped rather than failed, and no step
//! died without a result), not the sim's figures, which the limiter's own tests judge
//! (`libcuda-shim/tests/limiter.rs`). One rule of a judge's own, which the sim's card
//! cannot reach (its turns cost no work), is judged over made-up logs.
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
    // The limiter's trace of the timed run reaches the figure, with the fast path's own
    // time and which clock it read.
    let (_, figure) = &found["launch-cost-launch"];
    assert!(
        figure.contains("ns of its own each, the counter's clock)")
            || figure.contains("ns of its own each, the vDSO's clock)"),
        "the launch cost's figure carries the trace: {figure}"
    );
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
    let output = Command::new("python3")
        .arg(repo_root().join("tests/gpu/limiter/contention.py"))
        .arg(out.path())
        .arg("two")
        .output()
        .expect("run contention.py");
    assert!(
        output.status.success(),
        "contention.py: {}",
        String::from_utf8_lossy(&output.stderr)
    );
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
