//! The hooked NVML exports. Every `fn nvml...(` in this folder is an export the
//! generator will not give a trampoline; everything else forwards unchanged.

pub mod device;
pub mod errors;
pub mod memory;
pub mod process;
pub mod utilization;
