//! The `vgpu-plugin` daemon: logs its version, loads the node config, opens NVML,
//! runs the device plugin until SIGTERM or SIGINT or until its config file changes (a
//! ConfigMap update: it then exits cleanly and kubelet restarts it with the new one),
//! then removes its sockets.

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use vgpu_node_agent::devices::NvmlSource;
use vgpu_node_agent::process;
use vgpu_plugin::reload::{Change, ConfigWatch};

#[derive(Parser)]
#[command(
    name = "vgpu-plugin",
    version = vgpu_build_info::VERSION_LINE,
    about = "Kubernetes device plugin for tencent.com/vcuda-core and tencent.com/vcuda-memory"
)]
struct Args {
    /// The node config (YAML); a missing default file means built-in defaults.
    #[arg(long, default_value = vgpu_node_agent::config::DEFAULT_CONFIG_PATH)]
    config: PathBuf,
    /// Serve /metrics and /healthz here instead of the config's `metrics_address`: the
    /// DaemonSet passes `$(HOST_IP):9401` (the downward API's status.hostIP), which only
    /// a per-node value can say.
    #[arg(long)]
    metrics_address: Option<std::net::SocketAddr>,
}

/// Returns once the config file holds another valid config.
async fn config_changed(mut watch: ConfigWatch, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        match watch.poll() {
            Change::None => {}
            Change::Valid(_) => return,
            Change::Invalid(reason) => {
                tracing::error!("{reason}; keeping the config in effect until the file is fixed")
            }
            Change::Unreadable(reason) => {
                tracing::warn!("{reason}; keeping the config in effect")
            }
        }
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let default_path = args.config == Path::new(vgpu_node_agent::config::DEFAULT_CONFIG_PATH);
    let (mut config, watch) = ConfigWatch::load(&args.config, default_path)?;
    if let Some(address) = args.metrics_address {
        config.metrics_address = Some(address);
    }
    if default_path && !args.config.exists() {
        tracing::info!(path = %args.config.display(), "no config file; using defaults");
    }
    let every = Duration::from_millis(config.config_watch_interval_ms);
    let source = Arc::new(NvmlSource::open(&config.nvml_library)?);
    let plugin = vgpu_plugin::start(config, source).await?;
    tokio::select! {
        signalled = process::signalled() => signalled?,
        _ = config_changed(watch, every) => tracing::info!(
            config = %args.config.display(),
            "the config file changed: stopping, so that kubelet restarts the plugin with the new config"
        ),
    }
    plugin.stop().await;
    Ok(())
}

fn main() -> std::process::ExitCode {
    process::run_daemon("vgpu-plugin", run(Args::parse()))
}
