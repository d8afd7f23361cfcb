//! Shared pieces of vgpu-shim: the per-container quota config (`config`), byte sizes
//! (`size`), the cross-process usage region (`region`) and process identity (`process`).
//!
//! Everything here is used from inside application processes (through the shims) as
//! well as from host daemons, so nothing here panics on bad input, spawns threads or
//! writes to stdout.

pub mod cardstate;
pub mod config;
pub mod mapped;
pub mod process;
pub mod region;
pub mod size;
pub mod snapshot;

pub use config::{Config, ConfigError, CoreMode, DeviceQuota, DeviceSelector, UtilizationScale};
pub use size::ByteSize;
