//! The NVML facts the hooks use: all of them come from `vgpu-abi`, the one place that
//! pins them to `nvml.h`.

pub use vgpu_abi::nvml::*;
