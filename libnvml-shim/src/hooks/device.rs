//! Device visibility: only the container's devices, renumbered from 0 in config order.
//! Handles to other GPUs, however they are looked up, are refused with
//! NVML_ERROR_NOT_FOUND.

use std::ffi::{c_char, c_void};

use crate::hook;
use crate::nvml::*;
use crate::state::view;

/// The number of visible devices, after the real call proved NVML is initialised.
fn visible_count(count: *mut u32, real_result: NvmlReturn) -> NvmlReturn {
    match view() {
        Ok(None) => real_result,
        Err(()) => {
            if real_result == NVML_SUCCESS && !count.is_null() {
                // SAFETY: non-null out-pointer the real call just wrote.
                unsafe { *count = 0 };
            }
            real_result
        }
        Ok(Some(view)) => {
            if real_result != NVML_SUCCESS {
                return real_result;
            }
            let visible = view.devices().map_or(0, <[_]>::len);
            // SAFETY: the real call succeeded, so `count` is a valid out-pointer.
            unsafe { *count = visible as u32 };
            NVML_SUCCESS
        }
    }
}

hook! {
    fn nvmlDeviceGetCount_v2(count: *mut u32) -> NvmlReturn |real| {
        // SAFETY: forwarding the caller's arguments.
        visible_count(count, unsafe { real(count) })
    }
}

hook! {
    fn nvmlDeviceGetCount(count: *mut u32) -> NvmlReturn |real| {
        // SAFETY: forwarding the caller's arguments.
        visible_count(count, unsafe { real(count) })
    }
}

/// The handle of visible device `index`.
fn by_visible_index(
    index: u32,
    device: *mut NvmlDevice,
    real: impl FnOnce() -> NvmlReturn,
) -> NvmlReturn {
    match view() {
        Ok(None) => real(),
        Err(()) => NVML_ERROR_INVALID_ARGUMENT,
        Ok(Some(view)) => {
            if device.is_null() {
                return NVML_ERROR_INVALID_ARGUMENT;
            }
            let Some(devices) = view.devices() else {
                return NVML_ERROR_UNINITIALIZED;
            };
            match devices.get(index as usize) {
                Some(visible) => {
                    // SAFETY: checked non-null.
                    unsafe { *device = visible.handle as NvmlDevice };
                    NVML_SUCCESS
                }
                None => NVML_ERROR_INVALID_ARGUMENT,
            }
        }
    }
}

hook! {
    fn nvmlDeviceGetHandleByIndex_v2(index: u32, device: *mut NvmlDevice) -> NvmlReturn |real| {
        // SAFETY: forwarding the caller's arguments.
        by_visible_index(index, device, || unsafe { real(index, device) })
    }
}

hook! {
    fn nvmlDeviceGetHandleByIndex(index: u32, device: *mut NvmlDevice) -> NvmlReturn |real| {
        // SAFETY: forwarding the caller's arguments.
        by_visible_index(index, device, || unsafe { real(index, device) })
    }
}

/// Refuses a handle the real lookup found if the container may not see it.
fn only_visible(device: *mut NvmlDevice, result: NvmlReturn) -> NvmlReturn {
    match view() {
        Ok(None) => result,
        Err(()) => NVML_ERROR_NOT_FOUND,
        Ok(Some(view)) => {
            if result != NVML_SUCCESS {
                return result;
            }
            // SAFETY: the real call succeeded, so it wrote the handle.
            let handle = unsafe { *device };
            if view.find(handle).is_some() {
                NVML_SUCCESS
            } else {
                // SAFETY: as above; the caller must not keep a handle it may not use.
                unsafe { *device = std::ptr::null_mut() };
                NVML_ERROR_NOT_FOUND
            }
        }
    }
}

hook! {
    fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, device: *mut NvmlDevice) -> NvmlReturn |real| {
        // SAFETY: forwarding the caller's arguments.
        only_visible(device, unsafe { real(uuid, device) })
    }
}

hook! {
    fn nvmlDeviceGetHandleByUUIDV(uuid: *const c_void, device: *mut NvmlDevice) -> NvmlReturn |real| {
        // SAFETY: forwarding the caller's arguments.
        only_visible(device, unsafe { real(uuid, device) })
    }
}

hook! {
    fn nvmlDeviceGetHandleBySerial(serial: *const c_char, device: *mut NvmlDevice) -> NvmlReturn |real| {
        // SAFETY: forwarding the caller's arguments.
        only_visible(device, unsafe { real(serial, device) })
    }
}

hook! {
    fn nvmlDeviceGetHandleByPciBusId(bus_id: *const c_char, device: *mut NvmlDevice) -> NvmlReturn |real| {
        // SAFETY: forwarding the caller's arguments.
        only_visible(device, unsafe { real(bus_id, device) })
    }
}

hook! {
    fn nvmlDeviceGetHandleByPciBusId_v2(bus_id: *const c_char, device: *mut NvmlDevice) -> NvmlReturn |real| {
        // SAFETY: forwarding the caller's arguments.
        only_visible(device, unsafe { real(bus_id, device) })
    }
}

hook! {
    /// The container's index, not the host's.
    fn nvmlDeviceGetIndex(device: NvmlDevice, index: *mut u32) -> NvmlReturn |real| {
        match view() {
            // SAFETY: forwarding the caller's own arguments to the real function (or
            // writing through out-pointers the real call has just validated).
            Ok(None) => unsafe { real(device, index) },
            Err(()) => NVML_ERROR_INVALID_ARGUMENT,
            Ok(Some(view)) => match view.find(device) {
                Some((position, _)) if !index.is_null() => {
                    // SAFETY: checked non-null.
                    unsafe { *index = position as u32 };
                    NVML_SUCCESS
                }
                _ => NVML_ERROR_INVALID_ARGUMENT,
            },
        }
    }
}
