//! Device enumeration: the container sees only its configured devices, renumbered
//! from 0 in config order, each with its memory quota as its total memory.

use std::ffi::c_char;

use crate::cuda::*;
use crate::ffi::{read_out, write_out};
use crate::hook;
use crate::state::enforce;

hook! {
    /// Fails closed with CUDA_ERROR_NO_DEVICE when the config is unusable.
    fn cuInit(flags: u32) -> CUresult |forward| {
        enforce(forward, |_| forward())
    }
}

hook! {
    fn cuDeviceGetCount(count: *mut i32) -> CUresult |forward| {
        enforce(forward, |enforcer| {
            if count.is_null() {
                return CUDA_ERROR_INVALID_VALUE;
            }
            // The real call also tells us whether cuInit ran.
            let result = forward();
            if result != CUDA_SUCCESS {
                return result;
            }
            let visible = enforcer.devices().map_or(0, |devices| devices.len());
            write_out(count, visible as i32);
            CUDA_SUCCESS
        })
    }
}

hook! {
    fn cuDeviceGet(device: *mut CUdevice, ordinal: i32) -> CUresult |forward, real| {
        enforce(forward, |enforcer| {
            if device.is_null() {
                return CUDA_ERROR_INVALID_VALUE;
            }
            let mut probe = 0;
            // SAFETY: our own out-pointer and ordinal 0, to the real cuDeviceGet: it only
            // checks that the driver is initialised.
            let result = unsafe { real(&mut probe, 0) };
            if result == CUDA_ERROR_NOT_INITIALIZED {
                return result;
            }
            let devices = enforcer.devices().unwrap_or(&[]);
            match usize::try_from(ordinal).ok().and_then(|i| devices.get(i)) {
                Some(visible) => {
                    write_out(device, visible.handle);
                    CUDA_SUCCESS
                }
                None => CUDA_ERROR_INVALID_DEVICE,
            }
        })
    }
}

hook! {
    fn cuDeviceGetByPCIBusId(device: *mut CUdevice, pci_bus_id: *const c_char) -> CUresult |forward| {
        visible_only(forward(), device)
    }
}

/// Turns a successful lookup of a hidden device into CUDA_ERROR_INVALID_DEVICE.
fn visible_only(result: CUresult, device: *const CUdevice) -> CUresult {
    enforce(
        || result,
        |enforcer| {
            if result != CUDA_SUCCESS {
                return result;
            }
            match read_out(device) {
                Some(handle) if enforcer.visible(handle).is_some() => CUDA_SUCCESS,
                _ => CUDA_ERROR_INVALID_DEVICE,
            }
        },
    )
}

/// `forward` for a device the container may see, else CUDA_ERROR_INVALID_DEVICE.
fn if_visible(device: CUdevice, forward: impl FnOnce() -> CUresult + Copy) -> CUresult {
    enforce(forward, |enforcer| match enforcer.visible(device) {
        Some(_) => forward(),
        None => CUDA_ERROR_INVALID_DEVICE,
    })
}

hook! {
    fn cuDeviceGetUuid(uuid: *mut CUuuid, device: CUdevice) -> CUresult |forward| {
        if_visible(device, forward)
    }
}

hook! {
    fn cuDeviceGetUuid_v2(uuid: *mut CUuuid, device: CUdevice) -> CUresult |forward| {
        if_visible(device, forward)
    }
}

/// The cuDeviceTotalMem family: under the quota, the real call (to check the device and
/// the out-pointer), then `write` gets the quota of `device` in bytes.
fn quota_total(
    device: CUdevice,
    forward: impl FnOnce() -> CUresult + Copy,
    write: impl FnOnce(u64),
) -> CUresult {
    enforce(forward, |enforcer| {
        let result = forward();
        if result != CUDA_SUCCESS {
            return result;
        }
        match enforcer.visible(device) {
            Some(visible) => {
                write(visible.memory_limit);
                CUDA_SUCCESS
            }
            None => CUDA_ERROR_INVALID_DEVICE,
        }
    })
}

hook! {
    fn cuDeviceTotalMem_v2(bytes: *mut usize, device: CUdevice) -> CUresult |forward| {
        quota_total(device, forward, |limit| {
            write_out(bytes, limit as usize);
        })
    }
}

hook! {
    /// The pre-3.2 ABI with a 32-bit size.
    fn cuDeviceTotalMem(bytes: *mut u32, device: CUdevice) -> CUresult |forward| {
        quota_total(device, forward, |limit| {
            write_out(bytes, limit.min(u32::MAX as u64) as u32);
        })
    }
}
