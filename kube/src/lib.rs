//! vgpu-kube: the few Kubernetes API calls vgpu-shim makes, on kube-rs and k8s-openapi
//! (`resource.k8s.io/v1`).
//!
//! Module map:
//! * [`client`]: a client in the cluster, from a kubeconfig, or for a test URL;
//! * [`quantity`]: exact integer reading and writing of resource quantities;
//! * [`slices`]: the node's ResourceSlices (one multi-allocatable device per card, with
//!   consumable `cores` and `memory`) and the publisher that keeps them current;
//! * [`claims`]: the reader of a ResourceClaim's allocation (this driver's results, their
//!   consumed capacity, the pods it is reserved for);
//! * [`events`]: Events (`events.k8s.io/v1`) on a tenant's pod (allocations refused at
//!   its quota, over quota);
//! * [`pods`]: the reader of gpu-manager's `tencent.com/vcuda-core-limit` pod annotation,
//!   with a documented fallback when the API server cannot be reached;
//! * `standin` (feature `standin`): a stand-in API server on loopback for tests.

#![forbid(unsafe_code)]

pub mod claims;
pub mod client;
pub mod events;
pub mod pods;
pub mod quantity;
pub mod slices;
#[cfg(feature = "standin")]
pub mod standin;

pub use client::{ClientSource, connect};
pub use k8s_openapi;
pub use kube;
