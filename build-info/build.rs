//! Records the commit the binaries are built from: `VGPU_COMMIT` when set (builds from a
//! tarball or a container build context, where there is no `.git`), else
//! `git rev-parse HEAD` of the source tree, else `unknown`. Re-runs when the variable or
//! the checked-out commit changes, and only then, so an unchanged tree never rebuilds.

use std::path::{Path, PathBuf};
use std::process::Command;

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let output = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    if !output.status.success() {
        return None;
    }
    let text = String::from_utf8(output.stdout).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_string())
}

/// A commit id is hex, 7 to 64 digits; anything else is not shown as one.
fn is_commit(text: &str) -> bool {
    (7..=64).contains(&text.len()) && text.bytes().all(|byte| byte.is_ascii_hexdigit())
}

fn main() {
    println!("cargo:rerun-if-env-changed=VGPU_COMMIT");
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let from_env = std::env::var("VGPU_COMMIT")
        .ok()
        .map(|value| value.trim().to_string())
        .filter(|value| !value.is_empty());
    let commit = match from_env {
        Some(value) if is_commit(&value) => value,
        Some(value) => panic!("VGPU_COMMIT={value:?} is not a commit id (7-64 hex digits)"),
        None => {
            // Watch HEAD, the branch it names and packed-refs (worktrees keep HEAD in
            // their own git folder and the refs in the common one; git-path knows both).
            for path in ["HEAD", "packed-refs"] {
                if let Some(file) = git(
                    &manifest,
                    &["rev-parse", "--path-format=absolute", "--git-path", path],
                ) {
                    println!("cargo:rerun-if-changed={file}");
                }
            }
            if let Some(branch) = git(&manifest, &["symbolic-ref", "-q", "HEAD"])
                && let Some(file) = git(
                    &manifest,
                    &["rev-parse", "--path-format=absolute", "--git-path", &branch],
                )
            {
                println!("cargo:rerun-if-changed={file}");
            }
            git(&manifest, &["rev-parse", "HEAD"])
                .filter(|commit| is_commit(commit))
                .unwrap_or_else(|| "unknown".to_string())
        }
    };
    println!("cargo:rustc-env=VGPU_BUILD_COMMIT={commit}");
}
