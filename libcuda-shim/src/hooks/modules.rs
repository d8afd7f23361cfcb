//! Modules and libraries: the driver allocates a module's static data (`__device__`
//! variables) and loads its code without any allocation call. A load is priced from
//! its image (`vgpu_abi::image`: PTX `.global` declarations, a cubin's global sections,
//! a fatbin's entries), refused when that does not fit, and settled with the driver's
//! own figure right after (`crate::allocating`'s `load_begin` -> the load ->
//! `load_finish`, priced as `ledger::reserved` says); an unload credits it back.
//!
//! With lazy loading (`CUDA_MODULE_LOADING=LAZY`, the default since CUDA 12.2) code and
//! data arrive at first use: the image's static data is counted at the load all the
//! same (what the module commits to), and the first `cuModuleGetFunction`,
//! `cuModuleGetGlobal`, `cuLibraryGetModule` or `cuKernelGetFunction` of each handle is
//! settled with the driver's figure at once. The first `cuModuleGetFunction` or
//! `cuKernelGetFunction` of a function whose local memory passes the stack limit also
//! raises the stack limit to it, counted (`hooks::limits`), since its first launch
//! would grow it where nothing is hooked. Launches stay untouched.

use std::ffi::{c_char, c_void};

use vgpu_abi::image::{self, ImageKind};

use crate::allocating::{Priced, Settled};
use crate::cuda::*;
use crate::ffi::{read_out, with_caller_bytes, with_caller_c_bytes};
use crate::hooks::memory::current_context;
use crate::ledger::allocations::AllocKey;
use crate::process::process_state;
use crate::state::{Enforcer, after_success, enforce, enforcing};
use crate::{hook, real};

/// `CUlibrary`, `CUkernel`: opaque handles.
type CUlibrary = *mut c_void;
type CUkernel = *mut c_void;

/// The static data an image in the caller's memory declares (0 where it cannot tell:
/// compressed fatbin entries, a damaged header; those are settled after the load).
fn image_static_bytes(image: *const c_void) -> u64 {
    let at = image.cast::<u8>();
    // The first bytes one at a time, stopping at a NUL: PTX text may be shorter than
    // any header (no magic holds a NUL byte).
    let mut head = [0u8; 4];
    for (index, byte) in head.iter_mut().enumerate() {
        match with_caller_bytes(at.wrapping_add(index), 1, |b| b[0]) {
            Some(0) | None => break,
            Some(value) => *byte = value,
        }
    }
    let found = match image::kind(&head) {
        ImageKind::Elf => with_caller_bytes(at, 64, image::elf_table_end)
            .flatten()
            .and_then(|table_end| {
                let names_end = with_caller_bytes(at, table_end, image::elf_names_end).flatten()?;
                with_caller_bytes(at, table_end.max(names_end), image::elf_static_bytes).flatten()
            }),
        ImageKind::Fatbin => fatbin_static_bytes(at),
        ImageKind::FatbinWrapper => {
            // `__fatBinC_Wrapper_t`: magic, version, then the fatbin's address.
            let data = with_caller_bytes(at, 16, |b| {
                u64::from_le_bytes(b[8..16].try_into().unwrap_or([0; 8]))
            })
            .unwrap_or(0);
            fatbin_static_bytes(data as usize as *const u8)
        }
        ImageKind::Ptx => with_caller_c_bytes(image.cast::<c_char>(), image::ptx_static_bytes),
    };
    found.unwrap_or(0)
}

/// The static data of a fatbin in the caller's memory.
fn fatbin_static_bytes(at: *const u8) -> Option<u64> {
    let len = with_caller_bytes(at, 16, image::fatbin_len).flatten()?;
    with_caller_bytes(at, len, image::fatbin_static_bytes).flatten()
}

/// The static data an image file declares (0 where it cannot tell, or the file is
/// larger than any image).
fn file_static_bytes(path: *const c_char) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let Some(path) = with_caller_c_bytes(path, |b| {
        std::path::PathBuf::from(std::ffi::OsStr::from_bytes(b))
    }) else {
        return 0;
    };
    let fits = std::fs::metadata(&path).is_ok_and(|m| m.len() <= image::MAX_IMAGE_BYTES);
    let Some(bytes) = fits.then(|| std::fs::read(&path).ok()).flatten() else {
        return 0;
    };
    let found = match image::kind(&bytes) {
        ImageKind::Elf => image::elf_static_bytes(&bytes),
        ImageKind::Fatbin => image::fatbin_static_bytes(&bytes),
        ImageKind::FatbinWrapper => None,
        ImageKind::Ptx => Some(image::ptx_static_bytes(&bytes)),
    };
    found.unwrap_or(0)
}

/// Loads through `load` with the static data `static_bytes` counted on the current
/// device (`Enforcer::load_begin`, the load, `Enforcer::load_finish`); the handle is
/// read back from `handle_out` and unloaded with `unload` if the driver's figure then
/// passes the quota (`Enforcer::load_undone`).
fn load_module(
    static_bytes: impl FnOnce() -> u64,
    handle_out: *const usize,
    key: fn(usize) -> AllocKey,
    in_context: bool,
    load: impl FnOnce() -> CUresult + Copy,
    unload: impl FnOnce(usize),
) -> CUresult {
    enforce(load, |enforcer| {
        let Ok(device) = enforcer.current() else {
            // No current context: the driver answers (a library loads for later).
            return load();
        };
        let context = if in_context { current_context() } else { 0 };
        let priced = match enforcer.load_begin(device, static_bytes()) {
            Priced::Refused(error) => return error,
            priced => priced,
        };
        let result = load();
        let loaded = if result == CUDA_SUCCESS {
            read_out(handle_out).filter(|h| *h != 0).map(key)
        } else {
            None
        };
        match enforcer.load_finish(priced, device, context, (result, loaded)) {
            Settled::Kept(result) => result,
            Settled::Over(loaded) => {
                if let Some(AllocKey::Module(handle) | AllocKey::Library(handle)) = loaded {
                    unload(handle);
                }
                enforcer.load_undone(device, loaded)
            }
        }
    })
}

fn unload_module(handle: usize) {
    let unload = real!(cuModuleUnload as fn(CUmodule) -> CUresult);
    // SAFETY: unloading the module the real load just returned, with the real call.
    unsafe { unload(handle as CUmodule) };
}

fn unload_library(handle: usize) {
    let unload = real!(cuLibraryUnload as fn(CUlibrary) -> CUresult);
    // SAFETY: unloading the library the real load just returned, with the real call.
    unsafe { unload(handle as CUlibrary) };
}

/// After an unload: credit its static data and settle with the driver's figure.
fn unloaded(key: AllocKey, result: CUresult) -> CUresult {
    after_success(result, |enforcer| {
        enforcer.ledger().forget(key);
        settle_current(enforcer);
    })
}

/// Settles the current device's count with the driver's figure now.
fn settle_current(enforcer: &'static Enforcer) {
    if enforcer.ledger().slot().is_some()
        && let Ok(device) = enforcer.current()
    {
        enforcer.settle_with_driver(device);
    }
}

/// After a call that may load code or data lazily (the first use of `handle`):
/// settle with the driver's figure, once per handle.
fn first_use(handle: usize, result: CUresult) -> CUresult {
    if result == CUDA_SUCCESS
        && let Some(enforcer) = enforcing()
        && process_state(enforcer).first_use(handle)
    {
        settle_current(enforcer);
    }
    result
}

/// The first use of a function or kernel `handle`: settled as [`first_use`], and its
/// local memory (`local_bytes` asks the driver, on the current device) backed before
/// its first launch (`limits::back_local_memory`); CUDA_ERROR_OUT_OF_MEMORY when that
/// passes the quota.
fn first_use_of_function(
    handle: usize,
    result: CUresult,
    local_bytes: impl FnOnce(CUdevice) -> Option<u64>,
) -> CUresult {
    if result != CUDA_SUCCESS {
        return result;
    }
    let Some(enforcer) = enforcing() else {
        return result;
    };
    if !process_state(enforcer).first_use(handle) {
        return result;
    }
    settle_current(enforcer);
    let Ok(device) = enforcer.current() else {
        return result;
    };
    crate::hooks::limits::back_local_memory(local_bytes(device.handle))
}

/// A function's local memory per thread.
fn function_local_bytes(function: usize) -> Option<u64> {
    let attribute = real!(cuFuncGetAttribute as fn(*mut i32, i32, CUfunction) -> CUresult);
    let mut local = 0i32;
    // SAFETY: our own out-pointer and the function the real call just returned.
    let result = unsafe {
        attribute(
            &mut local,
            CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
            function as CUfunction,
        )
    };
    (result == CUDA_SUCCESS).then_some(local.max(0) as u64)
}

/// A kernel's local memory per thread on `device`.
fn kernel_local_bytes(kernel: usize, device: CUdevice) -> Option<u64> {
    let attribute =
        real!(cuKernelGetAttribute as fn(*mut i32, i32, CUkernel, CUdevice) -> CUresult);
    let mut local = 0i32;
    // SAFETY: our own out-pointer and the kernel the real call just returned.
    let result = unsafe {
        attribute(
            &mut local,
            CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
            kernel as CUkernel,
            device,
        )
    };
    (result == CUDA_SUCCESS).then_some(local.max(0) as u64)
}

hook! {
    fn cuModuleLoad(module: *mut CUmodule, path: *const c_char) -> CUresult |forward| {
        load_module(|| file_static_bytes(path), module.cast(), AllocKey::Module, true, forward, unload_module)
    }
}

hook! {
    fn cuModuleLoadData(module: *mut CUmodule, image: *const c_void) -> CUresult |forward| {
        load_module(|| image_static_bytes(image), module.cast(), AllocKey::Module, true, forward, unload_module)
    }
}

hook! {
    fn cuModuleLoadDataEx(module: *mut CUmodule, image: *const c_void, options: u32, keys: *mut i32, values: *mut *mut c_void) -> CUresult |forward| {
        load_module(|| image_static_bytes(image), module.cast(), AllocKey::Module, true, forward, unload_module)
    }
}

hook! {
    fn cuModuleLoadFatBinary(module: *mut CUmodule, image: *const c_void) -> CUresult |forward| {
        load_module(|| image_static_bytes(image), module.cast(), AllocKey::Module, true, forward, unload_module)
    }
}

hook! {
    fn cuModuleUnload(module: CUmodule) -> CUresult |forward| {
        unloaded(AllocKey::Module(module as usize), forward())
    }
}

hook! {
    fn cuLibraryLoadData(library: *mut CUlibrary, code: *const c_void, jit_keys: *mut i32, jit_values: *mut *mut c_void, jit_count: u32, keys: *mut i32, values: *mut *mut c_void, count: u32) -> CUresult |forward| {
        load_module(|| image_static_bytes(code), library.cast(), AllocKey::Library, false, forward, unload_library)
    }
}

hook! {
    fn cuLibraryLoadFromFile(library: *mut CUlibrary, path: *const c_char, jit_keys: *mut i32, jit_values: *mut *mut c_void, jit_count: u32, keys: *mut i32, values: *mut *mut c_void, count: u32) -> CUresult |forward| {
        load_module(|| file_static_bytes(path), library.cast(), AllocKey::Library, false, forward, unload_library)
    }
}

hook! {
    fn cuLibraryUnload(library: CUlibrary) -> CUresult |forward| {
        unloaded(AllocKey::Library(library as usize), forward())
    }
}

hook! {
    fn cuModuleGetFunction(function: *mut CUfunction, module: CUmodule, name: *const c_char) -> CUresult |forward| {
        let result = forward();
        let function = read_out(function).map_or(0, |f| f as usize);
        first_use_of_function(function, result, |_| function_local_bytes(function))
    }
}

hook! {
    fn cuModuleGetGlobal_v2(pointer: *mut CUdeviceptr, bytes: *mut usize, module: CUmodule, name: *const c_char) -> CUresult |forward| {
        let result = forward();
        first_use(read_out(pointer).unwrap_or(0) as usize, result)
    }
}

hook! {
    fn cuLibraryGetModule(module: *mut CUmodule, library: CUlibrary) -> CUresult |forward| {
        let result = forward();
        first_use(read_out(module).map_or(0, |m| m as usize), result)
    }
}

hook! {
    fn cuKernelGetFunction(function: *mut CUfunction, kernel: CUkernel) -> CUresult |forward| {
        let result = forward();
        let function = read_out(function).map_or(0, |f| f as usize);
        first_use_of_function(function, result, |_| function_local_bytes(function))
    }
}

hook! {
    /// A kernel the runtime launches as such (a `CUkernel` to cuLaunchKernel), in the
    /// current context.
    fn cuLibraryGetKernel(kernel: *mut CUkernel, library: CUlibrary, name: *const c_char) -> CUresult |forward| {
        let result = forward();
        let kernel = read_out(kernel).map_or(0, |k| k as usize);
        first_use_of_function(kernel, result, |device| kernel_local_bytes(kernel, device))
    }
}
