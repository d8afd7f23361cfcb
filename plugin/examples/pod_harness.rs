//! The GPU suite's pod (tests/gpu/sections/pod.sh): the real plugin against the
//! stand-in kubelet (real gRPC servers), over a driver folder `vgpu-ldconfig prepare`
//! made from the machine's driver, admits and starts containers as kubelet does and
//! writes, for each, an OCI bundle for runc whose mounts, devices and env are exactly
//! its merged Allocate responses. Then it keeps the plugin running (host-PID filling,
//! and compute coordination once the plugin runs it) until stdin closes.
//!
//! ```text
//! pod_harness --driver-dir DIR --state-dir DIR --bundles DIR --rootfs-dir DIR \
//!     [--bind PATH]... [--env K=V]... --container NAME:CORES:MEMORY_UNITS...
//! ```
//!
//! Bundle `DIR/NAME/config.json` runs `/bin/sh <bundles>/NAME.sh` (the caller writes
//! it) in rootfs `<rootfs-dir>/NAME` (the caller mounts it), with every `--bind` path
//! read-only at the same path (the bundles folder read-write) and each response also
//! written as `DIR/NAME.response.json`. Prints `READY` once all are written.

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::PathBuf;
use std::sync::Arc;

use common::e2e::{bind, runtime_spec};
use common::{CORE, MEMORY, Plugin, TestKubelet};
use vgpu_node_agent::devices::NvmlSource;

struct Args {
    driver_dir: PathBuf,
    state_dir: PathBuf,
    bundles: PathBuf,
    rootfs_dir: PathBuf,
    binds: Vec<PathBuf>,
    env: Vec<String>,
    containers: Vec<(String, usize, usize)>,
}

fn parse() -> Result<Args, String> {
    let mut args = std::env::args().skip(1);
    let mut parsed = Args {
        driver_dir: PathBuf::new(),
        state_dir: PathBuf::new(),
        bundles: PathBuf::new(),
        rootfs_dir: PathBuf::new(),
        binds: Vec::new(),
        env: Vec::new(),
        containers: Vec::new(),
    };
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--driver-dir" => parsed.driver_dir = value.into(),
            "--state-dir" => parsed.state_dir = value.into(),
            "--bundles" => parsed.bundles = value.into(),
            "--rootfs-dir" => parsed.rootfs_dir = value.into(),
            "--bind" => parsed.binds.push(value.into()),
            "--env" => parsed.env.push(value),
            "--container" => {
                let parts: Vec<&str> = value.split(':').collect();
                let [name, cores, memory] = parts.as_slice() else {
                    return Err(format!("--container {value}: NAME:CORES:MEMORY_UNITS"));
                };
                let number = |text: &str| {
                    text.parse::<usize>()
                        .map_err(|err| format!("--container {value}: {err}"))
                };
                parsed
                    .containers
                    .push((name.to_string(), number(cores)?, number(memory)?));
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    for (name, path) in [
        ("--driver-dir", &parsed.driver_dir),
        ("--state-dir", &parsed.state_dir),
        ("--bundles", &parsed.bundles),
        ("--rootfs-dir", &parsed.rootfs_dir),
    ] {
        if path.as_os_str().is_empty() {
            return Err(format!("{name} is required"));
        }
    }
    if parsed.containers.is_empty() {
        return Err("give at least one --container".into());
    }
    Ok(parsed)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> std::process::ExitCode {
    let args = match parse() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("pod_harness: {message}");
            return std::process::ExitCode::from(2);
        }
    };
    let kubelet = TestKubelet::start().await;
    let config = vgpu_node_agent::config::NodeConfig {
        host_driver_dir: args.driver_dir.clone(),
        shim_dir: args.driver_dir.join("shim"),
        state_dir: args.state_dir.clone(),
        nvml_library: args.driver_dir.join("current/lib64/libnvidia-ml.so.1"),
        dev_root: PathBuf::from("/dev"),
        metrics_address: None,
        ..kubelet.plugin_config()
    };
    let source = match NvmlSource::open(&config.nvml_library) {
        Ok(source) => Arc::new(source),
        Err(err) => {
            eprintln!("pod_harness: {err:#}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let mut plugin = Plugin::start(&kubelet, config, source).await;
    std::fs::create_dir_all(&args.bundles).expect("bundles folder");
    for (name, cores, memory) in &args.containers {
        let mut requests = vec![(CORE, *cores)];
        if *memory > 0 {
            requests.push((MEMORY, *memory));
        }
        let admitted = match kubelet
            .admit(&mut plugin, "gpu-suite", name, "main", &requests)
            .await
        {
            Ok(admitted) => admitted,
            Err((_, status)) => {
                eprintln!(
                    "pod_harness: {name}: Allocate refused: {}",
                    status.message()
                );
                return std::process::ExitCode::FAILURE;
            }
        };
        if let Err(status) = kubelet.start_container(&mut plugin, &admitted).await {
            eprintln!(
                "pod_harness: {name}: PreStart refused: {}",
                status.message()
            );
            return std::process::ExitCode::FAILURE;
        }
        let response = admitted.merged();
        let mut base: Vec<serde_json::Value> = args
            .binds
            .iter()
            .map(|path| bind(&path.to_string_lossy(), path, true))
            .collect();
        base.push(bind(&args.bundles.to_string_lossy(), &args.bundles, false));
        let script = args.bundles.join(format!("{name}.sh"));
        let process = vec!["/bin/sh".to_string(), script.to_string_lossy().into_owned()];
        let rootfs = args.rootfs_dir.join(name);
        let spec = runtime_spec(
            &response,
            &rootfs.to_string_lossy(),
            base,
            &args.env,
            &process,
        );
        let bundle = args.bundles.join(name);
        std::fs::create_dir_all(&bundle).expect("bundle folder");
        std::fs::write(
            bundle.join("config.json"),
            serde_json::to_vec_pretty(&spec).expect("json"),
        )
        .expect("config.json");
        let shown = serde_json::json!({
            "cores": admitted.cores.len(),
            "memory_units": admitted.memory.len(),
            "mounts": response.mounts.iter().map(|m| serde_json::json!({"container_path": m.container_path, "host_path": m.host_path, "read_only": m.read_only})).collect::<Vec<_>>(),
            "devices": response.devices.iter().map(|d| serde_json::json!({"container_path": d.container_path, "host_path": d.host_path})).collect::<Vec<_>>(),
            "envs": response.envs,
        });
        std::fs::write(
            args.bundles.join(format!("{name}.response.json")),
            serde_json::to_vec_pretty(&shown).expect("json"),
        )
        .expect("response json");
    }
    println!("READY");
    // Serve until the caller closes stdin.
    let _ = tokio::task::spawn_blocking(|| {
        let mut sink = String::new();
        while std::io::stdin().read_line(&mut sink).is_ok_and(|n| n > 0) {
            sink.clear();
        }
    })
    .await;
    plugin.handle.stop().await;
    std::process::ExitCode::SUCCESS
}
