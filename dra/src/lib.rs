//! vgpu-dra: the DRA kubelet plugin of vgpu-shim (`vgpu-dra-plugin`). Kubernetes places
//! each claim on one card from the ResourceSlices this plugin publishes (consumable
//! `cores` and `memory`, KEP-5075); this plugin turns each allocated share into the
//! container's quota config, usage region and CDI spec, which the shims enforce.
//!
//! The kubelet APIs it speaks (dra v1 and v1beta1, pluginregistration v1) are generated
//! once, in `vgpu_kubelet_api`.
//!
//! Module map:
//! * [`config`]: the plugin's YAML config;
//! * [`cards`]: the cards as the slices describe them (discovery plus NVML details);
//! * [`checkpoint`]: prepared claims on disk (`dra-state.json`);
//! * [`prepare`]: a claim's allocation → config, region and CDI spec, and back;
//! * [`registration`]: the pluginregistration service kubelet's plugin watcher calls;
//! * `service`: the DRAPlugin service, both versions;
//! * [`daemon`]: sockets, re-serving, health, slice publishing, shutdown;
//! * `metrics`: `/metrics` and `/healthz` on the device plugin's HTTP server.

#![forbid(unsafe_code)]

pub mod cards;
pub mod checkpoint;
pub mod config;
pub mod daemon;
mod metrics;
pub mod prepare;
pub mod registration;
mod service;

pub use config::DraConfig;
pub use daemon::{DraHandle, start};
