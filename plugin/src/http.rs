//! The plain-HTTP server of `/metrics` and `/healthz`, shared by the device plugin and
//! the DRA driver. Anyone who can reach the port can connect, so it holds up against
//! idle, slow and many connections without starving the daemon it runs in:
//!
//! * a request's header must arrive within [`HEADER_TIMEOUT`], and a connection lives
//!   [`CONNECTION_LIFETIME`] at most (keep-alive included);
//! * at most [`MAX_CONNECTIONS`] are served at once; connections beyond that are
//!   accepted and closed at once, so the backlog drains and no descriptor is held;
//!   [`RESERVED_LOCAL`] more are kept for connections from the node itself (loopback,
//!   or the listening address: kubelet's probes of a hostNetwork pod), so a flood from
//!   pods cannot fail the liveness probe;
//! * an accept error (the process out of descriptors, say) backs off, 10 ms doubling up
//!   to 1 s, instead of spinning, and is logged once per back-off run.
//!
//! What this does not do is decide who may connect: that is the listening address
//! and the network around it (deploy/README.md, "Who can reach the metrics port").

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::{Method, Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

/// How long a client may take to send a request's header.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one connection is served at most.
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(30);
/// Connections served at once (from anywhere).
pub const MAX_CONNECTIONS: usize = 32;
/// Further connections served at once for clients on the node itself.
pub const RESERVED_LOCAL: usize = 8;
/// The first and the longest pause after an accept error.
const ACCEPT_BACKOFF: (Duration, Duration) = (Duration::from_millis(10), Duration::from_secs(1));

/// What a request is answered with: the method and the path in, the response out.
pub type Handler = Arc<
    dyn Fn(Method, String) -> Pin<Box<dyn Future<Output = Response<String>> + Send>> + Send + Sync,
>;

/// Whether `peer` is on the node itself, seen from a connection accepted at `local`.
fn from_node(peer: SocketAddr, local: Option<SocketAddr>) -> bool {
    peer.ip().is_loopback() || local.is_some_and(|local| local.ip() == peer.ip())
}

/// Serves `handler` on `listener` until `stop`.
pub async fn serve(listener: TcpListener, handler: Handler, mut stop: watch::Receiver<bool>) {
    let anyone = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let local = Arc::new(Semaphore::new(RESERVED_LOCAL));
    let mut backoff: Option<Duration> = None;
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|stopped| *stopped) => return,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => {
                backoff = None;
                accepted
            }
            Err(err) => {
                let pause = match backoff {
                    None => {
                        tracing::warn!(error = %err, "metrics server cannot accept; backing off");
                        ACCEPT_BACKOFF.0
                    }
                    Some(pause) => (pause * 2).min(ACCEPT_BACKOFF.1),
                };
                backoff = Some(pause);
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = stop.wait_for(|stopped| *stopped) => return,
                }
                continue;
            }
        };
        let permit = anyone.clone().try_acquire_owned().or_else(|full| {
            if from_node(peer, stream.local_addr().ok()) {
                local.clone().try_acquire_owned()
            } else {
                Err(full)
            }
        });
        let Ok(permit) = permit else {
            tracing::debug!(%peer, "metrics server full: connection closed");
            continue;
        };
        let handler = handler.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let answer = handler(request.method().clone(), request.uri().path().to_string());
                async move { Ok::<_, Infallible>(answer.await) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            match tokio::time::timeout(CONNECTION_LIFETIME, connection).await {
                Ok(Err(err)) => {
                    tracing::debug!(error = %err, "metrics connection ended with an error")
                }
                Ok(Ok(())) => {}
                Err(_) => tracing::debug!(%peer, "metrics connection closed at its time limit"),
            }
        });
    }
}

/// Binds `address` and serves `handler` there until `stop`: the bound address (port 0
/// picks a free one).
pub async fn bind_and_serve(
    address: SocketAddr,
    handler: Handler,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(address)
        .await
        .map_err(|err| anyhow::anyhow!("cannot serve metrics on {address}: {err}"))?;
    let bound = listener.local_addr()?;
    tracing::info!(address = %bound, "serving /metrics and /healthz");
    Ok((bound, tokio::spawn(serve(listener, handler, stop))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_itself_is_loopback_or_the_listening_address() {
        let local: SocketAddr = "10.0.0.5:9401".parse().expect("addr");
        assert!(from_node(
            "127.0.0.1:5000".parse().expect("addr"),
            Some(local)
        ));
        assert!(from_node(
            "10.0.0.5:5000".parse().expect("addr"),
            Some(local)
        ));
        assert!(!from_node(
            "10.0.0.6:5000".parse().expect("addr"),
            Some(local)
        ));
        assert!(!from_node("10.0.0.6:5000".parse().expect("addr"), None));
    }
}
