//! The window a reconciliation covers: whole UTC minutes, because capture's
//! ledger counts per minute.

use std::time::{Duration, SystemTime};

use chrono::{DateTime, NaiveDate, SecondsFormat, Utc};

/// `[since, until)`, both on whole minutes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Inclusive.
    pub since: SystemTime,
    /// Exclusive.
    pub until: SystemTime,
}

/// A bad `--since`/`--until` value, with the flag, the value and the fix.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{flag} {value:?}: {problem}; {fix}")]
pub struct WindowError {
    /// The flag or setting.
    pub flag: &'static str,
    /// The value given.
    pub value: String,
    /// What is wrong.
    pub problem: String,
    /// How to fix it.
    pub fix: &'static str,
}

const TIME_FIX: &str = "give an RFC 3339 time (2026-11-30T10:00:00Z), a UTC day (2026-11-30), \
                        `now`, or a duration before now (`-24h`, `-90m`)";

impl Window {
    /// The window from two command-line values, read against `now`. Both
    /// ends are floored to the minute.
    pub fn parse(since: &str, until: &str, now: SystemTime) -> Result<Window, WindowError> {
        let since_at = parse_time("--since", since, now)?;
        let until_at = parse_time("--until", until, now)?;
        let window = Window {
            since: floor_minute(since_at),
            until: floor_minute(until_at),
        };
        if window.until <= window.since {
            return Err(WindowError {
                flag: "--until",
                value: until.to_string(),
                problem: format!(
                    "the window [{}, {}) is empty once both ends are on whole minutes",
                    rfc3339(window.since),
                    rfc3339(window.until)
                ),
                fix: "give an --until at least one minute after --since",
            });
        }
        Ok(window)
    }

    /// The window of `length` that ends `settle` before `now` (floored to
    /// the minute): what a scheduled run covers.
    pub fn rolling(now: SystemTime, length: Duration, settle: Duration) -> Window {
        let until = floor_minute(now.checked_sub(settle).unwrap_or(SystemTime::UNIX_EPOCH));
        let since = floor_minute(until.checked_sub(length).unwrap_or(SystemTime::UNIX_EPOCH));
        Window { since, until }
    }

    /// The UTC days the window touches, first to last.
    pub fn days(&self) -> Vec<NaiveDate> {
        let first = DateTime::<Utc>::from(self.since).date_naive();
        let last = DateTime::<Utc>::from(self.until - Duration::from_micros(1)).date_naive();
        first.iter_days().take_while(|d| *d <= last).collect()
    }

    /// The window's length.
    pub fn length(&self) -> Duration {
        self.until
            .duration_since(self.since)
            .unwrap_or(Duration::ZERO)
    }
}

/// RFC 3339 in UTC with a `Z`, to the second (microseconds when present).
pub fn rfc3339(t: SystemTime) -> String {
    DateTime::<Utc>::from(t).to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

fn floor_minute(t: SystemTime) -> SystemTime {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs - secs % 60)
}

fn parse_time(flag: &'static str, value: &str, now: SystemTime) -> Result<SystemTime, WindowError> {
    let bad = |problem: String| WindowError {
        flag,
        value: value.to_string(),
        problem,
        fix: TIME_FIX,
    };
    let v = value.trim();
    if v.eq_ignore_ascii_case("now") {
        return Ok(now);
    }
    if let Some(ago) = v.strip_prefix('-') {
        let d = walhook_pipeline::duration::parse(ago).map_err(|e| bad(e.to_string()))?;
        return now
            .checked_sub(d)
            .ok_or_else(|| bad("that is before 1970".into()));
    }
    if let Ok(t) = DateTime::parse_from_rfc3339(v) {
        let t: DateTime<Utc> = t.into();
        return Ok(t.into());
    }
    if let Ok(d) = NaiveDate::parse_from_str(v, "%Y-%m-%d") {
        let t = d.and_hms_opt(0, 0, 0).expect("midnight exists").and_utc();
        return Ok(t.into());
    }
    Err(bad("not a time walhook reads".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> SystemTime {
        DateTime::parse_from_rfc3339(s)
            .unwrap()
            .with_timezone(&Utc)
            .into()
    }

    #[test]
    fn times_days_and_durations_are_read_and_floored_to_minutes() {
        let now = at("2026-11-30T12:34:56Z");
        let w = Window::parse("2026-11-29", "now", now).unwrap();
        assert_eq!(rfc3339(w.since), "2026-11-29T00:00:00Z");
        assert_eq!(rfc3339(w.until), "2026-11-30T12:34:00Z");
        assert_eq!(w.days().len(), 2);
        let w = Window::parse("-90m", "2026-11-30T12:10:30+01:00", now).unwrap();
        assert_eq!(rfc3339(w.since), "2026-11-30T11:04:00Z");
        assert_eq!(rfc3339(w.until), "2026-11-30T11:10:00Z");
        assert_eq!(
            w.days(),
            vec![NaiveDate::from_ymd_opt(2026, 11, 30).unwrap()]
        );
    }

    #[test]
    fn bad_values_name_the_flag_the_value_and_the_fix() {
        let now = at("2026-11-30T12:00:00Z");
        let e = Window::parse("yesterday", "now", now).unwrap_err();
        assert_eq!(e.flag, "--since");
        assert!(e.to_string().contains("\"yesterday\""), "{e}");
        assert!(e.to_string().contains("RFC 3339"), "{e}");
        let e = Window::parse("now", "-1h", now).unwrap_err();
        assert_eq!(e.flag, "--until");
        assert!(e.problem.contains("empty"), "{e}");
        let e = Window::parse("-3 fortnights", "now", now).unwrap_err();
        assert_eq!(e.flag, "--since");
    }

    #[test]
    fn a_rolling_window_ends_settle_before_now() {
        let now = at("2026-11-30T12:34:56Z");
        let w = Window::rolling(now, Duration::from_secs(3600), Duration::from_secs(120));
        assert_eq!(rfc3339(w.since), "2026-11-30T11:32:00Z");
        assert_eq!(rfc3339(w.until), "2026-11-30T12:32:00Z");
    }
}
