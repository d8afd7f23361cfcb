//! `vgpu run` with a compute limit loads the host's NVML after it has bound the shims
//! over the public driver paths (index selectors, the coordinator's meter). The real
//! NVML loads `libcuda.so.1` by name, which there is our shim, and a shim without a
//! config says on stderr that it cannot load the real library (seen on the H200). This
//! test plays that host with two stand-ins built by `cc`: a "real" driver (soname
//! `libcuda.so.1`) and an NVML whose initialiser loads `libcuda.so.1` and says which file
//! it got. The run must print nothing of the shim's, and NVML must get the real driver.
//!
//! Needs root (a mount namespace and binds) and a C compiler; `cargo build -p
//! libcuda-shim -p libnvml-shim` first (same profile).

use std::path::Path;
use std::process::Command;

const FAKE_DRIVER: &str = r#"
/* Stands in for the real driver: only its soname and one symbol matter. */
int cuInit(unsigned flags) { (void)flags; return 100; }
"#;

const FAKE_NVML: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
/* As the real NVML does: libcuda.so.1 by name, at load. */
__attribute__((constructor)) static void load_cuda(void) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    void *symbol = cuda ? dlsym(cuda, "cuInit") : 0;
    Dl_info info;
    if (symbol && dladdr(symbol, &info))
        fprintf(stderr, "host-nvml: libcuda.so.1 is %s\n", info.dli_fname);
}
int nvmlInit_v2(void) { return 0; }
int nvmlInitWithFlags(unsigned flags) { (void)flags; return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlDeviceGetCount_v2(unsigned *count) { *count = 0; return 0; }
const char *nvmlErrorString(int result) { (void)result; return "stand-in"; }
"#;

fn build(dir: &Path, name: &str, source: &str) {
    let c = dir.join(format!("{name}.c"));
    std::fs::write(&c, source).expect("write source");
    let status = Command::new("cc")
        .args(["-shared", "-fPIC", &format!("-Wl,-soname,{name}"), "-o"])
        .arg(dir.join(name))
        .arg(&c)
        .arg("-ldl")
        .status()
        .expect("run cc (a C compiler is needed)");
    assert!(status.success(), "cc {name}");
}

#[test]
fn the_hosts_nvml_gets_the_real_driver_and_no_shim_speaks() {
    // `vgpu run` with the host's driver (no --simulate) bind-mounts over the host's paths.
    vgpu_test_support::require!(vgpu_test_support::Need::Root);
    let dir = tempfile::tempdir().expect("tempdir");
    let driver = dir.path().join("driver");
    std::fs::create_dir(&driver).expect("driver dir");
    build(&driver, "libcuda.so.1", FAKE_DRIVER);
    build(&driver, "libnvidia-ml.so.1", FAKE_NVML);
    let output = Command::new(env!("CARGO_BIN_EXE_vgpu"))
        .args(["run", "--cores", "30", "--", "/bin/true"])
        .env("LD_LIBRARY_PATH", &driver)
        .env("VGPU_HOST_DIR", dir.path().join("host"))
        .env_remove("VGPU_CONFIG")
        .env_remove("VGPU_DRIVER_DIR")
        .output()
        .expect("run vgpu");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(!stderr.contains("vgpu-shim"), "a shim spoke: {stderr}");
    let loaded: Vec<&str> = stderr
        .lines()
        .filter_map(|line| line.strip_prefix("host-nvml: libcuda.so.1 is "))
        .collect();
    assert!(!loaded.is_empty(), "the host's NVML was loaded: {stderr}");
    for file in loaded {
        // The run's private view of the real driver, never the public path the shim
        // covers.
        assert!(
            !file.starts_with(&driver.display().to_string()),
            "NVML got the shim at {file}: {stderr}"
        );
    }
}
