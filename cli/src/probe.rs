//! `vgpu probe`: what a CUDA process sees, through whatever `libcuda.so.1` and
//! `libnvidia-ml.so.1` the loader gives it (inside `vgpu run`, the shims): devices,
//! memory totals, cuMemGetInfo, a sequence of allocations, and NVML's memory view.
//! Human-readable by default, `--json` for tests.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::time::Duration;

use anyhow::{Context, Result};
use libloading::Library;
use serde::Serialize;
use vgpu_abi::cuda::{CUDA_SUCCESS, CUresult};
use vgpu_abi::entry::*;
use vgpu_abi::nvml::{Memory, NVML_SUCCESS};
use vgpu_contract::ByteSize;

#[derive(clap::Args)]
pub struct ProbeArgs {
    /// Allocate this much with cuMemAlloc (repeat for a sequence; each is kept).
    #[arg(long = "alloc")]
    allocations: Vec<ByteSize>,
    /// Keep the allocations this many seconds before freeing them.
    #[arg(long, default_value_t = 0.0)]
    hold: f64,
    /// Device ordinal to use.
    #[arg(long, default_value_t = 0)]
    device: i32,
    /// Look the driver functions up with cuGetProcAddress_v2, as CUDA 12+ runtimes do.
    #[arg(long)]
    proc_address: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize, Default)]
struct Report {
    driver_version: i32,
    device_count: i32,
    devices: Vec<DeviceReport>,
    mem_get_info: Option<(u64, u64)>,
    allocations: Vec<AllocationReport>,
    after_free: Option<(u64, u64)>,
    nvml: Option<NvmlReport>,
}

#[derive(Serialize)]
struct DeviceReport {
    ordinal: i32,
    name: String,
    total_mem: u64,
}

#[derive(Serialize)]
struct AllocationReport {
    bytes: u64,
    result: String,
}

#[derive(Serialize)]
struct NvmlReport {
    device_count: u32,
    memory: Vec<(u64, u64, u64)>,
}

/// Finds a driver function by export name.
type Lookup = Box<dyn Fn(&CStr) -> Result<*mut c_void>>;

struct Cuda {
    lookup: Lookup,
}

impl Cuda {
    /// Entry point `E`, typed as vgpu-abi declares it.
    fn function<E: EntryPoint>(&self) -> Result<E::Function> {
        let pointer = (self.lookup)(E::NAME)?;
        // SAFETY: a non-null address of the export E::NAME, and E::Function is that
        // export's C type (vgpu-abi's entry table, checked against the headers): both
        // are one pointer wide.
        Ok(unsafe { std::mem::transmute_copy::<*mut c_void, E::Function>(&pointer) })
    }

    fn error_name(&self, result: CUresult) -> String {
        let Ok(get_name) = self.function::<CuGetErrorName>() else {
            return format!("CUresult {result}");
        };
        let mut name: *const c_char = std::ptr::null();
        // SAFETY: valid out-pointer; the driver returns a static string.
        if unsafe { get_name(result, &mut name) } == CUDA_SUCCESS && !name.is_null() {
            // SAFETY: NUL-terminated static string from the driver.
            return unsafe { CStr::from_ptr(name) }
                .to_string_lossy()
                .into_owned();
        }
        format!("CUresult {result}")
    }

    fn check(&self, what: &str, result: CUresult) -> Result<()> {
        if result == CUDA_SUCCESS {
            Ok(())
        } else {
            anyhow::bail!("{what}: {}", self.error_name(result))
        }
    }
}

fn open_cuda(proc_address: bool) -> Result<Cuda> {
    // SAFETY: loading the CUDA driver by name, as any CUDA program does.
    let library = std::rc::Rc::new(
        unsafe { Library::new("libcuda.so.1") }.context("cannot load libcuda.so.1")?,
    );
    // SAFETY: the symbol's type is vgpu-abi's declaration of cuGetProcAddress_v2.
    let get_proc: Option<<CuGetProcAddressV2 as EntryPoint>::Function> =
        unsafe { library.get(CuGetProcAddressV2::NAME.to_bytes_with_nul()) }
            .ok()
            .map(|s| *s);
    let lookup: Lookup = match (proc_address, get_proc) {
        (true, Some(get_proc)) => Box::new(move |name: &CStr| {
            let full = name.to_str().unwrap_or_default();
            let base = full.strip_suffix("_v2").unwrap_or(full);
            let symbol = std::ffi::CString::new(base)?;
            let mut pointer = std::ptr::null_mut();
            let mut status = 0;
            // SAFETY: valid strings and out-pointers; 12000 asks for the CUDA 12 ABI.
            let result = unsafe { get_proc(symbol.as_ptr(), &mut pointer, 12000, 0, &mut status) };
            if result != CUDA_SUCCESS || pointer.is_null() {
                anyhow::bail!("cuGetProcAddress_v2({base}) failed with {result}");
            }
            Ok(pointer)
        }),
        _ => Box::new(move |name: &CStr| {
            // SAFETY: reading a symbol address only; the closure keeps the library alive.
            let symbol = unsafe { library.get::<*mut c_void>(name.to_bytes_with_nul()) }
                .with_context(|| format!("{} is not exported", name.to_string_lossy()))?;
            Ok(*symbol)
        }),
    };
    Ok(Cuda { lookup })
}

fn memory_info(cuda: &Cuda) -> Result<(u64, u64)> {
    let get_info = cuda.function::<CuMemGetInfoV2>()?;
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: valid out-pointers.
    cuda.check("cuMemGetInfo", unsafe { get_info(&mut free, &mut total) })?;
    Ok((free as u64, total as u64))
}

fn probe_cuda(args: &ProbeArgs, report: &mut Report) -> Result<()> {
    let cuda = open_cuda(args.proc_address)?;
    let init = cuda.function::<CuInit>()?;
    let driver_version = cuda.function::<CuDriverGetVersion>()?;
    let device_count = cuda.function::<CuDeviceGetCount>()?;
    let device_get = cuda.function::<CuDeviceGet>()?;
    let device_name = cuda.function::<CuDeviceGetName>()?;
    let total_mem = cuda.function::<CuDeviceTotalMemV2>()?;
    let retain = cuda.function::<CuDevicePrimaryCtxRetain>()?;
    let set_current = cuda.function::<CuCtxSetCurrent>()?;
    let alloc = cuda.function::<CuMemAllocV2>()?;
    let free = cuda.function::<CuMemFreeV2>()?;

    // SAFETY: our own out-pointer, to cuDriverGetVersion.
    unsafe { driver_version(&mut report.driver_version) };
    // SAFETY: cuInit takes flags only.
    cuda.check("cuInit", unsafe { init(0) })?;
    // SAFETY: our own out-pointer, to cuDeviceGetCount.
    cuda.check("cuDeviceGetCount", unsafe {
        device_count(&mut report.device_count)
    })?;
    for ordinal in 0..report.device_count {
        let mut device = 0;
        // SAFETY: a driver API call with valid out-pointers and sizes.
        cuda.check("cuDeviceGet", unsafe { device_get(&mut device, ordinal) })?;
        let mut name = [0 as c_char; 256];
        // SAFETY: our own buffer and its length, to cuDeviceGetName.
        unsafe { device_name(name.as_mut_ptr(), name.len() as c_int, device) };
        let mut total = 0usize;
        // SAFETY: a driver API call with valid out-pointers and sizes.
        cuda.check("cuDeviceTotalMem", unsafe { total_mem(&mut total, device) })?;
        // SAFETY: the driver NUL-terminates within the buffer.
        let name = unsafe { CStr::from_ptr(name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        report.devices.push(DeviceReport {
            ordinal,
            name,
            total_mem: total as u64,
        });
    }
    if report.device_count == 0 {
        return Ok(());
    }
    let mut device = 0;
    // SAFETY: a driver API call with valid out-pointers and sizes.
    cuda.check("cuDeviceGet", unsafe {
        device_get(&mut device, args.device)
    })?;
    let mut context = std::ptr::null_mut();
    // SAFETY: a driver API call with valid out-pointers and sizes.
    cuda.check("cuDevicePrimaryCtxRetain", unsafe {
        retain(&mut context, device)
    })?;
    // SAFETY: the context the driver just retained for us.
    cuda.check("cuCtxSetCurrent", unsafe { set_current(context) })?;
    report.mem_get_info = Some(memory_info(&cuda)?);
    let mut held = Vec::new();
    for bytes in &args.allocations {
        let mut pointer = 0u64;
        // SAFETY: a driver API call with valid out-pointers and sizes.
        let result = unsafe { alloc(&mut pointer, bytes.bytes() as usize) };
        if result == CUDA_SUCCESS {
            held.push(pointer);
        }
        let result = if result == CUDA_SUCCESS {
            "CUDA_SUCCESS".to_string()
        } else {
            cuda.error_name(result)
        };
        report.allocations.push(AllocationReport {
            bytes: bytes.bytes(),
            result,
        });
    }
    if !held.is_empty() {
        report.nvml = probe_nvml().ok();
        if args.hold > 0.0 {
            std::thread::sleep(Duration::from_secs_f64(args.hold));
        }
        for pointer in held {
            // SAFETY: a driver API call with valid out-pointers and sizes.
            unsafe { free(pointer) };
        }
        report.after_free = Some(memory_info(&cuda)?);
    }
    Ok(())
}

fn probe_nvml() -> Result<NvmlReport> {
    // SAFETY: loading NVML by name, as monitoring tools do.
    let library =
        unsafe { Library::new("libnvidia-ml.so.1") }.context("cannot load libnvidia-ml.so.1")?;
    // SAFETY: each symbol's type is vgpu-abi's declaration of its export.
    unsafe {
        let init = library
            .get::<<NvmlInitV2 as EntryPoint>::Function>(NvmlInitV2::NAME.to_bytes_with_nul())?;
        let count = library.get::<<NvmlDeviceGetCountV2 as EntryPoint>::Function>(
            NvmlDeviceGetCountV2::NAME.to_bytes_with_nul(),
        )?;
        let by_index = library.get::<<NvmlDeviceGetHandleByIndexV2 as EntryPoint>::Function>(
            NvmlDeviceGetHandleByIndexV2::NAME.to_bytes_with_nul(),
        )?;
        let memory = library.get::<<NvmlDeviceGetMemoryInfo as EntryPoint>::Function>(
            NvmlDeviceGetMemoryInfo::NAME.to_bytes_with_nul(),
        )?;
        anyhow::ensure!(init() == NVML_SUCCESS, "nvmlInit failed");
        let mut device_count = 0;
        anyhow::ensure!(
            count(&mut device_count) == NVML_SUCCESS,
            "nvmlDeviceGetCount failed"
        );
        let mut report = NvmlReport {
            device_count,
            memory: Vec::new(),
        };
        for index in 0..device_count {
            let mut device = std::ptr::null_mut();
            let mut info = Memory::default();
            if by_index(index, &mut device) == NVML_SUCCESS
                && memory(device, &mut info) == NVML_SUCCESS
            {
                report.memory.push((info.total, info.free, info.used));
            }
        }
        Ok(report)
    }
}

fn mib(bytes: u64) -> String {
    format!("{} MiB", bytes >> 20)
}

pub fn run(args: &ProbeArgs) -> Result<()> {
    let mut report = Report::default();
    let outcome = probe_cuda(args, &mut report);
    if report.nvml.is_none() {
        report.nvml = probe_nvml().ok();
    }
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
        return outcome;
    }
    println!(
        "driver API version {}.{}",
        report.driver_version / 1000,
        (report.driver_version % 1000) / 10
    );
    println!("devices: {}", report.device_count);
    for device in &report.devices {
        println!(
            "  {}: {} ({} total)",
            device.ordinal,
            device.name,
            mib(device.total_mem)
        );
    }
    if let Some((free, total)) = report.mem_get_info {
        println!("cuMemGetInfo: {} free of {}", mib(free), mib(total));
    }
    for allocation in &report.allocations {
        println!(
            "cuMemAlloc({}): {}",
            ByteSize(allocation.bytes),
            allocation.result
        );
    }
    if let Some(nvml) = &report.nvml {
        println!("NVML: {} device(s)", nvml.device_count);
        for (index, (total, free, used)) in nvml.memory.iter().enumerate() {
            println!(
                "  {index}: {} used, {} free of {}",
                mib(*used),
                mib(*free),
                mib(*total)
            );
        }
    }
    if let Some((free, total)) = report.after_free {
        println!("after free: {} free of {}", mib(free), mib(total));
    }
    outcome
}
