//! The caller's pointers: every read and write the hooks make through a pointer their C
//! caller passed (counts, handles, memory structs, record buffers) goes through these
//! copying functions, whose one safety argument is `vgpu_shimgen::runtime::pointers`'s.
//! Nothing built from a caller's pointer outlives the call.

vgpu_shimgen::define_caller_pointers!();
