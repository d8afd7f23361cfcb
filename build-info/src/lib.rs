//! What every vgpu-shim binary says about itself: the workspace version (Cargo.toml's
//! `workspace.package.version`, the image tag too) and the commit it was built from
//! (`VGPU_COMMIT` at build time, else the source tree's git HEAD, else `unknown`).
//!
//! ```ignore
//! #[derive(clap::Parser)]
//! #[command(version = vgpu_build_info::VERSION_LINE)]   // `vgpu-plugin --version`
//! struct Args {}
//!
//! tracing::info!("{}", vgpu_build_info::banner("vgpu-plugin"));  // first log line
//! ```

#![forbid(unsafe_code)]

/// The workspace version, e.g. `0.1.0`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The full commit id the binary was built from, or `unknown`.
pub const COMMIT: &str = env!("VGPU_BUILD_COMMIT");

/// What `--version` prints after the binary's name: `0.1.0 (commit 0123abcd...)`.
pub const VERSION_LINE: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("VGPU_BUILD_COMMIT"),
    ")"
);

/// The first 12 digits of [`COMMIT`] (all of `unknown`).
pub fn short_commit() -> &'static str {
    COMMIT.get(..12).unwrap_or(COMMIT)
}

/// The start-up line: `vgpu-plugin 0.1.0 (commit 0123abcd4567)`.
pub fn banner(binary: &str) -> String {
    format!("{binary} {VERSION} (commit {})", short_commit())
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_test_support::{Need, require};

    #[test]
    fn version_is_the_workspace_version_and_the_banner_names_the_commit() {
        assert_eq!(VERSION, env!("CARGO_PKG_VERSION"));
        assert!(VERSION_LINE.starts_with(VERSION));
        assert!(VERSION_LINE.contains(COMMIT));
        assert_eq!(
            banner("x"),
            format!("x {VERSION} (commit {})", short_commit())
        );
    }

    #[test]
    fn the_commit_is_known_in_a_checkout() {
        // The image build names it (VGPU_COMMIT); elsewhere git reads it from the
        // checkout, so a machine without git records `unknown`, as documented.
        if option_env!("VGPU_COMMIT").is_none() {
            require!(Need::program("git", "apt-get install git"));
        }
        assert_ne!(COMMIT, "unknown", "no commit recorded");
        assert!(COMMIT.bytes().all(|byte| byte.is_ascii_hexdigit()));
        assert_eq!(short_commit(), &COMMIT[..12]);
    }
}
