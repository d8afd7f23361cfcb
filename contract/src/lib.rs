//! vgpu-contract: what a container and the host agree on, loaded into every tenant
//! process through the shims: the per-container quota config (`config`), byte sizes
//! (`size`), the `VGPU_LOG` setting (`log`), the monotonic clock (`clock`), the
//! cross-process usage region (`region`, and the host's private copy of it,
//! `snapshot`), process identity (`process`), what the compute limiter's region words
//! mean (`limiter_words`) and the host-written per-card view the limiter reads
//! (`cardview`, its format, reader and writer).
//!
//! The host-side compute coordination that writes the card views lives in
//! `vgpu-coordination`, one layer up; nothing here depends on it.
//!
//! Everything here is used from inside application processes (through the shims) as
//! well as from host daemons, so nothing here panics on bad input, spawns threads or
//! writes to stdout.

pub mod cardview;
pub mod clock;
pub mod config;
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
