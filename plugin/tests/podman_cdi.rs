//! A podman container started from a real Allocate through its CDI spec alone: the
//! plugin runs with `device_list_strategy: cdi` against the stand-in kubelet over the
//! simulated driver, so the Allocate responses carry no mounts, only the CDI device
//! names; podman 4.3 (Debian's) resolves them from the spec files the plugin wrote in
//! `/var/run/cdi` (one of the two folders its CDI library reads; it has no option for
//! another) and applies their mounts, env and device nodes. Inside, the container must
//! see its quota (pynvml: 2560MiB total), the shims, the driver's JIT helper by name,
//! the device nodes and the image's own `LD_LIBRARY_PATH`.
//!
//! The CDI kind is unique to this run (`vgpu-e2e.test/p<pid>`), so no other spec in
//! `/var/run/cdi` is touched, and its spec files are removed at the end. Podman runs
//! here only with `default_ulimits = []` (a containers.conf named by CONTAINERS_CONF,
//! which also picks runc as its OCI runtime);
//! the rootfs is the machine's own `/` under an overlay (`--rootfs /:O`), so nothing is
//! pulled and the host is not written. Needs root, podman, cc, python3 with pynvml and
//! cuda-bindings, and the shims and sim driver built; a missing one skips the test here
//! and fails it on CI.

mod common;

use std::path::Path;
use std::process::Command;

use common::e2e;
use common::{CORE, MEMORY, TestKubelet};
use vgpu_node_agent::config::DeviceListStrategy;

/// Removes this run's spec files however the test ends.
struct Specs(vgpu_node_agent::cdi::SpecWriter);

impl Drop for Specs {
    fn drop(&mut self) {
        for name in self.0.names() {
            let _ = self.0.remove(&name);
        }
    }
}

/// A character device node at `path` with the numbers of /dev/null (safe to open).
fn make_node(path: &Path) {
    let name = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: mknod of a NUL-terminated path in our temp folder; makedev has no
    // preconditions.
    let made = unsafe { libc::mknod(name.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) };
    assert_eq!(made, 0, "mknod {}", path.display());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_podman_container_gets_its_quota_from_the_cdi_spec() {
    if !e2e::prerequisites("podman") {
        return;
    }
    let kubelet = TestKubelet::start().await;
    let mut config = kubelet.plugin_config();
    config.device_list_strategy = DeviceListStrategy::Cdi;
    config.cdi_kind = format!("vgpu-e2e.test/p{}", std::process::id());
    config.cdi_spec_dir = vgpu_node_agent::cdi::DEFAULT_SPEC_DIR.into();
    let _cleanup = Specs(config.cdi_writer().expect("kind"));
    // Device nodes the plugin hands out, so the spec's deviceNodes are exercised.
    std::fs::create_dir_all(&config.dev_root).expect("dev root");
    for node in ["nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"] {
        make_node(&config.dev_root.join(node));
    }
    let (config, plugin, admitted) =
        e2e::started_container(&kubelet, config, &[(MEMORY, 10), (CORE, 30)]).await;
    let response = admitted.merged();
    assert!(
        response.mounts.is_empty() && response.envs.is_empty() && response.devices.is_empty(),
        "with the cdi strategy everything comes through the spec"
    );
    let names: Vec<String> = response
        .cdi_devices
        .iter()
        .map(|device| device.name.clone())
        .collect();
    assert_eq!(
        names.len(),
        2,
        "one CDI device per Allocate call: {names:?}"
    );
    for name in &names {
        let id = name
            .strip_prefix(&format!("{}=", config.cdi_kind))
            .expect("our kind");
        let spec =
            vgpu_node_agent::cdi::Spec::load(&config.cdi_writer().expect("kind").path_of(id))
                .expect("spec file");
        assert_eq!(spec.cdi_version, "0.5.0", "podman 4.3 reads up to 0.5.0");
    }

    let work = kubelet.root.path();
    std::fs::write(
        work.join("containers.conf"),
        // runc, not crun: crun refuses a host with cgroup v1 controllers beside a
        // cgroup2 mount that has some ("hybrid mode").
        "[containers]\ndefault_ulimits = []\n[engine]\nruntime = \"runc\"\n",
    )
    .expect("containers.conf");
    let (executable, _) = e2e::python();
    let mut command = Command::new("podman");
    command
        .env("CONTAINERS_CONF", work.join("containers.conf"))
        .args(["run", "--rm", "--network", "none"]);
    for name in &names {
        command.args(["--device", name]);
    }
    for assignment in e2e::image_env() {
        command.args(["--env", &assignment]);
    }
    command.args([
        "--volume",
        &format!(
            "{}:/vgpu-tests:ro",
            vgpu_test_support::repo_root().join("tests").display()
        ),
        "--volume",
        &format!(
            "{}:/vgpu-check:ro",
            vgpu_test_support::repo_root()
                .join("plugin/tests")
                .display()
        ),
    ]);
    // `--rootfs` is a flag: the rootfs takes the image's place, just before the command.
    command
        .args(["--rootfs", "/:O"])
        .arg(&executable)
        .arg("/vgpu-check/container_check.py");
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("join")
        .expect("podman runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "podman failed: {stdout}\n{stderr}");
    e2e::assert_container_saw_its_quota(&config, &stdout, &stderr);
    let nodes: Vec<&str> = stdout.lines().filter(|l| l.starts_with("NODE ")).collect();
    for node in ["/dev/nvidiactl", "/dev/nvidia-uvm"] {
        assert!(
            nodes.contains(&format!("NODE {node} c 1 3").as_str()),
            "{node} from the spec's deviceNodes: {nodes:?}"
        );
    }
    assert!(
        nodes
            .iter()
            .any(|l| l.starts_with("NODE /dev/nvidia0 c 1 3")
                || l.starts_with("NODE /dev/nvidia1 c 1 3")),
        "the card's node: {nodes:?}"
    );
    // GC removes an allocation's specs with it.
    kubelet.clear_pods();
    let collected = vgpu_plugin::daemon::collect_garbage(plugin.handle.shared())
        .await
        .expect("gc");
    assert_eq!(collected, 1);
    assert!(
        config.cdi_writer().expect("kind").names().is_empty(),
        "the container's specs went with its allocation"
    );
    plugin.handle.stop().await;
}
