//! `vgpu install --prefix DIR`: a ready driver folder of the shims (and the sim driver
//! and the `vgpu` binary, with `vgpu-ldconfig` and `vgpu-plugin` when they were built
//! beside it), in the layout `artifacts` describes. Self-contained: it can be copied to
//! another machine of the same architecture.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::artifacts::{Artifacts, sim_driver_folder};

#[derive(clap::Args)]
pub struct InstallArgs {
    /// Folder to install into (created if needed).
    #[arg(long)]
    prefix: PathBuf,
}

/// Binaries installed beside `vgpu` when they were built beside it.
const SIBLING_TOOLS: [&str; 3] = ["vgpu-ldconfig", "vgpu-plugin", "vgpu-dra-plugin"];

fn copy(from: &Path, to: &Path) -> Result<()> {
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("create {}", parent.display()))?;
    }
    // Replace rather than overwrite in place: the old file may be mapped by a running process.
    let staging = to.with_extension("vgpu-new");
    std::fs::copy(from, &staging)
        .with_context(|| format!("copy {} to {}", from.display(), staging.display()))?;
    std::fs::rename(&staging, to).with_context(|| format!("rename to {}", to.display()))
}

fn link(target: &str, at: &Path) -> Result<()> {
    crate::artifacts::replace_symlink(Path::new(target), at)
}

pub fn run(args: &InstallArgs) -> Result<()> {
    let artifacts = Artifacts::locate()?;
    let lib64 = args.prefix.join("lib64");
    copy(&artifacts.cuda_shim, &lib64.join("libcuda.so.1"))?;
    copy(&artifacts.nvml_shim, &lib64.join("libnvidia-ml.so.1"))?;
    link("libcuda.so.1", &lib64.join("libcuda.so"))?;
    link("libnvidia-ml.so.1", &lib64.join("libnvidia-ml.so"))?;
    if let Some(sim) = &artifacts.sim {
        let sim_lib64 = args.prefix.join("sim/lib64");
        let installed = sim_lib64.join("libvgpu_sim.so");
        copy(sim, &installed)?;
        sim_driver_folder(&sim_lib64, Path::new("libvgpu_sim.so"))?;
    }
    let exe = std::env::current_exe().context("cannot find the vgpu executable")?;
    let bin = args.prefix.join("bin/vgpu");
    if std::fs::canonicalize(&exe).ok() != std::fs::canonicalize(&bin).ok() {
        copy(&exe, &bin)?;
    }
    // The node tools built beside vgpu (a Cargo target folder) come along, so a prefix
    // can also prepare a driver folder (`vgpu-ldconfig prepare --shim-dir PREFIX/lib64`).
    let mut tools = Vec::new();
    for tool in SIBLING_TOOLS {
        let from = exe.with_file_name(tool);
        let to = args.prefix.join("bin").join(tool);
        if from.is_file() && std::fs::canonicalize(&from).ok() != std::fs::canonicalize(&to).ok() {
            copy(&from, &to)?;
            tools.push(to);
        }
    }
    println!(
        "installed {} into {}",
        vgpu_build_info::banner("vgpu"),
        args.prefix.display()
    );
    println!("  {}  (CUDA shim)", lib64.join("libcuda.so.1").display());
    println!(
        "  {}  (NVML shim)",
        lib64.join("libnvidia-ml.so.1").display()
    );
    if artifacts.sim.is_some() {
        println!(
            "  {}  (simulated driver)",
            args.prefix.join("sim/lib64").display()
        );
    }
    println!("  {}", bin.display());
    for tool in &tools {
        println!("  {}", tool.display());
    }
    Ok(())
}
