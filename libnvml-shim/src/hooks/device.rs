//! Device visibility: only the container's devices, renumbered from 0 in config order.
//! Handles to other GPUs, however they are looked up, are refused with
//! NVML_ERROR_NOT_FOUND.

use std::ffi::{c_char, c_void};

use crate::ffi::{read_out, write_out};
use crate::hook;
use crate::nvml::*;
use crate::state::{policy, virtualize};

/// The number of visible devices, after the real call proved NVML is initialised.
/// Failing closed, that number is 0.
fn visible_count(count: *mut u32, real_result: NvmlReturn) -> NvmlReturn {
    policy().decide(
        || {
            if real_result == NVML_SUCCESS {
                write_out(count, 0);
            }
            real_result
        },
        || real_result,
        |view| {
            if real_result != NVML_SUCCESS {
                return real_result;
            }
            write_out(count, view.devices().map_or(0, <[_]>::len) as u32);
            NVML_SUCCESS
        },
    )
}

hook! {
    fn nvmlDeviceGetCount_v2(count: *mut u32) -> NvmlReturn |forward| {
        visible_count(count, forward())
    }
}

hook! {
    fn nvmlDeviceGetCount(count: *mut u32) -> NvmlReturn |forward| {
        visible_count(count, forward())
    }
}

/// The handle of visible device `index`.
fn by_visible_index(
    index: u32,
    device: *mut NvmlDevice,
    forward: impl FnOnce() -> NvmlReturn,
) -> NvmlReturn {
    virtualize(forward, |view| {
        if device.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let Some(devices) = view.devices() else {
            return NVML_ERROR_UNINITIALIZED;
        };
        match devices.get(index as usize) {
            Some(visible) => {
                write_out(device, visible.handle as NvmlDevice);
                NVML_SUCCESS
            }
            None => NVML_ERROR_INVALID_ARGUMENT,
        }
    })
}

hook! {
    fn nvmlDeviceGetHandleByIndex_v2(index: u32, device: *mut NvmlDevice) -> NvmlReturn |forward| {
        by_visible_index(index, device, forward)
    }
}

hook! {
    fn nvmlDeviceGetHandleByIndex(index: u32, device: *mut NvmlDevice) -> NvmlReturn |forward| {
        by_visible_index(index, device, forward)
    }
}

/// Refuses a handle the real lookup found if the container may not see it (and clears
/// it: the caller must not keep a handle it may not use). Failing closed, no device is
/// found.
fn only_visible(device: *mut NvmlDevice, result: NvmlReturn) -> NvmlReturn {
    policy().decide(
        || NVML_ERROR_NOT_FOUND,
        || result,
        |view| {
            if result != NVML_SUCCESS {
                return result;
            }
            match read_out(device) {
                Some(handle) if view.find(handle).is_some() => NVML_SUCCESS,
                _ => {
                    write_out(device, std::ptr::null_mut());
                    NVML_ERROR_NOT_FOUND
                }
            }
        },
    )
}

hook! {
    fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, device: *mut NvmlDevice) -> NvmlReturn |forward| {
        only_visible(device, forward())
    }
}

hook! {
    fn nvmlDeviceGetHandleByUUIDV(uuid: *const c_void, device: *mut NvmlDevice) -> NvmlReturn |forward| {
        only_visible(device, forward())
    }
}

hook! {
    fn nvmlDeviceGetHandleBySerial(serial: *const c_char, device: *mut NvmlDevice) -> NvmlReturn |forward| {
        only_visible(device, forward())
    }
}

hook! {
    fn nvmlDeviceGetHandleByPciBusId(bus_id: *const c_char, device: *mut NvmlDevice) -> NvmlReturn |forward| {
        only_visible(device, forward())
    }
}

hook! {
    fn nvmlDeviceGetHandleByPciBusId_v2(bus_id: *const c_char, device: *mut NvmlDevice) -> NvmlReturn |forward| {
        only_visible(device, forward())
    }
}

hook! {
    /// The container's index, not the host's.
    fn nvmlDeviceGetIndex(device: NvmlDevice, index: *mut u32) -> NvmlReturn |forward| {
        virtualize(forward, |view| match view.find(device) {
            Some((position, _)) if write_out(index, position as u32) => NVML_SUCCESS,
            _ => NVML_ERROR_INVALID_ARGUMENT,
        })
    }
}
