//! Extractors that turn bad input into problem documents naming the field,
//! instead of axum's plain-text rejections.
//!
//! - [`JsonBody`]: `application/json`, at most [`MAX_BODY_BYTES`]; syntax
//!   errors are 400, values that do not fit the schema are 422 with the
//!   path of the field (`event_types[2]`). The raw bytes are kept for the
//!   idempotency hash.
//! - [`QueryParams`]: the query string; a repeated parameter is a 400.
//!
//! Both refuse, with a 422 naming the field, the character and its
//! position, any string holding NUL or another control character (line
//! breaks and tabs aside in bodies, where handlers decide per field), so
//! that such text never reaches Postgres, which refuses NUL in text.
//! - [`PathParams`]: path segments; undecodable ones are 404.
//! - [`IdempotencyKey`]: the optional `Idempotency-Key` header.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::header;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use walhook_pipeline::sanitize::Lines;

use crate::error::{ApiError, FieldError};
use crate::routes::validate::unsafe_text;

/// The largest request body accepted.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// The longest `Idempotency-Key` accepted.
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 255;

/// A JSON body, parsed, with its bytes. An empty body parses as `{}`, so
/// operations whose every field is optional accept no body at all.
#[derive(Debug, Clone)]
pub struct JsonBody<T> {
    /// The parsed value.
    pub value: T,
    /// The bytes as received.
    pub raw: Bytes,
}

fn is_json(content_type: &str) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// Parses `bytes` as `T`, naming the field at fault.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let text: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        bytes
    };
    // First every string, wherever it is (member names too), so that no
    // later message echoes a control character.
    let tree: serde_json::Value = serde_json::from_slice(text).map_err(|e| json_error(".", &e))?;
    let mut errors = Vec::new();
    unsafe_strings(&tree, "", &mut errors);
    if !errors.is_empty() {
        return Err(ApiError::fields(errors));
    }
    let mut de = serde_json::Deserializer::from_slice(text);
    let value = serde_path_to_error::deserialize::<_, T>(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        json_error(&path, &inner)
    })?;
    de.end().map_err(|e| json_error(".", &e))?;
    Ok(value)
}

/// Collects the strings (keys too) of `value` that hold NUL or a control
/// character other than line breaks and tabs, by path.
fn unsafe_strings(value: &serde_json::Value, path: &str, out: &mut Vec<FieldError>) {
    use serde_json::Value;
    let field = |path: &str| {
        if path.is_empty() {
            "body".to_owned()
        } else {
            path.to_owned()
        }
    };
    match value {
        Value::String(text) => {
            if let Some(message) = unsafe_text(text, Lines::Keep) {
                out.push(FieldError {
                    field: field(path),
                    message,
                });
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                unsafe_strings(item, &format!("{path}[{i}]"), out);
            }
        }
        Value::Object(map) => {
            for (key, item) in map {
                let inner = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                if let Some(message) = unsafe_text(key, Lines::Escape) {
                    out.push(FieldError {
                        field: field(path),
                        message: format!("has a member name that {message}"),
                    });
                    continue;
                }
                unsafe_strings(item, &inner, out);
            }
        }
        _ => {}
    }
}

fn json_error(path: &str, e: &serde_json::Error) -> ApiError {
    use serde_json::error::Category;
    let message = e.to_string();
    // serde's messages end with " at line 1 column 7"; keep them, they help
    // with syntax errors, and name the field for data errors.
    let field = if let Some(rest) = message.strip_prefix("missing field `") {
        let name = rest.split('`').next().unwrap_or_default();
        if path == "." {
            name.to_owned()
        } else {
            format!("{path}.{name}")
        }
    } else if path == "." || path.is_empty() {
        "body".to_owned()
    } else {
        path.to_owned()
    };
    match e.classify() {
        Category::Syntax | Category::Eof | Category::Io => ApiError::BadRequest {
            detail: format!("the body is not valid JSON: {message}"),
            errors: vec![FieldError {
                field: "body".into(),
                message,
            }],
        },
        Category::Data => ApiError::fields(vec![FieldError { field, message }]),
    }
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let content_type = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let raw = Bytes::from_request(req, state).await.map_err(|e| {
            if crate::limits::is_body_timeout(&e) {
                ApiError::BodyTimeout(
                    "the body did not arrive within [api].body_read_timeout; nothing was done: \
                     send it again, whole"
                        .into(),
                )
            } else {
                ApiError::TooLarge(format!(
                    "the body is larger than {MAX_BODY_BYTES} bytes (or could not be read); send less"
                ))
            }
        })?;
        if raw.len() > MAX_BODY_BYTES {
            return Err(ApiError::TooLarge(format!(
                "the body has {} bytes; at most {MAX_BODY_BYTES} are accepted",
                raw.len()
            )));
        }
        let empty = raw.iter().all(u8::is_ascii_whitespace);
        match content_type.as_deref() {
            Some(ct) if is_json(ct) => {}
            None if empty => {}
            Some(ct) => {
                return Err(ApiError::UnsupportedMediaType(format!(
                    "content-type {ct:?} is not JSON; send application/json"
                )));
            }
            None => {
                return Err(ApiError::UnsupportedMediaType(
                    "the body has no content-type; send application/json".into(),
                ));
            }
        }
        let value = parse_json(&raw)?;
        Ok(JsonBody { value, raw })
    }
}

/// A query string, parsed.
#[derive(Debug, Clone)]
pub struct QueryParams<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for QueryParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let query = parts.uri.query().unwrap_or_default();
        // Decoded (`%00` is NUL), each name and value must be storable.
        if let Ok(pairs) = serde_urlencoded::from_str::<Vec<(String, String)>>(query) {
            let mut errors = Vec::new();
            for (name, value) in &pairs {
                if let Some(message) = unsafe_text(name, Lines::Escape) {
                    errors.push(FieldError {
                        field: "query".into(),
                        message: format!("has a parameter name that {message}"),
                    });
                } else if let Some(message) = unsafe_text(value, Lines::Escape) {
                    errors.push(FieldError {
                        field: format!("query.{name}"),
                        message,
                    });
                }
            }
            if !errors.is_empty() {
                return Err(ApiError::fields(errors));
            }
        }
        serde_urlencoded::from_str(query)
            .map(QueryParams)
            .map_err(|e| ApiError::BadRequest {
                detail: format!("the query string is malformed: {e}"),
                errors: vec![FieldError {
                    field: "query".into(),
                    message: format!("{e}; give each parameter once"),
                }],
            })
    }
}

/// Path segments, parsed.
#[derive(Debug, Clone)]
pub struct PathParams<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for PathParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| PathParams(p.0))
            .map_err(|e| ApiError::NotFound(format!("nothing is at this path ({e})")))
    }
}

/// The `Idempotency-Key` header, when sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey(pub Option<String>);

impl<S: Send + Sync> FromRequestParts<S> for IdempotencyKey {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let Some(value) = parts.headers.get("idempotency-key") else {
            return Ok(IdempotencyKey(None));
        };
        let bad = |message: String| ApiError::field("header.Idempotency-Key", message);
        let text = value
            .to_str()
            .map_err(|_| bad("must be visible ASCII characters".into()))?;
        if text.is_empty() || text.len() > MAX_IDEMPOTENCY_KEY_LEN {
            return Err(bad(format!(
                "must be 1 to {MAX_IDEMPOTENCY_KEY_LEN} characters (a UUID is a good choice); got {}",
                text.len()
            )));
        }
        if let Some(at) = text.bytes().position(|b| !b.is_ascii_graphic()) {
            let byte = text.as_bytes()[at];
            return Err(bad(format!(
                "has U+{byte:04X} ({}) at byte {at}; use visible ASCII characters without spaces (a UUID is a good choice)",
                if byte == b' ' {
                    "a space"
                } else {
                    "a control character"
                }
            )));
        }
        Ok(IdempotencyKey(Some(text.to_owned())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Body {
        url: String,
        #[serde(default)]
        event_types: Vec<String>,
    }

    fn field_of(e: ApiError) -> (u16, String) {
        let p = e.problem();
        (
            p.status,
            p.errors
                .first()
                .map(|f| f.field.clone())
                .unwrap_or_default(),
        )
    }

    #[test]
    fn errors_name_the_field() {
        assert_eq!(
            field_of(parse_json::<Body>(br#"{"event_types": []}"#).unwrap_err()),
            (422, "url".into())
        );
        assert_eq!(
            field_of(parse_json::<Body>(br#"{"url": "x", "event_types": ["a", 7]}"#).unwrap_err()),
            (422, "event_types[1]".into())
        );
        assert_eq!(
            field_of(parse_json::<Body>(br#"{"url": "x", "bogus": 1}"#).unwrap_err()),
            (422, "bogus".into())
        );
        assert_eq!(
            field_of(parse_json::<Body>(br#"{"url": "#).unwrap_err()),
            (400, "body".into())
        );
        assert_eq!(
            field_of(parse_json::<Body>(br#"{"url": "x"} trailing"#).unwrap_err()),
            (400, "body".into())
        );
        assert!(parse_json::<Body>(br#"{"url": "x"}"#).is_ok());
    }

    #[test]
    fn control_characters_in_any_string_are_refused_by_path() {
        let e = parse_json::<serde_json::Value>(
            br#"{"url": "https://x/\u0000", "event_types": ["a", "b\u001b"], "description": "two\nlines"}"#,
        )
        .unwrap_err()
        .problem();
        assert_eq!(e.status, 422);
        let mut fields: Vec<&str> = e.errors.iter().map(|f| f.field.as_str()).collect();
        fields.sort();
        assert_eq!(fields, vec!["event_types[1]", "url"], "{e:?}");
        let url = e.errors.iter().find(|f| f.field == "url").unwrap();
        assert!(url.message.contains("U+0000 (NUL) at byte 10"), "{e:?}");
        assert!(parse_json::<serde_json::Value>(br#"{"a": {"b\u0000": 1}}"#).is_err());
    }

    #[test]
    fn json_media_types() {
        assert!(is_json("application/json"));
        assert!(is_json("Application/JSON; charset=utf-8"));
        assert!(is_json("application/merge-patch+json"));
        assert!(!is_json("text/plain"));
    }
}
