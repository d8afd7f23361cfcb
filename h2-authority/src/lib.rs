//! Mends the HTTP/2 `:authority` that kubelet's plugin watcher sends, so h2 takes the
//! call: a relay in front of every unix socket the device plugin and the DRA driver serve.
//!
//! kubelet v1.37.2's plugin watcher (`pkg/kubelet/pluginmanager/operationexecutor`) dials
//! a registration socket with the socket's path as the gRPC target and no authority set,
//! so grpc-go sends the path, percent-encoded, as `:authority`:
//! `%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fgpu.vgpu-shim.io-reg.sock`. The `http`
//! crate refuses a `%` in a host, so h2 resets the stream with PROTOCOL_ERROR before
//! tonic sees the call, and the DRA driver never registers. (The device manager and the
//! DRA plugin manager send `localhost`; h2 has no switch for this.)
//!
//! [`mend`] puts every connection through a pump: the client's header blocks are decoded
//! (HPACK, with the client's dynamic table kept), an `:authority` that is no URI
//! authority becomes `localhost` (what grpc-go sends for a `unix:` target), and each
//! block is encoded again as plain literals, never indexed. Every other frame passes
//! unchanged, both ways; hostile frames end the connection. The client's bytes are
//! relayed by a pure state machine ([`Relay`], [`relay_all`]) that the fuzz target
//! `h2_authority` drives. Cost: one decode and encode of each request's header block (a
//! few hundred bytes) and one copy of every byte; these sockets carry a few calls a
//! minute.
//!
//! * [`mender`]: one connection's header blocks, decoded, mended and encoded again;
//! * [`relay`]: the client's byte stream, frame by frame, over the mender;
//! * `pump` (feature `tokio`, on by default): [`mend`], the async pump of a connection.

#![forbid(unsafe_code)]

pub mod mender;
#[cfg(feature = "tokio")]
mod pump;
pub mod relay;

pub use mender::{MendError, Mender, is_authority};
#[cfg(feature = "tokio")]
pub use pump::mend;
pub use relay::{PREFACE, Relay, relay_all};
