//! This process's own bookkeeping of what it holds on the card, beyond single
//! allocations: VMM handles (`vmm`) and memory pools (`pools`). Pure data structures,
//! unit-tested here; the hooks and `state` feed them and apply what they return to the
//! usage region.

pub mod pools;
pub mod vmm;
