//! Console sessions and sign-in, and failed authentications, against
//! callers who try too often: sessions are capped per credential (a tenant
//! ends only its own), sign-ins and failed authentications are limited per
//! client address and per credential with `Retry-After`, a reverse proxy's
//! `X-Forwarded-For` counts only from `[api].trusted_proxies`, cookies are
//! `__Host-` and HSTS follows `[api].public_url`. Clients use distinct
//! loopback addresses (127.0.0.x) to be distinct clients.

// Test code spawns freely.
#![allow(clippy::disallowed_methods)]

use std::net::IpAddr;

use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use walhook_api::ApiLimits;
use walhook_api::metrics::Refusal;

use crate::support::{Api, OPERATOR};

/// A browser-like client at loopback address `from`: it holds the sign-in
/// form's token and cookie.
struct Browser {
    http: reqwest::Client,
    base: String,
    csrf: String,
    login_cookie: String,
}

impl Browser {
    async fn open(base: &str, from: &str) -> Browser {
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .local_address(from.parse::<IpAddr>().unwrap())
            .build()
            .unwrap();
        let form = http
            .get(format!("{base}/console/login"))
            .send()
            .await
            .unwrap();
        let login_cookie = form.headers()["set-cookie"]
            .to_str()
            .unwrap()
            .split(';')
            .next()
            .unwrap()
            .to_owned();
        let html = form.text().await.unwrap();
        let csrf = html
            .split("name=\"csrf\" value=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .unwrap()
            .to_owned();
        Browser {
            http,
            base: base.to_owned(),
            csrf,
            login_cookie,
        }
    }

    /// Signs in with `key`: the status, the headers and the session cookie
    /// (`name=value`) when one was set.
    async fn sign_in(&self, key: &str) -> (StatusCode, HeaderMap, Option<String>) {
        let r = self
            .http
            .post(format!("{}/console/login", self.base))
            .header("cookie", &self.login_cookie)
            .form(&[("key", key), ("csrf", self.csrf.as_str())])
            .send()
            .await
            .unwrap();
        let session = r
            .headers()
            .get_all("set-cookie")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find(|c| c.starts_with("__Host-walhook_console=") && !c.contains("Max-Age=0"))
            .map(|c| c.split(';').next().unwrap().to_owned());
        (r.status(), r.headers().clone(), session)
    }

    /// GETs a console page with `session`; its status.
    async fn page(&self, session: &str, path: &str) -> StatusCode {
        self.http
            .get(format!("{}{path}", self.base))
            .header("cookie", session)
            .send()
            .await
            .unwrap()
            .status()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_signing_in_10500_times_does_not_sign_the_operator_out() {
    // The sign-in rate is raised so that the session cap itself is what
    // this exercises.
    let api = Api::start_with(ApiLimits {
        sign_in_attempts_per_minute: 1_000_000,
        ..ApiLimits::default()
    })
    .await;
    let key = api.tenant("acme").await;
    let operator = Browser::open(&api.base, "127.0.0.1").await;
    let (status, _, op_session) = operator.sign_in(OPERATOR).await;
    assert_eq!(status, 303);
    let op_session = op_session.unwrap();
    let (_, _, first_tenant_session) = operator.sign_in(&key).await;
    let first_tenant_session = first_tenant_session.unwrap();

    let started = std::time::Instant::now();
    let workers: Vec<_> = (0..8)
        .map(|w| {
            let (base, key) = (api.base.clone(), key.clone());
            tokio::spawn(async move {
                let b = Browser::open(&base, &format!("127.0.0.{}", 20 + w)).await;
                for _ in 0..10_500 / 8 + usize::from(w < 10_500 % 8) {
                    let (status, _, session) = b.sign_in(&key).await;
                    assert_eq!(status, 303);
                    assert!(session.is_some());
                }
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
    println!(
        "10,500 console sign-ins by one tenant in {:?}: {} sessions held, {} by the tenant",
        started.elapsed(),
        api.state.console_sessions(),
        api.state.console_sessions_held_by(&key)
    );
    // The operator's session, made before them, still works.
    assert_eq!(operator.page(&op_session, "/console/pipeline").await, 200);
    // The tenant ended only its own oldest sessions.
    assert_eq!(api.state.console_sessions_held_by(&key), 20);
    assert_eq!(api.state.console_sessions_held_by(OPERATOR), 1);
    assert_eq!(
        operator
            .page(&first_tenant_session, "/console/endpoints")
            .await,
        303
    );
}

#[tokio::test]
async fn sign_ins_are_limited_per_address_and_per_key_with_retry_after() {
    let api = Api::start().await;
    let key = api.tenant("acme").await;
    let wrong = format!("whk_{}", "w".repeat(43));
    let one = Browser::open(&api.base, "127.0.0.1").await;
    // The defaults: 10 attempts a minute per address and per key.
    for _ in 0..10 {
        let (status, h, session) = one.sign_in(&wrong).await;
        assert_eq!(status, 401);
        assert!(session.is_none());
        // Served over http, no HSTS (no [api].public_url).
        assert!(h.get("strict-transport-security").is_none());
    }
    let refused = one
        .http
        .post(format!("{}/console/login", api.base))
        .header("cookie", &one.login_cookie)
        .form(&[("key", key.as_str()), ("csrf", one.csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 429);
    let retry: u64 = refused.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
    let page = refused.text().await.unwrap();
    assert!(
        page.contains("Too many sign-in attempts") && page.contains("from this client address"),
        "{page}"
    );
    // The right key from that address is refused too: it was not checked.
    assert_eq!(one.sign_in(&key).await.0, 429);
    // Another address with the key that was tried 10 times: refused by key.
    let two = Browser::open(&api.base, "127.0.0.2").await;
    let (status, h, _) = two.sign_in(&wrong).await;
    assert_eq!(status, 429);
    assert!(h.contains_key("retry-after"));
    // Another address with another key: signed in.
    let (status, _, session) = two.sign_in(&key).await;
    assert_eq!(status, 303);
    assert_eq!(two.page(&session.unwrap(), "/console/endpoints").await, 200);
    assert_eq!(api.state.metrics.refusals(Refusal::SignInRate), 3);
}

#[tokio::test]
async fn failed_authentications_are_limited_with_retry_after() {
    let api = Api::start().await;
    let key = api.tenant("acme").await;
    let from = |ip: &str| {
        reqwest::Client::builder()
            .local_address(ip.parse::<IpAddr>().unwrap())
            .build()
            .unwrap()
    };
    let call = |http: reqwest::Client, token: String| {
        let url = format!("{}/v1/webhook-endpoints", api.base);
        async move { Api::answer(http.get(url).bearer_auth(token).send().await.unwrap()).await }
    };
    let guesser = from("127.0.0.3");
    // The default: 120 failures a minute per address; each a new guess.
    for i in 0..120 {
        let answer = call(guesser.clone(), format!("whk_{:0>43}", i)).await;
        answer.problem(401);
    }
    let refused = call(guesser.clone(), "whk_another".into()).await;
    refused.problem(429);
    assert_eq!(
        refused.body["quota"]["limit_name"],
        "failed_authentications_per_minute"
    );
    let retry: u64 = refused.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
    // The address is held back whatever it sends, a valid key included.
    call(guesser.clone(), key.clone()).await.problem(429);
    // Others are not.
    assert_eq!(call(from("127.0.0.4"), key.clone()).await.status, 200);
    // One wrong token from many addresses is limited by the token.
    let stale = "whk_revoked_or_never_issued".to_owned();
    for i in 0..120 {
        call(from(&format!("127.0.1.{}", i + 1)), stale.clone())
            .await
            .problem(401);
    }
    call(from("127.0.2.1"), stale).await.problem(429);
    assert_eq!(api.state.metrics.refusals(Refusal::AuthenticationRate), 3);
    // The limits' tables hold what they saw, no more.
    let (addresses, tokens) = api.state.failed_auths_tracked();
    assert!(addresses <= 122 && tokens <= 122, "{addresses} {tokens}");
}

#[tokio::test]
async fn a_trusted_proxy_names_the_client_and_an_untrusted_one_does_not() {
    let api = Api::start_configured(ApiLimits::default(), |s| {
        s.trusted_proxies = walhook_api::client::TrustedProxies::parse(&["127.0.0.1"]).unwrap();
    })
    .await;
    let key = api.tenant("acme").await;
    let call = |from: &str, forwarded: &str, token: &str| {
        let http = reqwest::Client::builder()
            .local_address(from.parse::<IpAddr>().unwrap())
            .build()
            .unwrap();
        let request = http
            .get(format!("{}/v1/webhook-endpoints", api.base))
            .header("x-forwarded-for", forwarded)
            .bearer_auth(token);
        async move { Api::answer(request.send().await.unwrap()).await.status }
    };
    // Through the proxy, 120 failures from 198.51.100.7 use up its budget.
    for i in 0..120 {
        assert_eq!(
            call("127.0.0.1", "198.51.100.7", &format!("whk_{i:0>43}")).await,
            401
        );
    }
    assert_eq!(call("127.0.0.1", "198.51.100.7", &key).await, 429);
    // Another client behind the same proxy is not held back; nor is one
    // that claims to be 198.51.100.7 from an untrusted peer (the header is
    // ignored there, and 127.0.0.6 has its own budget).
    assert_eq!(call("127.0.0.1", "198.51.100.8", &key).await, 200);
    assert_eq!(
        call("127.0.0.1", "198.51.100.7, 198.51.100.9", &key).await,
        200,
        "only the hop the proxy added counts"
    );
    assert_eq!(call("127.0.0.6", "198.51.100.7", &key).await, 200);
}

#[tokio::test]
async fn cookies_are_host_prefixed_and_hsts_follows_the_public_url() {
    let api = Api::start_configured(ApiLimits::default(), |s| {
        s.public_url =
            Some(walhook_api::settings::parse_public_url("https://hooks.example.com").unwrap());
    })
    .await;
    let key = api.tenant("acme").await;
    let b = Browser::open(&api.base, "127.0.0.1").await;
    assert!(b.login_cookie.starts_with("__Host-walhook_console_login="));
    let r = b
        .http
        .post(format!("{}/console/login", api.base))
        .header("cookie", &b.login_cookie)
        .form(&[("key", key.as_str()), ("csrf", b.csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    assert_eq!(r.headers()["strict-transport-security"], "max-age=31536000");
    let cookies: Vec<&str> = r
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    assert_eq!(cookies.len(), 2, "{cookies:?}");
    for c in &cookies {
        assert!(
            c.starts_with("__Host-")
                && c.contains("; Path=/;")
                && c.contains("; Secure")
                && c.contains("HttpOnly")
                && !c.to_lowercase().contains("domain="),
            "{c}"
        );
    }
    // The API's answers carry it too.
    let answer = api.get(&key, "/v1/webhook-endpoints").await;
    assert_eq!(
        answer.headers["strict-transport-security"],
        "max-age=31536000"
    );
}
