//! The built shims export every name of the real drivers: the Debian 535 packages'
//! libraries (read with `nm -D --defined-only`, as the lists were made) and the 580 lists
//! from the H200 machine; and `vgpu-ldconfig check` agrees.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use vgpu_test_support::repo_root;
use vgpu_test_support::{Need, require};
use vgpu_tests::artifact;

fn nm_exports(lib: &Path) -> BTreeSet<String> {
    let output = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(lib)
        .output()
        .expect("run nm (binutils)");
    assert!(
        output.status.success(),
        "nm {}: {}",
        lib.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().last())
        .map(String::from)
        .collect()
}

fn list(name: &str) -> BTreeSet<String> {
    let text =
        std::fs::read_to_string(repo_root().join("symbols").join(name)).expect("symbol list");
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect()
}

/// The Debian 535 packages unpacked into a temp folder, and the folder of their libraries.
fn debian_535() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let lib = vgpu_test_support::unpack_debian_driver(dir.path());
    (dir, lib)
}

#[test]
fn shims_export_every_real_driver_symbol() {
    require!(
        Need::DebianDebs,
        Need::program("nm", "apt-get install binutils")
    );
    let (_keep, debian) = debian_535();
    let cuda_shim = nm_exports(&artifact("libcuda_shim.so"));
    let nvml_shim = nm_exports(&artifact("libnvml_shim.so"));
    let real_cuda_535 = nm_exports(&debian.join("libcuda.so.535.261.03"));
    let real_nvml_535 = nm_exports(&debian.join("libnvidia-ml.so.535.261.03"));
    assert_eq!(real_cuda_535.len(), 620, "Debian's libcuda 535 exports");
    assert_eq!(
        real_nvml_535.len(),
        332,
        "Debian's libnvidia-ml 535 exports"
    );
    for (shim, real, what) in [
        (&cuda_shim, &real_cuda_535, "Debian libcuda 535"),
        (
            &cuda_shim,
            &list("libcuda.so.580.159.04.txt"),
            "libcuda 580 list",
        ),
        (&nvml_shim, &real_nvml_535, "Debian libnvidia-ml 535"),
        (
            &nvml_shim,
            &list("libnvidia-ml.so.580.159.04.txt"),
            "libnvidia-ml 580 list",
        ),
        (
            &nvml_shim,
            &list("nvidia-smi-535.261.03.nvml-lookups.txt"),
            "nvidia-smi 535 lookups",
        ),
    ] {
        let missing: Vec<_> = real.difference(shim).collect();
        assert!(missing.is_empty(), "{what}: the shim lacks {missing:?}");
    }
    // Nothing beyond the real names: the shims are drop-in libraries, not extensions.
    let union: BTreeSet<String> = list("libcuda.so.535.261.03.txt")
        .union(&list("libcuda.so.580.159.04.txt"))
        .cloned()
        .collect();
    assert_eq!(cuda_shim, union);
}

#[test]
fn ldconfig_check_accepts_the_shims_and_names_what_a_fake_lacks() {
    require!(
        Need::DebianDebs,
        Need::program("nm", "apt-get install binutils")
    );
    let (_keep, debian) = debian_535();
    let checker = artifact("vgpu-ldconfig");
    for (real, shim) in [
        ("libcuda.so.535.261.03", "libcuda_shim.so"),
        ("libnvidia-ml.so.535.261.03", "libnvml_shim.so"),
    ] {
        let output = Command::new(&checker)
            .args(["check", "--real"])
            .arg(debian.join(real))
            .arg("--shim")
            .arg(artifact(shim))
            .output()
            .expect("run");
        assert!(
            output.status.success(),
            "check {real}: {}",
            String::from_utf8_lossy(&output.stdout)
        );
    }
    // The NVML shim is no libcuda: the check must fail and list what it lacks.
    let output = Command::new(&checker)
        .args(["check", "--real"])
        .arg(debian.join("libcuda.so.535.261.03"))
        .arg("--shim")
        .arg(artifact("libnvml_shim.so"))
        .output()
        .expect("run");
    assert_eq!(output.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .any(|l| l.trim() == "cuMemAlloc_v2")
    );
}

#[test]
fn shims_have_the_real_sonames() {
    for (shim, soname) in [
        ("libcuda_shim.so", "libcuda.so.1"),
        ("libnvml_shim.so", "libnvidia-ml.so.1"),
    ] {
        assert_eq!(
            vgpu_ldconfig::soname(&artifact(shim))
                .expect("read")
                .as_deref(),
            Some(soname)
        );
    }
}
