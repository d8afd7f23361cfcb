//! vgpu-plugin: the Kubernetes device plugin (deviceplugin v1beta1) that advertises
//! `tencent.com/vcuda-core` and `tencent.com/vcuda-memory`, hands each container a
//! per-container quota config and usage region, and mounts the shims over the
//! container's CUDA and NVML libraries.
//!
//! The node side it shares with the DRA driver (its config, the allocation records and
//! folders, CDI specs, state files, devices, health, the HTTP server and the metrics'
//! shared parts, the coordinator's tick, the quota watch, MPS, background tasks, process
//! plumbing) is `vgpu_node_agent`.
//!
//! The kubelet APIs it speaks (deviceplugin v1beta1, podresources v1) are generated
//! once, in `vgpu_kubelet_api`.
//!
//! Module map:
//! * [`ids`]: the device IDs advertised to kubelet;
//! * [`annotations`]: `tencent.com/vcuda-core-limit` read from the pod at PreStart;
//! * [`allocator`]: card choice, pairing of core and memory, refusals, PreStart;
//! * [`kubelet`]: unix-socket gRPC clients (Registration, PodResources);
//! * [`service`]: the DevicePlugin gRPC service of one resource;
//! * [`daemon`]: sockets, registration, re-registration, GC, shutdown;
//! * [`coexist`]: refusing to start beside another plugin serving our resource names;
//! * [`response`]: the Allocate response and the files PreStartContainer leaves;
//! * [`usage`]: running totals of each container's counters, monotonic across exits;
//! * [`reload`]: noticing a changed config file (the plugin then exits to be restarted);
//! * [`metrics`]: Prometheus metrics and `/healthz`.

#![forbid(unsafe_code)]

pub mod admitting;
pub mod allocator;
pub mod annotations;
pub mod coexist;
pub mod daemon;
pub mod ids;
pub mod kubelet;
pub mod metrics;
pub mod reload;
pub mod response;
pub mod service;
pub mod usage;

pub use daemon::{PluginHandle, start};
