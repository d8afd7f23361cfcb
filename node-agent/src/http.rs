//! The plain-HTTP server of `/metrics` and `/healthz`, shared by the device plugin and
//! the DRA driver. Anyone who can reach the port can connect, so it holds up against
//! idle, slow and many connections without starving the daemon it runs in:
//!
//! * a request's header must arrive within [`HEADER_TIMEOUT`], and a connection lives
//!   [`CONNECTION_LIFETIME`] at most (keep-alive included);
//! * at most [`PER_PEER`] are served at once for one client address, so one pod's
//!   flood leaves the rest for kubelet's probes and Prometheus (who each hold one or
//!   two), and at most [`MAX_CONNECTIONS`] in all; connections beyond that are
//!   accepted and closed at once, so the backlog drains and no descriptor is held;
//!   [`RESERVED_LOCAL`] more are kept for connections from the node itself (loopback,
//!   or the listening address: kubelet's probes of a hostNetwork pod), so a flood from
//!   many pods cannot fail the liveness probe either;
//! * an accept error (the process out of descriptors, say) backs off, 10 ms doubling up
//!   to 1 s, instead of spinning, and is logged once per back-off run.
//!
//! What this does not do is decide who may connect: that is the listening address
//! and the network around it (deploy/README.md, "Who can reach the metrics port").

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::body::Incoming;
use hyper::{Method, Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::watch;

/// How long a client may take to send a request's header.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one connection is served at most.
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(30);
/// Connections served at once (from anywhere).
pub const MAX_CONNECTIONS: usize = 32;
/// Further connections served at once for clients on the node itself.
pub const RESERVED_LOCAL: usize = 8;
/// Connections served at once for one client address.
pub const PER_PEER: usize = 4;
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

/// The connections served now: per client address, and in all (the shared ones and
/// those from the reserve kept for the node). Entries exist only for clients served
/// now, so it holds at most [`MAX_CONNECTIONS`] + [`RESERVED_LOCAL`] of them.
#[derive(Debug, Default)]
struct Admission {
    per_peer: HashMap<IpAddr, usize>,
    shared: usize,
    reserved: usize,
}

/// A connection's place in [`Admission`], given back when it is dropped.
struct Ticket {
    served: Arc<Mutex<Admission>>,
    peer: IpAddr,
    reserved: bool,
}

impl Admission {
    /// A place for a connection from `peer` (`node`: on the node itself), or `None`
    /// when the peer has [`PER_PEER`] already or every place it may take is taken.
    fn admit(served: &Arc<Mutex<Admission>>, peer: IpAddr, node: bool) -> Option<Ticket> {
        let mut admission = served
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let reserved = admission.take(peer, node)?;
        Some(Ticket {
            served: served.clone(),
            peer,
            reserved,
        })
    }

    /// Takes a place for `peer`: whether it is one of the reserve.
    fn take(&mut self, peer: IpAddr, node: bool) -> Option<bool> {
        let held = self.per_peer.get(&peer).copied().unwrap_or(0);
        if held >= PER_PEER {
            return None;
        }
        let reserved = if self.shared < MAX_CONNECTIONS {
            self.shared += 1;
            false
        } else if node && self.reserved < RESERVED_LOCAL {
            self.reserved += 1;
            true
        } else {
            return None;
        };
        self.per_peer.insert(peer, held + 1);
        Some(reserved)
    }

    /// Gives back a place `peer` took.
    fn give_back(&mut self, peer: IpAddr, reserved: bool) {
        if reserved {
            self.reserved = self.reserved.saturating_sub(1);
        } else {
            self.shared = self.shared.saturating_sub(1);
        }
        if let Some(held) = self.per_peer.get_mut(&peer) {
            *held -= 1;
            if *held == 0 {
                self.per_peer.remove(&peer);
            }
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.served
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .give_back(self.peer, self.reserved);
    }
}

/// Serves `handler` on `listener` until `stop`.
pub async fn serve(listener: TcpListener, handler: Handler, mut stop: watch::Receiver<bool>) {
    let served = Arc::new(Mutex::new(Admission::default()));
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
        let node = from_node(peer, stream.local_addr().ok());
        let Some(permit) = Admission::admit(&served, peer.ip(), node) else {
            tracing::debug!(%peer, "metrics server full for this client: connection closed");
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

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("ip")
    }

    #[test]
    fn one_client_gets_a_few_places_and_the_rest_stay_for_others() {
        let mut admission = Admission::default();
        let flood = ip("10.0.0.66");
        let taken = (0..100)
            .filter(|_| admission.take(flood, false).is_some())
            .count();
        assert_eq!(taken, PER_PEER, "one address holds a few places at most");
        assert_eq!(admission.take(ip("10.0.0.9"), false), Some(false));
        admission.give_back(flood, false);
        assert_eq!(
            admission.take(flood, false),
            Some(false),
            "a place given back"
        );
    }

    #[test]
    fn many_clients_fill_the_shared_places_and_the_node_keeps_its_reserve() {
        let mut admission = Admission::default();
        let peers: Vec<IpAddr> = (1..=200)
            .map(|n| ip(&format!("10.1.{}.{}", n / 250, n % 250 + 1)))
            .collect();
        let taken = peers
            .iter()
            .filter(|peer| admission.take(**peer, false).is_some())
            .count();
        assert_eq!(taken, MAX_CONNECTIONS);
        assert_eq!(
            admission.take(ip("10.9.9.9"), false),
            None,
            "shared places full"
        );
        // The node's own probes still get in, up to the reserve, a few per address.
        let kubelet = ip("10.0.0.5");
        assert_eq!(admission.take(kubelet, true), Some(true));
        let reserve = 1
            + (0..RESERVED_LOCAL)
                .map(|n| ip(&format!("127.0.0.{}", n + 2)))
                .filter(|peer| admission.take(*peer, true).is_some())
                .count();
        assert_eq!(reserve, RESERVED_LOCAL);
        assert_eq!(admission.take(ip("127.0.0.99"), true), None);
        // Everything given back leaves nothing behind.
        for peer in peers.iter().take(MAX_CONNECTIONS) {
            admission.give_back(*peer, false);
        }
        admission.give_back(kubelet, true);
        for n in 0..RESERVED_LOCAL - 1 {
            admission.give_back(ip(&format!("127.0.0.{}", n + 2)), true);
        }
        assert!(admission.per_peer.is_empty(), "{admission:?}");
        assert_eq!((admission.shared, admission.reserved), (0, 0));
    }

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
