//! Copies and sets (`cuMemcpy*`, `cuMemset*`): checked against the allocations and
//! ordered on their stream; they move no bytes (the shim does not hook them).

use std::ffi::c_void;

use super::support::{Res, cuda, require_current};
use crate::clock::sleep_until;
use crate::cuda::errors::*;
use crate::cuda::{current_context, with_registry};

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

cuda! {
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
