//! Whatever a receiver answers, its stored excerpt is storable text: no NUL,
//! no control character but tab and line breaks, valid UTF-8, bounded.
#![no_main]

use libfuzzer_sys::fuzz_target;
use walhook_connectors::http::sink::{EXCERPT_MAX_BYTES, response_excerpt};
use walhook_pipeline::sanitize::{Lines, is_clean};

fuzz_target!(|data: &[u8]| {
    let excerpt = response_excerpt(data);
    assert!(excerpt.len() <= EXCERPT_MAX_BYTES);
    assert!(!excerpt.contains('\0'));
    assert!(is_clean(&excerpt, Lines::Keep));
    // Clean text of the limit's length comes back unchanged.
    if let Ok(text) = std::str::from_utf8(data)
        && text.len() <= EXCERPT_MAX_BYTES
        && is_clean(text, Lines::Keep)
    {
        assert_eq!(excerpt, text);
    }
});
