//! Shared fixtures of the integration tests: the Debian 535 driver packages unpacked into
//! a temporary folder, the checked-in export lists, and shims built with `cc`.

#![allow(dead_code)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The Debian bookworm non-free driver version the fixture packages carry.
pub const DEBIAN_VERSION: &str = "535.261.03";

/// The unpacked packages.
pub struct DebianDriver {
    /// Keeps the folder alive.
    pub root: tempfile::TempDir,
    /// `usr/lib/x86_64-linux-gnu/nvidia/current` inside it.
    pub lib_dir: PathBuf,
    /// `usr/lib/nvidia/current` inside it (where the package puts `nvidia-smi`).
    pub tool_dir: PathBuf,
}

/// Unpacks `libcuda1`, `libnvidia-ml1` and `nvidia-smi` from `$VGPU_DEBIAN_DEBS`
/// (default `/tmp/deb`) with `dpkg -x`; panics with instructions when they are absent.
pub fn unpack_debian_driver() -> DebianDriver {
    let debs = std::env::var_os("VGPU_DEBIAN_DEBS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp/deb"));
    let how = "get them with `apt-get download libcuda1 libnvidia-ml1 nvidia-smi` after enabling the non-free \
               component (e.g. `deb http://deb.debian.org/debian bookworm main non-free non-free-firmware` in \
               /etc/apt/sources.list.d/), then point VGPU_DEBIAN_DEBS at that folder";
    let root = tempfile::tempdir().unwrap();
    for package in ["libcuda1", "libnvidia-ml1", "nvidia-smi"] {
        let deb = std::fs::read_dir(&debs)
            .unwrap_or_else(|error| {
                panic!(
                    "cannot read the .deb folder {}: {error}; {how}",
                    debs.display()
                )
            })
            .filter_map(|entry| entry.ok().map(|entry| entry.path()))
            .find(|path| {
                let name = path.file_name().unwrap().to_string_lossy();
                name.starts_with(&format!("{package}_{DEBIAN_VERSION}")) && name.ends_with(".deb")
            })
            .unwrap_or_else(|| {
                panic!(
                    "no {package}_{DEBIAN_VERSION}*.deb in {}; {how}",
                    debs.display()
                )
            });
        let status = Command::new("dpkg")
            .arg("-x")
            .arg(&deb)
            .arg(root.path())
            .status()
            .expect("dpkg must be installed");
        assert!(status.success(), "dpkg -x {} failed", deb.display());
    }
    let lib_dir = root.path().join("usr/lib/x86_64-linux-gnu/nvidia/current");
    let tool_dir = root.path().join("usr/lib/nvidia/current");
    assert!(
        lib_dir
            .join(format!("libcuda.so.{DEBIAN_VERSION}"))
            .is_file()
    );
    DebianDriver {
        root,
        lib_dir,
        tool_dir,
    }
}

/// `symbols/NAME` of the repository.
pub fn symbols_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../symbols")
        .join(name)
}

/// Reads a symbols list.
pub fn symbol_list(name: &str) -> BTreeSet<String> {
    vgpu_ldconfig::exports::read_symbol_list(&symbols_file(name)).unwrap()
}

/// Compiles a shared object at `out` defining a function for each name.
pub fn build_shim<'a>(out: &Path, names: impl IntoIterator<Item = &'a str>) {
    let mut source = String::new();
    for name in names {
        source.push_str(&format!("void {name}(void) {{}}\n"));
    }
    let c_file = out.with_extension("c");
    std::fs::write(&c_file, source).unwrap();
    let status = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(out)
        .arg(&c_file)
        .status()
        .expect("cc must be installed for these tests");
    assert!(status.success(), "cc failed for {}", out.display());
}
