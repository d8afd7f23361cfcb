//! The caller's pointers: [`define_caller_pointers!`](crate::define_caller_pointers)
//! writes, into a shim's own `ffi` module, the few functions through which the hooks read
//! and write every pointer their C caller passed (out-parameters, descriptors, record
//! buffers, names). They are crate-private to the shim that invokes the macro, and their
//! one safety argument is written here, once:
//!
//! each pointer given to them is an argument of the hook being run, unchanged (or a
//! pointer the driver just wrote through one of them), and the C API makes the caller
//! keep it valid for that call: a descriptor readable before the real call, an
//! out-parameter writable, and readable once the real call has succeeded and written
//! it, a record buffer writable for as many records as the caller said it holds. Null
//! is checked here. Values are copied in and out (unaligned, so a caller's misaligned
//! struct is read, not trusted) and no reference is handed out, so nothing built from a
//! caller's pointer outlives the call.

/// Defines `read_out`, `write_out`, `read_descriptor`, `write_records`,
/// `with_caller_bytes`, `with_caller_c_bytes` and `c_string`
/// (crate-private) in the invoking module; see the module docs for their rule.
#[macro_export]
macro_rules! define_caller_pointers {
    () => {
        /// The value behind an out-parameter the real call has written; `None` for null.
        #[inline]
        #[allow(dead_code)]
        pub(crate) fn read_out<T: Copy>(pointer: *const T) -> Option<T> {
            // SAFETY: a hook's own out-parameter, written by the real call (the rule of
            // `vgpu_shimgen::runtime::pointers`).
            (!pointer.is_null()).then(|| unsafe { pointer.read_unaligned() })
        }

        /// Writes `value` to the caller's out-parameter; false (writing nothing) for null.
        #[inline]
        #[allow(dead_code)]
        pub(crate) fn write_out<T: Copy>(pointer: *mut T, value: T) -> bool {
            if pointer.is_null() {
                return false;
            }
            // SAFETY: a hook's own out-parameter, writable for the call (the rule of
            // `vgpu_shimgen::runtime::pointers`).
            unsafe { pointer.write_unaligned(value) };
            true
        }

        /// A copy of the descriptor the caller passed (read before the real call, as the
        /// driver itself reads it); `None` for null.
        #[inline]
        #[allow(dead_code)]
        pub(crate) fn read_descriptor<T: Copy>(pointer: *const T) -> Option<T> {
            // SAFETY: a hook's own input descriptor (the rule of
            // `vgpu_shimgen::runtime::pointers`).
            (!pointer.is_null()).then(|| unsafe { pointer.read_unaligned() })
        }

        /// Copies `records` into the caller's buffer, which the caller said holds
        /// `room` of them; false (writing nothing) for null or too little room.
        #[allow(dead_code)]
        pub(crate) fn write_records<T: Copy>(buffer: *mut T, room: usize, records: &[T]) -> bool {
            if records.is_empty() {
                return true;
            }
            if buffer.is_null() || room < records.len() {
                return false;
            }
            // SAFETY: the caller's buffer of `room` >= `records.len()` records (the rule
            // of `vgpu_shimgen::runtime::pointers`); ours is a separate allocation.
            unsafe { ::core::ptr::copy_nonoverlapping(records.as_ptr(), buffer, records.len()) };
            true
        }

        /// Runs `read` over `len` bytes of an input buffer of the caller's (a module
        /// image, read before the real call as the driver itself reads it, for as many
        /// bytes as the image's own header says it spans); `None` for null. The slice
        /// lives only inside `read`.
        #[allow(dead_code)]
        pub(crate) fn with_caller_bytes<R>(
            pointer: *const u8,
            len: usize,
            read: impl FnOnce(&[u8]) -> R,
        ) -> Option<R> {
            if pointer.is_null() {
                return None;
            }
            // SAFETY: a hook's own input buffer, readable for the `len` bytes its header
            // states (the rule of `vgpu_shimgen::runtime::pointers`); the borrow ends
            // with `read`, inside the call.
            Some(read(unsafe { ::core::slice::from_raw_parts(pointer, len) }))
        }

        /// Runs `read` over the bytes of the caller's C string (without its NUL);
        /// `None` for null. The slice lives only inside `read`.
        #[allow(dead_code)]
        pub(crate) fn with_caller_c_bytes<R>(
            pointer: *const ::core::ffi::c_char,
            read: impl FnOnce(&[u8]) -> R,
        ) -> Option<R> {
            if pointer.is_null() {
                return None;
            }
            // SAFETY: a NUL-terminated string of the caller's that the API takes as one
            // (PTX text, a path), read before the real call as the driver reads it (the
            // rule of `vgpu_shimgen::runtime::pointers`); the borrow ends with `read`.
            let text = unsafe { ::core::ffi::CStr::from_ptr(pointer) };
            Some(read(text.to_bytes()))
        }

        /// The caller's C string, lossily as UTF-8 (`?` for null), for messages.
        #[allow(dead_code)]
        pub(crate) fn c_string(pointer: *const ::core::ffi::c_char) -> String {
            if pointer.is_null() {
                return "?".to_string();
            }
            // SAFETY: a NUL-terminated string of the caller's, which the driver has just
            // accepted as one (the rule of `vgpu_shimgen::runtime::pointers`).
            unsafe { ::core::ffi::CStr::from_ptr(pointer) }
                .to_string_lossy()
                .into_owned()
        }
    };
}

#[cfg(test)]
mod tests {
    mod ffi {
        crate::define_caller_pointers!();
    }
    use ffi::*;

    #[test]
    fn null_pointers_read_nothing_and_write_nothing() {
        assert_eq!(read_out::<u64>(std::ptr::null()), None);
        assert_eq!(read_descriptor::<[u32; 4]>(std::ptr::null()), None);
        assert!(!write_out::<u64>(std::ptr::null_mut(), 7));
        assert!(!write_records::<u32>(std::ptr::null_mut(), 4, &[1]));
        assert!(
            write_records::<u32>(std::ptr::null_mut(), 0, &[]),
            "nothing to write"
        );
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
        let image = [1u8, 2, 3, 4];
        assert_eq!(
            with_caller_bytes(image.as_ptr(), 3, |b| b.to_vec()),
            Some(vec![1, 2, 3])
        );
        assert_eq!(with_caller_bytes(std::ptr::null(), 3, |b| b.len()), None);
        assert_eq!(with_caller_c_bytes(c"ptx".as_ptr(), |b| b.len()), Some(3));
        assert_eq!(with_caller_c_bytes(std::ptr::null(), |b| b.len()), None);
    }

    #[test]
    fn records_fit_the_room_the_caller_gave_or_are_not_written() {
        let mut buffer = [0u32; 3];
        assert!(!write_records(buffer.as_mut_ptr(), 3, &[1, 2, 3, 4]));
        assert_eq!(buffer, [0, 0, 0], "too little room: untouched");
        assert!(write_records(buffer.as_mut_ptr(), 3, &[7, 8]));
        assert_eq!(buffer, [7, 8, 0]);
    }
}
