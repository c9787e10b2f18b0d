//! The web console in a real browser: headless Chromium driven through
//! chromedriver (`walhook_devkit::browser`) against `walhook run` with a
//! real Postgres and loopback receivers. Screenshots of each step go to
//! the workspace's `target/console-screenshots/`.
//!
//! Chromium and chromedriver come from `scripts/ensure-chromium.sh`; without
//! them the tests fail, unless `WALHOOK_SKIP_BROWSER=1` says to skip them.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures::FutureExt as _;
use serde_json::json;
use walhook_devkit::browser::{Driver, Session, tool};
use walhook_devkit::receiver::Behaviour;

use crate::support::World;
use crate::support::api::{Http, OPERATOR, onboard, start, wait_verified};

/// A description and an e-mail written by an attacker: text, never markup.
const HOSTILE: &str = "<script>alert('pwned')</script><b>bold</b>";

/// Where the screenshots go (the workspace's `target/`, found at run time
/// because CI shares one build between checkouts).
fn shots() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("target")
        .join("console-screenshots");
    std::fs::create_dir_all(&dir).expect("the screenshot directory");
    dir
}

/// A browser, or `None` (with a line saying so) when the machine has none
/// and `WALHOOK_SKIP_BROWSER=1` allows skipping.
async fn browser(profile: &Path) -> Option<(Driver, Session)> {
    let chromium = tool("WALHOOK_CHROMIUM", "/usr/bin/chromium");
    let chromedriver = tool("WALHOOK_CHROMEDRIVER", "/usr/bin/chromedriver");
    let (Some(chromium), Some(chromedriver)) = (chromium, chromedriver) else {
        if std::env::var("WALHOOK_SKIP_BROWSER").as_deref() == Ok("1") {
            println!(
                "SKIPPED the console's browser test (WALHOOK_SKIP_BROWSER=1): Chromium or chromedriver is not installed"
            );
            return None;
        }
        panic!(
            "Chromium or chromedriver is not installed: run scripts/ensure-chromium.sh \
             (or set WALHOOK_SKIP_BROWSER=1 to skip this test)"
        );
    };
    let driver = Driver::start(&chromedriver).await;
    let session = Session::new(&driver, &chromium, profile).await;
    Some((driver, session))
}

/// Runs `checks` with a browser, closing it whatever they find.
pub(crate) async fn with_browser(checks: impl AsyncFnOnce(&Session)) {
    let profile = tempfile::tempdir().unwrap();
    let Some((_driver, session)) = browser(profile.path()).await else {
        return;
    };
    let outcome = std::panic::AssertUnwindSafe(checks(&session))
        .catch_unwind()
        .await;
    session.close().await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// Signs in on the login page with `key`.
pub(crate) async fn sign_in(b: &Session, api: &Http, key: &str) {
    b.goto(&format!("{}/console/login", api.base)).await;
    let field = b.one("#key").await;
    b.type_into(&field, key).await;
    b.click_and_wait(&b.one("main form button").await).await;
}

/// Markup in hostile values shows as text: no element came of it.
async fn assert_inert(b: &Session) {
    assert!(
        b.find("main script").await.is_empty(),
        "a script element in the page"
    );
    assert!(
        b.find("main b").await.is_empty(),
        "a <b> element in the page"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_works_in_the_console_and_sees_only_its_own() {
    let (w, child, api) = start("").await;
    let key = onboard(&w, &api, "acme").await;
    let other_key = onboard(&w, &api, "globex").await;
    let dir = shots();
    let w = &w;
    let (api, key, other_key, dir) = (&api, &key, &other_key, &dir);
    with_browser(async move |b: &Session| {
        // Sign in; the endpoints page is empty.
        sign_in(b, api, key).await;
        assert!(b.current_url().await.ends_with("/console/endpoints"));
        assert!(b.text_of("main").await.contains("No endpoint yet"));
        b.save_screenshot(&dir.join("01-signed-in.png")).await;

        // Add an endpoint through the form; the secret shows once.
        let path = "console";
        b.type_into(&b.one("#url").await, &w.receiver.url(path))
            .await;
        b.type_into(&b.one("#event_types").await, "order.created, user.disabled")
            .await;
        b.type_into(&b.one("#description").await, HOSTILE).await;
        b.click_and_wait(&b.one("main form button").await).await;
        let secret = b.text_of("code.secret").await;
        assert!(secret.starts_with("whsec_"), "{}", b.text_of("main").await);
        w.receiver.set_secrets(path, vec![secret.clone()]);
        assert!(
            b.text_of("main table").await.contains(HOSTILE),
            "the description shows as text"
        );
        assert_inert(b).await;
        b.save_screenshot(&dir.join("02-endpoint-added.png")).await;
        let (_, list) = api.get(key, "/v1/webhook-endpoints").await;
        let endpoint = list["data"][0]["id"].as_str().unwrap().to_owned();
        wait_verified(api, key, &endpoint).await;

        // A failing delivery, its payload hostile.
        w.receiver.set_behaviour(path, Behaviour::Status(500));
        w.shop
            .execute(
                "INSERT INTO users (id, tenant_id, email) VALUES (1, 'acme', $1)",
                &[&format!("{HOSTILE}@example.com")],
            )
            .await
            .unwrap();
        w.shop
            .execute("UPDATE users SET disabled = true WHERE id = 1", &[])
            .await
            .unwrap();
        let failing = api
            .wait_for(
                key,
                "/v1/webhook-deliveries?event_type=user.disabled",
                "a failed attempt",
                |b| b["data"][0]["last_http_status"] == 500,
            )
            .await;
        let delivery = failing["data"][0]["id"].as_str().unwrap().to_owned();
        let list_url = format!("{}/console/deliveries?event_type=user.disabled", api.base);
        b.goto(&list_url).await;
        assert!(b.text_of("main table").await.contains(&delivery));
        b.save_screenshot(&dir.join("03-deliveries.png")).await;
        b.click_and_wait(&b.one(&format!("main table a[href$='{delivery}']")).await)
            .await;
        let page = b.text_of("main").await;
        assert!(page.contains("HTTP 500"), "{page}");
        assert!(
            b.text_of("details.sent[open] pre.body")
                .await
                .contains(&format!("{HOSTILE}@example.com")),
            "the body sent shows as text"
        );
        assert_inert(b).await;
        b.save_screenshot(&dir.join("04-failing-delivery.png"))
            .await;

        // The receiver is fixed; a replay from the page succeeds.
        w.receiver.set_behaviour(path, Behaviour::Status(200));
        b.click_and_wait(&b.one("form[action$='/replay'] button").await)
            .await;
        let page = b.text_of("main").await;
        assert!(page.contains("Replay queued"), "{page}");
        let delivery_url = format!("{}/console/deliveries/{delivery}", api.base);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            b.goto(&delivery_url).await;
            let manual_ok = {
                let mut found = false;
                for li in b.find("ol.timeline li").await {
                    let t = b.text(&li).await;
                    found |= t.contains("manual") && t.contains("succeeded");
                }
                found
            };
            if manual_ok {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "no successful manual attempt shows: {}",
                b.text_of("main").await
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        b.save_screenshot(&dir.join("05-replayed.png")).await;
        // One press, one replay request, one manual attempt.
        let requests: i64 = w
            .platform_sql
            .query_one("SELECT count(*) FROM walhook.replay_requests", &[])
            .await
            .unwrap()
            .get(0);
        let manual: i64 = w
            .platform_sql
            .query_one(
                "SELECT count(*) FROM walhook.attempts WHERE trigger = 'manual'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(
            (requests, manual),
            (1, 1),
            "replay requests, manual attempts"
        );

        // Rotate the secret from the endpoint's page: a new one, shown once.
        b.goto(&format!("{}/console/endpoints/{endpoint}", api.base))
            .await;
        b.click_and_wait(&b.one("form[action$='/rotate'] button").await)
            .await;
        let rotated = b.text_of("code.secret").await;
        assert!(
            rotated.starts_with("whsec_") && rotated != secret,
            "{rotated}"
        );
        let (_, e) = api
            .get(key, &format!("/v1/webhook-endpoints/{endpoint}"))
            .await;
        assert_eq!(e["secret_version"], 2, "{e}");
        b.save_screenshot(&dir.join("06-secret-rotated.png")).await;
        // Shown once: the endpoint's page does not show it again.
        b.goto(&format!("{}/console/endpoints/{endpoint}", api.base))
            .await;
        assert!(!b.text_of("main").await.contains(&rotated));
        // Its attempts of the last 24 hours: the failures and the manual
        // success, as a rate and hour bars; and its circuit.
        let rate = b.text_of("#success-rate").await;
        assert!(rate.contains('%') && rate.contains(" of "), "{rate}");
        assert!(
            !rate.starts_with("100.0"),
            "a failed attempt was made: {rate}"
        );
        let circuit = b.text_of("#circuit").await;
        assert!(
            ["closed", "open", "half_open"]
                .iter()
                .any(|c| circuit.starts_with(c)),
            "{circuit}"
        );
        assert!(!b.find("svg.chart rect").await.is_empty(), "the hour bars");
        b.save_screenshot(&dir.join("06b-endpoint-stats.png")).await;

        // The operator's pages are not the tenant's.
        b.goto(&format!("{}/console/pipeline", api.base)).await;
        assert!(b.text_of("main h1").await.contains("Not found"));

        // Another tenant's session cannot open acme's endpoint or delivery.
        b.click_and_wait(&b.one("header form button").await).await;
        assert!(b.current_url().await.ends_with("/console/login"));
        sign_in(b, api, other_key).await;
        for page in [
            format!("endpoints/{endpoint}"),
            format!("deliveries/{delivery}"),
        ] {
            b.goto(&format!("{}/console/{page}", api.base)).await;
            assert_eq!(b.text_of("main h1").await, "Not found", "{page}");
        }
        b.goto(&format!("{}/console/deliveries", api.base)).await;
        assert!(!b.text_of("main").await.contains(&delivery));
        b.save_screenshot(&dir.join("07-other-tenant-404.png"))
            .await;
    })
    .await;
    drop(child);
}

/// A form posted without the session's CSRF token (or with another one)
/// changes nothing, and so does a sign-in without its own token.
#[tokio::test]
async fn a_form_without_its_csrf_token_is_refused() {
    let (w, child, api) = start("").await;
    let key = onboard(&w, &api, "acme").await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let base = &api.base;
    // The sign-in form's token and its cookie.
    let login = http
        .get(format!("{base}/console/login"))
        .send()
        .await
        .unwrap();
    let login_set_cookie = login.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(
        login_set_cookie.starts_with("__Host-walhook_console_login=")
            && login_set_cookie.contains("Secure")
            && login_set_cookie.contains("Path=/;")
            && !login_set_cookie.to_lowercase().contains("domain"),
        "{login_set_cookie}"
    );
    let login_cookie = login_set_cookie.split(';').next().unwrap().to_owned();
    let html = login.text().await.unwrap();
    let token = html
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .unwrap()
        .to_owned();
    // Without the token, or without the cookie: refused.
    for (cookie, form) in [
        (login_cookie.as_str(), vec![("key", key.as_str())]),
        ("", vec![("key", key.as_str()), ("csrf", token.as_str())]),
    ] {
        let r = http
            .post(format!("{base}/console/login"))
            .header("cookie", cookie)
            .form(&form)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 403);
        assert!(r.headers().get("set-cookie").is_none());
    }
    let r = http
        .post(format!("{base}/console/login"))
        .header("cookie", &login_cookie)
        .form(&[("key", key.as_str()), ("csrf", token.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303, "{:?}", r.text().await);
    let session = r
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .find(|c| c.starts_with("__Host-walhook_console="))
        .unwrap();
    // `__Host-`: browsers take it only with Secure, Path=/ and no Domain.
    for attribute in ["HttpOnly", "Secure", "SameSite=Strict", "Path=/;"] {
        assert!(session.contains(attribute), "{session}");
    }
    assert!(!session.to_lowercase().contains("domain"), "{session}");
    let session = session.split(';').next().unwrap().to_owned();
    // Signed in: a page shows, with the console's headers.
    let page = http
        .get(format!("{base}/console/endpoints"))
        .header("cookie", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    let csp = page.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        csp.contains("default-src 'none'") && !csp.contains("script-src"),
        "{csp}"
    );
    // Adding an endpoint without the token, or with the sign-in's token:
    // refused, and nothing was added.
    for form in [
        vec![
            ("url", "https://example.com/hook"),
            ("event_types", "order.created"),
        ],
        vec![
            ("url", "https://example.com/hook"),
            ("event_types", "order.created"),
            ("csrf", token.as_str()),
        ],
    ] {
        let r = http
            .post(format!("{base}/console/endpoints"))
            .header("cookie", &session)
            .form(&form)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 403);
        assert!(r.text().await.unwrap().contains("CSRF"));
    }
    let (_, list) = api.get(&key, "/v1/webhook-endpoints").await;
    assert_eq!(list["data"].as_array().unwrap().len(), 0, "{list}");
    // Without a session: the sign-in page.
    let r = http
        .get(format!("{base}/console/endpoints"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    assert_eq!(r.headers()["location"], "/console/login");
    drop(child);
}

/// The operator signs in with the operator token and watches the pipeline
/// page count attempts while load runs; the page refreshes by itself.
/// The pipeline page's count of attempts in the last hour, read from the
/// page source in one call (the page reloads itself meanwhile).
async fn attempts_shown(b: &Session) -> Option<i64> {
    let source = b.get("/source").await;
    source
        .as_str()?
        .split("id=\"attempts-hour\">")
        .nth(1)?
        .split('<')
        .next()?
        .trim()
        .parse()
        .ok()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_operator_watches_the_pipeline_while_load_runs() {
    let (w, child, api) = start("").await;
    let key = onboard(&w, &api, "acme").await;
    let (status, created) = api
        .post(
            &key,
            "/v1/webhook-endpoints",
            json!({"url": w.receiver.url("load"), "event_types": ["order.created"]}),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    w.receiver
        .set_secrets("load", vec![created["secret"].as_str().unwrap().to_owned()]);
    wait_verified(&api, &key, created["endpoint"]["id"].as_str().unwrap()).await;
    let dir = shots();
    let (w, api, dir, key): (&World, &Http, &PathBuf, &str) = (&w, &api, &dir, &key);
    with_browser(async move |b: &Session| {
        sign_in(b, api, OPERATOR).await;
        assert!(b.current_url().await.ends_with("/console/pipeline"));
        let before = attempts_shown(b)
            .await
            .expect("the attempts of the last hour");
        b.save_screenshot(&dir.join("08-pipeline-before.png")).await;
        // Load: 100 orders over about two seconds.
        for id in 1..=100i64 {
            w.shop
                .execute("INSERT INTO orders VALUES ($1, 'acme', 1)", &[&id])
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // No navigation: the page's Refresh brings the new figures.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let now = attempts_shown(b).await.unwrap_or(before);
            if now >= before + 100 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the pipeline page still shows {now} attempts (before: {before})"
            );
        }
        assert!(
            b.find("svg.chart rect").await.len() >= 2,
            "the charts have bars"
        );
        // The 100 first attempts' latency from commit is shown.
        let p99 = b.text_of("#first-p99").await;
        assert!(p99.starts_with('≤') && p99.ends_with('s'), "{p99}");
        b.save_screenshot(&dir.join("09-pipeline-after-load.png"))
            .await;
        let page = b.text_of("main").await;
        for section in [
            "Quarantined endpoints",
            "Capture incidents",
            "Archive",
            "Open incidents",
        ] {
            assert!(page.contains(section), "{section}: {page}");
        }
        b.goto(&format!("{}/console/tenants", api.base)).await;
        assert!(b.text_of("main table").await.contains("acme"));
        // The tenant's page lists its keys by prefix, never the key.
        b.click_and_wait(&b.one("main table a[href$='/acme']").await)
            .await;
        let keys = b.text_of("main table").await;
        assert!(keys.contains(&key[..12]) && !keys.contains(key), "{keys}");
        // The operator issues a key from the page (shown once, and it
        // works), then revokes it from the page (it stops working).
        b.type_into(&b.one("#key-name").await, "billing job").await;
        b.click_and_wait(&b.one("form[action$='/keys'] button").await)
            .await;
        let issued = b.text_of("code.secret").await;
        assert!(issued.starts_with("whk_"), "{issued}");
        let (s, _) = api.get(&issued, "/v1/webhook-endpoints").await;
        assert_eq!(s, 200, "the issued key works");
        let listed = b.text_of("main table").await;
        assert!(
            listed.contains("billing job") && !listed.contains(&issued),
            "{listed}"
        );
        b.save_screenshot(&dir.join("09b-key-issued.png")).await;
        b.goto(&format!("{}/console/tenants/acme", api.base)).await;
        assert!(!b.text_of("main").await.contains(&issued), "shown once");
        let (_, keys) = api.get(OPERATOR, "/v1/tenants/acme/api-keys").await;
        let id = keys["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|k| k["name"] == "billing job")
            .expect("the issued key is listed")["id"]
            .as_str()
            .unwrap()
            .to_owned();
        b.click_and_wait(&b.one(&format!("form[action$='/{id}/revoke'] button")).await)
            .await;
        assert!(b.text_of("main").await.contains("revoked"));
        let (s, _) = api.get(&issued, "/v1/webhook-endpoints").await;
        assert_eq!(s, 401, "a revoked key stops working");

        // A reconciliation of the load's window, and its report from the
        // console (the report's own page, styled inline).
        let since = (chrono::Utc::now() - chrono::Duration::minutes(10)).to_rfc3339();
        let until = chrono::Utc::now().to_rfc3339();
        let out = crate::support::run(
            crate::support::walhook()
                .args(["reconcile", "--config"])
                .arg(w.config(""))
                .args(["--since", &since, "--until", &until]),
        );
        assert!(out.status.success(), "{}", crate::support::stderr(&out));
        b.goto(&format!("{}/console/reconciliations", api.base))
            .await;
        b.click_and_wait(&b.one("main table a").await).await;
        assert!(b.current_url().await.ends_with("/report.html"));
        assert!(
            !b.find("svg#funnel").await.is_empty(),
            "the report's funnel chart"
        );
        b.save_screenshot(&dir.join("10-reconciliation-report.png"))
            .await;
    })
    .await;
    drop(child);
}
