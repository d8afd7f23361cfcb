//! vgpu-node-agent: the node side both host daemons share, the device plugin
//! (`vgpu-plugin`) and the DRA driver (`vgpu-dra-plugin`). What is specific to one
//! kubelet API (deviceplugin v1beta1, or DRA) stays in that front end; what either
//! daemon does on the node whatever API it answers lives here.
//!
//! Module map:
//! * [`cdi`]: CDI spec files of allocations;
//! * [`persist`]: versioned JSON files read with a version check and written atomically;
//! * [`devices`]: device discovery and health behind [`devices::DeviceSource`] (NVML or fake);
//! * [`health`]: what `/healthz` answers;
//! * [`http`]: the plain-HTTP server `/metrics` and `/healthz` are served by (timeouts, a
//!   connection cap);
//! * [`tasks`]: a daemon's background tasks and health thread, stopped together;
//! * [`process`]: what both daemons' `main` does: logging, signals, the exit status.

#![forbid(unsafe_code)]

pub mod cdi;
pub mod devices;
pub mod health;
pub mod http;
pub mod persist;
pub mod process;
pub mod tasks;
