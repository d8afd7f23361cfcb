//! The shims' logging: off unless `VGPU_LOG` names a level (parsed once, by
//! `vgpu_contract::log`, the parser every component shares), one stderr line a message;
//! and the few notices the user must hear whatever the level.

use std::sync::OnceLock;

pub use vgpu_contract::log::Level;

/// The level `VGPU_LOG` set (off when it names none), read once.
pub fn log_level() -> Level {
    static LEVEL: OnceLock<Level> = OnceLock::new();
    *LEVEL.get_or_init(|| Level::from_env(Level::Off))
}

/// Writes one line to stderr if `level` is enabled.
pub fn log(level: Level, shim: &str, message: std::fmt::Arguments<'_>) {
    if log_level().shows(level) {
        eprintln!("vgpu-shim[{shim} {}]: {message}", std::process::id());
    }
}

/// Writes one line to stderr whatever the log level: for the few conditions the user
/// must hear about (a broken config, a missing real library).
pub fn notice(shim: &str, message: std::fmt::Arguments<'_>) {
    eprintln!("vgpu-shim[{shim}]: {message}");
}
