//! The few CUDA driver API types and constants the hooks need, written from the
//! public `cuda.h` ABI.

#![allow(non_camel_case_types, dead_code)]

use std::ffi::c_void;

pub type CUresult = u32;
pub type CUdevice = i32;
pub type CUdeviceptr = u64;
pub type CUcontext = *mut c_void;
pub type CUstream = *mut c_void;
pub type CUarray = *mut c_void;
pub type CUmipmappedArray = *mut c_void;
pub type CUmemoryPool = *mut c_void;
pub type CUmemGenericAllocationHandle = u64;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
pub const CUDA_ERROR_NO_DEVICE: CUresult = 100;
pub const CUDA_ERROR_INVALID_DEVICE: CUresult = 101;
pub const CUDA_ERROR_INVALID_CONTEXT: CUresult = 201;
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
pub const CUDA_ERROR_NOT_SUPPORTED: CUresult = 801;
pub const CUDA_ERROR_UNKNOWN: CUresult = 999;

pub const CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: i32 = 33;
pub const CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: i32 = 34;
pub const CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: i32 = 50;

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct CUuuid {
    pub bytes: [u8; 16],
}

/// `CUarray_format` values and their element sizes in bytes.
pub fn array_format_bytes(format: u32) -> Option<u64> {
    Some(match format {
        0x01 | 0x08 => 1,        // UNSIGNED_INT8, SIGNED_INT8
        0x02 | 0x09 | 0x10 => 2, // UNSIGNED_INT16, SIGNED_INT16, HALF
        0x03 | 0x0a | 0x20 => 4, // UNSIGNED_INT32, SIGNED_INT32, FLOAT
        0x50..=0x54 => 1,        // UNORM_INT8X1.. and friends (per channel)
        0x55..=0x5a => 2,
        0xb0 => 1,        // NV12 (approximate: luma plane bytes)
        0x91..=0x9f => 1, // BC compressed formats: at most 1 byte per texel per channel
        _ => return None,
    })
}

/// `CUDA_ARRAY_DESCRIPTOR`.
#[repr(C)]
pub struct CudaArrayDescriptor {
    pub width: usize,
    pub height: usize,
    pub format: u32,
    pub num_channels: u32,
}

/// `CUDA_ARRAY3D_DESCRIPTOR`.
#[repr(C)]
pub struct CudaArray3dDescriptor {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: u32,
    pub num_channels: u32,
    pub flags: u32,
}

/// `CUmemAllocationProp` (only the leading fields we read).
#[repr(C)]
pub struct CUmemAllocationProp {
    pub kind: u32,
    pub requested_handle_types: u32,
    pub location_type: u32,
    pub location_id: i32,
    pub win32_handle_meta_data: *mut c_void,
    pub compression_type: u8,
    pub gpu_direct_rdma_capable: u8,
    pub usage: u16,
    pub reserved: [u8; 4],
}

pub const CU_MEM_LOCATION_TYPE_DEVICE: u32 = 1;
