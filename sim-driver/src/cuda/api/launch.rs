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

/// How many times its named duration a kernel of `name` launched with `params` runs: a
/// kernel whose name has `_scaled_` in it (`k_scaled_100us`) runs its first parameter's
/// (a `u32`) times, at least once, as a real kernel's work follows its arguments (a loop
/// count) with the function and grid the same; any other, once.
fn times_of(name: &str, params: *mut *mut c_void) -> u64 {
    if !name.contains("_scaled_") || params.is_null() {
        return 1;
    }
    // SAFETY: the caller passes the kernel's parameter array; a `_scaled_` kernel's first
    // parameter is a `u32` (the sim's own test kernels, nothing else has the name).
    let first = unsafe { *params };
    if first.is_null() {
        return 1;
    }
    // SAFETY: as above.
    u64::from(unsafe { first.cast::<u32>().read_unaligned() }).max(1)
}

/// Validates and queues one launch; the kernel occupies its stream for its duration.
#[allow(clippy::too_many_arguments)]
fn launch(
    function: u64,
    grid: [u32; 3],
    block: [u32; 3],
    shared: u32,
    stream: u64,
    per_thread: bool,
    cooperative: bool,
    params: *mut *mut c_void,
) -> Res {
    crate::cuda::schedule::spend_launch_call();
    crate::cuda::schedule::spend_first_launch(function);
    let current = current_context();
    with_registry(|registry| {
        let (key, ctx) = registry.stream_key(stream, per_thread, current)?;
        let (name, duration) = launch_function(registry, function, ctx)?;
        let duration = duration.saturating_mul(times_of(&name, params));
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

fn launch_ex(
    config: *const LaunchConfig,
    function: u64,
    per_thread: bool,
    params: *mut *mut c_void,
) -> Res {
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
        params,
    )
}

cuda! {
    fn cuGraphLaunch(exec: u64, stream: u64) { graph_launch(exec, stream, false) }
    fn cuGraphLaunch_ptsz(exec: u64, stream: u64) { graph_launch(exec, stream, true) }

    fn cuLaunchKernel(f: u64, gx: u32, gy: u32, gz: u32, bx: u32, by: u32, bz: u32, shared: u32, stream: u64, params: *mut *mut c_void, extra: *mut *mut c_void) {
        let _ = extra;
        launch(f, [gx, gy, gz], [bx, by, bz], shared, stream, false, false, params)
    }

    fn cuLaunchKernel_ptsz(f: u64, gx: u32, gy: u32, gz: u32, bx: u32, by: u32, bz: u32, shared: u32, stream: u64, params: *mut *mut c_void, extra: *mut *mut c_void) {
        let _ = extra;
        launch(f, [gx, gy, gz], [bx, by, bz], shared, stream, true, false, params)
    }

    fn cuLaunchCooperativeKernel(f: u64, gx: u32, gy: u32, gz: u32, bx: u32, by: u32, bz: u32, shared: u32, stream: u64, params: *mut *mut c_void) {
        launch(f, [gx, gy, gz], [bx, by, bz], shared, stream, false, true, params)
    }

    fn cuLaunchCooperativeKernel_ptsz(f: u64, gx: u32, gy: u32, gz: u32, bx: u32, by: u32, bz: u32, shared: u32, stream: u64, params: *mut *mut c_void) {
        launch(f, [gx, gy, gz], [bx, by, bz], shared, stream, true, true, params)
    }

    fn cuLaunchKernelEx(config: *const LaunchConfig, f: u64, params: *mut *mut c_void, extra: *mut *mut c_void) {
        let _ = extra;
        launch_ex(config, f, false, params)
    }

    fn cuLaunchKernelEx_ptsz(config: *const LaunchConfig, f: u64, params: *mut *mut c_void, extra: *mut *mut c_void) {
        let _ = extra;
        launch_ex(config, f, true, params)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scaled_kernel_runs_its_first_arguments_times_its_work_and_no_other_does() {
        let mut times = 10u32;
        let mut params = [(&raw mut times).cast::<c_void>()];
        let params = params.as_mut_ptr();
        assert_eq!(times_of("k_scaled_100us", params), 10);
        assert_eq!(times_of("k_100us", params), 1, "not a scaled kernel");
        assert_eq!(times_of("k_scaled_100us", std::ptr::null_mut()), 1);
        let mut zero = 0u32;
        let mut params = [(&raw mut zero).cast::<c_void>()];
        assert_eq!(
            times_of("k_scaled_100us", params.as_mut_ptr()),
            1,
            "at least once"
        );
        let mut params = [std::ptr::null_mut::<c_void>()];
        assert_eq!(times_of("k_scaled_100us", params.as_mut_ptr()), 1);
    }
}
