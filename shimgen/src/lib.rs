//! The forwarding machinery shared by libcuda-shim and libnvml-shim.
//!
//! - [`build`] runs in the shims' build scripts: it reads the driver export lists in
//!   `symbols/` (the single source of truth for names), finds the hooks the shim defines,
//!   and generates the slot table, the name tables and one naked trampoline per
//!   un-hooked export.
//! - [`runtime`] runs inside the application: it loads the real library, fills the slots,
//!   maps real function pointers back to export names, turns the config into the policy
//!   hooks act on, writes hooks (panic-guarded, forwarding their own arguments through
//!   one audited call), recovers poisoned locks and logs (off unless `VGPU_LOG` asks).

pub mod build;
pub mod runtime;
