//! Device enumeration: the container sees only its configured devices, renumbered
//! from 0 in config order, each with its memory quota as its total memory.

use std::ffi::c_char;

use crate::cuda::*;
use crate::hook;
use crate::state::enforcer;

hook! {
    /// Fails closed with CUDA_ERROR_NO_DEVICE when the config is unusable.
    fn cuInit(flags: u32) -> CUresult |real| {
        if let Err(error) = enforcer() {
            return error;
        }
        // SAFETY: forwarding the caller's arguments.
        unsafe { real(flags) }
    }
}

hook! {
    fn cuDeviceGetCount(count: *mut i32) -> CUresult |real| {
        match enforcer() {
            Err(error) => error,
            // SAFETY: forwarding the caller's own arguments to the real function (or
            // writing through out-pointers the real call has just validated).
            Ok(None) => unsafe { real(count) },
            Ok(Some(enforcer)) => {
                if count.is_null() {
                    return CUDA_ERROR_INVALID_VALUE;
                }
                // SAFETY: forwarding; the real call also tells us whether cuInit ran.
                let result = unsafe { real(count) };
                if result != CUDA_SUCCESS {
                    return result;
                }
                let visible = enforcer.devices().map_or(0, |devices| devices.len());
                // SAFETY: checked non-null above.
                unsafe { *count = visible as i32 };
                CUDA_SUCCESS
            }
        }
    }
}

hook! {
    fn cuDeviceGet(device: *mut CUdevice, ordinal: i32) -> CUresult |real| {
        match enforcer() {
            Err(error) => error,
            // SAFETY: forwarding the caller's own arguments to the real function (or
            // writing through out-pointers the real call has just validated).
            Ok(None) => unsafe { real(device, ordinal) },
            Ok(Some(enforcer)) => {
                if device.is_null() {
                    return CUDA_ERROR_INVALID_VALUE;
                }
                let mut probe = 0;
                // SAFETY: ordinal 0 only checks that the driver is initialised.
                let result = unsafe { real(&mut probe, 0) };
                if result == CUDA_ERROR_NOT_INITIALIZED {
                    return result;
                }
                let devices = enforcer.devices().unwrap_or(&[]);
                match usize::try_from(ordinal).ok().and_then(|i| devices.get(i)) {
                    Some(visible) => {
                        // SAFETY: checked non-null above.
                        unsafe { *device = visible.real };
                        CUDA_SUCCESS
                    }
                    None => CUDA_ERROR_INVALID_DEVICE,
                }
            }
        }
    }
}

hook! {
    fn cuDeviceGetByPCIBusId(device: *mut CUdevice, pci_bus_id: *const c_char) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let result = unsafe { real(device, pci_bus_id) };
        visible_only(result, device)
    }
}

/// Turns a successful lookup of a hidden device into CUDA_ERROR_INVALID_DEVICE.
fn visible_only(result: CUresult, device: *const CUdevice) -> CUresult {
    match enforcer() {
        Err(error) => error,
        Ok(None) => result,
        Ok(Some(enforcer)) => {
            if result != CUDA_SUCCESS {
                return result;
            }
            // SAFETY: the real call succeeded, so it wrote the handle.
            let handle = unsafe { *device };
            if enforcer.visible(handle).is_some() {
                CUDA_SUCCESS
            } else {
                CUDA_ERROR_INVALID_DEVICE
            }
        }
    }
}

/// CUDA_ERROR_INVALID_DEVICE for a handle the container may not see.
pub(crate) fn check_visible(handle: CUdevice) -> Result<(), CUresult> {
    match enforcer()? {
        None => Ok(()),
        Some(enforcer) => enforcer
            .visible(handle)
            .map(|_| ())
            .ok_or(CUDA_ERROR_INVALID_DEVICE),
    }
}

hook! {
    fn cuDeviceGetUuid(uuid: *mut CUuuid, device: CUdevice) -> CUresult |real| {
        if let Err(error) = check_visible(device) {
            return error;
        }
        // SAFETY: forwarding the caller's arguments.
        unsafe { real(uuid, device) }
    }
}

hook! {
    fn cuDeviceGetUuid_v2(uuid: *mut CUuuid, device: CUdevice) -> CUresult |real| {
        if let Err(error) = check_visible(device) {
            return error;
        }
        // SAFETY: forwarding the caller's arguments.
        unsafe { real(uuid, device) }
    }
}

/// The quota of `device` in bytes, for the cuDeviceTotalMem family.
fn total_for(
    device: CUdevice,
    real_total: impl FnOnce() -> CUresult,
) -> Result<Option<u64>, CUresult> {
    match enforcer()? {
        None => {
            let result = real_total();
            if result == CUDA_SUCCESS {
                Ok(None)
            } else {
                Err(result)
            }
        }
        Some(enforcer) => {
            let result = real_total();
            if result != CUDA_SUCCESS {
                return Err(result);
            }
            enforcer
                .visible(device)
                .map(|visible| Some(visible.memory_limit))
                .ok_or(CUDA_ERROR_INVALID_DEVICE)
        }
    }
}

hook! {
    fn cuDeviceTotalMem_v2(bytes: *mut usize, device: CUdevice) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function (or
        // writing through out-pointers the real call has just validated).
        match total_for(device, || unsafe { real(bytes, device) }) {
            Err(error) => error,
            Ok(None) => CUDA_SUCCESS,
            Ok(Some(limit)) => {
                // SAFETY: the real call succeeded, so `bytes` is a valid out-pointer.
                unsafe { *bytes = limit as usize };
                CUDA_SUCCESS
            }
        }
    }
}

hook! {
    /// The pre-3.2 ABI with a 32-bit size.
    fn cuDeviceTotalMem(bytes: *mut u32, device: CUdevice) -> CUresult |real| {
        // SAFETY: forwarding the caller's own arguments to the real function (or
        // writing through out-pointers the real call has just validated).
        match total_for(device, || unsafe { real(bytes, device) }) {
            Err(error) => error,
            Ok(None) => CUDA_SUCCESS,
            Ok(Some(limit)) => {
                // SAFETY: the real call succeeded, so `bytes` is a valid out-pointer.
                unsafe { *bytes = limit.min(u32::MAX as u64) as u32 };
                CUDA_SUCCESS
            }
        }
    }
}
