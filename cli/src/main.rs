//! `vgpu`: run a program under a GPU quota (`run`), assemble a driver folder of the
//! shims (`install`), show what a process sees (`probe`, `smi`).

mod smi;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "vgpu", version, about = "Share one NVIDIA GPU between containers with hard memory and compute quotas")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Render an nvidia-smi-like view through whatever libnvidia-ml.so.1 this process loads.
    Smi(smi::SmiArgs),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Smi(args) => smi::run(&args),
    };
    if let Err(err) = result {
        eprintln!("vgpu: {err:#}");
        std::process::exit(1);
    }
}
