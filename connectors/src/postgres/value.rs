//! Column values in the Postgres text format, written as typed JSON.
//!
//! The replication session pins `DateStyle=ISO`, `TimeZone=UTC`,
//! `IntervalStyle=iso_8601`, `bytea_output=hex` and `extra_float_digits=3`
//! (see `source.rs`), so the text each type prints is known and stable:
//!
//! | type (OID)                          | JSON                                      |
//! |-------------------------------------|-------------------------------------------|
//! | `bool`                              | `true` / `false`                          |
//! | `int2/int4/int8/oid`                | number                                    |
//! | `numeric`                           | number with the exact digits; `NaN`, `Infinity` as strings |
//! | `float4/float8`                     | number; `NaN`, `Infinity` as strings      |
//! | `json/jsonb`                        | embedded, re-serialised canonically       |
//! | `bytea`                             | base64 string                             |
//! | `timestamptz`                       | RFC 3339 string in UTC (`…Z`)             |
//! | `timestamp` (no time zone)          | RFC 3339 string, read as UTC (`…Z`)       |
//! | arrays of the above                 | JSON arrays, nested for more dimensions   |
//! | arrays of other types (`text[]`, `uuid[]`, enums, …) | JSON arrays of strings     |
//! | anything else (text, uuid, date, enum labels, …) | string as Postgres prints it |
//!
//! A domain is written as its base type, and an array of a domain as an
//! array of the base type: [`super::types`] maps each declared type first.
//!
//! Timestamps outside RFC 3339 (`infinity`, years BC) stay strings as printed.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use walhook_pipeline::canonical::JsonWriter;

/// Type OIDs with a JSON form of their own.
pub mod oid {
    #![allow(missing_docs)]
    pub const BOOL: u32 = 16;
    pub const BYTEA: u32 = 17;
    pub const INT8: u32 = 20;
    pub const INT2: u32 = 21;
    pub const INT4: u32 = 23;
    pub const TEXT: u32 = 25;
    pub const OID: u32 = 26;
    pub const JSON: u32 = 114;
    pub const FLOAT4: u32 = 700;
    pub const FLOAT8: u32 = 701;
    pub const VARCHAR: u32 = 1043;
    pub const TIMESTAMP: u32 = 1114;
    pub const TIMESTAMPTZ: u32 = 1184;
    pub const NUMERIC: u32 = 1700;
    pub const JSONB: u32 = 3802;
}

/// The element type of a built-in array type, if `type_oid` is one.
pub fn array_element(type_oid: u32) -> Option<u32> {
    Some(match type_oid {
        1000 => oid::BOOL,
        1001 => oid::BYTEA,
        1005 => oid::INT2,
        1007 => oid::INT4,
        1016 => oid::INT8,
        1028 => oid::OID,
        1021 => oid::FLOAT4,
        1022 => oid::FLOAT8,
        1231 => oid::NUMERIC,
        199 => oid::JSON,
        3807 => oid::JSONB,
        1115 => oid::TIMESTAMP,
        1185 => oid::TIMESTAMPTZ,
        // Arrays whose elements are written as strings.
        1009 => oid::TEXT,
        1015 => oid::VARCHAR,
        1014 => 1042,
        1182 => 1082,
        2951 => 2950,
        1183 => 1083,
        1187 => 1186,
        _ => return None,
    })
}

/// Whether values of `type_oid` may be stored out of line (TOASTed), so that
/// an update can leave them out of the new tuple.
pub fn may_be_toasted(type_oid: u32) -> bool {
    // Fixed-width built-ins cannot be TOASTed; everything variable-width can.
    !matches!(
        type_oid,
        oid::BOOL
            | oid::INT2
            | oid::INT4
            | oid::INT8
            | oid::OID
            | oid::FLOAT4
            | oid::FLOAT8
            | oid::TIMESTAMP
            | oid::TIMESTAMPTZ
            | 1082
            | 1083
            | 2950
            | 18
            | 19
    )
}

/// Whether `text` is a JSON number token.
fn is_json_number(text: &str) -> bool {
    let b = text.as_bytes();
    let mut i = 0;
    if b.first() == Some(&b'-') {
        i += 1;
    }
    let int_start = i;
    while i < b.len() && b[i].is_ascii_digit() {
        i += 1;
    }
    let int_len = i - int_start;
    if int_len == 0 || (int_len > 1 && b[int_start] == b'0') {
        return false;
    }
    if i < b.len() && b[i] == b'.' {
        i += 1;
        let f = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == f {
            return false;
        }
    }
    if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
        i += 1;
        if i < b.len() && (b[i] == b'+' || b[i] == b'-') {
            i += 1;
        }
        let e = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == e {
            return false;
        }
    }
    i == b.len()
}

/// `2026-11-29 10:11:44.5+00` → `2026-11-29T10:11:44.5Z`; `None` when the
/// text is not exactly Postgres's ISO output (infinity, BC, years past 9999,
/// anything else), so that such text is kept as it is.
fn iso_timestamp_to_rfc3339(text: &str, with_zone: bool) -> Option<String> {
    // Every byte is checked against the ISO shape, so the text is ASCII and
    // every slice below is on a char boundary whatever the input holds.
    fn digits(b: &[u8]) -> bool {
        !b.is_empty() && b.iter().all(u8::is_ascii_digit)
    }
    const PATTERN: &[u8; 19] = b"dddd-dd-dd dd:dd:dd";
    let b = text.as_bytes();
    let fits = b.len() >= 19
        && PATTERN.iter().zip(b).all(|(p, c)| match p {
            b'd' => c.is_ascii_digit(),
            p => p == c,
        });
    if !fits {
        return None;
    }
    let zone_at = if with_zone {
        19 + text[19..].find(['+', '-'])?
    } else {
        b.len()
    };
    let fraction = &b[19..zone_at];
    if !(fraction.is_empty() || (fraction[0] == b'.' && digits(&fraction[1..]))) {
        return None;
    }
    let zone = &text[zone_at..];
    // [+-]HH, [+-]HH:MM or [+-]HH:MM:SS.
    let zone_ok = zone.is_empty()
        || zone.len() >= 3
            && digits(&zone.as_bytes()[1..3])
            && zone.as_bytes()[3..]
                .chunks(3)
                .all(|c| c.len() == 3 && c[0] == b':' && digits(&c[1..]));
    if !zone_ok || zone.len() > 9 {
        return None;
    }
    let mut out = String::with_capacity(text.len() + 6);
    out.push_str(&text[..10]);
    out.push('T');
    out.push_str(&text[11..zone_at]);
    match zone {
        "" | "+00" | "+00:00" => out.push('Z'),
        z if z.len() == 3 => {
            out.push_str(z);
            out.push_str(":00");
        }
        z => out.push_str(z),
    }
    Some(out)
}

/// Writes the text-format `value` of type `type_oid` as JSON.
pub fn write_text_value(w: &mut JsonWriter<'_>, type_oid: u32, value: &[u8]) {
    let Ok(text) = std::str::from_utf8(value) else {
        // The session's client_encoding is UTF8, so this cannot happen for
        // text output; keep the bytes rather than lose them.
        w.string(&String::from_utf8_lossy(value));
        return;
    };
    if let Some(element) = array_element(type_oid) {
        if !write_array(w, element, text) {
            w.string(text);
        }
        return;
    }
    write_scalar(w, type_oid, text);
}

fn write_scalar(w: &mut JsonWriter<'_>, type_oid: u32, text: &str) {
    match type_oid {
        oid::BOOL => match text {
            "t" => w.boolean(true),
            "f" => w.boolean(false),
            other => w.string(other),
        },
        oid::INT2 | oid::INT4 | oid::INT8 | oid::OID | oid::NUMERIC | oid::FLOAT4 | oid::FLOAT8 => {
            if is_json_number(text) {
                w.raw_number(text)
            } else {
                w.string(text)
            }
        }
        oid::JSON | oid::JSONB => {
            if w.embedded_json(text).is_err() {
                w.string(text);
            }
        }
        oid::BYTEA => match text.strip_prefix("\\x").and_then(decode_hex) {
            Some(bytes) => w.string(&STANDARD.encode(bytes)),
            None => w.string(text),
        },
        oid::TIMESTAMPTZ | oid::TIMESTAMP => {
            match iso_timestamp_to_rfc3339(text, type_oid == oid::TIMESTAMPTZ) {
                Some(rfc) => w.string(&rfc),
                None => w.string(text),
            }
        }
        _ => w.string(text),
    }
}

fn decode_hex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    hex.as_bytes()
        .chunks(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}

/// One element of an array literal.
enum Element {
    Null,
    Value(String),
    Nested(Vec<Element>),
}

/// Parses a Postgres array literal such as `{1,2}`, `{"a b",NULL}` or
/// `{{1,2},{3,4}}`. Literals with explicit bounds (`[0:1]={…}`) are left to
/// the caller's fallback.
fn parse_array(text: &str) -> Option<Vec<Element>> {
    let bytes = text.as_bytes();
    let mut pos = 0;
    let items = parse_array_level(bytes, &mut pos, 0)?;
    (pos == bytes.len()).then_some(items)
}

fn parse_array_level(b: &[u8], pos: &mut usize, depth: usize) -> Option<Vec<Element>> {
    // Postgres allows at most 6 dimensions.
    if depth > 6 || b.get(*pos) != Some(&b'{') {
        return None;
    }
    *pos += 1;
    let mut items = Vec::new();
    if b.get(*pos) == Some(&b'}') {
        *pos += 1;
        return Some(items);
    }
    loop {
        match b.get(*pos)? {
            b'{' => items.push(Element::Nested(parse_array_level(b, pos, depth + 1)?)),
            b'"' => {
                *pos += 1;
                let mut s = Vec::new();
                loop {
                    match *b.get(*pos)? {
                        b'"' => {
                            *pos += 1;
                            break;
                        }
                        b'\\' => {
                            s.push(*b.get(*pos + 1)?);
                            *pos += 2;
                        }
                        c => {
                            s.push(c);
                            *pos += 1;
                        }
                    }
                }
                items.push(Element::Value(String::from_utf8(s).ok()?));
            }
            _ => {
                let start = *pos;
                while let Some(&c) = b.get(*pos) {
                    if c == b',' || c == b'}' {
                        break;
                    }
                    *pos += 1;
                }
                let token = std::str::from_utf8(&b[start..*pos]).ok()?;
                if token.eq_ignore_ascii_case("NULL") {
                    items.push(Element::Null);
                } else {
                    items.push(Element::Value(token.to_owned()));
                }
            }
        }
        match b.get(*pos)? {
            b',' => *pos += 1,
            b'}' => {
                *pos += 1;
                return Some(items);
            }
            _ => return None,
        }
    }
}

fn write_elements(w: &mut JsonWriter<'_>, element_oid: u32, items: &[Element]) {
    w.begin_array();
    for item in items {
        match item {
            Element::Null => w.null(),
            Element::Value(v) => write_scalar(w, element_oid, v),
            Element::Nested(inner) => write_elements(w, element_oid, inner),
        }
    }
    w.end_array();
}

fn write_array(w: &mut JsonWriter<'_>, element_oid: u32, text: &str) -> bool {
    match parse_array(text) {
        Some(items) => {
            write_elements(w, element_oid, &items);
            true
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn json(type_oid: u32, text: &str) -> String {
        let mut out = Vec::new();
        write_text_value(&mut JsonWriter::new(&mut out), type_oid, text.as_bytes());
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn scalars_get_their_json_types() {
        assert_eq!(json(oid::BOOL, "t"), "true");
        assert_eq!(
            json(oid::INT8, "-9223372036854775808"),
            "-9223372036854775808"
        );
        assert_eq!(
            json(oid::NUMERIC, "123456789012345678901234567890.000000001"),
            "123456789012345678901234567890.000000001"
        );
        assert_eq!(json(oid::NUMERIC, "NaN"), r#""NaN""#);
        assert_eq!(json(oid::FLOAT8, "1e+300"), "1e+300");
        assert_eq!(json(oid::FLOAT8, "-Infinity"), r#""-Infinity""#);
        assert_eq!(
            json(oid::JSONB, r#"{"b": 1, "a": [2]}"#),
            r#"{"a":[2],"b":1}"#
        );
        assert_eq!(json(oid::BYTEA, "\\x00ff10"), r#""AP8Q""#);
        assert_eq!(json(oid::TEXT, "line\nbreak"), r#""line\nbreak""#);
        assert_eq!(
            json(2950, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
            r#""a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11""#
        );
    }

    #[test]
    fn timestamps_become_rfc3339() {
        assert_eq!(
            json(oid::TIMESTAMPTZ, "2026-11-29 10:11:44.123456+00"),
            r#""2026-11-29T10:11:44.123456Z""#
        );
        assert_eq!(
            json(oid::TIMESTAMPTZ, "2026-11-29 10:11:44+05:30"),
            r#""2026-11-29T10:11:44+05:30""#
        );
        assert_eq!(
            json(oid::TIMESTAMPTZ, "2026-11-29 10:11:44-08"),
            r#""2026-11-29T10:11:44-08:00""#
        );
        assert_eq!(
            json(oid::TIMESTAMP, "2026-11-29 10:11:44.5"),
            r#""2026-11-29T10:11:44.5Z""#
        );
        assert_eq!(json(oid::TIMESTAMPTZ, "infinity"), r#""infinity""#);
        assert_eq!(
            json(oid::TIMESTAMP, "0044-03-15 12:00:00 BC"),
            r#""0044-03-15 12:00:00 BC""#
        );
    }

    #[test]
    fn text_that_only_looks_like_a_timestamp_stays_a_string() {
        // Found by the pgoutput fuzzer: a multi-byte char across byte 19
        // (or 10) once panicked on a slice that was not a char boundary.
        for text in [
            "5.1e-\0\0\0\0\0 \x0052nnn.\u{65a}0&-",
            "2026-11-29 10:11:4\u{65a}+00",
            "2026-11-2\u{65a}10:11:44+00",
            "2026-11-29 10:11:44\u{65a}+00",
            "abcd-ef-gh ij:kl:mn+00",
        ] {
            for type_oid in [oid::TIMESTAMP, oid::TIMESTAMPTZ] {
                let out = json(type_oid, text);
                let back: String = serde_json::from_str(&out).unwrap();
                assert_eq!(back, text, "{type_oid}");
            }
        }
    }

    #[test]
    fn arrays_become_json_arrays() {
        assert_eq!(json(1007, "{1,2,NULL}"), "[1,2,null]");
        assert_eq!(
            json(1009, r#"{"a b","c\"d",NULL,"NULL",plain}"#),
            r#"["a b","c\"d",null,"NULL","plain"]"#
        );
        assert_eq!(json(1016, "{{1,2},{3,4}}"), "[[1,2],[3,4]]");
        assert_eq!(json(1000, "{}"), "[]");
        assert_eq!(
            json(3807, r#"{"{\"b\": 1, \"a\": 2}"}"#),
            r#"[{"a":2,"b":1}]"#
        );
        assert_eq!(json(1007, "[0:1]={1,2}"), r#""[0:1]={1,2}""#);
    }

    proptest! {
        #[test]
        fn any_text_of_any_type_gives_valid_json(
            type_oid in proptest::sample::select(vec![16u32, 17, 20, 25, 114, 700, 1007, 1009, 1114, 1184, 1700, 3802, 3807]),
            text in "\\PC{0,40}",
        ) {
            let out = json(type_oid, &text);
            prop_assert!(serde_json::from_str::<serde_json::Value>(&out).is_ok(), "{} from {:?}", out, text);
        }
    }
}
