//! Debian's non-free 535 driver packages, which the export checks and the fake host
//! roots are made of: where their `.deb` files are (`VGPU_DEBIAN_DEBS`, else `/tmp/deb`;
//! `tests/run.sh` downloads them) and unpacking them. A test that needs them says
//! `require!(Need::DebianDebs)` first.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The Debian bookworm non-free driver version whose packages (`libcuda1`,
/// `libnvidia-ml1`, `nvidia-smi`) the export checks read; `symbols/*.535.261.03.txt`
/// were made from them.
pub const DEBIAN_DRIVER_VERSION: &str = "535.261.03";

/// The Debian driver packages a test unpacks.
pub const DEBIAN_DRIVER_PACKAGES: [&str; 3] = ["libcuda1", "libnvidia-ml1", "nvidia-smi"];

/// The folder of Debian's driver packages: `VGPU_DEBIAN_DEBS`, else `/tmp/deb`.
pub fn debian_debs() -> PathBuf {
    std::env::var_os("VGPU_DEBIAN_DEBS")
        .filter(|value| !value.is_empty())
        .map_or_else(|| PathBuf::from("/tmp/deb"), PathBuf::from)
}

/// The `.deb` file of `package` (version [`DEBIAN_DRIVER_VERSION`]) in `folder`.
pub fn debian_deb(folder: &Path, package: &str) -> Option<PathBuf> {
    let prefix = format!("{package}_{DEBIAN_DRIVER_VERSION}");
    std::fs::read_dir(folder)
        .ok()?
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .find(|path| {
            path.file_name()
                .map(|name| name.to_string_lossy())
                .is_some_and(|name| name.starts_with(&prefix) && name.ends_with(".deb"))
        })
}

/// Unpacks the three driver packages into `into` with `dpkg -x`; panics when one is
/// absent (check with `require!(Need::DebianDebs)` first). Returns
/// `usr/lib/x86_64-linux-gnu/nvidia/current`, where the libraries are.
pub fn unpack_debian_driver(into: &Path) -> PathBuf {
    let debs = debian_debs();
    for package in DEBIAN_DRIVER_PACKAGES {
        let deb = debian_deb(&debs, package).unwrap_or_else(|| {
            panic!(
                "no {package}_{DEBIAN_DRIVER_VERSION}*.deb in {} (require!(Need::DebianDebs) first)",
                debs.display()
            )
        });
        let status = Command::new("dpkg")
            .arg("-x")
            .arg(&deb)
            .arg(into)
            .status()
            .expect("dpkg runs");
        assert!(status.success(), "dpkg -x {} failed", deb.display());
    }
    let lib_dir = into.join("usr/lib/x86_64-linux-gnu/nvidia/current");
    assert!(
        lib_dir
            .join(format!("libcuda.so.{DEBIAN_DRIVER_VERSION}"))
            .is_file(),
        "{} holds no libcuda.so.{DEBIAN_DRIVER_VERSION}",
        lib_dir.display()
    );
    lib_dir
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debian_debs_are_found_by_package_and_version_only() {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            "libcuda1_535.261.03-1_amd64.deb",
            "libnvidia-ml1_535.104.05-1_amd64.deb",
            "nvidia-smi_535.261.03-1_amd64.deb.part",
        ] {
            std::fs::write(dir.path().join(name), b"").unwrap();
        }
        assert!(debian_deb(dir.path(), "libcuda1").is_some());
        assert!(
            debian_deb(dir.path(), "libnvidia-ml1").is_none(),
            "other version"
        );
        assert!(debian_deb(dir.path(), "nvidia-smi").is_none(), "not a .deb");
    }
}
