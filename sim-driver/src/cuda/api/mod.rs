//! The exported CUDA driver entry points (names and C signatures as in CUDA 13 `cuda.h`;
//! the unsuffixed legacy names keep their original 32-bit `CUdeviceptr_v1` / `unsigned
//! int` sizes). Opaque handles (`CUcontext`, `CUstream`, ...) are pointer-sized integers
//! here, which is the same C ABI on x86-64 and aarch64.
//!
//! Every body runs under `ffi::guard`, so a panic becomes CUDA_ERROR_UNKNOWN.
//!
//! One file per API family, named as the shim's `hooks/` files where the shim hooks that
//! family: `device`, `context`, `context_current`, `memory`, `vmm`, `pool`, `launch`, `limits`,
//! `capture`, `procaddress`; the families it does not hook have their own: `arrays`,
//! `copies`, `streams` (and events), `modules` (and libraries, kernels, functions),
//! `error_text`. `support` holds what they share. Everything is re-exported here, so
//! `api::cuInit` names the export whatever its file.

#![allow(non_snake_case, clippy::too_many_arguments, clippy::missing_safety_doc)]

mod support;

mod arrays;
mod capture;
mod context;
mod context_current;
mod copies;
mod device;
mod error_text;
mod launch;
mod limits;
mod memory;
mod modules;
mod pool;
mod procaddress;
mod streams;
mod vmm;

pub use arrays::*;
pub use capture::*;
pub use context::*;
pub use context_current::*;
pub use copies::*;
pub use device::*;
pub use error_text::*;
pub use launch::*;
pub use limits::*;
pub use memory::*;
pub use modules::*;
pub use pool::*;
pub use procaddress::*;
pub use streams::*;
pub use vmm::*;
