//! The one policy for a test's prerequisites: what a test needs from the machine that
//! this workspace does not build itself.
//!
//! - A test names what it needs at its start: `require!(Need::Root, Need::program("runc",
//!   "apt-get install runc"))`. Everything else it uses (the shims, the sim driver, the
//!   binaries) `cargo test --workspace` builds, and `cc`, which links Rust, is taken as given.
//! - **Outside CI** a missing prerequisite skips the test: it passes, and one line
//!   `SKIPPED <test>: missing <what> (<how to get it>)` is written straight to the
//!   terminal's stderr, past the test harness's capture, so a passing run shows every skip.
//! - **In CI** (`CI` set to anything but empty, `0` or `false`; `tests/run.sh`
//!   installs every prerequisite) a missing prerequisite fails the test. CI never
//!   passes by skipping.
//!
//! A fresh clone's `cargo test --workspace` on a machine with nothing installed therefore
//! passes, with its skips stated, and CI runs every test for real.

use crate::debian::{DEBIAN_DRIVER_PACKAGES, DEBIAN_DRIVER_VERSION, debian_deb, debian_debs};
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::process::{Command, Stdio};

/// One thing a test needs from the machine.
#[derive(Clone, Debug)]
pub enum Need<'a> {
    /// Running as root (mount namespaces, `ldconfig -r`, runc, podman).
    Root,
    /// What `vgpu run` makes for its command: a mount and a PID namespace with its own
    /// `/proc`. Root with `CAP_SYS_ADMIN` has them; any other user (root in an
    /// unprivileged container included) only where unprivileged user namespaces may
    /// mount a `/proc`, as util-linux's `unshare` finds out (not inside a container
    /// whose `/proc` has masked paths).
    Namespaces,
    /// A program that runs `NAME PROBE` successfully (`podman --version`).
    Program {
        /// The program, looked up on `PATH`.
        name: &'a str,
        /// An argument it answers with success (`--version`, `--help`).
        probe: &'a str,
        /// How to get it.
        install: &'a str,
    },
    /// `python3` that imports each of these modules.
    Python(&'a [&'a str]),
    /// Debian's 535 driver packages in [`debian_debs`] (`tests/run.sh` downloads them),
    /// and `dpkg` to unpack them.
    DebianDebs,
    /// A library or program of this workspace (named as in `target/<profile>/`) that the
    /// crate under test does not build itself (`vgpu` for the DRA driver's tests).
    Built(&'a str),
    /// Anything else, checked by the caller.
    Other {
        /// What it is.
        what: &'a str,
        /// Whether this machine has it.
        present: bool,
        /// How to get it.
        install: &'a str,
    },
}

impl<'a> Need<'a> {
    /// A program answering `NAME --version`.
    pub fn program(name: &'a str, install: &'a str) -> Need<'a> {
        Need::Program {
            name,
            probe: "--version",
            install,
        }
    }

    /// What is missing, with how to get it; `None` when this machine has it.
    pub fn missing(&self) -> Option<String> {
        match self {
            Need::Root => (!is_root()).then(|| {
                "root with CAP_SYS_ADMIN (run the tests as root, not in an unprivileged container)"
                    .to_string()
            }),
            Need::Namespaces => (!is_root()
                && !runs(
                    "unshare",
                    &[
                        "--user",
                        "--map-root-user",
                        "--mount",
                        "--pid",
                        "--fork",
                        "--mount-proc",
                        "true",
                    ],
                ))
            .then(|| {
                "mount and PID namespaces with a /proc of their own (root with CAP_SYS_ADMIN, or \
                 unprivileged user namespaces on a host or VM, not in an unprivileged container)"
                    .to_string()
            }),
            Need::Program {
                name,
                probe,
                install,
            } => (!runs(name, &[probe])).then(|| format!("{name} ({install})")),
            Need::Python(modules) => (!python_imports(modules)).then(|| {
                format!(
                    "python3 with {} (python3 -m pip install {})",
                    modules.join(", "),
                    pip_packages(modules)
                )
            }),
            Need::DebianDebs => {
                let folder = debian_debs();
                let absent = missing_debs(&folder);
                (!absent.is_empty()).then(|| {
                    format!(
                        "{} in {} (set VGPU_DEBIAN_DEBS to a folder of `apt-get download {}` \
                         with Debian's non-free component enabled, as tests/run.sh does)",
                        absent.join(", "),
                        folder.display(),
                        DEBIAN_DRIVER_PACKAGES
                            .map(|package| format!("{package}={DEBIAN_DRIVER_VERSION}-1"))
                            .join(" "),
                    )
                })
            }
            Need::Built(name) => crate::built::built(name)
                .is_none()
                .then(|| format!("{name} of this build (cargo build --workspace)")),
            Need::Other {
                what,
                present,
                install,
            } => (!present).then(|| format!("{what} ({install})")),
        }
    }
}

/// Whether this runs under CI: `CI` set to anything but empty, `0` or `false`.
pub fn in_ci() -> bool {
    ci_value_means_ci(std::env::var("CI").ok().as_deref())
}

fn ci_value_means_ci(value: Option<&str>) -> bool {
    value.is_some_and(|value| !matches!(value.trim(), "" | "0" | "false" | "FALSE" | "False"))
}

/// What the policy makes of a test with `missing` prerequisites.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing is missing: the test runs.
    Run,
    /// Outside CI: the test passes without running, and says this line.
    Skip(String),
    /// In CI: the test fails with this message.
    Fail(String),
}

/// The policy itself, apart from the machine: `missing` prerequisites of `test`, in CI
/// or not.
pub fn verdict(test: &str, missing: &[String], ci: bool) -> Verdict {
    if missing.is_empty() {
        Verdict::Run
    } else if ci {
        Verdict::Fail(format!(
            "{test}: missing in CI (CI is set, and tests/run.sh installs every prerequisite): {}",
            missing.join("; ")
        ))
    } else {
        Verdict::Skip(format!(
            "SKIPPED {test}: missing {} (in CI this fails)",
            missing.join("; ")
        ))
    }
}

/// Applies the policy: true when every need is met; false after a `SKIPPED` line outside
/// CI; panics in CI. Tests call it through [`require!`](crate::require).
pub fn present(needs: &[Need]) -> bool {
    let missing: Vec<String> = needs.iter().filter_map(Need::missing).collect();
    match verdict(&test_name(), &missing, in_ci()) {
        Verdict::Run => true,
        Verdict::Skip(line) => {
            // Straight to fd 2: the harness captures `eprintln!`, and a skip must show.
            let _ = writeln!(std::io::stderr().lock(), "{line}");
            false
        }
        Verdict::Fail(message) => panic!("{message}"),
    }
}

/// Returns from the calling test (or from a helper returning `Option`/`()`, with
/// `require!(return None; ...)`) when a prerequisite is missing outside CI; fails the
/// test in CI. See the module's policy.
#[macro_export]
macro_rules! require {
    (return $value:expr; $($need:expr),+ $(,)?) => {
        if !$crate::prerequisites::present(&[$($need),+]) {
            return $value;
        }
    };
    ($($need:expr),+ $(,)?) => {
        if !$crate::prerequisites::present(&[$($need),+]) {
            return;
        }
    };
}

/// The running test's name: libtest names each test's thread after the test.
fn test_name() -> String {
    std::thread::current()
        .name()
        .filter(|name| *name != "main")
        .unwrap_or("a test")
        .to_string()
}

/// Whether this process runs as root that may do what root is needed for (mount
/// namespaces, bind mounts): the owner of `/proc/self` is its effective uid, 0, and it
/// holds `CAP_SYS_ADMIN` (uid 0 in an unprivileged container does not).
pub fn is_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|meta| meta.uid() == 0)
        && vgpu_contract::process::holds_cap_sys_admin()
}

/// Whether `program ARGS` runs and succeeds.
fn runs(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .is_ok_and(|out| out.status.success())
}

/// Whether `python3` imports every module of `modules`.
pub fn python_imports(modules: &[&str]) -> bool {
    let script = format!("import {}", modules.join(", "));
    runs("python3", &["-c", &script])
}

/// The PyPI packages that give `modules`, for the install hint.
fn pip_packages(modules: &[&str]) -> String {
    let mut packages: Vec<&str> = modules
        .iter()
        .map(|module| match module.split('.').next().unwrap_or(module) {
            "cuda" => "'cuda-bindings>=13,<14'",
            "pynvml" => "nvidia-ml-py",
            other => other,
        })
        .collect();
    packages.dedup();
    packages.join(" ")
}

/// The driver packages absent from `folder` (all of them if it cannot be read), and
/// `dpkg` if it is absent.
fn missing_debs(folder: &std::path::Path) -> Vec<String> {
    let mut missing: Vec<String> = DEBIAN_DRIVER_PACKAGES
        .iter()
        .filter(|package| debian_deb(folder, package).is_none())
        .map(|package| format!("{package}_{DEBIAN_DRIVER_VERSION}*.deb"))
        .collect();
    if !runs("dpkg", &["--version"]) {
        missing.push("dpkg".to_string());
    }
    missing
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_missing_runs_in_and_out_of_ci() {
        assert_eq!(verdict("t", &[], false), Verdict::Run);
        assert_eq!(verdict("t", &[], true), Verdict::Run);
    }

    #[test]
    fn a_missing_prerequisite_skips_outside_ci_and_says_what_and_how() {
        let missing = vec![
            "runc (apt-get install runc)".to_string(),
            "root".to_string(),
        ];
        assert_eq!(
            verdict("runc_e2e", &missing, false),
            Verdict::Skip(
                "SKIPPED runc_e2e: missing runc (apt-get install runc); root (in CI this fails)"
                    .into()
            )
        );
    }

    #[test]
    fn a_missing_prerequisite_fails_in_ci() {
        let verdict = verdict("runc_e2e", &["root".to_string()], true);
        assert!(
            matches!(&verdict, Verdict::Fail(message) if message.starts_with("runc_e2e: missing in CI") && message.ends_with("root")),
            "{verdict:?}"
        );
    }

    #[test]
    fn ci_is_any_value_but_empty_zero_or_false() {
        for value in ["true", "1", "yes", "TRUE"] {
            assert!(ci_value_means_ci(Some(value)), "{value}");
        }
        for value in [None, Some(""), Some("0"), Some("false"), Some(" false ")] {
            assert!(!ci_value_means_ci(value), "{value:?}");
        }
    }

    #[test]
    fn a_program_that_is_not_there_is_missing_with_its_install_hint() {
        let need = Need::program("vgpu-no-such-program-here", "apt-get install nothing");
        assert_eq!(
            need.missing().as_deref(),
            Some("vgpu-no-such-program-here (apt-get install nothing)")
        );
        assert_eq!(Need::program("true", "coreutils").missing(), None);
    }

    #[test]
    fn the_debs_need_names_each_absent_package() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("libcuda1_535.261.03-1_amd64.deb"), b"").unwrap();
        let missing = missing_debs(dir.path());
        assert!(missing.contains(&"libnvidia-ml1_535.261.03*.deb".to_string()));
        assert!(missing.contains(&"nvidia-smi_535.261.03*.deb".to_string()));
        assert!(!missing.iter().any(|m| m.starts_with("libcuda1")));
        assert_eq!(
            missing_debs(&dir.path().join("absent")).len(),
            3 + usize::from(!runs("dpkg", &["--version"]))
        );
    }

    #[test]
    fn pip_hints_name_the_packages_not_the_modules() {
        assert_eq!(
            pip_packages(&["cuda.bindings.driver", "pynvml"]),
            "'cuda-bindings>=13,<14' nvidia-ml-py"
        );
    }

    #[test]
    fn the_test_name_is_the_test_threads_name() {
        assert_eq!(
            test_name(),
            "prerequisites::tests::the_test_name_is_the_test_threads_name"
        );
    }
}
