//! CUDA arrays and mipmapped arrays, charged in the driver's 2 MiB units (the shim hooks
//! them in `hooks/memory.rs`).

use vgpu_abi::cuda::{
    ARRAY_CHARGE_GRANULARITY, CudaArray3dDescriptor, CudaArray3dDescriptorV1, CudaArrayDescriptor,
    CudaArrayDescriptorV1, array_bytes,
};

use super::support::{Res, cuda, out, require_current};
use crate::cuda::errors::*;
use crate::cuda::registry::*;
use crate::cuda::with_registry;
use crate::ffi::read_in;

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
