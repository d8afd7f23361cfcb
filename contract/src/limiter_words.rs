//! What the compute limiter's words in a usage region mean.
//!
//! The region (layout: `region/layout.rs`) reserves per device a container-wide block of
//! `CONTAINER_LIMITER_WORDS` atomics and, in every process slot, a block of
//! `SLOT_LIMITER_WORDS`. The processes of one container share the first: their token
//! bucket lives there, so the container's limit is one budget however many processes
//! spend it, and so does their union horizon (a kernel's interval on a time-sliced card
//! spans the slices another context took meanwhile, so the container's busy time is
//! the union of its processes' kernels, not their sum). Each process publishes its own
//! activity in the second. The host-side coordinator (`coordinator.rs`) reads only the
//! slot words, from a private copy, and believes nothing it has not checked. Every time
//! is [`crate::clock::monotonic_ns`]; zero means "never".

/// Container-wide words (`Region::container_limiter(device)`), written with atomics by
/// every process of the container.
pub mod container {
    /// The token bucket, as the wall time up to which the container's allowance is spent
    /// ("generic cell rate"): a launch waits while this is in the future; a launch of
    /// union cost `c` at rate `r` moves it to `max(it, now - window) + c / r`.
    pub const PAID_UNTIL_NS: usize = 0;
    /// The union horizon: the latest projected end of any queued kernel of the container
    /// on this device. A launch that ends at `e` after starting at `s` adds
    /// `max(0, e - max(s, horizon))` of busy time.
    pub const HORIZON_NS: usize = 1;
    /// The rate in force, parts per million of the card (0: not set yet, use the limit).
    pub const RATE_PPM: usize = 2;
    /// The time until which every launch of the container waits: a launch that finds
    /// the bucket in debt sets it to when the bucket will have refilled part of its
    /// window, so that the container's streams resume together (and overlap, as they
    /// do bare) rather than one at a time as each sliver of budget comes back.
    pub const HELD_UNTIL_NS: usize = 3;
}

/// Per-process words (`Region::slot_limiter(slot, device)`), written by the process that
/// owns the slot, read by the coordinator.
pub mod slot {
    /// The last time the process had GPU work queued, or waited to launch.
    pub const ACTIVE_NS: usize = 0;
    /// Nanoseconds the process's launches have waited on the limit, in all.
    pub const WAITED_NS: usize = 1;
    /// The last time the process published (at most every publish interval).
    pub const HEARTBEAT_NS: usize = 2;
}
