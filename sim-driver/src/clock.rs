//! Simulated GPU time: the monotonic clock every process shares (streams' busy-until
//! points are monotonic nanoseconds, so several processes' kernels line up on one
//! card), wall time for NVML timestamps, and kernel durations read from function names.

/// Monotonic nanoseconds (CLOCK_MONOTONIC, shared by all processes of the host).
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Wall-clock microseconds since the epoch, for NVML sample timestamps.
pub fn wall_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// Sleeps until the monotonic clock reaches `deadline_ns`.
pub fn sleep_until(deadline_ns: u64) {
    loop {
        let now = now_ns();
        if now >= deadline_ns {
            return;
        }
        std::thread::sleep(std::time::Duration::from_nanos(deadline_ns - now));
    }
}

/// The duration a kernel's name asks for: a trailing `_<number><unit>` with unit `ns`,
/// `us`, `ms` or `s` (`matmul_250us`, `step_10ms`). For an Itanium-mangled name
/// (`_Z7k_250usPf`) the identifier after the length is read.
pub fn duration_from_name(name: &str) -> Option<u64> {
    if let Some(rest) = name.strip_prefix("_Z") {
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        let len: usize = rest[..digits].parse().ok()?;
        return suffix_duration(rest.get(digits..digits + len)?);
    }
    name.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .find_map(suffix_duration)
}

fn suffix_duration(identifier: &str) -> Option<u64> {
    let (body, scale) = [
        ("ns", 1u64),
        ("us", 1_000),
        ("ms", 1_000_000),
        ("s", 1_000_000_000),
    ]
    .iter()
    .find_map(|(unit, scale)| identifier.strip_suffix(unit).map(|body| (body, *scale)))?;
    let digits_start = body
        .rfind(|c: char| !c.is_ascii_digit())
        .map(|i| i + 1)
        .unwrap_or(0);
    if digits_start == 0
        || body.as_bytes().get(digits_start - 1) != Some(&b'_')
        || digits_start == body.len()
    {
        return None;
    }
    body[digits_start..].parse::<u64>().ok()?.checked_mul(scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_duration_suffixes() {
        assert_eq!(duration_from_name("k_100us"), Some(100_000));
        assert_eq!(duration_from_name("step_10ms"), Some(10_000_000));
        assert_eq!(duration_from_name("tiny_800ns"), Some(800));
        assert_eq!(duration_from_name("long_2s"), Some(2_000_000_000));
        assert_eq!(duration_from_name("_Z7k_250usPf"), Some(250_000));
        assert_eq!(duration_from_name("_Z2k_v"), None);
        assert_eq!(duration_from_name("plain"), None);
        assert_eq!(duration_from_name("k_us"), None);
        assert_eq!(duration_from_name("k100us"), None);
        assert_eq!(duration_from_name("void k_5ms(float*)"), Some(5_000_000));
    }
}
