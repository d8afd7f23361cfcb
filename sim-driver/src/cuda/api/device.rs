//! Initialisation, the driver version and the devices: `cuInit`, `cuDriverGetVersion`,
//! `cuDeviceGet*` and `cuDeviceTotalMem*`, with the attribute table of the simulated card
//! (as in the shim's `hooks/device.rs`).

use std::ffi::c_char;

use super::support::{cuda, device, out};
use crate::config::{GpuSpec, canonical_pci_bus_id};
use crate::cuda::errors::*;
use crate::cuda::with_registry;
use crate::ffi::{c_str, copy_c_string_truncated};

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

cuda! {
    fn cuInit(flags: u32) {
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        crate::cuda::initialize()
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
}
