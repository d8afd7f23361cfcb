//! vgpu-plugin: the Kubernetes device plugin (deviceplugin v1beta1) that advertises
//! `tencent.com/vcuda-core` and `tencent.com/vcuda-memory`, hands each container a
//! per-container quota config and usage region, and mounts the shims over the
//! container's CUDA and NVML libraries.
//!
//! Module map:
//! * [`proto`]: the generated kubelet APIs (deviceplugin v1beta1, podresources v1);
//! * [`config`]: the plugin's own YAML config;
//! * [`devices`]: device discovery and health behind [`devices::DeviceSource`] (NVML or fake);
//! * [`ids`]: the device IDs advertised to kubelet;
//! * [`state`]: allocations kept on disk (`plugin-state.json`);
//! * [`persist`]: versioned JSON files read with a version check and written atomically;
//! * [`annotations`]: `tencent.com/vcuda-core-limit` read from the pod at PreStart;
//! * [`allocator`]: card choice, pairing of core and memory, refusals, PreStart;
//! * [`cdi`]: CDI spec files of allocations (shared with the DRA driver);
//! * [`container`]: allocation folders, the container config, the Allocate response;
//! * [`layout`]: the per-container paths (config, usage region, card views, device
//!   nodes); the driver part of the mounts is `vgpu_ldconfig::layout`;
//! * [`kubelet`]: unix-socket gRPC clients (Registration, PodResources);
//! * [`service`]: the DevicePlugin gRPC service of one resource;
//! * [`daemon`]: sockets, registration, re-registration, GC, shutdown;
//! * [`serve`]: a gRPC server on a unix socket that a supervisor keeps served (shared with the DRA driver);
//! * [`tasks`]: a daemon's background tasks and health thread, stopped together (shared with the DRA driver);
//! * [`coexist`]: refusing to start beside another plugin serving our resource names;
//! * [`usage`]: running totals of each container's counters, monotonic across exits;
//! * [`health`]: what `/healthz` answers;
//! * [`reload`]: noticing a changed config file (the plugin then exits to be restarted);
//! * [`process`]: what both daemons' `main` does: logging, signals, the exit status;
//! * [`coordination`]: the host-side compute coordinator over the node's containers;
//! * [`metrics`]: Prometheus metrics and `/healthz`;
//! * [`http`]: the plain-HTTP server they are served by (timeouts, a connection cap;
//!   shared with the DRA driver).
//! * [`mps`]: the MPS sharing mode's hooks: daemons, health, container edits, quota.

#![forbid(unsafe_code)]

pub mod admitting;
pub mod allocator;
pub mod annotations;
pub mod cdi;
pub mod coexist;
pub mod config;
pub mod container;
pub mod coordination;
pub mod daemon;
pub mod devices;
pub mod health;
pub mod http;
pub mod ids;
pub mod kubelet;
pub mod layout;
pub mod metrics;
pub mod mps;
pub mod persist;
pub mod process;
pub mod proto;
pub mod quota_watch;
pub mod reload;
pub mod serve;
pub mod service;
pub mod state;
pub mod tasks;
pub mod usage;

pub use config::PluginConfig;
pub use daemon::{PluginHandle, start};
pub use devices::{CardInfo, DeviceSource};
