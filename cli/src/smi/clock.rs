//! The timestamp line of the table, in `asctime` form (`Wed Dec  2 15:49:22 2026`),
//! in local time like nvidia-smi (UTC when the local zone cannot be read).

use std::time::{SystemTime, UNIX_EPOCH};

/// A broken-down calendar time; `month` is 1..=12, `weekday` 0 (Sunday)..=6.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CivilTime {
    pub year: i64,
    pub month: u32,
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
    pub weekday: u32,
}

/// Now, formatted for the table's first line.
pub fn local_timestamp() -> String {
    let seconds = match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(elapsed) => i64::try_from(elapsed.as_secs()).unwrap_or(i64::MAX),
        Err(_) => 0,
    };
    format_asctime(local_time(seconds).unwrap_or_else(|| utc_time(seconds)))
}

fn local_time(seconds: i64) -> Option<CivilTime> {
    let time: libc::time_t = seconds;
    // SAFETY: `libc::tm` is plain old data (integers and a nullable pointer), so the
    // all-zero value is valid; `localtime_r` is the reentrant variant and writes only
    // into `broken_down`, which outlives the call, reading only `time`.
    let broken_down = unsafe {
        let mut broken_down: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&time, &mut broken_down).is_null() {
            return None;
        }
        broken_down
    };
    Some(CivilTime {
        year: i64::from(broken_down.tm_year) + 1900,
        month: u32::try_from(broken_down.tm_mon + 1).ok()?,
        day: u32::try_from(broken_down.tm_mday).ok()?,
        hour: u32::try_from(broken_down.tm_hour).ok()?,
        minute: u32::try_from(broken_down.tm_min).ok()?,
        second: u32::try_from(broken_down.tm_sec).ok()?,
        weekday: u32::try_from(broken_down.tm_wday).ok()?,
    })
}

/// Seconds since the Unix epoch to a UTC calendar time (proleptic Gregorian).
pub fn utc_time(seconds: i64) -> CivilTime {
    let days = seconds.div_euclid(86_400);
    let second_of_day = seconds.rem_euclid(86_400);
    // Shift the epoch to 0000-03-01 so that leap days fall at the end of a year.
    let shifted = days + 719_468;
    let era = shifted.div_euclid(146_097);
    let day_of_era = shifted.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    CivilTime {
        year,
        month: month as u32,
        day: day as u32,
        hour: (second_of_day / 3_600) as u32,
        minute: (second_of_day % 3_600 / 60) as u32,
        second: (second_of_day % 60) as u32,
        // 1970-01-01 was a Thursday.
        weekday: (days + 4).rem_euclid(7) as u32,
    }
}

/// `Www Mmm dd hh:mm:ss yyyy`, the day space-padded, as C's `asctime`.
pub fn format_asctime(time: CivilTime) -> String {
    const WEEKDAYS: [&str; 7] = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let weekday = WEEKDAYS
        .get(time.weekday as usize)
        .copied()
        .unwrap_or("???");
    let month = MONTHS
        .get(time.month.wrapping_sub(1) as usize)
        .copied()
        .unwrap_or("???");
    format!(
        "{weekday} {month} {:>2} {:02}:{:02}:{:02} {}",
        time.day, time.hour, time.minute, time.second, time.year
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_conversion_matches_known_dates() {
        // 2026-12-02 15:49:22 UTC, a Wednesday.
        assert_eq!(
            format_asctime(utc_time(1_796_226_562)),
            "Wed Dec  2 15:49:22 2026"
        );
        assert_eq!(format_asctime(utc_time(0)), "Thu Jan  1 00:00:00 1970");
        // Leap day.
        assert_eq!(
            format_asctime(utc_time(951_782_400)),
            "Tue Feb 29 00:00:00 2000"
        );
        // Before the epoch.
        assert_eq!(format_asctime(utc_time(-1)), "Wed Dec 31 23:59:59 1969");
    }

    #[test]
    fn local_timestamp_has_asctime_shape() {
        let stamp = local_timestamp();
        assert_eq!(stamp.len(), 24, "{stamp:?}");
        assert_eq!(&stamp[13..14], ":", "{stamp:?}");
        assert_eq!(&stamp[16..17], ":", "{stamp:?}");
    }
}
