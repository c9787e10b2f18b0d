//! Instants as microseconds since the Unix epoch, shown in RFC 3339 UTC.
//!
//! Postgres keeps microseconds, so do we: a commit time read from the WAL and
//! written back to a `timestamptz` column round-trips exactly.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Microseconds between 1970-01-01 and Postgres' epoch, 2000-01-01.
const PG_EPOCH_OFFSET_MICROS: i64 = 946_684_800_000_000;

/// An instant with microsecond precision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(pub i64);

impl Timestamp {
    /// The current time.
    pub fn now() -> Self {
        Self::from_system_time(SystemTime::now())
    }

    /// From microseconds since 2000-01-01, as the replication protocol counts.
    pub fn from_pg_micros(micros: i64) -> Self {
        Timestamp(micros.saturating_add(PG_EPOCH_OFFSET_MICROS))
    }

    /// Converts a [`SystemTime`], saturating outside the representable range.
    pub fn from_system_time(t: SystemTime) -> Self {
        match t.duration_since(UNIX_EPOCH) {
            Ok(d) => Timestamp(i64::try_from(d.as_micros()).unwrap_or(i64::MAX)),
            Err(e) => Timestamp(-i64::try_from(e.duration().as_micros()).unwrap_or(i64::MAX)),
        }
    }

    /// Converts to a [`SystemTime`].
    pub fn to_system_time(self) -> SystemTime {
        if self.0 >= 0 {
            UNIX_EPOCH + Duration::from_micros(self.0 as u64)
        } else {
            UNIX_EPOCH - Duration::from_micros(self.0.unsigned_abs())
        }
    }

    /// Seconds since the Unix epoch, rounded down.
    pub fn unix_seconds(self) -> i64 {
        self.0.div_euclid(1_000_000)
    }

    /// This instant moved by `d` (saturating).
    pub fn plus(self, d: Duration) -> Self {
        Timestamp(
            self.0
                .saturating_add(i64::try_from(d.as_micros()).unwrap_or(i64::MAX)),
        )
    }

    /// The time from `earlier` to this instant, or zero when `earlier` is later.
    pub fn since(self, earlier: Timestamp) -> Duration {
        Duration::from_micros(u64::try_from(self.0.saturating_sub(earlier.0)).unwrap_or(0))
    }

    /// The start of this instant's minute (UTC): the window the capture
    /// ledger counts it in.
    pub fn minute_start(self) -> Self {
        Timestamp(self.0 - self.0.rem_euclid(60_000_000))
    }
}

/// Days since 1970-01-01 to a proleptic Gregorian (year, month, day); the
/// algorithm of Howard Hinnant's `civil_from_days`.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

impl fmt::Display for Timestamp {
    /// RFC 3339 in UTC with microseconds: `2026-11-29T10:11:44.123456Z`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = self.0.div_euclid(1_000_000);
        let micros = self.0.rem_euclid(1_000_000);
        let days = secs.div_euclid(86_400);
        let sod = secs.rem_euclid(86_400);
        let (y, m, d) = civil_from_days(days);
        write!(
            f,
            "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{micros:06}Z",
            sod / 3600,
            (sod / 60) % 60,
            sod % 60
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_rfc3339_utc() {
        assert_eq!(Timestamp(0).to_string(), "1970-01-01T00:00:00.000000Z");
        assert_eq!(
            Timestamp::from_pg_micros(0).to_string(),
            "2000-01-01T00:00:00.000000Z"
        );
        // 2026-11-29T10:11:44.123456Z
        assert_eq!(
            Timestamp(1_795_947_104_123_456).to_string(),
            "2026-11-29T10:11:44.123456Z"
        );
        assert_eq!(Timestamp(-1).to_string(), "1969-12-31T23:59:59.999999Z");
        assert_eq!(
            Timestamp(951_782_400_000_000).to_string(),
            "2000-02-29T00:00:00.000000Z"
        );
    }

    #[test]
    fn minute_start_truncates_towards_the_past() {
        let t = Timestamp(1_795_947_104_123_456); // 10:11:44.123456
        assert_eq!(t.minute_start().to_string(), "2026-11-29T10:11:00.000000Z");
        assert_eq!(t.minute_start().minute_start(), t.minute_start());
        assert_eq!(
            Timestamp(-1).minute_start().to_string(),
            "1969-12-31T23:59:00.000000Z"
        );
    }

    #[test]
    fn round_trips_system_time() {
        let t = Timestamp(1_795_947_104_123_456);
        assert_eq!(Timestamp::from_system_time(t.to_system_time()), t);
        let before = Timestamp(-5_000_001);
        assert_eq!(Timestamp::from_system_time(before.to_system_time()), before);
    }
}
