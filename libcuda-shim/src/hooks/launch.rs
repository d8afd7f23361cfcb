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

hook! {
    fn cuLaunchKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void) -> CUresult |forward| {
        limiter::launch(Work::Kernel(f as usize), on(stream), forward)
    }
}

hook! {
    fn cuLaunchKernel_ptsz(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void) -> CUresult |forward| {
        limiter::launch(Work::Kernel(f as usize), on_per_thread(stream), forward)
    }
}

hook! {
    fn cuLaunchKernelEx(config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void) -> CUresult |forward| {
        limiter::launch(Work::Kernel(f as usize), on(config_stream(config)), forward)
    }
}

hook! {
    fn cuLaunchKernelEx_ptsz(config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void) -> CUresult |forward| {
        limiter::launch(Work::Kernel(f as usize), on_per_thread(config_stream(config)), forward)
    }
}

hook! {
    fn cuLaunchCooperativeKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, stream: CUstream, params: *mut *mut c_void) -> CUresult |forward| {
        limiter::launch(Work::Kernel(f as usize), on(stream), forward)
    }
}

hook! {
    fn cuLaunchCooperativeKernel_ptsz(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, stream: CUstream, params: *mut *mut c_void) -> CUresult |forward| {
        limiter::launch(Work::Kernel(f as usize), on_per_thread(stream), forward)
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
        limiter::launch(Work::Kernel(f as usize), on(std::ptr::null_mut()), forward)
    }
}

hook! {
    fn cuLaunchGrid(f: CUfunction, width: c_int, height: c_int) -> CUresult |forward| {
        limiter::launch(Work::Kernel(f as usize), on(std::ptr::null_mut()), forward)
    }
}

hook! {
    fn cuLaunchGridAsync(f: CUfunction, width: c_int, height: c_int, stream: CUstream) -> CUresult |forward| {
        limiter::launch(Work::Kernel(f as usize), on(stream), forward)
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
