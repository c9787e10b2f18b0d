//! Errors as RFC 9457 problem documents (`application/problem+json`).
//!
//! Every refusal names what was wrong and how to fix it; validation errors
//! list each field at fault (`url`, `event_types[2]`, query `limit`, header
//! `Idempotency-Key`). A refused request changes nothing. Another tenant's
//! object is a plain 404, the same as a missing one, so a caller learns
//! nothing about objects that are not theirs.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use walhook_sql::StoreError;

/// The media type of problem documents.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// One field at fault.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FieldError {
    /// Where: a body path (`url`, `event_types[1]`), `query.limit`,
    /// `header.Idempotency-Key` or `path.id`.
    pub field: String,
    /// What is wrong with it and how to fix it.
    pub message: String,
}

/// A problem document (RFC 9457).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Problem {
    /// A URI naming the class of problem, e.g. `urn:walhook:problem:validation`.
    #[serde(rename = "type")]
    pub kind: String,
    /// A short summary of the class.
    pub title: String,
    /// The HTTP status.
    pub status: u16,
    /// What happened here, for people.
    pub detail: String,
    /// The fields at fault (validation problems).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<FieldError>,
    /// The quota or rate used up (429 problems).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<QuotaExceeded>,
}

impl Problem {
    /// A problem without field errors or quota.
    pub fn new(slug: &str, title: &str, status: StatusCode, detail: impl Into<String>) -> Self {
        Problem {
            kind: format!("urn:walhook:problem:{slug}"),
            title: title.to_owned(),
            status: status.as_u16(),
            detail: detail.into(),
            errors: Vec::new(),
            quota: None,
        }
    }
}

/// A per-tenant quota or rate that a request would exceed (an RFC 9457
/// extension member of 429 problems).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct QuotaExceeded {
    /// The setting that sets the limit, e.g. `max_endpoints_per_tenant`
    /// (`[api].max_endpoints_per_tenant` in the config).
    pub limit_name: String,
    /// The limit.
    pub limit: u64,
    /// Where the tenant stands now.
    pub current: u64,
    /// For rates: seconds until a request can succeed (also sent as
    /// `Retry-After`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_seconds: Option<u64>,
}

/// Which request limit answered 503 (see [`crate::limits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overload {
    /// Every request slot stayed taken: nothing was done.
    Busy,
    /// The request ran past `[api].request_timeout` and was stopped.
    Timeout,
}

/// Why a request was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The request is malformed (JSON syntax, query string): 400.
    #[error("{detail}")]
    BadRequest {
        /// The summary.
        detail: String,
        /// The fields at fault.
        errors: Vec<FieldError>,
    },
    /// The request is well-formed but invalid: 422.
    #[error("{detail}")]
    Invalid {
        /// The summary.
        detail: String,
        /// The fields at fault.
        errors: Vec<FieldError>,
    },
    /// No valid bearer token: 401.
    #[error("{0}")]
    Unauthorized(String),
    /// The token is valid but not for this route: 403.
    #[error("{0}")]
    Forbidden(String),
    /// Nothing (of the caller's) is there: 404.
    #[error("{0}")]
    NotFound(String),
    /// The request conflicts with the current state: 409.
    #[error("{0}")]
    Conflict(String),
    /// The body is larger than allowed: 413.
    #[error("{0}")]
    TooLarge(String),
    /// The body is not JSON: 415.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// The body did not arrive within `[api].body_read_timeout`: 408.
    #[error("{0}")]
    BodyTimeout(String),
    /// A per-tenant quota or rate is used up: 429 (with `Retry-After` when
    /// waiting helps).
    #[error("{detail}")]
    QuotaExceeded {
        /// What was refused, the limit and what to do.
        detail: String,
        /// The limit, for programs.
        quota: QuotaExceeded,
    },
    /// The server is saturated or the request took too long: 503 with
    /// `Retry-After`.
    #[error("{detail}")]
    Overloaded {
        /// Which limit.
        kind: Overload,
        /// What happened and what to do.
        detail: String,
    },
    /// The platform database failed.
    #[error("the platform database failed")]
    Store(#[from] StoreError),
    /// Reading archived history failed (the store, or a part).
    #[error("reading archived history failed")]
    Archive(#[source] walhook_archive::ArchiveError),
}

impl From<walhook_archive::ArchiveError> for ApiError {
    /// A tenant over its archive reads at once is a 429 naming the limit
    /// ([`crate::cold::reads_busy`]); anything else a failed read.
    fn from(e: walhook_archive::ArchiveError) -> Self {
        match e {
            walhook_archive::ArchiveError::TenantReadsBusy {
                tenant,
                limit,
                current,
            } => crate::cold::reads_busy(&tenant, limit, current),
            e => ApiError::Archive(e),
        }
    }
}

impl ApiError {
    /// A 422 for one field.
    pub fn field(field: impl Into<String>, message: impl Into<String>) -> Self {
        let message = message.into();
        let field = field.into();
        ApiError::Invalid {
            detail: format!("{field}: {message}"),
            errors: vec![FieldError { field, message }],
        }
    }

    /// A 422 for several fields.
    pub fn fields(errors: Vec<FieldError>) -> Self {
        let detail = match errors.as_slice() {
            [one] => format!("{}: {}", one.field, one.message),
            many => format!("{} fields are invalid; see errors", many.len()),
        };
        ApiError::Invalid { detail, errors }
    }

    /// The status this error answers with.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest { .. } => StatusCode::BAD_REQUEST,
            ApiError::Invalid { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::QuotaExceeded { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Overloaded { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Store(e) if e.is_transient() => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::Archive(e) if e.is_transient() => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Archive(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The problem document.
    pub fn problem(&self) -> Problem {
        let (slug, title) = match self {
            ApiError::BadRequest { .. } => ("malformed", "Malformed request"),
            ApiError::Invalid { .. } => ("validation", "Invalid request"),
            ApiError::Unauthorized(_) => ("unauthorized", "Authentication required"),
            ApiError::Forbidden(_) => ("forbidden", "Not allowed with this token"),
            ApiError::NotFound(_) => ("not-found", "Not found"),
            ApiError::Conflict(_) => ("conflict", "Conflict"),
            ApiError::TooLarge(_) => ("too-large", "Request body too large"),
            ApiError::UnsupportedMediaType(_) => ("media-type", "Unsupported media type"),
            ApiError::BodyTimeout(_) => ("body-timeout", "Request body too slow"),
            ApiError::QuotaExceeded { .. } => ("quota", "Quota exceeded"),
            ApiError::Overloaded {
                kind: Overload::Timeout,
                ..
            } => ("timeout", "Request timed out"),
            ApiError::Overloaded {
                kind: Overload::Busy,
                ..
            } => ("busy", "Server busy"),
            ApiError::Store(e) if e.is_transient() => ("unavailable", "Temporarily unavailable"),
            ApiError::Store(_) => ("internal", "Internal error"),
            ApiError::Archive(e) if e.is_transient() => ("unavailable", "Temporarily unavailable"),
            ApiError::Archive(_) => ("internal", "Internal error"),
        };
        let errors = match self {
            ApiError::BadRequest { errors, .. } | ApiError::Invalid { errors, .. } => {
                errors.clone()
            }
            _ => Vec::new(),
        };
        let detail = match self {
            // Never show database details to callers; they are logged.
            ApiError::Store(e) if e.is_transient() => {
                "the platform database is unreachable; retry shortly".to_owned()
            }
            ApiError::Store(_) => "an internal error occurred; it was logged".to_owned(),
            ApiError::Archive(e) if e.is_transient() => {
                "archived history is temporarily unavailable; retry shortly".to_owned()
            }
            ApiError::Archive(_) => {
                "reading archived history failed; the error was logged".to_owned()
            }
            other => other.to_string(),
        };
        let quota = match self {
            ApiError::QuotaExceeded { quota, .. } => Some(quota.clone()),
            _ => None,
        };
        Problem {
            errors,
            quota,
            ..Problem::new(slug, title, self.status(), detail)
        }
    }

    /// Seconds to send as `Retry-After`, when waiting helps.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            ApiError::QuotaExceeded { quota, .. } => quota.retry_after_seconds,
            _ if self.status() == StatusCode::SERVICE_UNAVAILABLE => Some(1),
            _ => None,
        }
    }
}

/// A problem document as a response.
pub fn problem_response(status: StatusCode, problem: &Problem) -> Response {
    let body = serde_json::to_vec(problem).unwrap_or_default();
    let mut response = (status, body).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    response
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        if let ApiError::Store(e) = &self {
            tracing::error!(error = %e, source = ?std::error::Error::source(e), "request failed on the platform database");
        }
        if let ApiError::Archive(e) = &self {
            tracing::error!(error = %e, source = ?std::error::Error::source(e), "request failed on archived history");
        }
        let mut response = problem_response(status, &self.problem());
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"walhook\""),
            );
        }
        if status == StatusCode::REQUEST_TIMEOUT {
            // The rest of the body may still be on its way: the connection
            // cannot carry another request.
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        if let Some(secs) = self.retry_after() {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

/// The error responses every operation may give, for the OpenAPI document.
#[derive(Debug, utoipa::IntoResponses)]
pub enum ErrorResponses {
    /// Malformed request: JSON syntax, query string.
    #[response(status = 400, content_type = "application/problem+json")]
    BadRequest(Problem),
    /// No valid bearer token.
    #[response(status = 401, content_type = "application/problem+json")]
    Unauthorized(Problem),
    /// The token is valid but not for this route.
    #[response(status = 403, content_type = "application/problem+json")]
    Forbidden(Problem),
    /// Nothing of the caller's is there.
    #[response(status = 404, content_type = "application/problem+json")]
    NotFound(Problem),
    /// Conflicts with the current state, or an `Idempotency-Key` in use.
    #[response(status = 409, content_type = "application/problem+json")]
    Conflict(Problem),
    /// The body is too large.
    #[response(status = 413, content_type = "application/problem+json")]
    TooLarge(Problem),
    /// The body is not JSON.
    #[response(status = 415, content_type = "application/problem+json")]
    UnsupportedMediaType(Problem),
    /// Invalid values; `errors` names each field.
    #[response(status = 422, content_type = "application/problem+json")]
    Invalid(Problem),
    /// The platform database is unreachable, the server is busy or the
    /// request took longer than `[api].request_timeout`; retry after
    /// `Retry-After` seconds.
    #[response(status = 503, content_type = "application/problem+json")]
    Unavailable(Problem),
}

/// The quota refusal of operations limited per tenant, for the OpenAPI
/// document.
#[derive(Debug, utoipa::IntoResponses)]
pub enum QuotaResponses {
    /// A per-tenant quota or rate is used up; `quota` names the limit and
    /// the current value; `Retry-After` says when to retry a rate.
    #[response(status = 429, content_type = "application/problem+json")]
    QuotaExceeded(Problem),
}
