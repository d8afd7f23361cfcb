//! Memory as the container sees it: total = its quota, used = what its processes hold
//! in the usage region, free = total − used. BAR1 stays the card's.

use crate::hook;
use crate::nvml::*;
use crate::state::{VisibleGpu, view};

/// (total, used) for a visible device, or the error to return; `card_total` is the
/// real total, used when the config sets no memory limit.
fn virtual_memory(device: NvmlDevice, card_total: u64) -> Result<Option<(u64, u64)>, NvmlReturn> {
    match view() {
        Ok(None) => Ok(None),
        Err(()) => Err(NVML_ERROR_INVALID_ARGUMENT),
        Ok(Some(view)) => {
            let Some((_, visible)) = view.find(device) else {
                return Err(NVML_ERROR_INVALID_ARGUMENT);
            };
            let total = quota(visible, card_total);
            Ok(Some((total, view.used(visible).min(total))))
        }
    }
}

fn quota(visible: &VisibleGpu, card_total: u64) -> u64 {
    visible.memory_limit.unwrap_or(card_total)
}

hook! {
    fn nvmlDeviceGetMemoryInfo(device: NvmlDevice, memory: *mut Memory) -> NvmlReturn |real| {
        // SAFETY: forwarding the caller's arguments.
        let result = unsafe { real(device, memory) };
        if result != NVML_SUCCESS {
            return result;
        }
        // SAFETY: the real call succeeded, so `memory` is valid.
        let memory = unsafe { &mut *memory };
        match virtual_memory(device, memory.total) {
            Ok(None) => NVML_SUCCESS,
            Ok(Some((total, used))) => {
                (memory.total, memory.used, memory.free) = (total, used, total - used);
                NVML_SUCCESS
            }
            Err(error) => error,
        }
    }
}

hook! {
    /// Keeps the caller's `version`; `reserved` is 0, since the quota reserves nothing
    /// (total = used + free + reserved holds).
    fn nvmlDeviceGetMemoryInfo_v2(device: NvmlDevice, memory: *mut MemoryV2) -> NvmlReturn |real| {
        // SAFETY: forwarding the caller's arguments; the real call checks `version`.
        let result = unsafe { real(device, memory) };
        if result != NVML_SUCCESS {
            return result;
        }
        // SAFETY: the real call succeeded, so `memory` is valid.
        let memory = unsafe { &mut *memory };
        match virtual_memory(device, memory.total) {
            Ok(None) => NVML_SUCCESS,
            Ok(Some((total, used))) => {
                (memory.total, memory.reserved, memory.used, memory.free) = (total, 0, used, total - used);
                NVML_SUCCESS
            }
            Err(error) => error,
        }
    }
}
