//! vgpu-plugin: the Kubernetes device plugin (deviceplugin v1beta1) that advertises
//! `tencent.com/vcuda-core` and `tencent.com/vcuda-memory`, hands each container a
//! per-container quota config and usage region, and mounts the shims over the
//! container's CUDA and NVML libraries.
//!
//! The node side it shares with the DRA driver (CDI specs, state files, devices, health,
//! the HTTP server, background tasks, process plumbing) is `vgpu_node_agent`.
//!
//! Module map:
//! * [`proto`]: the generated kubelet APIs (deviceplugin v1beta1, podresources v1);
//! * [`config`]: the plugin's own YAML config;
//! * [`ids`]: the device IDs advertised to kubelet;
//! * [`state`]: allocations kept on disk (`plugin-state.json`);
//! * [`annotations`]: `tencent.com/vcuda-core-limit` read from the pod at PreStart;
//! * [`allocator`]: card choice, pairing of core and memory, refusals, PreStart;
//! * [`container`]: allocation folders, the container config, the Allocate response;
//! * [`layout`]: the per-container paths (config, usage region, card views, device
//!   nodes); the driver part of the mounts is `vgpu_ldconfig::layout`;
//! * [`kubelet`]: unix-socket gRPC clients (Registration, PodResources);
//! * [`service`]: the DevicePlugin gRPC service of one resource;
//! * [`daemon`]: sockets, registration, re-registration, GC, shutdown;
//! * [`serve`]: a gRPC server on a unix socket that a supervisor keeps served (shared with the DRA driver);
//! * [`authority`]: mends the HTTP/2 `:authority` kubelet's plugin watcher sends (a socket
//!   path, which h2 refuses) on every connection [`serve`] takes;
//! * [`coexist`]: refusing to start beside another plugin serving our resource names;
//! * [`usage`]: running totals of each container's counters, monotonic across exits;
//! * [`reload`]: noticing a changed config file (the plugin then exits to be restarted);
//! * [`coordination`]: the host-side compute coordinator over the node's containers;
//! * [`metrics`]: Prometheus metrics and `/healthz`;
//! * [`mps`]: the MPS sharing mode's hooks: daemons, health, container edits, quota.

#![forbid(unsafe_code)]

pub mod admitting;
pub mod allocator;
pub mod annotations;
pub mod authority;
pub mod coexist;
pub mod config;
pub mod container;
pub mod coordination;
pub mod daemon;
pub mod ids;
pub mod kubelet;
pub mod layout;
pub mod metrics;
pub mod mps;
pub mod proto;
pub mod quota_watch;
pub mod reload;
pub mod serve;
pub mod service;
pub mod state;
pub mod usage;

pub use config::PluginConfig;
pub use daemon::{PluginHandle, start};
