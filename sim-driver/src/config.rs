//! What the simulated machine looks like: the GPUs, their memory and SM counts, and the
//! timing knobs, read once per process from `VGPU_SIM_CONFIG` (a YAML file) or the
//! `VGPU_SIM_*` shortcut variables.
//!
//! ```yaml
//! count: 2                      # GPUs made from the defaults (or list them under `gpus`)
//! gpus:
//!   - name: NVIDIA H200 (simulated)
//!     uuid: GPU-51d00000-0000-4000-8000-000000000001
//!     memory: 80GiB
//!     sms: 132
//!     pci_bus_id: "00000000:11:00.0"
//! cuda_version: 13000
//! kernel_ns: 10000
//! context_overhead: 527MiB
//! module_overhead: 0             # device memory each loaded module takes
//! ```

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use vgpu_contract::ByteSize;

/// Env var naming a YAML sim config.
pub const CONFIG_ENV: &str = "VGPU_SIM_CONFIG";
/// Env shortcut: the number of GPUs.
pub const GPUS_ENV: &str = "VGPU_SIM_GPUS";
/// Env shortcut: memory per GPU (a byte size such as `80GiB`).
pub const MEMORY_ENV: &str = "VGPU_SIM_MEMORY";
/// Env shortcut: the product name of every GPU.
pub const NAME_ENV: &str = "VGPU_SIM_NAME";
/// Env shortcut: the SM count of every GPU.
pub const SMS_ENV: &str = "VGPU_SIM_SMS";
/// Env: the version `cuDriverGetVersion` reports (e.g. 13000).
pub const CUDA_VERSION_ENV: &str = "VGPU_SIM_CUDA_VERSION";
/// Env: nanoseconds a kernel without a duration suffix takes.
pub const KERNEL_NS_ENV: &str = "VGPU_SIM_KERNEL_NS";
/// Env: device memory each context takes (a byte size).
pub const CONTEXT_OVERHEAD_ENV: &str = "VGPU_SIM_CONTEXT_OVERHEAD";
/// Env: device memory each loaded module takes (a byte size; the code the driver loads
/// after the context exists).
pub const MODULE_OVERHEAD_ENV: &str = "VGPU_SIM_MODULE_OVERHEAD";
/// Env: the cross-process state file.
pub const STATE_ENV: &str = "VGPU_SIM_STATE";
/// Env: a library name the sim `dlopen`s, as the real driver loads
/// `libnvidia-ptxjitcompiler.so.1` by name, before it accepts PTX text; when the loader
/// cannot find it, loading PTX fails with `CUDA_ERROR_JIT_COMPILER_NOT_FOUND`. Unset,
/// PTX loads without any helper.
pub const PTX_JIT_LIBRARY_ENV: &str = "VGPU_SIM_PTX_JIT_LIBRARY";

/// The most GPUs one simulated machine has.
pub const MAX_GPUS: usize = 16;
pub const DEFAULT_GPU_COUNT: usize = 4;
pub const DEFAULT_NAME: &str = "NVIDIA H200 (simulated)";
/// 143771 MiB, what an H200 reports.
pub const DEFAULT_MEMORY: ByteSize = ByteSize::mib(143_771);
pub const DEFAULT_SMS: u32 = 132;
pub const DEFAULT_CUDA_VERSION: i32 = 13000;
pub const DEFAULT_KERNEL_NS: u64 = 10_000;
/// What a primary context took on a real H200 with driver 580.159.04 (526.8 MiB), rounded.
pub const DEFAULT_CONTEXT_OVERHEAD: ByteSize = ByteSize::mib(527);
/// The driver version NVML reports.
pub const DRIVER_VERSION: &str = "580.159.04";

/// One simulated GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuSpec {
    pub name: String,
    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    pub uuid: String,
    /// The 16 bytes behind `uuid`.
    pub uuid_bytes: [u8; 16],
    pub memory: u64,
    pub sms: u32,
    /// `DDDDDDDD:BB:DD.F`.
    pub pci_bus_id: String,
    pub pci_domain: u32,
    pub pci_bus: u32,
    pub pci_device: u32,
}

/// The whole simulated machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimConfig {
    pub gpus: Vec<GpuSpec>,
    pub cuda_version: i32,
    pub kernel_ns: u64,
    pub context_overhead: u64,
    /// Device memory each loaded module takes (0: modules are free).
    pub module_overhead: u64,
    pub state_path: PathBuf,
}

/// Why the sim config was refused.
#[derive(Debug, thiserror::Error)]
pub enum SimConfigError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("env {var}={value}: {reason}")]
    Env {
        var: &'static str,
        value: String,
        reason: String,
    },
    #[error("{0}")]
    Invalid(String),
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    count: Option<usize>,
    gpus: Option<Vec<FileGpu>>,
    cuda_version: Option<i32>,
    kernel_ns: Option<u64>,
    context_overhead: Option<ByteSize>,
    module_overhead: Option<ByteSize>,
    state: Option<PathBuf>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FileGpu {
    name: Option<String>,
    uuid: Option<String>,
    memory: Option<ByteSize>,
    sms: Option<u32>,
    pci_bus_id: Option<String>,
}

/// The UUID of default GPU `index` (0-based): `GPU-51d00000-0000-4000-8000-00000000000N`, N = index + 1.
pub fn default_uuid(index: usize) -> String {
    format!("GPU-51d00000-0000-4000-8000-{:012x}", index + 1)
}

/// The PCI bus id of default GPU `index`: `00000000:1N:00.0`, N = index + 1 (hex).
pub fn default_pci_bus_id(index: usize) -> String {
    format!("00000000:{:02x}:00.0", 0x10 + index + 1)
}

/// Parses `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` into 16 bytes.
pub fn parse_uuid(text: &str) -> Option<[u8; 16]> {
    let hex: String = text
        .strip_prefix("GPU-")?
        .chars()
        .filter(|c| *c != '-')
        .collect();
    let groups: Vec<usize> = text
        .strip_prefix("GPU-")?
        .split('-')
        .map(str::len)
        .collect();
    if groups != [8, 4, 4, 4, 12] || hex.len() != 32 {
        return None;
    }
    let mut bytes = [0u8; 16];
    for (i, byte) in bytes.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(bytes)
}

/// Parses `DDDDDDDD:BB:DD.F` (or `DDDD:BB:DD.F`, or `BB:DD.F`) into (domain, bus, device).
pub fn parse_pci_bus_id(text: &str) -> Option<(u32, u32, u32)> {
    let parts: Vec<&str> = text.split(':').collect();
    let (domain, bus, rest) = match parts.as_slice() {
        [domain, bus, rest] => (u32::from_str_radix(domain, 16).ok()?, *bus, *rest),
        [bus, rest] => (0, *bus, *rest),
        _ => return None,
    };
    let (device, function) = rest.split_once('.')?;
    let bus = u32::from_str_radix(bus, 16).ok()?;
    let device = u32::from_str_radix(device, 16).ok()?;
    let _function = u32::from_str_radix(function, 16).ok()?;
    (bus <= 0xff && device <= 0x1f).then_some((domain, bus, device))
}

/// Canonical `DDDDDDDD:BB:DD.0` form of a bus id, for comparisons.
pub fn canonical_pci_bus_id(text: &str) -> Option<String> {
    let (domain, bus, device) = parse_pci_bus_id(text.trim())?;
    Some(format!("{domain:08x}:{bus:02x}:{device:02x}.0"))
}

fn env_value(var: &'static str) -> Option<String> {
    std::env::var(var)
        .ok()
        .filter(|value| !value.trim().is_empty())
}

fn env_parse<T: std::str::FromStr>(var: &'static str) -> Result<Option<T>, SimConfigError>
where
    T::Err: std::fmt::Display,
{
    match env_value(var) {
        None => Ok(None),
        Some(value) => value
            .trim()
            .parse()
            .map(Some)
            .map_err(|err: T::Err| SimConfigError::Env {
                var,
                value: value.clone(),
                reason: err.to_string(),
            }),
    }
}

fn default_state_path() -> PathBuf {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    PathBuf::from(format!("/tmp/vgpu-sim-{uid}/state"))
}

impl SimConfig {
    /// Reads the config of this process: the YAML file named by `VGPU_SIM_CONFIG`, then
    /// the `VGPU_SIM_*` shortcuts on top.
    pub fn from_env() -> Result<SimConfig, SimConfigError> {
        let file = match env_value(CONFIG_ENV) {
            Some(path) => Some(Self::read_file(Path::new(&path))?),
            None => None,
        };
        let count = env_parse::<usize>(GPUS_ENV)?;
        let memory = env_parse::<ByteSize>(MEMORY_ENV)?;
        let sms = env_parse::<u32>(SMS_ENV)?;
        let name = env_value(NAME_ENV);
        let cuda_version = env_parse::<i32>(CUDA_VERSION_ENV)?;
        let kernel_ns = env_parse::<u64>(KERNEL_NS_ENV)?;
        let overhead = env_parse::<ByteSize>(CONTEXT_OVERHEAD_ENV)?;
        let module_overhead = env_parse::<ByteSize>(MODULE_OVERHEAD_ENV)?;
        let state = env_value(STATE_ENV).map(PathBuf::from);
        let overrides = Overrides {
            count,
            memory,
            sms,
            name,
            cuda_version,
            kernel_ns,
            overhead,
            module_overhead,
            state,
        };
        Self::build(file.unwrap_or_default(), overrides)
    }

    /// Parses a YAML sim config (env shortcuts not applied).
    pub fn from_yaml(text: &str, origin: &Path) -> Result<SimConfig, SimConfigError> {
        let file: FileConfig =
            serde_saphyr::from_str(text).map_err(|err| SimConfigError::Parse {
                path: origin.to_path_buf(),
                message: err.without_snippet().to_string(),
            })?;
        Self::build(file, Overrides::default())
    }

    fn read_file(path: &Path) -> Result<FileConfig, SimConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| SimConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        serde_saphyr::from_str(&text).map_err(|err| SimConfigError::Parse {
            path: path.to_path_buf(),
            message: err.without_snippet().to_string(),
        })
    }

    fn build(file: FileConfig, env: Overrides) -> Result<SimConfig, SimConfigError> {
        let listed = file.gpus.unwrap_or_default();
        let count = env.count.or(file.count).unwrap_or(if listed.is_empty() {
            DEFAULT_GPU_COUNT
        } else {
            listed.len()
        });
        if count == 0 || count > MAX_GPUS {
            return Err(SimConfigError::Invalid(format!(
                "{count} GPUs: the sim has 1 to {MAX_GPUS}"
            )));
        }
        if !listed.is_empty() && listed.len() != count {
            return Err(SimConfigError::Invalid(format!(
                "`count: {count}` but {} GPUs are listed under `gpus`",
                listed.len()
            )));
        }
        let mut gpus = Vec::with_capacity(count);
        let mut seen_uuids = HashSet::new();
        let mut seen_bus_ids = HashSet::new();
        for index in 0..count {
            let entry = listed.get(index);
            let uuid = entry
                .and_then(|gpu| gpu.uuid.clone())
                .unwrap_or_else(|| default_uuid(index));
            let uuid_bytes = parse_uuid(&uuid).ok_or_else(|| {
                SimConfigError::Invalid(format!(
                    "gpus[{index}].uuid `{uuid}` is not GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
                ))
            })?;
            let pci_bus_id = entry
                .and_then(|gpu| gpu.pci_bus_id.clone())
                .unwrap_or_else(|| default_pci_bus_id(index));
            let (pci_domain, pci_bus, pci_device) =
                parse_pci_bus_id(&pci_bus_id).ok_or_else(|| {
                    SimConfigError::Invalid(format!(
                        "gpus[{index}].pci_bus_id `{pci_bus_id}` is not DDDDDDDD:BB:DD.F"
                    ))
                })?;
            let name = env
                .name
                .clone()
                .or_else(|| entry.and_then(|gpu| gpu.name.clone()))
                .unwrap_or_else(|| DEFAULT_NAME.to_string());
            if name.is_empty() || name.len() > 95 {
                return Err(SimConfigError::Invalid(format!(
                    "gpus[{index}].name must be 1 to 95 bytes"
                )));
            }
            let memory = env
                .memory
                .or_else(|| entry.and_then(|gpu| gpu.memory))
                .unwrap_or(DEFAULT_MEMORY)
                .bytes();
            if memory < (64 << 20) {
                return Err(SimConfigError::Invalid(format!(
                    "gpus[{index}].memory {} is below the 64MiB minimum",
                    ByteSize(memory)
                )));
            }
            let sms = env
                .sms
                .or_else(|| entry.and_then(|gpu| gpu.sms))
                .unwrap_or(DEFAULT_SMS);
            if sms == 0 || sms > 1024 {
                return Err(SimConfigError::Invalid(format!(
                    "gpus[{index}].sms {sms}: expected 1 to 1024"
                )));
            }
            if !seen_uuids.insert(uuid.to_ascii_lowercase()) {
                return Err(SimConfigError::Invalid(format!(
                    "gpus[{index}].uuid `{uuid}` is used twice"
                )));
            }
            let canonical = format!("{pci_domain:08x}:{pci_bus:02x}:{pci_device:02x}.0");
            if !seen_bus_ids.insert(canonical.clone()) {
                return Err(SimConfigError::Invalid(format!(
                    "gpus[{index}].pci_bus_id `{pci_bus_id}` is used twice"
                )));
            }
            gpus.push(GpuSpec {
                name,
                uuid,
                uuid_bytes,
                memory,
                sms,
                pci_bus_id: canonical.to_ascii_uppercase(),
                pci_domain,
                pci_bus,
                pci_device,
            });
        }
        let cuda_version = env
            .cuda_version
            .or(file.cuda_version)
            .unwrap_or(DEFAULT_CUDA_VERSION);
        if !(2000..=99_990).contains(&cuda_version) {
            return Err(SimConfigError::Invalid(format!(
                "cuda_version {cuda_version}: expected e.g. 12080 or 13000"
            )));
        }
        let kernel_ns = env
            .kernel_ns
            .or(file.kernel_ns)
            .unwrap_or(DEFAULT_KERNEL_NS);
        if kernel_ns > 60_000_000_000 {
            return Err(SimConfigError::Invalid(format!(
                "kernel_ns {kernel_ns}: at most 60 s"
            )));
        }
        let context_overhead = env
            .overhead
            .or(file.context_overhead)
            .unwrap_or(DEFAULT_CONTEXT_OVERHEAD)
            .bytes();
        if gpus.iter().any(|gpu| context_overhead >= gpu.memory) {
            return Err(SimConfigError::Invalid(format!(
                "context_overhead {} does not fit in a GPU",
                ByteSize(context_overhead)
            )));
        }
        let module_overhead = env
            .module_overhead
            .or(file.module_overhead)
            .map_or(0, ByteSize::bytes);
        if gpus.iter().any(|gpu| module_overhead >= gpu.memory) {
            return Err(SimConfigError::Invalid(format!(
                "module_overhead {} does not fit in a GPU",
                ByteSize(module_overhead)
            )));
        }
        let state_path = env.state.or(file.state).unwrap_or_else(default_state_path);
        Ok(SimConfig {
            gpus,
            cuda_version,
            kernel_ns,
            context_overhead,
            module_overhead,
            state_path,
        })
    }
}

#[derive(Default)]
struct Overrides {
    count: Option<usize>,
    memory: Option<ByteSize>,
    sms: Option<u32>,
    name: Option<String>,
    cuda_version: Option<i32>,
    kernel_ns: Option<u64>,
    overhead: Option<ByteSize>,
    module_overhead: Option<ByteSize>,
    state: Option<PathBuf>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_four_h200s() {
        let config = SimConfig::from_yaml("{}", Path::new("t.yaml")).unwrap();
        assert_eq!(config.gpus.len(), 4);
        assert_eq!(
            config.gpus[0].uuid,
            "GPU-51d00000-0000-4000-8000-000000000001"
        );
        assert_eq!(
            config.gpus[3].uuid,
            "GPU-51d00000-0000-4000-8000-000000000004"
        );
        assert_eq!(config.gpus[0].pci_bus_id, "00000000:11:00.0");
        assert_eq!(config.gpus[2].pci_bus, 0x13);
        assert_eq!(config.gpus[0].memory, 143_771 << 20);
        assert_eq!(config.gpus[0].sms, 132);
        assert_eq!(config.cuda_version, 13000);
        assert_eq!(config.gpus[0].uuid_bytes[0], 0x51);
        assert_eq!(config.gpus[0].uuid_bytes[15], 0x01);
    }

    #[test]
    fn listed_gpus_and_count() {
        let yaml = "gpus:\n  - {name: A100, memory: 40GiB, sms: 108}\n  - {uuid: GPU-11111111-2222-3333-4444-555555555555, pci_bus_id: '0000:3b:00.0'}\n";
        let config = SimConfig::from_yaml(yaml, Path::new("t.yaml")).unwrap();
        assert_eq!(config.gpus.len(), 2);
        assert_eq!(config.gpus[0].name, "A100");
        assert_eq!(config.gpus[0].memory, 40 << 30);
        assert_eq!(config.gpus[1].pci_bus_id, "00000000:3B:00.0");
        let counted =
            SimConfig::from_yaml("count: 2\ncontext_overhead: 0", Path::new("t.yaml")).unwrap();
        assert_eq!(counted.gpus.len(), 2);
        assert_eq!(counted.context_overhead, 0);
    }

    #[test]
    fn refuses_bad_configs() {
        for (yaml, needle) in [
            ("gpu: []", "unknown field"),
            ("count: 0", "1 to 16"),
            ("count: 3\ngpus: [{}]", "listed"),
            ("gpus: [{uuid: nope}]", "not GPU-"),
            ("gpus: [{memory: 12 parsecs}]", "unit"),
            ("gpus: [{pci_bus_id: zz}]", "pci_bus_id"),
            (
                "gpus: [{}, {uuid: GPU-51d00000-0000-4000-8000-000000000001}]",
                "used twice",
            ),
            ("cuda_version: 7", "cuda_version"),
        ] {
            let err = SimConfig::from_yaml(yaml, Path::new("t.yaml"))
                .unwrap_err()
                .to_string();
            assert!(err.contains(needle), "{yaml}: {err}");
        }
    }

    #[test]
    fn parses_bus_ids() {
        assert_eq!(parse_pci_bus_id("00000000:11:00.0"), Some((0, 0x11, 0)));
        assert_eq!(parse_pci_bus_id("0001:3b:1f.0"), Some((1, 0x3b, 0x1f)));
        assert_eq!(parse_pci_bus_id("3b:00.0"), Some((0, 0x3b, 0)));
        assert_eq!(parse_pci_bus_id("3b:00"), None);
        assert_eq!(
            canonical_pci_bus_id("0000:3B:00.0").as_deref(),
            Some("00000000:3b:00.0")
        );
    }
}
