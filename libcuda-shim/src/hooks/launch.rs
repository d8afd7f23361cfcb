//! The kernel launch family, hooked for the compute limiter: cuLaunchKernel(_ptsz),
//! cuLaunchKernelEx(_ptsz), cuLaunchCooperativeKernel(_ptsz),
//! cuLaunchCooperativeKernelMultiDevice, the legacy cuLaunch, cuLaunchGrid and
//! cuLaunchGridAsync, and cuGraphLaunch(_ptsz) (a graph is costed as one unit, so graphs
//! are no escape from the limit). Signatures are the driver API's (`cuda.h`; the launch
//! structs are `vgpu_abi`'s). With no compute limit each hook is one atomic load and a
//! branch in front of the real call.

use std::ffi::{c_int, c_uint, c_void};

use crate::cuda::*;
use crate::hook;
use crate::limiter::{self, Target, Work};

fn on(stream: CUstream) -> Target {
    Target {
        stream,
        per_thread: false,
    }
}

fn on_per_thread(stream: CUstream) -> Target {
    Target {
        stream,
        per_thread: true,
    }
}

/// The stream of a `CUlaunchConfig`, null (the caller's default) when there is none.
fn config_stream(config: *const CUlaunchConfig) -> CUstream {
    // SAFETY: the caller passes a valid config or null (which the real call rejects).
    unsafe { config.as_ref() }
        .map(|config| config.stream)
        .unwrap_or(std::ptr::null_mut())
}

/// The grid of a `CUlaunchConfig`, one block when there is none (the real call rejects
/// a null config).
fn config_grid(config: *const CUlaunchConfig) -> [c_uint; 3] {
    // SAFETY: the caller passes a valid config or null.
    unsafe { config.as_ref() }
        .map(|config| config.grid_dim)
        .unwrap_or([1, 1, 1])
}

/// The grid of the legacy cuLaunchGrid calls (a negative size, which the real call
/// rejects, as one block).
fn legacy_grid(width: c_int, height: c_int) -> [c_uint; 3] {
    [width.max(1) as c_uint, height.max(1) as c_uint, 1]
}

hook! {
    fn cuLaunchKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void) -> CUresult |forward| {
        limiter::launch(Work::kernel(f as usize, [gx, gy, gz]), on(stream), forward)
    }
}

hook! {
    fn cuLaunchKernel_ptsz(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void) -> CUresult |forward| {
        limiter::launch(Work::kernel(f as usize, [gx, gy, gz]), on_per_thread(stream), forward)
    }
}

hook! {
    fn cuLaunchKernelEx(config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void) -> CUresult |forward| {
        limiter::launch(Work::kernel(f as usize, config_grid(config)), on(config_stream(config)), forward)
    }
}

hook! {
    fn cuLaunchKernelEx_ptsz(config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void) -> CUresult |forward| {
        limiter::launch(Work::kernel(f as usize, config_grid(config)), on_per_thread(config_stream(config)), forward)
    }
}

hook! {
    fn cuLaunchCooperativeKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, stream: CUstream, params: *mut *mut c_void) -> CUresult |forward| {
        limiter::launch(Work::kernel(f as usize, [gx, gy, gz]), on(stream), forward)
    }
}

hook! {
    fn cuLaunchCooperativeKernel_ptsz(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, stream: CUstream, params: *mut *mut c_void) -> CUresult |forward| {
        limiter::launch(Work::kernel(f as usize, [gx, gy, gz]), on_per_thread(stream), forward)
    }
}

hook! {
    fn cuLaunchCooperativeKernelMultiDevice(list: *mut CudaLaunchParams, devices: c_uint, flags: c_uint) -> CUresult |forward| {
        // One launch over several devices and streams: throttled, not bracketed.
        limiter::throttle_only(forward)
    }
}

hook! {
    fn cuLaunch(f: CUfunction) -> CUresult |forward| {
        limiter::launch(Work::kernel(f as usize, [1, 1, 1]), on(std::ptr::null_mut()), forward)
    }
}

hook! {
    fn cuLaunchGrid(f: CUfunction, width: c_int, height: c_int) -> CUresult |forward| {
        limiter::launch(Work::kernel(f as usize, legacy_grid(width, height)), on(std::ptr::null_mut()), forward)
    }
}

hook! {
    fn cuLaunchGridAsync(f: CUfunction, width: c_int, height: c_int, stream: CUstream) -> CUresult |forward| {
        limiter::launch(Work::kernel(f as usize, legacy_grid(width, height)), on(stream), forward)
    }
}

hook! {
    fn cuGraphLaunch(exec: CUgraphExec, stream: CUstream) -> CUresult |forward| {
        limiter::launch(Work::Graph(exec as usize), on(stream), forward)
    }
}

hook! {
    fn cuGraphLaunch_ptsz(exec: CUgraphExec, stream: CUstream) -> CUresult |forward| {
        limiter::launch(Work::Graph(exec as usize), on_per_thread(stream), forward)
    }
}
