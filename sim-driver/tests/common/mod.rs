//! Shared pieces of the sim-driver integration tests: finding and loading the built
//! `libvgpu_sim.so` by path, typed raw-symbol access, and running a test body in a fresh
//! child process (its own config and state file) so that tests never share a simulated
//! machine by accident.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The built cdylib: `target/<profile>/libvgpu_sim.so` (what `cargo build -p
/// vgpu-sim-driver` leaves) or `target/<profile>/deps/libvgpu_sim.so` (what `cargo test`
/// builds), whichever is newer.
pub fn library_path() -> PathBuf {
    vgpu_test_support::built("libvgpu_sim.so").unwrap_or_else(|| {
        panic!(
            "libvgpu_sim.so missing in {}: run `cargo test --workspace`",
            vgpu_test_support::profile_dir().display()
        )
    })
}

/// The loaded simulated driver.
pub struct Sim {
    lib: &'static libloading::Library,
}

impl Sim {
    pub fn load() -> Sim {
        // SAFETY: loading our own cdylib; its initialisers are Rust statics only.
        let lib =
            unsafe { libloading::Library::new(library_path()) }.expect("dlopen libvgpu_sim.so");
        Sim {
            lib: Box::leak(Box::new(lib)),
        }
    }

    /// A raw symbol as a function pointer of type `T` (the caller names the C signature).
    pub fn sym<T: Copy>(&self, name: &str) -> T {
        // SAFETY: the test names the real C signature of the symbol.
        unsafe {
            *self
                .lib
                .get::<T>(name.as_bytes())
                .unwrap_or_else(|err| panic!("dlsym {name}: {err}"))
        }
    }

    /// The address of a symbol.
    pub fn address(&self, name: &str) -> usize {
        let f: *const std::ffi::c_void = self.sym(name);
        f as usize
    }
}

pub type Fn0 = unsafe extern "C" fn() -> i32;

/// Runs `inner` (an #[ignore]d test of this binary) in a child process with `env` plus a
/// fresh state file, and asserts that it passed.
pub fn run_isolated(inner: &str, env: &[(&str, &str)]) {
    let dir = tempfile::tempdir().expect("tempdir");
    let output = isolated_command(inner, env, dir.path())
        .output()
        .expect("spawn test child");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "isolated {inner} failed:\n{stdout}\n{stderr}"
    );
}

/// The command that runs `inner` in a child with a state file under `dir`.
pub fn isolated_command(inner: &str, env: &[(&str, &str)], dir: &Path) -> Command {
    let mut command = Command::new(std::env::current_exe().expect("test exe"));
    command.args([
        "--exact",
        inner,
        "--ignored",
        "--nocapture",
        "--test-threads",
        "1",
    ]);
    command
        .env("VGPU_SIM_STATE", dir.join("state"))
        .env("VGPU_SIM_INNER", "1");
    for var in [
        "VGPU_SIM_CONFIG",
        "VGPU_SIM_GPUS",
        "VGPU_SIM_MEMORY",
        "VGPU_SIM_NAME",
        "VGPU_SIM_SMS",
        "VGPU_SIM_KERNEL_NS",
        "VGPU_SIM_CONTEXT_OVERHEAD",
        "VGPU_SIM_CUDA_VERSION",
    ] {
        command.env_remove(var);
    }
    for (key, value) in env {
        command.env(key, value);
    }
    command
}

/// Whether this process is an isolated child (inner tests do nothing when run directly).
pub fn inner() -> bool {
    std::env::var_os("VGPU_SIM_INNER").is_some()
}

/// Declares `#[test] fn $name` that runs `$body` in a fresh child process with `$env`.
#[macro_export]
macro_rules! isolated {
    ($name:ident, $inner:ident, [$(($k:expr, $v:expr)),* $(,)?], $body:block) => {
        #[test]
        fn $name() {
            common::run_isolated(stringify!($inner), &[$(($k, $v)),*]);
        }

        #[test]
        #[ignore = "runs in a child process started by its outer test"]
        fn $inner() {
            if !common::inner() {
                return;
            }
            $body
        }
    };
}
