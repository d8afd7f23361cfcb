//! Shared fixtures of the integration tests: the Debian 535 driver packages unpacked into
//! a temporary folder, the checked-in export lists, and shims built with `cc`.

#![allow(dead_code)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The Debian bookworm non-free driver version the fixture packages carry.
pub use vgpu_test_support::debian::DEBIAN_DRIVER_VERSION as DEBIAN_VERSION;

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
/// (default `/tmp/deb`); each test that calls this says `require!(Need::DebianDebs)`
/// first (vgpu-test-support's policy: a skip outside CI, a failure in CI).
pub fn unpack_debian_driver() -> DebianDriver {
    let root = tempfile::tempdir().unwrap();
    let lib_dir = vgpu_test_support::unpack_debian_driver(root.path());
    let tool_dir = root.path().join("usr/lib/nvidia/current");
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

/// How the fake host lays its driver out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostLayout {
    /// Debian's packages with their alternatives: `/usr/lib/x86_64-linux-gnu/libcuda.so.1`
    /// and `/usr/bin/nvidia-smi` are absolute links through `/etc/alternatives` into
    /// `nvidia/current`, and the loader cache names the first.
    Debian,
    /// The GPU Operator: the driver container's root at `/run/nvidia/driver`, with its
    /// own loader cache; the host's own folders hold no driver.
    GpuOperator,
    /// `/usr/local/nvidia/lib64` and `/usr/local/nvidia/bin`, in no loader cache.
    UsrLocalNvidia,
}

/// A host root built from the Debian packages; its loader caches are written by the
/// real `ldconfig -r`, so they hold host paths.
pub struct FakeHost {
    pub root: tempfile::TempDir,
    pub layout: HostLayout,
}

/// Writes `ROOT/etc/ld.so.conf` and runs `ldconfig -r ROOT` (needs root: it chroots).
pub fn ldconfig_in(root: &Path, folders: &[&str]) {
    std::fs::create_dir_all(root.join("etc")).unwrap();
    std::fs::write(root.join("etc/ld.so.conf"), folders.join("\n") + "\n").unwrap();
    let output = Command::new("ldconfig")
        .arg("-r")
        .arg(root)
        .output()
        .expect("ldconfig (libc-bin) must be installed");
    assert!(
        output.status.success(),
        "ldconfig -r {} failed (it chroots: run as root): {}",
        root.display(),
        String::from_utf8_lossy(&output.stderr)
    );
}

fn link(target: &str, at: &Path) {
    std::fs::create_dir_all(at.parent().unwrap()).unwrap();
    let _ = std::fs::remove_file(at);
    std::os::unix::fs::symlink(target, at).unwrap();
}

impl FakeHost {
    pub fn new(layout: HostLayout) -> FakeHost {
        let host = FakeHost {
            root: tempfile::tempdir().unwrap(),
            layout,
        };
        let driver = unpack_debian_driver();
        host.install(&driver.lib_dir, &driver.tool_dir, DEBIAN_VERSION);
        host
    }

    /// The folder holding the driver's own root (the host root, or the operator's).
    pub fn driver_root(&self) -> PathBuf {
        match self.layout {
            HostLayout::GpuOperator => self.root.path().join("run/nvidia/driver"),
            _ => self.root.path().to_path_buf(),
        }
    }

    /// Installs a driver `version` from `lib_dir` (libcuda/libnvidia-ml of 535, whose
    /// files are named for `version`) and `tool_dir`, replacing what was installed, and
    /// rebuilds the loader cache, as a driver upgrade on the host does.
    pub fn install(&self, lib_dir: &Path, tool_dir: &Path, version: &str) {
        let root = self.driver_root();
        let (libs, smi_at, cached) = match self.layout {
            HostLayout::Debian => (
                "usr/lib/x86_64-linux-gnu/nvidia/current",
                "usr/lib/nvidia/current/nvidia-smi",
                vec!["/usr/lib/x86_64-linux-gnu"],
            ),
            HostLayout::GpuOperator => (
                "usr/lib/x86_64-linux-gnu",
                "usr/bin/nvidia-smi",
                vec!["/usr/lib/x86_64-linux-gnu"],
            ),
            HostLayout::UsrLocalNvidia => (
                "usr/local/nvidia/lib64",
                "usr/local/nvidia/bin/nvidia-smi",
                Vec::new(),
            ),
        };
        // The versioned files and their SONAME links, as the packages lay them out.
        let libs = root.join(libs);
        let _ = std::fs::remove_dir_all(&libs);
        std::fs::create_dir_all(&libs).unwrap();
        for (stem, soname) in [
            ("libcuda.so", "libcuda.so.1"),
            ("libnvidia-ml.so", "libnvidia-ml.so.1"),
        ] {
            let file = format!("{stem}.{version}");
            std::fs::copy(
                lib_dir.join(format!("{stem}.{DEBIAN_VERSION}")),
                libs.join(&file),
            )
            .unwrap();
            link(&file, &libs.join(soname));
            if self.layout == HostLayout::Debian {
                // /usr/lib/x86_64-linux-gnu/SONAME -> /etc/alternatives/... -> nvidia/current/SONAME
                let alternative = format!("/etc/alternatives/nvidia--{soname}-x86_64-linux-gnu");
                link(
                    &format!("/usr/lib/x86_64-linux-gnu/nvidia/current/{soname}"),
                    &self.inside(&alternative),
                );
                link(
                    &alternative,
                    &root.join("usr/lib/x86_64-linux-gnu").join(soname),
                );
            }
        }
        std::fs::create_dir_all(root.join(smi_at).parent().unwrap()).unwrap();
        std::fs::copy(tool_dir.join("nvidia-smi"), root.join(smi_at)).unwrap();
        if self.layout == HostLayout::Debian {
            link(
                &format!("/{smi_at}"),
                &self.inside("/etc/alternatives/nvidia--nvidia-smi"),
            );
            link(
                "/etc/alternatives/nvidia--nvidia-smi",
                &root.join("usr/bin/nvidia-smi"),
            );
        }
        ldconfig_in(&root, &cached);
        if self.layout == HostLayout::GpuOperator {
            // The host's own cache knows no driver.
            ldconfig_in(self.root.path(), &[]);
        }
    }

    /// A host path inside the driver root, as this process opens it.
    fn inside(&self, host_path: &str) -> PathBuf {
        self.driver_root().join(host_path.trim_start_matches('/'))
    }
}

/// Runs the `vgpu-ldconfig` binary of this build (the loader's own env cleared).
pub fn vgpu_ldconfig(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_vgpu-ldconfig"))
        .args(args)
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .unwrap()
}

/// `sha256sum`'s digest of a file.
pub fn sha256sum(path: &Path) -> String {
    let output = Command::new("sha256sum").arg(path).output().unwrap();
    String::from_utf8(output.stdout)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}
