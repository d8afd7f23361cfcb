//! The one clock every compute figure is in: CLOCK_MONOTONIC nanoseconds, which all
//! processes of a host share whatever their PID or mount namespaces (container runtimes
//! do not give containers a time namespace). The limiter's shared words, the tenants'
//! published activity and the host's card views are all stamped with it.

/// CLOCK_MONOTONIC nanoseconds (the vDSO, no syscall). Inlined across crates: the
/// limiter reads it on every launch.
#[inline]
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we pass; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_goes_back() {
        let first = monotonic_ns();
        let second = monotonic_ns();
        assert!(first > 0 && second >= first);
    }
}
