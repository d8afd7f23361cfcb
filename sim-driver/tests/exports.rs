//! The library exports only names of the real driver's export lists (so the shims'
//! dlsym of every real name finds the sim's or nothing), every exported `cu*` name is
//! reachable through cuGetProcAddress, and the brief's required entry points are there.

mod common;

use std::collections::BTreeSet;

use object::{Object, ObjectSymbol};

fn exported_names() -> BTreeSet<String> {
    let bytes = std::fs::read(common::library_path()).unwrap();
    let file = object::File::parse(&*bytes).unwrap();
    file.dynamic_symbols()
        .filter(|s| s.is_definition() && s.is_global())
        .filter_map(|s| s.name().ok().map(str::to_string))
        .collect()
}

fn real_list(name: &str) -> BTreeSet<String> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../symbols")
        .join(name);
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

#[test]
fn exports_are_a_subset_of_the_real_lists() {
    let real: BTreeSet<String> = real_list("libcuda.so.580.159.04.txt")
        .union(&real_list("libnvidia-ml.so.580.159.04.txt"))
        .cloned()
        .collect();
    let exported: BTreeSet<String> = exported_names()
        .into_iter()
        .filter(|name| name.starts_with("cu") || name.starts_with("nvml"))
        .collect();
    let foreign: Vec<&String> = exported.difference(&real).collect();
    assert!(foreign.is_empty(), "not in the 580 lists: {foreign:?}");
    let all = exported_names();
    let stray: Vec<&String> = all
        .iter()
        .filter(|name| !(name.starts_with("cu") || name.starts_with("nvml")))
        .filter(|name| !name.starts_with('_') && !name.starts_with("rust_"))
        .collect();
    assert!(stray.is_empty(), "unexpected exports: {stray:?}");
    assert!(exported.len() > 200, "{} exports", exported.len());
}

#[test]
fn every_cuda_export_is_reachable_through_get_proc_address() {
    let sim = common::Sim::load();
    let get_proc: unsafe extern "C" fn(
        *const std::ffi::c_char,
        *mut *mut std::ffi::c_void,
        i32,
        u64,
        *mut i32,
    ) -> i32 = sim.sym("cuGetProcAddress_v2");
    let mut reachable = BTreeSet::new();
    let bases: BTreeSet<String> = exported_names()
        .into_iter()
        .filter(|name| name.starts_with("cu"))
        .map(|name| {
            name.trim_end_matches("_ptsz")
                .trim_end_matches("_ptds")
                .trim_end_matches("_v2")
                .trim_end_matches("_v3")
                .trim_end_matches("_v4")
                .to_string()
        })
        .collect();
    for base in &bases {
        for version in [
            2000, 3020, 4000, 7000, 10000, 10010, 11000, 11040, 12000, 12050, 12080, 13000,
        ] {
            for flags in [0u64, 2] {
                let name = std::ffi::CString::new(base.as_str()).unwrap();
                let mut pfn = std::ptr::null_mut();
                let mut status = 0;
                // SAFETY: our own C string and out-pointers, to cuGetProcAddress_v2.
                if unsafe { get_proc(name.as_ptr(), &mut pfn, version, flags, &mut status) } == 0 {
                    reachable.insert(pfn as usize);
                }
            }
        }
    }
    for name in exported_names()
        .into_iter()
        .filter(|name| name.starts_with("cu"))
    {
        assert!(
            reachable.contains(&sim.address(&name)),
            "{name} is exported but no cuGetProcAddress request returns it"
        );
    }
}

#[test]
fn required_entry_points_are_exported() {
    let exported = exported_names();
    for name in [
        "cuInit",
        "cuDriverGetVersion",
        "cuDeviceGetCount",
        "cuDeviceGet",
        "cuDeviceGetName",
        "cuDeviceGetUuid",
        "cuDeviceGetUuid_v2",
        "cuDeviceTotalMem",
        "cuDeviceTotalMem_v2",
        "cuDeviceGetAttribute",
        "cuDeviceGetPCIBusId",
        "cuDeviceGetByPCIBusId",
        "cuDeviceGetProperties",
        "cuDevicePrimaryCtxRetain",
        "cuDevicePrimaryCtxRelease_v2",
        "cuDevicePrimaryCtxReset_v2",
        "cuDevicePrimaryCtxGetState",
        "cuDevicePrimaryCtxSetFlags_v2",
        "cuCtxCreate",
        "cuCtxCreate_v2",
        "cuCtxCreate_v3",
        "cuCtxCreate_v4",
        "cuCtxDestroy_v2",
        "cuCtxGetCurrent",
        "cuCtxSetCurrent",
        "cuCtxPushCurrent_v2",
        "cuCtxPopCurrent_v2",
        "cuCtxGetDevice",
        "cuCtxSynchronize",
        "cuCtxGetApiVersion",
        "cuCtxGetFlags",
        "cuMemAlloc_v2",
        "cuMemFree_v2",
        "cuMemAllocPitch_v2",
        "cuMemAllocManaged",
        "cuMemGetInfo_v2",
        "cuMemGetAddressRange_v2",
        "cuPointerGetAttribute",
        "cuMemcpyHtoD_v2",
        "cuMemcpyDtoH_v2",
        "cuMemcpyDtoD_v2",
        "cuMemsetD8_v2",
        "cuMemsetD32_v2",
        "cuArrayCreate_v2",
        "cuArray3DCreate_v2",
        "cuArrayDestroy",
        "cuMipmappedArrayCreate",
        "cuMipmappedArrayDestroy",
        "cuMemGetAllocationGranularity",
        "cuMemCreate",
        "cuMemRelease",
        "cuMemAddressReserve",
        "cuMemAddressFree",
        "cuMemMap",
        "cuMemUnmap",
        "cuMemSetAccess",
        "cuMemRetainAllocationHandle",
        "cuDeviceGetDefaultMemPool",
        "cuDeviceGetMemPool",
        "cuMemPoolCreate",
        "cuMemPoolDestroy",
        "cuMemPoolTrimTo",
        "cuMemPoolSetAttribute",
        "cuMemPoolGetAttribute",
        "cuMemAllocAsync",
        "cuMemAllocFromPoolAsync",
        "cuMemFreeAsync",
        "cuStreamCreate",
        "cuStreamCreateWithPriority",
        "cuStreamDestroy_v2",
        "cuStreamSynchronize",
        "cuStreamQuery",
        "cuStreamWaitEvent",
        "cuEventCreate",
        "cuEventRecord",
        "cuEventQuery",
        "cuEventSynchronize",
        "cuEventElapsedTime",
        "cuEventDestroy_v2",
        "cuModuleLoad",
        "cuModuleLoadData",
        "cuModuleLoadDataEx",
        "cuModuleUnload",
        "cuModuleGetFunction",
        "cuLibraryLoadData",
        "cuLibraryGetKernel",
        "cuKernelGetFunction",
        "cuFuncGetAttribute",
        "cuLaunchKernel",
        "cuLaunchKernelEx",
        "cuLaunchCooperativeKernel",
        "cuLaunchKernel_ptsz",
        "cuGetProcAddress",
        "cuGetProcAddress_v2",
        "cuGetErrorString",
        "cuGetErrorName",
        "cuGetExportTable",
        "nvmlInit",
        "nvmlInit_v2",
        "nvmlInitWithFlags",
        "nvmlShutdown",
        "nvmlErrorString",
        "nvmlSystemGetDriverVersion",
        "nvmlSystemGetNVMLVersion",
        "nvmlSystemGetCudaDriverVersion_v2",
        "nvmlDeviceGetCount_v2",
        "nvmlDeviceGetHandleByIndex_v2",
        "nvmlDeviceGetHandleByUUID",
        "nvmlDeviceGetHandleBySerial",
        "nvmlDeviceGetHandleByPciBusId_v2",
        "nvmlDeviceGetName",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetSerial",
        "nvmlDeviceGetIndex",
        "nvmlDeviceGetMinorNumber",
        "nvmlDeviceGetPciInfo_v3",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetMemoryInfo_v2",
        "nvmlDeviceGetBAR1MemoryInfo",
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetProcessUtilization",
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetEnforcedPowerLimit",
        "nvmlDeviceGetPowerManagementLimit",
        "nvmlDeviceGetFanSpeed",
        "nvmlDeviceGetPerformanceState",
        "nvmlDeviceGetPersistenceMode",
        "nvmlDeviceGetComputeMode",
        "nvmlDeviceGetDisplayMode",
        "nvmlDeviceGetDisplayActive",
        "nvmlDeviceGetEccMode",
        "nvmlDeviceGetCudaComputeCapability",
        "nvmlDeviceGetArchitecture",
        "nvmlDeviceGetClockInfo",
        "nvmlDeviceGetMaxClockInfo",
        "nvmlDeviceGetMigMode",
        "nvmlDeviceGetBrand",
        "nvmlDeviceGetCurrPcieLinkGeneration",
        "nvmlDeviceGetCurrPcieLinkWidth",
    ] {
        assert!(exported.contains(name), "{name} is not exported");
    }
}
