//! Streams and events: creation, ordering, queries, synchronisation and timing (the
//! shim does not hook them, but for the synchronisation points in `hooks/pool.rs`).

use super::support::{Res, cuda, out, require_current};
use crate::clock::{now_ns, sleep_until};
use crate::cuda::errors::*;
use crate::cuda::registry::*;
use crate::cuda::{current_context, with_registry};

fn create_stream(out_stream: *mut u64, flags: u32, priority: i32) -> Res {
    if out_stream.is_null() || flags & !CU_STREAM_NON_BLOCKING != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let ctx = require_current()?;
    let handle = with_registry(|registry| {
        let handle = registry.handle(TAG_STREAM);
        registry.streams.insert(
            handle,
            Stream {
                ctx,
                flags,
                priority: priority.clamp(-5, 0),
                busy: 0,
            },
        );
        Ok(handle)
    })?;
    out(out_stream, handle)
}

fn destroy_stream(stream: u64) -> Res {
    with_registry(|registry| {
        registry
            .streams
            .remove(&stream)
            .map(|_| ())
            .ok_or(CUDA_ERROR_INVALID_HANDLE)
    })
}

fn stream_synchronize(stream: u64, per_thread: bool) -> Res {
    let current = current_context();
    let (deadline, device) = with_registry(|registry| {
        let (key, ctx) = registry.stream_key(stream, per_thread, current)?;
        registry.check_unsafe_call(Some(key))?;
        Ok((registry.ready_at(key), registry.context(ctx)?.device))
    })?;
    sleep_until(deadline);
    with_registry(|registry| {
        registry.release_pools_at_sync(device);
        Ok(())
    })
}

fn stream_query(stream: u64, per_thread: bool) -> Res {
    let current = current_context();
    with_registry(|registry| {
        let (key, _) = registry.stream_key(stream, per_thread, current)?;
        registry.check_unsafe_call(Some(key))?;
        if registry.ready_at(key) > now_ns() {
            Err(CUDA_ERROR_NOT_READY)
        } else {
            Ok(())
        }
    })
}

fn stream_wait_event(stream: u64, event: u64, flags: u32, per_thread: bool) -> Res {
    if flags & !1 != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let current = current_context();
    with_registry(|registry| {
        let (key, _) = registry.stream_key(stream, per_thread, current)?;
        let at = registry
            .events
            .get(&event)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?
            .at;
        if let Some(at) = at {
            registry.wait_until(key, at);
        }
        Ok(())
    })
}

fn record_event(event: u64, stream: u64, per_thread: bool) -> Res {
    crate::cuda::schedule::stall_before_record();
    let current = current_context();
    with_registry(|registry| {
        if !registry.events.contains_key(&event) {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        let (key, ctx) = registry.stream_key(stream, per_thread, current)?;
        // Recorded into a capture, the event becomes a graph node.
        let captured = registry.capture_nodes(key, &[]);
        let at = registry.event_fires_at(key, ctx);
        if !captured {
            registry.event_queued(key);
        }
        if let Some(e) = registry.events.get_mut(&event) {
            e.at = (!captured).then_some(at);
            e.captured = captured;
        }
        Ok(())
    })
}

/// When a recorded event completes (None: never recorded), for a query or a wait (both
/// "potentially unsafe" during a capture); a captured event never completes as such.
/// When `event` completes (`None`: never recorded) and its context.
fn event_completion(event: u64) -> Result<(Option<u64>, u64), CUresult> {
    with_registry(|registry| {
        registry.check_unsafe_call(None)?;
        match registry.events.get(&event) {
            Some(e) if e.captured => Err(crate::cuda::graphs::CUDA_ERROR_CAPTURED_EVENT),
            Some(e) => Ok((e.at, e.ctx)),
            None => Err(CUDA_ERROR_INVALID_HANDLE),
        }
    })
}

fn elapsed(ms: *mut f32, start: u64, end: u64) -> Res {
    if ms.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (a, b) = with_registry(|registry| {
        let first = registry
            .events
            .get(&start)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let second = registry.events.get(&end).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        if (first.flags | second.flags) & CU_EVENT_DISABLE_TIMING != 0 {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        match (first.at, second.at) {
            (Some(a), Some(b)) => Ok((a, b)),
            _ => Err(CUDA_ERROR_INVALID_HANDLE),
        }
    })?;
    if a.max(b) > now_ns() {
        return Err(CUDA_ERROR_NOT_READY);
    }
    out(ms, ((b as i128 - a as i128) as f64 / 1e6) as f32)
}

fn destroy_event(event: u64) -> Res {
    with_registry(|registry| {
        registry
            .events
            .remove(&event)
            .map(|_| ())
            .ok_or(CUDA_ERROR_INVALID_HANDLE)
    })
}

cuda! {
    fn cuStreamCreate(stream: *mut u64, flags: u32) { create_stream(stream, flags, 0) }
    fn cuStreamCreateWithPriority(stream: *mut u64, flags: u32, priority: i32) { create_stream(stream, flags, priority) }
    fn cuStreamDestroy(stream: u64) { destroy_stream(stream) }
    fn cuStreamDestroy_v2(stream: u64) { destroy_stream(stream) }
    fn cuStreamSynchronize(stream: u64) { stream_synchronize(stream, false) }
    fn cuStreamSynchronize_ptsz(stream: u64) { stream_synchronize(stream, true) }
    fn cuStreamQuery(stream: u64) { stream_query(stream, false) }
    fn cuStreamQuery_ptsz(stream: u64) { stream_query(stream, true) }
    fn cuStreamWaitEvent(stream: u64, event: u64, flags: u32) { stream_wait_event(stream, event, flags, false) }
    fn cuStreamWaitEvent_ptsz(stream: u64, event: u64, flags: u32) { stream_wait_event(stream, event, flags, true) }

    fn cuStreamGetPriority(stream: u64, priority: *mut i32) {
        let value = with_registry(|registry| Ok(registry.streams.get(&stream).map(|s| s.priority).unwrap_or(0)))?;
        out(priority, value)
    }

    fn cuStreamGetFlags(stream: u64, flags: *mut u32) {
        let value = with_registry(|registry| Ok(registry.streams.get(&stream).map(|s| s.flags).unwrap_or(0)))?;
        out(flags, value)
    }

    fn cuEventCreate(event: *mut u64, flags: u32) {
        // DEFAULT 0, BLOCKING_SYNC 1, DISABLE_TIMING 2, INTERPROCESS 4 (needs DISABLE_TIMING).
        if event.is_null() || flags & !0x7 != 0 || (flags & 0x4 != 0 && flags & CU_EVENT_DISABLE_TIMING == 0) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let ctx = require_current()?;
        let handle = with_registry(|registry| {
            let handle = registry.handle(TAG_EVENT);
            registry.events.insert(handle, Event { ctx, flags, at: None, captured: false });
            Ok(handle)
        })?;
        out(event, handle)
    }

    fn cuEventRecord(event: u64, stream: u64) { record_event(event, stream, false) }
    fn cuEventRecord_ptsz(event: u64, stream: u64) { record_event(event, stream, true) }

    fn cuEventRecordWithFlags(event: u64, stream: u64, flags: u32) {
        if flags & !1 != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        record_event(event, stream, false)
    }

    fn cuEventRecordWithFlags_ptsz(event: u64, stream: u64, flags: u32) {
        if flags & !1 != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        record_event(event, stream, true)
    }

    fn cuEventQuery(event: u64) {
        let (at, _) = event_completion(event)?;
        match at {
            Some(at) if at > now_ns() => Err(CUDA_ERROR_NOT_READY),
            _ => Ok(()),
        }
    }

    /// Waits for the event, then lets its device's pools release memory (a
    /// synchronisation point, as for streams and contexts).
    fn cuEventSynchronize(event: u64) {
        let (at, ctx) = event_completion(event)?;
        if let Some(at) = at {
            sleep_until(at);
        }
        with_registry(|registry| {
            if let Some(device) = registry.contexts.get(&ctx).map(|c| c.device) {
                registry.release_pools_at_sync(device);
            }
            Ok(())
        })
    }

    fn cuEventElapsedTime(ms: *mut f32, start: u64, end: u64) { elapsed(ms, start, end) }
    fn cuEventElapsedTime_v2(ms: *mut f32, start: u64, end: u64) { elapsed(ms, start, end) }
    fn cuEventDestroy(event: u64) { destroy_event(event) }
    fn cuEventDestroy_v2(event: u64) { destroy_event(event) }
}
