//! Signing in and out of the console: the sign-in form with its own CSRF
//! token (double-submitted in a cookie), the attempt limits checked before
//! a key is looked at, the session table's caps, and the pages that say
//! why a sign-in was refused.

use std::time::Instant;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use maud::html;

use super::sessions::{Full, MAX_SESSIONS_PER_CREDENTIAL};
use super::{
    COOKIE, Form, LOGIN_COOKIE, SESSION_TTL, Session, Who, cookie, forbidden_form, page,
    random_token, same, set_cookie,
};
use crate::ApiState;
use crate::client::Client;
use crate::metrics::Refusal;
use crate::ratelimit::{CredentialKey, Refused};

/// The page of a form whose body did not arrive in time.
pub(crate) fn too_slow_form() -> Response {
    let body = html! {
        h1 { "The form took too long to arrive" }
        p { "Nothing was changed. Reload the page and send the form again." }
    };
    (
        StatusCode::REQUEST_TIMEOUT,
        [(header::CONNECTION, HeaderValue::from_static("close"))],
        page("Too slow", None, None, body),
    )
        .into_response()
}

/// The page of a sign-in form larger than `max` bytes.
pub(crate) fn too_large_form(max: usize) -> Response {
    let body = html! {
        h1 { "The form is too large" }
        p { "A sign-in form holds at most " (max) " bytes; nothing was checked. Reload the page and sign in again." }
    };
    (
        StatusCode::PAYLOAD_TOO_LARGE,
        [(header::CONNECTION, HeaderValue::from_static("close"))],
        page("Too large", None, None, body),
    )
        .into_response()
}

fn login_page(token: &str, error: Option<&str>) -> Response {
    let body = html! {
        h1 { "Sign in" }
        p { "Tenants sign in with an API key (" code { "whk_…" } "); the operator with the operator token of " code { "[api]" } "." }
        @if let Some(e) = error { p class="error" role="alert" { (e) } }
        form method="post" action="/console/login" {
            input type="hidden" name="csrf" value=(token);
            label for="key" { "API key or operator token" }
            input id="key" name="key" type="password" autocomplete="off" required autofocus;
            button type="submit" { "Sign in" }
        }
    };
    let status = if error.is_some() {
        StatusCode::UNAUTHORIZED
    } else {
        StatusCode::OK
    };
    (
        status,
        [(header::SET_COOKIE, set_cookie(LOGIN_COOKIE, token, 3600))],
        page("Sign in", None, None, body),
    )
        .into_response()
}

pub(super) async fn login_form() -> Response {
    login_page(&random_token(), None)
}

pub(super) async fn login(
    State(state): State<ApiState>,
    Client(client): Client,
    headers: HeaderMap,
    form: Form,
) -> Response {
    // Double submit: the form's token must match the cookie set with it.
    let fresh = random_token();
    match (form.get("csrf"), cookie(&headers, LOGIN_COOKIE)) {
        (Some(a), Some(b)) if same(a, b) => {}
        _ => return forbidden_form(None),
    }
    let key = form.get("key").unwrap_or_default().trim().to_owned();
    if key.is_empty() {
        return login_page(&fresh, Some("Give an API key or the operator token."));
    }
    // Every attempt counts, by address and by the key tried, before the
    // key is looked at.
    let owner = CredentialKey::of(&key);
    if let Err(refused) = state
        .guards
        .console
        .sign_ins
        .take(client, owner, Instant::now())
    {
        if state.metrics.refused(Refusal::SignInRate) {
            tracing::warn!(
                client = %client.map(|c| c.to_string()).unwrap_or_default(),
                by = refused.whom(),
                "console sign-in refused: too many attempts"
            );
        }
        return too_many_sign_ins(&refused, state.guards.console.sign_ins.per_minute());
    }
    let who = match crate::auth::principal_of(&key, &state).await {
        Ok(crate::auth::Principal::Operator) => Who::Operator,
        Ok(crate::auth::Principal::Tenant { tenant, .. }) => Who::Tenant(tenant.to_string()),
        Err(crate::ApiError::Unauthorized(_)) => {
            return login_page(
                &fresh,
                Some(
                    "That key was not accepted: it is unknown or revoked, or its tenant is disabled.",
                ),
            );
        }
        Err(e) => return e.into_response(),
    };
    let id = random_token();
    let now = Instant::now();
    let session = Session {
        credential: key,
        owner,
        who,
        csrf: random_token(),
        expires: now + SESSION_TTL,
    };
    let added = state
        .guards
        .console
        .sessions
        .lock()
        .insert(id.clone(), session, now);
    match added {
        Ok(0) => {}
        Ok(ended) => tracing::info!(
            ended,
            "console sign-in: the credential's oldest sessions ended (at most {MAX_SESSIONS_PER_CREDENTIAL} per credential)"
        ),
        Err(full) => {
            if state.metrics.refused(Refusal::SessionsFull) {
                tracing::warn!(
                    max = full.max,
                    "console sign-in refused: every console session is in use"
                );
            }
            return sessions_full(full);
        }
    }
    let mut response = Redirect::to("/console").into_response();
    let h = response.headers_mut();
    h.append(
        header::SET_COOKIE,
        set_cookie(COOKIE, &id, SESSION_TTL.as_secs()),
    );
    h.append(header::SET_COOKIE, set_cookie(LOGIN_COOKIE, "", 0));
    response
}

/// The 429 page of a sign-in over `[api].sign_in_attempts_per_minute`.
fn too_many_sign_ins(refused: &Refused, per_minute: u32) -> Response {
    let secs = refused.retry_after_secs();
    let body = html! {
        h1 { "Too many sign-in attempts" }
        p role="alert" {
            "There were more than " (per_minute) " sign-in attempts in a minute " (refused.whom())
            ", so this one was not checked. Try again in " (secs) " seconds."
        }
        p { a href="/console/login" { "Back to sign-in" } }
    };
    (
        StatusCode::TOO_MANY_REQUESTS,
        [(header::RETRY_AFTER, HeaderValue::from(secs))],
        page("Too many attempts", None, None, body),
    )
        .into_response()
}

/// The page of a sign-in refused because the session table is full.
fn sessions_full(full: Full) -> Response {
    let body = html! {
        h1 { "The console is full" }
        p role="alert" {
            "All " (full.max) " console sessions are in use, so no new one was opened and nobody \
             was signed out. Try again later; the operator can see this in the log."
        }
    };
    (
        StatusCode::TOO_MANY_REQUESTS,
        [(header::RETRY_AFTER, HeaderValue::from_static("60"))],
        page("Console full", None, None, body),
    )
        .into_response()
}

pub(super) async fn logout(
    State(state): State<ApiState>,
    s: Session,
    headers: HeaderMap,
    form: Form,
) -> Response {
    if let Some(r) = form.refused(&s) {
        return r;
    }
    if let Some(id) = cookie(&headers, COOKIE) {
        state.guards.console.sessions.lock().remove(id);
    }
    let mut response = Redirect::to("/console/login").into_response();
    response
        .headers_mut()
        .append(header::SET_COOKIE, set_cookie(COOKIE, "", 0));
    response
}
