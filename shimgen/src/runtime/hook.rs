//! Writing a hook: [`define_hook!`](crate::define_hook) makes an exported C function
//! that runs its body under [`guard`] (no panic unwinds into C) and hands the body the
//! real function, [`call_real!`](crate::call_real) fetches another export's real
//! function, [`run_at_load!`](crate::run_at_load) runs the shim's start at load time.
//!
//! A hook's body gets `forward`: the real function called with exactly the hook's own
//! arguments, unchanged. It is safe to call because the one `unsafe` call behind it is
//! here, argued once: the C caller passed those arguments to this export, whose real
//! function has the same C signature, so handing them on is the call the caller made.
//! `forward` borrows a local of the hook's frame, so it cannot outlive the call (nor be
//! stored or sent to another thread). Calls with any other arguments (our own
//! out-pointers, a scratch copy) take `real`, the raw function, in an `unsafe` block
//! that says why those arguments are valid. What a body reads or writes through its
//! caller's pointers goes through the copying functions of
//! [`pointers`](super::pointers).

use std::panic::{AssertUnwindSafe, catch_unwind};

/// Runs a hook body; a panic becomes `on_panic` instead of unwinding into C.
#[inline(always)]
pub fn guard<R>(on_panic: R, body: impl FnOnce() -> R) -> R {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or(on_panic)
}

/// Defines an exported hook for a shim. `$exports` is the shim's generated module (with
/// `SLOTS` and `idx`), `$on_panic` the API's error code for a caught panic. The body
/// runs under [`guard`] and names what it is given:
///
/// - `|forward|`: a `Copy` closure calling the real function (or the stub that returns
///   the right error) with the hook's own arguments;
/// - `|forward, real|`: that, and the raw real function with the hook's own C
///   signature, for calls with other arguments (each in its own `unsafe` block);
/// - `|real|`: the raw real function only (the older form; every call is `unsafe`).
///
/// ```
/// # use vgpu_shimgen::runtime::Slots;
/// # mod exports {
/// #     pub static SLOTS: vgpu_shimgen::runtime::Slots<1> =
/// #         vgpu_shimgen::runtime::Slots::new(super::doubled as *mut core::ffi::c_void);
/// #     #[allow(non_upper_case_globals)]
/// #     pub mod idx { pub const exampleCall: usize = 0; }
/// # }
/// # extern "C" fn doubled(value: u32) -> u32 { value * 2 }
/// vgpu_shimgen::define_hook! {
///     crate::exports, u32::MAX;
///     fn exampleCall(value: u32) -> u32 |forward| {
///         forward().saturating_add(1)
///     }
/// }
/// # fn main() {
/// // SAFETY: the example's real function takes any u32.
/// assert_eq!(unsafe { exampleCall(20) }, 41);
/// # }
/// ```
///
/// `forward` cannot leave the call it belongs to:
///
/// ```compile_fail
/// # mod exports {
/// #     pub static SLOTS: vgpu_shimgen::runtime::Slots<1> =
/// #         vgpu_shimgen::runtime::Slots::new(std::ptr::null_mut());
/// #     #[allow(non_upper_case_globals)]
/// #     pub mod idx { pub const exampleCall: usize = 0; }
/// # }
/// static KEPT: std::sync::Mutex<Option<Box<dyn Fn() -> u32 + Send>>> =
///     std::sync::Mutex::new(None);
/// vgpu_shimgen::define_hook! {
///     crate::exports, u32::MAX;
///     fn exampleCall(value: u32) -> u32 |forward| {
///         *KEPT.lock().unwrap() = Some(Box::new(forward));
///         0
///     }
/// }
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! define_hook {
    ($exports:path, $on_panic:expr;
     $(#[$meta:meta])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty
     |$($binding:ident),+| $body:block) => {
        $(#[$meta])*
        #[unsafe(no_mangle)]
        #[allow(non_snake_case, clippy::missing_safety_doc)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            use $exports as exports;
            // SAFETY: the slot holds the real function of this very export (same C
            // signature), or a stub that ignores its arguments and returns an error code.
            let real_function = unsafe {
                ::core::mem::transmute::<*mut ::core::ffi::c_void, unsafe extern "C" fn($($ty),*) -> $ret>(
                    exports::SLOTS.get(exports::idx::$name),
                )
            };
            $crate::define_hook!(@bind real_function, ($($arg),*), [$($binding),+] $($binding),+);
            $crate::runtime::guard($on_panic, move || $body)
        }
    };
    // The binding names are matched as words (`forward`, `real`) and then bound with the
    // caller's own tokens, so the body can see them.
    (@bind $real:ident, ($($arg:ident),*), [forward] $forward:ident) => {
        $crate::define_hook!(@forward $real, ($($arg),*), $forward);
    };
    (@bind $real:ident, ($($arg:ident),*), [forward, real] $forward:ident, $raw:ident) => {
        $crate::define_hook!(@forward $real, ($($arg),*), $forward);
        let $raw = $real;
    };
    (@bind $real:ident, ($($arg:ident),*), [real] $raw:ident) => {
        let $raw = $real;
    };
    (@forward $real:ident, ($($arg:ident),*), $forward:ident) => {
        // The frame `forward` borrows, so that it cannot outlive the call.
        let this_call = ();
        let $forward = {
            let this_call = &this_call;
            move || {
                let _in_this_call: &() = this_call;
                // SAFETY: the caller's own arguments, unchanged, to the real function of
                // the export they called it as (same C signature), or to a stub that
                // ignores them; `forward` cannot outlive the call, so every pointer
                // among them is as valid as the caller made it.
                unsafe { $real($($arg),*) }
            }
        };
    };
}

/// The real function behind export `$name` of a shim (`$exports` is its generated
/// module), typed with the C signature the caller states.
#[macro_export]
macro_rules! call_real {
    ($exports:path, $name:ident as fn($($ty:ty),*) -> $ret:ty) => {{
        use $exports as exports;
        // SAFETY: the slot holds the real export `$name` (whose C signature the caller
        // states) or an error stub that ignores its arguments.
        unsafe {
            ::core::mem::transmute::<*mut ::core::ffi::c_void, unsafe extern "C" fn($($ty),*) -> $ret>(
                exports::SLOTS.get(exports::idx::$name),
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

    #[test]
    fn guard_turns_panics_into_errors() {
        assert_eq!(guard(999, || 0), 0);
        assert_eq!(guard(999, || panic!("boom")), 999);
    }

    /// A stand-in for a shim's generated module: three exports whose real function
    /// adds 100 to its argument.
    mod exports {
        use crate::runtime::Slots;
        pub static SLOTS: Slots<3> = Slots::new(super::add_hundred as *mut core::ffi::c_void);
        #[allow(non_upper_case_globals)]
        pub mod idx {
            pub const vgpu_shimgen_test_forward: usize = 0;
            pub const vgpu_shimgen_test_both: usize = 1;
            pub const vgpu_shimgen_test_real: usize = 2;
        }
    }

    extern "C" fn add_hundred(value: u32) -> u32 {
        value + 100
    }

    crate::define_hook! {
        crate::runtime::hook::tests::exports, 999;
        fn vgpu_shimgen_test_forward(value: u32) -> u32 |forward| {
            if value == 0 {
                panic!("a hook panicked");
            }
            // `forward` is Copy: a body may hand it on and still call it.
            let twice = forward;
            forward() + twice()
        }
    }

    crate::define_hook! {
        crate::runtime::hook::tests::exports, 999;
        fn vgpu_shimgen_test_both(value: u32) -> u32 |forward, real| {
            // SAFETY: the stand-in's real function takes any u32.
            forward() * 1000 + unsafe { real(value + 1) }
        }
    }

    crate::define_hook! {
        crate::runtime::hook::tests::exports, 999;
        fn vgpu_shimgen_test_real(value: u32) -> u32 |real| {
            // SAFETY: as above.
            unsafe { real(value * 2) }
        }
    }

    #[test]
    fn forward_calls_the_real_function_with_the_hooks_own_arguments() {
        // SAFETY: the test hooks take any u32.
        unsafe {
            assert_eq!(vgpu_shimgen_test_forward(1), 202);
            assert_eq!(
                vgpu_shimgen_test_forward(0),
                999,
                "a panic is the error code"
            );
            assert_eq!(vgpu_shimgen_test_both(1), 101_102);
            assert_eq!(vgpu_shimgen_test_real(4), 108);
        }
    }
}
