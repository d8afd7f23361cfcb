//! The `vgpu-dra-plugin` daemon: loads the config, opens NVML, runs the DRA kubelet
//! plugin until SIGTERM or SIGINT, then removes its sockets.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::sync::Arc;

use clap::Parser;
use vgpu_dra::DraConfig;
use vgpu_dra::cards::NvmlDetails;
use vgpu_node_agent::devices::NvmlSource;
use vgpu_node_agent::process;

#[derive(Parser)]
#[command(
    name = "vgpu-dra-plugin",
    version = vgpu_build_info::VERSION_LINE,
    about = "DRA kubelet plugin: shareable GPUs with consumable cores and memory, enforced by the vgpu-shim shims"
)]
struct Args {
    /// The DRA driver's config (YAML); a missing default file means built-in defaults.
    #[arg(long, default_value = vgpu_dra::config::DEFAULT_CONFIG_PATH)]
    config: PathBuf,
    /// Serve /metrics and /healthz here instead of the config's `metrics_address`: the
    /// DaemonSet passes `$(HOST_IP):9402` (the downward API's status.hostIP), which only
    /// a per-node value can say.
    #[arg(long)]
    metrics_address: Option<std::net::SocketAddr>,
}

async fn run(args: Args) -> anyhow::Result<()> {
    let mut config = DraConfig::load(&args.config)?;
    if let Some(address) = args.metrics_address {
        config.metrics_address = Some(address);
    }
    let source = Arc::new(NvmlSource::open(&config.nvml_library)?);
    let details = Arc::new(NvmlDetails::open(&config.nvml_library)?);
    let plugin = vgpu_dra::start(config, source, details).await?;
    let signalled = process::signalled().await;
    plugin.stop().await;
    signalled
}

fn main() -> std::process::ExitCode {
    process::run_daemon("vgpu-dra-plugin", run(Args::parse()))
}
