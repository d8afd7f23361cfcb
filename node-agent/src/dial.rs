//! A gRPC channel to a server on a unix socket: kubelet's sockets for the device plugin,
//! and the daemons' own sockets for their tests and for the check that no other plugin
//! serves our resources.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

/// How long the connection, and each call on the channel, may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// A channel to the gRPC server on the unix socket `path`.
pub async fn connect_unix(path: &Path) -> anyhow::Result<Channel> {
    let path: PathBuf = path.to_path_buf();
    let shown = path.display().to_string();
    // The URI is required by the API but unused: the connector always dials `path`.
    let channel = Endpoint::from_static("http://localhost")
        .connect_timeout(CALL_TIMEOUT)
        .timeout(CALL_TIMEOUT)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
        .map_err(|err| anyhow::anyhow!("cannot connect to {shown}: {err}"))?;
    Ok(channel)
}
