//! What an attempt's result means, decided in one place.
//!
//! | result                                   | outcome                    |
//! |------------------------------------------|----------------------------|
//! | any 2xx                                  | delivered                  |
//! | 408, 429, 5xx                            | retryable                  |
//! | connect error, reset, timeout            | retryable                  |
//! | timeout after the request left           | retryable (outcome unknown: the receiver may have it) |
//! | 410 Gone                                 | gone: the endpoint is disabled |
//! | 3xx (never followed)                     | rejected                   |
//! | other 4xx                                | rejected                   |
//!
//! An HTTP result is a value, not an error: the egress never fails, it
//! reports.

use std::time::Duration;

use crate::delivery::OutcomeKind;

crate::stored_names! {
    /// Why an attempt did not succeed.
    pub enum ErrorClass as "error class" {
        /// A 3xx: redirects are not followed.
        Redirect = "http_3xx",
        /// 408 Request Timeout.
        RequestTimeout = "http_408",
        /// 429 Too Many Requests.
        RateLimited = "http_429",
        /// 410 Gone.
        Gone = "http_410",
        /// Another 4xx.
        ClientError = "http_4xx",
        /// A 5xx.
        ServerError = "http_5xx",
        /// No connection within the connect timeout.
        ConnectTimeout = "connect_timeout",
        /// The connection was refused or failed.
        Connect = "connect",
        /// The TLS handshake failed.
        Tls = "tls",
        /// The name did not resolve, or resolved only to refused addresses.
        Dns = "dns",
        /// The egress policy refused the URL or its addresses.
        Blocked = "blocked",
        /// The connection broke while sending or reading.
        Reset = "reset",
        /// No response within the request timeout after the request left.
        Timeout = "timeout",
        /// The endpoint is disabled, deleted, or has no secret.
        EndpointUnavailable = "endpoint_unavailable",
        /// The dispatcher stopped before the response arrived: the request may
        /// have been received; the outcome is unknown and the delivery is
        /// attempted again.
        Shutdown = "shutdown",
    }
}

/// The outcome of one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptOutcome {
    /// A 2xx.
    Delivered {
        /// The status.
        status: u16,
    },
    /// Worth trying again.
    Retryable {
        /// The status, if a response arrived.
        status: Option<u16>,
        /// Why.
        class: ErrorClass,
        /// The response's `Retry-After`, if any.
        retry_after: Option<Duration>,
    },
    /// Will not succeed by retrying.
    Rejected {
        /// The status, if any.
        status: Option<u16>,
        /// Why.
        class: ErrorClass,
    },
    /// 410: the receiver asks never to be called again.
    Gone,
}

impl AttemptOutcome {
    /// What it came to, as stored.
    pub fn kind(&self) -> OutcomeKind {
        match self {
            AttemptOutcome::Delivered { .. } => OutcomeKind::Succeeded,
            AttemptOutcome::Retryable { .. } => OutcomeKind::Retryable,
            AttemptOutcome::Rejected { .. } => OutcomeKind::Rejected,
            AttemptOutcome::Gone => OutcomeKind::Gone,
        }
    }

    /// The HTTP status, if a response arrived.
    pub fn status(&self) -> Option<u16> {
        match *self {
            AttemptOutcome::Delivered { status } => Some(status),
            AttemptOutcome::Retryable { status, .. } | AttemptOutcome::Rejected { status, .. } => {
                status
            }
            AttemptOutcome::Gone => Some(410),
        }
    }

    /// The error class, when not delivered.
    pub fn error_class(&self) -> Option<ErrorClass> {
        match *self {
            AttemptOutcome::Delivered { .. } => None,
            AttemptOutcome::Retryable { class, .. } | AttemptOutcome::Rejected { class, .. } => {
                Some(class)
            }
            AttemptOutcome::Gone => Some(ErrorClass::Gone),
        }
    }

    /// Whether it succeeded.
    pub fn is_success(&self) -> bool {
        matches!(self, AttemptOutcome::Delivered { .. })
    }
}

/// Classifies an HTTP response.
pub fn classify_status(status: u16, retry_after: Option<Duration>) -> AttemptOutcome {
    match status {
        200..=299 => AttemptOutcome::Delivered { status },
        410 => AttemptOutcome::Gone,
        408 => AttemptOutcome::Retryable {
            status: Some(status),
            class: ErrorClass::RequestTimeout,
            retry_after: None,
        },
        429 => AttemptOutcome::Retryable {
            status: Some(status),
            class: ErrorClass::RateLimited,
            retry_after,
        },
        500..=599 => AttemptOutcome::Retryable {
            status: Some(status),
            class: ErrorClass::ServerError,
            // Retry-After is honoured on 503 (and 429), as HTTP defines it.
            retry_after: if status == 503 { retry_after } else { None },
        },
        300..=399 => AttemptOutcome::Rejected {
            status: Some(status),
            class: ErrorClass::Redirect,
        },
        400..=499 => AttemptOutcome::Rejected {
            status: Some(status),
            class: ErrorClass::ClientError,
        },
        // 1xx as a final status, or nonsense: the receiver is broken now,
        // perhaps not later.
        _ => AttemptOutcome::Retryable {
            status: Some(status),
            class: ErrorClass::ServerError,
            retry_after: None,
        },
    }
}

/// Classifies a transport failure (no response).
pub fn classify_failure(class: ErrorClass) -> AttemptOutcome {
    match class {
        ErrorClass::Blocked => AttemptOutcome::Rejected {
            status: None,
            class,
        },
        _ => AttemptOutcome::Retryable {
            status: None,
            class,
            retry_after: None,
        },
    }
}

/// Parses `Retry-After` (seconds or an HTTP date) relative to `now_unix`.
///
/// The receiver writes this value, so no value may overflow or panic:
/// delta-seconds too large for a `u64` saturate (the retry policy caps
/// what it honours anyway, see `RetryPolicy::delay`), a date in the past
/// means "now", and a date outside what an IMF-fixdate can write (years
/// 0000 to 9999, valid clock fields) is not a date.
pub fn parse_retry_after(value: &str, now_unix: i64) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // delta-seconds = 1*DIGIT (RFC 9110 §10.2.3): only too many digits
        // can fail to parse, and they mean "longer than anyone waits".
        return Some(Duration::from_secs(
            value.parse::<u64>().unwrap_or(u64::MAX),
        ));
    }
    let when = parse_http_date(value)?;
    Some(Duration::from_secs(
        u64::try_from(when.saturating_sub(now_unix)).unwrap_or(0),
    ))
}

/// Parses an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`) to Unix seconds.
///
/// Every field is range-checked before any arithmetic, so the sum below
/// stays within ±400 billion seconds: no input can overflow it.
fn parse_http_date(s: &str) -> Option<i64> {
    let parts: Vec<&str> = s.split_whitespace().collect();
    if parts.len() != 6 || parts[5] != "GMT" {
        return None;
    }
    let day = two_digits_or_one(parts[1])?;
    let month = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ]
    .iter()
    .position(|m| *m == parts[2])? as i64
        + 1;
    // An IMF-fixdate's year is exactly four digits.
    if parts[3].len() != 4 || !parts[3].bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let year: i64 = parts[3].parse().ok()?;
    let hms: Vec<i64> = parts[4]
        .split(':')
        .map(two_digits_or_one)
        .collect::<Option<_>>()?;
    if hms.len() != 3 || !(1..=31).contains(&day) || hms[0] > 23 || hms[1] > 59 || hms[2] > 60 {
        return None;
    }
    // Days from civil (Howard Hinnant).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + hms[0] * 3600 + hms[1] * 60 + hms[2])
}

/// A clock or day field: one or two ASCII digits (no sign, no spaces).
fn two_digits_or_one(s: &str) -> Option<i64> {
    if s.is_empty() || s.len() > 2 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_outcome_is_stored_as_its_kind_and_class() {
        let cases = [
            (classify_status(200, None), OutcomeKind::Succeeded, None),
            (
                classify_status(503, None),
                OutcomeKind::Retryable,
                Some(ErrorClass::ServerError),
            ),
            (
                classify_status(404, None),
                OutcomeKind::Rejected,
                Some(ErrorClass::ClientError),
            ),
            (
                classify_status(410, None),
                OutcomeKind::Gone,
                Some(ErrorClass::Gone),
            ),
            (
                classify_failure(ErrorClass::Blocked),
                OutcomeKind::Rejected,
                Some(ErrorClass::Blocked),
            ),
        ];
        for (outcome, kind, class) in cases {
            assert_eq!((outcome.kind(), outcome.error_class()), (kind, class));
        }
    }

    #[test]
    fn statuses_are_classified() {
        assert!(classify_status(204, None).is_success());
        assert_eq!(classify_status(410, None), AttemptOutcome::Gone);
        for s in [408, 429, 500, 502, 503, 599] {
            assert!(
                matches!(classify_status(s, None), AttemptOutcome::Retryable { .. }),
                "{s}"
            );
        }
        for s in [301, 302, 307, 308, 400, 401, 403, 404, 422] {
            assert!(
                matches!(classify_status(s, None), AttemptOutcome::Rejected { .. }),
                "{s}"
            );
        }
        let ra = Some(Duration::from_secs(7));
        assert!(matches!(
            classify_status(503, ra),
            AttemptOutcome::Retryable {
                retry_after: Some(_),
                ..
            }
        ));
        assert!(matches!(
            classify_status(500, ra),
            AttemptOutcome::Retryable {
                retry_after: None,
                ..
            }
        ));
    }

    #[test]
    fn retry_after_takes_seconds_and_dates() {
        assert_eq!(parse_retry_after("120", 0), Some(Duration::from_secs(120)));
        // 1994-11-06T08:49:37Z is 784111777.
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", 784_111_777 - 30),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", 784_111_777 + 30),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon", 0), None);
    }

    #[test]
    fn retry_after_extremes_saturate_and_never_panic() {
        let now = 1_700_000_000;
        // Too many digits for a u64: "longer than anyone waits".
        assert_eq!(
            parse_retry_after("99999999999999999999", now),
            Some(Duration::from_secs(u64::MAX))
        );
        assert_eq!(
            parse_retry_after("18446744073709551615", now),
            Some(Duration::from_secs(u64::MAX))
        );
        assert_eq!(
            parse_retry_after(&"9".repeat(10_000), now),
            Some(Duration::from_secs(u64::MAX))
        );
        // Negative, signed, fractional and empty values are not delays.
        for bad in ["-1", "-99999999999999999999", "+5", "1.5", "", " ", "1e9"] {
            assert_eq!(parse_retry_after(bad, now), None, "{bad:?}");
        }
        // Far past: now. Far future: the whole span, in range.
        assert_eq!(
            parse_retry_after("Mon, 01 Jan 0001 00:00:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(
            parse_retry_after("Sat, 01 Jan 0000 00:00:00 GMT", i64::MAX),
            Some(Duration::ZERO)
        );
        let far = parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT", now).unwrap();
        assert_eq!(far.as_secs(), 253_402_300_799 - now as u64);
        assert_eq!(
            parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT", i64::MIN),
            Some(Duration::from_secs(i64::MAX as u64))
        );
        // Fields outside an IMF-fixdate are refused, not wrapped.
        for bad in [
            "Sun, 06 Nov 99999999999999999999 08:49:37 GMT",
            "Sun, 06 Nov 9223372036854775807 08:49:37 GMT",
            "Sun, 06 Nov -1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 9223372036854775807:00:00 GMT",
            "Sun, 06 Nov 1994 24:00:00 GMT",
            "Sun, 06 Nov 1994 08:60:00 GMT",
            "Sun, 06 Nov 1994 08:49:61 GMT",
            "Sun, 99 Nov 1994 08:49:37 GMT",
            "Sun, -6 Nov 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 -8:49:37 GMT",
            "Sun, 06 Nov 1994 08:49 GMT",
            "Sun, 06 Nov 1994 08:49:37:01 GMT",
        ] {
            assert_eq!(parse_retry_after(bad, now), None, "{bad:?}");
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(5_000))]

        /// Whatever a receiver writes and whatever the clock says, parsing
        /// returns (never panics), and a parsed date is never negative.
        #[test]
        fn any_retry_after_parses_without_panicking(value in ".{0,64}", now: i64) {
            let _ = parse_retry_after(&value, now);
        }

        /// Dates built from any field values: in range they parse to the
        /// right span, out of range they are refused.
        #[test]
        fn any_http_date_fields_are_safe(
            day in -5i64..40, month in 0usize..13, year in -10i64..10_010,
            h in -2i64..30, m in -2i64..70, s in -2i64..70, now: i64,
        ) {
            const MONTHS: [&str; 13] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec", "Foo"];
            let text = format!("Mon, {day:02} {} {year:04} {h:02}:{m:02}:{s:02} GMT", MONTHS[month]);
            let got = parse_retry_after(&text, now);
            let valid = (1..=31).contains(&day) && month < 12 && (0..=9999).contains(&year)
                && (0..=23).contains(&h) && (0..=59).contains(&m) && (0..=60).contains(&s);
            proptest::prop_assert_eq!(got.is_some(), valid, "{}", text);
        }
    }
}
