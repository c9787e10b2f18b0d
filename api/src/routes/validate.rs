//! Checks of request values, each naming the field and the fix. Handlers
//! run every check before writing anything, so a refused request changes
//! nothing.

use walhook_pipeline::event::EventType;
use walhook_pipeline::sanitize::{Lines, first_unsafe};
use walhook_pipeline::url_policy::{UrlPolicy, check_url};
use walhook_sql::Platform;

use crate::error::{ApiError, FieldError};
use crate::model::endpoints::{MAX_EVENT_TYPES, MAX_URL_LEN};

/// Collects field errors, then fails with all of them at once.
#[derive(Debug, Default)]
pub struct Checks(Vec<FieldError>);

impl Checks {
    /// Records `message` for `field`.
    pub fn fail(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.0.push(FieldError {
            field: field.into(),
            message: message.into(),
        });
    }

    /// Text of at most `max` characters without control characters
    /// (newlines and tabs allowed when `multiline`).
    pub fn text(&mut self, field: &str, value: &str, max: usize, multiline: bool) {
        let n = value.chars().count();
        if n > max {
            self.fail(
                field,
                format!("has {n} characters; at most {max} are allowed"),
            );
        }
        let lines = if multiline {
            Lines::Keep
        } else {
            Lines::Escape
        };
        self.storable(field, value, lines);
    }

    /// Text without NUL or other control characters (see [`unsafe_text`]);
    /// `false` when it has one.
    pub fn storable(&mut self, field: &str, value: &str, lines: Lines) -> bool {
        match unsafe_text(value, lines) {
            Some(message) => {
                self.fail(field, message);
                false
            }
            None => true,
        }
    }

    /// An endpoint URL, against the egress policy; returns the URL as it
    /// will be stored (re-serialised by the WHATWG parser).
    pub fn url(&mut self, field: &str, value: &str, policy: &UrlPolicy) -> Option<String> {
        // Before the parser, which would strip or percent-encode such
        // characters and store a URL other than the one sent.
        if !self.storable(field, value, Lines::Escape) {
            return None;
        }
        if value.len() > MAX_URL_LEN {
            self.fail(
                field,
                format!(
                    "has {} bytes; at most {MAX_URL_LEN} are allowed",
                    value.len()
                ),
            );
            return None;
        }
        match check_url(value, policy) {
            Ok(vetted) => Some(vetted.url.to_string()),
            Err(refusal) => {
                self.fail(
                    field,
                    format!("{} (refused: {})", refusal.detail, refusal.reason.as_str()),
                );
                None
            }
        }
    }

    /// Event type names: well-formed, no repeats, at most
    /// [`MAX_EVENT_TYPES`]. The catalog check is [`Checks::known_types`].
    pub fn event_types(&mut self, field: &str, names: &[String]) -> Vec<EventType> {
        if names.len() > MAX_EVENT_TYPES {
            self.fail(
                field,
                format!(
                    "lists {} types; at most {MAX_EVENT_TYPES} are allowed",
                    names.len()
                ),
            );
            return Vec::new();
        }
        let mut out: Vec<EventType> = Vec::with_capacity(names.len());
        for (i, name) in names.iter().enumerate() {
            if !self.storable(&format!("{field}[{i}]"), name, Lines::Escape) {
                continue;
            }
            match EventType::new(name) {
                Ok(t) if out.contains(&t) => {
                    self.fail(format!("{field}[{i}]"), format!("{name:?} is listed twice"));
                }
                Ok(t) => out.push(t),
                Err(_) => self.fail(
                    format!("{field}[{i}]"),
                    format!(
                        "{name:?} is not an event type name (a letter, then letters, digits, '.', '_' or '-'; at most 128)"
                    ),
                ),
            }
        }
        out
    }

    /// Fails the types missing from the catalog.
    pub async fn known_types(
        &mut self,
        platform: &Platform,
        field: &str,
        types: &[EventType],
    ) -> Result<(), ApiError> {
        let names: Vec<String> = types.iter().map(|t| t.to_string()).collect();
        let unknown = platform.unknown_event_types(&names).await?;
        for (i, name) in names.iter().enumerate() {
            if unknown.contains(name) {
                self.fail(
                    format!("{field}[{i}]"),
                    format!("{name:?} is not in the event-type catalog; GET /v1/event-types lists the types"),
                );
            }
        }
        Ok(())
    }

    /// An integer in `min..=max`.
    /// Checks a retry schedule against the operator's limits; each problem
    /// names `retry.<field>`.
    pub fn retry(
        &mut self,
        value: Option<&crate::model::RetrySchedule>,
        limits: &walhook_pipeline::retry::RetryLimits,
    ) {
        if let Some(v) = value {
            let o = walhook_pipeline::retry::RetryOverride::from(*v);
            for (field, why) in o.problems(limits) {
                self.fail(format!("retry.{field}"), why);
            }
        }
    }

    /// Records a failure unless `value` lies in `min..=max`.
    pub fn range(&mut self, field: &str, value: Option<u32>, min: u32, max: u32) {
        if let Some(v) = value
            && !(min..=max).contains(&v)
        {
            self.fail(field, format!("is {v}; give {min} to {max}"));
        }
    }

    /// Ok when nothing failed.
    pub fn finish(self) -> Result<(), ApiError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(ApiError::fields(self.0))
        }
    }
}

/// What is wrong with `value` when it holds a character that must not be
/// stored or shown as is: NUL (which Postgres refuses in text) or another
/// control character (tab, line feed and carriage return are allowed with
/// [`Lines::Keep`]). Names the character and its position, and the fix.
pub fn unsafe_text(value: &str, lines: Lines) -> Option<String> {
    let (at, c) = first_unsafe(value, lines)?;
    let name = match c {
        '\0' => " (NUL)",
        '\t' => " (tab)",
        '\n' => " (line feed)",
        '\r' => " (carriage return)",
        _ => "",
    };
    let allowed = match lines {
        Lines::Keep => "only printable characters, line breaks and tabs are allowed",
        Lines::Escape => "only printable characters are allowed (no line breaks or tabs)",
    };
    Some(format!(
        "contains the control character U+{:04X}{name} at byte {at}; remove it: {allowed}",
        c as u32
    ))
}

/// The page size: 1 to `max`, `default` when absent.
pub fn limit(value: Option<&str>, default: i64, max: i64) -> Result<i64, ApiError> {
    count("query.limit", value, default, max)
}

/// A whole number from 1 to `max` in `field`, `default` when absent.
pub fn count(field: &str, value: Option<&str>, default: i64, max: i64) -> Result<i64, ApiError> {
    let Some(text) = value else {
        return Ok(default);
    };
    match text.trim().parse::<i64>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(ApiError::field(
            field,
            format!("is {text:?}; give a whole number from 1 to {max}"),
        )),
    }
}

/// An RFC 3339 time in a query parameter.
pub fn time(field: &str, value: Option<&str>) -> Result<Option<std::time::SystemTime>, ApiError> {
    let Some(text) = value else {
        return Ok(None);
    };
    chrono::DateTime::parse_from_rfc3339(text.trim())
        .map(|t| Some(std::time::SystemTime::from(t)))
        .map_err(|e| {
            ApiError::field(
                field,
                format!("{text:?} is not an RFC 3339 time ({e}); write e.g. 2026-11-29T10:00:00Z"),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_against_the_policy() {
        let policy = UrlPolicy::default();
        let mut c = Checks::default();
        assert_eq!(
            c.url("url", "https://hooks.example.com/x", &policy)
                .as_deref(),
            Some("https://hooks.example.com/x")
        );
        assert!(c.url("url", "http://10.0.0.1/x", &policy).is_none());
        assert!(c.url("url", "https://169.254.169.254/", &policy).is_none());
        assert!(c.url("url", "not a url", &policy).is_none());
        let e = c.finish().unwrap_err().problem();
        assert_eq!(e.errors.len(), 3);
        assert!(e.errors.iter().all(|f| f.field == "url"));
    }

    #[test]
    fn event_types_are_named_by_index() {
        let mut c = Checks::default();
        let ok = c.event_types(
            "event_types",
            &[
                "invoice.paid".into(),
                "bad type".into(),
                "invoice.paid".into(),
            ],
        );
        assert_eq!(ok.len(), 1);
        let e = c.finish().unwrap_err().problem();
        let fields: Vec<&str> = e.errors.iter().map(|f| f.field.as_str()).collect();
        assert_eq!(fields, vec!["event_types[1]", "event_types[2]"]);
    }

    #[test]
    fn control_characters_are_named_with_their_position() {
        let mut c = Checks::default();
        c.text("description", "line one\nline two\ttabbed", 100, true);
        assert!(c.finish().is_ok());
        let mut c = Checks::default();
        c.text("description", "bad\0byte", 100, true);
        c.text("name", "two\nlines", 100, false);
        assert!(
            c.url(
                "url",
                "https://hooks.example.com/\u{1}",
                &UrlPolicy::default()
            )
            .is_none()
        );
        c.event_types("event_types", &["invoice.paid".into(), "a\0".into()]);
        let e = c.finish().unwrap_err().problem();
        let got: Vec<(&str, &str)> = e
            .errors
            .iter()
            .map(|f| (f.field.as_str(), f.message.as_str()))
            .collect();
        assert_eq!(got.len(), 4, "{got:?}");
        assert_eq!(got[0].0, "description");
        assert!(got[0].1.contains("U+0000 (NUL) at byte 3"), "{}", got[0].1);
        assert_eq!(got[1].0, "name");
        assert!(
            got[1].1.contains("U+000A (line feed) at byte 3"),
            "{}",
            got[1].1
        );
        assert_eq!(got[2].0, "url");
        assert!(got[2].1.contains("U+0001 at byte 26"), "{}", got[2].1);
        assert_eq!(got[3].0, "event_types[1]");
        assert!(got[3].1.contains("remove it"), "{}", got[3].1);
    }

    #[test]
    fn limits_and_times() {
        assert_eq!(limit(None, 50, 250).unwrap(), 50);
        assert_eq!(limit(Some("250"), 50, 250).unwrap(), 250);
        assert!(limit(Some("0"), 50, 250).is_err());
        assert!(limit(Some("x"), 50, 250).is_err());
        assert!(
            time("query.since", Some("2026-11-29T10:00:00Z"))
                .unwrap()
                .is_some()
        );
        assert!(time("query.since", Some("yesterday")).is_err());
    }
}
