//! The `Snapshot`: everything `vgpu smi` shows, gathered once from NVML into plain
//! data so that the renderers stay pure and unit tests can build fixed snapshots.
//!
//! Every optional GPU property is an `Option`: whatever NVML does not support (or the
//! library does not export) becomes `None` and renders as `N/A`. Only the calls that
//! the view cannot do without (init, device count, device handles) are errors.

use std::ffi::OsStr;
use std::path::Path;

use anyhow::{Context, bail};
use nvml_wrapper::enum_wrappers::device::{
    ComputeMode as NvmlComputeMode, EccCounter, MemoryError, PerformanceState, TemperatureSensor,
};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use nvml_wrapper::{Device, Nvml};

use super::legacy;

/// One `vgpu smi` view of the machine, as seen through one NVML library.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// Already formatted like `asctime`: `Wed Dec  2 15:49:22 2026`.
    pub timestamp: String,
    pub driver_version: Option<String>,
    /// The CUDA driver API version as NVML encodes it (`12020` is 12.2).
    pub cuda_version: Option<i32>,
    /// How many GPUs NVML reports in total, before `--id` selection.
    pub device_count: u32,
    /// The selected GPUs, in the order the table lists them.
    pub gpus: Vec<GpuInfo>,
    /// Processes on the selected GPUs.
    pub processes: Vec<GpuProcess>,
}

/// The properties of one GPU that the table and the CSV queries show.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuInfo {
    pub index: u32,
    pub name: Option<String>,
    pub uuid: Option<String>,
    pub persistence_mode: Option<bool>,
    /// `00000000:00:06.0`, the 32-bit-domain form NVML's `busId` gives.
    pub bus_id: Option<String>,
    pub display_active: Option<bool>,
    pub ecc: EccStatus,
    pub fan_percent: Option<u32>,
    pub temperature_celsius: Option<u32>,
    /// 0 to 15, the `P` number.
    pub performance_state: Option<u32>,
    pub power_usage_milliwatts: Option<u32>,
    pub power_limit_milliwatts: Option<u32>,
    pub memory: Option<MemoryUsage>,
    pub utilization: Option<Utilization>,
    pub compute_mode: Option<ComputeMode>,
    pub mig_enabled: Option<bool>,
}

/// The `Volatile Uncorr. ECC` cell.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum EccStatus {
    /// ECC is not supported or could not be read.
    #[default]
    Unknown,
    /// ECC is supported and turned off.
    Disabled,
    /// ECC is on; the volatile uncorrected error count, when NVML gives it.
    Enabled { volatile_uncorrected: Option<u64> },
}

/// Framebuffer memory, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryUsage {
    pub total_bytes: u64,
    pub used_bytes: u64,
    pub free_bytes: u64,
}

/// Utilization percentages over NVML's last sample period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Utilization {
    pub gpu_percent: u32,
    pub memory_percent: u32,
}

/// NVML compute modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ComputeMode {
    Default,
    ExclusiveThread,
    Prohibited,
    ExclusiveProcess,
}

/// Whether a process holds a compute context, a graphics context or both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessKind {
    Compute,
    Graphics,
    ComputeAndGraphics,
}

impl ProcessKind {
    /// nvidia-smi's `Type` column: `C`, `G` or `C+G`.
    pub fn label(self) -> &'static str {
        match self {
            ProcessKind::Compute => "C",
            ProcessKind::Graphics => "G",
            ProcessKind::ComputeAndGraphics => "C+G",
        }
    }

    pub fn has_compute(self) -> bool {
        matches!(self, ProcessKind::Compute | ProcessKind::ComputeAndGraphics)
    }
}

/// One process row: a process with a context on one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuProcess {
    pub gpu_index: u32,
    pub gpu_uuid: Option<String>,
    pub gpu_name: Option<String>,
    pub gpu_bus_id: Option<String>,
    pub pid: u32,
    pub kind: ProcessKind,
    pub gpu_instance_id: Option<u32>,
    pub compute_instance_id: Option<u32>,
    /// From `/proc/PID/cmdline` (argv\[0\]) or `/proc/PID/comm`; `None` when the
    /// process is not visible from here (another PID namespace, gone).
    pub name: Option<String>,
    pub used_memory_bytes: Option<u64>,
}

/// Which GPUs `--id` picked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuSelector {
    Index(u32),
    Uuid(String),
    PciBusId(String),
}

/// Parses `--id`: comma-separated indexes, UUIDs (`GPU-...`, `MIG-...`) or PCI bus ids.
pub fn parse_selectors(text: &str) -> anyhow::Result<Vec<GpuSelector>> {
    let mut selectors = Vec::new();
    for token in text.split(',').map(str::trim) {
        if token.is_empty() {
            bail!("--id {text:?}: empty GPU id; give an index, a UUID or a PCI bus id");
        }
        let selector = if let Ok(index) = token.parse::<u32>() {
            GpuSelector::Index(index)
        } else if token.starts_with("GPU-") || token.starts_with("MIG-") {
            GpuSelector::Uuid(token.to_owned())
        } else if token.contains(':') {
            GpuSelector::PciBusId(token.to_owned())
        } else {
            bail!("--id {token:?} is neither a GPU index, a UUID (GPU-...) nor a PCI bus id");
        };
        selectors.push(selector);
    }
    Ok(selectors)
}

/// Initializes NVML from `library` (a file name searched like `dlopen` does, or a path).
pub fn open_nvml(library: &OsStr) -> anyhow::Result<Nvml> {
    Nvml::builder().lib_path(library).init().with_context(|| {
        format!(
            "could not initialize NVML through {}: is the NVIDIA driver (or the vgpu shim) \
             installed and running?",
            Path::new(library).display()
        )
    })
}

/// Gathers a snapshot of the selected GPUs (all of them when `selectors` is empty).
/// `library` is the NVML library `nvml` was opened from, for the legacy fallbacks.
pub fn gather(
    nvml: &Nvml,
    library: &OsStr,
    selectors: &[GpuSelector],
    include_processes: bool,
) -> anyhow::Result<Snapshot> {
    let device_count = nvml
        .device_count()
        .context("nvmlDeviceGetCount_v2 failed")?;
    let devices = select_devices(nvml, device_count, selectors)?;
    let mut gpus = Vec::with_capacity(devices.len());
    let mut processes = Vec::new();
    for (index, device) in &devices {
        let gpu = gather_gpu(*index, device, library);
        if include_processes {
            processes.extend(gather_processes(&gpu, device, library));
        }
        gpus.push(gpu);
    }
    Ok(Snapshot {
        timestamp: super::clock::local_timestamp(),
        driver_version: nvml.sys_driver_version().ok(),
        cuda_version: nvml.sys_cuda_driver_version().ok(),
        device_count,
        gpus,
        processes,
    })
}

fn select_devices<'nvml>(
    nvml: &'nvml Nvml,
    device_count: u32,
    selectors: &[GpuSelector],
) -> anyhow::Result<Vec<(u32, Device<'nvml>)>> {
    if selectors.is_empty() {
        return (0..device_count)
            .map(|index| {
                let device = nvml
                    .device_by_index(index)
                    .with_context(|| format!("nvmlDeviceGetHandleByIndex_v2({index}) failed"))?;
                Ok((index, device))
            })
            .collect();
    }
    let mut picked: Vec<(u32, Device<'nvml>)> = Vec::new();
    for selector in selectors {
        let found = match selector {
            GpuSelector::Index(index) if *index >= device_count => {
                bail!("no GPU has index {index}: {device_count} GPU(s) visible")
            }
            GpuSelector::Index(index) => nvml.device_by_index(*index),
            GpuSelector::Uuid(uuid) => nvml.device_by_uuid(uuid.as_str()),
            GpuSelector::PciBusId(bus_id) => nvml.device_by_pci_bus_id(bus_id.as_str()),
        };
        let device = match found {
            Ok(device) => device,
            Err(NvmlError::NotFound | NvmlError::InvalidArg) => {
                bail!("no GPU matches --id {}", selector_text(selector))
            }
            Err(err) => {
                return Err(err)
                    .with_context(|| format!("looking up GPU {}", selector_text(selector)));
            }
        };
        let index = match selector {
            GpuSelector::Index(index) => *index,
            _ => device.index().context("nvmlDeviceGetIndex failed")?,
        };
        if !picked.iter().any(|(seen, _)| *seen == index) {
            picked.push((index, device));
        }
    }
    Ok(picked)
}

fn selector_text(selector: &GpuSelector) -> String {
    match selector {
        GpuSelector::Index(index) => index.to_string(),
        GpuSelector::Uuid(text) | GpuSelector::PciBusId(text) => text.clone(),
    }
}

fn gather_gpu(index: u32, device: &Device<'_>, library: &OsStr) -> GpuInfo {
    let memory = match device.memory_info() {
        Ok(info) => Some(MemoryUsage {
            total_bytes: info.total,
            used_bytes: info.used,
            free_bytes: info.free,
        }),
        Err(NvmlError::FunctionNotFound) => legacy::memory_info_v1(library, device),
        Err(_) => None,
    };
    let ecc = match device.is_ecc_enabled() {
        Ok(state) if state.currently_enabled => EccStatus::Enabled {
            volatile_uncorrected: device
                .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
                .ok(),
        },
        Ok(_) => EccStatus::Disabled,
        Err(_) => EccStatus::Unknown,
    };
    GpuInfo {
        index,
        name: device.name().ok(),
        uuid: device.uuid().ok(),
        persistence_mode: device.is_in_persistent_mode().ok(),
        bus_id: device.pci_info().ok().map(|pci| pci.bus_id),
        display_active: device.is_display_active().ok(),
        ecc,
        fan_percent: device.fan_speed(0).ok(),
        temperature_celsius: device.temperature(TemperatureSensor::Gpu).ok(),
        performance_state: device.performance_state().ok().and_then(pstate_number),
        power_usage_milliwatts: device.power_usage().ok(),
        power_limit_milliwatts: device
            .enforced_power_limit()
            .or_else(|_| device.power_management_limit())
            .ok(),
        memory,
        utilization: device.utilization_rates().ok().map(|rates| Utilization {
            gpu_percent: rates.gpu,
            memory_percent: rates.memory,
        }),
        compute_mode: device.compute_mode().ok().map(|mode| match mode {
            NvmlComputeMode::Default => ComputeMode::Default,
            NvmlComputeMode::ExclusiveThread => ComputeMode::ExclusiveThread,
            NvmlComputeMode::Prohibited => ComputeMode::Prohibited,
            NvmlComputeMode::ExclusiveProcess => ComputeMode::ExclusiveProcess,
        }),
        mig_enabled: device.mig_mode().ok().map(|mode| mode.current == 1),
    }
}

fn pstate_number(state: PerformanceState) -> Option<u32> {
    use PerformanceState::*;
    let number = match state {
        Zero => 0,
        One => 1,
        Two => 2,
        Three => 3,
        Four => 4,
        Five => 5,
        Six => 6,
        Seven => 7,
        Eight => 8,
        Nine => 9,
        Ten => 10,
        Eleven => 11,
        Twelve => 12,
        Thirteen => 13,
        Fourteen => 14,
        Fifteen => 15,
        Unknown => return None,
    };
    Some(number)
}

/// A process as NVML lists it, before names are looked up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RawProcess {
    pub pid: u32,
    pub used_memory_bytes: Option<u64>,
    pub gpu_instance_id: Option<u32>,
    pub compute_instance_id: Option<u32>,
}

impl From<ProcessInfo> for RawProcess {
    fn from(info: ProcessInfo) -> Self {
        RawProcess {
            pid: info.pid,
            used_memory_bytes: match info.used_gpu_memory {
                UsedGpuMemory::Used(bytes) => Some(bytes),
                UsedGpuMemory::Unavailable => None,
            },
            gpu_instance_id: info.gpu_instance_id,
            compute_instance_id: info.compute_instance_id,
        }
    }
}

fn gather_processes(gpu: &GpuInfo, device: &Device<'_>, library: &OsStr) -> Vec<GpuProcess> {
    let compute: Vec<RawProcess> = match device.running_compute_processes() {
        Ok(list) => list.into_iter().map(RawProcess::from).collect(),
        Err(NvmlError::FunctionNotFound) => legacy::compute_processes_v1(library, device),
        Err(_) => Vec::new(),
    };
    let graphics: Vec<RawProcess> = device
        .running_graphics_processes()
        .map(|list| list.into_iter().map(RawProcess::from).collect())
        .unwrap_or_default();
    merge_processes(&compute, &graphics)
        .into_iter()
        .map(|(raw, kind)| GpuProcess {
            gpu_index: gpu.index,
            gpu_uuid: gpu.uuid.clone(),
            gpu_name: gpu.name.clone(),
            gpu_bus_id: gpu.bus_id.clone(),
            pid: raw.pid,
            kind,
            gpu_instance_id: raw.gpu_instance_id,
            compute_instance_id: raw.compute_instance_id,
            name: process_name(raw.pid),
            used_memory_bytes: raw.used_memory_bytes,
        })
        .collect()
}

/// Joins the compute and graphics lists of one GPU: a PID in both becomes one `C+G` row.
pub(super) fn merge_processes(
    compute: &[RawProcess],
    graphics: &[RawProcess],
) -> Vec<(RawProcess, ProcessKind)> {
    let mut merged: Vec<(RawProcess, ProcessKind)> = Vec::new();
    for process in compute {
        if !merged.iter().any(|(seen, _)| seen.pid == process.pid) {
            merged.push((*process, ProcessKind::Compute));
        }
    }
    for process in graphics {
        match merged.iter_mut().find(|(seen, _)| seen.pid == process.pid) {
            Some((seen, kind)) => {
                *kind = ProcessKind::ComputeAndGraphics;
                if seen.used_memory_bytes.is_none() {
                    seen.used_memory_bytes = process.used_memory_bytes;
                }
            }
            None => merged.push((*process, ProcessKind::Graphics)),
        }
    }
    merged
}

/// The name nvidia-smi shows: argv\[0\] from `/proc/PID/cmdline`, else `/proc/PID/comm`.
fn process_name(pid: u32) -> Option<String> {
    process_name_in(Path::new("/proc"), pid)
}

pub(super) fn process_name_in(proc_root: &Path, pid: u32) -> Option<String> {
    let process_dir = proc_root.join(pid.to_string());
    if let Ok(cmdline) = std::fs::read(process_dir.join("cmdline")) {
        let argv0 = cmdline.split(|byte| *byte == 0).next().unwrap_or_default();
        let argv0 = String::from_utf8_lossy(argv0).trim().to_owned();
        if !argv0.is_empty() {
            return Some(argv0);
        }
    }
    let comm = std::fs::read(process_dir.join("comm")).ok()?;
    let comm = String::from_utf8_lossy(&comm).trim().to_owned();
    (!comm.is_empty()).then_some(comm)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(pid: u32, used: Option<u64>) -> RawProcess {
        RawProcess {
            pid,
            used_memory_bytes: used,
            gpu_instance_id: None,
            compute_instance_id: None,
        }
    }

    #[test]
    fn selectors_parse_indexes_uuids_and_bus_ids() {
        let parsed = parse_selectors("0, GPU-a277,00000000:00:06.0,MIG-1").unwrap();
        assert_eq!(
            parsed,
            vec![
                GpuSelector::Index(0),
                GpuSelector::Uuid("GPU-a277".into()),
                GpuSelector::PciBusId("00000000:00:06.0".into()),
                GpuSelector::Uuid("MIG-1".into()),
            ]
        );
    }

    #[test]
    fn selectors_reject_garbage_with_the_token() {
        let err = parse_selectors("0,tesla").unwrap_err().to_string();
        assert!(err.contains("\"tesla\""), "{err}");
        let err = parse_selectors("0,,1").unwrap_err().to_string();
        assert!(err.contains("empty GPU id"), "{err}");
    }

    #[test]
    fn merge_marks_pids_in_both_lists_as_compute_and_graphics() {
        let compute = [raw(10, Some(100)), raw(11, None), raw(10, Some(100))];
        let graphics = [raw(11, Some(7)), raw(12, Some(3))];
        let merged = merge_processes(&compute, &graphics);
        assert_eq!(
            merged,
            vec![
                (raw(10, Some(100)), ProcessKind::Compute),
                (raw(11, Some(7)), ProcessKind::ComputeAndGraphics),
                (raw(12, Some(3)), ProcessKind::Graphics),
            ]
        );
    }

    #[test]
    fn process_name_prefers_argv0_then_comm_then_none() {
        let root = tempfile::tempdir().unwrap();
        let with_cmdline = root.path().join("1");
        std::fs::create_dir(&with_cmdline).unwrap();
        std::fs::write(
            with_cmdline.join("cmdline"),
            b"/usr/bin/python3\0train.py\0",
        )
        .unwrap();
        std::fs::write(with_cmdline.join("comm"), b"python3\n").unwrap();
        let kernel_thread = root.path().join("2");
        std::fs::create_dir(&kernel_thread).unwrap();
        std::fs::write(kernel_thread.join("cmdline"), b"").unwrap();
        std::fs::write(kernel_thread.join("comm"), b"kworker\n").unwrap();

        assert_eq!(
            process_name_in(root.path(), 1).as_deref(),
            Some("/usr/bin/python3")
        );
        assert_eq!(process_name_in(root.path(), 2).as_deref(), Some("kworker"));
        assert_eq!(process_name_in(root.path(), 3), None);
    }

    #[test]
    fn this_process_has_a_visible_name() {
        let name = process_name(std::process::id()).unwrap();
        assert!(!name.is_empty());
    }
}
