//! The image `deploy/build-image.sh` builds (once per test run), run with podman as a
//! node runs it:
//! * the shims and every binary in it load under glibc 2.17 (no symbol version above
//!   GLIBC_2.17) and the shims still export every name of the real drivers;
//! * the plugin from the image, against the stand-in kubelet (its folders bind-mounted
//!   at the same paths), registers both resources and answers an Allocate;
//! * the init container's own command and security context from
//!   `deploy/vgpu-plugin.yaml` prepare the driver folder from a host built of Debian's
//!   535 packages mounted read-only at /host: no privilege, no capability, a read-only
//!   root file system.
//!
//! Needs root, podman, debootstrap and cargo-zigbuild, and the last one Debian's driver
//! packages (tests/run.sh installs them all); by vgpu-test-support's policy a missing one
//! fails in CI and skips elsewhere.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

use common::{TestKubelet, allocate, list_ids, plugin_client};
use serde_json::Value;
use vgpu_test_support::Need;
use vgpu_test_support::repo_root;

/// podman, with the CI machine's containers.conf unless the caller chose one.
fn podman(args: &[&str]) -> Output {
    let mut command = Command::new("podman");
    if std::env::var_os("CONTAINERS_CONF").is_none() {
        command.env(
            "CONTAINERS_CONF",
            repo_root().join("tests/podman-containers.conf"),
        );
    }
    command.args(args).output().expect("run podman")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Whether cargo-zigbuild runs, on `PATH` or in python3's scripts folder (where
/// `pip install cargo-zigbuild` puts it), as deploy/build-image.sh looks for it.
fn has_zigbuild() -> bool {
    let runs = |program: &Path| {
        Command::new(program)
            .arg("--version")
            .output()
            .is_ok_and(|out| out.status.success())
    };
    let scripts = Command::new("python3")
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_path('scripts'))",
        ])
        .output()
        .ok()
        .map(|out| PathBuf::from(text(&out.stdout).trim()).join("cargo-zigbuild"));
    runs(Path::new("cargo-zigbuild")) || scripts.is_some_and(|path| runs(&path))
}

/// What the image tests need, by vgpu-test-support's one policy (a skip outside CI, a
/// failure in CI).
fn prerequisites() -> bool {
    vgpu_test_support::present(&[
        Need::Root,
        Need::program("podman", "apt-get install podman"),
        Need::Program {
            name: "debootstrap",
            probe: "--help",
            install: "apt-get install debootstrap",
        },
        Need::Other {
            what: "cargo-zigbuild with zig",
            present: has_zigbuild(),
            install: "python3 -m pip install ziglang cargo-zigbuild",
        },
    ])
}

/// The image reference, built once for every test of this file; `None` to skip.
fn image() -> Option<&'static str> {
    static IMAGE: OnceLock<Result<String, String>> = OnceLock::new();
    if !prerequisites() {
        return None;
    }
    let built = IMAGE.get_or_init(|| {
        let mut command = Command::new("bash");
        command.arg(repo_root().join("deploy/build-image.sh"));
        if std::env::var_os("CONTAINERS_CONF").is_none() {
            command.env(
                "CONTAINERS_CONF",
                repo_root().join("tests/podman-containers.conf"),
            );
        }
        let output = command.output().expect("run deploy/build-image.sh");
        if !output.status.success() {
            let stderr = text(&output.stderr);
            let lines: Vec<&str> = stderr.lines().collect();
            let tail = lines[lines.len().saturating_sub(40)..].join("\n");
            return Err(format!("deploy/build-image.sh failed:\n{tail}"));
        }
        let stdout = text(&output.stdout);
        Ok(stdout.lines().last().unwrap_or_default().to_string())
    });
    match built {
        Ok(reference) => Some(reference.as_str()),
        Err(why) => panic!("{why}"),
    }
}

/// A container removed when the test ends, however it ends.
struct Running(String);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = podman(&["rm", "--force", "--time", "2", &self.0]);
    }
}

/// `/usr/local/vgpu` of the image, copied out.
fn copy_out(image: &str, into: &Path) -> PathBuf {
    std::fs::create_dir_all(into).expect("mkdir");
    // The tests of this file run at once in one process: the name must differ per call.
    static COPIES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let copy = COPIES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = format!("vgpu-image-copy-{}-{copy}", std::process::id());
    let created = podman(&["create", "--name", &name, image, "true"]);
    assert!(created.status.success(), "{}", text(&created.stderr));
    let _cleanup = Running(name.clone());
    let copied = podman(&[
        "cp",
        &format!("{name}:/usr/local/vgpu"),
        &into.to_string_lossy(),
    ]);
    assert!(copied.status.success(), "{}", text(&copied.stderr));
    into.join("vgpu")
}

/// The highest GLIBC_x.y symbol version an ELF file needs (objdump -T).
fn max_glibc(file: &Path) -> (u32, u32) {
    let output = Command::new("objdump")
        .arg("-T")
        .arg(file)
        .output()
        .expect("objdump (binutils)");
    assert!(output.status.success(), "objdump -T {}", file.display());
    text(&output.stdout)
        .split("GLIBC_")
        .skip(1)
        .filter_map(|rest| {
            let version: String = rest
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '.')
                .collect();
            let mut parts = version
                .split('.')
                .filter_map(|part| part.parse::<u32>().ok());
            Some((parts.next()?, parts.next().unwrap_or(0)))
        })
        .max()
        .unwrap_or((0, 0))
}

fn nm_exports(lib: &Path) -> BTreeSet<String> {
    let output = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(lib)
        .output()
        .expect("nm");
    assert!(output.status.success(), "nm {}", lib.display());
    text(&output.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().last().map(str::to_string))
        .collect()
}

/// The union of `symbols/<stem>*.txt`.
fn export_lists(stem: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for entry in std::fs::read_dir(repo_root().join("symbols"))
        .expect("symbols")
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(stem) && name.ends_with(".txt") {
            let list = vgpu_ldconfig::exports::read_symbol_list(&entry.path()).expect("list");
            names.extend(list);
        }
    }
    names
}

#[test]
fn everything_in_the_image_loads_under_glibc_2_17_and_the_shims_export_every_name() {
    let Some(image) = image() else { return };
    let work = tempfile::tempdir().expect("tempdir");
    let prefix = copy_out(image, work.path());
    let mut elves = vec![
        prefix.join("shim/libcuda_shim.so"),
        prefix.join("shim/libnvml_shim.so"),
        prefix.join("sim/lib64/libvgpu_sim.so"),
    ];
    for binary in ["vgpu", "vgpu-plugin", "vgpu-ldconfig"] {
        elves.push(prefix.join("bin").join(binary));
    }
    for elf in &elves {
        let needed = max_glibc(elf);
        assert!(
            needed <= (2, 17),
            "{} needs GLIBC_{}.{}, above the 2.17 floor",
            elf.display(),
            needed.0,
            needed.1
        );
    }
    let cuda = nm_exports(&prefix.join("shim/libcuda_shim.so"));
    assert_eq!(
        cuda,
        export_lists("libcuda.so."),
        "the CUDA shim exports exactly the drivers' names"
    );
    let nvml = nm_exports(&prefix.join("shim/libnvml_shim.so"));
    for list in ["libnvidia-ml.so.", "nvidia-smi-"] {
        let missing: Vec<String> = export_lists(list).difference(&nvml).cloned().collect();
        assert!(missing.is_empty(), "the NVML shim lacks {missing:?}");
    }
    // The installed lib64/ copies are the same shims, and they keep their special link.
    for (shim, soname) in [
        ("libcuda_shim.so", "libcuda.so.1"),
        ("libnvml_shim.so", "libnvidia-ml.so.1"),
    ] {
        assert_eq!(
            std::fs::read(prefix.join("shim").join(shim)).expect("shim"),
            std::fs::read(prefix.join("lib64").join(soname)).expect("installed"),
        );
        assert_eq!(
            vgpu_ldconfig::soname(&prefix.join("shim").join(shim))
                .expect("soname")
                .as_deref(),
            Some(soname)
        );
        let dynamic = Command::new("readelf")
            .arg("-d")
            .arg(prefix.join("shim").join(shim))
            .output()
            .expect("readelf");
        let dynamic = text(&dynamic.stdout);
        assert!(
            dynamic.contains("SYMBOLIC") && dynamic.contains("NODELETE"),
            "{dynamic}"
        );
    }
    // Every binary answers --version with the workspace version and this commit.
    for binary in ["vgpu", "vgpu-plugin", "vgpu-ldconfig"] {
        let output = podman(&[
            "run",
            "--rm",
            "--network",
            "none",
            image,
            binary,
            "--version",
        ]);
        assert!(output.status.success(), "{}", text(&output.stderr));
        assert_eq!(
            text(&output.stdout).trim(),
            format!("{binary} {}", vgpu_build_info::VERSION_LINE)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plugin_from_the_image_registers_and_answers_an_allocate() {
    // Checked here too: `image()` below runs on a blocking thread, not the test's.
    if !prerequisites() {
        return;
    }
    let Some(image) = tokio::task::spawn_blocking(image).await.expect("build") else {
        return;
    };
    let kubelet = TestKubelet::start().await;
    let root = kubelet.root.path();
    let config = root.join("plugin.yaml");
    std::fs::write(
        &config,
        format!(
            "device_plugin_dir: {}\npod_resources_socket: {}\nstate_dir: {}\nhost_driver_dir: {}\nnvml_library: /usr/local/vgpu/sim/lib64/libnvidia-ml.so.1\nkubelet_watch_interval_ms: 100\nmetrics_address: 127.0.0.1:9401\n",
            kubelet.device_plugin_dir().display(),
            kubelet.pod_resources_socket().display(),
            root.join("vgpu").display(),
            root.join("vgpu/driver").display(),
        ),
    )
    .expect("config");
    let name = format!("vgpu-image-plugin-{}", std::process::id());
    let volume = format!("{}:{}", root.display(), root.display());
    let started = podman(&[
        "run",
        "--detach",
        "--name",
        &name,
        "--network",
        "none",
        "--volume",
        &volume,
        "--env",
        "VGPU_SIM_GPUS=2",
        "--env",
        &format!("VGPU_SIM_STATE={}", root.join("sim.state").display()),
        image,
        "vgpu-plugin",
        "--config",
        &config.to_string_lossy(),
    ]);
    assert!(started.status.success(), "{}", text(&started.stderr));
    let container = Running(name.clone());
    for _ in 0..300 {
        if kubelet.registrations().len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let logs = || text(&podman(&["logs", &name]).stderr);
    let mut names: Vec<String> = kubelet
        .registrations()
        .iter()
        .map(|r| r.resource_name.clone())
        .collect();
    names.sort();
    assert_eq!(names, [common::CORE, common::MEMORY], "{}", logs());

    let mut cores = plugin_client(&kubelet.device_plugin_dir().join("vgpu-vcuda-core.sock")).await;
    let mut memory =
        plugin_client(&kubelet.device_plugin_dir().join("vgpu-vcuda-memory.sock")).await;
    let core_ids = list_ids(&mut cores).await;
    assert_eq!(core_ids.len(), 200, "two simulated cards, 100 cores each");
    let response = allocate(&mut cores, &core_ids[..30])
        .await
        .expect("Allocate");
    assert_eq!(response.annotations["tencent.com/vcuda-core"], "30");
    assert!(
        response
            .mounts
            .iter()
            .any(|mount| mount.container_path == "/usr/local/vgpu/driver"),
        "{response:?}"
    );
    assert_eq!(response.envs["VGPU_CONFIG"], "/etc/vgpu/vgpu.yaml");
    let memory_ids = list_ids(&mut memory).await;
    let joined = allocate(&mut memory, &memory_ids[..4])
        .await
        .expect("Allocate memory");
    assert_eq!(joined.annotations["tencent.com/vcuda-memory"], "4");
    assert!(
        logs().contains(&vgpu_build_info::banner("vgpu-plugin")),
        "{}",
        logs()
    );

    // SIGTERM: a clean stop that removes the sockets.
    let stopped = podman(&["stop", "--time", "10", &name]);
    assert!(stopped.status.success(), "{}", text(&stopped.stderr));
    let exit = podman(&["inspect", "--format", "{{.State.ExitCode}}", &name]);
    assert_eq!(text(&exit.stdout).trim(), "0", "{}", logs());
    assert!(
        !kubelet
            .device_plugin_dir()
            .join("vgpu-vcuda-core.sock")
            .exists()
    );
    drop(container);
}

/// The init container of the shipped DaemonSet.
fn init_container() -> Value {
    let manifest =
        std::fs::read_to_string(repo_root().join("deploy/vgpu-plugin.yaml")).expect("manifest");
    let daemonset = serde_saphyr::from_multiple::<Value>(&manifest)
        .expect("YAML documents")
        .into_iter()
        .find(|doc| doc["kind"].as_str() == Some("DaemonSet"))
        .expect("DaemonSet");
    daemonset["spec"]["template"]["spec"]["initContainers"][0].clone()
}

/// A host root made of Debian's 535 packages (`nvidia/current` folders, found without
/// help) with a loader cache that `ldconfig -r` wrote, so it holds host paths.
fn debian_host(into: &Path) {
    vgpu_test_support::unpack_debian_driver(into);
    std::fs::create_dir_all(into.join("etc")).expect("etc");
    std::fs::write(
        into.join("etc/ld.so.conf"),
        "/usr/lib/x86_64-linux-gnu/nvidia/current\n",
    )
    .expect("conf");
    let status = Command::new("ldconfig")
        .arg("-r")
        .arg(into)
        .status()
        .expect("ldconfig");
    assert!(status.success(), "ldconfig -r");
}

#[test]
fn the_init_container_prepares_the_driver_unprivileged() {
    vgpu_test_support::require!(Need::DebianDebs);
    let Some(image) = image() else { return };
    let init = init_container();
    let security = &init["securityContext"];
    // What the manifest says is what this test grants.
    assert_eq!(security["privileged"].as_bool(), Some(false));
    assert_eq!(security["allowPrivilegeEscalation"].as_bool(), Some(false));
    assert_eq!(security["readOnlyRootFilesystem"].as_bool(), Some(true));
    assert_eq!(security["capabilities"]["drop"][0].as_str(), Some("ALL"));
    assert!(security["capabilities"]["add"].is_null());
    let command: Vec<String> = init["command"]
        .as_array()
        .expect("command")
        .iter()
        .map(|arg| arg.as_str().expect("string").to_string())
        .collect();
    let mounts: Vec<(&str, bool)> = init["volumeMounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .map(|m| {
            (
                m["mountPath"].as_str().expect("path"),
                m["readOnly"].as_bool().unwrap_or(false),
            )
        })
        .collect();
    assert_eq!(mounts, [("/host", true), ("/var/lib/vgpu", false)]);

    let work = tempfile::tempdir().expect("tempdir");
    let host = work.path().join("host");
    let state = work.path().join("state");
    std::fs::create_dir_all(&state).expect("state");
    debian_host(&host);
    let mut args = vec![
        "run".to_string(),
        "--rm".into(),
        "--network".into(),
        "none".into(),
        "--user".into(),
        "0".into(),
        "--cap-drop".into(),
        "ALL".into(),
        "--security-opt".into(),
        "no-new-privileges".into(),
        "--read-only".into(),
        "--volume".into(),
        format!("{}:/host:ro", host.display()),
        "--volume".into(),
        format!("{}:/var/lib/vgpu", state.display()),
        image.to_string(),
    ];
    args.extend(command);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let output = podman(&args);
    let stdout = text(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        text(&output.stderr)
    );
    assert!(
        stdout.starts_with(&vgpu_build_info::banner("vgpu-ldconfig")),
        "{stdout}"
    );
    assert!(stdout.contains("exports all 620 names"), "{stdout}");
    assert!(
        stdout.contains(
            "library libcuda.so.1 => /usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.1"
        ),
        "the host's own path, from its cache: {stdout}"
    );
    let driver = state.join("driver");
    assert_eq!(
        std::fs::read_link(driver.join("current")).expect("current"),
        Path::new("535.261.03")
    );
    let prepared = driver.join("535.261.03");
    assert_eq!(
        std::fs::read(prepared.join("lib64/libcuda.so.535.261.03")).expect("copied"),
        std::fs::read(host.join("usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.535.261.03"))
            .expect("real")
    );
    assert!(
        prepared.join("bin/nvidia-smi").is_file(),
        "the host's nvidia-smi"
    );
    let copy = copy_out(image, &work.path().join("image"));
    assert_eq!(
        std::fs::read(prepared.join("shim/libcuda_shim.so")).expect("deployed"),
        std::fs::read(copy.join("shim/libcuda_shim.so")).expect("image's"),
        "the image's own shims are deployed"
    );
}
