//! What the real-container tests (runc_e2e, podman_cdi) share: their prerequisites (by
//! vgpu-test-support's policy: skipped outside CI, failed in CI), a prepared driver folder over
//! the simulated driver (the shims, the sim as the "real" libcuda/NVML, and a JIT helper
//! the sim loads by name as the real libcuda does), the sim-backed device source, and
//! an OCI runtime spec built from a container's merged Allocate response.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use serde_json::{Value, json};
use vgpu_kubelet_api::deviceplugin::ContainerAllocateResponse;
use vgpu_node_agent::config::NodeConfig;
use vgpu_node_agent::devices::{DeviceSource, NvmlSource};

/// The JIT helper's SONAME, as the real driver names it.
pub const JIT_HELPER: &str = "libnvidia-ptxjitcompiler.so.1";

use vgpu_test_support::Need;
pub use vgpu_test_support::built;
use vgpu_test_support::repo_root;

/// Checks what a real-container test needs: root, the container `runtime`, python3 with
/// pynvml and cuda-bindings, the shims and the sim driver built. False when something is
/// missing, by vgpu-test-support's one policy: a skip outside CI, a failure in CI.
pub fn prerequisites(runtime: &str) -> bool {
    let install = format!("apt-get install {runtime}");
    vgpu_test_support::present(&[
        Need::Root,
        Need::program(runtime, &install),
        Need::Python(&["pynvml", "cuda.bindings.driver"]),
        Need::Built("libcuda_shim.so"),
        Need::Built("libnvml_shim.so"),
        Need::Built("libvgpu_sim.so"),
    ])
}

/// (python3's executable, its `sys.prefix`).
pub fn python() -> (PathBuf, PathBuf) {
    let out = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable); print(sys.prefix)"])
        .output()
        .expect("python3");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut lines = text.lines();
    (
        PathBuf::from(lines.next().expect("executable")),
        PathBuf::from(lines.next().expect("prefix")),
    )
}

/// Fills `config`'s host driver folder as `vgpu-ldconfig prepare` would over the sim:
/// `lib64/libvgpu_sim.so` with `libcuda.so.1` and `libnvidia-ml.so.1` links, the JIT
/// helper (a real shared object with the real SONAME, built with `cc`) under a
/// versioned file name with its SONAME link, and the shims in `shim_dir`.
pub fn prepare_sim_driver(config: &NodeConfig) {
    let lib64 = config.host_driver_dir.join("lib64");
    std::fs::create_dir_all(&lib64).expect("lib64");
    std::fs::create_dir_all(&config.shim_dir).expect("shim dir");
    for shim in ["libcuda_shim.so", "libnvml_shim.so"] {
        std::fs::copy(built(shim).expect(shim), config.shim_dir.join(shim)).expect("copy shim");
    }
    let sim = built("libvgpu_sim.so").expect("libvgpu_sim.so");
    std::fs::copy(sim, lib64.join("libvgpu_sim.so")).expect("sim");
    for name in ["libcuda.so.1", "libnvidia-ml.so.1"] {
        std::os::unix::fs::symlink("libvgpu_sim.so", lib64.join(name)).expect("link");
    }
    let source = config.host_driver_dir.join("jit-helper.c");
    std::fs::write(&source, "int vgpu_jit_helper(void) { return 1; }\n").expect("source");
    let versioned = "libnvidia-ptxjitcompiler.so.580.0.1";
    let status = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(lib64.join(versioned))
        .arg(&source)
        .arg(format!("-Wl,-soname,{JIT_HELPER}"))
        .status()
        .expect("cc");
    assert!(status.success(), "cc built the JIT helper");
    std::os::unix::fs::symlink(versioned, lib64.join(JIT_HELPER)).expect("soname link");
}

/// The sim's NVML from the prepared folder, as the plugin's device source (2 cards).
pub fn sim_source(config: &mut NodeConfig) -> Arc<dyn DeviceSource> {
    // SAFETY: set before any thread of this test reads the environment for the sim.
    unsafe { std::env::set_var("VGPU_SIM_GPUS", "2") };
    config.nvml_library = config.host_driver_dir.join("lib64/libnvidia-ml.so.1");
    Arc::new(NvmlSource::open(&config.nvml_library).expect("sim NVML"))
}

/// Starts the plugin with `config` over a prepared sim driver and runs one container's
/// admission (`requests` in kubelet's order) and PreStartContainer.
pub async fn started_container(
    kubelet: &super::TestKubelet,
    mut config: NodeConfig,
    requests: &[(&str, usize)],
) -> (NodeConfig, super::Plugin, super::Admitted) {
    prepare_sim_driver(&config);
    let source = sim_source(&mut config);
    let mut plugin = super::Plugin::start(kubelet, config.clone(), source).await;
    let admitted = kubelet
        .admit(&mut plugin, "default", "e2e", "cuda", requests)
        .await
        .expect("admitted");
    kubelet
        .start_container(&mut plugin, &admitted)
        .await
        .expect("PreStart");
    (config, plugin, admitted)
}

/// The env a container of the tests runs with beside the response's: the image's own
/// `LD_LIBRARY_PATH` (it must arrive unchanged), the sim's knobs, the script folder.
pub fn image_env() -> Vec<String> {
    vec![
        "PATH=/usr/local/bin:/usr/bin:/bin".into(),
        "LD_LIBRARY_PATH=/opt/image/lib".into(),
        "VGPU_SIM_GPUS=2".into(),
        format!("VGPU_SIM_PTX_JIT_LIBRARY={JIT_HELPER}"),
        "VGPU_TESTS_GPU=/vgpu-tests/gpu".into(),
        "CHECK_NVML=1".into(),
    ]
}

/// A read-only or read-write bind mount of an OCI spec.
pub fn bind(destination: &str, source: &Path, read_only: bool) -> Value {
    let mut options = vec!["rbind", "nosuid"];
    if read_only {
        options.push("ro");
    }
    json!({ "destination": destination, "type": "bind", "source": source, "options": options })
}

/// (type, major, minor) of a host device node.
fn node_numbers(path: &Path) -> Option<(&'static str, u64, u64)> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let meta = std::fs::metadata(path).ok()?;
    let kind = if meta.file_type().is_char_device() {
        "c"
    } else if meta.file_type().is_block_device() {
        "b"
    } else {
        return None;
    };
    Some((
        kind,
        libc::major(meta.rdev()) as u64,
        libc::minor(meta.rdev()) as u64,
    ))
}

/// An OCI runtime spec for runc: `rootfs` (inside the bundle), `/proc`, a tmpfs
/// `/dev` and `/tmp`, then `base_mounts`, then exactly the response's mounts, devices
/// (numbers read from the host nodes) and env, plus `env`.
pub fn runtime_spec(
    response: &ContainerAllocateResponse,
    rootfs: &str,
    base_mounts: Vec<Value>,
    env: &[String],
    args: &[String],
) -> Value {
    let mut mounts = vec![
        json!({ "destination": "/proc", "type": "proc", "source": "proc" }),
        json!({ "destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"] }),
        json!({ "destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev"] }),
    ];
    mounts.extend(base_mounts);
    for mount in &response.mounts {
        mounts.push(bind(
            &mount.container_path,
            Path::new(&mount.host_path),
            mount.read_only,
        ));
    }
    let devices: Vec<Value> = response
        .devices
        .iter()
        .map(|device| {
            let (kind, major, minor) =
                node_numbers(Path::new(&device.host_path)).unwrap_or(("c", 195, 0));
            json!({ "path": device.container_path, "type": kind, "major": major, "minor": minor, "fileMode": 0o666 })
        })
        .collect();
    let resources: Vec<Value> = devices
        .iter()
        .map(|device| json!({ "allow": true, "type": device["type"], "major": device["major"], "minor": device["minor"], "access": "rwm" }))
        .collect();
    let mut all_env: Vec<String> = response
        .envs
        .iter()
        .map(|(key, value)| format!("{key}={value}"))
        .collect();
    all_env.extend(env.iter().cloned());
    json!({
        "ociVersion": "1.0.2",
        "process": { "terminal": false, "user": { "uid": 0, "gid": 0 }, "args": args, "env": all_env, "cwd": "/" },
        "root": { "path": rootfs, "readonly": false },
        "hostname": "vgpu-e2e",
        "mounts": mounts,
        "linux": {
            "namespaces": [{ "type": "pid" }, { "type": "mount" }, { "type": "ipc" }, { "type": "uts" }],
            "devices": devices,
            "resources": { "devices": resources },
        }
    })
}

/// Runs the bundle with runc (deleted afterwards): (success, stdout, stderr).
pub fn runc_run(bundle: &Path, id: &str) -> (bool, String, String) {
    let output = Command::new("runc")
        .args(["run", "--bundle"])
        .arg(bundle)
        .arg(id)
        .output()
        .expect("runc runs");
    let _ = Command::new("runc")
        .args(["delete", "--force", id])
        .output();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// sha256 of a file, as `sha256sum` prints it.
pub fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("sha256sum");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// What the in-container check (`container_check.py`) printed, checked: the quota
/// config and env, the shims over every library folder, the JIT helper found by name in
/// a shim folder, the image's `LD_LIBRARY_PATH` intact, pynvml's total at the quota and
/// PTX loading only with the helper the layout provides.
pub fn assert_container_saw_its_quota(config: &NodeConfig, stdout: &str, stderr: &str) {
    let line = |prefix: &str| {
        stdout
            .lines()
            .find(|line| line.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} line: {stdout}\n{stderr}"))
            .to_string()
    };
    let config_line = line("CONFIG ");
    assert!(
        config_line.contains("memory_limit: 2560MiB")
            && config_line.contains("core_limit: 30")
            && config_line.contains("container_id: a"),
        "{config_line}"
    );
    assert_eq!(
        line("ENV "),
        "ENV /etc/vgpu/vgpu.yaml void /opt/image/lib",
        "the image keeps its own LD_LIBRARY_PATH"
    );
    let cuda = sha256(&config.shim_dir.join("libcuda_shim.so"));
    let nvml = sha256(&config.shim_dir.join("libnvml_shim.so"));
    let libs: Vec<&str> = stdout.lines().filter(|l| l.starts_with("LIB ")).collect();
    assert_eq!(libs.len(), 3, "{stdout}\n{stderr}");
    for lib in libs {
        assert!(
            lib.ends_with(&format!("{cuda} {nvml}")),
            "the shims are mounted: {lib}"
        );
    }
    let helper = line("HELPER ");
    assert!(
        [
            "/usr/lib/x86_64-linux-gnu",
            "/usr/lib64",
            "/usr/local/nvidia/lib64"
        ]
        .iter()
        .any(|dir| helper == format!("HELPER {dir}/{JIT_HELPER}")),
        "the loader finds the driver's helper by name: {helper}"
    );
    assert_eq!(
        line("TOTAL "),
        "TOTAL 2684354560",
        "pynvml sees the quota as total memory"
    );
    assert_eq!(
        line("PTX_MISSING "),
        "PTX_MISSING CUDA_ERROR_JIT_COMPILER_NOT_FOUND",
        "without its helper the driver cannot JIT (the H200's 221)"
    );
    assert_eq!(
        line("PTX "),
        "PTX CUDA_SUCCESS launched",
        "PTX loads through the helper the layout mounts"
    );
}

/// A bundle in `root/<name>` that runs `args` (python3's executable first) over the
/// host's `/usr` (an overlay, so runc may create mount targets), python's prefix, the
/// repository's `tests/` at `/vgpu-tests`, then exactly `response`'s mounts, devices
/// and env with `env`. Returns the bundle folder.
pub fn python_bundle(
    root: &Path,
    name: &str,
    response: &ContainerAllocateResponse,
    env: &[String],
    script_args: &[&str],
) -> PathBuf {
    let bundle = root.join(name);
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
        json!({ "destination": "/usr", "type": "overlay", "source": "overlay", "options": [
            "lowerdir=/usr",
            format!("upperdir={}", bundle.join("upper").display()),
            format!("workdir={}", bundle.join("overlay-work").display()),
        ]}),
    ];
    let (executable, prefix) = python();
    if !prefix.starts_with("/usr") {
        base.push(bind(&prefix.to_string_lossy(), &prefix, true));
    }
    base.push(bind("/vgpu-tests", &repo_root().join("tests"), true));
    let mut args = vec![executable.to_string_lossy().into_owned()];
    args.extend(script_args.iter().map(|arg| arg.to_string()));
    let spec = runtime_spec(response, "rootfs", base, env, &args);
    std::fs::write(
        bundle.join("config.json"),
        serde_json::to_vec_pretty(&spec).expect("json"),
    )
    .expect("config.json");
    bundle
}
