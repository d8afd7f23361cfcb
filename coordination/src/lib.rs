//! vgpu-coordination: host-side compute coordination, end to end. The device plugin,
//! the DRA driver and `vgpu run` each start the one loop here ([`tick`]) and only say
//! which containers, who may coordinate and where its words go.
//!
//! - [`coordinator`]: the judge. Every tick it reads each container's region (a private
//!   copy: tenant input), checks what the containers measured against the card's own
//!   figures, and writes one card view per card (`vgpu_contract::cardview`) that the
//!   shims' limiters read.
//! - [`cardmeter`]: what the card itself measured (NVML, with the `nvml` feature).
//! - [`hostpids`]: the host PIDs the card knows the containers' processes by.
//! - [`backstop`]: what is done about a container the card shows over its memory quota.
//! - [`tick`]: the loop.
//!
//! Host-side only: nothing here is loaded into a tenant process (the shims link
//! `vgpu-contract` alone).

pub mod backstop;
pub mod cardmeter;
pub mod coordinator;
pub mod hostpids;
pub mod tick;
