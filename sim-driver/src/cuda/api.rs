//! The exported CUDA driver entry points (names and C signatures as in CUDA 13 `cuda.h`;
//! the unsuffixed legacy names keep their original 32-bit `CUdeviceptr_v1` / `unsigned
//! int` sizes). Opaque handles (`CUcontext`, `CUstream`, ...) are pointer-sized integers
//! here, which is the same C ABI on x86-64 and aarch64.
//!
//! Every body runs under `ffi::guard`, so a panic becomes CUDA_ERROR_UNKNOWN.

#![allow(non_snake_case, clippy::too_many_arguments, clippy::missing_safety_doc)]

use std::collections::{HashMap, HashSet};
use std::ffi::{c_char, c_void};
use std::sync::OnceLock;

use super::errors::*;
use super::registry::*;
use super::{current_context, with_registry, with_stack};
use crate::clock::{duration_from_name, now_ns, sleep_until};
use crate::config::{GpuSpec, canonical_pci_bus_id};
use crate::ffi::{self, c_str, copy_c_string_truncated, read_at, read_in, write_out};

type Res = Result<(), CUresult>;

fn finish(result: Res) -> CUresult {
    match result {
        Ok(()) => CUDA_SUCCESS,
        Err(code) => code,
    }
}

macro_rules! cuda {
    ($( $(#[$meta:meta])* fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) $body:block )*) => {
        $(
            $(#[$meta])*
            #[unsafe(no_mangle)]
            pub extern "C" fn $name($($arg: $ty),*) -> CUresult {
                fn body($($arg: $ty),*) -> Res { $body }
                ffi::guard(CUDA_ERROR_UNKNOWN, || finish(body($($arg),*)))
            }
        )*
    };
}

/// The spec of device ordinal `dev` (INVALID_DEVICE when out of range; NOT_INITIALIZED before cuInit).
fn device(dev: i32) -> Result<(usize, &'static GpuSpec), CUresult> {
    with_registry(|registry| {
        let sim = registry.sim;
        usize::try_from(dev)
            .ok()
            .and_then(|index| sim.config.gpus.get(index).map(|spec| (index, spec)))
            .ok_or(CUDA_ERROR_INVALID_DEVICE)
    })
}

fn out<T>(ptr: *mut T, value: T) -> Res {
    if write_out(ptr, value) {
        Ok(())
    } else {
        Err(CUDA_ERROR_INVALID_VALUE)
    }
}

fn require_current() -> Result<u64, CUresult> {
    let ctx = current_context().ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
    with_registry(|registry| registry.context(ctx).map(|_| ctx))
}

// ---------------------------------------------------------------------------------------
// Initialisation, version, devices
// ---------------------------------------------------------------------------------------

/// `cuDeviceGetAttribute` for the simulated card: the values a real H200 reports with
/// driver 580.159.04 (measured with tools/probe_real_driver.py), with the SM count, PCI
/// location and compute capability taken from the sim config.
pub fn device_attribute(spec: &GpuSpec, attribute: i32, cc: (i32, i32)) -> Option<i32> {
    let value = match attribute {
        1 => 1024,
        2 => 1024,
        3 => 1024,
        4 => 64,
        5 => 2147483647,
        6 => 65535,
        7 => 65535,
        8 => 49152,
        9 => 65536,
        10 => 32,
        11 => 2147483647,
        12 => 65536,
        13 => 1980000,
        14 => 512,
        15 => 1,
        16 => spec.sms as i32,
        17 => 0,
        18 => 0,
        19 => 1,
        20 => 0,
        21 => 131072,
        22 => 131072,
        23 => 65536,
        24 => 16384,
        25 => 16384,
        26 => 16384,
        27 => 32768,
        28 => 32768,
        29 => 2048,
        30 => 512,
        31 => 1,
        32 => 1,
        33 => spec.pci_bus as i32,
        34 => spec.pci_device as i32,
        35 => 0,
        36 => 3201000,
        37 => 6016,
        38 => 62914560,
        39 => 2048,
        40 => 3,
        41 => 1,
        42 => 32768,
        43 => 2048,
        44 => 1,
        45 => 32768,
        46 => 32768,
        47 => 8192,
        48 => 8192,
        49 => 32768,
        50 => spec.pci_domain as i32,
        51 => 32,
        52 => 32768,
        53 => 32768,
        54 => 2046,
        55 => 32768,
        56 => 131072,
        57 => 65536,
        58 => 16384,
        59 => 16384,
        60 => 16384,
        61 => 32768,
        62 => 2048,
        63 => 32768,
        64 => 32768,
        65 => 2048,
        66 => 32768,
        67 => 32768,
        68 => 2046,
        69 => 268435456,
        70 => 131072,
        71 => 65000,
        72 => 2097120,
        73 => 32768,
        74 => 32768,
        75 => cc.0,
        76 => cc.1,
        77 => 32768,
        78 => 1,
        79 => 1,
        80 => 1,
        81 => 233472,
        82 => 65536,
        83 => 1,
        84 => 0,
        85 => 0,
        86 => 0,
        87 => 2,
        88 => 0,
        89 => 1,
        90 => 1,
        91 => 1,
        92 => 0,
        93 => 0,
        94 => 0,
        95 => 1,
        96 => 1,
        97 => 232448,
        98 => 0,
        99 => 1,
        100 => 0,
        101 => 0,
        102 => 1,
        103 => 1,
        104 => 0,
        105 => 0,
        106 => 32,
        107 => 1,
        108 => 39321600,
        109 => 134217728,
        110 => 1,
        111 => 1024,
        112 => 1,
        113 => 1,
        114 => 1,
        115 => 1,
        116 => 1,
        117 => 1,
        118 => 100,
        119 => 9,
        120 => 1,
        121 => 1,
        122 => 1,
        123 => 1,
        124 => 1,
        125 => 1,
        126 => 4,
        127 => 1,
        128 => 1,
        129 => 1,
        130 => 0,
        131 => -1,
        132 => 0,
        133 => 0,
        134 => 0,
        135 => 0,
        136 => 0,
        137 => 0,
        138 => 0,
        139 => 590680286,
        140 => 415174878,
        141 => 1,
        142 => 1,
        143 => 0,
        144 => 1,
        145 => 1,
        146 => 0,
        147 => 0,
        _ => return None,
    };
    Some(value)
}

/// H100/H200-class compute capability.
pub const COMPUTE_CAPABILITY: (i32, i32) = (9, 0);

#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUdevprop {
    pub max_threads_per_block: i32,
    pub max_threads_dim: [i32; 3],
    pub max_grid_size: [i32; 3],
    pub shared_mem_per_block: i32,
    pub total_constant_memory: i32,
    pub simd_width: i32,
    pub mem_pitch: i32,
    pub regs_per_block: i32,
    pub clock_rate: i32,
    pub texture_align: i32,
}
const _: () = assert!(std::mem::size_of::<CUdevprop>() == 56);

/// The `CUresult` names and strings as NUL-terminated statics.
fn error_strings() -> &'static HashMap<CUresult, (std::ffi::CString, std::ffi::CString)> {
    static TABLE: OnceLock<HashMap<CUresult, (std::ffi::CString, std::ffi::CString)>> =
        OnceLock::new();
    TABLE.get_or_init(|| {
        ERRORS
            .iter()
            .filter_map(|(code, name, text)| {
                Some((
                    *code,
                    (
                        std::ffi::CString::new(*name).ok()?,
                        std::ffi::CString::new(*text).ok()?,
                    ),
                ))
            })
            .collect()
    })
}

cuda! {
    fn cuInit(flags: u32) {
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        super::initialize()
    }

    fn cuDriverGetVersion(version: *mut i32) {
        // Works before cuInit, as on a real driver.
        let sim = crate::sim().ok_or(CUDA_ERROR_NOT_INITIALIZED)?;
        out(version, sim.config.cuda_version)
    }

    fn cuDeviceGetCount(count: *mut i32) {
        let n = with_registry(|registry| Ok(registry.device_count() as i32))?;
        out(count, n)
    }

    fn cuDeviceGet(device_out: *mut i32, ordinal: i32) {
        device(ordinal)?;
        out(device_out, ordinal)
    }

    fn cuDeviceGetName(name: *mut c_char, len: i32, dev: i32) {
        let (_, spec) = device(dev)?;
        let len = usize::try_from(len).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        if copy_c_string_truncated(name, len, &spec.name) { Ok(()) } else { Err(CUDA_ERROR_INVALID_VALUE) }
    }

    fn cuDeviceGetUuid(uuid: *mut [u8; 16], dev: i32) {
        let (_, spec) = device(dev)?;
        out(uuid, spec.uuid_bytes)
    }

    fn cuDeviceGetUuid_v2(uuid: *mut [u8; 16], dev: i32) {
        let (_, spec) = device(dev)?;
        out(uuid, spec.uuid_bytes)
    }

    fn cuDeviceGetLuid(luid: *mut c_char, mask: *mut u32, dev: i32) {
        device(dev)?;
        let _ = (luid, mask);
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }

    fn cuDeviceTotalMem(bytes: *mut u32, dev: i32) {
        let (_, spec) = device(dev)?;
        out(bytes, spec.memory.min(u32::MAX as u64) as u32)
    }

    fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: i32) {
        let (_, spec) = device(dev)?;
        out(bytes, spec.memory as usize)
    }

    fn cuDeviceGetAttribute(value: *mut i32, attribute: i32, dev: i32) {
        let (_, spec) = device(dev)?;
        let found = device_attribute(spec, attribute, COMPUTE_CAPABILITY).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        out(value, found)
    }

    fn cuDeviceComputeCapability(major: *mut i32, minor: *mut i32, dev: i32) {
        device(dev)?;
        out(major, COMPUTE_CAPABILITY.0)?;
        out(minor, COMPUTE_CAPABILITY.1)
    }

    fn cuDeviceGetProperties(prop: *mut CUdevprop, dev: i32) {
        let (_, spec) = device(dev)?;
        out(prop, CUdevprop {
            max_threads_per_block: 1024,
            max_threads_dim: [1024, 1024, 64],
            max_grid_size: [i32::MAX, 65535, 65535],
            shared_mem_per_block: 49152,
            total_constant_memory: 65536,
            simd_width: 32,
            mem_pitch: i32::MAX,
            regs_per_block: 65536,
            clock_rate: device_attribute(spec, 13, COMPUTE_CAPABILITY).unwrap_or(0),
            texture_align: 512,
        })
    }

    fn cuDeviceGetPCIBusId(bus_id: *mut c_char, len: i32, dev: i32) {
        let (_, spec) = device(dev)?;
        let len = usize::try_from(len).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        // The driver writes the 13-character DDDD:BB:DD.F form.
        let text = format!("{:04X}:{:02X}:{:02X}.0", spec.pci_domain, spec.pci_bus, spec.pci_device);
        if copy_c_string_truncated(bus_id, len, &text) { Ok(()) } else { Err(CUDA_ERROR_INVALID_VALUE) }
    }

    fn cuDeviceGetByPCIBusId(dev: *mut i32, bus_id: *const c_char) {
        let wanted = c_str(bus_id).and_then(|text| canonical_pci_bus_id(&text)).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let index = with_registry(|registry| {
            registry
                .sim
                .config
                .gpus
                .iter()
                .position(|spec| spec.pci_bus_id.eq_ignore_ascii_case(&wanted))
                .ok_or(CUDA_ERROR_INVALID_DEVICE)
        })?;
        out(dev, index as i32)
    }

    fn cuGetErrorName(error: CUresult, name: *mut *const c_char) {
        match error_strings().get(&error) {
            Some((text, _)) => out(name, text.as_ptr()),
            None => {
                let _ = write_out(name, std::ptr::null());
                Err(CUDA_ERROR_INVALID_VALUE)
            }
        }
    }

    fn cuGetErrorString(error: CUresult, text: *mut *const c_char) {
        match error_strings().get(&error) {
            Some((_, string)) => out(text, string.as_ptr()),
            None => {
                let _ = write_out(text, std::ptr::null());
                Err(CUDA_ERROR_INVALID_VALUE)
            }
        }
    }

    /// The private tables the real libcudart asks for are not simulated: runtime-API
    /// programs (cudaMalloc, <<<>>>) need a real GPU. Driver-API programs work.
    fn cuGetExportTable(table: *mut *const c_void, export_id: *const c_void) {
        let _ = export_id;
        let _ = write_out(table, std::ptr::null());
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
}

// ---------------------------------------------------------------------------------------
// Contexts
// ---------------------------------------------------------------------------------------

const CTX_FLAGS_MASK: u32 = 0xff;

fn create_context(pctx: *mut u64, flags: u32, dev: i32) -> Res {
    if pctx.is_null() || flags & !CTX_FLAGS_MASK != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (index, _) = device(dev)?;
    let ctx = with_registry(|registry| {
        let ctx = registry.handle(TAG_CONTEXT);
        registry
            .contexts
            .insert(ctx, Context::new(index, flags, false));
        if let Err(code) = registry.activate(ctx) {
            registry.contexts.remove(&ctx);
            return Err(code);
        }
        Ok(ctx)
    })?;
    with_stack(|stack| stack.push(ctx));
    out(pctx, ctx)
}

fn destroy_context(ctx: u64) -> Res {
    if ctx == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    with_registry(|registry| {
        match registry.contexts.get(&ctx) {
            Some(context) if !context.primary => {}
            _ => return Err(CUDA_ERROR_INVALID_CONTEXT),
        }
        registry.deactivate(ctx);
        registry.contexts.remove(&ctx);
        Ok(())
    })?;
    with_stack(|stack| stack.retain(|held| *held != ctx));
    Ok(())
}

fn primary_release(dev: i32) -> Res {
    let (index, _) = device(dev)?;
    with_registry(|registry| {
        let primary = &mut registry.primaries[index];
        if primary.refs == 0 {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        primary.refs -= 1;
        if primary.refs == 0 {
            let ctx = primary.ctx;
            registry.deactivate(ctx);
        }
        Ok(())
    })
}

fn primary_reset(dev: i32) -> Res {
    let (index, _) = device(dev)?;
    with_registry(|registry| {
        let primary = &mut registry.primaries[index];
        primary.refs = 0;
        primary.flags = 0;
        let ctx = primary.ctx;
        registry.deactivate(ctx);
        Ok(())
    })
}

fn primary_set_flags(dev: i32, flags: u32, refuse_when_active: bool) -> Res {
    let (index, _) = device(dev)?;
    if flags & !CTX_FLAGS_MASK != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    with_registry(|registry| {
        let primary = &mut registry.primaries[index];
        if refuse_when_active && primary.refs > 0 {
            return Err(CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE);
        }
        primary.flags = flags;
        let ctx = primary.ctx;
        if let Some(context) = registry.contexts.get_mut(&ctx) {
            context.flags = flags;
        }
        Ok(())
    })
}

fn ctx_push(ctx: u64) -> Res {
    with_registry(|registry| registry.context(ctx).map(|_| ()))?;
    with_stack(|stack| stack.push(ctx));
    Ok(())
}

fn ctx_pop(pctx: *mut u64) -> Res {
    let popped = with_stack(|stack| stack.pop()).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
    if !pctx.is_null() {
        out(pctx, popped)?;
    }
    Ok(())
}

/// Sleeps until `ctx` is idle, then lets its device's pools release memory.
fn synchronize_context(ctx: u64) -> Res {
    let deadline = with_registry(|registry| {
        registry.check_unsafe_call(None)?;
        registry.context(ctx).map(|_| registry.ctx_idle_at(ctx))
    })?;
    sleep_until(deadline);
    with_registry(|registry| {
        let device = registry.context(ctx)?.device;
        registry.release_pools_at_sync(device);
        Ok(())
    })
}

cuda! {
    fn cuDevicePrimaryCtxRetain(pctx: *mut u64, dev: i32) {
        if pctx.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (index, _) = device(dev)?;
        let ctx = with_registry(|registry| {
            let (ctx, refs) = (registry.primaries[index].ctx, registry.primaries[index].refs);
            if refs == 0 {
                registry.activate(ctx)?;
                let flags = registry.primaries[index].flags;
                if let Some(context) = registry.contexts.get_mut(&ctx) {
                    context.flags = flags;
                }
            }
            registry.primaries[index].refs += 1;
            Ok(ctx)
        })?;
        out(pctx, ctx)
    }

    fn cuDevicePrimaryCtxRelease(dev: i32) { primary_release(dev) }
    fn cuDevicePrimaryCtxRelease_v2(dev: i32) { primary_release(dev) }
    fn cuDevicePrimaryCtxReset(dev: i32) { primary_reset(dev) }
    fn cuDevicePrimaryCtxReset_v2(dev: i32) { primary_reset(dev) }
    fn cuDevicePrimaryCtxSetFlags(dev: i32, flags: u32) { primary_set_flags(dev, flags, true) }
    fn cuDevicePrimaryCtxSetFlags_v2(dev: i32, flags: u32) { primary_set_flags(dev, flags, false) }

    fn cuDevicePrimaryCtxGetState(dev: i32, flags: *mut u32, active: *mut i32) {
        let (index, _) = device(dev)?;
        let (f, refs) = with_registry(|registry| Ok((registry.primaries[index].flags, registry.primaries[index].refs)))?;
        out(flags, f)?;
        out(active, i32::from(refs > 0))
    }

    fn cuCtxCreate(pctx: *mut u64, flags: u32, dev: i32) { create_context(pctx, flags, dev) }
    fn cuCtxCreate_v2(pctx: *mut u64, flags: u32, dev: i32) { create_context(pctx, flags, dev) }

    /// Execution-affinity parameters are accepted and not enforced.
    fn cuCtxCreate_v3(pctx: *mut u64, params: *const c_void, num_params: i32, flags: u32, dev: i32) {
        if num_params < 0 || (num_params > 0 && params.is_null()) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        create_context(pctx, flags, dev)
    }

    /// `CUctxCreateParams` (affinity, CIG) is accepted and not enforced.
    fn cuCtxCreate_v4(pctx: *mut u64, params: *const c_void, flags: u32, dev: i32) {
        let _ = params;
        create_context(pctx, flags, dev)
    }

    fn cuCtxDestroy(ctx: u64) { destroy_context(ctx) }
    fn cuCtxDestroy_v2(ctx: u64) { destroy_context(ctx) }

    fn cuCtxGetCurrent(pctx: *mut u64) {
        with_registry(|_| Ok(()))?;
        out(pctx, current_context().unwrap_or(0))
    }

    fn cuCtxSetCurrent(ctx: u64) {
        if ctx != 0 {
            with_registry(|registry| registry.context(ctx).map(|_| ()))?;
        } else {
            with_registry(|_| Ok(()))?;
        }
        with_stack(|stack| {
            stack.pop();
            if ctx != 0 {
                stack.push(ctx);
            }
        });
        Ok(())
    }

    fn cuCtxPushCurrent(ctx: u64) { ctx_push(ctx) }
    fn cuCtxPushCurrent_v2(ctx: u64) { ctx_push(ctx) }
    fn cuCtxPopCurrent(pctx: *mut u64) { ctx_pop(pctx) }
    fn cuCtxPopCurrent_v2(pctx: *mut u64) { ctx_pop(pctx) }

    fn cuCtxGetDevice(dev: *mut i32) {
        let ctx = require_current()?;
        let index = with_registry(|registry| registry.context(ctx).map(|c| c.device))?;
        out(dev, index as i32)
    }

    fn cuCtxGetDevice_v2(dev: *mut i32, ctx: u64) {
        let ctx = if ctx == 0 { require_current()? } else { ctx };
        let index = with_registry(|registry| registry.context(ctx).map(|c| c.device))?;
        out(dev, index as i32)
    }

    fn cuCtxSynchronize() {
        let ctx = require_current()?;
        synchronize_context(ctx)
    }

    fn cuCtxSynchronize_v2(ctx: u64) {
        let ctx = if ctx == 0 { require_current()? } else { ctx };
        synchronize_context(ctx)
    }

    fn cuCtxGetApiVersion(ctx: u64, version: *mut u32) {
        let ctx = if ctx == 0 { require_current()? } else { ctx };
        with_registry(|registry| registry.context(ctx).map(|_| ()))?;
        out(version, 3020)
    }

    fn cuCtxGetFlags(flags: *mut u32) {
        let ctx = require_current()?;
        let f = with_registry(|registry| registry.context(ctx).map(|c| c.flags))?;
        out(flags, f)
    }

    fn cuCtxGetStreamPriorityRange(least: *mut i32, greatest: *mut i32) {
        with_registry(|_| Ok(()))?;
        if !least.is_null() {
            out(least, 0)?;
        }
        if !greatest.is_null() {
            out(greatest, -5)?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// Memory
// ---------------------------------------------------------------------------------------

fn allocate_current(size: u64, kind: AllocKind) -> Result<u64, CUresult> {
    let ctx = require_current()?;
    with_registry(|registry| registry.allocate(ctx, size, kind))
}

fn mem_info() -> Result<(u64, u64), CUresult> {
    let ctx = require_current()?;
    with_registry(|registry| {
        let device = registry.context(ctx)?.device;
        registry.sim.state.reclaim_dead();
        let total = registry.capacity(device);
        Ok((
            total.saturating_sub(registry.sim.state.gpu_used(device)),
            total,
        ))
    })
}

fn address_range(ptr: u64) -> Result<(u64, u64), CUresult> {
    with_registry(|registry| {
        registry
            .find(ptr)
            .map(|(base, a)| (base, a.size))
            .ok_or(CUDA_ERROR_NOT_FOUND)
    })
}

/// A synchronous copy or set: validates the ranges and waits for the default stream.
fn sync_transfer(ranges: &[(u64, u64)], host: &[*const c_void], per_thread: bool) -> Res {
    if host.iter().any(|ptr| ptr.is_null()) && ranges.iter().any(|(_, len)| *len > 0) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let ctx = require_current()?;
    let deadline = with_registry(|registry| {
        for (ptr, len) in ranges {
            if *len > 0 && !registry.covers(*ptr, *len) {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
        }
        let (key, _) = registry.stream_key(0, per_thread, Some(ctx))?;
        Ok(registry.ready_at(key))
    })?;
    sleep_until(deadline);
    Ok(())
}

/// An asynchronous copy or set: validates and orders it on the stream (it takes no simulated time).
fn async_transfer(
    ranges: &[(u64, u64)],
    host: &[*const c_void],
    stream: u64,
    per_thread: bool,
) -> Res {
    if host.iter().any(|ptr| ptr.is_null()) && ranges.iter().any(|(_, len)| *len > 0) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let current = current_context();
    with_registry(|registry| {
        let (key, _) = registry.stream_key(stream, per_thread, current)?;
        for (ptr, len) in ranges {
            if *len > 0 && !registry.covers(*ptr, *len) {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
        }
        registry.enqueue(key, 0);
        Ok(())
    })
}

fn memset_ranges(ptr: u64, count: u64, element: u64) -> Result<[(u64, u64); 1], CUresult> {
    if element > 1 && !ptr.is_multiple_of(element) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok([(
        ptr,
        count.checked_mul(element).ok_or(CUDA_ERROR_INVALID_VALUE)?,
    )])
}

const CU_MEMORYTYPE_DEVICE: u32 = 2;

fn pointer_attribute(data: *mut c_void, attribute: i32, ptr: u64) -> Res {
    if data.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (base, allocation, access) = with_registry(|registry| {
        let (base, allocation) = registry.find(ptr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let access = match allocation.kind {
            AllocKind::Mapped { .. } => 3u32,
            _ => 3,
        };
        Ok((base, allocation, access))
    })?;
    let ctx = match allocation.kind {
        AllocKind::Mapped { .. } | AllocKind::Pool(_) => 0,
        _ => allocation.ctx,
    };
    match attribute {
        1 => out(data.cast::<u64>(), ctx),
        2 => out(data.cast::<u32>(), CU_MEMORYTYPE_DEVICE),
        3 => out(data.cast::<u64>(), ptr),
        4 => Err(CUDA_ERROR_INVALID_VALUE),
        6 => out(data.cast::<u8>(), 0),
        7 => out(data.cast::<u64>(), allocation.buffer_id),
        8 => out(
            data.cast::<u8>(),
            u8::from(allocation.kind == AllocKind::Managed),
        ),
        9 => out(data.cast::<i32>(), allocation.device as i32),
        10 => out(
            data.cast::<u8>(),
            u8::from(matches!(
                allocation.kind,
                AllocKind::Device | AllocKind::Low
            )),
        ),
        11 => out(data.cast::<u64>(), base),
        12 => out(data.cast::<usize>(), allocation.size as usize),
        13 => out(data.cast::<u8>(), 1),
        14 => out(data.cast::<u64>(), 0),
        15 => out(data.cast::<u8>(), 1),
        16 => out(data.cast::<u32>(), access),
        17 => out(
            data.cast::<u64>(),
            match allocation.kind {
                AllocKind::Pool(pool) => pool,
                _ => 0,
            },
        ),
        18 => out(data.cast::<usize>(), allocation.size as usize),
        19 => out(data.cast::<u64>(), base),
        20 => out(data.cast::<u64>(), allocation.buffer_id),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

cuda! {
    fn cuMemAlloc(dptr: *mut u32, bytesize: u32) {
        if dptr.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let ptr = allocate_current(bytesize as u64, AllocKind::Low)?;
        out(dptr, ptr as u32)
    }

    fn cuMemAlloc_v2(dptr: *mut u64, bytesize: usize) {
        if dptr.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let ptr = allocate_current(bytesize as u64, AllocKind::Device)?;
        out(dptr, ptr)
    }

    fn cuMemAllocManaged(dptr: *mut u64, bytesize: usize, flags: u32) {
        // CU_MEM_ATTACH_GLOBAL = 1, CU_MEM_ATTACH_HOST = 2: exactly one.
        if dptr.is_null() || !(flags == 1 || flags == 2) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let ptr = allocate_current(bytesize as u64, AllocKind::Managed)?;
        out(dptr, ptr)
    }

    fn cuMemAllocPitch(dptr: *mut u32, pitch: *mut u32, width: u32, height: u32, element_size: u32) {
        if dptr.is_null() || pitch.is_null() || !matches!(element_size, 4 | 8 | 16) || width == 0 || height == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let row = round_up(width as u64, 512).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let size = row.checked_mul(height as u64).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        let ptr = allocate_current(size, AllocKind::Low)?;
        out(dptr, ptr as u32)?;
        out(pitch, row as u32)
    }

    fn cuMemAllocPitch_v2(dptr: *mut u64, pitch: *mut usize, width: usize, height: usize, element_size: u32) {
        if dptr.is_null() || pitch.is_null() || !matches!(element_size, 4 | 8 | 16) || width == 0 || height == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let row = round_up(width as u64, 512).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let size = row.checked_mul(height as u64).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        let ptr = allocate_current(size, AllocKind::Device)?;
        out(dptr, ptr)?;
        out(pitch, row as usize)
    }

    fn cuMemFree(dptr: u32) {
        if dptr == 0 {
            return Ok(());
        }
        require_current()?;
        with_registry(|registry| registry.free(dptr as u64))
    }

    fn cuMemFree_v2(dptr: u64) {
        if dptr == 0 {
            return Ok(());
        }
        require_current()?;
        with_registry(|registry| registry.free(dptr))
    }

    fn cuMemGetInfo(free: *mut u32, total: *mut u32) {
        let (f, t) = mem_info()?;
        out(free, f.min(u32::MAX as u64) as u32)?;
        out(total, t.min(u32::MAX as u64) as u32)
    }

    fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) {
        let (f, t) = mem_info()?;
        out(free, f as usize)?;
        out(total, t as usize)
    }

    fn cuMemGetAddressRange(base: *mut u32, size: *mut u32, dptr: u32) {
        let (b, s) = address_range(dptr as u64)?;
        if !base.is_null() {
            out(base, b as u32)?;
        }
        if !size.is_null() {
            out(size, s as u32)?;
        }
        Ok(())
    }

    fn cuMemGetAddressRange_v2(base: *mut u64, size: *mut usize, dptr: u64) {
        let (b, s) = address_range(dptr)?;
        if !base.is_null() {
            out(base, b)?;
        }
        if !size.is_null() {
            out(size, s as usize)?;
        }
        Ok(())
    }

    fn cuPointerGetAttribute(data: *mut c_void, attribute: i32, ptr: u64) { pointer_attribute(data, attribute, ptr) }

    fn cuMemcpyHtoD(dst: u32, src: *const c_void, bytes: u32) { sync_transfer(&[(dst as u64, bytes as u64)], &[src], false) }
    fn cuMemcpyHtoD_v2(dst: u64, src: *const c_void, bytes: usize) { sync_transfer(&[(dst, bytes as u64)], &[src], false) }
    fn cuMemcpyHtoD_v2_ptds(dst: u64, src: *const c_void, bytes: usize) { sync_transfer(&[(dst, bytes as u64)], &[src], true) }
    fn cuMemcpyDtoH(dst: *mut c_void, src: u32, bytes: u32) { sync_transfer(&[(src as u64, bytes as u64)], &[dst.cast_const()], false) }
    fn cuMemcpyDtoH_v2(dst: *mut c_void, src: u64, bytes: usize) { sync_transfer(&[(src, bytes as u64)], &[dst.cast_const()], false) }
    fn cuMemcpyDtoH_v2_ptds(dst: *mut c_void, src: u64, bytes: usize) { sync_transfer(&[(src, bytes as u64)], &[dst.cast_const()], true) }
    fn cuMemcpyDtoD(dst: u32, src: u32, bytes: u32) { sync_transfer(&[(dst as u64, bytes as u64), (src as u64, bytes as u64)], &[], false) }
    fn cuMemcpyDtoD_v2(dst: u64, src: u64, bytes: usize) { sync_transfer(&[(dst, bytes as u64), (src, bytes as u64)], &[], false) }
    fn cuMemcpyDtoD_v2_ptds(dst: u64, src: u64, bytes: usize) { sync_transfer(&[(dst, bytes as u64), (src, bytes as u64)], &[], true) }
    fn cuMemcpyHtoDAsync_v2(dst: u64, src: *const c_void, bytes: usize, stream: u64) { async_transfer(&[(dst, bytes as u64)], &[src], stream, false) }
    fn cuMemcpyHtoDAsync_v2_ptsz(dst: u64, src: *const c_void, bytes: usize, stream: u64) { async_transfer(&[(dst, bytes as u64)], &[src], stream, true) }
    fn cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: u64, bytes: usize, stream: u64) { async_transfer(&[(src, bytes as u64)], &[dst.cast_const()], stream, false) }
    fn cuMemcpyDtoHAsync_v2_ptsz(dst: *mut c_void, src: u64, bytes: usize, stream: u64) { async_transfer(&[(src, bytes as u64)], &[dst.cast_const()], stream, true) }
    fn cuMemcpyDtoDAsync_v2(dst: u64, src: u64, bytes: usize, stream: u64) { async_transfer(&[(dst, bytes as u64), (src, bytes as u64)], &[], stream, false) }
    fn cuMemcpyDtoDAsync_v2_ptsz(dst: u64, src: u64, bytes: usize, stream: u64) { async_transfer(&[(dst, bytes as u64), (src, bytes as u64)], &[], stream, true) }
    fn cuMemsetD8(dst: u32, value: u8, count: u32) { let _ = value; sync_transfer(&memset_ranges(dst as u64, count as u64, 1)?, &[], false) }
    fn cuMemsetD8_v2(dst: u64, value: u8, count: usize) { let _ = value; sync_transfer(&memset_ranges(dst, count as u64, 1)?, &[], false) }
    fn cuMemsetD8_v2_ptds(dst: u64, value: u8, count: usize) { let _ = value; sync_transfer(&memset_ranges(dst, count as u64, 1)?, &[], true) }
    fn cuMemsetD32(dst: u32, value: u32, count: u32) { let _ = value; sync_transfer(&memset_ranges(dst as u64, count as u64, 4)?, &[], false) }
    fn cuMemsetD32_v2(dst: u64, value: u32, count: usize) { let _ = value; sync_transfer(&memset_ranges(dst, count as u64, 4)?, &[], false) }
    fn cuMemsetD32_v2_ptds(dst: u64, value: u32, count: usize) { let _ = value; sync_transfer(&memset_ranges(dst, count as u64, 4)?, &[], true) }
    fn cuMemsetD8Async(dst: u64, value: u8, count: usize, stream: u64) { let _ = value; async_transfer(&memset_ranges(dst, count as u64, 1)?, &[], stream, false) }
    fn cuMemsetD8Async_ptsz(dst: u64, value: u8, count: usize, stream: u64) { let _ = value; async_transfer(&memset_ranges(dst, count as u64, 1)?, &[], stream, true) }
    fn cuMemsetD32Async(dst: u64, value: u32, count: usize, stream: u64) { let _ = value; async_transfer(&memset_ranges(dst, count as u64, 4)?, &[], stream, false) }
    fn cuMemsetD32Async_ptsz(dst: u64, value: u32, count: usize, stream: u64) { let _ = value; async_transfer(&memset_ranges(dst, count as u64, 4)?, &[], stream, true) }
}

// ---------------------------------------------------------------------------------------
// Arrays
// ---------------------------------------------------------------------------------------

use vgpu_abi::cuda::{
    ARRAY_CHARGE_GRANULARITY, CudaArray3dDescriptor, CudaArray3dDescriptorV1, CudaArrayDescriptor,
    CudaArrayDescriptorV1, array_bytes,
};

fn create_array(
    handle_out: *mut u64,
    dims: [u64; 3],
    format: u32,
    channels: u32,
    flags: u32,
    levels: u32,
    tag: u64,
) -> Res {
    if handle_out.is_null() || dims[0] == 0 || !matches!(channels, 1..=4) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // The format table and the mip chain of `cuda.h` that the shims use too
    // (`vgpu_abi`), charged in the driver's 2 MiB units.
    let bytes =
        array_bytes(format, channels, dims, flags, levels).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let charged = round_up(bytes, ARRAY_CHARGE_GRANULARITY).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
    let ctx = require_current()?;
    let handle = with_registry(|registry| {
        let device = registry.context(ctx)?.device;
        if charged > registry.capacity(device) {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        registry.charge(device, charged)?;
        let handle = registry.handle(tag);
        let descriptor = [
            dims[0],
            dims[1],
            dims[2],
            format as u64,
            channels as u64,
            flags as u64,
        ];
        registry.arrays.insert(
            handle,
            Array {
                device,
                charged,
                ctx,
                descriptor,
                levels: levels.max(1),
            },
        );
        Ok(handle)
    })?;
    out(handle_out, handle)
}

fn destroy_array(handle: u64, tag: u64) -> Res {
    with_registry(|registry| {
        if tag_of(handle) != tag {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        let array = registry
            .arrays
            .remove(&handle)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        registry.uncharge(array.device, array.charged);
        Ok(())
    })
}

cuda! {
    fn cuArrayCreate(handle: *mut u64, descriptor: *const CudaArrayDescriptorV1) {
        let d = read_in(descriptor).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        create_array(handle, [d.width as u64, d.height as u64, 0], d.format, d.num_channels, 0, 1, TAG_ARRAY)
    }

    fn cuArrayCreate_v2(handle: *mut u64, descriptor: *const CudaArrayDescriptor) {
        let d = read_in(descriptor).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        create_array(handle, [d.width as u64, d.height as u64, 0], d.format, d.num_channels, 0, 1, TAG_ARRAY)
    }

    fn cuArray3DCreate(handle: *mut u64, descriptor: *const CudaArray3dDescriptorV1) {
        let d = read_in(descriptor).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        create_array(handle, [d.width as u64, d.height as u64, d.depth as u64], d.format, d.num_channels, d.flags, 1, TAG_ARRAY)
    }

    fn cuArray3DCreate_v2(handle: *mut u64, descriptor: *const CudaArray3dDescriptor) {
        let d = read_in(descriptor).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        create_array(handle, [d.width as u64, d.height as u64, d.depth as u64], d.format, d.num_channels, d.flags, 1, TAG_ARRAY)
    }

    fn cuArrayDestroy(handle: u64) { destroy_array(handle, TAG_ARRAY) }

    fn cuArrayGetDescriptor_v2(descriptor: *mut CudaArrayDescriptor, handle: u64) {
        let d = with_registry(|registry| registry.arrays.get(&handle).filter(|_| tag_of(handle) == TAG_ARRAY).map(|a| a.descriptor).ok_or(CUDA_ERROR_INVALID_HANDLE))?;
        out(descriptor, CudaArrayDescriptor { width: d[0] as usize, height: d[1] as usize, format: d[3] as u32, num_channels: d[4] as u32 })
    }

    fn cuArray3DGetDescriptor_v2(descriptor: *mut CudaArray3dDescriptor, handle: u64) {
        let d = with_registry(|registry| registry.arrays.get(&handle).filter(|_| tag_of(handle) == TAG_ARRAY).map(|a| a.descriptor).ok_or(CUDA_ERROR_INVALID_HANDLE))?;
        out(descriptor, CudaArray3dDescriptor { width: d[0] as usize, height: d[1] as usize, depth: d[2] as usize, format: d[3] as u32, num_channels: d[4] as u32, flags: d[5] as u32 })
    }

    fn cuMipmappedArrayCreate(handle: *mut u64, descriptor: *const CudaArray3dDescriptor, levels: u32) {
        let d = read_in(descriptor).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let largest = d.width.max(d.height).max(d.depth).max(1) as u64;
        if levels == 0 || levels > 64 - largest.leading_zeros() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        create_array(handle, [d.width as u64, d.height as u64, d.depth as u64], d.format, d.num_channels, d.flags, levels, TAG_MIPMAP)
    }

    fn cuMipmappedArrayDestroy(handle: u64) { destroy_array(handle, TAG_MIPMAP) }
}

// ---------------------------------------------------------------------------------------
// Virtual memory management
// ---------------------------------------------------------------------------------------

/// `CUmemAllocationProp`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemAllocationProp {
    pub kind: i32,
    pub requested_handle_types: i32,
    pub location_type: i32,
    pub location_id: i32,
    pub win32_metadata: *mut c_void,
    pub alloc_flags: [u8; 8],
}
const _: () = assert!(std::mem::size_of::<MemAllocationProp>() == 32);

/// `CUmemAccessDesc`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemAccessDesc {
    pub location_type: i32,
    pub location_id: i32,
    pub flags: i32,
}
const _: () = assert!(std::mem::size_of::<MemAccessDesc>() == 12);

const CU_MEM_ALLOCATION_TYPE_PINNED: i32 = 1;
const CU_MEM_LOCATION_TYPE_DEVICE: i32 = 1;

fn check_prop(prop: *const MemAllocationProp) -> Result<(MemAllocationProp, usize), CUresult> {
    let p = read_in(prop).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if p.kind != CU_MEM_ALLOCATION_TYPE_PINNED || p.location_type != CU_MEM_LOCATION_TYPE_DEVICE {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (index, _) = device(p.location_id).map_err(|code| {
        if code == CUDA_ERROR_INVALID_DEVICE {
            CUDA_ERROR_INVALID_DEVICE
        } else {
            code
        }
    })?;
    Ok((p, index))
}

fn prop_bytes(p: &MemAllocationProp) -> [u8; 32] {
    let mut bytes = [0u8; 32];
    bytes[0..4].copy_from_slice(&p.kind.to_le_bytes());
    bytes[4..8].copy_from_slice(&p.requested_handle_types.to_le_bytes());
    bytes[8..12].copy_from_slice(&p.location_type.to_le_bytes());
    bytes[12..16].copy_from_slice(&p.location_id.to_le_bytes());
    bytes[24..32].copy_from_slice(&p.alloc_flags);
    bytes
}

/// Drops a VMM handle's memory once it is released and unmapped everywhere.
fn maybe_free_vmm(registry: &mut Registry, handle: u64) {
    if let Some(entry) = registry.vmm.get(&handle)
        && entry.refs == 0
        && entry.mappings == 0
    {
        let (device, size) = (entry.device, entry.size);
        registry.vmm.remove(&handle);
        registry.uncharge(device, size);
    }
}

cuda! {
    fn cuMemGetAllocationGranularity(granularity: *mut usize, prop: *const MemAllocationProp, option: i32) {
        check_prop(prop)?;
        if !(option == 0 || option == 1) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(granularity, GRANULARITY as usize)
    }

    fn cuMemCreate(handle_out: *mut u64, size: usize, prop: *const MemAllocationProp, flags: u64) {
        let (p, index) = check_prop(prop)?;
        let size = size as u64;
        if handle_out.is_null() || flags != 0 || size == 0 || !size.is_multiple_of(GRANULARITY) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let handle = with_registry(|registry| {
            if size > registry.capacity(index) {
                return Err(CUDA_ERROR_OUT_OF_MEMORY);
            }
            registry.charge(index, size)?;
            let handle = registry.handle(TAG_VMM);
            registry.vmm.insert(handle, VmmHandle { device: index, size, refs: 1, mappings: 0, prop: prop_bytes(&p) });
            Ok(handle)
        })?;
        out(handle_out, handle)
    }

    fn cuMemRelease(handle: u64) {
        with_registry(|registry| {
            let entry = registry.vmm.get_mut(&handle).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            if entry.refs == 0 {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            entry.refs -= 1;
            maybe_free_vmm(registry, handle);
            Ok(())
        })
    }

    fn cuMemGetAllocationPropertiesFromHandle(prop: *mut MemAllocationProp, handle: u64) {
        let bytes = with_registry(|registry| registry.vmm.get(&handle).map(|h| h.prop).ok_or(CUDA_ERROR_INVALID_VALUE))?;
        let field = |at: usize| i32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
        let mut alloc_flags = [0u8; 8];
        alloc_flags.copy_from_slice(&bytes[24..32]);
        out(prop, MemAllocationProp { kind: field(0), requested_handle_types: field(4), location_type: field(8), location_id: field(12), win32_metadata: std::ptr::null_mut(), alloc_flags })
    }

    fn cuMemAddressReserve(ptr: *mut u64, size: usize, alignment: usize, addr: u64, flags: u64) {
        let (size, alignment) = (size as u64, alignment as u64);
        if ptr.is_null() || flags != 0 || size == 0 || size % GRANULARITY != 0 || (alignment != 0 && !alignment.is_power_of_two()) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let align = alignment.max(GRANULARITY);
        let base = with_registry(|registry| {
            let base = registry.place_reservation(size, align, addr).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
            registry.reservations.insert(base, size);
            Ok(base)
        })?;
        out(ptr, base)
    }

    fn cuMemAddressFree(ptr: u64, size: usize) {
        with_registry(|registry| {
            match registry.reservations.get(&ptr) {
                Some(&len) if len == size as u64 => {}
                _ => return Err(CUDA_ERROR_INVALID_VALUE),
            }
            let end = ptr + size as u64;
            if registry.allocations.range(ptr..end).next().is_some() {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            registry.reservations.remove(&ptr);
            Ok(())
        })
    }

    fn cuMemMap(ptr: u64, size: usize, offset: usize, handle: u64, flags: u64) {
        let (size, offset) = (size as u64, offset as u64);
        if flags != 0 || size == 0 || !ptr.is_multiple_of(GRANULARITY) || size % GRANULARITY != 0 || offset % GRANULARITY != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        with_registry(|registry| {
            let entry = registry.vmm.get(&handle).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
            if entry.refs == 0 || offset.checked_add(size).is_none_or(|end| end > entry.size) {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            let device = entry.device;
            let end = ptr.checked_add(size).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            let inside = registry.reservations.range(..=ptr).next_back().is_some_and(|(&base, &len)| end <= base + len);
            if !inside {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            let overlaps = registry.allocations.range(..end).next_back().is_some_and(|(&base, a)| base + a.size > ptr);
            if overlaps {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            let buffer_id = registry.next_buffer_id();
            registry.allocations.insert(ptr, Allocation { size, charged: 0, device, ctx: 0, kind: AllocKind::Mapped { handle, offset }, buffer_id });
            if let Some(entry) = registry.vmm.get_mut(&handle) {
                entry.mappings += 1;
            }
            Ok(())
        })
    }

    fn cuMemUnmap(ptr: u64, size: usize) {
        let end = ptr.checked_add(size as u64).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        with_registry(|registry| {
            if registry.find(ptr).is_some_and(|(base, _)| base < ptr) {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            let inside: Vec<(u64, Allocation)> = registry.allocations.range(ptr..end).map(|(b, a)| (*b, *a)).collect();
            if inside.is_empty() || inside.iter().any(|(base, a)| base + a.size > end || !matches!(a.kind, AllocKind::Mapped { .. })) {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            for (base, allocation) in inside {
                registry.allocations.remove(&base);
                if let AllocKind::Mapped { handle, .. } = allocation.kind {
                    if let Some(entry) = registry.vmm.get_mut(&handle) {
                        entry.mappings = entry.mappings.saturating_sub(1);
                    }
                    maybe_free_vmm(registry, handle);
                }
            }
            Ok(())
        })
    }

    fn cuMemSetAccess(ptr: u64, size: usize, descriptors: *const MemAccessDesc, count: usize) {
        if descriptors.is_null() || count == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let devices = with_registry(|registry| Ok(registry.device_count()))?;
        for index in 0..count {
            let d = read_at(descriptors, index).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            if d.location_type != CU_MEM_LOCATION_TYPE_DEVICE || usize::try_from(d.location_id).map_or(true, |id| id >= devices) || !(0..=3).contains(&d.flags) {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
        }
        let end = ptr.checked_add(size as u64).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        with_registry(|registry| {
            // Every byte of the range must be mapped.
            let mut cursor = ptr;
            while cursor < end {
                match registry.find(cursor) {
                    Some((base, a)) if matches!(a.kind, AllocKind::Mapped { .. }) => cursor = base + a.size,
                    _ => return Err(CUDA_ERROR_INVALID_VALUE),
                }
            }
            Ok(())
        })
    }

    fn cuMemRetainAllocationHandle(handle_out: *mut u64, addr: *mut c_void) {
        let handle = with_registry(|registry| {
            let (_, allocation) = registry.find(addr as u64).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            let AllocKind::Mapped { handle, .. } = allocation.kind else { return Err(CUDA_ERROR_INVALID_VALUE) };
            let entry = registry.vmm.get_mut(&handle).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            entry.refs += 1;
            Ok(handle)
        })?;
        out(handle_out, handle)
    }
}

// ---------------------------------------------------------------------------------------
// Stream-ordered allocation and memory pools
// ---------------------------------------------------------------------------------------

/// `CUmemPoolProps`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemPoolProps {
    pub alloc_type: i32,
    pub handle_types: i32,
    pub location_type: i32,
    pub location_id: i32,
    pub win32_security_attributes: *mut c_void,
    pub max_size: usize,
    pub usage: u16,
    pub reserved: [u8; 54],
}
const _: () = assert!(std::mem::size_of::<MemPoolProps>() == 88);

fn alloc_async(
    dptr: *mut u64,
    size: usize,
    pool: Option<u64>,
    stream: u64,
    per_thread: bool,
) -> Res {
    if dptr.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let current = current_context();
    let ptr = with_registry(|registry| {
        let (key, ctx) = registry.stream_key(stream, per_thread, current)?;
        let device = registry.context(ctx)?.device;
        let pool = match pool {
            Some(pool) => {
                if !registry.pools.contains_key(&pool) {
                    return Err(CUDA_ERROR_INVALID_VALUE);
                }
                pool
            }
            None => registry.current_pools[device],
        };
        let ptr = registry.pool_allocate(pool, ctx, size as u64)?;
        registry.enqueue(key, 0);
        Ok(ptr)
    })?;
    out(dptr, ptr)
}

fn free_async(dptr: u64, stream: u64, per_thread: bool) -> Res {
    let current = current_context();
    with_registry(|registry| {
        let (key, _) = registry.stream_key(stream, per_thread, current)?;
        match registry.allocations.get(&dptr) {
            Some(a) if matches!(a.kind, AllocKind::Pool(_)) => {}
            Some(_) => {}
            None => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        registry.free(dptr)?;
        registry.enqueue(key, 0);
        Ok(())
    })
}

const CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES: i32 = 1;
const CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: i32 = 3;
const CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: i32 = 4;
const CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: i32 = 5;
const CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: i32 = 6;
const CU_MEMPOOL_ATTR_USED_MEM_CURRENT: i32 = 7;
const CU_MEMPOOL_ATTR_USED_MEM_HIGH: i32 = 8;

cuda! {
    fn cuDeviceGetDefaultMemPool(pool: *mut u64, dev: i32) {
        let (index, _) = device(dev)?;
        let handle = with_registry(|registry| Ok(registry.default_pools[index]))?;
        out(pool, handle)
    }

    fn cuDeviceGetMemPool(pool: *mut u64, dev: i32) {
        let (index, _) = device(dev)?;
        let handle = with_registry(|registry| Ok(registry.current_pools[index]))?;
        out(pool, handle)
    }

    fn cuDeviceSetMemPool(dev: i32, pool: u64) {
        let (index, _) = device(dev)?;
        with_registry(|registry| {
            match registry.pools.get(&pool) {
                Some(p) if p.device == index => {}
                _ => return Err(CUDA_ERROR_INVALID_VALUE),
            }
            registry.current_pools[index] = pool;
            Ok(())
        })
    }

    fn cuMemPoolCreate(pool: *mut u64, props: *const MemPoolProps) {
        let p = read_in(props).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if pool.is_null() || p.alloc_type != CU_MEM_ALLOCATION_TYPE_PINNED || p.location_type != CU_MEM_LOCATION_TYPE_DEVICE {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (index, _) = device(p.location_id)?;
        let handle = with_registry(|registry| {
            let handle = registry.handle(TAG_POOL);
            let mut created = Pool::new(index, false);
            created.max_size = p.max_size as u64;
            registry.pools.insert(handle, created);
            Ok(handle)
        })?;
        out(pool, handle)
    }

    /// Destroying a pool frees what is still allocated from it and returns its reservation.
    fn cuMemPoolDestroy(pool: u64) {
        with_registry(|registry| {
            match registry.pools.get(&pool) {
                Some(p) if !p.is_default => {}
                _ => return Err(CUDA_ERROR_INVALID_VALUE),
            }
            let owned: Vec<u64> = registry.allocations.iter().filter(|(_, a)| a.kind == AllocKind::Pool(pool)).map(|(p, _)| *p).collect();
            for ptr in owned {
                let _ = registry.free(ptr);
            }
            registry.pool_trim(pool, 0);
            if let Some(removed) = registry.pools.remove(&pool)
                && registry.current_pools[removed.device] == pool {
                    registry.current_pools[removed.device] = registry.default_pools[removed.device];
                }
            Ok(())
        })
    }

    fn cuMemPoolTrimTo(pool: u64, min_bytes_to_keep: usize) {
        with_registry(|registry| {
            if !registry.pools.contains_key(&pool) {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            registry.pool_trim(pool, min_bytes_to_keep as u64);
            Ok(())
        })
    }

    fn cuMemPoolSetAttribute(pool: u64, attribute: i32, value: *mut c_void) {
        if value.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        with_registry(|registry| {
            let p = registry.pools.get_mut(&pool).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            match attribute {
                CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES..=CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
                    p.reuse[(attribute - 1) as usize] = read_in(value.cast::<i32>()).ok_or(CUDA_ERROR_INVALID_VALUE)?;
                }
                CU_MEMPOOL_ATTR_RELEASE_THRESHOLD => p.release_threshold = read_in(value.cast::<u64>()).ok_or(CUDA_ERROR_INVALID_VALUE)?,
                CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH | CU_MEMPOOL_ATTR_USED_MEM_HIGH => {
                    // Only a reset to zero is allowed; it sets the mark to the current value.
                    if read_in(value.cast::<u64>()) != Some(0) {
                        return Err(CUDA_ERROR_INVALID_VALUE);
                    }
                    if attribute == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH {
                        p.reserved_high = p.reserved;
                    } else {
                        p.used_high = p.used;
                    }
                }
                _ => return Err(CUDA_ERROR_INVALID_VALUE),
            }
            Ok(())
        })
    }

    fn cuMemPoolGetAttribute(pool: u64, attribute: i32, value: *mut c_void) {
        let (int_value, u64_value) = with_registry(|registry| {
            let p = registry.pools.get(&pool).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            Ok(match attribute {
                CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES..=CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES => (Some(p.reuse[(attribute - 1) as usize]), None),
                CU_MEMPOOL_ATTR_RELEASE_THRESHOLD => (None, Some(p.release_threshold)),
                CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT => (None, Some(p.reserved)),
                CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH => (None, Some(p.reserved_high)),
                CU_MEMPOOL_ATTR_USED_MEM_CURRENT => (None, Some(p.used)),
                CU_MEMPOOL_ATTR_USED_MEM_HIGH => (None, Some(p.used_high)),
                _ => return Err(CUDA_ERROR_INVALID_VALUE),
            })
        })?;
        match (int_value, u64_value) {
            (Some(v), _) => out(value.cast::<i32>(), v),
            (_, Some(v)) => out(value.cast::<u64>(), v),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }

    fn cuMemAllocAsync(dptr: *mut u64, size: usize, stream: u64) { alloc_async(dptr, size, None, stream, false) }
    fn cuMemAllocAsync_ptsz(dptr: *mut u64, size: usize, stream: u64) { alloc_async(dptr, size, None, stream, true) }
    fn cuMemAllocFromPoolAsync(dptr: *mut u64, size: usize, pool: u64, stream: u64) { alloc_async(dptr, size, Some(pool), stream, false) }
    fn cuMemAllocFromPoolAsync_ptsz(dptr: *mut u64, size: usize, pool: u64, stream: u64) { alloc_async(dptr, size, Some(pool), stream, true) }
    fn cuMemFreeAsync(dptr: u64, stream: u64) { free_async(dptr, stream, false) }
    fn cuMemFreeAsync_ptsz(dptr: u64, stream: u64) { free_async(dptr, stream, true) }
}

// ---------------------------------------------------------------------------------------
// Streams and events
// ---------------------------------------------------------------------------------------

fn create_stream(out_stream: *mut u64, flags: u32, priority: i32) -> Res {
    if out_stream.is_null() || flags & !CU_STREAM_NON_BLOCKING != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let ctx = require_current()?;
    let handle = with_registry(|registry| {
        let handle = registry.handle(TAG_STREAM);
        registry.streams.insert(
            handle,
            Stream {
                ctx,
                flags,
                priority: priority.clamp(-5, 0),
                busy: 0,
            },
        );
        Ok(handle)
    })?;
    out(out_stream, handle)
}

fn destroy_stream(stream: u64) -> Res {
    with_registry(|registry| {
        registry
            .streams
            .remove(&stream)
            .map(|_| ())
            .ok_or(CUDA_ERROR_INVALID_HANDLE)
    })
}

fn stream_synchronize(stream: u64, per_thread: bool) -> Res {
    let current = current_context();
    let (deadline, device) = with_registry(|registry| {
        let (key, ctx) = registry.stream_key(stream, per_thread, current)?;
        registry.check_unsafe_call(Some(key))?;
        Ok((registry.ready_at(key), registry.context(ctx)?.device))
    })?;
    sleep_until(deadline);
    with_registry(|registry| {
        registry.release_pools_at_sync(device);
        Ok(())
    })
}

fn stream_query(stream: u64, per_thread: bool) -> Res {
    let current = current_context();
    with_registry(|registry| {
        let (key, _) = registry.stream_key(stream, per_thread, current)?;
        registry.check_unsafe_call(Some(key))?;
        if registry.ready_at(key) > now_ns() {
            Err(CUDA_ERROR_NOT_READY)
        } else {
            Ok(())
        }
    })
}

fn stream_wait_event(stream: u64, event: u64, flags: u32, per_thread: bool) -> Res {
    if flags & !1 != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let current = current_context();
    with_registry(|registry| {
        let (key, _) = registry.stream_key(stream, per_thread, current)?;
        let at = registry
            .events
            .get(&event)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?
            .at;
        if let Some(at) = at {
            registry.wait_until(key, at);
        }
        Ok(())
    })
}

fn record_event(event: u64, stream: u64, per_thread: bool) -> Res {
    let current = current_context();
    with_registry(|registry| {
        if !registry.events.contains_key(&event) {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        let (key, _) = registry.stream_key(stream, per_thread, current)?;
        // Recorded into a capture, the event becomes a graph node.
        let captured = registry.capture_nodes(key, &[]);
        let at = registry.ready_at(key).max(now_ns());
        if let Some(e) = registry.events.get_mut(&event) {
            e.at = (!captured).then_some(at);
            e.captured = captured;
        }
        Ok(())
    })
}

/// When a recorded event completes (None: never recorded), for a query or a wait (both
/// "potentially unsafe" during a capture); a captured event never completes as such.
/// When `event` completes (`None`: never recorded) and its context.
fn event_completion(event: u64) -> Result<(Option<u64>, u64), CUresult> {
    with_registry(|registry| {
        registry.check_unsafe_call(None)?;
        match registry.events.get(&event) {
            Some(e) if e.captured => Err(super::graphs::CUDA_ERROR_CAPTURED_EVENT),
            Some(e) => Ok((e.at, e.ctx)),
            None => Err(CUDA_ERROR_INVALID_HANDLE),
        }
    })
}

fn elapsed(ms: *mut f32, start: u64, end: u64) -> Res {
    if ms.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (a, b) = with_registry(|registry| {
        let first = registry
            .events
            .get(&start)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let second = registry.events.get(&end).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        if (first.flags | second.flags) & CU_EVENT_DISABLE_TIMING != 0 {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        match (first.at, second.at) {
            (Some(a), Some(b)) => Ok((a, b)),
            _ => Err(CUDA_ERROR_INVALID_HANDLE),
        }
    })?;
    if a.max(b) > now_ns() {
        return Err(CUDA_ERROR_NOT_READY);
    }
    out(ms, ((b as i128 - a as i128) as f64 / 1e6) as f32)
}

fn destroy_event(event: u64) -> Res {
    with_registry(|registry| {
        registry
            .events
            .remove(&event)
            .map(|_| ())
            .ok_or(CUDA_ERROR_INVALID_HANDLE)
    })
}

cuda! {
    fn cuStreamCreate(stream: *mut u64, flags: u32) { create_stream(stream, flags, 0) }
    fn cuStreamCreateWithPriority(stream: *mut u64, flags: u32, priority: i32) { create_stream(stream, flags, priority) }
    fn cuStreamDestroy(stream: u64) { destroy_stream(stream) }
    fn cuStreamDestroy_v2(stream: u64) { destroy_stream(stream) }
    fn cuStreamSynchronize(stream: u64) { stream_synchronize(stream, false) }
    fn cuStreamSynchronize_ptsz(stream: u64) { stream_synchronize(stream, true) }
    fn cuStreamQuery(stream: u64) { stream_query(stream, false) }
    fn cuStreamQuery_ptsz(stream: u64) { stream_query(stream, true) }
    fn cuStreamWaitEvent(stream: u64, event: u64, flags: u32) { stream_wait_event(stream, event, flags, false) }
    fn cuStreamWaitEvent_ptsz(stream: u64, event: u64, flags: u32) { stream_wait_event(stream, event, flags, true) }

    fn cuStreamGetPriority(stream: u64, priority: *mut i32) {
        let value = with_registry(|registry| Ok(registry.streams.get(&stream).map(|s| s.priority).unwrap_or(0)))?;
        out(priority, value)
    }

    fn cuStreamGetFlags(stream: u64, flags: *mut u32) {
        let value = with_registry(|registry| Ok(registry.streams.get(&stream).map(|s| s.flags).unwrap_or(0)))?;
        out(flags, value)
    }

    fn cuEventCreate(event: *mut u64, flags: u32) {
        // DEFAULT 0, BLOCKING_SYNC 1, DISABLE_TIMING 2, INTERPROCESS 4 (needs DISABLE_TIMING).
        if event.is_null() || flags & !0x7 != 0 || (flags & 0x4 != 0 && flags & CU_EVENT_DISABLE_TIMING == 0) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let ctx = require_current()?;
        let handle = with_registry(|registry| {
            let handle = registry.handle(TAG_EVENT);
            registry.events.insert(handle, Event { ctx, flags, at: None, captured: false });
            Ok(handle)
        })?;
        out(event, handle)
    }

    fn cuEventRecord(event: u64, stream: u64) { record_event(event, stream, false) }
    fn cuEventRecord_ptsz(event: u64, stream: u64) { record_event(event, stream, true) }

    fn cuEventRecordWithFlags(event: u64, stream: u64, flags: u32) {
        if flags & !1 != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        record_event(event, stream, false)
    }

    fn cuEventRecordWithFlags_ptsz(event: u64, stream: u64, flags: u32) {
        if flags & !1 != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        record_event(event, stream, true)
    }

    fn cuEventQuery(event: u64) {
        let (at, _) = event_completion(event)?;
        match at {
            Some(at) if at > now_ns() => Err(CUDA_ERROR_NOT_READY),
            _ => Ok(()),
        }
    }

    /// Waits for the event, then lets its device's pools release memory (a
    /// synchronisation point, as for streams and contexts).
    fn cuEventSynchronize(event: u64) {
        let (at, ctx) = event_completion(event)?;
        if let Some(at) = at {
            sleep_until(at);
        }
        with_registry(|registry| {
            if let Some(device) = registry.contexts.get(&ctx).map(|c| c.device) {
                registry.release_pools_at_sync(device);
            }
            Ok(())
        })
    }

    fn cuEventElapsedTime(ms: *mut f32, start: u64, end: u64) { elapsed(ms, start, end) }
    fn cuEventElapsedTime_v2(ms: *mut f32, start: u64, end: u64) { elapsed(ms, start, end) }
    fn cuEventDestroy(event: u64) { destroy_event(event) }
    fn cuEventDestroy_v2(event: u64) { destroy_event(event) }
}

// ---------------------------------------------------------------------------------------
// Modules, libraries, functions and launches
// ---------------------------------------------------------------------------------------

/// The most bytes an image header may claim (1 GiB).
const MAX_IMAGE: u64 = 1 << 30;
const FATBIN_MAGIC: u32 = 0xBA55_ED50;
const FATBIN_WRAPPER_MAGIC: u32 = 0x4662_43B1;

/// Entry names declared by a PTX text.
fn ptx_entries(text: &str) -> HashSet<String> {
    let mut entries = HashSet::new();
    let mut rest = text;
    while let Some(at) = rest.find(".entry") {
        let after = &rest[at + ".entry".len()..];
        let name: String = after
            .trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '$' | '.'))
            .collect();
        if !name.is_empty() {
            entries.insert(name);
        }
        rest = after;
    }
    entries
}

/// Kernel names of a cubin: its `.text.<name>` sections.
fn elf_entries(image: &[u8]) -> Result<HashSet<String>, CUresult> {
    let u16_at = |at: usize| {
        image
            .get(at..at + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]) as u64)
    };
    let u32_at = |at: usize| {
        image
            .get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as u64)
    };
    let u64_at = |at: usize| {
        image
            .get(at..at + 8)
            .map(|b| u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
    };
    if image.get(4) != Some(&2) {
        return Err(CUDA_ERROR_INVALID_IMAGE); // only ELF64 cubins
    }
    let shoff = u64_at(0x28).ok_or(CUDA_ERROR_INVALID_IMAGE)? as usize;
    let shentsize = u16_at(0x3a).ok_or(CUDA_ERROR_INVALID_IMAGE)? as usize;
    let shnum = u16_at(0x3c).ok_or(CUDA_ERROR_INVALID_IMAGE)? as usize;
    let shstrndx = u16_at(0x3e).ok_or(CUDA_ERROR_INVALID_IMAGE)? as usize;
    let section = |index: usize| -> Option<(u64, u64, u64)> {
        let at = shoff + index * shentsize;
        Some((u32_at(at)?, u64_at(at + 0x18)?, u64_at(at + 0x20)?))
    };
    let (_, strtab_offset, strtab_size) = section(shstrndx).ok_or(CUDA_ERROR_INVALID_IMAGE)?;
    let strtab = image
        .get(strtab_offset as usize..(strtab_offset + strtab_size) as usize)
        .ok_or(CUDA_ERROR_INVALID_IMAGE)?;
    let mut entries = HashSet::new();
    for index in 0..shnum {
        let (name_offset, _, _) = section(index).ok_or(CUDA_ERROR_INVALID_IMAGE)?;
        let name_bytes = strtab.get(name_offset as usize..).unwrap_or(&[]);
        let end = name_bytes
            .iter()
            .position(|b| *b == 0)
            .unwrap_or(name_bytes.len());
        if let Some(kernel) = std::str::from_utf8(&name_bytes[..end])
            .ok()
            .and_then(|name| name.strip_prefix(".text."))
        {
            entries.insert(kernel.to_string());
        }
    }
    Ok(entries)
}

/// The entry names of an image in memory: PTX text, an ELF cubin (its length read from
/// its header), or a fatbin (whose kernels are not listed: any name is accepted).
fn image_entries(image: *const c_void) -> Result<Option<HashSet<String>>, CUresult> {
    let head = ffi::bytes(image.cast::<u8>(), 4).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let magic = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
    if head == b"\x7fELF" {
        let header = ffi::bytes(image.cast::<u8>(), 64).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let shoff = u64::from_le_bytes(
            header[0x28..0x30]
                .try_into()
                .map_err(|_| CUDA_ERROR_INVALID_IMAGE)?,
        );
        let shentsize = u16::from_le_bytes([header[0x3a], header[0x3b]]) as u64;
        let shnum = u16::from_le_bytes([header[0x3c], header[0x3d]]) as u64;
        let len = shoff
            .checked_add(shentsize * shnum)
            .filter(|len| *len <= MAX_IMAGE && *len >= 64)
            .ok_or(CUDA_ERROR_INVALID_IMAGE)?;
        let whole = ffi::bytes(image.cast::<u8>(), len as usize).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        return elf_entries(whole).map(Some);
    }
    if magic == FATBIN_MAGIC || magic == FATBIN_WRAPPER_MAGIC {
        return Ok(None);
    }
    let text = c_str(image.cast::<c_char>()).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    ptx_from_text(&text).map(Some)
}

fn ptx_from_text(text: &str) -> Result<HashSet<String>, CUresult> {
    if !(text.contains(".version") || text.contains(".entry") || text.contains(".target")) {
        return Err(CUDA_ERROR_INVALID_IMAGE);
    }
    require_jit_compiler()?;
    Ok(ptx_entries(text))
}

/// Loads the JIT helper named by `VGPU_SIM_PTX_JIT_LIBRARY` by name, through the loader's
/// search path as the real driver does, so a container layout that hides the driver's
/// helpers fails over the sim as it fails on a GPU.
fn require_jit_compiler() -> Result<(), CUresult> {
    use std::os::unix::ffi::OsStringExt;
    let Some(name) = std::env::var_os(crate::config::PTX_JIT_LIBRARY_ENV).filter(|n| !n.is_empty())
    else {
        return Ok(());
    };
    // cuda.h's code (vgpu_abi's CUresult is unsigned, the sim's signed).
    const NOT_FOUND: CUresult = vgpu_abi::cuda::CUDA_ERROR_JIT_COMPILER_NOT_FOUND as CUresult;
    let name = std::ffi::CString::new(name.into_vec()).map_err(|_| NOT_FOUND)?;
    // SAFETY: dlopen of a NUL-terminated name; the handle is never closed, as the driver
    // keeps its helper loaded.
    let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
    if handle.is_null() {
        Err(NOT_FOUND)
    } else {
        Ok(())
    }
}

/// The entry names of an image file.
fn file_entries(path: &str) -> Result<Option<HashSet<String>>, CUresult> {
    let bytes = std::fs::read(path).map_err(|_| CUDA_ERROR_FILE_NOT_FOUND)?;
    if bytes.starts_with(b"\x7fELF") {
        return elf_entries(&bytes).map(Some);
    }
    if bytes.len() >= 4 {
        let magic = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        if magic == FATBIN_MAGIC || magic == FATBIN_WRAPPER_MAGIC {
            return Ok(None);
        }
    }
    ptx_from_text(&String::from_utf8_lossy(&bytes)).map(Some)
}

fn load_module(module_out: *mut u64, entries: Option<HashSet<String>>) -> Res {
    if module_out.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let ctx = require_current()?;
    let handle = with_registry(|registry| {
        // The driver loads the module's code into device memory, after the context.
        let charged = registry.sim.config.module_overhead;
        let device = registry.context(ctx)?.device;
        registry.charge(device, charged)?;
        let handle = registry.handle(TAG_MODULE);
        registry.modules.insert(
            handle,
            Module {
                ctx,
                charged,
                entries,
                functions: HashMap::new(),
            },
        );
        Ok(handle)
    })?;
    out(module_out, handle)
}

fn load_library(library_out: *mut u64, entries: Option<HashSet<String>>) -> Res {
    if library_out.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let handle = with_registry(|registry| {
        let handle = registry.handle(TAG_LIBRARY);
        registry.libraries.insert(
            handle,
            Library {
                entries,
                kernels: HashMap::new(),
            },
        );
        Ok(handle)
    })?;
    out(library_out, handle)
}

fn kernel_duration(registry: &Registry, name: &str) -> u64 {
    duration_from_name(name).unwrap_or(registry.sim.config.kernel_ns)
}

/// The function a launch names: a CUfunction, or a CUkernel (resolved in the current context).
fn launch_function(
    registry: &mut Registry,
    handle: u64,
    ctx: u64,
) -> Result<(String, u64), CUresult> {
    match tag_of(handle) {
        TAG_FUNCTION => {
            let function = registry
                .functions
                .get(&handle)
                .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
            Ok((function.name.clone(), function.duration_ns))
        }
        TAG_KERNEL => {
            let kernel = registry
                .kernels
                .get(&handle)
                .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
            let _ = ctx;
            Ok((kernel.name.clone(), kernel.duration_ns))
        }
        _ => Err(CUDA_ERROR_INVALID_HANDLE),
    }
}

/// Validates and queues one launch; the kernel occupies its stream for its duration.
fn launch(
    function: u64,
    grid: [u32; 3],
    block: [u32; 3],
    shared: u32,
    stream: u64,
    per_thread: bool,
    cooperative: bool,
) -> Res {
    let current = current_context();
    with_registry(|registry| {
        let (key, ctx) = registry.stream_key(stream, per_thread, current)?;
        let (_, duration) = launch_function(registry, function, ctx)?;
        if grid.contains(&0) || block.contains(&0) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if block[0] > 1024
            || block[1] > 1024
            || block[2] > 64
            || grid[1] > 65535
            || grid[2] > 65535
            || grid[0] > i32::MAX as u32
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let threads = block.iter().map(|d| *d as u64).product::<u64>();
        if threads > 1024 || shared > 232_448 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let device = registry.context(ctx)?.device;
        if cooperative {
            let blocks = grid.iter().map(|d| *d as u64).product::<u64>();
            let per_sm = (2048 / threads).clamp(1, 32);
            if blocks > registry.sim.config.gpus[device].sms as u64 * per_sm {
                return Err(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE);
            }
        }
        let blocks = grid.iter().map(|d| *d as u64).product::<u64>();
        if registry.capture_nodes(
            key,
            &[super::graphs::Node {
                duration_ns: duration,
                blocks,
            }],
        ) {
            return Ok(());
        }
        let now = now_ns();
        let (start, end) = registry.enqueue_kernel(key, device, duration, blocks);
        registry
            .sim
            .state
            .record_busy(registry.slot, device, start, end, now);
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------
// Stream capture and graphs (the logic is in `graphs`)
// ---------------------------------------------------------------------------------------

fn begin_capture(stream: u64, mode: u32, per_thread: bool) -> Res {
    let current = current_context();
    with_registry(|registry| {
        let (key, _) = registry.stream_key(stream, per_thread, current)?;
        registry.begin_capture(key, mode)
    })
}

fn end_capture(stream: u64, graph: *mut u64, per_thread: bool) -> Res {
    if graph.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let current = current_context();
    let made = with_registry(|registry| {
        let (key, _) = registry.stream_key(stream, per_thread, current)?;
        registry.end_capture(key)
    });
    out(graph, made.unwrap_or(0))?;
    made.map(|_| ())
}

fn is_capturing(stream: u64, status: *mut u32, per_thread: bool) -> Res {
    let current = current_context();
    let value = with_registry(|registry| {
        let (key, _) = registry.stream_key(stream, per_thread, current)?;
        Ok(registry.capture_status(key))
    })?;
    out(status, value)
}

fn instantiate(exec: *mut u64, graph: u64) -> Res {
    if exec.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let made = with_registry(|registry| registry.instantiate(graph))?;
    out(exec, made)
}

/// Runs a graph's kernels one after the other on the stream (or captures them).
fn graph_launch(exec: u64, stream: u64, per_thread: bool) -> Res {
    let current = current_context();
    with_registry(|registry| {
        let nodes = registry
            .graph_execs
            .get(&exec)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?
            .clone();
        let (key, ctx) = registry.stream_key(stream, per_thread, current)?;
        if registry.capture_nodes(key, &nodes) {
            return Ok(());
        }
        let device = registry.context(ctx)?.device;
        for node in nodes {
            let now = now_ns();
            let (start, end) = registry.enqueue_kernel(key, device, node.duration_ns, node.blocks);
            registry
                .sim
                .state
                .record_busy(registry.slot, device, start, end, now);
        }
        Ok(())
    })
}

cuda! {
    fn cuStreamBeginCapture(stream: u64) { begin_capture(stream, super::graphs::CU_STREAM_CAPTURE_MODE_GLOBAL, false) }
    fn cuStreamBeginCapture_ptsz(stream: u64) { begin_capture(stream, super::graphs::CU_STREAM_CAPTURE_MODE_GLOBAL, true) }
    fn cuStreamBeginCapture_v2(stream: u64, mode: u32) { begin_capture(stream, mode, false) }
    fn cuStreamBeginCapture_v2_ptsz(stream: u64, mode: u32) { begin_capture(stream, mode, true) }
    fn cuStreamEndCapture(stream: u64, graph: *mut u64) { end_capture(stream, graph, false) }
    fn cuStreamEndCapture_ptsz(stream: u64, graph: *mut u64) { end_capture(stream, graph, true) }
    fn cuStreamIsCapturing(stream: u64, status: *mut u32) { is_capturing(stream, status, false) }
    fn cuStreamIsCapturing_ptsz(stream: u64, status: *mut u32) { is_capturing(stream, status, true) }

    fn cuThreadExchangeStreamCaptureMode(mode: *mut u32) {
        let wanted = read_in(mode).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let previous = super::graphs::exchange_thread_mode(wanted)?;
        out(mode, previous)
    }

    fn cuGraphInstantiate(exec: *mut u64, graph: u64, error_node: *mut u64, log: *mut c_char, log_size: usize) {
        let _ = (error_node, log, log_size);
        instantiate(exec, graph)
    }

    fn cuGraphInstantiate_v2(exec: *mut u64, graph: u64, error_node: *mut u64, log: *mut c_char, log_size: usize) {
        let _ = (error_node, log, log_size);
        instantiate(exec, graph)
    }

    fn cuGraphInstantiateWithFlags(exec: *mut u64, graph: u64, flags: u64) {
        let _ = flags;
        instantiate(exec, graph)
    }

    fn cuGraphLaunch(exec: u64, stream: u64) { graph_launch(exec, stream, false) }
    fn cuGraphLaunch_ptsz(exec: u64, stream: u64) { graph_launch(exec, stream, true) }

    fn cuGraphDestroy(graph: u64) {
        with_registry(|registry| registry.graphs.remove(&graph).map(|_| ()).ok_or(CUDA_ERROR_INVALID_VALUE))
    }

    fn cuGraphExecDestroy(exec: u64) {
        with_registry(|registry| registry.graph_execs.remove(&exec).map(|_| ()).ok_or(CUDA_ERROR_INVALID_VALUE))
    }
}

/// `CUlaunchConfig`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct LaunchConfig {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem_bytes: u32,
    pub stream: u64,
    pub attrs: *mut c_void,
    pub num_attrs: u32,
}
const _: () = assert!(std::mem::size_of::<LaunchConfig>() == 56);

fn launch_ex(config: *const LaunchConfig, function: u64, per_thread: bool) -> Res {
    let c = read_in(config).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if c.num_attrs > 0 && c.attrs.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    launch(
        function,
        c.grid,
        c.block,
        c.shared_mem_bytes,
        c.stream,
        per_thread,
        false,
    )
}

/// Function attributes of every simulated kernel.
fn function_attribute(attribute: i32) -> Option<i32> {
    Some(match attribute {
        0 => 1024,    // MAX_THREADS_PER_BLOCK
        1 => 0,       // SHARED_SIZE_BYTES
        2 => 0,       // CONST_SIZE_BYTES
        3 => 0,       // LOCAL_SIZE_BYTES
        4 => 32,      // NUM_REGS
        5 => 90,      // PTX_VERSION
        6 => 90,      // BINARY_VERSION
        7 => 0,       // CACHE_MODE_CA
        8 => 49152,   // MAX_DYNAMIC_SHARED_SIZE_BYTES
        9 => -1,      // PREFERRED_SHARED_MEMORY_CARVEOUT
        10 => 0,      // CLUSTER_SIZE_MUST_BE_SET
        11..=13 => 0, // REQUIRED_CLUSTER_WIDTH/HEIGHT/DEPTH
        14 => 1,      // NON_PORTABLE_CLUSTER_SIZE_ALLOWED
        15 => 0,      // CLUSTER_SCHEDULING_POLICY_PREFERENCE
        _ => return None,
    })
}

cuda! {
    fn cuModuleLoad(module: *mut u64, path: *const c_char) {
        let path = c_str(path).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        require_current()?;
        let entries = file_entries(&path)?;
        load_module(module, entries)
    }

    fn cuModuleLoadData(module: *mut u64, image: *const c_void) {
        require_current()?;
        let entries = image_entries(image)?;
        load_module(module, entries)
    }

    /// JIT options are accepted and ignored.
    fn cuModuleLoadDataEx(module: *mut u64, image: *const c_void, num_options: u32, options: *mut i32, option_values: *mut *mut c_void) {
        if num_options > 0 && (options.is_null() || option_values.is_null()) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        require_current()?;
        let entries = image_entries(image)?;
        load_module(module, entries)
    }

    fn cuModuleLoadFatBinary(module: *mut u64, image: *const c_void) {
        require_current()?;
        let entries = image_entries(image)?;
        load_module(module, entries)
    }

    fn cuModuleUnload(module: u64) {
        with_registry(|registry| if registry.unload_module(module) { Ok(()) } else { Err(CUDA_ERROR_INVALID_HANDLE) })
    }

    fn cuModuleGetFunction(function: *mut u64, module: u64, name: *const c_char) {
        let name = c_str(name).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if function.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let handle = with_registry(|registry| {
            let found = registry.modules.get(&module).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
            if let Some(existing) = found.functions.get(&name) {
                return Ok(*existing);
            }
            if found.entries.as_ref().is_some_and(|entries| !entries.contains(&name)) {
                return Err(CUDA_ERROR_NOT_FOUND);
            }
            let duration_ns = kernel_duration(registry, &name);
            let handle = registry.handle(TAG_FUNCTION);
            registry.functions.insert(handle, Function { module, name: name.clone(), duration_ns });
            if let Some(m) = registry.modules.get_mut(&module) {
                m.functions.insert(name, handle);
            }
            Ok(handle)
        })?;
        out(function, handle)
    }

    fn cuLibraryLoadData(library: *mut u64, code: *const c_void, jit_options: *mut i32, jit_values: *mut *mut c_void, num_jit: u32, library_options: *mut i32, library_values: *mut *mut c_void, num_library: u32) {
        if (num_jit > 0 && (jit_options.is_null() || jit_values.is_null())) || (num_library > 0 && (library_options.is_null() || library_values.is_null())) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let entries = image_entries(code)?;
        load_library(library, entries)
    }

    fn cuLibraryLoadFromFile(library: *mut u64, path: *const c_char, jit_options: *mut i32, jit_values: *mut *mut c_void, num_jit: u32, library_options: *mut i32, library_values: *mut *mut c_void, num_library: u32) {
        let _ = (jit_options, jit_values, num_jit, library_options, library_values, num_library);
        let path = c_str(path).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        with_registry(|_| Ok(()))?;
        let entries = file_entries(&path)?;
        load_library(library, entries)
    }

    fn cuLibraryUnload(library: u64) {
        with_registry(|registry| {
            let removed = registry.libraries.remove(&library).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
            for kernel in removed.kernels.values() {
                if let Some(k) = registry.kernels.remove(kernel) {
                    for function in k.functions.values() {
                        registry.functions.remove(function);
                    }
                }
            }
            Ok(())
        })
    }

    fn cuLibraryGetKernel(kernel: *mut u64, library: u64, name: *const c_char) {
        let name = c_str(name).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if kernel.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let handle = with_registry(|registry| {
            let found = registry.libraries.get(&library).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
            if let Some(existing) = found.kernels.get(&name) {
                return Ok(*existing);
            }
            if found.entries.as_ref().is_some_and(|entries| !entries.contains(&name)) {
                return Err(CUDA_ERROR_NOT_FOUND);
            }
            let duration_ns = kernel_duration(registry, &name);
            let handle = registry.handle(TAG_KERNEL);
            registry.kernels.insert(handle, Kernel { library, name: name.clone(), duration_ns, functions: HashMap::new() });
            if let Some(l) = registry.libraries.get_mut(&library) {
                l.kernels.insert(name, handle);
            }
            Ok(handle)
        })?;
        out(kernel, handle)
    }

    fn cuKernelGetFunction(function: *mut u64, kernel: u64) {
        if function.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let ctx = require_current()?;
        let handle = with_registry(|registry| {
            let found = registry.kernels.get(&kernel).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
            if let Some(existing) = found.functions.get(&ctx) {
                return Ok(*existing);
            }
            let (name, duration_ns) = (found.name.clone(), found.duration_ns);
            let handle = registry.handle(TAG_FUNCTION);
            registry.functions.insert(handle, Function { module: 0, name, duration_ns });
            if let Some(k) = registry.kernels.get_mut(&kernel) {
                k.functions.insert(ctx, handle);
            }
            Ok(handle)
        })?;
        out(function, handle)
    }

    fn cuFuncGetAttribute(value: *mut i32, attribute: i32, function: u64) {
        with_registry(|registry| {
            if tag_of(function) == TAG_KERNEL && registry.kernels.contains_key(&function) || registry.functions.contains_key(&function) {
                Ok(())
            } else {
                Err(CUDA_ERROR_INVALID_HANDLE)
            }
        })?;
        out(value, function_attribute(attribute).ok_or(CUDA_ERROR_INVALID_VALUE)?)
    }

    fn cuFuncSetAttribute(function: u64, attribute: i32, value: i32) {
        with_registry(|registry| if registry.functions.contains_key(&function) { Ok(()) } else { Err(CUDA_ERROR_INVALID_HANDLE) })?;
        match attribute {
            8 if (0..=232_448).contains(&value) => Ok(()),
            9 if (-1..=100).contains(&value) => Ok(()),
            10 | 14 | 15 => Ok(()),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }

    fn cuFuncGetName(name: *mut *const c_char, function: u64) {
        // Names live as long as their function; interned so the pointer stays valid after.
        static NAMES: std::sync::Mutex<Vec<std::ffi::CString>> = std::sync::Mutex::new(Vec::new());
        let text = with_registry(|registry| registry.functions.get(&function).map(|f| f.name.clone()).ok_or(CUDA_ERROR_INVALID_HANDLE))?;
        let c_name = std::ffi::CString::new(text).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        let mut names = NAMES.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?;
        let pointer = match names.iter().find(|held| **held == c_name) {
            Some(held) => held.as_ptr(),
            None => {
                names.push(c_name);
                names.last().map(|held| held.as_ptr()).ok_or(CUDA_ERROR_UNKNOWN)?
            }
        };
        out(name, pointer)
    }

    fn cuLaunchKernel(f: u64, gx: u32, gy: u32, gz: u32, bx: u32, by: u32, bz: u32, shared: u32, stream: u64, params: *mut *mut c_void, extra: *mut *mut c_void) {
        let _ = (params, extra);
        launch(f, [gx, gy, gz], [bx, by, bz], shared, stream, false, false)
    }

    fn cuLaunchKernel_ptsz(f: u64, gx: u32, gy: u32, gz: u32, bx: u32, by: u32, bz: u32, shared: u32, stream: u64, params: *mut *mut c_void, extra: *mut *mut c_void) {
        let _ = (params, extra);
        launch(f, [gx, gy, gz], [bx, by, bz], shared, stream, true, false)
    }

    fn cuLaunchCooperativeKernel(f: u64, gx: u32, gy: u32, gz: u32, bx: u32, by: u32, bz: u32, shared: u32, stream: u64, params: *mut *mut c_void) {
        let _ = params;
        launch(f, [gx, gy, gz], [bx, by, bz], shared, stream, false, true)
    }

    fn cuLaunchCooperativeKernel_ptsz(f: u64, gx: u32, gy: u32, gz: u32, bx: u32, by: u32, bz: u32, shared: u32, stream: u64, params: *mut *mut c_void) {
        let _ = params;
        launch(f, [gx, gy, gz], [bx, by, bz], shared, stream, true, true)
    }

    fn cuLaunchKernelEx(config: *const LaunchConfig, f: u64, params: *mut *mut c_void, extra: *mut *mut c_void) {
        let _ = (params, extra);
        launch_ex(config, f, false)
    }

    fn cuLaunchKernelEx_ptsz(config: *const LaunchConfig, f: u64, params: *mut *mut c_void, extra: *mut *mut c_void) {
        let _ = (params, extra);
        launch_ex(config, f, true)
    }
}

// ---------------------------------------------------------------------------------------
// cuGetProcAddress
// ---------------------------------------------------------------------------------------

/// `CUdriverProcAddressQueryResult`.
pub const CU_GET_PROC_ADDRESS_SUCCESS: i32 = 0;
pub const CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND: i32 = 1;
pub const CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT: i32 = 2;

/// The lookup behind both entry points. `cuGetProcAddress_v2` (given `status`) answers a
/// miss with CUDA_SUCCESS, a NULL function and the reason in `status`, as the 580 driver
/// does (measured); the original entry point answers CUDA_ERROR_NOT_FOUND.
fn get_proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: i32,
    flags: u64,
    status: *mut i32,
) -> Res {
    let miss = if status.is_null() {
        Err(CUDA_ERROR_NOT_FOUND)
    } else {
        Ok(())
    };
    let set_status = |value: i32| {
        if !status.is_null() {
            let _ = write_out(status, value);
        }
    };
    let name = c_str(symbol);
    if pfn.is_null() || name.is_none() || flags > 2 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let _ = write_out(pfn, std::ptr::null_mut());
    match super::procaddr::resolve(name.as_deref().unwrap_or_default(), version, flags) {
        super::procaddr::Lookup::Found(address) => {
            set_status(CU_GET_PROC_ADDRESS_SUCCESS);
            out(pfn, address as *mut c_void)
        }
        super::procaddr::Lookup::VersionTooLow => {
            set_status(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
            miss
        }
        super::procaddr::Lookup::NotFound => {
            set_status(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
            miss
        }
    }
}

cuda! {
    fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, version: i32, flags: u64) {
        get_proc_address(symbol, pfn, version, flags, std::ptr::null_mut())
    }

    fn cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, version: i32, flags: u64, status: *mut i32) {
        get_proc_address(symbol, pfn, version, flags, status)
    }
}
