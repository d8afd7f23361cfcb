//! Shared pieces of vgpu-shim: the per-container quota config (`config`), byte sizes
//! (`size`), the `VGPU_LOG` setting (`log`), the monotonic clock (`clock`), the
//! cross-process usage region (`region`, and the host's private copy of it,
//! `snapshot`), process identity (`process`), and compute coordination: what the
//! limiter's region words mean (`limiter_words`), the host-owned per-card view
//! (`cardview`), the host-side coordinator that writes it (`coordinator`), what the card
//! itself measured (`cardmeter`, NVML with the `nvml` feature) and the host PIDs it
//! knows the containers' processes by (`hostpids`).
//!
//! Everything here is used from inside application processes (through the shims) as
//! well as from host daemons, so nothing here panics on bad input, spawns threads or
//! writes to stdout.

pub mod backstop;
pub mod cardmeter;
pub mod cardview;
pub mod clock;
pub mod config;
pub mod coordinator;
pub mod hostpids;
pub mod limiter_words;
pub mod log;
pub mod mapped;
pub mod process;
pub mod region;
pub mod size;
pub mod snapshot;

pub use config::{
    Config, ConfigError, CoreMode, DeviceQuota, DeviceSelector, OverQuota, UtilizationScale,
};
pub use size::ByteSize;
