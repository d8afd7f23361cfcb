//! What the driver reserves on its own, as the simulated card models it: a context's
//! limits (`cuCtxSetLimit`) and a module's or library's static data.
//!
//! - the stack (`CU_LIMIT_STACK_SIZE`) is backed at once for every thread the card holds
//!   (SMs × 2048 threads per SM), beyond the 1 KiB default that the context's overhead
//!   already holds; a launch of a kernel whose local memory passes it grows that to the
//!   kernel's need, and keeps it;
//! - the malloc heap is reserved lazily, at the context's next launch, beyond its 8 MiB
//!   default; a launch that cannot get it fails with CUDA_ERROR_OUT_OF_MEMORY;
//! - the printf FIFO is host memory (a 1.5 GiB FIFO added no device memory on the H200);
//! - the device runtime's pending launches take [`PENDING_LAUNCH_BYTES`] each beyond the
//!   default 2048, at once (a stand-in for a reservation the shim cannot price: the H200
//!   showed none); its sync depth takes nothing here;
//! - a module's static data (`vgpu_abi::image`: PTX `.global`, a cubin's global
//!   sections) is loaded with the module (lazy loading or not, as on the H200); a
//!   library's, into each context at its first use there (or at the load into the
//!   current one under `CUDA_MODULE_LOADING=EAGER`).

use super::errors::*;
use super::registry::Registry;

/// Threads one simulated SM holds at once (`MAX_THREADS_PER_MULTIPROCESSOR`).
pub const THREADS_PER_SM: u64 = 2048;
/// Bytes the device runtime keeps per pending launch (the sim's model).
pub const PENDING_LAUNCH_BYTES: u64 = 2048;

const STACK: usize = 0;
const PRINTF_FIFO: usize = 1;
const MALLOC_HEAP: usize = 2;
const SYNC_DEPTH: usize = 3;
const PENDING_LAUNCHES: usize = 4;
const L2_FETCH: usize = 5;
const PERSISTING_L2: usize = 6;
const COUNT: usize = 7;

/// The defaults of a new context (what its overhead already holds).
const DEFAULTS: [u64; COUNT] = [1024, 1 << 20, 8 << 20, 2, 2048, 64, 0];

/// A context's limits and what each has charged beyond its default.
#[derive(Clone, Debug)]
pub struct Limits {
    values: [u64; COUNT],
    charged: [u64; COUNT],
    /// The heap or FIFO changed since the last launch: the next launch reserves it.
    pending: bool,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            values: DEFAULTS,
            charged: [0; COUNT],
            pending: false,
        }
    }
}

impl Limits {
    /// Back to the defaults; returns the bytes that were charged.
    pub fn reset(&mut self) -> u64 {
        let charged = self
            .charged
            .iter()
            .fold(0u64, |sum, c| sum.saturating_add(*c));
        *self = Limits::default();
        charged
    }
}

/// What limit `index` at `value` takes beyond its default, on a card of `sms` SMs.
fn reserved(index: usize, value: u64, sms: u64) -> u64 {
    let beyond = value.saturating_sub(DEFAULTS[index]);
    match index {
        STACK => beyond.saturating_mul(sms).saturating_mul(THREADS_PER_SM),
        MALLOC_HEAP => beyond,
        PENDING_LAUNCHES => beyond.saturating_mul(PENDING_LAUNCH_BYTES),
        _ => 0,
    }
}

impl Registry {
    fn sms(&self, device: usize) -> u64 {
        self.sim
            .config
            .gpus
            .get(device)
            .map_or(1, |gpu| gpu.sms as u64)
    }

    /// Charges (or gives back) limit `index` of `ctx` to `target` bytes.
    fn charge_limit(&mut self, ctx: u64, index: usize, target: u64) -> Result<(), CUresult> {
        let context = self.contexts.get(&ctx).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        let (device, held) = (context.device, context.limits.charged[index]);
        if target > held {
            self.charge(device, target - held)?;
        } else {
            self.uncharge(device, held - target);
        }
        if let Some(context) = self.contexts.get_mut(&ctx) {
            context.limits.charged[index] = target;
        }
        Ok(())
    }

    /// `cuCtxSetLimit` in `ctx`.
    pub fn set_limit(&mut self, ctx: u64, limit: u32, value: u64) -> Result<(), CUresult> {
        let index = limit as usize;
        if index >= COUNT {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let device = self.context(ctx)?.device;
        match index {
            STACK | PENDING_LAUNCHES => {
                self.charge_limit(ctx, index, reserved(index, value, self.sms(device)))?
            }
            PRINTF_FIFO | MALLOC_HEAP => {
                if let Some(context) = self.contexts.get_mut(&ctx) {
                    context.limits.pending = true;
                }
            }
            L2_FETCH if ![0, 32, 64, 128].contains(&value) => {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            SYNC_DEPTH | L2_FETCH | PERSISTING_L2 => {}
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        if let Some(context) = self.contexts.get_mut(&ctx) {
            context.limits.values[index] = value;
        }
        Ok(())
    }

    /// `cuCtxGetLimit` in `ctx`.
    pub fn get_limit(&self, ctx: u64, limit: u32) -> Result<u64, CUresult> {
        let context = self.context(ctx)?;
        context
            .limits
            .values
            .get(limit as usize)
            .copied()
            .ok_or(CUDA_ERROR_INVALID_VALUE)
    }

    /// What a launch in `ctx` makes the driver reserve first: the heap set since the
    /// last launch.
    pub fn reserve_for_launch(&mut self, ctx: u64) -> Result<(), CUresult> {
        let context = self.context(ctx)?;
        if !context.limits.pending {
            return Ok(());
        }
        let values = context.limits.values;
        let sms = self.sms(context.device);
        self.charge_limit(
            ctx,
            MALLOC_HEAP,
            reserved(MALLOC_HEAP, values[MALLOC_HEAP], sms),
        )?;
        if let Some(context) = self.contexts.get_mut(&ctx) {
            context.limits.pending = false;
        }
        Ok(())
    }

    /// A launch of a kernel needing `local` bytes per thread in `ctx`: past the stack
    /// limit, the local memory backed for every resident thread grows to it (and stays).
    pub fn grow_local_memory(&mut self, ctx: u64, local: u64) -> Result<(), CUresult> {
        let context = self.context(ctx)?;
        if local <= context.limits.values[STACK] {
            return Ok(());
        }
        let grown = reserved(STACK, local, self.sms(context.device));
        if grown > context.limits.charged[STACK] {
            self.charge_limit(ctx, STACK, grown)?;
        }
        Ok(())
    }

    /// Loads module `module`'s static data (once).
    pub fn load_module_data(&mut self, module: u64) -> Result<(), CUresult> {
        let found = self.modules.get(&module).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        if found.data_loaded {
            return Ok(());
        }
        let (ctx, bytes) = (found.ctx, found.static_bytes);
        let device = self.context(ctx)?.device;
        self.charge(device, bytes)?;
        if let Some(found) = self.modules.get_mut(&module) {
            found.data_loaded = true;
            found.charged = found.charged.saturating_add(bytes);
        }
        Ok(())
    }

    /// Loads library `library`'s static data into `ctx` (once per context).
    pub fn load_library_data(&mut self, library: u64, ctx: u64) -> Result<(), CUresult> {
        let found = self
            .libraries
            .get(&library)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        if found.loaded_in.iter().any(|(held, _)| *held == ctx) {
            return Ok(());
        }
        let bytes = found.static_bytes;
        let device = self.context(ctx)?.device;
        self.charge(device, bytes)?;
        if let Some(found) = self.libraries.get_mut(&library) {
            found.loaded_in.push((ctx, device));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_limit_reserves_beyond_its_default() {
        // 132 SMs: 32 KiB of stack is 31 KiB more for 270336 threads (8184 MiB).
        assert_eq!(reserved(STACK, 32 << 10, 132), (31 << 10) * 132 * 2048);
        assert_eq!(reserved(STACK, 512, 132), 0, "below the default");
        assert_eq!(reserved(MALLOC_HEAP, 1536 << 20, 132), (1536 - 8) << 20);
        assert_eq!(reserved(PRINTF_FIFO, 64 << 20, 132), 0, "host memory");
        assert_eq!(
            reserved(PENDING_LAUNCHES, 4096, 132),
            2048 * PENDING_LAUNCH_BYTES
        );
        assert_eq!(reserved(SYNC_DEPTH, 24, 132), 0);
        let mut limits = Limits::default();
        limits.charged[STACK] = 5;
        limits.charged[MALLOC_HEAP] = 7;
        assert_eq!(limits.reset(), 12);
        assert_eq!(limits.values, DEFAULTS);
    }
}
