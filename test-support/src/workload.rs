//! The GPU suite's driver-API workload (`tests/gpu/limiter/streams.c`) built for a test,
//! so that the simulated driver runs exactly what the H200 runs.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Compiles `tests/gpu/limiter/streams.c` into `dir/streams` (warnings are errors) and
/// returns its path. Panics when `cc` is missing or the build fails: `cc`, which links
/// Rust, is taken as given (`prerequisites`).
pub fn streams_workload(dir: &Path) -> PathBuf {
    let source = crate::repo_root().join("tests/gpu/limiter/streams.c");
    let binary = dir.join("streams");
    let status = Command::new("cc")
        .args(["-O2", "-Wall", "-Werror", "-o"])
        .arg(&binary)
        .arg(&source)
        .args(["-ldl", "-lpthread"])
        .status()
        .expect("run cc (a C compiler is needed)");
    assert!(status.success(), "cc {}", source.display());
    binary
}
