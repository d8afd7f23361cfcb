//! The CUDA driver API facts the hooks use: all of them come from `vgpu-abi`, the one
//! place that pins them to `cuda.h`.

pub use vgpu_abi::cuda::*;
