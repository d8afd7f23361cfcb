//! vgpu-abi: the facts that must match NVIDIA's public C headers, kept in one place.
//!
//! - [`cuda`]: types, result codes, attributes, descriptor layouts and the
//!   `CUarray_format` table of `cuda.h`;
//! - [`nvml`]: types, return codes and struct layouts of `nvml.h`;
//! - [`entry`]: the C types of the entry points tools call through a looked-up
//!   pointer, each beside its export name;
//! - [`image`]: the module image formats (PTX, cubin, fatbin) and the static data they
//!   declare.
//!
//! The shims, the simulated driver, the plugin and the CLI all read these from here, so
//! a fact is written once and a test (here) pins it to the header. Nothing in this crate
//! does I/O, allocates on a hot path or panics on any input.

#![forbid(unsafe_code)]
#![no_std]
#![allow(non_camel_case_types)]

pub mod cuda;
pub mod entry;
pub mod image;
pub mod nvml;
