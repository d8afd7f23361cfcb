//! `vgpu-ldconfig prepare` against a host root mounted elsewhere, as the init container
//! sees it at `/host`: fake hosts built from Debian's real 535 packages in the three
//! layouts operators have (Debian's alternatives, the GPU Operator's driver root,
//! `/usr/local/nvidia`), each with a loader cache written by the real `ldconfig -r`
//! (host paths, never the folder's). Tools and libraries are found there, and a second
//! driver version installed on the host replaces the first at the next preparation.

mod common;

use vgpu_test_support::{Need, require};

use std::path::{Path, PathBuf};

use common::{
    DEBIAN_VERSION, FakeHost, HostLayout, build_shim, sha256sum, symbol_list, unpack_debian_driver,
    vgpu_ldconfig,
};

fn path(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// Complete shims for the 535 driver (every export, built with cc).
fn shims(dir: &Path) -> PathBuf {
    let shims = dir.join("shims");
    std::fs::create_dir_all(&shims).unwrap();
    for (file, list) in [
        (
            "libcuda_shim.so",
            format!("libcuda.so.{DEBIAN_VERSION}.txt"),
        ),
        (
            "libnvml_shim.so",
            format!("libnvidia-ml.so.{DEBIAN_VERSION}.txt"),
        ),
    ] {
        build_shim(
            &shims.join(file),
            symbol_list(&list).iter().map(String::as_str),
        );
    }
    shims
}

/// `prepare --json` from the host mounted at `host`; the outcome.
fn prepare(host: &Path, dest: &Path, shims: &Path) -> serde_json::Value {
    let output = vgpu_ldconfig(&[
        "prepare",
        "--host-root",
        path(host),
        "--dest",
        path(dest),
        "--shim-dir",
        path(shims),
        // The machine running the test may have a GPU driver of its own loaded.
        "--proc-version",
        "/nonexistent/version",
        "--json",
    ]);
    assert!(
        output.status.success(),
        "prepare failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

fn scan(host: &Path) -> serde_json::Value {
    let output = vgpu_ldconfig(&[
        "scan",
        "--host-root",
        path(host),
        "--proc-version",
        "/nonexistent/version",
        "--json",
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

#[test]
fn every_layout_is_found_through_the_mounted_host_root() {
    require!(Need::DebianDebs, Need::Root);
    let work = tempfile::tempdir().unwrap();
    let shims = shims(work.path());
    for (layout, driver_root, found_at, tool_at) in [
        (
            HostLayout::Debian,
            "/",
            "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
            "usr/lib/nvidia/current/nvidia-smi",
        ),
        (
            HostLayout::GpuOperator,
            "/run/nvidia/driver",
            "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
            "run/nvidia/driver/usr/bin/nvidia-smi",
        ),
        (
            HostLayout::UsrLocalNvidia,
            "/",
            "/usr/local/nvidia/lib64/libcuda.so.1",
            "usr/local/nvidia/bin/nvidia-smi",
        ),
    ] {
        let host = FakeHost::new(layout);
        let root = host.root.path();
        let found = scan(root);
        assert_eq!(found["driver_root"], driver_root, "{layout:?}: {found:#}");
        assert_eq!(found["version"], DEBIAN_VERSION, "{layout:?}");
        let libraries = found["libraries"].as_array().unwrap();
        let sonames: Vec<&str> = libraries
            .iter()
            .map(|library| library["soname"].as_str().unwrap())
            .collect();
        assert_eq!(sonames, ["libcuda.so.1", "libnvidia-ml.so.1"], "{layout:?}");
        assert_eq!(libraries[0]["found_at"], found_at, "{layout:?}");
        assert!(
            libraries[0]["real_path"]
                .as_str()
                .unwrap()
                .starts_with(path(root)),
            "{layout:?}: read inside the mounted root: {found:#}"
        );
        assert_eq!(
            found["tools"]["nvidia-smi"],
            path(&root.join(tool_at)),
            "{layout:?}"
        );

        let dest = work.path().join(format!("{layout:?}"));
        let outcome = prepare(root, &dest, &shims);
        assert_eq!(outcome["manifest"]["version"], DEBIAN_VERSION);
        let prepared = dest.join("current");
        assert_eq!(
            sha256sum(&prepared.join("lib64/libcuda.so.1")),
            sha256sum(Path::new(libraries[0]["real_path"].as_str().unwrap())),
            "{layout:?}: the real libcuda is copied"
        );
        assert_eq!(
            sha256sum(&prepared.join("bin/nvidia-smi")),
            sha256sum(&root.join(tool_at)),
            "{layout:?}: nvidia-smi is copied"
        );
        assert!(prepared.join("shim/libcuda_shim.so").is_file());
    }
}

#[test]
fn the_cache_holds_host_paths_and_an_upgrade_replaces_the_prepared_driver() {
    require!(Need::DebianDebs, Need::Root);
    let work = tempfile::tempdir().unwrap();
    let shims = shims(work.path());
    let host = FakeHost::new(HostLayout::Debian);
    let root = host.root.path();
    // What `ldconfig -r` wrote names the host's own paths, not the folder's.
    let cache = vgpu_ldconfig::read_cache(&root.join("etc/ld.so.cache")).unwrap();
    let cuda = cache
        .iter()
        .find(|entry| entry.name == "libcuda.so.1")
        .expect("libcuda in the host's cache");
    assert_eq!(
        cuda.path,
        Path::new("/usr/lib/x86_64-linux-gnu/libcuda.so.1")
    );

    let dest = work.path().join("driver");
    let first = prepare(root, &dest, &shims);
    assert_eq!(first["manifest"]["version"], DEBIAN_VERSION);
    assert_eq!(first["replaced"], serde_json::Value::Null);

    // The host driver is upgraded (files named for the new version, alternatives
    // switched, the cache rebuilt): the next start prepares a new folder and switches.
    let debs = unpack_debian_driver();
    for version in ["999.1.2", "999.2.0"] {
        host.install(&debs.lib_dir, &debs.tool_dir, version);
        let next = prepare(root, &dest, &shims);
        assert_eq!(next["manifest"]["version"], version);
        assert_eq!(
            std::fs::read_link(dest.join("current")).unwrap(),
            Path::new(version)
        );
        assert_eq!(
            std::fs::read_link(dest.join(version).join("lib64/libcuda.so.1")).unwrap(),
            PathBuf::from(format!("libcuda.so.{version}"))
        );
    }
    // The one before the current is kept for containers that mounted it; older ones go.
    assert!(dest.join("999.1.2/lib64/libcuda.so.999.1.2").is_file());
    assert!(!dest.join(DEBIAN_VERSION).exists());
    // Preparing again changes nothing.
    let again = prepare(root, &dest, &shims);
    assert_eq!(again["changed"].as_array().unwrap().len(), 0, "{again:#}");
    assert_eq!(again["replaced"], serde_json::Value::Null);
}

#[test]
fn explicit_flags_name_the_driver_root_cache_and_folders() {
    require!(Need::DebianDebs, Need::Root);
    let work = tempfile::tempdir().unwrap();
    let shims = shims(work.path());
    let host = FakeHost::new(HostLayout::UsrLocalNvidia);
    let root = host.root.path();
    let dest = work.path().join("driver");
    let output = vgpu_ldconfig(&[
        "prepare",
        "--host-root",
        path(root),
        "--driver-root",
        "/",
        "--cache",
        path(&root.join("etc/ld.so.cache")),
        "--extra-dir",
        "/usr/local/nvidia/lib64",
        "--tool-dir",
        "/usr/local/nvidia/bin",
        "--proc-version",
        "/nonexistent/version",
        "--dest",
        path(&dest),
        "--shim-dir",
        path(&shims),
    ]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("library libcuda.so.1 => /usr/local/nvidia/lib64/libcuda.so.1"),
        "{stdout}"
    );
    let last = stdout.lines().last().unwrap();
    assert!(
        last.contains(&format!("driver {DEBIAN_VERSION} prepared")),
        "{last}"
    );
    assert!(dest.join("current/bin/nvidia-smi").is_file());
}
