//! Test plumbing shared by every crate's tests: where a Cargo build left the workspace's
//! libraries and programs and where the repository is (`built`), Debian's driver packages the export checks read
//! (`debian`), a client's `RESULT` line (`client_output`), kubelet's own gRPC client
//! (`kubelet_dial`), a series of a metrics text (`exposition`), the GPU suite's C workload
//! built for a test (`workload`), and the one policy for
//! what a test needs from the
//! machine (`prerequisites`, the `require!` macro).
//!
//! The policy, in short: a test that needs something this workspace does not build
//! (root, runc, podman, debootstrap, cargo-zigbuild, Go, git, Python packages, Debian's
//! driver packages, the host's initial PID namespace) says so with [`require!`]. Outside CI a missing prerequisite skips the test
//! with one plain `SKIPPED` line on the terminal; in CI (`CI=true`, where `tests/run.sh`
//! installs everything) it fails the test, so CI never passes by skipping.

#![forbid(unsafe_code)]

pub mod built;
pub mod client_output;
pub mod debian;
pub mod exposition;
pub mod kubelet_dial;
pub mod prerequisites;
pub mod workload;

pub use built::{built, in_profile_dir, profile_dir, repo_root};
pub use client_output::result_line;
pub use debian::unpack_debian_driver;
pub use exposition::metric_value;
pub use kubelet_dial::kubelet_dial;
pub use prerequisites::{Need, in_ci, present};
pub use workload::streams_workload;
