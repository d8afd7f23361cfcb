//! A real container end to end: the plugin (against the stand-in kubelet, over the
//! simulated driver) allocates 30 cores and 10 memory units as kubelet asks for them,
//! PreStartContainer writes the config, and an OCI bundle whose mounts, devices and env
//! are exactly the merged Allocate responses is run with `runc`. Inside, the shims must
//! sit over `libcuda.so.1`/`libnvidia-ml.so.1`, the driver's JIT helper must be found by
//! name (PTX loads; with the helper's name unknown it fails with 221, as on the H200
//! before the helpers were mounted), the image's `LD_LIBRARY_PATH` must arrive
//! unchanged, the config must carry the quota and pynvml must see 2560MiB total.
//!
//! Needs root, `runc`, `cc`, overlayfs, python3 with pynvml and cuda-bindings, and the
//! shims and sim driver in `target/<profile>/`. Missing prerequisites skip the test
//! here and fail it on CI.

mod common;

use common::e2e::{self, bind};
use common::{CORE, MEMORY, TestKubelet};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_sees_its_quota_through_the_shims() {
    if !e2e::prerequisites("runc") {
        return;
    }
    let kubelet = TestKubelet::start().await;
    let (config, plugin, admitted) = e2e::started_container(
        &kubelet,
        kubelet.plugin_config(),
        &[(CORE, 30), (MEMORY, 10)],
    )
    .await;
    let response = admitted.merged();

    // The bundle: host /usr through an overlay (so runc may create mount targets), the
    // usual top-level links, python's prefix and the test scripts, then exactly the
    // plugin's mounts.
    let bundle = kubelet.root.path().join("bundle");
    let rootfs = bundle.join("rootfs");
    for dir in ["rootfs", "upper", "overlay-work"] {
        std::fs::create_dir_all(bundle.join(dir)).expect("bundle dir");
    }
    for (link, target) in [
        ("bin", "usr/bin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
        ("sbin", "usr/sbin"),
    ] {
        std::os::unix::fs::symlink(target, rootfs.join(link)).expect("rootfs link");
    }
    let mut base = vec![
        serde_json::json!({ "destination": "/usr", "type": "overlay", "source": "overlay", "options": [
            "lowerdir=/usr",
            format!("upperdir={}", bundle.join("upper").display()),
            format!("workdir={}", bundle.join("overlay-work").display()),
        ]}),
    ];
    let (executable, prefix) = e2e::python();
    if !prefix.starts_with("/usr") {
        base.push(bind(&prefix.to_string_lossy(), &prefix, true));
    }
    base.push(bind(
        "/vgpu-tests",
        &vgpu_test_support::repo_root().join("tests"),
        true,
    ));
    base.push(bind(
        "/vgpu-check",
        &vgpu_test_support::repo_root().join("plugin/tests"),
        true,
    ));
    let args = vec![
        executable.to_string_lossy().into_owned(),
        "/vgpu-check/container_check.py".to_string(),
    ];
    let spec = e2e::runtime_spec(&response, "rootfs", base, &e2e::image_env(), &args);
    std::fs::write(
        bundle.join("config.json"),
        serde_json::to_vec_pretty(&spec).expect("json"),
    )
    .expect("config.json");
    let (ok, stdout, stderr) = e2e::runc_run(&bundle, &format!("vgpu-e2e-{}", std::process::id()));
    assert!(ok, "runc failed: {stdout}\n{stderr}");
    e2e::assert_container_saw_its_quota(&config, &stdout, &stderr);
    plugin.handle.stop().await;
}
