//! The audited boundary with C callers: every read of a caller's pointer and every write
//! through one goes through these helpers, which refuse NULL and never unwind.
//!
//! The caller of a C API promises that a non-NULL pointer points to a valid object of
//! the documented type; these helpers rely on that promise and on nothing else.

use std::ffi::{CStr, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};

/// Writes `value` through the caller's out-pointer; false when it is NULL.
pub(crate) fn write_out<T>(ptr: *mut T, value: T) -> bool {
    if ptr.is_null() {
        return false;
    }
    // SAFETY: non-NULL, and the C API contract says it points to a writable T.
    // write_unaligned: C callers are not obliged to align the way Rust would.
    unsafe { ptr.write_unaligned(value) };
    true
}

/// Reads the caller's in-pointer; None when it is NULL.
pub(crate) fn read_in<T: Copy>(ptr: *const T) -> Option<T> {
    if ptr.is_null() {
        return None;
    }
    // SAFETY: non-NULL, and the C API contract says it points to a readable T.
    Some(unsafe { ptr.read_unaligned() })
}

/// Reads element `index` of a caller's array.
pub(crate) fn read_at<T: Copy>(ptr: *const T, index: usize) -> Option<T> {
    if ptr.is_null() {
        return None;
    }
    // SAFETY: the caller passed an array of at least index+1 elements (its count argument).
    Some(unsafe { ptr.add(index).read_unaligned() })
}

/// Writes element `index` of a caller's array.
pub(crate) fn write_at<T>(ptr: *mut T, index: usize, value: T) -> bool {
    if ptr.is_null() {
        return false;
    }
    // SAFETY: the caller passed an array with room for index+1 elements (its count argument).
    unsafe { ptr.add(index).write_unaligned(value) };
    true
}

/// A caller's NUL-terminated string, as UTF-8 (lossy); None when NULL.
pub(crate) fn c_str(ptr: *const c_char) -> Option<String> {
    if ptr.is_null() {
        return None;
    }
    // SAFETY: non-NULL, and the C API contract says it is NUL-terminated.
    Some(
        unsafe { CStr::from_ptr(ptr) }
            .to_string_lossy()
            .into_owned(),
    )
}

/// Copies `text` and a NUL into a caller's buffer of `len` bytes; false when it does not fit.
pub(crate) fn copy_c_string(buffer: *mut c_char, len: usize, text: &str) -> bool {
    if buffer.is_null() || text.len() + 1 > len {
        return false;
    }
    // SAFETY: the buffer has `len` writable bytes (caller's contract) and we write text.len()+1 <= len.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), buffer.cast::<u8>(), text.len());
        *buffer.add(text.len()) = 0;
    }
    true
}

/// Copies as much of `text` as fits (always NUL-terminated), as cuDeviceGetName does.
pub(crate) fn copy_c_string_truncated(buffer: *mut c_char, len: usize, text: &str) -> bool {
    if buffer.is_null() || len == 0 {
        return false;
    }
    let n = text.len().min(len - 1);
    // SAFETY: the buffer has `len` writable bytes and we write n+1 <= len.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), buffer.cast::<u8>(), n);
        *buffer.add(n) = 0;
    }
    true
}

/// Bytes `[ptr, ptr+len)` of a caller's buffer, for images whose length the format gives.
pub(crate) fn bytes<'a>(ptr: *const u8, len: usize) -> Option<&'a [u8]> {
    if ptr.is_null() {
        return None;
    }
    // SAFETY: the caller's image spans at least `len` bytes (read from its own header).
    Some(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// Runs an API body, turning a panic into the API's "unknown error" code.
pub(crate) fn guard<R: Copy>(unknown: R, body: impl FnOnce() -> R) -> R {
    crate::install_panic_hook();
    catch_unwind(AssertUnwindSafe(body)).unwrap_or(unknown)
}
