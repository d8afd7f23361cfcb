//! What the entry points of every family share: the `cuda!` macro that exports a body as a
//! panic-guarded C function, the result type of a body, out-pointer writes and the
//! device and current-context lookups most calls begin with.

use crate::config::GpuSpec;
use crate::cuda::errors::*;
use crate::cuda::{current_context, with_registry};
use crate::ffi::write_out;

/// What an entry point's body returns: `Err` carries the `CUresult` to answer.
pub(super) type Res = Result<(), CUresult>;

/// The `CUresult` of a body's result.
pub(super) fn finish(result: Res) -> CUresult {
    match result {
        Ok(()) => CUDA_SUCCESS,
        Err(code) => code,
    }
}

/// Exports each `fn name(args) { body }` as `#[no_mangle] extern "C" fn name(args) ->
/// CUresult`, the body running under `ffi::guard` (a panic answers CUDA_ERROR_UNKNOWN).
macro_rules! cuda {
    ($( $(#[$meta:meta])* fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) $body:block )*) => {
        $(
            $(#[$meta])*
            #[unsafe(no_mangle)]
            pub extern "C" fn $name($($arg: $ty),*) -> $crate::cuda::errors::CUresult {
                fn body($($arg: $ty),*) -> $crate::cuda::api::support::Res { $body }
                $crate::ffi::guard($crate::cuda::errors::CUDA_ERROR_UNKNOWN, || {
                    $crate::cuda::api::support::finish(body($($arg),*))
                })
            }
        )*
    };
}
pub(super) use cuda;

/// The spec of device ordinal `dev` (INVALID_DEVICE when out of range; NOT_INITIALIZED before cuInit).
pub(super) fn device(dev: i32) -> Result<(usize, &'static GpuSpec), CUresult> {
    with_registry(|registry| {
        let sim = registry.sim;
        usize::try_from(dev)
            .ok()
            .and_then(|index| sim.config.gpus.get(index).map(|spec| (index, spec)))
            .ok_or(CUDA_ERROR_INVALID_DEVICE)
    })
}

/// Writes `value` through an out-pointer; INVALID_VALUE when it is NULL.
pub(super) fn out<T>(ptr: *mut T, value: T) -> Res {
    if write_out(ptr, value) {
        Ok(())
    } else {
        Err(CUDA_ERROR_INVALID_VALUE)
    }
}

/// The calling thread's current context; INVALID_CONTEXT when there is none (or it was destroyed).
pub(super) fn require_current() -> Result<u64, CUresult> {
    let ctx = current_context().ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
    with_registry(|registry| registry.context(ctx).map(|_| ctx))
}
