//! Whatever a receiver sends back, the attempt's result is a value: its
//! response head is parsed as hyper parses it (httparse, then `StatusCode`
//! and `HeaderMap`, refusing what they refuse), read by the egress's own
//! [`ResponseHead`] at any clock reading, and its body taken through the
//! [`BodyTap`] under any limit. Nothing panics or overflows; the outcome
//! follows the status; a Retry-After is kept only on 429 and 503; the
//! bytes read never pass the limit; the excerpt is bounded, clean text.
#![no_main]

use libfuzzer_sys::fuzz_target;
use walhook_connectors::http::sink::{BodyTap, EXCERPT_MAX_BYTES, ResponseHead};
use walhook_pipeline::dispatch::outcome::AttemptOutcome;
use walhook_pipeline::sanitize::{Lines, is_clean};

fuzz_target!(|data: &[u8]| {
    // The first 8 bytes are the clock, the next 4 the body limit, the next
    // one the chunk size; the rest is the response.
    if data.len() < 13 {
        return;
    }
    let now = i64::from_le_bytes(data[..8].try_into().unwrap());
    let limit = u32::from_le_bytes(data[8..12].try_into().unwrap()) as usize % (1 << 17);
    let chunk = usize::from(data[12]).max(1);
    let raw = &data[13..];

    let mut slots = [httparse::EMPTY_HEADER; 64];
    let mut parsed = httparse::Response::new(&mut slots);
    let Ok(httparse::Status::Complete(head_len)) = parsed.parse(raw) else {
        return;
    };
    let Some(code) = parsed.code else {
        return;
    };
    let Ok(status) = http::StatusCode::from_u16(code) else {
        return;
    };
    let mut headers = http::HeaderMap::new();
    for h in parsed.headers.iter() {
        let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(h.name.as_bytes()),
            http::HeaderValue::from_bytes(h.value),
        ) else {
            return;
        };
        headers.append(name, value);
    }

    let head = ResponseHead::read(status, &headers, now);
    assert_eq!(head.status, code);
    if head.retry_after.is_some() {
        assert!(headers.contains_key(http::header::RETRY_AFTER));
    }

    let mut tap = BodyTap::new(limit);
    for piece in raw[head_len..].chunks(chunk) {
        if !tap.take(piece) {
            break;
        }
    }
    assert!(tap.read() <= limit);
    let result = tap.result(head);

    match result.outcome {
        AttemptOutcome::Gone => assert_eq!(code, 410),
        other => assert_eq!(other.status(), Some(code)),
    }
    if let AttemptOutcome::Retryable {
        retry_after: Some(_),
        ..
    } = result.outcome
    {
        assert!(code == 429 || code == 503, "{code}");
    }
    if let Some(excerpt) = &result.response_excerpt {
        assert!(excerpt.len() <= EXCERPT_MAX_BYTES);
        assert!(is_clean(excerpt, Lines::Keep));
    }
});
