//! Kernel and graph launches: each one occupies its stream for its duration and is
//! recorded as busy time on its card (as in the shim's `hooks/launch.rs`). A launch
//! first takes what the driver reserves lazily (`cuda::limits`): a launched kernel's
//! library data, and the heap and printf FIFO set since the context's last launch.

use std::ffi::c_void;

use super::support::{Res, cuda};
use crate::clock::now_ns;
use crate::cuda::errors::*;
use crate::cuda::registry::*;
use crate::cuda::{current_context, with_registry};
use crate::ffi::read_in;

/// The function a launch names: a CUfunction, or a CUkernel (resolved in the current context).
fn launch_function(
    registry: &mut Registry,
    handle: u64,
    ctx: u64,
) -> Result<(String, u64), CUresult> {
    match tag_of(handle) {
        TAG_FUNCTION => {
            let function = registry
                .functions
                .get(&handle)
                .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
            Ok((function.name.clone(), function.duration_ns))
        }
        TAG_KERNEL => {
            let kernel = registry
                .kernels
                .get(&handle)
                .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
            let (name, duration_ns, library) =
                (kernel.name.clone(), kernel.duration_ns, kernel.library);
            // A kernel launched as such is loaded into the context at its first launch.
            registry.load_library_data(library, ctx)?;
            Ok((name, duration_ns))
        }
        _ => Err(CUDA_ERROR_INVALID_HANDLE),
    }
}

/// Validates and queues one launch; the kernel occupies its stream for its duration.
fn launch(
    function: u64,
    grid: [u32; 3],
    block: [u32; 3],
    shared: u32,
    stream: u64,
    per_thread: bool,
    cooperative: bool,
) -> Res {
    crate::cuda::schedule::spend_launch_call();
    let current = current_context();
    with_registry(|registry| {
        let (key, ctx) = registry.stream_key(stream, per_thread, current)?;
        let (name, duration) = launch_function(registry, function, ctx)?;
        if grid.contains(&0) || block.contains(&0) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if block[0] > 1024
            || block[1] > 1024
            || block[2] > 64
            || grid[1] > 65535
            || grid[2] > 65535
            || grid[0] > i32::MAX as u32
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let threads = block.iter().map(|d| *d as u64).product::<u64>();
        if threads > 1024 || shared > 232_448 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let device = registry.context(ctx)?.device;
        // The heap and printf FIFO set since the last launch are reserved now, and local
        // memory past the stack limit is grown for every resident thread.
        registry.reserve_for_launch(ctx)?;
        registry.grow_local_memory(ctx, super::modules::local_bytes_of(&name))?;
        if cooperative {
            let blocks = grid.iter().map(|d| *d as u64).product::<u64>();
            let per_sm = (2048 / threads).clamp(1, 32);
            if blocks > registry.sim.config.gpus[device].sms as u64 * per_sm {
                return Err(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE);
            }
        }
        let blocks = grid.iter().map(|d| *d as u64).product::<u64>();
        if registry.capture_nodes(
            key,
            &[crate::cuda::graphs::Node {
                duration_ns: duration,
                blocks,
            }],
        ) {
            return Ok(());
        }
        let now = now_ns();
        let (start, end) = registry.enqueue_kernel(key, device, duration, blocks);
        registry
            .sim
            .state
            .record_busy(registry.slot, device, start, end, now);
        Ok(())
    })
}

/// Runs a graph's kernels one after the other on the stream (or captures them).
fn graph_launch(exec: u64, stream: u64, per_thread: bool) -> Res {
    crate::cuda::schedule::spend_launch_call();
    let current = current_context();
    with_registry(|registry| {
        let nodes = registry
            .graph_execs
            .get(&exec)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?
            .clone();
        let (key, ctx) = registry.stream_key(stream, per_thread, current)?;
        if registry.capture_nodes(key, &nodes) {
            return Ok(());
        }
        let device = registry.context(ctx)?.device;
        for node in nodes {
            let now = now_ns();
            let (start, end) = registry.enqueue_kernel(key, device, node.duration_ns, node.blocks);
            registry
                .sim
                .state
                .record_busy(registry.slot, device, start, end, now);
        }
        Ok(())
    })
}

/// `CUlaunchConfig`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct LaunchConfig {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem_bytes: u32,
    pub stream: u64,
    pub attrs: *mut c_void,
    pub num_attrs: u32,
}
const _: () = assert!(std::mem::size_of::<LaunchConfig>() == 56);

fn launch_ex(config: *const LaunchConfig, function: u64, per_thread: bool) -> Res {
    let c = read_in(config).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if c.num_attrs > 0 && c.attrs.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    launch(
        function,
        c.grid,
        c.block,
        c.shared_mem_bytes,
        c.stream,
        per_thread,
        false,
    )
}

cuda! {
    fn cuGraphLaunch(exec: u64, stream: u64) { graph_launch(exec, stream, false) }
    fn cuGraphLaunch_ptsz(exec: u64, stream: u64) { graph_launch(exec, stream, true) }

    fn cuLaunchKernel(f: u64, gx: u32, gy: u32, gz: u32, bx: u32, by: u32, bz: u32, shared: u32, stream: u64, params: *mut *mut c_void, extra: *mut *mut c_void) {
        let _ = (params, extra);
        launch(f, [gx, gy, gz], [bx, by, bz], shared, stream, false, false)
    }

    fn cuLaunchKernel_ptsz(f: u64, gx: u32, gy: u32, gz: u32, bx: u32, by: u32, bz: u32, shared: u32, stream: u64, params: *mut *mut c_void, extra: *mut *mut c_void) {
        let _ = (params, extra);
        launch(f, [gx, gy, gz], [bx, by, bz], shared, stream, true, false)
    }

    fn cuLaunchCooperativeKernel(f: u64, gx: u32, gy: u32, gz: u32, bx: u32, by: u32, bz: u32, shared: u32, stream: u64, params: *mut *mut c_void) {
        let _ = params;
        launch(f, [gx, gy, gz], [bx, by, bz], shared, stream, false, true)
    }

    fn cuLaunchCooperativeKernel_ptsz(f: u64, gx: u32, gy: u32, gz: u32, bx: u32, by: u32, bz: u32, shared: u32, stream: u64, params: *mut *mut c_void) {
        let _ = params;
        launch(f, [gx, gy, gz], [bx, by, bz], shared, stream, true, true)
    }

    fn cuLaunchKernelEx(config: *const LaunchConfig, f: u64, params: *mut *mut c_void, extra: *mut *mut c_void) {
        let _ = (params, extra);
        launch_ex(config, f, false)
    }

    fn cuLaunchKernelEx_ptsz(config: *const LaunchConfig, f: u64, params: *mut *mut c_void, extra: *mut *mut c_void) {
        let _ = (params, extra);
        launch_ex(config, f, true)
    }
}
