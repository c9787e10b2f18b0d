//! Every page, link and button of the console, in a real browser, as a
//! tenant and as the operator: headless Chromium (`walhook_devkit::browser`)
//! against `walhook run` with a real Postgres and loopback receivers.
//!
//! The crawler starts from each list page (once with a small page size, so
//! that every list has a next and a previous page), follows every link of
//! every page it reaches (each kind of page a few times, not every
//! delivery), and presses every button once. A page fails the test when
//! the browser's own record of it (the Navigation and Resource Timing
//! entries) shows a status of 400 or more for the page or anything it
//! loaded, or when it is one of the console's error pages. Screenshots of
//! the pages the docs show go to `docs/images/`.
//!
//! The delivery page's *Copy as curl* is run for real: the receiver gets
//! the same bytes, the same `webhook-id`, timestamp and signature as the
//! attempt it was copied from, and verifies the signature.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use walhook_devkit::browser::Session;
use walhook_devkit::receiver::Behaviour;

use crate::console::{sign_in, with_browser};
use crate::support::api::{OPERATOR, endpoint, onboard, start};

/// `docs/images/`, where the docs' screenshots live.
fn images() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("docs")
        .join("images")
}

/// The titles of the console's error pages.
const ERROR_TITLES: &[&str] = &[
    "Not found",
    "The request failed",
    "The form was refused",
    "Error",
];

/// Pages of one kind visited at most (ids, cursors and page numbers make
/// a kind: `/console/deliveries/*`, `/console/deliveries?cursor`).
const PER_KIND: usize = 2;

/// Pages visited at most per crawl.
const MAX_PAGES: usize = 120;

/// A page's kind: its path with ids as `*`, and its query's names.
fn kind(url: &str) -> String {
    let (path, query) = url.split_once('?').unwrap_or((url, ""));
    let path: Vec<&str> = path
        .split('/')
        .map(|seg| {
            if seg.contains('_') || seg.chars().all(|c| c.is_ascii_digit()) && !seg.is_empty() {
                "*"
            } else {
                seg
            }
        })
        .collect();
    let names: BTreeSet<&str> = query
        .split('&')
        .filter_map(|p| p.split('=').next())
        .filter(|n| !n.is_empty())
        .collect();
    format!(
        "{}?{}",
        path.join("/"),
        names.into_iter().collect::<Vec<_>>().join("&")
    )
}

/// The browser's statuses for the page and everything it loaded, from
/// the Navigation and Resource Timing entries.
async fn statuses(b: &Session) -> Value {
    b.post(
        "/execute/sync",
        json!({
            "script": "const nav = performance.getEntriesByType('navigation')[0]; \
                       return { page: nav ? nav.responseStatus : 0, \
                                resources: performance.getEntriesByType('resource') \
                                    .map(r => [r.name, r.responseStatus]) };",
            "args": [],
        }),
    )
    .await
}

/// Fails unless the page the browser shows loaded, and everything in it,
/// and is not an error page. `what` says how it was reached.
async fn assert_page_works(b: &Session, what: &str) {
    let url = b.current_url().await;
    let s = statuses(b).await;
    let page = s["page"].as_u64().unwrap_or(0);
    assert!(
        (200..400).contains(&page),
        "{what}: {url} answered {page}: {}",
        b.text_of("main").await
    );
    for r in s["resources"].as_array().into_iter().flatten() {
        let status = r[1].as_u64().unwrap_or(0);
        assert!(
            (200..400).contains(&status),
            "{what}: {url} loaded {} with {status}",
            r[0]
        );
    }
    if url.contains("/console/") && !url.ends_with("/report.html") {
        assert!(
            !b.find("link[rel=stylesheet]").await.is_empty(),
            "{what}: {url} is not a console page"
        );
    }
    let h1 = b.text_of("h1").await;
    assert!(
        !ERROR_TITLES.iter().any(|t| h1 == *t),
        "{what}: {url} is an error page: {}",
        b.text_of("main").await
    );
    assert!(
        b.find("main .error, main [role=alert]").await.is_empty(),
        "{what}: {url} shows an error: {}",
        b.text_of("main").await
    );
}

/// Where links and forms of the page lead: same-origin console URLs.
async fn links(b: &Session, base: &str) -> Vec<String> {
    let mut out = Vec::new();
    for a in b.find("a[href]").await {
        let href = b.attribute(&a, "href").await;
        let url = if href.starts_with('/') {
            format!("{base}{href}")
        } else {
            href
        };
        if url.starts_with(&format!("{base}/console")) && !url.contains('#') {
            out.push(url);
        }
    }
    out
}

/// A form of a page: its action and method, and the page it is on.
#[derive(Debug, Clone)]
struct FormSeen {
    page: String,
    action: String,
    method: String,
}

/// Visits every page reachable from `seeds` (a few of each kind),
/// checking each; returns the forms seen, one per action kind.
async fn crawl(b: &Session, base: &str, seeds: &[String], who: &str) -> Vec<FormSeen> {
    let mut queue: VecDeque<String> = seeds.iter().cloned().collect();
    let mut seen: BTreeSet<String> = BTreeSet::new();
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    let mut forms: BTreeMap<String, FormSeen> = BTreeMap::new();
    let mut visited = 0;
    while let Some(url) = queue.pop_front() {
        if !seen.insert(url.clone()) {
            continue;
        }
        let k = kind(&url);
        let n = kinds.entry(k.clone()).or_default();
        if *n >= PER_KIND {
            continue;
        }
        *n += 1;
        visited += 1;
        assert!(visited <= MAX_PAGES, "{who}: more than {MAX_PAGES} pages");
        b.goto(&url).await;
        assert_page_works(b, &format!("{who} following a link")).await;
        for next in links(b, base).await {
            queue.push_back(next);
        }
        for f in b.find("form").await {
            let action = b.attribute(&f, "action").await;
            let action = action.strip_prefix(base).unwrap_or(&action).to_owned();
            let method = b.attribute(&f, "method").await.to_lowercase();
            forms
                .entry(format!("{method} {}", kind(&action)))
                .or_insert(FormSeen {
                    page: url.clone(),
                    action,
                    method,
                });
        }
    }
    println!("{who}: {visited} pages of {} kinds", kinds.len());
    forms.into_values().collect()
}

/// Fills the fields a form needs (`values` by field name) and presses its
/// button; the page it leads to must work.
async fn press(b: &Session, base: &str, f: &FormSeen, values: &[(&str, &str)], who: &str) {
    b.goto(&f.page).await;
    let selector = format!("form[action='{}']", f.action);
    let form = b.find(&selector).await;
    assert!(
        !form.is_empty(),
        "{who}: {selector} is gone from {}",
        f.page
    );
    for (name, value) in values {
        let field = format!("{selector} input[name='{name}']");
        if let Some(input) = b.find(&field).await.first() {
            b.post(&format!("/element/{input}/clear"), json!({})).await;
            b.type_into(input, value).await;
        }
    }
    let button = b.find(&format!("{selector} button")).await;
    b.click_and_wait(&button[0]).await;
    assert_page_works(
        b,
        &format!("{who} pressing {} {} on {}", f.method, f.action, f.page),
    )
    .await;
    let _ = base;
}

/// Runs the command a page's *Copy as curl* shows.
fn run_curl(command: &str) -> std::process::Output {
    std::process::Command::new("sh")
        .arg("-c")
        .arg(command)
        .output()
        .expect("sh runs")
}

#[tokio::test(flavor = "multi_thread")]
async fn every_console_page_link_and_button_works_for_a_tenant_and_the_operator() {
    let (w, child, api) = start("").await;
    let acme = onboard(&w, &api, "acme").await;
    let globex = onboard(&w, &api, "globex").await;
    let (acme_ep, acme_secret) = endpoint(&w, &api, &acme, "acme", &["order.created"]).await;
    let (_, _) = endpoint(&w, &api, &globex, "globex", &["order.created"]).await;
    let since = chrono::Utc::now() - chrono::Duration::minutes(5);

    // acme: seven deliveries refused for good (400: failed, to recover),
    // then three that succeed; globex: three that succeed.
    w.receiver.set_behaviour("acme", Behaviour::Status(400));
    for id in 1..=7i64 {
        w.shop
            .execute("INSERT INTO orders VALUES ($1, 'acme', 10)", &[&id])
            .await
            .unwrap();
    }
    api.wait_for(
        &acme,
        "/v1/webhook-deliveries?status=failed",
        "seven failed deliveries",
        |b| b["data"].as_array().is_some_and(|d| d.len() == 7),
    )
    .await;
    w.receiver.set_behaviour("acme", Behaviour::Status(200));
    for id in 8..=10i64 {
        w.shop
            .execute("INSERT INTO orders VALUES ($1, 'acme', 20)", &[&id])
            .await
            .unwrap();
    }
    for id in 11..=13i64 {
        w.shop
            .execute("INSERT INTO orders VALUES ($1, 'globex', 30)", &[&id])
            .await
            .unwrap();
    }
    let done = api
        .wait_for(
            &acme,
            "/v1/webhook-deliveries?status=succeeded",
            "three succeeded deliveries",
            |b| b["data"].as_array().is_some_and(|d| d.len() == 3),
        )
        .await;
    let succeeded = done["data"][0]["id"].as_str().unwrap().to_owned();
    let globex_done = api
        .wait_for(
            &globex,
            "/v1/webhook-deliveries?status=succeeded",
            "globex's deliveries",
            |b| b["data"].as_array().is_some_and(|d| d.len() == 3),
        )
        .await;
    let globex_ids: Vec<String> = globex_done["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_str().unwrap().to_owned())
        .collect();

    // Reconciliations: one over every tenant, one over globex alone.
    let until = chrono::Utc::now() + chrono::Duration::minutes(1);
    for tenant in [None, Some("globex")] {
        let mut cmd = crate::support::walhook();
        cmd.args(["reconcile", "--config"]).arg(w.config("")).args([
            "--since",
            &since.to_rfc3339(),
            "--until",
            &until.to_rfc3339(),
        ]);
        if let Some(t) = tenant {
            cmd.args(["--tenant", t]);
        }
        let out = crate::support::run(&mut cmd);
        assert!(
            out.status.code().is_some_and(|c| c == 0 || c == 3),
            "{}",
            crate::support::stderr(&out)
        );
    }
    let (_, runs) = api.get(OPERATOR, "/v1/reconciliations").await;
    let globex_run = runs["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["tenant_id"] == "globex")
        .expect("globex's own run")["id"]
        .clone();

    let images = images();
    let base = api.base.clone();
    let (w, api, images, base) = (&w, &api, &images, &base);
    let (acme, acme_ep, acme_secret, succeeded) = (&acme, &acme_ep, &acme_secret, &succeeded);
    let globex_ids = &globex_ids;
    with_browser(async move |b: &Session| {
        // ---- The tenant.
        sign_in(b, api, acme).await;
        let seeds: Vec<String> = [
            "/console/endpoints",
            "/console/endpoints?limit=1",
            &format!("/console/endpoints/{acme_ep}?limit=1"),
            "/console/deliveries?limit=3",
            "/console/event-types?limit=1",
            "/console/audit-log?limit=2",
            "/console/reconciliations?limit=1",
        ]
        .iter()
        .map(|p| format!("{base}{p}"))
        .collect();
        let forms = crawl(b, base, &seeds, "the tenant").await;

        // Every list pages both ways: next, then previous, back where it
        // started.
        b.goto(&format!("{base}/console/deliveries?limit=3")).await;
        let first = b.text_of("main table").await;
        b.click_and_wait(&b.one("a[rel=next]").await).await;
        let second = b.text_of("main table").await;
        assert_ne!(first, second, "the next page shows other deliveries");
        b.save_screenshot(&images.join("console-deliveries-paged.png"))
            .await;
        b.click_and_wait(&b.one("a[rel=prev]").await).await;
        assert_eq!(b.text_of("main table").await, first, "previous goes back");

        // Deliveries filter by until as well as since: nothing before the
        // first order, everything before now.
        let before = (since - chrono::Duration::minutes(1)).to_rfc3339();
        b.goto(&format!("{base}/console/deliveries")).await;
        b.type_into(&b.one("#until").await, &before).await;
        b.click_and_wait(&b.one("form.filters button").await).await;
        assert!(b.text_of("main").await.contains("No delivery matches"));

        // Every button, once (signing out last).
        let added = w.receiver.url("added");
        let values = [
            ("url", added.as_str()),
            ("event_types", "order.created"),
            ("description", "added by the crawler"),
        ];
        let mut pressed = Vec::new();
        for f in forms.iter().filter(|f| !f.action.ends_with("/logout")) {
            press(b, base, f, &values, "the tenant").await;
            pressed.push(format!("{} {}", f.method, kind(&f.action)));
        }
        for needed in [
            "post /console/endpoints?",
            "post /console/endpoints/*/rotate?",
            "post /console/endpoints/*/recover?",
            "post /console/deliveries/*/replay?",
            "get /console/deliveries?",
        ] {
            assert!(
                pressed.iter().any(|p| p == needed),
                "{needed} not pressed: {pressed:?}"
            );
        }

        // Recover asks for a time (24 hours ago by default) and says what
        // it re-enqueued: the seven failed deliveries (the replay pressed
        // above may hold one already).
        b.goto(&format!("{base}/console/endpoints/{acme_ep}")).await;
        let default = b.attribute(&b.one("#since").await, "value").await;
        let default = chrono::DateTime::parse_from_rfc3339(&default).expect("an RFC 3339 default");
        let age = chrono::Utc::now() - default.with_timezone(&chrono::Utc);
        assert!(
            (age - chrono::Duration::hours(24)).num_minutes().abs() <= 5,
            "the default is 24 hours ago: {default}"
        );
        b.click_and_wait(&b.one("form.recover button").await).await;
        assert_page_works(b, "recover").await;
        let said = b.text_of("#recovered").await;
        assert!(
            said.contains("re-enqueued") || said.contains("nothing was re-enqueued"),
            "{said}"
        );
        b.save_screenshot(&images.join("console-recover.png")).await;
        // A time the API refuses is named, with the form kept.
        let field = b.one("#since").await;
        b.post(&format!("/element/{field}/clear"), json!({})).await;
        b.type_into(&field, "yesterday").await;
        b.click_and_wait(&b.one("form.recover button").await).await;
        let refused = b.text_of("main [role=alert]").await;
        assert!(refused.contains("since"), "{refused}");

        // The delivery page shows what was sent, and its curl sends it
        // again byte for byte: the receiver verifies the signature.
        b.goto(&format!("{base}/console/deliveries/{succeeded}"))
            .await;
        assert_page_works(b, "the delivery page").await;
        let headers = b.text_of("details.sent[open] table.headers").await;
        for name in [
            "webhook-id",
            "webhook-timestamp",
            "webhook-signature",
            "walhook-attempt",
            "walhook-event-id",
            "walhook-event-type",
            "content-type",
            "user-agent",
        ] {
            assert!(headers.contains(name), "{name} missing: {headers}");
        }
        b.save_screenshot(&images.join("console-delivery-sent.png"))
            .await;
        // The first attempt's command (its details are closed: the text is
        // read from the document, not from the screen).
        let first_curl = b.find("ol.timeline > li:first-child pre.curl").await;
        let command = b
            .get(&format!("/element/{}/property/textContent", first_curl[0]))
            .await
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let original = w
            .receiver
            .received()
            .into_iter()
            .find(|r| &r.webhook_id == succeeded)
            .expect("the receiver got the delivery");
        let arrived = w.receiver.count();
        let out = run_curl(&command);
        assert!(
            out.status.success(),
            "{command}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let again = w.receiver.received()[arrived..]
            .iter()
            .find(|r| &r.webhook_id == succeeded)
            .cloned()
            .expect("curl's request arrived");
        assert_eq!(again.verified, Some(true), "the signature verifies");
        assert_eq!(again.body, original.body, "the same bytes");
        assert_eq!(
            (
                &again.webhook_timestamp,
                &again.signature,
                &again.event_id,
                &again.event_occurred_at,
                &again.schema_version
            ),
            (
                &original.webhook_timestamp,
                &original.signature,
                &original.event_id,
                &original.event_occurred_at,
                &original.schema_version
            )
        );
        assert!(walhook_devkit::receiver::verify_signature(
            acme_secret,
            &again.webhook_id,
            &again.webhook_timestamp,
            &again.body,
            &again.signature
        ));

        // The tenant's reports: its own funnel and gaps, nothing of globex.
        b.goto(&format!("{base}/console/reconciliations")).await;
        let listed = b.text_of("main table").await;
        assert!(!listed.contains("globex"), "{listed}");
        b.goto(&format!(
            "{base}/console/reconciliations/{globex_run}/report.html"
        ))
        .await;
        assert_eq!(b.text_of("h1").await, "Not found", "globex's own run");
        b.goto(&format!("{base}/console/reconciliations")).await;
        b.click_and_wait(&b.find("main table a").await[0]).await;
        assert_page_works(b, "the tenant's report").await;
        let report = b
            .get("/source")
            .await
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(report.contains("acme"), "the report is acme's");
        assert!(!report.contains("globex"), "globex named in acme's report");
        for id in globex_ids {
            assert!(!report.contains(id.as_str()), "{id} in acme's report");
        }
        b.save_screenshot(&images.join("console-tenant-report.png"))
            .await;

        // Signing out (from a console page: the report is a document of
        // its own) leads to the sign-in page.
        b.goto(&format!("{base}/console/deliveries")).await;
        b.click_and_wait(&b.one("header form button").await).await;
        assert!(b.current_url().await.ends_with("/console/login"));

        // ---- The operator.
        sign_in(b, api, OPERATOR).await;
        let seeds: Vec<String> = [
            "/console/pipeline",
            "/console/tenants",
            "/console/tenants?limit=1",
            "/console/tenants/acme?limit=1",
            "/console/reconciliations?limit=1",
        ]
        .iter()
        .map(|p| format!("{base}{p}"))
        .collect();
        let forms = crawl(b, base, &seeds, "the operator").await;
        let values = [("name", "crawler")];
        let mut pressed = Vec::new();
        // Issue a key before revoking one (the tenant's page then has two).
        let mut ordered = forms.clone();
        ordered.sort_by_key(|f| f.action.ends_with("/revoke"));
        for f in ordered.iter().filter(|f| !f.action.ends_with("/logout")) {
            press(b, base, f, &values, "the operator").await;
            pressed.push(format!("{} {}", f.method, kind(&f.action)));
        }
        for needed in ["/keys?", "/revoke?"] {
            assert!(
                pressed
                    .iter()
                    .any(|p| p.starts_with("post ") && p.ends_with(needed)),
                "{needed} not pressed: {pressed:?}"
            );
        }
        b.goto(&format!("{base}/console/tenants?limit=1")).await;
        b.save_screenshot(&images.join("console-operator-tenants.png"))
            .await;
        b.click_and_wait(&b.one("header form button").await).await;
        assert!(b.current_url().await.ends_with("/console/login"));
    })
    .await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    drop(child);
}

#[test]
fn kinds_hide_ids_and_keep_query_names() {
    assert_eq!(
        kind("http://h/console/deliveries/dlv_01abc?replayed=1"),
        "http://h/console/deliveries/*?replayed"
    );
    assert_eq!(
        kind("/console/deliveries?limit=3&cursor=x&back="),
        "/console/deliveries?back&cursor&limit"
    );
    assert_eq!(
        kind("/console/reconciliations/12/report.html"),
        "/console/reconciliations/*/report.html?"
    );
}
