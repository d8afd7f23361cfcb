//! Application-side support shared by both shims: the slot table type, loading the real
//! library into it, the reverse map from real function pointers to export names, the
//! panic guard for hooks, and logging that is off unless `VGPU_LOG` asks.

use std::collections::HashMap;
use std::ffi::{CStr, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::sync::OnceLock;
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

/// What the config says a shim should do with the calls it hooks.
pub enum Policy<T> {
    /// No config at all: a transparent forwarder.
    Passthrough,
    /// The config exists but is unusable: every device is hidden.
    FailClosed,
    /// The quota applies, through `T` (the shim's own machinery).
    Apply(Box<T>),
}

/// The config as a shim starts with it.
pub enum StartConfig {
    Absent,
    /// Unusable; the notice has been printed.
    Broken,
    Found(vgpu_common::Config, std::path::PathBuf),
}

/// What every shim does when it loads: read the config (`VGPU_CONFIG`; one stderr line
/// naming the file and the error, then fail closed, when it is unusable), find the real
/// library in the driver folder and fill the slots from it (one stderr line, and every
/// call returns `unloaded_effect`'s error, when it cannot be loaded).
pub struct Start {
    pub shim: &'static str,
    /// File name of the real library in the driver folder (`libcuda.so.1`).
    pub library: &'static str,
    /// What the application then gets, for the notices.
    pub unloaded_effect: &'static str,
    pub fail_closed_effect: &'static str,
}

impl Start {
    pub fn run<const N: usize>(
        &self,
        names: &'static [&'static CStr; N],
        slots: &Slots<N>,
        hooked: impl Fn(usize) -> bool,
        missing_stub: *mut c_void,
    ) -> (Option<RealLibrary>, StartConfig, std::path::PathBuf) {
        use vgpu_common::config::{Config, Loaded};
        let config = match Config::load_from_env() {
            Ok(Loaded::Found(config, path)) => StartConfig::Found(config, path),
            Ok(Loaded::Absent) => StartConfig::Absent,
            Err(err) => {
                notice(
                    self.shim,
                    format_args!("config {err}; {}", self.fail_closed_effect),
                );
                StartConfig::Broken
            }
        };
        let driver_dir = Config::resolved_driver_dir(match &config {
            StartConfig::Found(config, _) => Some(config),
            _ => None,
        });
        let path = driver_dir.join(self.library);
        let real = match load_real(&path, names, slots, hooked, missing_stub) {
            Ok(real) => {
                log(
                    Level::Debug,
                    self.shim,
                    format_args!(
                        "loaded {} ({} of {N} exports, {} missing)",
                        path.display(),
                        real.resolved(),
                        real.missing.len()
                    ),
                );
                Some(real)
            }
            Err(err) => {
                notice(
                    self.shim,
                    format_args!(
                        "cannot load the real library {}: {err}; {}",
                        path.display(),
                        self.unloaded_effect
                    ),
                );
                None
            }
        };
        (real, config, driver_dir)
    }
}

/// Runs a hook body; a panic becomes `on_panic` instead of unwinding into C.
#[inline(always)]
pub fn guard<R>(on_panic: R, body: impl FnOnce() -> R) -> R {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or(on_panic)
}

/// Log levels of `VGPU_LOG` (`off` by default).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Off = 0,
    Error = 1,
    Warn = 2,
    Info = 3,
    Debug = 4,
}

/// The level `VGPU_LOG` set, read once.
pub fn log_level() -> Level {
    static LEVEL: OnceLock<Level> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        match std::env::var("VGPU_LOG")
            .unwrap_or_default()
            .to_ascii_lowercase()
            .as_str()
        {
            "error" => Level::Error,
            "warn" | "warning" => Level::Warn,
            "info" => Level::Info,
            "debug" | "trace" | "1" => Level::Debug,
            _ => Level::Off,
        }
    })
}

/// Writes one line to stderr if `level` is enabled.
pub fn log(level: Level, shim: &str, message: std::fmt::Arguments<'_>) {
    if level != Level::Off && level <= log_level() {
        eprintln!("vgpu-shim[{shim} {}]: {message}", std::process::id());
    }
}

/// Writes one line to stderr whatever the log level: for the few conditions the user
/// must hear about (a broken config, a missing real library).
pub fn notice(shim: &str, message: std::fmt::Arguments<'_>) {
    eprintln!("vgpu-shim[{shim}]: {message}");
}

/// Defines an exported hook for a shim. `$forward` is the shim's generated module (with
/// `SLOTS` and `idx`), `$on_panic` the API's error code for a caught panic. The body
/// sees `$real`, the real function with the hook's own signature (or the stub that
/// returns the right error), and runs under [`guard`].
#[macro_export]
macro_rules! define_hook {
    ($forward:path, $on_panic:expr;
     $(#[$meta:meta])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty |$real:ident| $body:block) => {
        $(#[$meta])*
        #[unsafe(no_mangle)]
        #[allow(non_snake_case, clippy::missing_safety_doc)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            use $forward as forward;
            // SAFETY: the slot holds the real function of this very export (same C
            // signature), or a stub that ignores its arguments and returns an error code.
            let $real = unsafe {
                ::core::mem::transmute::<*mut ::core::ffi::c_void, unsafe extern "C" fn($($ty),*) -> $ret>(
                    forward::SLOTS.get(forward::idx::$name),
                )
            };
            $crate::runtime::guard($on_panic, move || $body)
        }
    };
}

/// The real function behind export `$name` of a shim (`$forward` is its generated
/// module), typed with the C signature the caller states.
#[macro_export]
macro_rules! call_real {
    ($forward:path, $name:ident as fn($($ty:ty),*) -> $ret:ty) => {{
        use $forward as forward;
        // SAFETY: the slot holds the real export `$name` (whose C signature the caller
        // states) or an error stub that ignores its arguments.
        unsafe {
            ::core::mem::transmute::<*mut ::core::ffi::c_void, unsafe extern "C" fn($($ty),*) -> $ret>(
                forward::SLOTS.get(forward::idx::$name),
            )
        }
    }};
}

/// Runs `$init()` when the shim is loaded (an `.init_array` constructor), under
/// [`guard`], so the real library is loaded before any call can arrive.
#[macro_export]
macro_rules! run_at_load {
    ($init:path) => {
        extern "C" fn vgpu_shim_on_load() {
            $crate::runtime::guard((), || {
                $init();
            });
        }

        #[used]
        #[unsafe(link_section = ".init_array")]
        static VGPU_SHIM_ON_LOAD: extern "C" fn() = vgpu_shim_on_load;
    };
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
    fn guard_turns_panics_into_errors() {
        assert_eq!(guard(999, || 0), 0);
        assert_eq!(guard(999, || panic!("boom")), 999);
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
