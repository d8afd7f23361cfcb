//! This process's CUDA objects: contexts (primary and created), streams and their
//! simulated timelines, events, modules, functions, libraries and kernels, device
//! allocations with their address ranges, arrays, VMM handles, reservations and
//! mappings, and memory pools. One `Registry` behind one fork-safe lock; every device
//! byte it hands out is first reserved in the cross-process state file.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::errors::*;
use super::graphs::{Capture, Node};
use super::schedule::SmSchedule;
use crate::Sim;
use crate::clock::now_ns;
use crate::state::SlotIndex;

/// VMM and pool granularity, and the pool reservation step.
pub const GRANULARITY: u64 = 2 << 20;
/// The least a pool's reservation grows by.
pub const POOL_CHUNK: u64 = 32 << 20;
/// Alignment of `cuMemAlloc` results, and the rounding of what they are charged.
pub const ALLOC_ALIGN: u64 = 512;
pub const TAG_CONTEXT: u64 = 0x1;
pub const TAG_STREAM: u64 = 0x2;
pub const TAG_EVENT: u64 = 0x3;
pub const TAG_MODULE: u64 = 0x4;
pub const TAG_FUNCTION: u64 = 0x5;
pub const TAG_LIBRARY: u64 = 0x6;
pub const TAG_KERNEL: u64 = 0x7;
pub const TAG_POOL: u64 = 0x8;
pub const TAG_ARRAY: u64 = 0x9;
pub const TAG_MIPMAP: u64 = 0xa;
pub const TAG_VMM: u64 = 0xb;
pub const TAG_GRAPH: u64 = 0xc;
pub const TAG_GRAPH_EXEC: u64 = 0xd;
const TAG_SHIFT: u32 = 40;

/// Where device pointers of GPU `g` live: 1 TiB each from 32 TiB up.
const DEVICE_VA_BASE: u64 = 0x2000_0000_0000;
const DEVICE_VA_SPAN: u64 = 0x0100_0000_0000;
/// Where VMM reservations live.
const RESERVE_VA_BASE: u64 = 0x4000_0000_0000;
const RESERVE_VA_END: u64 = 0x6000_0000_0000;
/// Where the 32-bit (`CUdeviceptr_v1`) entry points allocate.
const LOW_VA_BASE: u64 = 0x4000_0000;
const LOW_VA_END: u64 = 0xF000_0000;

pub const CU_STREAM_LEGACY: u64 = 0x1;
pub const CU_STREAM_PER_THREAD: u64 = 0x2;
pub const CU_STREAM_NON_BLOCKING: u32 = 0x1;
pub const CU_EVENT_DISABLE_TIMING: u32 = 0x2;

/// The tag of a handle value (0 for foreign values).
pub fn tag_of(handle: u64) -> u64 {
    handle >> TAG_SHIFT
}

pub fn round_up(value: u64, to: u64) -> Option<u64> {
    value.checked_add(to - 1).map(|v| v / to * to)
}

pub struct Context {
    pub device: usize,
    pub flags: u32,
    pub primary: bool,
    /// False for a primary context while its device's refcount is zero.
    pub active: bool,
    pub overhead: u64,
    /// Its `CUlimit` values (`cuCtxSetLimit`), and what each has charged beyond the
    /// default (`limits`).
    pub limits: super::limits::Limits,
    pub legacy_busy: u64,
    pub per_thread_busy: HashMap<u64, u64>,
}

pub struct Stream {
    pub ctx: u64,
    pub flags: u32,
    pub priority: i32,
    pub busy: u64,
}

pub struct Event {
    pub ctx: u64,
    pub flags: u32,
    /// The monotonic ns at which the work before the record completes.
    pub at: Option<u64>,
    /// Recorded into a stream capture (a graph node), so it never completes as such.
    pub captured: bool,
}

pub struct Module {
    pub ctx: u64,
    /// Device memory charged to the context's card: the loaded code
    /// (`module_overhead`), and its static data once loaded.
    pub charged: u64,
    /// The static data its image declares (`__device__` variables).
    pub static_bytes: u64,
    /// Whether the static data is loaded (at the load, or at first use when lazy).
    pub data_loaded: bool,
    /// The entry names the image declares; None when the image format hides them.
    pub entries: Option<HashSet<String>>,
    pub functions: HashMap<String, u64>,
}

pub struct Function {
    pub name: String,
    pub duration_ns: u64,
}

pub struct Library {
    pub entries: Option<HashSet<String>>,
    pub kernels: HashMap<String, u64>,
    /// The static data its image declares, loaded into each context that uses it.
    pub static_bytes: u64,
    /// The contexts it is loaded into: (context, device) with `static_bytes` charged.
    pub loaded_in: Vec<(u64, usize)>,
}

pub struct Kernel {
    /// The library it belongs to.
    pub library: u64,
    pub name: String,
    pub duration_ns: u64,
    /// One function per context it was fetched in.
    pub functions: HashMap<u64, u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllocKind {
    Device,
    Managed,
    /// From a memory pool (handle).
    Pool(u64),
    /// A VMM mapping of handle at offset.
    Mapped {
        handle: u64,
        offset: u64,
    },
    /// A 32-bit-pointer allocation of the legacy entry points.
    Low,
}

#[derive(Clone, Copy, Debug)]
pub struct Allocation {
    pub size: u64,
    pub charged: u64,
    pub device: usize,
    pub ctx: u64,
    pub kind: AllocKind,
    pub buffer_id: u64,
}

pub struct Array {
    pub device: usize,
    pub charged: u64,
    pub ctx: u64,
    /// width, height, depth, format, channels, flags as created.
    pub descriptor: [u64; 6],
}

pub struct VmmHandle {
    pub device: usize,
    pub size: u64,
    pub refs: u32,
    pub mappings: u32,
    pub prop: [u8; 32],
}

pub struct Pool {
    pub device: usize,
    pub reserved: u64,
    pub used: u64,
    pub release_threshold: u64,
    pub reserved_high: u64,
    pub used_high: u64,
    pub is_default: bool,
    /// REUSE_FOLLOW_EVENT_DEPENDENCIES, REUSE_ALLOW_OPPORTUNISTIC, REUSE_ALLOW_INTERNAL_DEPENDENCIES.
    pub reuse: [i32; 3],
    pub max_size: u64,
}

pub struct Primary {
    pub ctx: u64,
    pub refs: u32,
    pub flags: u32,
}

/// Which timeline a stream argument names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StreamKey {
    Legacy(u64),
    PerThread(u64, u64),
    Owned(u64),
}

/// Everything this process's CUDA has created.
pub struct Registry {
    pub sim: &'static Sim,
    pub slot: SlotIndex,
    next_id: u64,
    next_buffer_id: u64,
    pub contexts: HashMap<u64, Context>,
    pub primaries: Vec<Primary>,
    pub streams: HashMap<u64, Stream>,
    pub events: HashMap<u64, Event>,
    pub modules: HashMap<u64, Module>,
    pub functions: HashMap<u64, Function>,
    pub libraries: HashMap<u64, Library>,
    pub kernels: HashMap<u64, Kernel>,
    pub allocations: BTreeMap<u64, Allocation>,
    pub arrays: HashMap<u64, Array>,
    pub vmm: HashMap<u64, VmmHandle>,
    pub reservations: BTreeMap<u64, u64>,
    pub pools: HashMap<u64, Pool>,
    pub current_pools: Vec<u64>,
    pub default_pools: Vec<u64>,
    cursors: HashMap<u64, u64>,
    /// Per device: the SMs held by kernels that have not finished.
    pub sm_schedules: Vec<SmSchedule>,
    pub captures: HashMap<StreamKey, Capture>,
    /// Streams whose last queued work is an event (`schedule::kernel_after_event_ns`).
    after_event: HashSet<StreamKey>,
    pub graphs: HashMap<u64, Vec<Node>>,
    pub graph_execs: HashMap<u64, Vec<Node>>,
}

/// Finds `size` free bytes aligned to `align` in `[start, end)` of `taken` (start -> len),
/// first fit from `cursor`, wrapping once.
fn find_free<V>(
    taken: &BTreeMap<u64, V>,
    len_of: impl Fn(&V) -> u64,
    start: u64,
    end: u64,
    cursor: u64,
    size: u64,
    align: u64,
) -> Option<u64> {
    let mut position = cursor.clamp(start, end);
    let mut wrapped = false;
    loop {
        let candidate = round_up(position, align)?;
        let candidate_end = candidate.checked_add(size)?;
        if candidate_end > end {
            if wrapped {
                return None;
            }
            wrapped = true;
            position = start;
            continue;
        }
        match taken.range(..candidate_end).next_back() {
            Some((&base, value)) if base + len_of(value) > candidate => {
                position = base + len_of(value)
            }
            _ => return Some(candidate),
        }
    }
}

impl Registry {
    pub fn new(sim: &'static Sim, slot: SlotIndex) -> Registry {
        let mut registry = Registry {
            sim,
            slot,
            next_id: 1,
            next_buffer_id: 1,
            contexts: HashMap::new(),
            primaries: Vec::new(),
            streams: HashMap::new(),
            events: HashMap::new(),
            modules: HashMap::new(),
            functions: HashMap::new(),
            libraries: HashMap::new(),
            kernels: HashMap::new(),
            allocations: BTreeMap::new(),
            arrays: HashMap::new(),
            vmm: HashMap::new(),
            reservations: BTreeMap::new(),
            pools: HashMap::new(),
            current_pools: Vec::new(),
            default_pools: Vec::new(),
            cursors: HashMap::new(),
            sm_schedules: (0..sim.config.gpus.len())
                .map(|_| SmSchedule::default())
                .collect(),
            captures: HashMap::new(),
            after_event: HashSet::new(),
            graphs: HashMap::new(),
            graph_execs: HashMap::new(),
        };
        for device in 0..sim.config.gpus.len() {
            let ctx = registry.handle(TAG_CONTEXT);
            registry.contexts.insert(ctx, Context::new(device, 0, true));
            registry.primaries.push(Primary {
                ctx,
                refs: 0,
                flags: 0,
            });
            let pool = registry.handle(TAG_POOL);
            registry.pools.insert(pool, Pool::new(device, true));
            registry.default_pools.push(pool);
            registry.current_pools.push(pool);
        }
        registry
    }

    pub fn handle(&mut self, tag: u64) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        (tag << TAG_SHIFT) | id
    }

    pub fn device_count(&self) -> usize {
        self.sim.config.gpus.len()
    }

    pub fn capacity(&self, device: usize) -> u64 {
        self.sim.config.gpus[device].memory
    }

    /// Reserves `bytes` of `device` in the shared state: OUT_OF_MEMORY when the card is full.
    pub fn charge(&self, device: usize, bytes: u64) -> Result<(), CUresult> {
        if self
            .sim
            .state
            .try_reserve(self.slot, device, bytes, self.capacity(device))
        {
            Ok(())
        } else {
            Err(CUDA_ERROR_OUT_OF_MEMORY)
        }
    }

    pub fn uncharge(&self, device: usize, bytes: u64) {
        self.sim.state.release(self.slot, device, bytes);
    }

    /// A live, active context.
    pub fn context(&self, ctx: u64) -> Result<&Context, CUresult> {
        match self.contexts.get(&ctx) {
            Some(context) if context.active => Ok(context),
            _ => Err(CUDA_ERROR_INVALID_CONTEXT),
        }
    }

    /// Activates a context: charges its overhead and counts it in the shared state.
    pub fn activate(&mut self, ctx: u64) -> Result<(), CUresult> {
        let overhead = self.sim.config.context_overhead;
        let device = self
            .contexts
            .get(&ctx)
            .ok_or(CUDA_ERROR_INVALID_CONTEXT)?
            .device;
        self.charge(device, overhead)?;
        self.sim.state.count_context(self.slot, device, true);
        if let Some(context) = self.contexts.get_mut(&ctx) {
            context.active = true;
            context.overhead = overhead;
            context.legacy_busy = 0;
            context.per_thread_busy.clear();
        }
        Ok(())
    }

    /// Deactivates a context: frees what it allocated, destroys its streams, events and
    /// modules, and returns its overhead.
    pub fn deactivate(&mut self, ctx: u64) {
        let Some(context) = self.contexts.get_mut(&ctx) else {
            return;
        };
        if !context.active {
            return;
        }
        context.active = false;
        let (device, overhead) = (context.device, std::mem::take(&mut context.overhead));
        let limits = context.limits.reset();
        self.uncharge(device, overhead.saturating_add(limits));
        let mut libraries_data = 0u64;
        for library in self.libraries.values_mut() {
            let before = library.loaded_in.len();
            library.loaded_in.retain(|(held, _)| *held != ctx);
            let dropped = (before - library.loaded_in.len()) as u64;
            libraries_data =
                libraries_data.saturating_add(library.static_bytes.saturating_mul(dropped));
        }
        self.uncharge(device, libraries_data);
        self.sim.state.count_context(self.slot, device, false);
        let owned: Vec<u64> = self
            .allocations
            .iter()
            .filter(|(_, a)| a.ctx == ctx && !matches!(a.kind, AllocKind::Mapped { .. }))
            .map(|(p, _)| *p)
            .collect();
        for ptr in owned {
            let _ = self.free(ptr);
        }
        let arrays: Vec<u64> = self
            .arrays
            .iter()
            .filter(|(_, a)| a.ctx == ctx)
            .map(|(h, _)| *h)
            .collect();
        for array in arrays {
            if let Some(array) = self.arrays.remove(&array) {
                self.uncharge(array.device, array.charged);
            }
        }
        self.streams.retain(|_, stream| stream.ctx != ctx);
        self.events.retain(|_, event| event.ctx != ctx);
        let modules: Vec<u64> = self
            .modules
            .iter()
            .filter(|(_, m)| m.ctx == ctx)
            .map(|(h, _)| *h)
            .collect();
        for module in modules {
            self.unload_module(module);
        }
        for kernel in self.kernels.values_mut() {
            kernel.functions.remove(&ctx);
        }
    }

    pub fn unload_module(&mut self, module: u64) -> bool {
        match self.modules.remove(&module) {
            Some(removed) => {
                if let Some(device) = self.contexts.get(&removed.ctx).map(|c| c.device) {
                    self.uncharge(device, removed.charged);
                }
                for function in removed.functions.values() {
                    self.functions.remove(function);
                }
                true
            }
            None => false,
        }
    }

    fn cursor_key(region: u64) -> u64 {
        region
    }

    /// A fresh device address range of `size` bytes on `device` (`low`: below 4 GiB).
    pub fn place(&mut self, device: usize, size: u64, align: u64, low: bool) -> Option<u64> {
        let (start, end) = if low {
            (LOW_VA_BASE, LOW_VA_END)
        } else {
            let start = DEVICE_VA_BASE + device as u64 * DEVICE_VA_SPAN;
            (start, start + DEVICE_VA_SPAN)
        };
        let key = Self::cursor_key(start);
        let cursor = self.cursors.get(&key).copied().unwrap_or(start);
        let placed = find_free(
            &self.allocations,
            |a: &Allocation| a.size.max(1),
            start,
            end,
            cursor,
            size.max(1),
            align,
        )?;
        self.cursors.insert(key, placed + size.max(1));
        Some(placed)
    }

    /// A fresh VMM reservation range.
    pub fn place_reservation(&mut self, size: u64, align: u64, hint: u64) -> Option<u64> {
        if hint != 0 && hint.is_multiple_of(align) {
            let fits = hint >= RESERVE_VA_BASE
                && hint
                    .checked_add(size)
                    .is_some_and(|end| end <= RESERVE_VA_END);
            let clear = self
                .reservations
                .range(..hint + size)
                .next_back()
                .is_none_or(|(&base, &len)| base + len <= hint);
            if fits && clear {
                return Some(hint);
            }
        }
        let cursor = self
            .cursors
            .get(&RESERVE_VA_BASE)
            .copied()
            .unwrap_or(RESERVE_VA_BASE);
        let placed = find_free(
            &self.reservations,
            |len: &u64| *len,
            RESERVE_VA_BASE,
            RESERVE_VA_END,
            cursor,
            size,
            align,
        )?;
        self.cursors.insert(RESERVE_VA_BASE, placed + size);
        Some(placed)
    }

    pub fn next_buffer_id(&mut self) -> u64 {
        let id = self.next_buffer_id;
        self.next_buffer_id += 1;
        id
    }

    /// Allocates device memory for `ctx`.
    pub fn allocate(&mut self, ctx: u64, size: u64, kind: AllocKind) -> Result<u64, CUresult> {
        let device = self.context(ctx)?.device;
        if size == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let charged = round_up(size, ALLOC_ALIGN).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        if charged > self.capacity(device) {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        let low = kind == AllocKind::Low;
        let ptr = self
            .place(device, charged, ALLOC_ALIGN, low)
            .ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        self.charge(device, charged)?;
        let buffer_id = self.next_buffer_id();
        self.allocations.insert(
            ptr,
            Allocation {
                size,
                charged,
                device,
                ctx,
                kind,
                buffer_id,
            },
        );
        Ok(ptr)
    }

    /// Frees an allocation made by `allocate` or from a pool (by its base address).
    pub fn free(&mut self, ptr: u64) -> Result<(), CUresult> {
        match self.allocations.get(&ptr).copied() {
            Some(allocation) if !matches!(allocation.kind, AllocKind::Mapped { .. }) => {
                self.allocations.remove(&ptr);
                match allocation.kind {
                    AllocKind::Pool(pool) => {
                        if let Some(pool) = self.pools.get_mut(&pool) {
                            pool.used = pool.used.saturating_sub(allocation.charged);
                        }
                    }
                    _ => self.uncharge(allocation.device, allocation.charged),
                }
                Ok(())
            }
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }

    /// The allocation containing `ptr` (base, record).
    pub fn find(&self, ptr: u64) -> Option<(u64, Allocation)> {
        let (&base, allocation) = self.allocations.range(..=ptr).next_back()?;
        (ptr < base + allocation.size.max(1)).then_some((base, *allocation))
    }

    /// Whether `[ptr, ptr+len)` lies inside one live allocation.
    pub fn covers(&self, ptr: u64, len: u64) -> bool {
        match self.find(ptr) {
            Some((base, allocation)) => ptr
                .checked_add(len)
                .is_some_and(|end| end <= base + allocation.size),
            None => false,
        }
    }

    /// Allocates from a pool: grows its reservation (charging the card) by at least 32 MiB.
    pub fn pool_allocate(
        &mut self,
        pool_handle: u64,
        ctx: u64,
        size: u64,
    ) -> Result<u64, CUresult> {
        if size == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let charged = round_up(size, ALLOC_ALIGN).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        let pool = self
            .pools
            .get(&pool_handle)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let device = pool.device;
        let needed = pool
            .used
            .checked_add(charged)
            .ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        if pool.max_size != 0 && needed > pool.max_size {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        // A real pool grows by at least 32 MiB at a time (measured: a 5 MiB cuMemAllocAsync
        // reserves 32 MiB), in 2 MiB steps beyond that.
        let grow = if needed > pool.reserved {
            round_up(needed - pool.reserved, GRANULARITY)
                .ok_or(CUDA_ERROR_OUT_OF_MEMORY)?
                .max(POOL_CHUNK)
        } else {
            0
        };
        let ptr = self
            .place(device, charged, ALLOC_ALIGN, false)
            .ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        self.charge(device, grow)?;
        let buffer_id = self.next_buffer_id();
        if let Some(pool) = self.pools.get_mut(&pool_handle) {
            pool.reserved += grow;
            pool.used = needed;
            pool.reserved_high = pool.reserved_high.max(pool.reserved);
            pool.used_high = pool.used_high.max(pool.used);
        }
        self.allocations.insert(
            ptr,
            Allocation {
                size,
                charged,
                device,
                ctx,
                kind: AllocKind::Pool(pool_handle),
                buffer_id,
            },
        );
        Ok(ptr)
    }

    /// Gives back reserved-but-unused pool memory down to `keep` bytes (never below what is in use).
    pub fn pool_trim(&mut self, pool_handle: u64, keep: u64) {
        let Some(pool) = self.pools.get_mut(&pool_handle) else {
            return;
        };
        let floor = round_up(pool.used, GRANULARITY)
            .unwrap_or(pool.used)
            .max(round_up(keep, GRANULARITY).unwrap_or(keep));
        if pool.reserved > floor {
            let released = pool.reserved - floor;
            pool.reserved = floor;
            let device = pool.device;
            self.uncharge(device, released);
        }
    }

    /// What the driver does at a synchronisation point: pools of `device` holding more
    /// than their release threshold give the excess back.
    pub fn release_pools_at_sync(&mut self, device: usize) {
        let pools: Vec<(u64, u64)> = self
            .pools
            .iter()
            .filter(|(_, p)| p.device == device)
            .map(|(h, p)| (*h, p.release_threshold))
            .collect();
        for (pool, threshold) in pools {
            self.pool_trim(pool, threshold);
        }
    }

    /// Resolves a stream argument (0 is the legacy or, for per-thread entry points, the
    /// per-thread default stream of the current context).
    pub fn stream_key(
        &self,
        stream: u64,
        per_thread: bool,
        current: Option<u64>,
    ) -> Result<(StreamKey, u64), CUresult> {
        let current_ctx = || -> Result<u64, CUresult> {
            let ctx = current.ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
            self.context(ctx)?;
            Ok(ctx)
        };
        match stream {
            0 if per_thread => Ok((
                StreamKey::PerThread(current_ctx()?, super::thread_id()),
                current_ctx()?,
            )),
            0 | CU_STREAM_LEGACY => Ok((StreamKey::Legacy(current_ctx()?), current_ctx()?)),
            CU_STREAM_PER_THREAD => Ok((
                StreamKey::PerThread(current_ctx()?, super::thread_id()),
                current_ctx()?,
            )),
            handle => {
                let owned = self.streams.get(&handle).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
                self.context(owned.ctx)?;
                Ok((StreamKey::Owned(handle), owned.ctx))
            }
        }
    }

    fn busy_of(&self, key: StreamKey) -> u64 {
        match key {
            StreamKey::Legacy(ctx) => self.contexts.get(&ctx).map(|c| c.legacy_busy).unwrap_or(0),
            StreamKey::PerThread(ctx, tid) => self
                .contexts
                .get(&ctx)
                .and_then(|c| c.per_thread_busy.get(&tid).copied())
                .unwrap_or(0),
            StreamKey::Owned(handle) => self.streams.get(&handle).map(|s| s.busy).unwrap_or(0),
        }
    }

    fn set_busy(&mut self, key: StreamKey, until: u64) {
        match key {
            StreamKey::Legacy(ctx) => {
                if let Some(context) = self.contexts.get_mut(&ctx) {
                    context.legacy_busy = until;
                }
            }
            StreamKey::PerThread(ctx, tid) => {
                if let Some(context) = self.contexts.get_mut(&ctx) {
                    context.per_thread_busy.insert(tid, until);
                }
            }
            StreamKey::Owned(handle) => {
                if let Some(stream) = self.streams.get_mut(&handle) {
                    stream.busy = until;
                }
            }
        }
    }

    /// When the work queued so far on `key` completes, with the legacy stream's implicit
    /// synchronisation: legacy work waits for blocking streams and they wait for it.
    pub fn ready_at(&self, key: StreamKey) -> u64 {
        let own = self.busy_of(key);
        match key {
            StreamKey::Legacy(ctx) => {
                let blocking = self
                    .streams
                    .values()
                    .filter(|s| s.ctx == ctx && s.flags & CU_STREAM_NON_BLOCKING == 0)
                    .map(|s| s.busy)
                    .max()
                    .unwrap_or(0);
                own.max(blocking)
            }
            StreamKey::Owned(handle) => match self.streams.get(&handle) {
                Some(stream) if stream.flags & CU_STREAM_NON_BLOCKING == 0 => {
                    own.max(self.busy_of(StreamKey::Legacy(stream.ctx)))
                }
                _ => own,
            },
            StreamKey::PerThread(..) => own,
        }
    }

    /// Queues `duration_ns` of work on `key`; returns its simulated (start, end).
    pub fn enqueue(&mut self, key: StreamKey, duration_ns: u64) -> (u64, u64) {
        let start = self.ready_at(key).max(now_ns());
        let end = start.saturating_add(duration_ns);
        self.set_busy(key, end);
        (start, end)
    }

    /// Queues a kernel of `duration_ns` and `blocks` blocks on `key` of `device`: it
    /// starts when its stream reaches it, the card's turn is its process's
    /// (`schedule::place_on_card`) and the SMs it needs are free (`SmSchedule`);
    /// returns its simulated (start, end).
    pub fn enqueue_kernel(
        &mut self,
        key: StreamKey,
        device: usize,
        duration_ns: u64,
        blocks: u64,
    ) -> (u64, u64) {
        let now = now_ns();
        let setup = if self.after_event.remove(&key) {
            super::schedule::kernel_after_event_ns()
        } else {
            0
        };
        let queued_until = self.ready_at(key);
        // On an idle stream the card fetches and sets the kernel up first
        // (`schedule::idle_submit_ns`); behind queued work, beside it.
        let delay = if queued_until <= now {
            setup.max(super::schedule::idle_submit_ns())
        } else {
            setup
        };
        let ready = queued_until.max(now).saturating_add(delay);
        let card_sms = self
            .sim
            .config
            .gpus
            .get(device)
            .map(|gpu| gpu.sms)
            .unwrap_or(1);
        let sms = blocks.min(u32::MAX as u64) as u32;
        let duration_ns = super::schedule::kernel_duration(duration_ns, blocks, card_sms);
        let start = match self.sm_schedules.get_mut(device) {
            Some(schedule) => super::schedule::place_on_card(
                &self.sim.state,
                self.slot,
                device,
                schedule,
                ready,
                duration_ns,
                sms,
                card_sms,
                now,
            ),
            None => ready,
        };
        let end = start.saturating_add(duration_ns);
        self.set_busy(key, end);
        (start, end)
    }

    /// Notes an event queued on `key`: the kernel queued next on it is set up only once
    /// the event is done (`schedule::kernel_after_event_ns`; nothing is noted while that
    /// is 0, the default, so streams are not tracked for nothing).
    pub fn event_queued(&mut self, key: StreamKey) {
        if super::schedule::kernel_after_event_ns() > 0 {
            self.after_event.insert(key);
        }
    }

    /// When an event recorded on `key` of context `ctx` now fires: when the stream
    /// reaches it, and not before the card is the process's (`schedule::event_on_card`).
    pub fn event_fires_at(&self, key: StreamKey, ctx: u64) -> u64 {
        let (queued_until, now) = (self.ready_at(key), now_ns());
        // Recorded on an idle stream, it fires once the card has fetched it
        // (`schedule::idle_submit_ns`).
        let at = if queued_until <= now {
            now.saturating_add(super::schedule::idle_submit_ns())
        } else {
            queued_until
        };
        match self.contexts.get(&ctx).map(|context| context.device) {
            Some(device) if device < self.sm_schedules.len() => {
                super::schedule::event_on_card(&self.sim.state, self.slot, device, at)
            }
            _ => at,
        }
    }

    /// Makes `key` wait for `at`.
    pub fn wait_until(&mut self, key: StreamKey, at: u64) {
        let busy = self.busy_of(key).max(at);
        self.set_busy(key, busy);
    }

    /// When every stream of `ctx` is idle.
    pub fn ctx_idle_at(&self, ctx: u64) -> u64 {
        let Some(context) = self.contexts.get(&ctx) else {
            return 0;
        };
        let streams = self
            .streams
            .values()
            .filter(|s| s.ctx == ctx)
            .map(|s| s.busy)
            .max()
            .unwrap_or(0);
        let per_thread = context.per_thread_busy.values().copied().max().unwrap_or(0);
        context.legacy_busy.max(streams).max(per_thread)
    }
}

impl Context {
    pub fn new(device: usize, flags: u32, primary: bool) -> Context {
        Context {
            device,
            flags,
            primary,
            active: false,
            overhead: 0,
            limits: super::limits::Limits::default(),
            legacy_busy: 0,
            per_thread_busy: HashMap::new(),
        }
    }
}

impl Pool {
    pub fn new(device: usize, is_default: bool) -> Pool {
        Pool {
            device,
            reserved: 0,
            used: 0,
            release_threshold: 0,
            reserved_high: 0,
            used_high: 0,
            is_default,
            reuse: [1, 1, 1],
            max_size: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn find_free_skips_taken_ranges_and_wraps() {
        let mut taken: BTreeMap<u64, u64> = BTreeMap::new();
        taken.insert(0, 100);
        taken.insert(200, 100);
        let len = |l: &u64| *l;
        assert_eq!(find_free(&taken, len, 0, 1000, 0, 50, 10), Some(100));
        assert_eq!(find_free(&taken, len, 0, 1000, 0, 150, 10), Some(300));
        assert_eq!(
            find_free(&taken, len, 0, 1000, 900, 150, 10),
            Some(300),
            "wraps to the start"
        );
        assert_eq!(find_free(&taken, len, 0, 400, 0, 150, 10), None);
    }
}
