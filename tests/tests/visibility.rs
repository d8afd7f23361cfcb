//! Issue 27 over the simulated driver, through the real shims under
//! `vgpu run --simulate`: a refused allocation is counted in the container's usage
//! region (refusals, bytes refused, what was asked, what the container held), the
//! counters outlive the process, the shim's warning line appears only when the config
//! asks for it (`--warn-on-refusal`), and `vgpu top --once --json` shows the container.

use std::path::Path;

use vgpu_contract::snapshot::RegionSnapshot;
use vgpu_tests::{SimHost, shim_notices};

const MIB: u64 = 1 << 20;

fn counters(state: &Path) -> vgpu_contract::region::QuotaCounters {
    RegionSnapshot::read(&state.join("usage.region"))
        .expect("the container's region")
        .counters(0)
}

#[test]
fn a_refusal_is_counted_in_the_region_and_warned_only_when_asked() {
    vgpu_test_support::require!(vgpu_test_support::Need::Namespaces);
    let host = SimHost::new(1);
    let state = host.dir.path().join("container");
    let state_arg = state.to_str().expect("utf-8");
    let probe = vgpu_tests::vgpu();
    let probe = probe.to_str().expect("utf-8");
    let quiet = host.run(
        &["--memory", "1GiB", "--state-dir", state_arg, "--keep"],
        &[probe, "probe", "--alloc", "700MiB", "--alloc", "700MiB"],
    );
    let stderr = String::from_utf8_lossy(&quiet.stderr);
    assert!(quiet.status.success(), "{stderr}");
    assert!(
        shim_notices(&stderr).is_empty(),
        "logging is off by default: {stderr}"
    );
    let first = counters(&state);
    assert_eq!(first.refusals, 1, "{first:?}");
    assert_eq!(first.refused_bytes, 700 * MIB);
    assert_eq!(first.last_asked, 700 * MIB);
    // The context (64 MiB in the sim) and the first 700 MiB.
    assert_eq!(first.last_held, 764 * MIB, "{first:?}");

    // The same container again, with the warning line on: one line that says the quota,
    // what was asked and what the container holds; the counters go on from 1.
    let loud = host.run(
        &[
            "--memory",
            "1GiB",
            "--state-dir",
            state_arg,
            "--keep",
            "--warn-on-refusal",
        ],
        &[probe, "probe", "--alloc", "900MiB", "--alloc", "300MiB"],
    );
    let stderr = String::from_utf8_lossy(&loud.stderr);
    assert!(loud.status.success(), "{stderr}");
    let lines = shim_notices(&stderr);
    assert_eq!(lines.len(), 1, "{stderr}");
    for part in [
        "CUDA_ERROR_OUT_OF_MEMORY",
        "refused 300.0 MiB",
        "memory quota of 1024.0 MiB",
        "it holds 964.0 MiB",
    ] {
        assert!(lines[0].contains(part), "{part:?} not in {}", lines[0]);
    }
    let second = counters(&state);
    assert_eq!(second.refusals, 2, "{second:?}");
    assert_eq!(second.refused_bytes, 1000 * MIB);
    assert_eq!(second.throttled_ns, 0, "no compute limit, no wait");
}

/// Two `vgpu run`s on the one simulated card, each holding memory, and `vgpu top --once
/// --json` run under a third `vgpu run --simulate`: both containers on that card, with
/// their quotas, what they hold, their refusals and their processes.
#[test]
fn vgpu_top_shows_two_containers_on_one_simulated_card() {
    vgpu_test_support::require!(vgpu_test_support::Need::Namespaces);
    let host = SimHost::new(1);
    let host_dir = host.dir.path().join("host");
    let vgpu = vgpu_tests::vgpu();
    let spawn = |name: &str, quota: &[&str], allocs: &[&str]| {
        let mut command = std::process::Command::new(&vgpu);
        let state = host.dir.path().join(name);
        command
            .args(["run", "--simulate", "--state-dir"])
            .arg(&state)
            .args(quota)
            .arg("--")
            .arg(&vgpu)
            .arg("probe");
        for size in allocs {
            command.args(["--alloc", size]);
        }
        command
            .args(["--hold", "30"])
            .env("VGPU_HOST_DIR", &host_dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        host.apply(&mut command);
        (command.spawn().expect("spawn vgpu run"), state)
    };
    let (mut trainer, trainer_dir) = spawn(
        "trainer",
        &["--memory", "4GiB", "--cores", "30"],
        &["3GiB", "2GiB"],
    );
    let (mut notebook, notebook_dir) = spawn(
        "notebook",
        &["--memory", "2GiB", "--cores", "50", "--core-mode", "soft"],
        &["1GiB"],
    );
    // Until both hold their memory (what the sim's clock does not govern: the runs
    // start in real time).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let holding = |dir: &Path, bytes: u64| {
        RegionSnapshot::read(&dir.join("usage.region")).is_ok_and(|r| r.device_used(0) >= bytes)
    };
    while !(holding(&trainer_dir, 3 << 30) && holding(&notebook_dir, 1 << 30)) {
        assert!(
            std::time::Instant::now() < deadline,
            "the runs never held their memory"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let mut command = std::process::Command::new(&vgpu);
    command
        .args(["run", "--simulate", "--"])
        .arg(&vgpu)
        .args(["top", "--once", "--json", "--plugin-state-dir"])
        .arg(host.dir.path().join("no-plugin"))
        .env("VGPU_HOST_DIR", &host_dir);
    host.apply(&mut command);
    let output = command.output().expect("vgpu top");
    for child in [&mut trainer, &mut notebook] {
        let _ = child.kill();
        let _ = child.wait();
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let view: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    let cards = view["cards"].as_array().expect("cards");
    assert_eq!(cards.len(), 1, "{view}");
    let card = &cards[0];
    assert_eq!(card["uuid"], "GPU-51d00000-0000-4000-8000-000000000001");
    assert_eq!(card["memory_total_bytes"], 80u64 << 30);
    let containers = card["containers"].as_array().expect("containers");
    assert_eq!(containers.len(), 2, "{view}");
    let named = |prefix: &str| {
        containers
            .iter()
            .find(|c| c["id"].as_str().is_some_and(|id| id.starts_with(prefix)))
            .unwrap_or_else(|| panic!("no {prefix}: {view}"))
            .clone()
    };
    let trainer = named("run-trainer-");
    assert_eq!(trainer["memory_limit_bytes"], 4u64 << 30);
    assert_eq!(trainer["memory_used_bytes"], (64u64 << 20) + (3u64 << 30));
    assert_eq!(trainer["core_limit"], 30);
    assert_eq!(trainer["core_mode"], "hard");
    assert_eq!(trainer["refusals"], 1, "the 2 GiB past its quota");
    assert_eq!(trainer["refused_bytes"], 2u64 << 30);
    assert_eq!(trainer["processes"].as_array().map(Vec::len), Some(1));
    let notebook = named("run-notebook-");
    assert_eq!(notebook["memory_limit_bytes"], 2u64 << 30);
    assert_eq!(notebook["core_mode"], "soft");
    assert_eq!(notebook["refusals"], 0);
    assert_eq!(
        card["memory_used_by_containers_bytes"],
        (128u64 << 20) + (4u64 << 30)
    );
}
