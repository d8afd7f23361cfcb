//! Where the built shims and the sim driver are, and the install layout:
//!
//! ```text
//! PREFIX/bin/vgpu
//! PREFIX/bin/vgpu-ldconfig, vgpu-plugin when built beside vgpu
//! PREFIX/lib64/libcuda.so.1         the CUDA shim     (libcuda.so -> libcuda.so.1)
//! PREFIX/lib64/libnvidia-ml.so.1    the NVML shim     (libnvidia-ml.so -> libnvidia-ml.so.1)
//! PREFIX/sim/lib64/libvgpu_sim.so   the simulated driver
//! PREFIX/sim/lib64/libcuda.so.1, libnvidia-ml.so.1 -> libvgpu_sim.so
//! ```
//!
//! `vgpu` finds them beside itself: in an installed prefix (`PREFIX/bin/vgpu`), or in a
//! Cargo target folder (`target/release/vgpu` beside `libcuda_shim.so`).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use vgpu_test_support::built;

/// The files `vgpu run` mounts.
#[derive(Clone, Debug)]
pub struct Artifacts {
    pub cuda_shim: PathBuf,
    pub nvml_shim: PathBuf,
    /// The simulated driver, when built.
    pub sim: Option<PathBuf>,
}

impl Artifacts {
    /// Finds the artifacts from `VGPU_PREFIX`, else from beside the running executable.
    pub fn locate() -> Result<Artifacts> {
        if let Some(prefix) = std::env::var_os("VGPU_PREFIX").filter(|p| !p.is_empty()) {
            return Artifacts::in_prefix(Path::new(&prefix))
                .with_context(|| format!("VGPU_PREFIX={}", PathBuf::from(&prefix).display()));
        }
        let exe = std::env::current_exe().context("cannot find the vgpu executable")?;
        let dir = exe.parent().context("vgpu executable has no folder")?;
        if let Some(prefix) = dir.parent()
            && dir.file_name().is_some_and(|name| name == "bin")
            && let Ok(artifacts) = Artifacts::in_prefix(prefix)
        {
            return Ok(artifacts);
        }
        Artifacts::in_target_dir(dir)
    }

    /// An installed prefix.
    pub fn in_prefix(prefix: &Path) -> Result<Artifacts> {
        let cuda_shim = prefix.join("lib64/libcuda.so.1");
        let nvml_shim = prefix.join("lib64/libnvidia-ml.so.1");
        for path in [&cuda_shim, &nvml_shim] {
            if !path.is_file() {
                bail!(
                    "{} is missing (run `vgpu install --prefix {}`)",
                    path.display(),
                    prefix.display()
                );
            }
        }
        let sim = Some(prefix.join("sim/lib64/libvgpu_sim.so")).filter(|p| p.is_file());
        Ok(Artifacts {
            cuda_shim,
            nvml_shim,
            sim,
        })
    }

    /// A Cargo target folder (`target/debug`, `target/release`; `cargo test` leaves
    /// the libraries in its `deps/`).
    pub fn in_target_dir(dir: &Path) -> Result<Artifacts> {
        let built = |name: &str| {
            built::in_profile_dir(dir, name).with_context(|| {
                format!(
                    "{} is missing: build the whole workspace first (`cargo build --release --workspace`) or set VGPU_PREFIX",
                    dir.join(name).display()
                )
            })
        };
        let cuda_shim = built("libcuda_shim.so")?;
        let nvml_shim = built("libnvml_shim.so")?;
        let sim = built::in_profile_dir(dir, "libvgpu_sim.so");
        Ok(Artifacts {
            cuda_shim,
            nvml_shim,
            sim,
        })
    }

    /// The simulated driver, or a clear error.
    pub fn require_sim(&self) -> Result<&Path> {
        self.sim.as_deref().context("the simulated driver (libvgpu_sim.so) is not built: `cargo build --release --workspace`")
    }
}

/// Lays out a sim driver folder in `dir`: `libcuda.so.1` and `libnvidia-ml.so.1` (and
/// their unversioned names) linking to the sim library.
pub fn sim_driver_folder(dir: &Path, sim: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    for name in [
        "libcuda.so.1",
        "libcuda.so",
        "libnvidia-ml.so.1",
        "libnvidia-ml.so",
    ] {
        replace_symlink(sim, &dir.join(name))?;
    }
    Ok(())
}

/// Points the symlink `at` to `target`, replacing whatever is there in one rename, so
/// that several `vgpu run`s sharing one state folder never trip over each other.
pub fn replace_symlink(target: &Path, at: &Path) -> Result<()> {
    let staging = at.with_file_name(format!(
        ".{}.{}.tmp",
        at.file_name().and_then(|n| n.to_str()).unwrap_or("link"),
        std::process::id()
    ));
    let _ = std::fs::remove_file(&staging);
    std::os::unix::fs::symlink(target, &staging)
        .with_context(|| format!("link {}", staging.display()))?;
    std::fs::rename(&staging, at).with_context(|| format!("link {}", at.display()))
}
