//! Two `vgpu run`s at 30 and 60 on one simulated card coordinate through their host
//! folder: one of them is elected, finds both containers' processes by their host PIDs
//! (each runs in a PID namespace of its own, whose `/proc` must not hide the host's from
//! the coordinator) and corrects their charges by the card's per-process figures.
//!
//! Run 7 on the H200 missed exactly this: the container init mounted its `/proc` in the
//! mount namespace it shares with `vgpu run`, the coordinator thread then read the
//! container's `/proc`, found no PID, and every charge factor stayed 1000.
//!
//! Needs root (mount namespaces and binds), the initial PID namespace (not a container:
//! see the test), a C compiler, and the shims and the sim driver built (`cargo test
//! --workspace` builds them).

use std::path::Path;
use std::process::{Child, Stdio};

mod common;

fn container(dir: &Path, streams: &Path, cores: &str) -> Child {
    common::simulated_run(dir, &["--memory", "1GiB", "--cores", cores], streams)
        .args(["run", "f1ms", "3"])
        .env("VGPU_COORDINATOR_TRACE", dir.join("coordinator.trace"))
        // Events that fire at their record, so that each process's kernels are timed
        // with the other's turns and its own figure runs over what the card gave it:
        // there is something for the coordinator to correct. (The sim's default makes
        // events wait for their turn; the H200's do not, BENCHMARKS run 12, but the sim's
        // turns are a kernel long: `cuda::schedule::event_on_card` says why it stays.)
        .env("VGPU_SIM_EVENT_TURNS", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run vgpu")
}

/// One judgement of the trace where the container's process was found: the factor the
/// card's figures pointed to (none where there was nothing to judge by) and its charge
/// factor (per mille).
#[derive(Clone, Copy, Debug)]
struct Judged {
    target: Option<f64>,
    charge_permille: u32,
}

/// The trace's judgements of `id`, in order, where its process was found.
fn judgements(trace: &str, id: &str) -> Vec<Judged> {
    let after = |line: &str, key: &str| -> Option<String> {
        let mut words = line.split_whitespace();
        words.find(|word| *word == key)?;
        words.next().map(str::to_string)
    };
    trace
        .lines()
        .filter(|line| line.contains(&format!(" container {id} ")) && line.contains(" pids 1/1 "))
        .filter_map(|line| {
            Some(Judged {
                target: after(line, "target")?.parse().ok(),
                charge_permille: after(line, "charge")?.parse().ok()?,
            })
        })
        .collect()
}

#[test]
fn two_runs_on_one_card_find_each_others_processes_and_correct_their_charges() {
    // `vgpu run` with the host's driver (no --simulate) bind-mounts over the host's paths.
    // NVML lists another namespace's process only to a caller in the initial PID
    // namespace (the simulated one as driver 580's), as the plugin's pod with hostPID
    // is: inside a container the coordinator finds no process, and nothing to judge.
    let initial = vgpu_contract::process::pid_namespace_in(Path::new("/proc"), "self")
        == Some(vgpu_contract::process::INIT_PID_NS);
    vgpu_test_support::require!(
        vgpu_test_support::Need::Root,
        vgpu_test_support::Need::Other {
            what: "the host's initial PID namespace",
            present: initial,
            install: "run the tests on the host or a VM, not inside a container",
        }
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let streams = vgpu_test_support::streams_workload(dir.path());
    let runs = [
        container(dir.path(), &streams, "30"),
        container(dir.path(), &streams, "60"),
    ];
    let mut ids = Vec::new();
    let mut corrected = Vec::new();
    for run in runs {
        let pid = run.id();
        let output = run.wait_with_output().expect("wait");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "vgpu run failed: {stderr}");
        assert!(
            String::from_utf8_lossy(&output.stdout).contains("\"per_s\""),
            "no figures from streams: {stderr}"
        );
        // A `vgpu run` names its container after itself.
        ids.push(format!("run-vgpu-run-{pid}-"));
    }
    let trace =
        std::fs::read_to_string(dir.path().join("coordinator.trace")).expect("coordinator trace");
    assert!(!trace.contains("meter none"), "no card meter: {trace}");
    for prefix in &ids {
        let id = trace
            .split_whitespace()
            .find(|word| word.starts_with(prefix.as_str()))
            .unwrap_or_else(|| panic!("container {prefix}* never judged:\n{trace}"));
        let judged = judgements(&trace, id);
        assert!(
            !judged.is_empty(),
            "the coordinator never found {id}'s process by its host PID:\n{trace}"
        );
        assert!(
            judged.iter().any(|j| j.target.is_some()),
            "{id} was never judged by the card's figures:\n{trace}"
        );
        corrected.push(judged.iter().any(|j| j.charge_permille < 950));
    }
    // The sim time-slices the two processes, and (VGPU_SIM_EVENT_TURNS=0) one's events
    // at least time the other's slices: the card's split took that back. Not both
    // always: the limiter sets aside samples of an idle stream beside a neighbour, and
    // the 60's often measure what the card gave it (CI-like run of 50bfd2d: 59.5-60.7
    // against the card's 60, its charge at least 959, judged < 950 for both before: a
    // FAIL; the 30 measured 41 against the card's 30, charge 730).
    assert!(
        corrected.iter().any(|&c| c),
        "no charge was ever corrected:\n{trace}"
    );
}
