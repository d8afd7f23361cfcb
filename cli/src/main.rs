//! `vgpu`: run a program under a GPU quota (`run`, `--mps` as an MPS client; `mps`
//! keeps a card's MPS daemon), assemble a driver folder of the shims (`install`), show
//! what a process sees (`probe`, `smi`), and the node's view by card and container
//! (`top`).

mod artifacts;
mod coordinate;
mod install;
mod mps;
mod pidns;
mod probe;
mod run;
mod smi;
mod top;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "vgpu",
    version = vgpu_build_info::VERSION_LINE,
    about = "Share one NVIDIA GPU between containers with hard memory and compute quotas"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a command under a GPU quota, in a mount namespace where the shims cover the
    /// driver libraries, as a container gets them from the device plugin.
    Run(run::RunArgs),
    /// Keep one card's MPS control daemon running, supervised, until SIGINT or SIGTERM
    /// (`vgpu run --mps` joins it).
    Mps(mps::MpsArgs),
    /// Install the shims, the simulated driver and vgpu into a prefix.
    Install(install::InstallArgs),
    /// Print what a CUDA process sees through libcuda.so.1 and libnvidia-ml.so.1.
    Probe(probe::ProbeArgs),
    /// Render an nvidia-smi-like view through whatever libnvidia-ml.so.1 this process loads.
    Smi(smi::SmiArgs),
    /// The node by card and by container: quota, memory used, busy share, throttled
    /// time, refusals and processes, from the host's usage regions and card views.
    Top(top::TopArgs),
}

/// `vgpu smi` under the name `nvidia-smi` (`argv[0]`): a node whose driver's own tool
/// cannot run (the simulated driver serves the public NVML API, not the private export
/// table Debian's nvidia-smi asks for first) installs vgpu as its nvidia-smi.
#[derive(Parser)]
#[command(name = "nvidia-smi", version = vgpu_build_info::VERSION_LINE)]
struct NvidiaSmi {
    #[command(flatten)]
    args: smi::SmiArgs,
}

fn invoked_as_nvidia_smi() -> bool {
    std::env::args_os()
        .next()
        .map(std::path::PathBuf::from)
        .and_then(|path| path.file_name().map(|name| name == "nvidia-smi"))
        .unwrap_or(false)
}

fn main() {
    let command = if invoked_as_nvidia_smi() {
        Command::Smi(NvidiaSmi::parse().args)
    } else {
        Cli::parse().command
    };
    let result = match command {
        Command::Run(args) => run::run(&args).map(Some),
        Command::Mps(args) => mps::run(&args).map(|()| None),
        Command::Install(args) => install::run(&args).map(|()| None),
        Command::Probe(args) => probe::run(&args).map(|()| None),
        Command::Smi(args) => smi::run(&args).map(|()| None),
        Command::Top(args) => top::run(&args).map(|()| None),
    };
    match result {
        Ok(Some(code)) => std::process::exit(code),
        Ok(None) => {}
        Err(err) => {
            eprintln!("vgpu: {err:#}");
            std::process::exit(1);
        }
    }
}
