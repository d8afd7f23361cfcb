//! The timestamp line of the table, in `asctime` form (`Wed Dec  2 15:49:22 2026`),
//! in local time like nvidia-smi: jiff reads the system's zone (`TZ`, else
//! `/etc/localtime`) and falls back to UTC when it cannot.

use jiff::Zoned;

/// Now, formatted for the table's first line.
pub fn local_timestamp() -> String {
    format_asctime(&Zoned::now())
}

/// `Www Mmm dd hh:mm:ss yyyy`, the day space-padded, as C's `asctime`.
pub fn format_asctime(time: &Zoned) -> String {
    time.strftime("%a %b %e %H:%M:%S %Y").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::Timestamp;
    use jiff::tz::TimeZone;

    fn utc(seconds: i64) -> String {
        let time = Timestamp::from_second(seconds).expect("in range");
        format_asctime(&time.to_zoned(TimeZone::UTC))
    }

    #[test]
    fn utc_times_print_as_asctime_does() {
        // 2026-12-02 15:49:22 UTC, a Wednesday.
        assert_eq!(utc(1_796_226_562), "Wed Dec  2 15:49:22 2026");
        assert_eq!(utc(0), "Thu Jan  1 00:00:00 1970");
        // Leap day.
        assert_eq!(utc(951_782_400), "Tue Feb 29 00:00:00 2000");
        // Before the epoch.
        assert_eq!(utc(-1), "Wed Dec 31 23:59:59 1969");
        // A two-digit day is not padded.
        assert_eq!(utc(1_797_955_200), "Tue Dec 22 16:00:00 2026");
    }

    #[test]
    fn a_zone_shifts_the_hour_and_the_day() {
        let time = Timestamp::from_second(1_796_226_562).expect("in range");
        let tokyo = TimeZone::fixed(jiff::tz::offset(9));
        assert_eq!(
            format_asctime(&time.to_zoned(tokyo)),
            "Thu Dec  3 00:49:22 2026"
        );
    }

    #[test]
    fn local_timestamp_has_asctime_shape() {
        let stamp = local_timestamp();
        assert_eq!(stamp.len(), 24, "{stamp:?}");
        assert_eq!(&stamp[13..14], ":", "{stamp:?}");
        assert_eq!(&stamp[16..17], ":", "{stamp:?}");
    }
}
