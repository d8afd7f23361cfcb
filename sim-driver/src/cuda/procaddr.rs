//! `cuGetProcAddress` rules: which exported entry point a (base name, CUDA version,
//! flags) request gets. A base name maps to the newest variant introduced at or before
//! the requested version (`cuMemAlloc` -> `cuMemAlloc_v2` from 3020), and with
//! CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM to its `_ptds`/`_ptsz` variant when
//! one exists (nothing when the version predates that variant). The versions are those of CUDA's `cudaTypedefs.h`
//! (`PFN_<name>_v<version>`).

use std::collections::HashMap;
use std::sync::OnceLock;

use super::api;

/// `base  version:exported ...  [| version:per-thread-exported ...]`.
const RULES: &str = "
cuInit 2000:cuInit
cuDriverGetVersion 2020:cuDriverGetVersion
cuDeviceGet 2000:cuDeviceGet
cuDeviceGetCount 2000:cuDeviceGetCount
cuDeviceGetName 2000:cuDeviceGetName
cuDeviceGetUuid 9020:cuDeviceGetUuid 11040:cuDeviceGetUuid_v2
cuDeviceGetLuid 10000:cuDeviceGetLuid
cuDeviceTotalMem 2000:cuDeviceTotalMem 3020:cuDeviceTotalMem_v2
cuDeviceGetAttribute 2000:cuDeviceGetAttribute
cuDeviceComputeCapability 2000:cuDeviceComputeCapability
cuDeviceGetProperties 2000:cuDeviceGetProperties
cuDeviceGetPCIBusId 4010:cuDeviceGetPCIBusId
cuDeviceGetByPCIBusId 4010:cuDeviceGetByPCIBusId
cuDeviceGetDefaultMemPool 11020:cuDeviceGetDefaultMemPool
cuDeviceGetMemPool 11020:cuDeviceGetMemPool
cuDeviceSetMemPool 11020:cuDeviceSetMemPool
cuDevicePrimaryCtxRetain 7000:cuDevicePrimaryCtxRetain
cuDevicePrimaryCtxRelease 7000:cuDevicePrimaryCtxRelease 11000:cuDevicePrimaryCtxRelease_v2
cuDevicePrimaryCtxReset 7000:cuDevicePrimaryCtxReset 11000:cuDevicePrimaryCtxReset_v2
cuDevicePrimaryCtxSetFlags 7000:cuDevicePrimaryCtxSetFlags 11000:cuDevicePrimaryCtxSetFlags_v2
cuDevicePrimaryCtxGetState 7000:cuDevicePrimaryCtxGetState
cuCtxCreate 2000:cuCtxCreate 3020:cuCtxCreate_v2 11040:cuCtxCreate_v3 12050:cuCtxCreate_v4
cuCtxDestroy 2000:cuCtxDestroy 4000:cuCtxDestroy_v2
cuCtxPushCurrent 2000:cuCtxPushCurrent 4000:cuCtxPushCurrent_v2
cuCtxPopCurrent 2000:cuCtxPopCurrent 4000:cuCtxPopCurrent_v2
cuCtxSetCurrent 4000:cuCtxSetCurrent
cuCtxGetCurrent 4000:cuCtxGetCurrent
cuCtxGetDevice 2000:cuCtxGetDevice 13000:cuCtxGetDevice_v2
cuCtxGetFlags 7000:cuCtxGetFlags
cuCtxSynchronize 2000:cuCtxSynchronize 13000:cuCtxSynchronize_v2
cuCtxGetApiVersion 3020:cuCtxGetApiVersion
cuCtxGetStreamPriorityRange 5050:cuCtxGetStreamPriorityRange
cuCtxSetLimit 3010:cuCtxSetLimit
cuCtxGetLimit 3010:cuCtxGetLimit
cuMemGetInfo 2000:cuMemGetInfo 3020:cuMemGetInfo_v2
cuMemAlloc 2000:cuMemAlloc 3020:cuMemAlloc_v2
cuMemAllocPitch 2000:cuMemAllocPitch 3020:cuMemAllocPitch_v2
cuMemFree 2000:cuMemFree 3020:cuMemFree_v2
cuMemGetAddressRange 2000:cuMemGetAddressRange 3020:cuMemGetAddressRange_v2
cuMemAllocManaged 6000:cuMemAllocManaged
cuPointerGetAttribute 4000:cuPointerGetAttribute
cuMemcpyHtoD 2000:cuMemcpyHtoD 3020:cuMemcpyHtoD_v2 | 7000:cuMemcpyHtoD_v2_ptds
cuMemcpyDtoH 2000:cuMemcpyDtoH 3020:cuMemcpyDtoH_v2 | 7000:cuMemcpyDtoH_v2_ptds
cuMemcpyDtoD 2000:cuMemcpyDtoD 3020:cuMemcpyDtoD_v2 | 7000:cuMemcpyDtoD_v2_ptds
cuMemcpyHtoDAsync 3020:cuMemcpyHtoDAsync_v2 | 7000:cuMemcpyHtoDAsync_v2_ptsz
cuMemcpyDtoHAsync 3020:cuMemcpyDtoHAsync_v2 | 7000:cuMemcpyDtoHAsync_v2_ptsz
cuMemcpyDtoDAsync 3020:cuMemcpyDtoDAsync_v2 | 7000:cuMemcpyDtoDAsync_v2_ptsz
cuMemsetD8 2000:cuMemsetD8 3020:cuMemsetD8_v2 | 7000:cuMemsetD8_v2_ptds
cuMemsetD32 2000:cuMemsetD32 3020:cuMemsetD32_v2 | 7000:cuMemsetD32_v2_ptds
cuMemsetD8Async 3020:cuMemsetD8Async | 7000:cuMemsetD8Async_ptsz
cuMemsetD32Async 3020:cuMemsetD32Async | 7000:cuMemsetD32Async_ptsz
cuArrayCreate 2000:cuArrayCreate 3020:cuArrayCreate_v2
cuArrayGetDescriptor 3020:cuArrayGetDescriptor_v2
cuArray3DCreate 2000:cuArray3DCreate 3020:cuArray3DCreate_v2
cuArray3DGetDescriptor 3020:cuArray3DGetDescriptor_v2
cuArrayDestroy 2000:cuArrayDestroy
cuMipmappedArrayCreate 5000:cuMipmappedArrayCreate
cuMipmappedArrayDestroy 5000:cuMipmappedArrayDestroy
cuMemAddressReserve 10020:cuMemAddressReserve
cuMemAddressFree 10020:cuMemAddressFree
cuMemCreate 10020:cuMemCreate
cuMemRelease 10020:cuMemRelease
cuMemMap 10020:cuMemMap
cuMemUnmap 10020:cuMemUnmap
cuMemSetAccess 10020:cuMemSetAccess
cuMemGetAllocationGranularity 10020:cuMemGetAllocationGranularity
cuMemGetAllocationPropertiesFromHandle 10020:cuMemGetAllocationPropertiesFromHandle
cuMemRetainAllocationHandle 11000:cuMemRetainAllocationHandle
cuMemAllocAsync 11020:cuMemAllocAsync | 11020:cuMemAllocAsync_ptsz
cuMemAllocFromPoolAsync 11020:cuMemAllocFromPoolAsync | 11020:cuMemAllocFromPoolAsync_ptsz
cuMemFreeAsync 11020:cuMemFreeAsync | 11020:cuMemFreeAsync_ptsz
cuMemPoolTrimTo 11020:cuMemPoolTrimTo
cuMemPoolSetAttribute 11020:cuMemPoolSetAttribute
cuMemPoolGetAttribute 11020:cuMemPoolGetAttribute
cuMemPoolCreate 11020:cuMemPoolCreate
cuMemPoolDestroy 11020:cuMemPoolDestroy
cuStreamCreate 2000:cuStreamCreate
cuStreamCreateWithPriority 5050:cuStreamCreateWithPriority
cuStreamGetPriority 5050:cuStreamGetPriority
cuStreamGetFlags 5050:cuStreamGetFlags
cuStreamWaitEvent 3020:cuStreamWaitEvent | 7000:cuStreamWaitEvent_ptsz
cuStreamQuery 2000:cuStreamQuery | 7000:cuStreamQuery_ptsz
cuStreamSynchronize 2000:cuStreamSynchronize | 7000:cuStreamSynchronize_ptsz
cuStreamDestroy 2000:cuStreamDestroy 4000:cuStreamDestroy_v2
cuEventCreate 2000:cuEventCreate
cuEventRecord 2000:cuEventRecord | 7000:cuEventRecord_ptsz
cuEventRecordWithFlags 11010:cuEventRecordWithFlags | 11010:cuEventRecordWithFlags_ptsz
cuEventQuery 2000:cuEventQuery
cuEventSynchronize 2000:cuEventSynchronize
cuEventDestroy 2000:cuEventDestroy 4000:cuEventDestroy_v2
cuEventElapsedTime 2000:cuEventElapsedTime 12080:cuEventElapsedTime_v2
cuModuleLoad 2000:cuModuleLoad
cuModuleLoadData 2000:cuModuleLoadData
cuModuleLoadDataEx 2010:cuModuleLoadDataEx
cuModuleLoadFatBinary 2000:cuModuleLoadFatBinary
cuModuleUnload 2000:cuModuleUnload
cuModuleGetFunction 2000:cuModuleGetFunction
cuLibraryLoadData 12000:cuLibraryLoadData
cuLibraryLoadFromFile 12000:cuLibraryLoadFromFile
cuLibraryUnload 12000:cuLibraryUnload
cuLibraryGetKernel 12000:cuLibraryGetKernel
cuKernelGetFunction 12000:cuKernelGetFunction
cuKernelGetAttribute 12000:cuKernelGetAttribute
cuFuncGetAttribute 2020:cuFuncGetAttribute
cuFuncSetAttribute 9000:cuFuncSetAttribute
cuFuncGetName 12030:cuFuncGetName
cuKernelGetName 12030:cuKernelGetName
cuLaunchKernel 4000:cuLaunchKernel | 7000:cuLaunchKernel_ptsz
cuLaunchKernelEx 11060:cuLaunchKernelEx | 11060:cuLaunchKernelEx_ptsz
cuLaunchCooperativeKernel 9000:cuLaunchCooperativeKernel | 9000:cuLaunchCooperativeKernel_ptsz
cuGetErrorString 6000:cuGetErrorString
cuGetErrorName 6000:cuGetErrorName
cuGetExportTable 3000:cuGetExportTable
cuGetProcAddress 11030:cuGetProcAddress 12000:cuGetProcAddress_v2
cuStreamBeginCapture 10000:cuStreamBeginCapture 10010:cuStreamBeginCapture_v2 | 10000:cuStreamBeginCapture_ptsz 10010:cuStreamBeginCapture_v2_ptsz
cuStreamEndCapture 10000:cuStreamEndCapture | 10000:cuStreamEndCapture_ptsz
cuStreamIsCapturing 10000:cuStreamIsCapturing | 10000:cuStreamIsCapturing_ptsz
cuThreadExchangeStreamCaptureMode 10010:cuThreadExchangeStreamCaptureMode
cuGraphInstantiate 10000:cuGraphInstantiate 11000:cuGraphInstantiate_v2
cuGraphInstantiateWithFlags 11040:cuGraphInstantiateWithFlags
cuGraphLaunch 10000:cuGraphLaunch | 10000:cuGraphLaunch_ptsz
cuGraphDestroy 10000:cuGraphDestroy
cuGraphExecDestroy 10000:cuGraphExecDestroy
";

macro_rules! exports {
    ($($name:ident),* $(,)?) => {
        /// Every entry point this library exports, by name.
        pub fn exported() -> &'static HashMap<&'static str, usize> {
            static TABLE: OnceLock<HashMap<&'static str, usize>> = OnceLock::new();
            TABLE.get_or_init(|| [$((stringify!($name), api::$name as *const () as usize)),*].into_iter().collect())
        }
    };
}

exports!(
    cuInit,
    cuDriverGetVersion,
    cuDeviceGet,
    cuDeviceGetCount,
    cuDeviceGetName,
    cuDeviceGetUuid,
    cuDeviceGetUuid_v2,
    cuDeviceGetLuid,
    cuDeviceTotalMem,
    cuDeviceTotalMem_v2,
    cuDeviceGetAttribute,
    cuDeviceComputeCapability,
    cuDeviceGetProperties,
    cuDeviceGetPCIBusId,
    cuDeviceGetByPCIBusId,
    cuDeviceGetDefaultMemPool,
    cuDeviceGetMemPool,
    cuDeviceSetMemPool,
    cuDevicePrimaryCtxRetain,
    cuDevicePrimaryCtxRelease,
    cuDevicePrimaryCtxRelease_v2,
    cuDevicePrimaryCtxReset,
    cuDevicePrimaryCtxReset_v2,
    cuDevicePrimaryCtxSetFlags,
    cuDevicePrimaryCtxSetFlags_v2,
    cuDevicePrimaryCtxGetState,
    cuCtxCreate,
    cuCtxCreate_v2,
    cuCtxCreate_v3,
    cuCtxCreate_v4,
    cuCtxDestroy,
    cuCtxDestroy_v2,
    cuCtxPushCurrent,
    cuCtxPushCurrent_v2,
    cuCtxPopCurrent,
    cuCtxPopCurrent_v2,
    cuCtxSetCurrent,
    cuCtxGetCurrent,
    cuCtxGetDevice,
    cuCtxGetDevice_v2,
    cuCtxGetFlags,
    cuCtxSynchronize,
    cuCtxSetLimit,
    cuCtxGetLimit,
    cuCtxSynchronize_v2,
    cuCtxGetApiVersion,
    cuCtxGetStreamPriorityRange,
    cuMemGetInfo,
    cuMemGetInfo_v2,
    cuMemAlloc,
    cuMemAlloc_v2,
    cuMemAllocPitch,
    cuMemAllocPitch_v2,
    cuMemFree,
    cuMemFree_v2,
    cuMemGetAddressRange,
    cuMemGetAddressRange_v2,
    cuMemAllocManaged,
    cuPointerGetAttribute,
    cuMemcpyHtoD,
    cuMemcpyHtoD_v2,
    cuMemcpyHtoD_v2_ptds,
    cuMemcpyDtoH,
    cuMemcpyDtoH_v2,
    cuMemcpyDtoH_v2_ptds,
    cuMemcpyDtoD,
    cuMemcpyDtoD_v2,
    cuMemcpyDtoD_v2_ptds,
    cuMemcpyHtoDAsync_v2,
    cuMemcpyHtoDAsync_v2_ptsz,
    cuMemcpyDtoHAsync_v2,
    cuMemcpyDtoHAsync_v2_ptsz,
    cuMemcpyDtoDAsync_v2,
    cuMemcpyDtoDAsync_v2_ptsz,
    cuMemsetD8,
    cuMemsetD8_v2,
    cuMemsetD8_v2_ptds,
    cuMemsetD32,
    cuMemsetD32_v2,
    cuMemsetD32_v2_ptds,
    cuMemsetD8Async,
    cuMemsetD8Async_ptsz,
    cuMemsetD32Async,
    cuMemsetD32Async_ptsz,
    cuArrayCreate,
    cuArrayCreate_v2,
    cuArrayGetDescriptor_v2,
    cuArray3DCreate,
    cuArray3DCreate_v2,
    cuArray3DGetDescriptor_v2,
    cuArrayDestroy,
    cuMipmappedArrayCreate,
    cuMipmappedArrayDestroy,
    cuMemAddressReserve,
    cuMemAddressFree,
    cuMemCreate,
    cuMemRelease,
    cuMemMap,
    cuMemUnmap,
    cuMemSetAccess,
    cuMemGetAllocationGranularity,
    cuMemGetAllocationPropertiesFromHandle,
    cuMemRetainAllocationHandle,
    cuMemAllocAsync,
    cuMemAllocAsync_ptsz,
    cuMemAllocFromPoolAsync,
    cuMemAllocFromPoolAsync_ptsz,
    cuMemFreeAsync,
    cuMemFreeAsync_ptsz,
    cuMemPoolTrimTo,
    cuMemPoolSetAttribute,
    cuMemPoolGetAttribute,
    cuMemPoolCreate,
    cuMemPoolDestroy,
    cuStreamCreate,
    cuStreamCreateWithPriority,
    cuStreamGetPriority,
    cuStreamGetFlags,
    cuStreamWaitEvent,
    cuStreamWaitEvent_ptsz,
    cuStreamQuery,
    cuStreamQuery_ptsz,
    cuStreamSynchronize,
    cuStreamSynchronize_ptsz,
    cuStreamDestroy,
    cuStreamDestroy_v2,
    cuEventCreate,
    cuEventRecord,
    cuEventRecord_ptsz,
    cuEventRecordWithFlags,
    cuEventRecordWithFlags_ptsz,
    cuEventQuery,
    cuEventSynchronize,
    cuEventDestroy,
    cuEventDestroy_v2,
    cuEventElapsedTime,
    cuEventElapsedTime_v2,
    cuModuleLoad,
    cuModuleLoadData,
    cuModuleLoadDataEx,
    cuModuleLoadFatBinary,
    cuModuleUnload,
    cuModuleGetFunction,
    cuLibraryLoadData,
    cuLibraryLoadFromFile,
    cuLibraryUnload,
    cuLibraryGetKernel,
    cuKernelGetFunction,
    cuFuncGetAttribute,
    cuKernelGetAttribute,
    cuFuncSetAttribute,
    cuFuncGetName,
    cuKernelGetName,
    cuLaunchKernel,
    cuLaunchKernel_ptsz,
    cuStreamBeginCapture,
    cuStreamBeginCapture_ptsz,
    cuStreamBeginCapture_v2,
    cuStreamBeginCapture_v2_ptsz,
    cuStreamEndCapture,
    cuStreamEndCapture_ptsz,
    cuStreamIsCapturing,
    cuStreamIsCapturing_ptsz,
    cuThreadExchangeStreamCaptureMode,
    cuGraphInstantiate,
    cuGraphInstantiate_v2,
    cuGraphInstantiateWithFlags,
    cuGraphLaunch,
    cuGraphLaunch_ptsz,
    cuGraphDestroy,
    cuGraphExecDestroy,
    cuLaunchKernelEx,
    cuLaunchKernelEx_ptsz,
    cuLaunchCooperativeKernel,
    cuLaunchCooperativeKernel_ptsz,
    cuGetErrorString,
    cuGetErrorName,
    cuGetExportTable,
    cuGetProcAddress,
    cuGetProcAddress_v2,
);

/// One base name's variants.
pub struct Rule {
    /// (introduced in, exported name), oldest first.
    pub variants: Vec<(i32, &'static str)>,
    /// (introduced in, per-thread-default-stream exported name), oldest first.
    pub per_thread: Vec<(i32, &'static str)>,
}

/// The parsed rule table, by base name.
pub fn rules() -> &'static HashMap<&'static str, Rule> {
    static TABLE: OnceLock<HashMap<&'static str, Rule>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let parse = |item: &'static str| -> Option<(i32, &'static str)> {
            let (version, name) = item.split_once(':')?;
            Some((version.parse().ok()?, name))
        };
        RULES
            .lines()
            .filter(|line| !line.trim().is_empty())
            .filter_map(|line| {
                let (main, per_thread) = match line.split_once('|') {
                    Some((main, per_thread)) => (main, Some(per_thread.trim())),
                    None => (line, None),
                };
                let mut words = main.split_whitespace();
                let base = words.next()?;
                let variants = words.filter_map(parse).collect();
                Some((
                    base,
                    Rule {
                        variants,
                        per_thread: per_thread
                            .map(|items| items.split_whitespace().filter_map(parse).collect())
                            .unwrap_or_default(),
                    },
                ))
            })
            .collect()
    })
}

/// What a lookup found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    Found(usize),
    VersionTooLow,
    NotFound,
}

/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.
pub const PER_THREAD_DEFAULT_STREAM: u64 = 2;

/// Resolves `symbol` for `version` and `flags`.
pub fn resolve(symbol: &str, version: i32, flags: u64) -> Lookup {
    let Some(rule) = rules().get(symbol) else {
        return Lookup::NotFound;
    };
    let Some(&(_, mut chosen)) = rule
        .variants
        .iter()
        .rev()
        .find(|(since, _)| *since <= version)
    else {
        return Lookup::VersionTooLow;
    };
    // With the per-thread flag, a name that has a per-thread variant gets it, and a
    // version older than that variant gets nothing (as the 580 driver answers).
    if flags & PER_THREAD_DEFAULT_STREAM != 0 && !rule.per_thread.is_empty() {
        match rule
            .per_thread
            .iter()
            .rev()
            .find(|(since, _)| *since <= version)
        {
            Some(&(_, name)) => chosen = name,
            None => return Lookup::VersionTooLow,
        }
    }
    exported()
        .get(chosen)
        .map_or(Lookup::NotFound, |address| Lookup::Found(*address))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name_of(lookup: Lookup) -> Option<&'static str> {
        match lookup {
            Lookup::Found(address) => exported()
                .iter()
                .find(|(_, a)| **a == address)
                .map(|(n, _)| *n),
            _ => None,
        }
    }

    #[test]
    fn every_rule_names_exported_functions() {
        for (base, rule) in rules() {
            for (_, name) in rule.variants.iter().chain(rule.per_thread.iter()) {
                assert!(
                    exported().contains_key(name),
                    "{base}: {name} is not exported"
                );
            }
        }
    }

    #[test]
    fn versions_pick_the_right_variant() {
        assert_eq!(name_of(resolve("cuMemAlloc", 2000, 0)), Some("cuMemAlloc"));
        assert_eq!(
            name_of(resolve("cuMemAlloc", 3020, 0)),
            Some("cuMemAlloc_v2")
        );
        assert_eq!(
            name_of(resolve("cuCtxCreate", 11040, 0)),
            Some("cuCtxCreate_v3")
        );
        assert_eq!(
            name_of(resolve("cuCtxCreate", 13000, 0)),
            Some("cuCtxCreate_v4")
        );
        assert_eq!(
            name_of(resolve("cuGetProcAddress", 12000, 0)),
            Some("cuGetProcAddress_v2")
        );
        assert_eq!(
            name_of(resolve("cuLaunchKernel", 13000, 2)),
            Some("cuLaunchKernel_ptsz")
        );
        assert_eq!(
            name_of(resolve("cuLaunchKernel", 13000, 1)),
            Some("cuLaunchKernel")
        );
        assert_eq!(
            resolve("cuMemAlloc_v2", 13000, 0),
            Lookup::NotFound,
            "base names only"
        );
        assert_eq!(
            name_of(resolve("cuMemAlloc", 13000, 2)),
            Some("cuMemAlloc_v2"),
            "no per-thread variant: the plain one"
        );
        assert_eq!(
            resolve("cuMemcpyHtoD", 6000, 2),
            Lookup::VersionTooLow,
            "ptds only from 7000"
        );
        assert_eq!(resolve("cuMemAllocAsync", 11000, 0), Lookup::VersionTooLow);
        assert_eq!(resolve("cuNoSuchThing", 13000, 0), Lookup::NotFound);
    }
}
