//! The slot table (one pointer per export, what the trampolines jump through), loading
//! the real library into it, and the reverse map from real function pointers to export
//! names that `cuGetProcAddress` answers are mapped back with.

use std::collections::HashMap;
use std::ffi::{CStr, c_void};
use std::path::Path;
use std::sync::atomic::{AtomicPtr, Ordering};

/// One pointer per export. `repr(transparent)` over an array of `AtomicPtr` (which has
/// the layout of a plain pointer), so the trampolines can index it with `8 * i`.
#[repr(transparent)]
pub struct Slots<const N: usize>([AtomicPtr<c_void>; N]);

impl<const N: usize> Slots<N> {
    /// Every slot pointing at `initial`.
    pub const fn new(initial: *mut c_void) -> Slots<N> {
        let mut slots = [const { AtomicPtr::new(std::ptr::null_mut()) }; N];
        let mut i = 0;
        while i < N {
            slots[i] = AtomicPtr::new(initial);
            i += 1;
        }
        Slots(slots)
    }

    /// The current target of slot `index`.
    #[inline(always)]
    pub fn get(&self, index: usize) -> *mut c_void {
        self.0[index].load(Ordering::Relaxed)
    }

    fn set(&self, index: usize, target: *mut c_void) {
        self.0[index].store(target, Ordering::Release);
    }
}

/// What loading the real library found.
pub struct RealLibrary {
    /// Real function address -> slot index, for mapping `cuGetProcAddress` answers back.
    by_address: HashMap<usize, usize>,
    /// Names the real library lacks (their slots return the API's "not found" error).
    pub missing: Vec<&'static CStr>,
    /// Where it was loaded from.
    pub path: std::path::PathBuf,
}

impl RealLibrary {
    /// The export whose real address is `address`, if the real library exports it.
    pub fn index_of(&self, address: *const c_void) -> Option<usize> {
        self.by_address.get(&(address as usize)).copied()
    }

    /// How many exports resolved.
    pub fn resolved(&self) -> usize {
        self.by_address.len()
    }
}

/// Opens `path` (RTLD_NOW | RTLD_LOCAL, never unloaded) and points every slot at its
/// real function, or at `missing_stub` when the library lacks the name. When two names
/// share one address, the map keeps the one with a hook, so a hook is never bypassed.
pub fn load_real<const N: usize>(
    path: &Path,
    names: &'static [&'static CStr; N],
    slots: &Slots<N>,
    hooked: impl Fn(usize) -> bool,
    missing_stub: *mut c_void,
) -> Result<RealLibrary, String> {
    // SAFETY: loading the real driver runs its initialisers, which is what the
    // application asked for when it loaded us. RTLD_LOCAL keeps its names out of the
    // global scope, where they would shadow ours.
    let library = unsafe {
        libloading::os::unix::Library::open(
            Some(path),
            libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_LOCAL,
        )
    }
    .map_err(|err| match std::error::Error::source(&err) {
        Some(cause) => format!("{err}: {cause}"),
        None => err.to_string(),
    })?;
    let mut by_address = HashMap::with_capacity(N);
    let mut missing = Vec::new();
    for (index, name) in names.iter().enumerate() {
        // SAFETY: we only read the symbol's address; it is called later through the
        // trampoline with the caller's own (correct) signature.
        let symbol = unsafe { library.get::<*mut c_void>(name.to_bytes_with_nul()) };
        match symbol {
            Ok(symbol) => {
                let address = symbol.into_raw();
                slots.set(index, address);
                let keep_existing = by_address
                    .get(&(address as usize))
                    .is_some_and(|&other| hooked(other));
                if !keep_existing {
                    by_address.insert(address as usize, index);
                }
            }
            Err(_) => {
                slots.set(index, missing_stub);
                missing.push(*name);
            }
        }
    }
    // The real library stays loaded for the life of the process.
    std::mem::forget(library);
    Ok(RealLibrary {
        by_address,
        missing,
        path: path.to_path_buf(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    extern "C" fn stub() -> u32 {
        7
    }

    #[test]
    fn slots_start_at_the_initial_stub_and_load_fills_them() {
        static NAMES: [&CStr; 3] = [c"getpid", c"no_such_function_anywhere", c"getppid"];
        let slots: Slots<3> = Slots::new(stub as *mut c_void);
        assert_eq!(slots.get(1), stub as *mut c_void);
        let libc = Path::new("libc.so.6");
        let real =
            load_real(libc, &NAMES, &slots, |_| false, std::ptr::null_mut()).expect("libc loads");
        assert_eq!(real.missing, vec![c"no_such_function_anywhere"]);
        assert!(slots.get(1).is_null());
        assert_eq!(real.index_of(slots.get(0)), Some(0));
        assert_eq!(real.index_of(slots.get(2)), Some(2));
        assert_eq!(real.resolved(), 2);
    }

    #[test]
    fn missing_library_is_an_error() {
        static NAMES: [&CStr; 1] = [c"x"];
        let slots: Slots<1> = Slots::new(std::ptr::null_mut());
        assert!(
            load_real(
                Path::new("/nonexistent/libx.so"),
                &NAMES,
                &slots,
                |_| false,
                std::ptr::null_mut()
            )
            .is_err()
        );
    }
}
