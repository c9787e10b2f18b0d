//! Secrets and tokens end to end: a signing secret left in plaintext from
//! before sealing quarantines its endpoint until `walhook secrets rotate`
//! seals it; a weak operator token stops `walhook run` at start with the
//! fix; an endpoint URL's query string (where receivers keep tokens)
//! reaches only its tenant, not the audit records or `endpoint.disabled`
//! events.

use std::time::{Duration, Instant};

use serde_json::json;
use walhook_devkit::receiver::Behaviour;
use walhook_pipeline::signing::SigningSecret;

use crate::support::api::{Http, OPERATOR, endpoint, insert_order, onboard, start, wait_verified};
use crate::support::{run, stderr, stdout, walhook, write_config};

/// A config that `walhook run` accepts up to the database, with `token`.
fn config_with_token(dir: &std::path::Path, token: &str) -> std::path::PathBuf {
    // Port 9 on loopback: nothing listens there, so a config that passes
    // stops at the database, after every check of the config.
    write_config(
        dir,
        &format!(
            "[platform]\nurl = \"postgres://postgres@127.0.0.1:9/walhook\"\n\n\
             [source]\nurl = \"postgres://postgres@127.0.0.1:9/shop\"\n\n\
             [api]\nlisten = \"127.0.0.1:0\"\noperator_token = \"{token}\"\n\n\
             [[rules]]\nname = \"m\"\nkind = \"message\"\nprefix = \"app\"\n"
        ),
    )
}

/// `operator_token = "aaaa…"` (32 × `a`) is long enough and refused: `walhook
/// run` exits at once naming the field and `walhook secrets
/// generate-token`, whose token the same config then accepts.
#[test]
fn run_refuses_a_low_entropy_operator_token_and_names_the_generator() {
    let dir = tempfile::tempdir().unwrap();
    let key = walhook_sql::secrets::MasterKey::generate_text();
    let weak = "a".repeat(32);
    let out = run(walhook()
        .args(["run", "--config"])
        .arg(config_with_token(dir.path(), &weak))
        .env("WALHOOK_MASTER_KEY", &key)
        .env_remove("WALHOOK_API_OPERATOR_TOKEN"));
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("[api].operator_token")
            && err.contains("too weak")
            && err.contains("128 bits")
            && err.contains("walhook secrets generate-token"),
        "{err}"
    );
    assert!(!err.contains(&weak), "the token was printed: {err}");
    assert!(
        !err.contains("[platform].url"),
        "walhook went on past the config: {err}"
    );

    // The generator's token passes the same check: `walhook run` goes on
    // to the (absent) database.
    let out = run(walhook().args(["secrets", "generate-token"]));
    assert!(out.status.success(), "{}", stderr(&out));
    let token = stdout(&out).trim().to_owned();
    assert_eq!(token.len(), 43, "{token}");
    let out = run(walhook()
        .args(["run", "--config"])
        .arg(config_with_token(dir.path(), &token))
        .env("WALHOOK_MASTER_KEY", &key)
        .env_remove("WALHOOK_API_OPERATOR_TOKEN"));
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        !err.contains("operator_token") && err.contains("[platform].url"),
        "{err}"
    );
}

/// Waits until `/metrics` has a line `line`.
async fn wait_metric(api: &Http, line: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let metrics = api.metrics().await;
        if metrics.lines().any(|l| l == line) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no {line:?} within 30 s:\n{metrics}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A secret row from before sealing (`key_id = 'plain'`) is refused at
/// load: its endpoint is quarantined, with an incident that tells the fix
/// and the quarantine gauge, while the tenant's other endpoint keeps
/// receiving; `walhook secrets rotate` seals the row and the waiting
/// delivery goes out, signed with the same secret.
#[tokio::test]
async fn a_plaintext_secret_quarantines_its_endpoint_until_secrets_rotate() {
    let (w, child, api) = start("").await;
    let cfg = w.dir.path().join("walhook.toml");
    let key = onboard(&w, &api, "acme").await;
    let (legacy, secret) = endpoint(&w, &api, &key, "legacy", &["order.created"]).await;
    endpoint(&w, &api, &key, "steady", &["order.created"]).await;

    // As a row written before secrets were sealed: the raw key bytes.
    let raw = SigningSecret::parse(&secret)
        .unwrap()
        .expose_bytes()
        .to_vec();
    let changed = w
        .platform_sql
        .execute(
            "UPDATE walhook.endpoint_secrets SET key_id = 'plain', secret = $2 \
             WHERE endpoint_id = (SELECT id FROM walhook.endpoints WHERE url = $1)",
            &[&w.receiver.url("legacy"), &raw],
        )
        .await
        .unwrap();
    assert_eq!(changed, 1);
    w.wait_count(
        "the quarantine incident naming the fix",
        "SELECT count(*) FROM walhook.incidents WHERE kind = 'endpoint_quarantined' \
         AND resolved_at IS NULL AND detail LIKE '%plaintext%' AND detail LIKE '%walhook secrets rotate%'",
        1,
    )
    .await;
    wait_metric(&api, "walhook_endpoints_quarantined 1").await;
    let subject: String = w
        .platform_sql
        .query_one(
            "SELECT subject FROM walhook.incidents WHERE kind = 'endpoint_quarantined'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(subject, legacy);

    insert_order(&w, 1, "acme").await;
    let succeeded_at = |path: &str| {
        format!(
            "SELECT count(*) FROM walhook.deliveries d JOIN walhook.endpoints e ON e.id = d.endpoint_id \
             WHERE e.url LIKE '%/{path}' AND d.status = 'succeeded'"
        )
    };
    w.wait_count("the steady endpoint's delivery", &succeeded_at("steady"), 1)
        .await;
    assert_eq!(
        w.receiver.arrivals("legacy"),
        0,
        "a plaintext secret signed a delivery"
    );

    // The documented fix.
    let out = run(walhook().args(["secrets", "rotate", "--config"]).arg(&cfg));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("from plain"), "{}", stdout(&out));
    w.wait_count("the sealed endpoint's delivery", &succeeded_at("legacy"), 1)
        .await;
    wait_metric(&api, "walhook_endpoints_quarantined 0").await;
    let open: i64 = w
        .platform_sql
        .query_one(
            "SELECT count(*) FROM walhook.incidents WHERE kind = 'endpoint_quarantined' AND resolved_at IS NULL",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(open, 0, "the quarantine was not lifted");
    let plain: i64 = w
        .platform_sql
        .query_one(
            "SELECT count(*) FROM walhook.endpoint_secrets WHERE key_id = 'plain'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(plain, 0);
    let got = w.receiver.received();
    let sent: Vec<_> = got.iter().filter(|r| r.path == "legacy").collect();
    assert!(
        !sent.is_empty() && sent.iter().all(|r| r.verified == Some(true)),
        "{sent:?}"
    );
    assert!(child.terminate().success());
}

/// An endpoint URL with a token in its query: its tenant reads it whole;
/// the audit records the operator reads, and the `endpoint.disabled` event
/// another receiver gets, carry it without the query.
#[tokio::test]
async fn an_endpoint_url_query_reaches_only_its_tenant() {
    const TOKEN: &str = "s3cr3t-receiver-token";
    let (w, child, api) = start("").await;
    let key = onboard(&w, &api, "acme").await;
    // Every type (the catalog does not list the operational
    // `endpoint.disabled`, so it cannot be named through the API).
    endpoint(&w, &api, &key, "ops", &[]).await;
    let bare = w.receiver.url("tokened");
    let full = format!("{bare}?token={TOKEN}");
    let (s, created) = api
        .post(
            &key,
            "/v1/webhook-endpoints",
            json!({"url": full, "event_types": ["order.created"]}),
        )
        .await;
    assert_eq!(s, 201, "{created}");
    let id = created["endpoint"]["id"].as_str().unwrap().to_owned();
    w.receiver.set_secrets(
        "tokened",
        vec![created["secret"].as_str().unwrap().to_owned()],
    );
    wait_verified(&api, &key, &id).await;
    let (_, mine) = api.get(&key, &format!("/v1/webhook-endpoints/{id}")).await;
    assert_eq!(mine["url"], full.as_str(), "{mine}");

    // A 410 disables it: an audit record and an endpoint.disabled event.
    w.receiver.set_behaviour("tokened", Behaviour::Status(410));
    insert_order(&w, 1, "acme").await;
    let disabled = |r: &walhook_devkit::receiver::Received| {
        r.path == "ops" && String::from_utf8_lossy(&r.body).contains("\"endpoint.disabled\"")
    };
    assert!(
        w.receiver
            .wait_until(Duration::from_secs(30), |r| r.iter().any(disabled))
            .await,
        "no endpoint.disabled event arrived"
    );
    let event = w.receiver.received().into_iter().find(disabled).unwrap();
    let body: serde_json::Value = serde_json::from_slice(&event.body).unwrap();
    assert_eq!(body["type"], "endpoint.disabled");
    assert_eq!(body["data"]["endpoint_id"], id.as_str());
    assert_eq!(body["data"]["url"], bare.as_str(), "{body}");
    assert!(
        !String::from_utf8_lossy(&event.body).contains(TOKEN),
        "{body}"
    );

    let (s, audit) = api.get(OPERATOR, "/v1/audit-log?tenant_id=acme").await;
    assert_eq!(s, 200, "{audit}");
    let records = audit["data"].as_array().unwrap();
    let created = records
        .iter()
        .find(|r| r["action"] == "endpoint.created" && r["target"] == id.as_str())
        .unwrap_or_else(|| panic!("no endpoint.created record: {audit}"));
    assert_eq!(created["detail"]["url"], bare.as_str(), "{created}");
    assert!(
        records.iter().any(|r| r["action"] == "endpoint.disabled"),
        "{audit}"
    );
    assert!(!audit.to_string().contains(TOKEN), "{audit}");
    for (what, sql) in [
        (
            "audit records",
            "SELECT count(*) FROM walhook.audit_log WHERE detail::text LIKE '%' || $1 || '%'",
        ),
        (
            "stored events",
            "SELECT count(*) FROM walhook.events WHERE position(convert_to($1, 'UTF8') IN payload) > 0",
        ),
    ] {
        let n: i64 = w
            .platform_sql
            .query_one(sql, &[&TOKEN])
            .await
            .unwrap()
            .get(0);
        assert_eq!(n, 0, "{what} hold the URL's query");
    }
    // The tenant still reads its URL whole.
    let (_, mine) = api.get(&key, &format!("/v1/webhook-endpoints/{id}")).await;
    assert_eq!(mine["url"], full.as_str(), "{mine}");
    assert_eq!(mine["enabled"], false, "{mine}");
    assert!(child.terminate().success());
}
