//! Application-side support shared by both shims, one job a file:
//!
//! - [`slots`]: the slot table, loading the real library into it, and the reverse map
//!   from real function pointers to export names;
//! - [`start`]: what a shim does when it loads (config, real library) and the policy
//!   every hook acts on;
//! - [`hook`]: the panic guard and the macros that write hooks, with the one audited
//!   forwarding of a hook's own arguments;
//! - [`pointers`]: the one audited way hooks read and write their caller's pointers;
//! - [`sync`]: the one rule for poisoned locks;
//! - [`log`](mod@log): logging, off unless `VGPU_LOG` asks.

pub mod hook;
pub mod log;
pub mod pointers;
pub mod slots;
pub mod start;
pub mod sync;

pub use hook::guard;
pub use log::{Level, log, log_level, notice};
pub use slots::{RealLibrary, Slots, load_real};
pub use start::{FailedClosed, Policy, Start, StartConfig};
pub use sync::{lock, try_lock};
