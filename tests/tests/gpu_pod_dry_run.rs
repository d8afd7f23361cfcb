//! The GPU suite's `pod` section (`tests/gpu/sections/pod.sh`) over the simulated driver,
//! as CI can run it: `vgpu-ldconfig prepare` from Debian's 535 libraries, the sim then
//! put in the real driver's place, the real plugin (`pod_harness`) admitting both pairs
//! (q30/p60, then a50/b50 in a plugin of their own) and runc running their containers.
//! The H200 is lent 30 minutes a session, so a section that breaks must break here
//! first. Like `gpu_limiter_dry_run.rs`, this judges the plumbing (every record is
//! written, the steps that need no real GPU pass, both pairs' containers ran and spun),
//! not the sim's figures: each container's sim state is in its own `/tmp` (a tmpfs of
//! its own), so each pair's two containers are not even on one simulated card.
//!
//! Needs root (mounts, runc), runc, a C compiler, python3, dpkg and Debian's driver
//! packages (`tests/run.sh` downloads them), `vgpu-ldconfig` and the plugin's
//! `pod_harness` example of this build.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use vgpu_test_support::debian::DEBIAN_DRIVER_VERSION;
use vgpu_test_support::{Need, profile_dir, repo_root, require, unpack_debian_driver};
use vgpu_tests::SimHost;

/// One record of results.jsonl: (verdict, figure, the whole object).
type Record = (String, String, serde_json::Value);

/// The records `results.jsonl` holds, by name; a name written twice fails.
fn records(out: &Path) -> BTreeMap<String, Record> {
    let text = std::fs::read_to_string(out.join("results.jsonl")).expect("results.jsonl");
    let mut found = BTreeMap::new();
    for line in text.lines() {
        let value: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|err| panic!("{err}: {line}"));
        assert_eq!(value["section"], "pod", "{line}");
        let field = |key: &str| value[key].as_str().unwrap_or_default().to_string();
        let name = field("name");
        let record = (field("verdict"), field("figure"), value.clone());
        assert!(
            found.insert(name.clone(), record).is_none(),
            "{name} written twice"
        );
    }
    found
}

#[test]
fn the_pod_section_admits_and_runs_both_pairs_under_runc_over_the_sim() {
    let harness = profile_dir().join("examples/pod_harness");
    require!(
        Need::Root,
        Need::program("runc", "apt-get install runc"),
        Need::program("cc", "apt-get install gcc"),
        Need::program("python3", "apt-get install python3"),
        Need::DebianDebs,
        Need::Built("vgpu-ldconfig"),
        Need::Other {
            what: "pod_harness (the plugin's example) of this build",
            present: harness.is_file(),
            install: "cargo build -p vgpu-plugin --example pod_harness",
        },
    );
    let host = SimHost::new(1);
    let prefix = host.install();
    // The section looks in $PREFIX/bin first (it knows target/release, not this profile).
    std::os::unix::fs::symlink(&harness, prefix.join("bin/pod_harness")).expect("link");
    assert!(
        prefix.join("bin/vgpu-ldconfig").is_file(),
        "vgpu install left out vgpu-ldconfig"
    );
    let debian = host.dir.path().join("debian");
    let libraries = unpack_debian_driver(&debian);
    let tools = debian.join("usr/lib/nvidia/current");
    assert!(tools.join("nvidia-smi").is_file(), "Debian's nvidia-smi");

    // In the prepared lib64: the sim in the real libraries' place (it reports the driver
    // version of its file name), and vgpu (`vgpu smi` as nvidia-smi) in Debian's
    // nvidia-smi's, which asks NVML for a private table the sim does not have.
    let sim = prefix.join("sim/lib64/libvgpu_sim.so");
    let vgpu = prefix.join("bin/vgpu");
    let after_prepare = format!(
        "for f in libcuda.so.{v} libnvidia-ml.so.{v}; do rm -f \"$f\" && cp '{sim}' \"$f\" || exit 1; done \
         && rm -f ../bin/nvidia-smi && cp '{vgpu}' ../bin/nvidia-smi",
        v = DEBIAN_DRIVER_VERSION,
        sim = sim.display(),
        vgpu = vgpu.display(),
    );
    let path = format!(
        "{}:{}",
        tools.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = host.dir.path().join("out");
    let mut command = Command::new("timeout");
    // Every step of the section has its own timeout (about 500 s at worst); this only
    // keeps a broken section from hanging the test run.
    command
        .args(["--kill-after=30", "1200", "bash"])
        .arg(repo_root().join("tests/gpu/run.sh"))
        .arg(&prefix)
        .arg("pod");
    host.apply(&mut command)
        .env("OUT", &out)
        .env("PATH", path)
        .env("POD_DRIVER_DIRS", &libraries)
        .env("POD_AFTER_PREPARE", after_prepare)
        .env("POD_VERIFY", "0")
        .env(
            "POD_EXTRA_ENV",
            "VGPU_SIM_GPUS=1 VGPU_SIM_MEMORY=80GiB VGPU_SIM_CONTEXT_OVERHEAD=64MiB \
             VGPU_SIM_STATE=/tmp/vgpu-sim.state",
        )
        .env_remove("PACK");
    let output = command.output().expect("run tests/gpu/run.sh");
    let shown = format!(
        "{}\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "run.sh: {shown}");
    let found = records(&out);

    let names: Vec<&str> = found.keys().map(String::as_str).collect();
    let mut expected = [
        "prepare",
        "allocate-30-60",
        "nvidia-smi-quota",
        "torch-oom",
        "ptx-module",
        "share-30-60",
        "allocate-50-50",
        "share-50-50",
    ];
    expected.sort();
    assert_eq!(names, expected, "the records written: {shown}");
    for (name, (verdict, figure, _)) in &found {
        assert!(
            ["PASS", "FAIL"].contains(&verdict.as_str()),
            "{name}: verdict {verdict:?} ({figure})"
        );
    }
    // What needs no real GPU passes: the driver folder, both admissions, the quota as
    // the prepared folder's nvidia-smi shows it in q30 (10 x 256 MiB), a PTX module
    // loaded and launched through the shim in a container.
    for name in [
        "prepare",
        "allocate-30-60",
        "allocate-50-50",
        "nvidia-smi-quota",
        "ptx-module",
    ] {
        let (verdict, figure, _) = &found[name];
        assert_eq!(verdict, "PASS", "{name}: {figure}");
    }
    // Both pairs ran under runc (each container's runc exit 0) and both containers of
    // each spun: a busy share each, whatever its figure (the sim's are not the card's).
    for (pair, containers) in [("30-60", ["q30", "p60"]), ("50-50", ["a50", "b50"])] {
        let (_, figure, record) = &found[&format!("share-{pair}")];
        assert!(
            figure.starts_with("busy share at once: ") && !figure.contains("no spin result"),
            "share-{pair}: {figure}"
        );
        assert_eq!(
            record["rc"],
            serde_json::json!([0, 0]),
            "share-{pair}: runc"
        );
        for container in containers {
            let spin = std::fs::read_to_string(out.join(format!("{container}-spin.txt")))
                .unwrap_or_else(|err| panic!("{container}-spin.txt: {err}"));
            let line = spin.lines().find(|line| line.starts_with('{'));
            let result: serde_json::Value =
                serde_json::from_str(line.unwrap_or_else(|| panic!("{container}: {spin}")))
                    .expect("streams' JSON line");
            assert!(
                result["completed"].as_u64().is_some_and(|n| n > 0),
                "{container} launched nothing: {spin}"
            );
        }
    }
    // PyTorch is not part of the plumbing: over the sim it has no CUDA build to run (and
    // is often not installed); its check is written and judged, nothing more.

    // The section left no mount behind: its work folder (named in prepare's figure) is
    // gone and nothing is mounted under it.
    let (_, prepare, _) = &found["prepare"];
    let work = prepare
        .split_whitespace()
        .next()
        .and_then(|path| path.strip_suffix("/pod/driver/current"))
        .unwrap_or_else(|| panic!("no work folder in prepare's figure: {prepare}"));
    assert!(!Path::new(work).exists(), "{work} was left behind");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(
        !mounts.contains(&format!("{work}/")),
        "mounts left under {work}"
    );
}
