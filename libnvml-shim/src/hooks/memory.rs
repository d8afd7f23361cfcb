//! Memory as the container sees it: total = its quota, used = what its processes hold
//! (`crate::usage`), free = total − used. BAR1 stays the card's.

use crate::devices::VisibleGpu;
use crate::ffi::{read_out, write_out};
use crate::hook;
use crate::nvml::*;
use crate::state::virtualize;

/// (total, used) for a visible device, or the error to return (`None`: the real
/// figures stand); `card_total` is the real total, used when the config sets no memory
/// limit.
fn virtual_memory(device: NvmlDevice, card_total: u64) -> Result<Option<(u64, u64)>, NvmlReturn> {
    virtualize(
        || Ok(None),
        |view| {
            let Some((_, visible)) = view.find(device) else {
                return Err(NVML_ERROR_INVALID_ARGUMENT);
            };
            let total = quota(visible, card_total);
            Ok(Some((total, view.used(visible).min(total))))
        },
    )
}

/// The memory a device shows the container: its quota, or the card's own.
fn quota(visible: &VisibleGpu, card_total: u64) -> u64 {
    visible.memory_limit.unwrap_or(card_total)
}

hook! {
    fn nvmlDeviceGetMemoryInfo(device: NvmlDevice, memory: *mut Memory) -> NvmlReturn |forward| {
        let result = forward();
        if result != NVML_SUCCESS {
            return result;
        }
        let Some(mut info) = read_out(memory) else { return result };
        match virtual_memory(device, info.total) {
            Ok(None) => NVML_SUCCESS,
            Ok(Some((total, used))) => {
                (info.total, info.used, info.free) = (total, used, total - used);
                write_out(memory, info);
                NVML_SUCCESS
            }
            Err(error) => error,
        }
    }
}

hook! {
    /// Keeps the caller's `version`; `reserved` is 0, since the quota reserves nothing
    /// (total = used + free + reserved holds).
    fn nvmlDeviceGetMemoryInfo_v2(device: NvmlDevice, memory: *mut MemoryV2) -> NvmlReturn |forward| {
        // The real call checks `version`.
        let result = forward();
        if result != NVML_SUCCESS {
            return result;
        }
        let Some(mut info) = read_out(memory) else { return result };
        match virtual_memory(device, info.total) {
            Ok(None) => NVML_SUCCESS,
            Ok(Some((total, used))) => {
                (info.total, info.reserved, info.used, info.free) = (total, 0, used, total - used);
                write_out(memory, info);
                NVML_SUCCESS
            }
            Err(error) => error,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_quota_is_the_total_unless_there_is_none() {
        let mut visible = VisibleGpu {
            handle: 1,
            region_index: 0,
            memory_limit: Some(4 << 30),
            core_limit: None,
        };
        assert_eq!(quota(&visible, 80 << 30), 4 << 30);
        visible.memory_limit = None;
        assert_eq!(quota(&visible, 80 << 30), 80 << 30);
    }
}
