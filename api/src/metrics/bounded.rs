//! What keeps every label bounded where a caller could otherwise choose
//! its value: the standard methods (anything else is refused at the edge
//! and labelled `OTHER` if it ever got here), the closed set of refusal
//! reasons, and the cap on the names of SQL gauges.

use prometheus_client::encoding::EncodeLabelSet;

use walhook_pipeline::metrics::{MAX_LABELLED, OTHER};

/// Why the API refused a request or a connection before serving it: a
/// closed set, so the label stays bounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// A method outside the standard set (405).
    Method,
    /// A connection past `[api].max_connections_per_client` (closed at
    /// once).
    ClientConnections,
    /// A request past its address's share of the request slots (503).
    ClientRequests,
    /// A request past its tenant's share of the request slots (503).
    TenantRequests,
    /// Every request slot stayed taken (503).
    Busy,
    /// A console sign-in past `[api].sign_in_attempts_per_minute` (429).
    SignInRate,
    /// A call past `[api].failed_authentications_per_minute` (429).
    AuthenticationRate,
    /// A sign-in form too slow or too large (408, 413).
    SignInBody,
    /// An authenticated body slower than `[api].body_read_timeout` (408).
    BodyTimeout,
    /// A console sign-in while every session is in use (429).
    SessionsFull,
}

impl Refusal {
    /// Every reason (each has a series from the start).
    pub const ALL: [Refusal; 10] = [
        Refusal::Method,
        Refusal::ClientConnections,
        Refusal::ClientRequests,
        Refusal::TenantRequests,
        Refusal::Busy,
        Refusal::SignInRate,
        Refusal::AuthenticationRate,
        Refusal::SignInBody,
        Refusal::BodyTimeout,
        Refusal::SessionsFull,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Method => "method",
            Refusal::ClientConnections => "client_connections",
            Refusal::ClientRequests => "client_requests",
            Refusal::TenantRequests => "tenant_requests",
            Refusal::Busy => "busy",
            Refusal::SignInRate => "sign_in_rate",
            Refusal::AuthenticationRate => "authentication_rate",
            Refusal::SignInBody => "sign_in_body",
            Refusal::BodyTimeout => "body_timeout",
            Refusal::SessionsFull => "sessions_full",
        }
    }
}

/// The methods the API knows; anything else is refused at the edge.
pub const STANDARD_METHODS: [axum::http::Method; 9] = [
    axum::http::Method::GET,
    axum::http::Method::HEAD,
    axum::http::Method::POST,
    axum::http::Method::PUT,
    axum::http::Method::PATCH,
    axum::http::Method::DELETE,
    axum::http::Method::OPTIONS,
    axum::http::Method::TRACE,
    axum::http::Method::CONNECT,
];

/// The label of `method`: its name when standard, `OTHER` otherwise, so
/// that no method a caller makes up becomes a series.
pub fn method_label(method: &axum::http::Method) -> &'static str {
    STANDARD_METHODS
        .iter()
        .find(|m| *m == method)
        .map_or("OTHER", axum::http::Method::as_str)
}

/// The reason of a refusal.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// [`Refusal::as_str`].
    pub reason: String,
}

/// The first [`MAX_LABELLED`] names of a SQL gauge keep their own series;
/// the values of the rest are folded into one named [`OTHER`], so that
/// however many rows the database holds, the series stay bounded.
pub(super) fn capped<T>(rows: Vec<(String, T)>, fold: impl Fn(T, T) -> T) -> Vec<(String, T)> {
    let mut out: Vec<(String, T)> = Vec::with_capacity(rows.len().min(MAX_LABELLED + 1));
    let mut rest: Option<T> = None;
    for (name, value) in rows {
        if out.len() < MAX_LABELLED && name != OTHER {
            out.push((name, value));
        } else {
            rest = Some(match rest {
                Some(r) => fold(r, value),
                None => value,
            });
        }
    }
    if let Some(r) = rest {
        out.push((OTHER.to_owned(), r));
    }
    out
}

#[cfg(test)]
mod tests {
    use axum::http::Method;

    use super::*;

    #[test]
    fn made_up_methods_have_one_label() {
        assert_eq!(method_label(&Method::PATCH), "PATCH");
        let made_up = Method::from_bytes(&[b'X'; 2048]).unwrap();
        assert_eq!(method_label(&made_up), "OTHER");
    }

    #[test]
    fn sql_gauge_names_are_capped_and_the_rest_folded() {
        let rows: Vec<(String, i64)> = (0..500).map(|i| (format!("source-{i}"), 1)).collect();
        let kept = capped(rows, |a, b| a + b);
        assert_eq!(kept.len(), MAX_LABELLED + 1);
        assert_eq!(kept.last().unwrap(), &(OTHER.to_owned(), 400));
        // A row named `other` joins the folded rest, never a second series.
        let kept = capped(vec![("other".into(), 2), ("a".into(), 1)], |a, b| a + b);
        assert_eq!(kept, vec![("a".to_owned(), 1), ("other".to_owned(), 2)]);
    }

    #[test]
    fn every_refusal_is_counted_and_one_a_second_is_logged() {
        let m = super::super::Metrics::new();
        assert!(m.refused(Refusal::Method));
        for _ in 0..1000 {
            assert!(!m.refused(Refusal::Method));
        }
        // Another reason has a line of its own.
        assert!(m.refused(Refusal::Busy));
        assert_eq!(m.refusals(Refusal::Method), 1001);
    }
}
