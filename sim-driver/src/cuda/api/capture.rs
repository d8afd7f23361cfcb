//! Stream capture and the graphs it makes (instantiation and destruction); the logic is
//! in `cuda::graphs` (as in the shim's `hooks/capture.rs`; graph launches are in `launch`).

use std::ffi::c_char;

use super::support::{Res, cuda, out};
use crate::cuda::errors::*;
use crate::cuda::{current_context, with_registry};
use crate::ffi::read_in;

fn begin_capture(stream: u64, mode: u32, per_thread: bool) -> Res {
    let current = current_context();
    with_registry(|registry| {
        let (key, _) = registry.stream_key(stream, per_thread, current)?;
        registry.begin_capture(key, mode)
    })
}

fn end_capture(stream: u64, graph: *mut u64, per_thread: bool) -> Res {
    if graph.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let current = current_context();
    let made = with_registry(|registry| {
        let (key, _) = registry.stream_key(stream, per_thread, current)?;
        registry.end_capture(key)
    });
    out(graph, made.unwrap_or(0))?;
    made.map(|_| ())
}

fn is_capturing(stream: u64, status: *mut u32, per_thread: bool) -> Res {
    let current = current_context();
    let value = with_registry(|registry| {
        let (key, _) = registry.stream_key(stream, per_thread, current)?;
        Ok(registry.capture_status(key))
    })?;
    out(status, value)
}

fn instantiate(exec: *mut u64, graph: u64) -> Res {
    if exec.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let made = with_registry(|registry| registry.instantiate(graph))?;
    out(exec, made)
}

cuda! {
    fn cuStreamBeginCapture(stream: u64) { begin_capture(stream, crate::cuda::graphs::CU_STREAM_CAPTURE_MODE_GLOBAL, false) }
    fn cuStreamBeginCapture_ptsz(stream: u64) { begin_capture(stream, crate::cuda::graphs::CU_STREAM_CAPTURE_MODE_GLOBAL, true) }
    fn cuStreamBeginCapture_v2(stream: u64, mode: u32) { begin_capture(stream, mode, false) }
    fn cuStreamBeginCapture_v2_ptsz(stream: u64, mode: u32) { begin_capture(stream, mode, true) }
    fn cuStreamEndCapture(stream: u64, graph: *mut u64) { end_capture(stream, graph, false) }
    fn cuStreamEndCapture_ptsz(stream: u64, graph: *mut u64) { end_capture(stream, graph, true) }
    fn cuStreamIsCapturing(stream: u64, status: *mut u32) { is_capturing(stream, status, false) }
    fn cuStreamIsCapturing_ptsz(stream: u64, status: *mut u32) { is_capturing(stream, status, true) }

    fn cuThreadExchangeStreamCaptureMode(mode: *mut u32) {
        let wanted = read_in(mode).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let previous = crate::cuda::graphs::exchange_thread_mode(wanted)?;
        out(mode, previous)
    }

    fn cuGraphInstantiate(exec: *mut u64, graph: u64, error_node: *mut u64, log: *mut c_char, log_size: usize) {
        let _ = (error_node, log, log_size);
        instantiate(exec, graph)
    }

    fn cuGraphInstantiate_v2(exec: *mut u64, graph: u64, error_node: *mut u64, log: *mut c_char, log_size: usize) {
        let _ = (error_node, log, log_size);
        instantiate(exec, graph)
    }

    fn cuGraphInstantiateWithFlags(exec: *mut u64, graph: u64, flags: u64) {
        let _ = flags;
        instantiate(exec, graph)
    }

    fn cuGraphDestroy(graph: u64) {
        with_registry(|registry| registry.graphs.remove(&graph).map(|_| ()).ok_or(CUDA_ERROR_INVALID_VALUE))
    }

    fn cuGraphExecDestroy(exec: u64) {
        with_registry(|registry| registry.graph_execs.remove(&exec).map(|_| ()).ok_or(CUDA_ERROR_INVALID_VALUE))
    }
}
