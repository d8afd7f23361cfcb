//! The `vgpu-plugin` daemon: loads the plugin config, opens NVML, runs the device
//! plugin until SIGTERM or SIGINT, then removes its sockets.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Parser;
use vgpu_plugin::PluginConfig;
use vgpu_plugin::devices::NvmlSource;

#[derive(Parser)]
#[command(
    name = "vgpu-plugin",
    version = vgpu_build_info::VERSION_LINE,
    about = "Kubernetes device plugin for tencent.com/vcuda-core and tencent.com/vcuda-memory"
)]
struct Args {
    /// Plugin config (YAML); missing default file means built-in defaults.
    #[arg(long, default_value = vgpu_plugin::config::DEFAULT_CONFIG_PATH)]
    config: PathBuf,
}

fn load_config(path: &std::path::Path) -> anyhow::Result<PluginConfig> {
    if !path.exists() && path == std::path::Path::new(vgpu_plugin::config::DEFAULT_CONFIG_PATH) {
        tracing::info!(path = %path.display(), "no config file; using defaults");
        return Ok(PluginConfig::default());
    }
    PluginConfig::load(path)
}

async fn run(args: Args) -> anyhow::Result<()> {
    tracing::info!("{}", vgpu_build_info::banner("vgpu-plugin"));
    let config = load_config(&args.config)?;
    let source = Arc::new(NvmlSource::open(&config.nvml_library)?);
    let plugin = vgpu_plugin::start(config, source).await?;
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = terminate.recv() => tracing::info!("SIGTERM: stopping"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: stopping"),
    }
    plugin.stop().await;
    Ok(())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_env("VGPU_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    match run(Args::parse()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!("{err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
