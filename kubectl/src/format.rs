//! Numbers for people: durations as kubectl prints ages (43s, 2m05s, 1h05m), rates with three
//! significant digits and a k/M suffix, seconds of a recovery to the hundredth.

use jiff::Timestamp;

/// `43s`, `2m05s`, `1h05m`, `3d4h` (kubectl's ages; negative counts as 0).
pub fn age(seconds: f64) -> String {
    let s = seconds.max(0.0).round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86400 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{}h", s / 86400, (s % 86400) / 3600),
    }
}

/// Seconds between two instants.
pub fn seconds(from: Timestamp, to: Timestamp) -> f64 {
    (to.as_millisecond() - from.as_millisecond()) as f64 / 1000.0
}

/// `0.26 s`, `12.3 s`, `1m05s` past a minute.
pub fn short_seconds(s: f64) -> String {
    if s < 10.0 {
        format!("{s:.2} s")
    } else if s < 60.0 {
        format!("{s:.1} s")
    } else {
        age(s)
    }
}

/// Three significant digits, with k and M: `35.9`, `412`, `41.2k`, `1.20M`.
pub fn rate(v: f64) -> String {
    let (scaled, suffix) = if v.abs() >= 1e6 {
        (v / 1e6, "M")
    } else if v.abs() >= 1e3 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    let digits = if scaled.abs() >= 100.0 {
        0
    } else if scaled.abs() >= 10.0 {
        1
    } else {
        2
    };
    format!("{scaled:.digits$}{suffix}")
}

/// A loss: four significant digits (`2.314`, `0.01180`).
pub fn loss(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return format!("{v}");
    }
    let digits = (3 - v.abs().log10().floor() as i32).clamp(0, 8) as usize;
    format!("{v:.digits$}")
}

/// A share as a percent: `12%`, `0.4%`.
pub fn percent(share: f64) -> String {
    let p = share * 100.0;
    if p < 1.0 && p > 0.0 {
        format!("{p:.1}%")
    } else {
        format!("{p:.0}%")
    }
}

/// A run's progress: `230/600 38%`, or the step alone when the total is unknown (0).
pub fn steps(step: u64, total: u64) -> String {
    if total > 0 {
        format!("{step}/{total} {}", percent(step as f64 / total as f64))
    } else {
        step.to_string()
    }
}

/// `12:00:41` (UTC).
pub fn clock(t: Timestamp) -> String {
    t.strftime("%H:%M:%S").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_as_kubectl_s() {
        assert_eq!(age(0.4), "0s");
        assert_eq!(age(43.0), "43s");
        assert_eq!(age(125.0), "2m05s");
        assert_eq!(age(3900.0), "1h05m");
        assert_eq!(age(100_000.0), "1d3h");
        assert_eq!(age(-5.0), "0s");
    }

    #[test]
    fn rates_keep_three_digits() {
        assert_eq!(rate(35.94), "35.9");
        assert_eq!(rate(412.3), "412");
        assert_eq!(rate(41_234.0), "41.2k");
        assert_eq!(rate(1_200_000.0), "1.20M");
        assert_eq!(rate(0.5), "0.50");
    }

    #[test]
    fn losses_keep_four_digits_and_shares_read_as_percents() {
        assert_eq!(loss(2.31412), "2.314");
        assert_eq!(loss(0.0118), "0.01180");
        assert_eq!(loss(0.0), "0");
        assert_eq!(percent(0.123), "12%");
        assert_eq!(percent(0.004), "0.4%");
        assert_eq!(short_seconds(0.2634), "0.26 s");
        assert_eq!(short_seconds(75.0), "1m15s");
        assert_eq!(steps(230, 600), "230/600 38%");
        assert_eq!(steps(230, 0), "230");
    }

    #[test]
    fn seconds_between_instants() {
        let a: Timestamp = "2026-12-01T12:00:00Z".parse().unwrap();
        let b: Timestamp = "2026-12-01T12:00:01.250Z".parse().unwrap();
        assert_eq!(seconds(a, b), 1.25);
        assert_eq!(clock(b), "12:00:01");
    }
}
