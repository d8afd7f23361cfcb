//! vgpu-node-agent: the node side both host daemons share, the device plugin
//! (`vgpu-plugin`) and the DRA driver (`vgpu-dra-plugin`). What is specific to one
//! kubelet API (deviceplugin v1beta1, or DRA) stays in that front end; what either
//! daemon does on the node whatever API it answers lives here.
//!
//! Module map:
//! * [`config`]: the node's YAML config (`plugin.yaml`; the DRA driver builds the same
//!   from its own file);
//! * [`layout`]: the per-container paths (config, usage region, card views, device
//!   nodes); the driver part of the mounts is `vgpu_ldconfig::layout`;
//! * [`state`]: allocation records, and the device plugin's state file of them;
//! * [`container`]: allocation folders, the container config, the container edits and
//!   their CDI spec;
//! * [`coordination`]: the host-side compute coordinator over the node's containers;
//! * [`quota_watch`]: what the quota did to each container (totals, info lines, Events);
//! * [`mps`]: the MPS sharing mode's hooks: daemons, health, container edits, quota;
//! * [`exposition`]: what both daemons' `/metrics` and `/healthz` share;
//! * [`cdi`]: CDI spec files of allocations;
//! * [`persist`]: versioned JSON files read with a version check and written atomically;
//! * [`devices`]: device discovery and health behind [`devices::DeviceSource`] (NVML or fake);
//! * [`dial`]: a gRPC channel to a server on a unix socket;
//! * [`folder_watch`]: wakes a supervisor when a folder's entries change (inotify);
//! * [`serve`]: a gRPC server on a unix socket that a supervisor keeps served, every
//!   connection's `:authority` mended;
//! * [`health`]: what `/healthz` answers;
//! * [`http`]: the plain-HTTP server `/metrics` and `/healthz` are served by (timeouts, a
//!   connection cap);
//! * [`tasks`]: a daemon's background tasks and health thread, stopped together;
//! * [`process`]: what both daemons' `main` does ([`process::run_daemon`]): logging, the
//!   banner, the runtime, signals, the exit status.

#![forbid(unsafe_code)]

pub mod cdi;
pub mod config;
pub mod container;
pub mod coordination;
pub mod devices;
pub mod dial;
pub mod exposition;
pub mod folder_watch;
pub mod health;
pub mod http;
pub mod layout;
pub mod mps;
pub mod persist;
pub mod process;
pub mod quota_watch;
pub mod serve;
pub mod state;
pub mod tasks;
