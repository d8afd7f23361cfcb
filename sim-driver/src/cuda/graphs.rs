//! Stream capture and CUDA graphs, as much as the shims' limiter meets them.
//!
//! - `cuStreamBeginCapture(_v2)(_ptsz)` puts a stream in capture: kernels launched on it
//!   (and graphs launched on it) become nodes of the capture's graph instead of running;
//!   an event recorded on it is "captured" (querying it is `CUDA_ERROR_CAPTURED_EVENT`).
//!   `cuStreamIsCapturing(_ptsz)` reports the status, `cuStreamEndCapture(_ptsz)` hands
//!   out the graph (or `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`).
//! - "Potentially unsafe" calls (event and stream queries and synchronisation here) are
//!   forbidden on a capturing stream, to the capturing thread (unless the capture is
//!   relaxed), and to other threads while a global-mode capture runs; a thread in
//!   relaxed mode (`cuThreadExchangeStreamCaptureMode`) is only refused the first, a
//!   thread-local one not the last. A forbidden call returns
//!   `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and invalidates the capture, as the real
//!   driver does.
//! - `cuGraphInstantiate*` makes an executable graph; `cuGraphLaunch(_ptsz)` runs its
//!   kernels one after the other on the stream (graph nodes captured from one stream
//!   form a chain).

use std::cell::Cell;

pub use vgpu_abi::cuda::{
    CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_RELAXED, CU_STREAM_CAPTURE_STATUS_ACTIVE,
    CU_STREAM_CAPTURE_STATUS_INVALIDATED, CU_STREAM_CAPTURE_STATUS_NONE,
};

use super::errors::*;
use super::registry::{Registry, StreamKey};

// The sim's CUresult is the C `int` (`vgpu_abi` spells it unsigned).
pub const CUDA_ERROR_ILLEGAL_STATE: CUresult = vgpu_abi::cuda::CUDA_ERROR_ILLEGAL_STATE as CUresult;
pub const CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: CUresult =
    vgpu_abi::cuda::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED as CUresult;
pub const CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: CUresult =
    vgpu_abi::cuda::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED as CUresult;
pub const CUDA_ERROR_CAPTURED_EVENT: CUresult =
    vgpu_abi::cuda::CUDA_ERROR_CAPTURED_EVENT as CUresult;

thread_local! {
    /// The calling thread's capture mode (`cuThreadExchangeStreamCaptureMode`).
    static THREAD_MODE: Cell<u32> = const { Cell::new(CU_STREAM_CAPTURE_MODE_GLOBAL) };
}

/// One kernel of a graph: its duration and the blocks it launches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Node {
    pub duration_ns: u64,
    pub blocks: u64,
}

/// A stream's capture under way.
#[derive(Debug)]
pub struct Capture {
    pub mode: u32,
    pub thread: u64,
    pub invalidated: bool,
    pub nodes: Vec<Node>,
}

/// Swaps the calling thread's capture mode.
pub fn exchange_thread_mode(mode: u32) -> Result<u32, CUresult> {
    if mode > CU_STREAM_CAPTURE_MODE_RELAXED {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(THREAD_MODE.with(|cell| cell.replace(mode)))
}

impl Registry {
    pub fn begin_capture(&mut self, key: StreamKey, mode: u32) -> Result<(), CUresult> {
        if mode > CU_STREAM_CAPTURE_MODE_RELAXED {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if matches!(key, StreamKey::Legacy(_)) {
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        if self.captures.contains_key(&key) {
            return Err(CUDA_ERROR_ILLEGAL_STATE);
        }
        self.captures.insert(
            key,
            Capture {
                mode,
                thread: super::thread_id(),
                invalidated: false,
                nodes: Vec::new(),
            },
        );
        Ok(())
    }

    pub fn capture_status(&self, key: StreamKey) -> u32 {
        match self.captures.get(&key) {
            None => CU_STREAM_CAPTURE_STATUS_NONE,
            Some(capture) if capture.invalidated => CU_STREAM_CAPTURE_STATUS_INVALIDATED,
            Some(_) => CU_STREAM_CAPTURE_STATUS_ACTIVE,
        }
    }

    /// Ends the capture on `key`: the new graph's handle.
    pub fn end_capture(&mut self, key: StreamKey) -> Result<u64, CUresult> {
        let capture = self.captures.remove(&key).ok_or(CUDA_ERROR_ILLEGAL_STATE)?;
        if capture.invalidated {
            return Err(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
        }
        let graph = self.handle(super::registry::TAG_GRAPH);
        self.graphs.insert(graph, capture.nodes);
        Ok(graph)
    }

    /// Adds nodes to the capture on `key`; false when the stream is not capturing.
    pub fn capture_nodes(&mut self, key: StreamKey, nodes: &[Node]) -> bool {
        match self.captures.get_mut(&key) {
            Some(capture) => {
                capture.nodes.extend_from_slice(nodes);
                true
            }
            None => false,
        }
    }

    /// Checks a "potentially unsafe" call on `key` (None: not about one stream) against
    /// the captures under way; a forbidden call invalidates them and fails.
    pub fn check_unsafe_call(&mut self, key: Option<StreamKey>) -> Result<(), CUresult> {
        let mode = THREAD_MODE.with(|cell| cell.get());
        let me = super::thread_id();
        let mut forbidden = false;
        for (captured, capture) in self.captures.iter_mut() {
            let on_it = key == Some(*captured);
            let own = capture.thread == me && capture.mode != CU_STREAM_CAPTURE_MODE_RELAXED;
            let global_elsewhere = capture.thread != me
                && capture.mode == CU_STREAM_CAPTURE_MODE_GLOBAL
                && mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
            if on_it || (mode != CU_STREAM_CAPTURE_MODE_RELAXED && (own || global_elsewhere)) {
                capture.invalidated = true;
                forbidden = true;
            }
        }
        if forbidden {
            Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
        } else {
            Ok(())
        }
    }

    pub fn instantiate(&mut self, graph: u64) -> Result<u64, CUresult> {
        let nodes = self
            .graphs
            .get(&graph)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?
            .clone();
        let exec = self.handle(super::registry::TAG_GRAPH_EXEC);
        self.graph_execs.insert(exec, nodes);
        Ok(exec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_modes_swap_and_are_checked() {
        assert_eq!(
            exchange_thread_mode(CU_STREAM_CAPTURE_MODE_RELAXED),
            Ok(CU_STREAM_CAPTURE_MODE_GLOBAL)
        );
        assert_eq!(
            exchange_thread_mode(CU_STREAM_CAPTURE_MODE_GLOBAL),
            Ok(CU_STREAM_CAPTURE_MODE_RELAXED)
        );
        assert_eq!(exchange_thread_mode(7), Err(CUDA_ERROR_INVALID_VALUE));
    }
}
