//! Untrusted text made safe where it enters.
//!
//! Receivers, producers and API callers control bytes that end up in
//! Postgres `text` and `jsonb` values, HTTP headers and log lines. Postgres
//! refuses NUL (`0x00`) and invalid UTF-8 in text; a log line with control
//! characters can forge lines or hide text; an unbounded value can fill a
//! disk. Every such byte string passes through [`clean_text`] (or one of its
//! wrappers) before it is stored, logged or echoed, so that the failure
//! cannot happen where the value is used.
//!
//! The rules, in order:
//! - invalid UTF-8 becomes U+FFFD (the replacement character), one per
//!   maximal invalid sequence, as `String::from_utf8_lossy` does;
//! - NUL and the other C0 controls (except tab, line feed and carriage
//!   return when [`Lines::Keep`]), DEL, and the C1 controls U+0080–U+009F
//!   become `\u{…}`-style escapes such as `\x00`, so an operator sees that
//!   they were there;
//! - the result is cut to at most `max_bytes` bytes on a character
//!   boundary, with `…` appended when something was cut.

use std::fmt::Write as _;

/// What to do with line breaks and tabs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lines {
    /// Keep `\t`, `\n` and `\r` (response excerpts, multi-line texts).
    Keep,
    /// Escape them too (identifiers, log fields, header values).
    Escape,
}

/// The marker appended to a value that was cut.
pub const ELLIPSIS: &str = "…";

/// `bytes` as text that Postgres, a header or a log line accepts: see the
/// module documentation. Never panics; the result is at most `max_bytes`
/// bytes long (plus nothing: the ellipsis counts towards the limit).
pub fn clean_text(bytes: &[u8], lines: Lines, max_bytes: usize) -> String {
    let mut out = String::with_capacity(bytes.len().min(max_bytes));
    let mut cut = false;
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            if !push_clean(&mut out, c, lines, max_bytes) {
                cut = true;
                break;
            }
        }
        if cut {
            break;
        }
        if !chunk.invalid().is_empty()
            && !push_clean(&mut out, char::REPLACEMENT_CHARACTER, lines, max_bytes)
        {
            cut = true;
            break;
        }
    }
    if cut {
        // Make room for the marker on a character boundary.
        let room = max_bytes.saturating_sub(ELLIPSIS.len());
        let mut end = room.min(out.len());
        while !out.is_char_boundary(end) {
            end -= 1;
        }
        out.truncate(end);
        if max_bytes >= ELLIPSIS.len() {
            out.push_str(ELLIPSIS);
        }
    }
    out
}

/// [`clean_text`] of a `&str` (which is valid UTF-8 but may still hold NUL
/// and controls).
pub fn clean_str(text: &str, lines: Lines, max_bytes: usize) -> String {
    if is_clean(text, lines) && text.len() <= max_bytes {
        return text.to_owned();
    }
    clean_text(text.as_bytes(), lines, max_bytes)
}

/// Whether `text` has nothing [`clean_text`] would change (length aside).
pub fn is_clean(text: &str, lines: Lines) -> bool {
    !text.chars().any(|c| needs_escape(c, lines))
}

/// The first character of `text` that cannot be stored or shown as is
/// (NUL, a control character), with its byte offset: for error messages
/// that name the position of the bad character.
pub fn first_unsafe(text: &str, lines: Lines) -> Option<(usize, char)> {
    text.char_indices().find(|(_, c)| needs_escape(*c, lines))
}

fn needs_escape(c: char, lines: Lines) -> bool {
    match c {
        '\t' | '\n' | '\r' => lines == Lines::Escape,
        c => c.is_control(),
    }
}

/// Appends `c` (escaped when needed); `false` when it does not fit.
fn push_clean(out: &mut String, c: char, lines: Lines, max_bytes: usize) -> bool {
    if needs_escape(c, lines) {
        let mut escaped = String::with_capacity(6);
        match c {
            '\t' => escaped.push_str("\\t"),
            '\n' => escaped.push_str("\\n"),
            '\r' => escaped.push_str("\\r"),
            c if (c as u32) < 0x100 => {
                let _ = write!(escaped, "\\x{:02x}", c as u32);
            }
            c => {
                let _ = write!(escaped, "\\u{{{:x}}}", c as u32);
            }
        }
        if out.len() + escaped.len() > max_bytes {
            return false;
        }
        out.push_str(&escaped);
    } else {
        if out.len() + c.len_utf8() > max_bytes {
            return false;
        }
        out.push(c);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nul_invalid_utf8_and_controls_are_escaped() {
        let raw = b"ok\0\xff\xfe then \x1b[31m red \xc2\x85 next\r\nline";
        let clean = clean_text(raw, Lines::Keep, 1024);
        assert_eq!(
            clean,
            "ok\\x00\u{fffd}\u{fffd} then \\x1b[31m red \\x85 next\r\nline"
        );
        assert!(!clean.contains('\0'));
        let one_line = clean_text(raw, Lines::Escape, 1024);
        assert!(one_line.ends_with("next\\r\\nline"), "{one_line}");
    }

    #[test]
    fn cut_on_a_character_boundary_with_a_marker() {
        let text = "ééééé"; // 10 bytes
        let cut = clean_str(text, Lines::Keep, 7);
        assert!(cut.len() <= 7, "{cut:?}");
        assert_eq!(cut, "éé…");
        assert_eq!(clean_str("abc", Lines::Keep, 3), "abc");
        assert_eq!(clean_str("abcd", Lines::Keep, 2), "");
        assert_eq!(clean_str("abcd", Lines::Keep, 0), "");
    }

    #[test]
    fn clean_text_is_unchanged() {
        let text = "plain text, with ünïcödé and 漢字\tand tabs";
        assert_eq!(clean_str(text, Lines::Keep, 1000), text);
        assert!(is_clean(text, Lines::Keep));
        assert!(!is_clean(text, Lines::Escape));
        assert_eq!(first_unsafe("ab\0c", Lines::Keep), Some((2, '\0')));
    }

    proptest::proptest! {
        #[test]
        fn output_is_always_storable(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..300), max in 0usize..200) {
            for lines in [Lines::Keep, Lines::Escape] {
                let out = clean_text(&bytes, lines, max);
                proptest::prop_assert!(out.len() <= max);
                proptest::prop_assert!(!out.contains('\0'));
                proptest::prop_assert!(is_clean(&out, lines));
            }
        }
    }
}
