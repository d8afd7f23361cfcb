//! The hooked exports. Every `fn cu...(` in this folder is an export the generator will
//! not give a trampoline; `hook!` makes it an exported, panic-guarded C function.

pub mod capture;
pub mod context;
pub mod context_current;
pub mod device;
pub mod launch;
pub mod limits;
pub mod memory;
pub mod modules;
pub mod pool;
pub mod procaddress;
pub mod vmm;
