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

/// Why an attempt did not succeed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// A 3xx: redirects are not followed.
    Redirect,
    /// 408 Request Timeout.
    RequestTimeout,
    /// 429 Too Many Requests.
    RateLimited,
    /// 410 Gone.
    Gone,
    /// Another 4xx.
    ClientError,
    /// A 5xx.
    ServerError,
    /// No connection within the connect timeout.
    ConnectTimeout,
    /// The connection was refused or failed.
    Connect,
    /// The TLS handshake failed.
    Tls,
    /// The name did not resolve, or resolved only to refused addresses.
    Dns,
    /// The egress policy refused the URL or its addresses.
    Blocked,
    /// The connection broke while sending or reading.
    Reset,
    /// No response within the request timeout after the request left.
    Timeout,
    /// The endpoint is disabled, deleted, or has no secret.
    EndpointUnavailable,
    /// The dispatcher stopped before the response arrived: the request may
    /// have been received; the outcome is unknown and the delivery is
    /// attempted again.
    Shutdown,
}

impl ErrorClass {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::Redirect => "http_3xx",
            ErrorClass::RequestTimeout => "http_408",
            ErrorClass::RateLimited => "http_429",
            ErrorClass::Gone => "http_410",
            ErrorClass::ClientError => "http_4xx",
            ErrorClass::ServerError => "http_5xx",
            ErrorClass::ConnectTimeout => "connect_timeout",
            ErrorClass::Connect => "connect",
            ErrorClass::Tls => "tls",
            ErrorClass::Dns => "dns",
            ErrorClass::Blocked => "blocked",
            ErrorClass::Reset => "reset",
            ErrorClass::Timeout => "timeout",
            ErrorClass::EndpointUnavailable => "endpoint_unavailable",
            ErrorClass::Shutdown => "shutdown",
        }
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
    /// The stored outcome name.
    pub fn name(&self) -> &'static str {
        match self {
            AttemptOutcome::Delivered { .. } => "succeeded",
            AttemptOutcome::Retryable { .. } => "retryable",
            AttemptOutcome::Rejected { .. } => "rejected",
            AttemptOutcome::Gone => "gone",
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
pub fn parse_retry_after(value: &str, now_unix: i64) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let when = parse_http_date(value)?;
    Some(Duration::from_secs(
        u64::try_from(when - now_unix).unwrap_or(0),
    ))
}

/// Parses an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`) to Unix seconds.
fn parse_http_date(s: &str) -> Option<i64> {
    let parts: Vec<&str> = s.split_whitespace().collect();
    if parts.len() != 6 || parts[5] != "GMT" {
        return None;
    }
    let day: i64 = parts[1].parse().ok()?;
    let month = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ]
    .iter()
    .position(|m| *m == parts[2])? as i64
        + 1;
    let year: i64 = parts[3].parse().ok()?;
    let hms: Vec<i64> = parts[4]
        .split(':')
        .map(|p| p.parse().ok())
        .collect::<Option<_>>()?;
    if hms.len() != 3 || !(1..=31).contains(&day) {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
