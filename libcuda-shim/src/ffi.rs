//! The caller's pointers: every read and write the hooks make through a pointer their
//! C caller passed (an out-parameter, a descriptor, a symbol name) goes through here.
//!
//! The rule, argued once: each pointer given to these functions is an argument of the
//! hook being run, unchanged (or a pointer the driver just wrote through one of them),
//! and the CUDA API makes the caller keep it valid for that call: a descriptor readable
//! before the real call, an out-parameter writable, and readable once the real call has
//! succeeded and written it. Null is checked here. The functions copy values in and out
//! (unaligned, so a caller's misaligned struct is read, not trusted), and hand out no
//! reference, so nothing built from a caller's pointer outlives the call.

use std::ffi::{CStr, c_char};

/// The value behind an out-parameter the real call has written; `None` for null.
#[inline]
pub(crate) fn read_out<T: Copy>(pointer: *const T) -> Option<T> {
    // SAFETY: see the module rule: a hook's own out-parameter, written by the real call.
    (!pointer.is_null()).then(|| unsafe { pointer.read_unaligned() })
}

/// Writes `value` to the caller's out-parameter; false (writing nothing) for null.
#[inline]
pub(crate) fn write_out<T: Copy>(pointer: *mut T, value: T) -> bool {
    if pointer.is_null() {
        return false;
    }
    // SAFETY: see the module rule: a hook's own out-parameter, writable for the call.
    unsafe { pointer.write_unaligned(value) };
    true
}

/// A copy of the descriptor the caller passed (read before the real call, as the
/// driver itself reads it); `None` for null.
#[inline]
pub(crate) fn read_descriptor<T: Copy>(pointer: *const T) -> Option<T> {
    // SAFETY: see the module rule: a hook's own input descriptor.
    (!pointer.is_null()).then(|| unsafe { pointer.read_unaligned() })
}

/// The caller's C string, lossily as UTF-8 (`?` for null), for messages.
pub(crate) fn c_string(pointer: *const c_char) -> String {
    if pointer.is_null() {
        return "?".to_string();
    }
    // SAFETY: see the module rule: a NUL-terminated string the driver has just
    // accepted as one.
    unsafe { CStr::from_ptr(pointer) }
        .to_string_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn null_pointers_read_nothing_and_write_nothing() {
        assert_eq!(read_out::<u64>(std::ptr::null()), None);
        assert_eq!(read_descriptor::<[u32; 4]>(std::ptr::null()), None);
        assert!(!write_out::<u64>(std::ptr::null_mut(), 7));
        assert_eq!(c_string(std::ptr::null()), "?");
    }

    #[test]
    fn values_are_copied_in_and_out() {
        let mut out = 0u64;
        assert!(write_out(&mut out, 42));
        assert_eq!(read_out(&out), Some(42));
        // A misaligned descriptor inside a byte buffer is read, not trusted.
        let bytes = [0u8, 1, 0, 0, 0, 2, 0, 0, 0];
        let at_one = bytes[1..].as_ptr().cast::<[u32; 2]>();
        assert_eq!(read_descriptor(at_one), Some([1, 2]));
        assert_eq!(c_string(c"cuMemAlloc_v2".as_ptr()), "cuMemAlloc_v2");
    }
}
