//! Canonical JSON: the one serialisation of an event body.
//!
//! The bytes an event is signed and sent with are written once, at capture,
//! and never rebuilt (DESIGN.md, Capture). "Canonical" here means: object keys
//! in ascending byte order, no insignificant white space, strings escaped
//! minimally (only `"`, `\` and control characters), numbers kept as the exact
//! digits the database printed (a `numeric(40,20)` never passes through a
//! float). The same input therefore always gives the same bytes.
//!
//! [`JsonWriter`] appends tokens to a buffer; callers that know their keys in
//! advance (capture rules sort their columns once) write objects directly.
//! [`JsonWriter::embedded_json`] re-serialises JSON text from `json`/`jsonb`
//! columns; it never panics and limits nesting depth.

use std::collections::BTreeMap;

/// Deepest nesting accepted in embedded JSON; deeper input is refused rather
/// than risking the stack.
pub const MAX_JSON_DEPTH: usize = 128;

/// Why embedded JSON text could not be re-serialised.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid JSON at byte {offset}: {reason}")]
pub struct JsonError {
    /// Byte offset in the input.
    pub offset: usize,
    /// What was wrong there.
    pub reason: &'static str,
}

/// Appends canonical JSON tokens to a byte buffer.
#[derive(Debug)]
pub struct JsonWriter<'a> {
    out: &'a mut Vec<u8>,
    /// One entry per open container: whether it already holds a member.
    not_empty: Vec<bool>,
    /// A key was just written; its value needs no separator.
    after_key: bool,
}

impl<'a> JsonWriter<'a> {
    /// A writer appending to `out`.
    pub fn new(out: &'a mut Vec<u8>) -> Self {
        JsonWriter {
            out,
            not_empty: Vec::with_capacity(4),
            after_key: false,
        }
    }

    /// Writes the separator a new member of the current container needs.
    fn separate(&mut self) {
        if self.after_key {
            self.after_key = false;
            return;
        }
        if let Some(not_empty) = self.not_empty.last_mut() {
            if *not_empty {
                self.out.push(b',');
            }
            *not_empty = true;
        }
    }

    /// Opens an object. Keys must then be written in ascending byte order.
    pub fn begin_object(&mut self) {
        self.separate();
        self.out.push(b'{');
        self.not_empty.push(false);
    }

    /// Closes the innermost object.
    pub fn end_object(&mut self) {
        self.not_empty.pop();
        self.out.push(b'}');
    }

    /// Opens an array.
    pub fn begin_array(&mut self) {
        self.separate();
        self.out.push(b'[');
        self.not_empty.push(false);
    }

    /// Closes the innermost array.
    pub fn end_array(&mut self) {
        self.not_empty.pop();
        self.out.push(b']');
    }

    /// Writes an object key; the value follows.
    pub fn key(&mut self, key: &str) {
        self.separate();
        write_escaped(self.out, key);
        self.out.push(b':');
        self.after_key = true;
    }

    /// Writes a string value.
    pub fn string(&mut self, value: &str) {
        self.separate();
        write_escaped(self.out, value);
    }

    /// Writes a number token exactly as given. The caller guarantees that
    /// `digits` is a valid JSON number.
    pub fn raw_number(&mut self, digits: &str) {
        self.separate();
        self.out.extend_from_slice(digits.as_bytes());
    }

    /// Writes a JSON value that is already canonical (for example from
    /// [`canonical_members`]).
    pub fn raw_value(&mut self, json: &str) {
        self.separate();
        self.out.extend_from_slice(json.as_bytes());
    }

    /// Writes an integer.
    pub fn integer(&mut self, value: i64) {
        self.separate();
        self.out.extend_from_slice(value.to_string().as_bytes());
    }

    /// Writes `true` or `false`.
    pub fn boolean(&mut self, value: bool) {
        self.separate();
        self.out
            .extend_from_slice(if value { b"true" } else { b"false" });
    }

    /// Writes `null`.
    pub fn null(&mut self) {
        self.separate();
        self.out.extend_from_slice(b"null");
    }

    /// Writes JSON text re-serialised canonically. On error nothing is
    /// written, so the caller can fall back to writing the text as a string.
    pub fn embedded_json(&mut self, text: &str) -> Result<(), JsonError> {
        let mut parser = Parser {
            bytes: text.as_bytes(),
            pos: 0,
        };
        let value = parser.document()?;
        self.separate();
        value.write(self.out);
        Ok(())
    }
}

/// Parses a JSON object and returns its members, each value re-serialised
/// canonically, keys in byte order. Anything but an object is an error.
pub fn canonical_members(text: &str) -> Result<Vec<(String, String)>, JsonError> {
    let mut parser = Parser {
        bytes: text.as_bytes(),
        pos: 0,
    };
    match parser.document()? {
        Value::Object(members) => Ok(members
            .into_iter()
            .map(|(k, v)| {
                let mut out = Vec::new();
                v.write(&mut out);
                // Serialised from valid UTF-8 strings and ASCII tokens.
                (k, String::from_utf8_lossy(&out).into_owned())
            })
            .collect()),
        _ => Err(JsonError {
            offset: 0,
            reason: "expected a JSON object",
        }),
    }
}

/// Writes `value` as a JSON string with minimal escaping.
pub fn write_escaped(out: &mut Vec<u8>, value: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    let bytes = value.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape: &[u8] = match b {
            b'"' => br#"\""#,
            b'\\' => br"\\",
            b'\n' => br"\n",
            b'\r' => br"\r",
            b'\t' => br"\t",
            0x08 => br"\b",
            0x0c => br"\f",
            0x00..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        if escape.is_empty() {
            out.extend_from_slice(br"\u00");
            out.push(HEX[(b >> 4) as usize]);
            out.push(HEX[(b & 0xf) as usize]);
        } else {
            out.extend_from_slice(escape);
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

/// A parsed JSON value that keeps number lexemes and sorts object keys.
#[derive(Debug)]
enum Value {
    Null,
    Bool(bool),
    Number(String),
    String(String),
    Array(Vec<Value>),
    /// Keys in byte order; a repeated key keeps its last value, as `jsonb`
    /// does.
    Object(BTreeMap<String, Value>),
}

impl Value {
    fn write(&self, out: &mut Vec<u8>) {
        match self {
            Value::Null => out.extend_from_slice(b"null"),
            Value::Bool(true) => out.extend_from_slice(b"true"),
            Value::Bool(false) => out.extend_from_slice(b"false"),
            Value::Number(n) => out.extend_from_slice(n.as_bytes()),
            Value::String(s) => write_escaped(out, s),
            Value::Array(items) => {
                out.push(b'[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    item.write(out);
                }
                out.push(b']');
            }
            Value::Object(members) => {
                out.push(b'{');
                for (i, (key, value)) in members.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    write_escaped(out, key);
                    out.push(b':');
                    value.write(out);
                }
                out.push(b'}');
            }
        }
    }
}

struct Parser<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl Parser<'_> {
    fn error(&self, reason: &'static str) -> JsonError {
        JsonError {
            offset: self.pos,
            reason,
        }
    }

    fn document(&mut self) -> Result<Value, JsonError> {
        let value = self.value(0)?;
        self.skip_ws();
        if self.pos != self.bytes.len() {
            return Err(self.error("trailing characters"));
        }
        Ok(value)
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.bytes.get(self.pos) {
            self.pos += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    fn literal(&mut self, literal: &'static [u8], value: Value) -> Result<Value, JsonError> {
        if self.bytes[self.pos..].starts_with(literal) {
            self.pos += literal.len();
            Ok(value)
        } else {
            Err(self.error("unknown literal"))
        }
    }

    fn value(&mut self, depth: usize) -> Result<Value, JsonError> {
        if depth > MAX_JSON_DEPTH {
            return Err(self.error("nesting too deep"));
        }
        self.skip_ws();
        match self.peek() {
            None => Err(self.error("unexpected end")),
            Some(b'n') => self.literal(b"null", Value::Null),
            Some(b't') => self.literal(b"true", Value::Bool(true)),
            Some(b'f') => self.literal(b"false", Value::Bool(false)),
            Some(b'"') => Ok(Value::String(self.string()?)),
            Some(b'[') => self.array(depth),
            Some(b'{') => self.object(depth),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(_) => Err(self.error("unexpected character")),
        }
    }

    fn array(&mut self, depth: usize) -> Result<Value, JsonError> {
        self.pos += 1;
        let mut items = Vec::new();
        self.skip_ws();
        if self.peek() == Some(b']') {
            self.pos += 1;
            return Ok(Value::Array(items));
        }
        loop {
            items.push(self.value(depth + 1)?);
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.pos += 1;
                    return Ok(Value::Array(items));
                }
                _ => return Err(self.error("expected , or ]")),
            }
        }
    }

    fn object(&mut self, depth: usize) -> Result<Value, JsonError> {
        self.pos += 1;
        let mut members = BTreeMap::new();
        self.skip_ws();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(Value::Object(members));
        }
        loop {
            self.skip_ws();
            if self.peek() != Some(b'"') {
                return Err(self.error("expected a key"));
            }
            let key = self.string()?;
            self.skip_ws();
            if self.peek() != Some(b':') {
                return Err(self.error("expected :"));
            }
            self.pos += 1;
            let value = self.value(depth + 1)?;
            members.insert(key, value);
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    return Ok(Value::Object(members));
                }
                _ => return Err(self.error("expected , or }")),
            }
        }
    }

    fn digits(&mut self) -> usize {
        let from = self.pos;
        while let Some(b'0'..=b'9') = self.peek() {
            self.pos += 1;
        }
        self.pos - from
    }

    fn number(&mut self) -> Result<Value, JsonError> {
        let start = self.pos;
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        let int_start = self.pos;
        let int_digits = self.digits();
        if int_digits == 0 || (int_digits > 1 && self.bytes[int_start] == b'0') {
            return Err(self.error("malformed number"));
        }
        if self.peek() == Some(b'.') {
            self.pos += 1;
            if self.digits() == 0 {
                return Err(self.error("malformed fraction"));
            }
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.pos += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.pos += 1;
            }
            if self.digits() == 0 {
                return Err(self.error("malformed exponent"));
            }
        }
        // The lexeme is ASCII by construction.
        let text = String::from_utf8_lossy(&self.bytes[start..self.pos]).into_owned();
        Ok(Value::Number(text))
    }

    fn hex4(&mut self) -> Result<u32, JsonError> {
        let end = self.pos + 4;
        let chunk = self
            .bytes
            .get(self.pos..end)
            .ok_or_else(|| self.error("short escape"))?;
        let mut value = 0u32;
        for &c in chunk {
            let digit = (c as char)
                .to_digit(16)
                .ok_or_else(|| self.error("bad escape"))?;
            value = value * 16 + digit;
        }
        self.pos = end;
        Ok(value)
    }

    fn unicode_escape(&mut self) -> Result<char, JsonError> {
        let first = self.hex4()?;
        let code = if (0xd800..0xdc00).contains(&first) {
            if !self.bytes[self.pos..].starts_with(br"\u") {
                return Err(self.error("lone surrogate"));
            }
            self.pos += 2;
            let second = self.hex4()?;
            if !(0xdc00..0xe000).contains(&second) {
                return Err(self.error("lone surrogate"));
            }
            0x10000 + ((first - 0xd800) << 10) + (second - 0xdc00)
        } else {
            first
        };
        char::from_u32(code).ok_or_else(|| self.error("lone surrogate"))
    }

    fn string(&mut self) -> Result<String, JsonError> {
        // Called on the opening quote.
        self.pos += 1;
        let mut out = String::new();
        loop {
            let run_start = self.pos;
            while let Some(c) = self.peek() {
                if c == b'"' || c == b'\\' || c < 0x20 {
                    break;
                }
                self.pos += 1;
            }
            let run = std::str::from_utf8(&self.bytes[run_start..self.pos])
                .map_err(|_| self.error("invalid UTF-8"))?;
            out.push_str(run);
            match self.peek() {
                None => return Err(self.error("unterminated string")),
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.pos += 1;
                    let escaped = self
                        .peek()
                        .ok_or_else(|| self.error("unterminated escape"))?;
                    self.pos += 1;
                    match escaped {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => out.push(self.unicode_escape()?),
                        _ => return Err(self.error("unknown escape")),
                    }
                }
                Some(_) => return Err(self.error("control character in string")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn canon(text: &str) -> String {
        let mut out = Vec::new();
        JsonWriter::new(&mut out).embedded_json(text).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn sorts_keys_and_keeps_number_digits() {
        assert_eq!(
            canon(
                r#" { "b": 1.10, "a": [true, null, {"z":1,"y":2}], "c": 12345678901234567890123 } "#
            ),
            r#"{"a":[true,null,{"y":2,"z":1}],"b":1.10,"c":12345678901234567890123}"#
        );
    }

    #[test]
    fn escapes_minimally() {
        assert_eq!(
            canon(r#""a\u0041\u00e9\n\"\\\/\ud83d\ude00""#),
            r#""aAé\n\"\\/😀""#
        );
        let mut out = Vec::new();
        write_escaped(&mut out, "\u{1}\u{7f}");
        assert_eq!(out, "\"\\u0001\u{7f}\"".as_bytes());
    }

    #[test]
    fn refuses_malformed_input() {
        let bad = [
            "",
            "{",
            "[1,]",
            "01",
            "1.",
            r#""\x""#,
            r#""\ud800""#,
            "nul",
            r#"{"a" 1}"#,
            "1 2",
        ];
        for text in bad {
            let mut out = Vec::new();
            assert!(
                JsonWriter::new(&mut out).embedded_json(text).is_err(),
                "{text:?}"
            );
            assert!(out.is_empty());
        }
        let deep = "[".repeat(MAX_JSON_DEPTH + 2);
        let mut out = Vec::new();
        assert!(JsonWriter::new(&mut out).embedded_json(&deep).is_err());
    }

    #[test]
    fn writer_separates_members() {
        let mut out = Vec::new();
        let mut w = JsonWriter::new(&mut out);
        w.begin_object();
        w.key("a");
        w.begin_array();
        w.integer(1);
        w.string("x");
        w.end_array();
        w.key("b");
        w.null();
        w.end_object();
        assert_eq!(out, br#"{"a":[1,"x"],"b":null}"#);
    }

    proptest! {
        #[test]
        fn reserialising_is_idempotent_and_agrees_with_serde(text in r#"[\[\]{}",:0-9a-z\\ .eE+-]{0,40}"#) {
            let mut out = Vec::new();
            let mine = JsonWriter::new(&mut out).embedded_json(&text).is_ok();
            let theirs = serde_json::from_str::<serde_json::Value>(&text);
            prop_assert_eq!(mine, theirs.is_ok(), "{:?}", text);
            if mine {
                let once = String::from_utf8(out.clone()).unwrap();
                prop_assert_eq!(canon(&once), once.clone());
                let reparsed: serde_json::Value = serde_json::from_str(&once).unwrap();
                prop_assert_eq!(reparsed, theirs.unwrap());
            }
        }
    }
}
