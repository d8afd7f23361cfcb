//! Issue 27 over the simulated driver, through the real shims under
//! `vgpu run --simulate`: a refused allocation is counted in the container's usage
//! region (refusals, bytes refused, what was asked, what the container held), the
//! counters outlive the process, the shim's warning line appears only when the config
//! asks for it (`--warn-on-refusal`), and `vgpu top --once --json` shows the container.

use std::path::Path;

use vgpu_common::snapshot::RegionSnapshot;
use vgpu_tests::{SimHost, shim_notices};

const MIB: u64 = 1 << 20;

fn counters(state: &Path) -> vgpu_common::region::QuotaCounters {
    RegionSnapshot::read(&state.join("usage.region"))
        .expect("the container's region")
        .counters(0)
}

#[test]
fn a_refusal_is_counted_in_the_region_and_warned_only_when_asked() {
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
