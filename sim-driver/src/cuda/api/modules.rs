//! Modules, libraries, kernels and functions: images (PTX, cubin, fatbin) are parsed
//! for their entry names and static data; a module's code and static data are charged
//! at the load; a library's static data in each context at its first use there, or at
//! the load into the current one under `CUDA_MODULE_LOADING=EAGER` (`cuda::limits`).

use std::collections::{HashMap, HashSet};
use std::ffi::{c_char, c_void};

use super::support::{Res, cuda, out, require_current};
use crate::clock::duration_from_name;
use crate::cuda::errors::*;
use crate::cuda::registry::*;
use crate::cuda::with_registry;
use crate::ffi::{self, c_str};
use vgpu_abi::image::{self as abi_image, ImageKind};

/// Entry names declared by a PTX text.
fn ptx_entries(text: &str) -> HashSet<String> {
    let mut entries = HashSet::new();
    let mut rest = text;
    while let Some(at) = rest.find(".entry") {
        let after = &rest[at + ".entry".len()..];
        let name: String = after
            .trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '$' | '.'))
            .collect();
        if !name.is_empty() {
            entries.insert(name);
        }
        rest = after;
    }
    entries
}

/// Kernel names of a cubin: its `.text.<name>` sections.
fn elf_entries(image: &[u8]) -> Result<HashSet<String>, CUresult> {
    let u16_at = |at: usize| {
        image
            .get(at..at + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]) as u64)
    };
    let u32_at = |at: usize| {
        image
            .get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as u64)
    };
    let u64_at = |at: usize| {
        image
            .get(at..at + 8)
            .map(|b| u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
    };
    if image.get(4) != Some(&2) {
        return Err(CUDA_ERROR_INVALID_IMAGE); // only ELF64 cubins
    }
    let shoff = u64_at(0x28).ok_or(CUDA_ERROR_INVALID_IMAGE)? as usize;
    let shentsize = u16_at(0x3a).ok_or(CUDA_ERROR_INVALID_IMAGE)? as usize;
    let shnum = u16_at(0x3c).ok_or(CUDA_ERROR_INVALID_IMAGE)? as usize;
    let shstrndx = u16_at(0x3e).ok_or(CUDA_ERROR_INVALID_IMAGE)? as usize;
    let section = |index: usize| -> Option<(u64, u64, u64)> {
        let at = shoff + index * shentsize;
        Some((u32_at(at)?, u64_at(at + 0x18)?, u64_at(at + 0x20)?))
    };
    let (_, strtab_offset, strtab_size) = section(shstrndx).ok_or(CUDA_ERROR_INVALID_IMAGE)?;
    let strtab = image
        .get(strtab_offset as usize..(strtab_offset + strtab_size) as usize)
        .ok_or(CUDA_ERROR_INVALID_IMAGE)?;
    let mut entries = HashSet::new();
    for index in 0..shnum {
        let (name_offset, _, _) = section(index).ok_or(CUDA_ERROR_INVALID_IMAGE)?;
        let name_bytes = strtab.get(name_offset as usize..).unwrap_or(&[]);
        let end = name_bytes
            .iter()
            .position(|b| *b == 0)
            .unwrap_or(name_bytes.len());
        if let Some(kernel) = std::str::from_utf8(&name_bytes[..end])
            .ok()
            .and_then(|name| name.strip_prefix(".text."))
        {
            entries.insert(kernel.to_string());
        }
    }
    Ok(entries)
}

/// What a loaded image holds: its entry names (None when the format hides them: any
/// name is accepted) and the static data it declares.
type Loaded = (Option<HashSet<String>>, u64);

/// An image in memory: PTX text, an ELF cubin (its length read from its header), or a
/// fatbin (whose kernels are not listed), directly or behind its wrapper.
fn image_entries(image: *const c_void) -> Result<Loaded, CUresult> {
    // PTX text may be shorter than any header: the first bytes up to a NUL (no magic
    // holds one).
    let mut head = [0u8; 4];
    for (index, byte) in head.iter_mut().enumerate() {
        let at = image.cast::<u8>().wrapping_add(index);
        match ffi::bytes(at, 1).ok_or(CUDA_ERROR_INVALID_VALUE)?[0] {
            0 => break,
            value => *byte = value,
        }
    }
    match abi_image::kind(&head) {
        ImageKind::Elf => {
            let header = ffi::bytes(image.cast::<u8>(), 64).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            let table_end = abi_image::elf_table_end(header).ok_or(CUDA_ERROR_INVALID_IMAGE)?;
            let table =
                ffi::bytes(image.cast::<u8>(), table_end).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            let names_end = abi_image::elf_names_end(table).ok_or(CUDA_ERROR_INVALID_IMAGE)?;
            let whole = ffi::bytes(image.cast::<u8>(), table_end.max(names_end))
                .ok_or(CUDA_ERROR_INVALID_VALUE)?;
            elf_loaded(whole)
        }
        ImageKind::Fatbin => fatbin_loaded(image.cast::<u8>()),
        ImageKind::FatbinWrapper => {
            let wrapper = ffi::bytes(image.cast::<u8>(), 16).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            let data = u64::from_le_bytes(
                wrapper[8..16]
                    .try_into()
                    .map_err(|_| CUDA_ERROR_INVALID_IMAGE)?,
            );
            fatbin_loaded(data as usize as *const u8)
        }
        ImageKind::Ptx => {
            let text = c_str(image.cast::<c_char>()).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            ptx_from_text(&text)
                .map(|entries| (Some(entries), abi_image::ptx_static_bytes(text.as_bytes())))
        }
    }
}

fn elf_loaded(image: &[u8]) -> Result<Loaded, CUresult> {
    let entries = elf_entries(image)?;
    Ok((
        Some(entries),
        abi_image::elf_static_bytes(image).unwrap_or(0),
    ))
}

/// A fatbin in memory: no entry names; the static data of its readable entries.
fn fatbin_loaded(at: *const u8) -> Result<Loaded, CUresult> {
    let header = ffi::bytes(at, 16).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let len = abi_image::fatbin_len(header).ok_or(CUDA_ERROR_INVALID_IMAGE)?;
    let whole = ffi::bytes(at, len).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    Ok((None, abi_image::fatbin_static_bytes(whole).unwrap_or(0)))
}

fn ptx_from_text(text: &str) -> Result<HashSet<String>, CUresult> {
    if !(text.contains(".version") || text.contains(".entry") || text.contains(".target")) {
        return Err(CUDA_ERROR_INVALID_IMAGE);
    }
    require_jit_compiler()?;
    Ok(ptx_entries(text))
}

/// Loads the JIT helper named by `VGPU_SIM_PTX_JIT_LIBRARY` by name, through the loader's
/// search path as the real driver does, so a container layout that hides the driver's
/// helpers fails over the sim as it fails on a GPU.
fn require_jit_compiler() -> Result<(), CUresult> {
    use std::os::unix::ffi::OsStringExt;
    let Some(name) = std::env::var_os(crate::config::PTX_JIT_LIBRARY_ENV).filter(|n| !n.is_empty())
    else {
        return Ok(());
    };
    // cuda.h's code (vgpu_abi's CUresult is unsigned, the sim's signed).
    const NOT_FOUND: CUresult = vgpu_abi::cuda::CUDA_ERROR_JIT_COMPILER_NOT_FOUND as CUresult;
    let name = std::ffi::CString::new(name.into_vec()).map_err(|_| NOT_FOUND)?;
    // SAFETY: dlopen of a NUL-terminated name; the handle is never closed, as the driver
    // keeps its helper loaded.
    let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
    if handle.is_null() {
        Err(NOT_FOUND)
    } else {
        Ok(())
    }
}

/// An image file: its entry names and static data.
fn file_entries(path: &str) -> Result<Loaded, CUresult> {
    let bytes = std::fs::read(path).map_err(|_| CUDA_ERROR_FILE_NOT_FOUND)?;
    match abi_image::kind(&bytes) {
        ImageKind::Elf => elf_loaded(&bytes),
        ImageKind::Fatbin => Ok((None, abi_image::fatbin_static_bytes(&bytes).unwrap_or(0))),
        ImageKind::FatbinWrapper => Err(CUDA_ERROR_INVALID_IMAGE),
        ImageKind::Ptx => {
            let text = String::from_utf8_lossy(&bytes);
            ptx_from_text(&text).map(|entries| (Some(entries), abi_image::ptx_static_bytes(&bytes)))
        }
    }
}

/// Whether libraries load lazily (`CUDA_MODULE_LOADING`, LAZY unless EAGER, as the real
/// driver since CUDA 12.2).
fn lazy_loading() -> bool {
    static LAZY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *LAZY.get_or_init(|| {
        std::env::var("CUDA_MODULE_LOADING")
            .map_or(true, |mode| !mode.trim().eq_ignore_ascii_case("EAGER"))
    })
}

fn load_module(module_out: *mut u64, (entries, static_bytes): Loaded) -> Res {
    if module_out.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let ctx = require_current()?;
    let handle = with_registry(|registry| {
        // The driver loads the module's code into device memory, after the context.
        let charged = registry.sim.config.module_overhead;
        let device = registry.context(ctx)?.device;
        registry.charge(device, charged)?;
        let handle = registry.handle(TAG_MODULE);
        registry.modules.insert(
            handle,
            Module {
                ctx,
                charged,
                static_bytes,
                data_loaded: false,
                entries,
                functions: HashMap::new(),
            },
        );
        // A module's data arrives with the load, lazy loading or not (as measured on
        // the H200, driver 580: +1536 MiB at cuModuleLoadData under LAZY).
        if let Err(code) = registry.load_module_data(handle) {
            registry.unload_module(handle);
            return Err(code);
        }
        Ok(handle)
    })?;
    out(module_out, handle)
}

fn load_library(library_out: *mut u64, (entries, static_bytes): Loaded) -> Res {
    if library_out.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let current = require_current().ok();
    let handle = with_registry(|registry| {
        let handle = registry.handle(TAG_LIBRARY);
        registry.libraries.insert(
            handle,
            Library {
                entries,
                kernels: HashMap::new(),
                static_bytes,
                loaded_in: Vec::new(),
            },
        );
        if let Some(ctx) = current.filter(|_| !lazy_loading())
            && let Err(code) = registry.load_library_data(handle, ctx)
        {
            registry.libraries.remove(&handle);
            return Err(code);
        }
        Ok(handle)
    })?;
    out(library_out, handle)
}

fn kernel_duration(registry: &Registry, name: &str) -> u64 {
    duration_from_name(name).unwrap_or(registry.sim.config.kernel_ns)
}

/// Local memory per thread of a simulated kernel: `N` KiB for a name with `_local<N>k`
/// (`big_local16k`), else none.
pub(crate) fn local_bytes_of(name: &str) -> u64 {
    name.split("_local")
        .nth(1)
        .and_then(|rest| rest.strip_suffix('k').or_else(|| rest.split('k').next()))
        .and_then(|digits| digits.parse::<u64>().ok())
        .map_or(0, |kib| kib.saturating_mul(1024))
}

/// Function attributes of every simulated kernel (local memory: `local_bytes_of`).
fn function_attribute(attribute: i32) -> Option<i32> {
    Some(match attribute {
        0 => 1024,    // MAX_THREADS_PER_BLOCK
        1 => 0,       // SHARED_SIZE_BYTES
        2 => 0,       // CONST_SIZE_BYTES
        3 => 0,       // LOCAL_SIZE_BYTES
        4 => 32,      // NUM_REGS
        5 => 90,      // PTX_VERSION
        6 => 90,      // BINARY_VERSION
        7 => 0,       // CACHE_MODE_CA
        8 => 49152,   // MAX_DYNAMIC_SHARED_SIZE_BYTES
        9 => -1,      // PREFERRED_SHARED_MEMORY_CARVEOUT
        10 => 0,      // CLUSTER_SIZE_MUST_BE_SET
        11..=13 => 0, // REQUIRED_CLUSTER_WIDTH/HEIGHT/DEPTH
        14 => 1,      // NON_PORTABLE_CLUSTER_SIZE_ALLOWED
        15 => 0,      // CLUSTER_SCHEDULING_POLICY_PREFERENCE
        _ => return None,
    })
}

cuda! {
    fn cuModuleLoad(module: *mut u64, path: *const c_char) {
        let path = c_str(path).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        require_current()?;
        let entries = file_entries(&path)?;
        load_module(module, entries)
    }

    fn cuModuleLoadData(module: *mut u64, image: *const c_void) {
        require_current()?;
        let entries = image_entries(image)?;
        load_module(module, entries)
    }

    /// JIT options are accepted and ignored.
    fn cuModuleLoadDataEx(module: *mut u64, image: *const c_void, num_options: u32, options: *mut i32, option_values: *mut *mut c_void) {
        if num_options > 0 && (options.is_null() || option_values.is_null()) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        require_current()?;
        let entries = image_entries(image)?;
        load_module(module, entries)
    }

    fn cuModuleLoadFatBinary(module: *mut u64, image: *const c_void) {
        require_current()?;
        let entries = image_entries(image)?;
        load_module(module, entries)
    }

    fn cuModuleUnload(module: u64) {
        with_registry(|registry| if registry.unload_module(module) { Ok(()) } else { Err(CUDA_ERROR_INVALID_HANDLE) })
    }

    fn cuModuleGetFunction(function: *mut u64, module: u64, name: *const c_char) {
        let name = c_str(name).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if function.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let handle = with_registry(|registry| {
            let found = registry.modules.get(&module).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
            if let Some(existing) = found.functions.get(&name) {
                return Ok(*existing);
            }
            if found.entries.as_ref().is_some_and(|entries| !entries.contains(&name)) {
                return Err(CUDA_ERROR_NOT_FOUND);
            }
            let duration_ns = kernel_duration(registry, &name);
            let handle = registry.handle(TAG_FUNCTION);
            registry.functions.insert(handle, Function { name: name.clone(), duration_ns });
            if let Some(m) = registry.modules.get_mut(&module) {
                m.functions.insert(name, handle);
            }
            Ok(handle)
        })?;
        out(function, handle)
    }

    fn cuLibraryLoadData(library: *mut u64, code: *const c_void, jit_options: *mut i32, jit_values: *mut *mut c_void, num_jit: u32, library_options: *mut i32, library_values: *mut *mut c_void, num_library: u32) {
        if (num_jit > 0 && (jit_options.is_null() || jit_values.is_null())) || (num_library > 0 && (library_options.is_null() || library_values.is_null())) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let entries = image_entries(code)?;
        load_library(library, entries)
    }

    fn cuLibraryLoadFromFile(library: *mut u64, path: *const c_char, jit_options: *mut i32, jit_values: *mut *mut c_void, num_jit: u32, library_options: *mut i32, library_values: *mut *mut c_void, num_library: u32) {
        let _ = (jit_options, jit_values, num_jit, library_options, library_values, num_library);
        let path = c_str(path).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        with_registry(|_| Ok(()))?;
        let entries = file_entries(&path)?;
        load_library(library, entries)
    }

    fn cuLibraryUnload(library: u64) {
        with_registry(|registry| {
            let removed = registry.libraries.remove(&library).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
            for (_, device) in &removed.loaded_in {
                registry.uncharge(*device, removed.static_bytes);
            }
            for kernel in removed.kernels.values() {
                if let Some(k) = registry.kernels.remove(kernel) {
                    for function in k.functions.values() {
                        registry.functions.remove(function);
                    }
                }
            }
            Ok(())
        })
    }

    fn cuLibraryGetKernel(kernel: *mut u64, library: u64, name: *const c_char) {
        let name = c_str(name).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if kernel.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let handle = with_registry(|registry| {
            let found = registry.libraries.get(&library).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
            if let Some(existing) = found.kernels.get(&name) {
                return Ok(*existing);
            }
            if found.entries.as_ref().is_some_and(|entries| !entries.contains(&name)) {
                return Err(CUDA_ERROR_NOT_FOUND);
            }
            let duration_ns = kernel_duration(registry, &name);
            let handle = registry.handle(TAG_KERNEL);
            registry.kernels.insert(handle, Kernel { library, name: name.clone(), duration_ns, functions: HashMap::new() });
            if let Some(l) = registry.libraries.get_mut(&library) {
                l.kernels.insert(name, handle);
            }
            Ok(handle)
        })?;
        out(kernel, handle)
    }

    fn cuKernelGetFunction(function: *mut u64, kernel: u64) {
        if function.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let ctx = require_current()?;
        let handle = with_registry(|registry| {
            let found = registry.kernels.get(&kernel).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
            if let Some(existing) = found.functions.get(&ctx) {
                return Ok(*existing);
            }
            let (name, duration_ns, library) = (found.name.clone(), found.duration_ns, found.library);
            registry.load_library_data(library, ctx)?;
            let handle = registry.handle(TAG_FUNCTION);
            registry.functions.insert(handle, Function { name, duration_ns });
            if let Some(k) = registry.kernels.get_mut(&kernel) {
                k.functions.insert(ctx, handle);
            }
            Ok(handle)
        })?;
        out(function, handle)
    }

    fn cuFuncGetAttribute(value: *mut i32, attribute: i32, function: u64) {
        let name = with_registry(|registry| {
            match (registry.kernels.get(&function), registry.functions.get(&function)) {
                (Some(kernel), _) if tag_of(function) == TAG_KERNEL => Ok(kernel.name.clone()),
                (_, Some(found)) => Ok(found.name.clone()),
                _ => Err(CUDA_ERROR_INVALID_HANDLE),
            }
        })?;
        let local = local_bytes_of(&name).min(i32::MAX as u64) as i32;
        out(value, if attribute == 3 { local } else { function_attribute(attribute).ok_or(CUDA_ERROR_INVALID_VALUE)? })
    }

    fn cuKernelGetAttribute(value: *mut i32, attribute: i32, kernel: u64, dev: i32) {
        let _ = dev;
        let name = with_registry(|registry| registry.kernels.get(&kernel).map(|k| k.name.clone()).ok_or(CUDA_ERROR_INVALID_HANDLE))?;
        let local = local_bytes_of(&name).min(i32::MAX as u64) as i32;
        out(value, if attribute == 3 { local } else { function_attribute(attribute).ok_or(CUDA_ERROR_INVALID_VALUE)? })
    }

    fn cuFuncSetAttribute(function: u64, attribute: i32, value: i32) {
        with_registry(|registry| if registry.functions.contains_key(&function) { Ok(()) } else { Err(CUDA_ERROR_INVALID_HANDLE) })?;
        match attribute {
            8 if (0..=232_448).contains(&value) => Ok(()),
            9 if (-1..=100).contains(&value) => Ok(()),
            10 | 14 | 15 => Ok(()),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }

    fn cuFuncGetName(name: *mut *const c_char, function: u64) {
        // As the real driver: a function's name, not a library kernel's (cuKernelGetName).
        let text = with_registry(|registry| registry.functions.get(&function).map(|f| f.name.clone()).ok_or(CUDA_ERROR_INVALID_HANDLE))?;
        out(name, interned_name(text)?)
    }

    fn cuKernelGetName(name: *mut *const c_char, kernel: u64) {
        let text = with_registry(|registry| registry.kernels.get(&kernel).map(|k| k.name.clone()).ok_or(CUDA_ERROR_INVALID_HANDLE))?;
        out(name, interned_name(text)?)
    }
}

/// `text` as a C string that lives as long as the process (names live as long as their
/// function or kernel; interned so the pointer stays valid after).
fn interned_name(text: String) -> Result<*const c_char, CUresult> {
    static NAMES: std::sync::Mutex<Vec<std::ffi::CString>> = std::sync::Mutex::new(Vec::new());
    let c_name = std::ffi::CString::new(text).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    let mut names = NAMES.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?;
    match names.iter().find(|held| **held == c_name) {
        Some(held) => Ok(held.as_ptr()),
        None => {
            names.push(c_name);
            names
                .last()
                .map(|held| held.as_ptr())
                .ok_or(CUDA_ERROR_UNKNOWN)
        }
    }
}
