//! The cross-process usage region: one file-backed shared mapping per container,
//! written by every CUDA process of the container (through libcuda-shim) and read by
//! the NVML shim and the host daemon.
//!
//! Layout (version 3), all little-endian, fixed size:
//! - an 8 KiB header: magic, version, a layout fingerprint, the length, the devices and
//!   their limits, a checksum over those fields, per device a block of 16 words
//!   reserved for the compute limiter's container-wide state
//!   ([`Region::container_limiter`]), and per device a block of 8 container-wide
//!   counters of what the quota did to the container ([`counter`]: refusals, bytes
//!   refused, time launches waited, times over quota), which outlive the processes that
//!   bump them;
//! - `MAX_SLOTS` process slots, one cache-line-aligned record each, holding the owner
//!   (PID, state), its start time and PID namespace, per-device counters, and per device
//!   4 words reserved for the limiter's per-process state ([`Region::slot_limiter`]).
//!   The limiter defines what its words mean; this module only places them.
//!
//! Accounting is lock-free, so a process that dies at any instruction can never leave a
//! lock held. To reserve, a process adds to its own slot and then sums every slot: the
//! sequentially consistent add-then-sum means that of two racing reservations, the later
//! one always sees both, so the quota can never be passed. A dead process's slot is found
//! by PID and start time (PID reuse is no trap) and zeroed, which credits its usage back
//! exactly; slots change owner only by compare-and-swap on an owner word that carries a
//! per-claim nonce.
//!
//! Live usage is never erased: a region whose magic, version, fingerprint, length or
//! checksum is wrong, or that records other devices, is rebuilt only when no live process
//! holds it (each holder keeps a shared lock on the file, see [`crate::mapped`]); while
//! one does, it is refused and left as it is. A new quota for the same devices is written
//! into the header in place, under the init lock, keeping every slot. Every count a
//! reader takes from the file is clamped to [`MAX_COUNT`].
//!
//! One job per file: `layout` (the records and their offsets), `open` (open, create,
//! rebuild), `slots` (the slot protocol), `reserve` (reservations), `liveness`
//! (whose slot is dead, host PIDs), `read` (checks and readers, shared with the
//! host's private copy) and `words` (the quota counters and the limiter's words).

mod layout;
mod liveness;
mod open;
mod read;
mod reserve;
mod slots;
mod words;

use crate::mapped::MappedFile;

pub(crate) use layout::{Block, aligned_zeroed, bytes_of, host_pid_offset};
pub use layout::{
    CONTAINER_LIMITER_WORDS, COUNTER_WORDS, MAX_SLOTS, REGION_LEN, RegionDevice,
    SLOT_LIMITER_WORDS, VERSION,
};
pub use liveness::{WantedHostPid, find_host_pids, is_dead, judge, nvml_match};
pub(crate) use liveness::{dead_slots, wanting_host_pids};
pub use open::{OpenOutcome, RegionError};
pub(crate) use read::RegionBytes;
pub use read::{MAX_COUNT, ProcessUsage};
pub use slots::SlotId;
pub(crate) use slots::free_slot_by_io;
pub(crate) use words::counter_offset;
pub use words::{QuotaCounters, counter};

/// An open usage region. The mapping lives as long as the value, and so does this
/// process's hold on the file (see [`crate::mapped`]).
pub struct Region {
    map: MappedFile,
}

/// The one device of the region tests.
#[cfg(test)]
fn test_devices() -> Vec<RegionDevice> {
    vec![RegionDevice {
        id: "GPU-test".into(),
        memory_limit: 1 << 30,
        core_limit: 30,
        core_mode: 0,
    }]
}
