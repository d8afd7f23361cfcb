//! The allocation paths: the enforcer's half of every call that makes the driver hold
//! memory. Each goes `*_begin` (which device, the quota there, the ledger's
//! reservation; refused: the real call must not run) -> the hook's real call ->
//! `*_finish` (the result handed to the ledger to record, settle or give back), and,
//! should the driver's figure then pass the quota, the hook undoes its call and says
//! `*_undone`. No closure goes into the ledger and nothing comes back out of it into a
//! hook.
//!
//! - [`Enforcer::begin`] / [`Enforcer::finish`]: single allocations and VMM handles;
//! - [`Enforcer::pool_begin`] / [`Enforcer::pool_finish`] / [`Enforcer::pool_undone`]:
//!   stream-ordered allocations from a pool;
//! - [`Enforcer::load_begin`] / [`Enforcer::load_finish`] / [`Enforcer::load_undone`]:
//!   module and library loads, priced from their image;
//! - [`Enforcer::limit_begin`] / [`Enforcer::limit_finish`] /
//!   [`Enforcer::limit_undone`]: `cuCtxSetLimit`, priced by the limit.
//!
//! What lives here rather than in the ledger: the visible device a call lands on, the
//! quota's policy (oversubscription), the driver's figures (the pools' attributes
//! through [`RealPools`], NVML through `crate::meter`), and the refusal's report (the
//! region's counters, the debug line, the `warn_on_refusal` warning).

use std::ffi::c_void;

use vgpu_shimgen::runtime;

use crate::cuda::*;
use crate::devices::{LandsOn, Visible};
use crate::ledger::allocations::{AllocKey, charged_size};
use crate::ledger::pool_counting::{PoolFinish, PoolHeld, PoolOver};
use crate::ledger::pools::PoolDriver;
use crate::ledger::reserved::{limit_bytes, limit_charge};
use crate::ledger::{Ledger, Place, Ticket};
use crate::process::process_state;
use crate::state::Enforcer;
use crate::{debug, real};

/// What [`Enforcer::begin`] decided before an allocation's real call.
#[must_use = "a reservation is finished (recorded or given back) after the real call"]
pub enum Reservation {
    /// Reserved in the region: run the real call, then [`Enforcer::finish`].
    Reserved(Ticket),
    /// The device is not known before the call (no current context, or before
    /// `cuInit`): the driver answers with its own error; should it succeed anyway,
    /// [`Enforcer::finish`] counts these bytes after the fact.
    Unplaced(u64),
    /// Refused: the real call must not run; the hook answers this error.
    Refused(CUresult),
}

/// What a load or limit's `*_begin` decided before its real call.
#[must_use = "a priced call is finished after the real call"]
pub enum Priced<P> {
    /// Refused: the real call must not run; the hook answers this error.
    Refused(CUresult),
    /// Nothing is counted (this process has no slot, and the call takes no more): run
    /// the real call and answer its result.
    Uncounted,
    /// Reserved: run the real call, then finish.
    Reserved(Reserved<P>),
}

/// A load or limit between its reservation and its result.
pub struct Reserved<P> {
    ticket: Option<Ticket>,
    /// What the container held before the call.
    before: u64,
    /// What the call's finish needs beside (nothing for a load).
    plan: P,
}

/// What a load or limit's `*_finish` found.
#[must_use = "a call whose memory passed the quota is undone, then `*_undone`"]
pub enum Settled<U> {
    /// Answer this result.
    Kept(CUresult),
    /// Settled with the driver's figure, the container holds more than its quota: the
    /// hook undoes its call (unloads, sets the limit back), then says `*_undone`.
    Over(U),
}

/// A `cuCtxSetLimit`'s record: where, and its bytes before the call and after it; what
/// setting the limit back returns it to.
pub struct LimitPlan {
    key: AllocKey,
    context: usize,
    place: Place,
    counted: u64,
    total: u64,
}

impl Enforcer {
    /// This process's ledger (built on first use in each process, after a fork too).
    #[inline]
    pub fn ledger(&'static self) -> &'static Ledger<'static> {
        &process_state(self).ledger
    }

    /// Where reservations on `device` are counted and the quota they are checked against.
    pub fn place(&self, device: &Visible) -> Place {
        Place {
            region_index: device.region_index,
            limit: if self.config.memory_oversubscribe {
                u64::MAX
            } else {
                device.memory_limit
            },
        }
    }

    // --- single allocations ----------------------------------------------------------

    /// The first half of an allocation, before the real call: reserves `charge` bytes
    /// on the device `lands_on` names. A hidden device is CUDA_ERROR_INVALID_DEVICE, and
    /// a quota that cannot take it CUDA_ERROR_OUT_OF_MEMORY ([`Reservation::Refused`]:
    /// the real call must not run); no current context (or no cuInit) leaves the error
    /// to the driver ([`Reservation::Unplaced`]). The caller runs the real call, then
    /// hands its result to [`Enforcer::finish`].
    pub fn begin(&'static self, lands_on: &LandsOn, charge: u64) -> Reservation {
        match self.device_for(lands_on) {
            Ok(device) => match self.reserve(device, charge) {
                Ok(ticket) => Reservation::Reserved(ticket),
                Err(error) => Reservation::Refused(error),
            },
            Err(CUDA_ERROR_INVALID_DEVICE) => Reservation::Refused(CUDA_ERROR_INVALID_DEVICE),
            Err(_) => Reservation::Unplaced(charge),
        }
    }

    /// The second half, after the real call returned `result`: on success the ticket to
    /// record (what will credit it back), for an unplaced allocation what the driver
    /// handed out counted now; on failure the reservation is given back and `None`.
    pub fn finish(
        &'static self,
        reservation: Reservation,
        lands_on: &LandsOn,
        result: CUresult,
    ) -> Option<Ticket> {
        match reservation {
            Reservation::Reserved(ticket) if result == CUDA_SUCCESS => Some(ticket),
            Reservation::Reserved(ticket) => {
                self.ledger().unreserve(ticket);
                None
            }
            Reservation::Unplaced(charge) if result == CUDA_SUCCESS => {
                let device = self.device_for(lands_on).ok()?;
                self.ledger().count_handed_out(device.region_index, charge)
            }
            Reservation::Unplaced(_) | Reservation::Refused(_) => None,
        }
    }

    /// Reserves `bytes` on `device` for this process, or says why not (after settling
    /// with the driver's figure when that is due; the ledger makes room first).
    pub fn reserve(&'static self, device: &Visible, bytes: u64) -> Result<Ticket, CUresult> {
        let ledger = self.ledger();
        if ledger.slot().is_none() {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        self.sync_with_driver(device);
        let place = self.place(device);
        ledger.reserve(place, bytes, &RealPools).map_err(|_| {
            self.refused(device, bytes, place.limit);
            CUDA_ERROR_OUT_OF_MEMORY
        })
    }

    /// Says that an allocation of `asked` bytes on `device` was refused at `limit`: the
    /// container's counters in the region (read by the host: metrics, Events), a debug
    /// line, and, when the config asks for it (`warn_on_refusal`), one warning line on
    /// stderr at most every second per process. Only on the refusal path.
    fn refused(&self, device: &Visible, asked: u64, limit: u64) {
        let held = self.region.device_used(device.region_index);
        self.region.count_refusal(device.region_index, asked, held);
        debug!(
            "refused {asked} bytes on {}: {held} used of {limit}",
            device.uuid
        );
        if self.config.warn_on_refusal && warning_due() {
            runtime::notice(
                "cuda",
                format_args!(
                    "CUDA_ERROR_OUT_OF_MEMORY: refused {} on {} by the container's memory quota of {} (it holds {}; the card may have room, the quota has not)",
                    mib(asked),
                    device.uuid,
                    mib(limit),
                    mib(held)
                ),
            );
        }
    }

    /// Bytes the container holds on a device, after crediting back what processes that
    /// are gone held (one `kill(pid, 0)` per other process), settling this process's
    /// pools and reconciling with NVML (what `cuMemGetInfo` answers from).
    pub fn used(&'static self, device: &Visible) -> u64 {
        let process = process_state(self);
        let ledger = &process.ledger;
        let index = device.region_index;
        let Some(slot) = ledger.slot() else {
            return if self.refused {
                device.memory_limit
            } else {
                ledger.used(index)
            };
        };
        self.region.reclaim_gone(slot, process.pid_ns);
        ledger.settle_pools(Some(index), &RealPools);
        self.sync_with_driver(device);
        ledger.used(index)
    }

    // --- pools -----------------------------------------------------------------------

    /// The visible device a known pool belongs to.
    pub fn pool_device(&'static self, pool: usize) -> Option<&'static Visible> {
        let index = self.ledger().pool_device(pool)?;
        self.devices()?.iter().find(|d| d.region_index == index)
    }

    /// Before `bytes` are allocated from `pool` on `device`: the most the pool can grow
    /// by reserved (after making room), or nothing when the pool has the room unused;
    /// CUDA_ERROR_OUT_OF_MEMORY when neither (the real call must not run). The pool
    /// table stays held until [`Enforcer::pool_finish`].
    pub fn pool_begin(
        &'static self,
        device: &Visible,
        pool: usize,
        bytes: u64,
    ) -> Result<PoolHeld<'static>, CUresult> {
        let ledger = self.ledger();
        if ledger.slot().is_none() {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        self.sync_with_driver(device);
        let place = self.place(device);
        ledger
            .pool_begin(place, pool, bytes, &RealPools)
            .ok_or_else(|| {
                debug!("refusing {bytes} bytes from pool {pool:#x}");
                self.refused(device, bytes, place.limit);
                CUDA_ERROR_OUT_OF_MEMORY
            })
    }

    /// After the real call returned `result` (and on success wrote `pointer`, in
    /// `context`): the pool settled at the driver's figure and the allocation recorded;
    /// [`PoolFinish::Over`] (a refusal, reported) when the pool grew past the quota:
    /// the hook frees the allocation, then [`Enforcer::pool_undone`].
    pub fn pool_finish(
        &'static self,
        held: PoolHeld<'static>,
        device: &Visible,
        bytes: u64,
        (result, pointer, context): (CUresult, u64, usize),
    ) -> PoolFinish<'static> {
        let finish = self
            .ledger()
            .pool_finish(held, result, pointer, context, &RealPools);
        if let PoolFinish::Over(over) = &finish {
            debug!(
                "a pool grew by {} bytes for {bytes}, past the quota: undone",
                over.grew
            );
            self.refused(device, bytes, self.place(device).limit);
        }
        finish
    }

    /// The allocation [`PoolFinish::Over`] named was freed: the pool is trimmed and
    /// settled; the hook answers the CUDA_ERROR_OUT_OF_MEMORY this returns.
    pub fn pool_undone(&'static self, over: PoolOver<'static>) -> CUresult {
        self.ledger().pool_undone(over, &RealPools);
        CUDA_ERROR_OUT_OF_MEMORY
    }

    // --- module and library loads ----------------------------------------------------

    /// Before a load whose image declares `static_bytes` of static data, on `device`:
    /// reserves them (as charged); refused when the quota cannot take them (or this
    /// process's allocations are refused).
    pub fn load_begin(&'static self, device: &Visible, static_bytes: u64) -> Priced<()> {
        let ledger = self.ledger();
        let charge = charged_size(static_bytes);
        if ledger.slot().is_none() {
            // This process's allocations are refused (no slot): so is static data.
            return if charge > 0 {
                Priced::Refused(CUDA_ERROR_OUT_OF_MEMORY)
            } else {
                Priced::Uncounted
            };
        }
        let priced = self.priced(device, charge, ());
        if let Priced::Refused(_) = priced {
            debug!("refused a module of {static_bytes} bytes of static data");
        }
        priced
    }

    /// After the load returned `result` (and on success the handle `key`, in
    /// `context`, 0 for none): the reservation recorded under it (or given back), then
    /// settled with the driver's figure at once. [`Settled::Over`] when that passed the
    /// quota: the hook unloads the handle, then [`Enforcer::load_undone`].
    pub fn load_finish(
        &'static self,
        priced: Priced<()>,
        device: &Visible,
        context: usize,
        (result, key): (CUresult, Option<AllocKey>),
    ) -> Settled<Option<AllocKey>> {
        let reserved = match self.succeeded(priced, result) {
            Ok(reserved) => reserved,
            Err(answer) => return Settled::Kept(answer),
        };
        let ledger = self.ledger();
        match (key, reserved.ticket) {
            (Some(key), Some(ticket)) => ledger.record(key, ticket, context),
            (None, Some(ticket)) => ledger.unreserve(ticket),
            _ => {}
        }
        if self.over_after_settling(device, reserved.before) {
            return Settled::Over(key);
        }
        Settled::Kept(result)
    }

    /// The load [`Settled::Over`] named was unloaded: its record credited, the count
    /// settled again; the hook answers the CUDA_ERROR_OUT_OF_MEMORY this returns.
    pub fn load_undone(&'static self, device: &Visible, key: Option<AllocKey>) -> CUresult {
        if let Some(key) = key {
            self.ledger().forget(key);
        }
        self.settle_with_driver(device);
        debug!("unloaded a module whose memory passed the quota");
        CUDA_ERROR_OUT_OF_MEMORY
    }

    // --- context limits --------------------------------------------------------------

    /// Before `cuCtxSetLimit(limit, new)` in `context` on `device`, the limit being
    /// `old`, on a card holding `resident_threads` threads: reserves what the new value
    /// backs beyond the old; refused when the quota cannot take it.
    pub fn limit_begin(
        &'static self,
        device: &Visible,
        context: usize,
        limit: CUlimit,
        (old, new): (u64, u64),
        resident_threads: u64,
    ) -> Priced<LimitPlan> {
        let ledger = self.ledger();
        let (old_bytes, new_bytes) = (
            limit_bytes(limit, old, resident_threads),
            limit_bytes(limit, new, resident_threads),
        );
        if ledger.slot().is_none() {
            // This process's allocations are refused (no slot): so is more memory.
            return if new_bytes > old_bytes {
                Priced::Refused(CUDA_ERROR_OUT_OF_MEMORY)
            } else {
                Priced::Uncounted
            };
        }
        let key = AllocKey::Limit { context, limit };
        let counted = ledger.charge_of(key);
        let total = charged_size(limit_charge(counted, old_bytes, new_bytes));
        let plan = LimitPlan {
            key,
            context,
            place: self.place(device),
            counted,
            total,
        };
        let priced = self.priced(device, total.saturating_sub(counted), plan);
        if let Priced::Refused(_) = priced {
            debug!(
                "refused limit {limit} = {new}: {} bytes more",
                total.saturating_sub(counted)
            );
        }
        priced
    }

    /// After the real call returned `result`: the (context, limit) record at its new
    /// size, settled with the driver's figure at once. [`Settled::Over`] when that
    /// passed the quota: the hook sets the old value back, then
    /// [`Enforcer::limit_undone`].
    pub fn limit_finish(
        &'static self,
        priced: Priced<LimitPlan>,
        device: &Visible,
        result: CUresult,
    ) -> Settled<LimitPlan> {
        let Reserved { before, plan, .. } = match self.succeeded(priced, result) {
            Ok(reserved) => reserved,
            Err(answer) => return Settled::Kept(answer),
        };
        // The region holds the old count, and the growth reserved at the start.
        self.ledger().resize(
            plan.key,
            plan.context,
            plan.place,
            plan.counted.max(plan.total),
            plan.total,
        );
        if self.over_after_settling(device, before) {
            return Settled::Over(plan);
        }
        Settled::Kept(result)
    }

    /// The limit [`Settled::Over`] named was set back: its record returns to what it
    /// was, the count is settled again; the hook answers the CUDA_ERROR_OUT_OF_MEMORY
    /// this returns.
    pub fn limit_undone(&'static self, over: LimitPlan, device: &Visible) -> CUresult {
        let LimitPlan {
            key,
            context,
            place,
            counted,
            total,
        } = over;
        self.ledger().resize(key, context, place, total, counted);
        self.settle_with_driver(device);
        debug!("set {key:?} back: its new value passed the quota");
        CUDA_ERROR_OUT_OF_MEMORY
    }

    /// Reserves `bytes` on `device` (nothing when 0) for a priced call that will finish
    /// with `plan`; refused: what the hook answers.
    fn priced<P>(&'static self, device: &Visible, bytes: u64, plan: P) -> Priced<P> {
        let ticket = if bytes > 0 {
            match self.reserve(device, bytes) {
                Ok(ticket) => Some(ticket),
                Err(error) => return Priced::Refused(error),
            }
        } else {
            None
        };
        Priced::Reserved(Reserved {
            ticket,
            before: self.ledger().used(device.region_index),
            plan,
        })
    }

    /// After a priced call returned `result`: its reservation when the call succeeded;
    /// otherwise what the hook answers (the reservation given back).
    fn succeeded<P>(
        &'static self,
        priced: Priced<P>,
        result: CUresult,
    ) -> Result<Reserved<P>, CUresult> {
        match priced {
            Priced::Refused(error) => Err(error),
            Priced::Uncounted => Err(result),
            Priced::Reserved(reserved) if result == CUDA_SUCCESS => Ok(reserved),
            Priced::Reserved(reserved) => {
                if let Some(ticket) = reserved.ticket {
                    self.ledger().unreserve(ticket);
                }
                Err(result)
            }
        }
    }

    /// Whether, settled with the driver's figure now, the container holds more than
    /// its quota on `device` and more than the `before` it held before the call.
    fn over_after_settling(&'static self, device: &Visible, before: u64) -> bool {
        self.settle_with_driver(device);
        let used = self.ledger().used(device.region_index);
        used > self.place(device).limit && used > before
    }
}

/// Bytes as MiB with one decimal, for the warning line.
fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1u32 << 20))
}

/// Whether this process may write another refusal warning: at most one a second (one
/// atomic load, and a compare-and-swap when due).
fn warning_due() -> bool {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST_NS: AtomicU64 = AtomicU64::new(0);
    let now = vgpu_contract::clock::monotonic_ns().max(1);
    let last = LAST_NS.load(Ordering::Relaxed);
    (last == 0 || now.saturating_sub(last) >= 1_000_000_000)
        && LAST_NS
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
}

/// The real driver's pool attributes, for the ledger's pool table.
pub struct RealPools;

impl PoolDriver for RealPools {
    fn attribute(&self, pool: usize, attribute: i32) -> Option<u64> {
        let get = real!(cuMemPoolGetAttribute as fn(CUmemoryPool, i32, *mut c_void) -> CUresult);
        let mut value = 0u64;
        // SAFETY: the reserved/used attributes are cuuint64_t, written to our own u64.
        let result = unsafe {
            get(
                pool as CUmemoryPool,
                attribute,
                (&mut value as *mut u64).cast(),
            )
        };
        (result == CUDA_SUCCESS).then_some(value)
    }

    fn trim(&self, pool: usize) {
        let trim = real!(cuMemPoolTrimTo as fn(CUmemoryPool, usize) -> CUresult);
        // SAFETY: trimming a pool handle this process allocated from; it releases only
        // memory that no allocation uses.
        unsafe { trim(pool as CUmemoryPool, 0) };
    }
}
