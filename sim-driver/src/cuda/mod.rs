//! The simulated CUDA driver API: the process-local registry behind a fork-safe lock,
//! the thread's context stack, and initialisation. The exported `cu*` entry points are
//! in `api`, `cuGetProcAddress`'s version rules in `procaddr`, the error table in `errors`,
//! SM occupancy of kernels in `schedule`, what a context's limits reserve in `limits`, stream capture and graphs in `graphs`.

pub mod api;
pub mod errors;
pub mod graphs;
pub mod limits;
pub mod procaddr;
pub mod registry;
pub mod schedule;

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

use errors::*;
use registry::Registry;

use crate::sync::SpinLock;

/// The process's CUDA state; None until `cuInit` succeeds (and again in a forked child).
static REGISTRY: SpinLock<Option<Registry>> = SpinLock::new(None);
static NEXT_THREAD_ID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// The thread's context stack; the top is the current context.
    static CONTEXT_STACK: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
    static THREAD_ID: u64 = NEXT_THREAD_ID.fetch_add(1, Ordering::Relaxed);
}

/// A small number naming the calling thread (for per-thread default streams).
pub fn thread_id() -> u64 {
    THREAD_ID.with(|id| *id)
}

/// The calling thread's current context.
pub fn current_context() -> Option<u64> {
    CONTEXT_STACK.with(|stack| stack.borrow().last().copied())
}

pub fn with_stack<R>(body: impl FnOnce(&mut Vec<u64>) -> R) -> R {
    CONTEXT_STACK.with(|stack| body(&mut stack.borrow_mut()))
}

/// Runs `body` with the registry locked; NOT_INITIALIZED before `cuInit`.
pub fn with_registry<R>(
    body: impl FnOnce(&mut Registry) -> Result<R, CUresult>,
) -> Result<R, CUresult> {
    let mut guard = REGISTRY.lock();
    match guard.as_mut() {
        Some(registry) => body(registry),
        None => Err(CUDA_ERROR_NOT_INITIALIZED),
    }
}

/// `cuInit`: loads the machine, claims the state slot and builds the registry once.
pub fn initialize() -> Result<(), CUresult> {
    register_fork_handlers();
    let sim = crate::sim().ok_or(CUDA_ERROR_NOT_INITIALIZED)?;
    let mut guard = REGISTRY.lock();
    if guard.is_some() {
        return Ok(());
    }
    let slot = crate::my_slot(sim).ok_or_else(|| {
        crate::log("all process slots of the simulated GPU state file are held by live processes");
        CUDA_ERROR_OUT_OF_MEMORY
    })?;
    sim.state.reclaim_dead();
    *guard = Some(Registry::new(sim, slot));
    Ok(())
}

extern "C" fn before_fork() {
    REGISTRY.raw_lock();
}

extern "C" fn after_fork_in_parent() {
    REGISTRY.raw_unlock();
}

extern "C" fn after_fork_in_child() {
    // The child is a new process: the parent's CUDA objects are not its own (as with a
    // real driver, it must call cuInit again), and it claims its own state slot. The
    // prepare handler took the lock, and only this thread exists in the child.
    let mut guard = REGISTRY.assume_locked();
    *guard = None;
    drop(guard);
    CONTEXT_STACK.with(|stack| stack.borrow_mut().clear());
    crate::forget_slot_after_fork();
}

fn register_fork_handlers() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: the handlers are plain extern "C" fns that live as long as the library
        // (linked with -z nodelete, so it is never unmapped).
        unsafe {
            libc::pthread_atfork(
                Some(before_fork),
                Some(after_fork_in_parent),
                Some(after_fork_in_child),
            )
        };
    });
}
