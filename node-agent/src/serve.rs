//! A gRPC server on a unix socket, kept alive by a supervisor loop. Kubelet deletes the
//! sockets of its plugins when it restarts, so a supervisor asks [`ServedSocket::is_serving`]
//! each pass (the socket file is still the one bound, and the server still runs) and
//! serves again when not. The device plugin serves its two resources this way, the DRA
//! driver its DRA and registration sockets. Every connection goes through
//! [`vgpu_h2_authority::mend`], so kubelet's plugin watcher, which sends the socket's path
//! as the HTTP/2 `:authority`, is served too.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnixListenerStream;

/// How long a stopping server may take to finish its calls.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// Waits until each of `sockets` exists, about two seconds at most, so that whoever
/// started a daemon can connect to its sockets as soon as `start` returns.
pub async fn wait_for_sockets(sockets: &[PathBuf]) {
    for _ in 0..100 {
        if sockets.iter().all(|socket| socket.exists()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The inode of the file at `path` (not followed), to notice a socket replaced or removed.
pub fn socket_inode(path: &Path) -> Option<u64> {
    std::fs::symlink_metadata(path).ok().map(|meta| meta.ino())
}

/// One served socket.
pub struct ServedSocket {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
    inode: u64,
}

impl ServedSocket {
    /// Binds `path` (replacing a stale socket file there) and serves the router that
    /// `router` makes until [`ServedSocket::stop`]; `router` gets the stop signal, for
    /// services whose streams must end with the server.
    pub fn serve(
        path: &Path,
        router: impl FnOnce(watch::Receiver<bool>) -> tonic::transport::server::Router,
    ) -> anyhow::Result<ServedSocket> {
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path)
            .map_err(|err| anyhow::anyhow!("cannot listen on {}: {err}", path.display()))?;
        let inode = socket_inode(path).unwrap_or(0);
        let (stop, mut stopped) = watch::channel(false);
        let router = router(stopped.clone());
        let shown = path.display().to_string();
        let task = tokio::spawn(async move {
            let connections = UnixListenerStream::new(listener)
                .map(|connection| connection.map(vgpu_h2_authority::mend));
            let result = router
                .serve_with_incoming_shutdown(connections, async move {
                    let _ = stopped.wait_for(|stopped| *stopped).await;
                })
                .await;
            if let Err(err) = result {
                tracing::error!(socket = %shown, error = %err, "gRPC server failed");
            }
        });
        Ok(ServedSocket { stop, task, inode })
    }

    /// Whether the server still runs.
    pub fn is_running(&self) -> bool {
        !self.task.is_finished()
    }

    /// Whether the server still runs on the socket file it bound at `path`.
    pub fn is_serving(&self, path: &Path) -> bool {
        socket_inode(path) == Some(self.inode) && self.is_running()
    }

    /// Stops the server and waits (up to 5 s) for it to finish.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        if tokio::time::timeout(STOP_TIMEOUT, self.task).await.is_err() {
            tracing::warn!("a gRPC server did not stop within 5s");
        }
    }
}
