//! The simulated NVML: device enumeration and the queries monitoring tools make,
//! answered from the sim config and the cross-process state file (memory used by every
//! process of the host, running processes, utilization from the kernels' busy timelines).
//!
//! Handles are pointers into a static table of devices; a foreign pointer gets
//! NVML_ERROR_INVALID_ARGUMENT. Every body runs under `ffi::guard` (a panic becomes
//! NVML_ERROR_UNKNOWN).

#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::c_char;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::clock::{now_ns, wall_us};
use crate::config::{GpuSpec, MAX_GPUS, canonical_pci_bus_id};
use crate::ffi::{self, c_str, copy_c_string, write_at, write_out};
use crate::state::{BUCKET_NS, HISTORY_BUCKETS, ProcessRecord};
use crate::version::driver_version;
use crate::{Sim, sim};

pub type NvmlReturn = i32;
pub const NVML_SUCCESS: NvmlReturn = 0;
pub const NVML_ERROR_UNINITIALIZED: NvmlReturn = 1;
pub const NVML_ERROR_INVALID_ARGUMENT: NvmlReturn = 2;
pub const NVML_ERROR_NOT_SUPPORTED: NvmlReturn = 3;
pub const NVML_ERROR_NOT_FOUND: NvmlReturn = 6;
pub const NVML_ERROR_INSUFFICIENT_SIZE: NvmlReturn = 7;
pub const NVML_ERROR_ARGUMENT_VERSION_MISMATCH: NvmlReturn = 25;
pub const NVML_ERROR_UNKNOWN: NvmlReturn = 999;

/// `nvmlErrorString` texts of the 580.159.04 library (measured), NUL-terminated.
const ERROR_STRINGS: &[(NvmlReturn, &str)] = &[
    (0, "Success\0"),
    (1, "Uninitialized\0"),
    (2, "Invalid Argument\0"),
    (3, "Not Supported\0"),
    (4, "Insufficient Permissions\0"),
    (5, "Already Initialized\0"),
    (6, "Not Found\0"),
    (7, "Insufficient Size\0"),
    (8, "Insufficient External Power\0"),
    (9, "Driver Not Loaded\0"),
    (10, "Timeout\0"),
    (11, "Interrupt Request Issue\0"),
    (12, "NVML Shared Library Not Found\0"),
    (13, "Function Not Found\0"),
    (14, "Corrupted infoROM\0"),
    (15, "GPU is lost\0"),
    (16, "GPU requires reset\0"),
    (17, "GPU access blocked by the operating system\0"),
    (18, "Driver/library version mismatch\0"),
    (19, "In use by another client\0"),
    (20, "Insufficient Memory\0"),
    (21, "No data\0"),
    (22, "vGPU ECC not supported\0"),
    (23, "Insufficient Resources\0"),
    (24, "Invalid Frequency\0"),
    (25, "Argument version mismatch\0"),
    (26, "Requested functionality has been deprecated\0"),
    (27, "System is not in ready state\0"),
    (28, "No supported GPUs were found\0"),
    (
        29,
        "Resource not in correct state to perform requested operation\0",
    ),
    (30, "Reset type is not supported for given device\0"),
    (999, "Unknown Error\0"),
];

/// One entry of the static device table; a `nvmlDevice_t` points at one.
#[repr(C)]
pub struct DeviceSlot {
    magic: u32,
    index: u32,
}

const DEVICE_MAGIC: u32 = 0x5649_4d4c;
static DEVICES: [DeviceSlot; MAX_GPUS] = {
    let mut table = [const {
        DeviceSlot {
            magic: DEVICE_MAGIC,
            index: 0,
        }
    }; MAX_GPUS];
    let mut i = 0;
    while i < MAX_GPUS {
        table[i].index = i as u32;
        i += 1;
    }
    table
};

/// nvmlInit calls not yet matched by nvmlShutdown.
static INIT_COUNT: AtomicU32 = AtomicU32::new(0);

type Res = Result<(), NvmlReturn>;

fn finish(result: Res) -> NvmlReturn {
    match result {
        Ok(()) => NVML_SUCCESS,
        Err(code) => code,
    }
}

macro_rules! nvml {
    ($( $(#[$meta:meta])* fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) $body:block )*) => {
        $(
            $(#[$meta])*
            #[unsafe(no_mangle)]
            pub extern "C" fn $name($($arg: $ty),*) -> NvmlReturn {
                fn body($($arg: $ty),*) -> Res { $body }
                ffi::guard(NVML_ERROR_UNKNOWN, || finish(body($($arg),*)))
            }
        )*
    };
}

fn out<T>(ptr: *mut T, value: T) -> Res {
    if write_out(ptr, value) {
        Ok(())
    } else {
        Err(NVML_ERROR_INVALID_ARGUMENT)
    }
}

fn initialized() -> Result<&'static Sim, NvmlReturn> {
    if INIT_COUNT.load(Ordering::Acquire) == 0 {
        return Err(NVML_ERROR_UNINITIALIZED);
    }
    sim().ok_or(NVML_ERROR_UNINITIALIZED)
}

/// The device a handle points at.
fn device(
    handle: *const DeviceSlot,
) -> Result<(&'static Sim, usize, &'static GpuSpec), NvmlReturn> {
    let sim = initialized()?;
    let base = DEVICES.as_ptr() as usize;
    let address = handle as usize;
    let size = std::mem::size_of::<DeviceSlot>();
    if address < base || address >= base + MAX_GPUS * size || !(address - base).is_multiple_of(size)
    {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    let index = (address - base) / size;
    let spec = sim
        .config
        .gpus
        .get(index)
        .ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
    if DEVICES[index].magic != DEVICE_MAGIC {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    Ok((sim, index, spec))
}

fn handle_of(index: usize) -> *const DeviceSlot {
    &DEVICES[index] as *const DeviceSlot
}

fn string_out(buffer: *mut c_char, length: u32, text: &str) -> Res {
    if buffer.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    if copy_c_string(buffer, length as usize, text) {
        Ok(())
    } else {
        Err(NVML_ERROR_INSUFFICIENT_SIZE)
    }
}

fn serial(index: usize) -> String {
    format!("165092400{:04}", index + 1)
}

/// Percent of the last second the card was busy.
fn utilization_percent(sim: &Sim, index: usize) -> u32 {
    (sim.state.gpu_busy_recent_ns(index, now_ns()) / 10_000_000).min(100) as u32
}

/// Whether per-process utilization comes as an H200's does (`VGPU_SIM_NVML_SAMPLES=sparse`,
/// read once per process): see [`sparse`]. Otherwise each query gets one exact sample per
/// busy process, its busy fraction over the last second.
fn sparse_samples() -> bool {
    static SPARSE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SPARSE.get_or_init(|| std::env::var(SPARSE_SAMPLES_ENV).is_ok_and(|value| value == "sparse"))
}

/// The env var that makes per-process utilization sparse and noisy.
pub const SPARSE_SAMPLES_ENV: &str = "VGPU_SIM_NVML_SAMPLES";

/// A process's per-process utilization samples as a time-sliced H200 gives them (BENCHMARKS
/// run 9: one sample every 200-1000 ms, now and then none for a whole second): a sample now
/// and then, not one per query (here: each run of [`SAMPLE_FRAME_BUCKETS`] 100 ms buckets
/// carries one, in any but its last bucket, so samples come 200 ms to 1.2 s apart, 700 ms
/// on average, and a busy process may have none in a whole second; no gap runs longer,
/// as none was seen longer there), each the process's busy fraction in that bucket swung
/// by a factor from 0.1 to 1.9 towards 0 or 100 (a steady 50 % reads anywhere from 5 to
/// 95; the swing averages 1, so many samples average to the truth). Both are drawn from
/// a hash of the PID and the bucket: every query sees the same samples.
fn sparse(record: &ProcessRecord, now: u64, wall_us: u64) -> Vec<NvmlProcessUtilizationSample> {
    let current = now / BUCKET_NS;
    let carries = |bucket: u64| {
        let frame = bucket / SAMPLE_FRAME_BUCKETS;
        bucket % SAMPLE_FRAME_BUCKETS == mix(record.pid as u64, frame) % (SAMPLE_FRAME_BUCKETS - 1)
    };
    record
        .history
        .iter()
        .enumerate()
        .filter_map(|(back, &busy_ns)| {
            let bucket = (current + back as u64).checked_sub(HISTORY_BUCKETS as u64)?;
            if !carries(bucket) || busy_ns == 0 {
                return None;
            }
            let swing_permille = 100 + mix(bucket, record.pid as u64 ^ 0x5a5a) % 1801;
            // The swing moves the figure towards 0 or 100, whichever is nearer, so that it
            // stays a percent and averages to the truth.
            let truth = (busy_ns * 1000 / BUCKET_NS).min(1000);
            let permille = if truth <= 500 {
                truth * swing_permille / 1000
            } else {
                1000 - (1000 - truth) * swing_permille / 1000
            };
            let percent = (permille / 10).min(100) as u32;
            let ended_ago_us = now.saturating_sub((bucket + 1) * BUCKET_NS) / 1000;
            Some(NvmlProcessUtilizationSample {
                pid: record.pid,
                time_stamp: wall_us.saturating_sub(ended_ago_us),
                sm_util: percent,
                mem_util: 0,
                enc_util: 0,
                dec_util: 0,
            })
        })
        .collect()
}

/// Buckets per sparse sample (see [`sparse`]): one sample in each run of this many.
const SAMPLE_FRAME_BUCKETS: u64 = 7;

/// A 64-bit mix of two numbers (splitmix64's finalizer).
fn mix(a: u64, b: u64) -> u64 {
    let mut z = a.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ b.wrapping_add(0x6a09_e667_f3bc_c909);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn processes(sim: &Sim, index: usize) -> Vec<ProcessRecord> {
    sim.state.reclaim_dead();
    sim.state.processes(index, now_ns())
}

/// NVML's two-call protocol for process lists: `infos` NULL or too small gives the count
/// and INSUFFICIENT_SIZE (SUCCESS when there are none).
fn write_processes<T>(
    count: *mut u32,
    infos: *mut T,
    list: &[ProcessRecord],
    make: impl Fn(&ProcessRecord) -> T,
) -> Res {
    let capacity = ffi::read_in(count).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
    out(count, list.len() as u32)?;
    if list.is_empty() {
        return Ok(());
    }
    if infos.is_null() || (capacity as usize) < list.len() {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (i, record) in list.iter().enumerate() {
        write_at(infos, i, make(record));
    }
    Ok(())
}

/// `nvmlMemory_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NvmlMemory {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NvmlMemoryV2 {
    pub version: u32,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}
const _: () = assert!(std::mem::size_of::<NvmlMemoryV2>() == 40);
/// `nvmlMemory_v2` = sizeof | 2 << 24.
pub const NVML_MEMORY_V2: u32 = 40 | (2 << 24);

/// `nvmlPciInfo_t` (v2 and v3 layout).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NvmlPciInfo {
    pub bus_id_legacy: [u8; 16],
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
    pub pci_device_id: u32,
    pub pci_sub_system_id: u32,
    pub bus_id: [u8; 32],
}
const _: () = assert!(std::mem::size_of::<NvmlPciInfo>() == 68);

/// The first `nvmlPciInfo_t` (for `nvmlDeviceGetPciInfo`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NvmlPciInfoV1 {
    pub bus_id: [u8; 16],
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
    pub pci_device_id: u32,
    pub pci_sub_system_id: u32,
    pub reserved: [u32; 4],
}
const _: () = assert!(std::mem::size_of::<NvmlPciInfoV1>() == 52);

/// `nvmlProcessInfo_v1_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NvmlProcessInfoV1 {
    pub pid: u32,
    pub used_gpu_memory: u64,
}
const _: () = assert!(std::mem::size_of::<NvmlProcessInfoV1>() == 16);

/// `nvmlProcessInfo_v2_t` = `nvmlProcessInfo_t` (what `_v3` fills).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NvmlProcessInfo {
    pub pid: u32,
    pub used_gpu_memory: u64,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
}
const _: () = assert!(std::mem::size_of::<NvmlProcessInfo>() == 24);

/// `nvmlProcessUtilizationSample_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NvmlProcessUtilizationSample {
    pub pid: u32,
    pub time_stamp: u64,
    pub sm_util: u32,
    pub mem_util: u32,
    pub enc_util: u32,
    pub dec_util: u32,
}
const _: () = assert!(std::mem::size_of::<NvmlProcessUtilizationSample>() == 32);

/// H200 SXM's PCI ids: device 0x2335, vendor 0x10de.
const PCI_DEVICE_ID: u32 = 0x2335_10de;
const PCI_SUBSYSTEM_ID: u32 = 0x18bf_10de;
const NOT_AVAILABLE: u32 = 0xffff_ffff;

fn fixed<const N: usize>(text: &str) -> [u8; N] {
    let mut bytes = [0u8; N];
    let n = text.len().min(N - 1);
    bytes[..n].copy_from_slice(&text.as_bytes()[..n]);
    bytes
}

fn pci_info(spec: &GpuSpec) -> NvmlPciInfo {
    NvmlPciInfo {
        bus_id_legacy: fixed(&format!(
            "{:04X}:{:02X}:{:02X}.0",
            spec.pci_domain, spec.pci_bus, spec.pci_device
        )),
        domain: spec.pci_domain,
        bus: spec.pci_bus,
        device: spec.pci_device,
        pci_device_id: PCI_DEVICE_ID,
        pci_sub_system_id: PCI_SUBSYSTEM_ID,
        bus_id: fixed(&spec.pci_bus_id),
    }
}

fn find_device(matches: impl Fn(&GpuSpec) -> bool, handle: *mut *const DeviceSlot) -> Res {
    let sim = initialized()?;
    let index = sim
        .config
        .gpus
        .iter()
        .position(matches)
        .ok_or(NVML_ERROR_NOT_FOUND)?;
    out(handle, handle_of(index))
}

fn process_name(pid: u32) -> Option<String> {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
        .ok()
        .map(|path| path.to_string_lossy().into_owned());
    exe.or_else(|| {
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .ok()
            .map(|comm| comm.trim().to_string())
    })
}

nvml! {
    fn nvmlInit() { init(0) }
    fn nvmlInit_v2() { init(0) }
    fn nvmlInitWithFlags(flags: u32) { init(flags) }

    fn nvmlShutdown() {
        INIT_COUNT.fetch_update(Ordering::AcqRel, Ordering::Acquire, |count| count.checked_sub(1)).map(|_| ()).map_err(|_| NVML_ERROR_UNINITIALIZED)
    }

    fn nvmlSystemGetDriverVersion(version: *mut c_char, length: u32) {
        initialized()?;
        string_out(version, length, driver_version())
    }

    fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: u32) {
        let sim = initialized()?;
        string_out(version, length, &format!("{}.{}", sim.config.cuda_version / 1000, driver_version()))
    }

    fn nvmlSystemGetCudaDriverVersion(version: *mut i32) {
        let sim = initialized()?;
        out(version, sim.config.cuda_version)
    }

    fn nvmlSystemGetCudaDriverVersion_v2(version: *mut i32) {
        let sim = initialized()?;
        out(version, sim.config.cuda_version)
    }

    fn nvmlSystemGetProcessName(pid: u32, name: *mut c_char, length: u32) {
        initialized()?;
        let text = process_name(pid).ok_or(NVML_ERROR_NOT_FOUND)?;
        string_out(name, length, &text)
    }

    fn nvmlDeviceGetCount(count: *mut u32) {
        let sim = initialized()?;
        out(count, sim.config.gpus.len() as u32)
    }

    fn nvmlDeviceGetCount_v2(count: *mut u32) {
        let sim = initialized()?;
        out(count, sim.config.gpus.len() as u32)
    }

    fn nvmlDeviceGetHandleByIndex(index: u32, handle: *mut *const DeviceSlot) { by_index(index, handle) }
    fn nvmlDeviceGetHandleByIndex_v2(index: u32, handle: *mut *const DeviceSlot) { by_index(index, handle) }

    fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, handle: *mut *const DeviceSlot) {
        let wanted = c_str(uuid).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
        find_device(|spec| spec.uuid.eq_ignore_ascii_case(wanted.trim()), handle)
    }

    fn nvmlDeviceGetHandleBySerial(serial_text: *const c_char, handle: *mut *const DeviceSlot) {
        let wanted = c_str(serial_text).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
        let sim = initialized()?;
        let index = (0..sim.config.gpus.len()).find(|i| serial(*i) == wanted.trim()).ok_or(NVML_ERROR_NOT_FOUND)?;
        out(handle, handle_of(index))
    }

    fn nvmlDeviceGetHandleByPciBusId(bus_id: *const c_char, handle: *mut *const DeviceSlot) { by_bus_id(bus_id, handle) }
    fn nvmlDeviceGetHandleByPciBusId_v2(bus_id: *const c_char, handle: *mut *const DeviceSlot) { by_bus_id(bus_id, handle) }

    fn nvmlDeviceGetName(handle: *const DeviceSlot, name: *mut c_char, length: u32) {
        let (_, _, spec) = device(handle)?;
        string_out(name, length, &spec.name)
    }

    fn nvmlDeviceGetUUID(handle: *const DeviceSlot, uuid: *mut c_char, length: u32) {
        let (_, _, spec) = device(handle)?;
        string_out(uuid, length, &spec.uuid)
    }

    fn nvmlDeviceGetSerial(handle: *const DeviceSlot, text: *mut c_char, length: u32) {
        let (_, index, _) = device(handle)?;
        string_out(text, length, &serial(index))
    }

    fn nvmlDeviceGetIndex(handle: *const DeviceSlot, index: *mut u32) {
        let (_, i, _) = device(handle)?;
        out(index, i as u32)
    }

    fn nvmlDeviceGetMinorNumber(handle: *const DeviceSlot, minor: *mut u32) {
        let (_, i, _) = device(handle)?;
        out(minor, i as u32)
    }

    fn nvmlDeviceGetPciInfo(handle: *const DeviceSlot, pci: *mut NvmlPciInfoV1) {
        let (_, _, spec) = device(handle)?;
        let info = pci_info(spec);
        out(pci, NvmlPciInfoV1 { bus_id: info.bus_id_legacy, domain: info.domain, bus: info.bus, device: info.device, pci_device_id: info.pci_device_id, pci_sub_system_id: info.pci_sub_system_id, reserved: [0; 4] })
    }

    fn nvmlDeviceGetPciInfo_v2(handle: *const DeviceSlot, pci: *mut NvmlPciInfo) {
        let (_, _, spec) = device(handle)?;
        out(pci, pci_info(spec))
    }

    fn nvmlDeviceGetPciInfo_v3(handle: *const DeviceSlot, pci: *mut NvmlPciInfo) {
        let (_, _, spec) = device(handle)?;
        out(pci, pci_info(spec))
    }

    fn nvmlDeviceGetMemoryInfo(handle: *const DeviceSlot, memory: *mut NvmlMemory) {
        let (sim, index, spec) = device(handle)?;
        sim.state.reclaim_dead();
        let used = sim.state.gpu_used(index).min(spec.memory);
        out(memory, NvmlMemory { total: spec.memory, free: spec.memory - used, used })
    }

    /// The sim reserves nothing for the driver: `reserved` is 0 and total is what CUDA reports.
    fn nvmlDeviceGetMemoryInfo_v2(handle: *const DeviceSlot, memory: *mut NvmlMemoryV2) {
        let (sim, index, spec) = device(handle)?;
        let version = ffi::read_in(memory.cast::<u32>()).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
        if version != NVML_MEMORY_V2 {
            return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        sim.state.reclaim_dead();
        let used = sim.state.gpu_used(index).min(spec.memory);
        out(memory, NvmlMemoryV2 { version, total: spec.memory, reserved: 0, free: spec.memory - used, used })
    }

    fn nvmlDeviceGetBAR1MemoryInfo(handle: *const DeviceSlot, bar1: *mut NvmlMemory) {
        device(handle)?;
        let total = 256u64 << 30;
        let used = 2u64 << 20;
        out(bar1, NvmlMemory { total, free: total - used, used })
    }

    fn nvmlDeviceGetUtilizationRates(handle: *const DeviceSlot, utilization: *mut [u32; 2]) {
        let (sim, index, _) = device(handle)?;
        // No memory-traffic model: the memory controller reads idle.
        out(utilization, [utilization_percent(sim, index), 0])
    }

    fn nvmlDeviceGetProcessUtilization(handle: *const DeviceSlot, samples: *mut NvmlProcessUtilizationSample, count: *mut u32, last_seen: u64) {
        let (sim, index, _) = device(handle)?;
        let now = now_ns();
        let wall = wall_us();
        let records = processes(sim, index);
        let list: Vec<NvmlProcessUtilizationSample> = if sparse_samples() {
            records.iter().flat_map(|record| sparse(record, now, wall)).filter(|sample| sample.time_stamp > last_seen).collect()
        } else {
            records
                .iter()
                .filter(|record| record.busy_recent_ns > 0)
                .map(|record| {
                    let ended_ago_us = now.saturating_sub(record.busy_until.min(now)) / 1000;
                    NvmlProcessUtilizationSample { pid: record.pid, time_stamp: wall.saturating_sub(ended_ago_us), sm_util: (record.busy_recent_ns / 10_000_000).min(100) as u32, mem_util: 0, enc_util: 0, dec_util: 0 }
                })
                .filter(|sample| sample.time_stamp > last_seen)
                .collect()
        };
        let capacity = ffi::read_in(count).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
        out(count, list.len() as u32)?;
        if samples.is_null() {
            return Err(NVML_ERROR_INSUFFICIENT_SIZE);
        }
        if list.is_empty() {
            return Err(NVML_ERROR_NOT_FOUND);
        }
        if (capacity as usize) < list.len() {
            return Err(NVML_ERROR_INSUFFICIENT_SIZE);
        }
        for (i, sample) in list.into_iter().enumerate() {
            write_at(samples, i, sample);
        }
        Ok(())
    }

    fn nvmlDeviceGetComputeRunningProcesses(handle: *const DeviceSlot, count: *mut u32, infos: *mut NvmlProcessInfoV1) {
        let (sim, index, _) = device(handle)?;
        write_processes(count, infos, &processes(sim, index), |r| NvmlProcessInfoV1 { pid: r.pid, used_gpu_memory: r.used })
    }

    fn nvmlDeviceGetComputeRunningProcesses_v2(handle: *const DeviceSlot, count: *mut u32, infos: *mut NvmlProcessInfo) {
        let (sim, index, _) = device(handle)?;
        write_processes(count, infos, &processes(sim, index), |r| NvmlProcessInfo { pid: r.pid, used_gpu_memory: r.used, gpu_instance_id: NOT_AVAILABLE, compute_instance_id: NOT_AVAILABLE })
    }

    fn nvmlDeviceGetComputeRunningProcesses_v3(handle: *const DeviceSlot, count: *mut u32, infos: *mut NvmlProcessInfo) {
        let (sim, index, _) = device(handle)?;
        write_processes(count, infos, &processes(sim, index), |r| NvmlProcessInfo { pid: r.pid, used_gpu_memory: r.used, gpu_instance_id: NOT_AVAILABLE, compute_instance_id: NOT_AVAILABLE })
    }

    /// The sim runs no graphics clients.
    fn nvmlDeviceGetGraphicsRunningProcesses(handle: *const DeviceSlot, count: *mut u32, infos: *mut NvmlProcessInfoV1) {
        device(handle)?;
        write_processes(count, infos, &[], |r| NvmlProcessInfoV1 { pid: r.pid, used_gpu_memory: r.used })
    }

    fn nvmlDeviceGetGraphicsRunningProcesses_v2(handle: *const DeviceSlot, count: *mut u32, infos: *mut NvmlProcessInfo) {
        device(handle)?;
        write_processes(count, infos, &[], |r| NvmlProcessInfo { pid: r.pid, used_gpu_memory: r.used, gpu_instance_id: NOT_AVAILABLE, compute_instance_id: NOT_AVAILABLE })
    }

    fn nvmlDeviceGetGraphicsRunningProcesses_v3(handle: *const DeviceSlot, count: *mut u32, infos: *mut NvmlProcessInfo) {
        device(handle)?;
        write_processes(count, infos, &[], |r| NvmlProcessInfo { pid: r.pid, used_gpu_memory: r.used, gpu_instance_id: NOT_AVAILABLE, compute_instance_id: NOT_AVAILABLE })
    }

    /// Sensor 0 (GPU): 30 °C idle, up to 70 °C fully busy.
    fn nvmlDeviceGetTemperature(handle: *const DeviceSlot, sensor: u32, temperature: *mut u32) {
        let (sim, index, _) = device(handle)?;
        if sensor != 0 {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        out(temperature, 30 + utilization_percent(sim, index) * 40 / 100)
    }

    /// Milliwatts: 70 W idle, up to 700 W fully busy.
    fn nvmlDeviceGetPowerUsage(handle: *const DeviceSlot, power: *mut u32) {
        let (sim, index, _) = device(handle)?;
        out(power, 70_000 + utilization_percent(sim, index) * 6_300)
    }

    fn nvmlDeviceGetEnforcedPowerLimit(handle: *const DeviceSlot, limit: *mut u32) {
        device(handle)?;
        out(limit, 700_000)
    }

    fn nvmlDeviceGetPowerManagementLimit(handle: *const DeviceSlot, limit: *mut u32) {
        device(handle)?;
        out(limit, 700_000)
    }

    /// SXM boards have no fans of their own.
    fn nvmlDeviceGetFanSpeed(handle: *const DeviceSlot, speed: *mut u32) {
        device(handle)?;
        let _ = speed;
        Err(NVML_ERROR_NOT_SUPPORTED)
    }

    fn nvmlDeviceGetPerformanceState(handle: *const DeviceSlot, state: *mut u32) {
        device(handle)?;
        out(state, 0)
    }

    fn nvmlDeviceGetPersistenceMode(handle: *const DeviceSlot, mode: *mut u32) {
        device(handle)?;
        out(mode, 1)
    }

    fn nvmlDeviceGetComputeMode(handle: *const DeviceSlot, mode: *mut u32) {
        device(handle)?;
        out(mode, 0)
    }

    /// A real H200 reports display mode enabled and no display active.
    fn nvmlDeviceGetDisplayMode(handle: *const DeviceSlot, mode: *mut u32) {
        device(handle)?;
        out(mode, 1)
    }

    fn nvmlDeviceGetDisplayActive(handle: *const DeviceSlot, active: *mut u32) {
        device(handle)?;
        out(active, 0)
    }

    fn nvmlDeviceGetEccMode(handle: *const DeviceSlot, current: *mut u32, pending: *mut u32) {
        device(handle)?;
        out(current, 1)?;
        out(pending, 1)
    }

    fn nvmlDeviceGetCudaComputeCapability(handle: *const DeviceSlot, major: *mut i32, minor: *mut i32) {
        device(handle)?;
        out(major, crate::cuda::api::COMPUTE_CAPABILITY.0)?;
        out(minor, crate::cuda::api::COMPUTE_CAPABILITY.1)
    }

    /// NVML_DEVICE_ARCH_HOPPER.
    fn nvmlDeviceGetArchitecture(handle: *const DeviceSlot, arch: *mut u32) {
        device(handle)?;
        out(arch, 9)
    }

    fn nvmlDeviceGetClockInfo(handle: *const DeviceSlot, clock: u32, mhz: *mut u32) {
        let (sim, index, _) = device(handle)?;
        let busy = utilization_percent(sim, index) > 0;
        out(mhz, match clock {
            0 | 1 => if busy { 1980 } else { 345 },
            2 => 3201,
            3 => if busy { 1545 } else { 765 },
            _ => return Err(NVML_ERROR_INVALID_ARGUMENT),
        })
    }

    fn nvmlDeviceGetMaxClockInfo(handle: *const DeviceSlot, clock: u32, mhz: *mut u32) {
        device(handle)?;
        out(mhz, match clock {
            0 | 1 => 1980,
            2 => 3201,
            3 => 1545,
            _ => return Err(NVML_ERROR_INVALID_ARGUMENT),
        })
    }

    fn nvmlDeviceGetMigMode(handle: *const DeviceSlot, current: *mut u32, pending: *mut u32) {
        device(handle)?;
        out(current, 0)?;
        out(pending, 0)
    }

    /// NVML_BRAND_NVIDIA.
    fn nvmlDeviceGetBrand(handle: *const DeviceSlot, brand: *mut u32) {
        device(handle)?;
        out(brand, 14)
    }

    fn nvmlDeviceGetCurrPcieLinkGeneration(handle: *const DeviceSlot, generation: *mut u32) {
        device(handle)?;
        out(generation, 5)
    }

    fn nvmlDeviceGetCurrPcieLinkWidth(handle: *const DeviceSlot, width: *mut u32) {
        device(handle)?;
        out(width, 16)
    }
}

fn init(flags: u32) -> Res {
    if flags & !0x3 != 0 {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    sim().ok_or(NVML_ERROR_UNINITIALIZED)?;
    INIT_COUNT.fetch_add(1, Ordering::AcqRel);
    Ok(())
}

fn by_index(index: u32, handle: *mut *const DeviceSlot) -> Res {
    let sim = initialized()?;
    if index as usize >= sim.config.gpus.len() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    out(handle, handle_of(index as usize))
}

fn by_bus_id(bus_id: *const c_char, handle: *mut *const DeviceSlot) -> Res {
    let wanted = c_str(bus_id)
        .and_then(|text| canonical_pci_bus_id(&text))
        .ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
    find_device(|spec| spec.pci_bus_id.eq_ignore_ascii_case(&wanted), handle)
}

/// `nvmlErrorString`: a static string for every code ("Unknown Error" for unknown ones).
#[unsafe(no_mangle)]
pub extern "C" fn nvmlErrorString(result: NvmlReturn) -> *const c_char {
    let text = ERROR_STRINGS
        .iter()
        .find(|(code, _)| *code == result)
        .map(|(_, text)| *text)
        .unwrap_or("Unknown Error\0");
    text.as_ptr().cast()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn busy_at(percent: u64, pid: u32) -> ProcessRecord {
        ProcessRecord {
            pid,
            used: 0,
            contexts: 1,
            launches: 0,
            busy_total_ns: 0,
            busy_recent_ns: 0,
            busy_until: 0,
            history: [BUCKET_NS * percent / 100; HISTORY_BUCKETS],
        }
    }

    #[test]
    fn sparse_samples_come_now_and_then_swing_widely_and_average_to_the_truth() {
        let wall = 1_700_000_000_000_000u64;
        let (mut values, mut gaps, mut queries) = (Vec::new(), Vec::new(), 0);
        for pid in 1000..1200u32 {
            // Queries far enough apart that every bucket is seen once.
            let now = 1_000 * BUCKET_NS + pid as u64 * HISTORY_BUCKETS as u64 * BUCKET_NS;
            let samples = sparse(&busy_at(50, pid), now, wall);
            let stamps: Vec<u64> = samples.iter().map(|s| s.time_stamp).collect();
            gaps.extend(stamps.windows(2).map(|w| w[1] - w[0]));
            values.extend(samples.iter().map(|s| s.sm_util));
            queries += 1;
        }
        let per_second = values.len() as f64 / (queries as f64 * HISTORY_BUCKETS as f64 / 10.0);
        assert!(
            (1.0..=2.5).contains(&per_second),
            "{per_second} samples a second"
        );
        assert!(
            gaps.iter().all(|gap| (200_000..=1_200_000).contains(gap)),
            "two buckets running, or a gap beyond 1.2 s: {:?}",
            (gaps.iter().min(), gaps.iter().max())
        );
        // Now and then none for a whole second.
        assert!(
            gaps.iter().any(|gap| *gap > 1_000_000),
            "no gap beyond a second"
        );
        let mean = values.iter().sum::<u32>() as f64 / values.len() as f64;
        assert!((mean - 50.0).abs() < 4.0, "mean {mean}");
        let (low, high) = (values.iter().min(), values.iter().max());
        assert!(low <= Some(&12) && high >= Some(&88), "{low:?}..{high:?}");
        // A busy card's process: the swing stays within a percent.
        let busy = sparse(&busy_at(95, 7), 1_000 * BUCKET_NS, wall);
        assert!(busy.iter().all(|s| s.sm_util <= 100));
        // An idle process has no samples.
        assert!(sparse(&busy_at(0, 7), 1_000 * BUCKET_NS, wall).is_empty());
    }
}
