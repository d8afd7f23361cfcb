//! What both daemons' `main` does around its work (`vgpu-plugin` and
//! `vgpu-dra-plugin`): logging set up from `VGPU_LOG` on stderr, the version banner, the
//! runtime, the wait for SIGTERM or SIGINT, and the exit status with the error logged
//! ([`run_daemon`] is a daemon's whole `main` but for its arguments).

use std::future::Future;
use std::process::ExitCode;

/// Runs a daemon: logging from `VGPU_LOG` ([`init_logging`]), the version banner of
/// `name`, then `work` on a multi-threaded tokio runtime (timers and I/O enabled, as
/// `#[tokio::main]` builds it); the exit status is [`exit_code`]'s.
pub fn run_daemon(name: &str, work: impl Future<Output = anyhow::Result<()>>) -> ExitCode {
    init_logging();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => return exit_code(Err(anyhow::anyhow!("cannot start the runtime: {err}"))),
    };
    exit_code(runtime.block_on(async {
        tracing::info!("{}", vgpu_build_info::banner(name));
        work.await
    }))
}

/// Logs to stderr at the level `VGPU_LOG` names (the one parser every component
/// shares); unset, or naming no level, `info`.
pub fn init_logging() {
    let level = vgpu_contract::log::Level::from_env(vgpu_contract::log::Level::Info);
    let filter = tracing_subscriber::EnvFilter::new(level.directive());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

/// Returns at SIGTERM or SIGINT, having logged which; fails if the handler cannot be set.
pub async fn signalled() -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate())?;
    tokio::select! {
        _ = terminate.recv() => tracing::info!("SIGTERM: stopping"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: stopping"),
    }
    Ok(())
}

/// The exit status of a daemon that ended with `result`; an error is logged with its
/// causes.
pub fn exit_code(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!("{err:#}");
            ExitCode::FAILURE
        }
    }
}
