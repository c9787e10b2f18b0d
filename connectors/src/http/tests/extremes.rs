//! Receivers that answer with extreme numbers over real loopback HTTP: a
//! `Retry-After` past `u64`, dates far in the past and the future, negative
//! values, `Content-Length`s past `u64` or far beyond the bytes sent. Every
//! one ends in an outcome; none overflows or panics.

use std::sync::Arc;
use std::time::Duration;

use walhook_pipeline::dispatch::egress::Egress;
use walhook_pipeline::dispatch::outcome::{AttemptOutcome, ErrorClass};

use super::server::RawServer;
use super::{Recorder, dev_settings, egress, outbound};
use crate::http::resolve::StaticLookup;

/// What the egress made of a server answering `response` (connection
/// closed after it when `closing`).
async fn answer(response: &str, closing: bool) -> walhook_pipeline::dispatch::egress::EgressResult {
    let bytes = response.as_bytes().to_vec();
    let server = if closing {
        RawServer::plain_closing(bytes).await
    } else {
        RawServer::plain(bytes).await
    };
    let table = Arc::new(StaticLookup::new());
    let recorder = Arc::new(Recorder::default());
    let egress = egress(dev_settings(), &table, &recorder);
    let result = egress
        .send(outbound(&format!(
            "http://127.0.0.1:{}/hook",
            server.port()
        )))
        .await;
    recorder.assert_only_loopback();
    result
}

fn retry_after_of(outcome: &AttemptOutcome) -> Option<Duration> {
    match outcome {
        AttemptOutcome::Retryable { retry_after, .. } => *retry_after,
        other => panic!("not retryable: {other:?}"),
    }
}

#[tokio::test]
async fn retry_after_values_from_receivers_saturate() {
    let cases: [(&str, Option<Duration>); 6] = [
        ("99999999999999999999", Some(Duration::from_secs(u64::MAX))),
        ("18446744073709551616", Some(Duration::from_secs(u64::MAX))),
        ("-5", None),
        ("Mon, 01 Jan 0001 00:00:00 GMT", Some(Duration::ZERO)),
        ("Sun, 06 Nov 1994 08:49:37 GMT", Some(Duration::ZERO)),
        ("Sun, 06 Nov 99999999999999999999 08:49:37 GMT", None),
    ];
    for (value, want) in cases {
        for status in [429, 503] {
            let result = answer(
                &format!(
                    "HTTP/1.1 {status} Busy\r\nretry-after: {value}\r\ncontent-length: 0\r\n\r\n"
                ),
                false,
            )
            .await;
            assert_eq!(retry_after_of(&result.outcome), want, "{status} {value}");
        }
    }
    // A date at the end of the calendar: the whole span, in range.
    let result = answer(
        "HTTP/1.1 503 Busy\r\nretry-after: Fri, 31 Dec 9999 23:59:59 GMT\r\ncontent-length: 0\r\n\r\n",
        false,
    )
    .await;
    let span = retry_after_of(&result.outcome).unwrap();
    assert!(span > Duration::from_secs(200_000_000_000), "{span:?}");
}

#[tokio::test]
async fn content_lengths_past_what_arrives_or_past_u64_never_panic() {
    // Declared 2^63 - 1 bytes, sent 2, then closed: the status stands, the
    // two bytes are what is digested.
    let result = answer(
        "HTTP/1.1 200 OK\r\ncontent-length: 9223372036854775807\r\n\r\nok",
        true,
    )
    .await;
    assert!(result.outcome.is_success(), "{result:?}");
    assert_eq!(result.response_excerpt.as_deref(), Some("ok"));
    // Lengths hyper cannot hold (it keeps the top values of u64 for its own
    // markers) or that are not a u64 at all are not HTTP: hyper refuses the
    // response, which is a broken exchange (retried), not a panic.
    for length in ["18446744073709551615", "99999999999999999999"] {
        let result = answer(
            &format!("HTTP/1.1 200 OK\r\ncontent-length: {length}\r\n\r\nok"),
            true,
        )
        .await;
        assert_eq!(
            result.outcome.error_class(),
            Some(ErrorClass::Reset),
            "{length}: {result:?}"
        );
    }
    // Negative and conflicting lengths, likewise.
    for head in [
        "content-length: -1",
        "content-length: 2\r\ncontent-length: 3",
    ] {
        let result = answer(&format!("HTTP/1.1 200 OK\r\n{head}\r\n\r\nok"), true).await;
        assert!(
            matches!(result.outcome, AttemptOutcome::Retryable { .. }),
            "{head}: {result:?}"
        );
    }
}
