//! Wall-clock times as the trainer writes and reads them: RFC 3339 in UTC.

use std::time::SystemTime;

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// How finely a written time resolves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// `2026-01-02T03:04:05Z`: the progress report's checkpoint times and the fence.
    Second,
    /// As the clock gave it (`2026-01-02T03:04:05.123456789Z`): trainer.json.
    Exact,
}

/// `t` as RFC 3339 in UTC.
pub fn format(t: SystemTime, resolution: Resolution) -> String {
    let t = OffsetDateTime::from(t);
    let t = match resolution {
        Resolution::Second => t.replace_nanosecond(0).unwrap_or(t),
        Resolution::Exact => t,
    };
    t.format(&Rfc3339).unwrap_or_default()
}

/// The Unix time (whole seconds) of an RFC 3339 text; None if it is not one, or before 1970.
pub fn unix_seconds(text: &str) -> Option<u64> {
    let t = OffsetDateTime::parse(text, &Rfc3339).ok()?;
    u64::try_from(t.unix_timestamp()).ok()
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    #[test]
    fn times_are_written_to_the_second_or_exactly_and_read_back() {
        let t = UNIX_EPOCH + Duration::new(1_767_323_045, 123_456_789);
        assert_eq!(format(t, Resolution::Second), "2026-01-02T03:04:05Z");
        assert_eq!(
            format(t, Resolution::Exact),
            "2026-01-02T03:04:05.123456789Z"
        );
        assert_eq!(unix_seconds("2026-01-02T03:04:05Z"), Some(1_767_323_045));
        assert_eq!(
            unix_seconds(&format(t, Resolution::Exact)),
            Some(1_767_323_045)
        );
        assert_eq!(unix_seconds("1969-12-31T23:59:59Z"), None);
        assert_eq!(unix_seconds("yesterday"), None);
    }
}
