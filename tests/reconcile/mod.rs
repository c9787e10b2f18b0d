//! `walhook reconcile` against a real pipeline: a clean run over a workload
//! with retries, a disabled endpoint and filtered changes reports equal
//! counts at every stage and names the explained differences; injected
//! faults are each found with the right class and id; `--repair` fixes the
//! missing and the overdue delivery and the next run is clean for them;
//! archived days are verified object by object; the API and the metrics
//! show the runs. [`capture`]: schema changes are explained, a stopped
//! capture is a gap until it catches up. [`archived`]: archived days are
//! reconciled row by row from their Parquet parts.

mod archived;
mod capture;

use std::path::Path;
use std::time::{Duration, SystemTime};

use reqwest::Method;
use serde_json::{Value, json};
use walhook_devkit::receiver::Behaviour;
use walhook_pipeline::ids::{DeliveryId, EventId};

use crate::support::api::{Http, OPERATOR, api_section, endpoint, free_port, onboard};
use crate::support::{Child, World, run, stderr, stdout, walhook};

/// The window `[now - 10 min, now + 2 min)`: everything the test made.
fn window() -> (String, String) {
    let fmt = |t: SystemTime| {
        chrono::DateTime::<chrono::Utc>::from(t).to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    };
    let now = SystemTime::now();
    (
        fmt(now - Duration::from_secs(600)),
        fmt(now + Duration::from_secs(120)),
    )
}

/// Runs `walhook reconcile … --format json`; returns the exit code and the
/// report.
pub(super) fn reconcile(cfg: &Path, extra: &[&str]) -> (i32, Value) {
    let (since, until) = window();
    let mut cmd = walhook();
    cmd.args(["reconcile", "--config"])
        .arg(cfg)
        .args(["--since", &since, "--until", &until, "--format", "json"])
        .args(extra);
    let out = run(&mut cmd);
    let report: Value = serde_json::from_str(&stdout(&out))
        .unwrap_or_else(|e| panic!("{e}: {}\n{}", stdout(&out), stderr(&out)));
    (out.status.code().unwrap_or(-1), report)
}

pub(super) fn gap_ids(report: &Value) -> Vec<String> {
    report["gaps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["id"].as_str().unwrap().to_owned())
        .collect()
}

pub(super) fn explained(report: &Value, reason: &str) -> u64 {
    report["explained"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["reason"] == reason)
        .map(|e| e["count"].as_u64().unwrap())
        .sum()
}

/// `walhook run` with the API and `[reconcile] extra` (no schedule), and
/// the tenants `acme` and `globex` with their API keys.
struct Running {
    cfg: std::path::PathBuf,
    child: Child,
    api: Http,
    acme: String,
    globex: String,
}

async fn start(w: &World, extra: &str) -> Running {
    let port = free_port();
    let cfg = w.config(&format!(
        "{}\n[reconcile]\nevery = \"0s\"\n{extra}",
        api_section(port)
    ));
    let child = Child::run(&cfg);
    let api = Http::new(port);
    api.wait_ready().await;
    w.wait_streaming().await;
    let acme = onboard(w, &api, "acme").await;
    let globex = onboard(w, &api, "globex").await;
    Running {
        cfg,
        child,
        api,
        acme,
        globex,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_workload_reconciles_with_equal_counts_and_named_explanations() {
    let w = World::new().await;
    let Running {
        cfg,
        child,
        api,
        acme,
        globex,
    } = start(&w, "").await;
    endpoint(&w, &api, &acme, "acme-all", &[]).await;
    endpoint(&w, &api, &acme, "acme-orders", &["order.created"]).await;
    let (off, _) = endpoint(&w, &api, &acme, "acme-off", &[]).await;
    endpoint(&w, &api, &globex, "globex", &[]).await;
    // Every second request to acme-all fails once: retries.
    w.receiver
        .set_behaviour("acme-all", Behaviour::FailEvery { n: 2, status: 503 });
    let (s, body) = api
        .call(
            &acme,
            Method::PATCH,
            &format!("/v1/webhook-endpoints/{off}"),
            Some(json!({"enabled": false})),
        )
        .await;
    assert_eq!(s, 200, "{body}");
    // Changes committed after the endpoints exist (their creation is
    // recorded in the platform's clock, the commits in the shop's).
    tokio::time::sleep(Duration::from_millis(1100)).await;
    for i in 0..12i64 {
        let tenant = if i % 3 == 0 { "globex" } else { "acme" };
        w.shop
            .execute("INSERT INTO orders VALUES ($1, $2, 1)", &[&i, &tenant])
            .await
            .unwrap();
        // Filtered: invoice_paid takes updates to `paid` only.
        w.shop
            .execute(
                "INSERT INTO invoices (id, tenant_id, status, amount_cents) VALUES ($1, $2, 'open', 100)",
                &[&i, &tenant],
            )
            .await
            .unwrap();
    }
    w.shop
        .batch_execute("UPDATE invoices SET status = 'paid' WHERE id < 6")
        .await
        .unwrap();
    // acme: 8 orders × 2 + 4 invoices × 1; globex: 4 orders + 2 invoices.
    w.wait_count(
        "deliveries succeeded",
        "SELECT count(*) FROM walhook.deliveries WHERE status = 'succeeded'",
        26,
    )
    .await;

    let (code, report) = reconcile(&cfg, &[]);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["clean"], true);
    assert_eq!(report["gap_counts"], json!({}), "{report:#}");
    let f = &report["funnel"];
    // 12 orders + 12 invoice inserts + 6 invoice updates seen by the rules
    // (24 rows of invoices are seen by one rule, 12 orders by another).
    assert_eq!(f["captured_events"], 18, "{f:#}");
    // The source's row changes, each once: 12 orders, 12 invoice inserts,
    // 6 invoice updates.
    assert_eq!(f["captured_changes"], 30, "{f:#}");
    assert_eq!(f["events"], 18, "{f:#}");
    assert_eq!(f["expected_deliveries"], 26, "{f:#}");
    assert_eq!(f["materialised_deliveries"], 26, "{f:#}");
    assert_eq!(f["attempted_deliveries"], 26, "{f:#}");
    assert_eq!(f["succeeded"], 26, "{f:#}");
    assert_eq!(f["attempts_expected"], f["attempts_hot"], "{f:#}");
    assert!(
        f["attempts_hot"].as_u64().unwrap() > 26,
        "acme-all's failures were retried: {f:#}"
    );
    // The disabled endpoint would have had acme's 12 events.
    assert_eq!(explained(&report, "endpoint_disabled"), 12, "{report:#}");
    assert_eq!(
        explained(&report, "filtered_by_rule"),
        12,
        "invoice inserts, which invoice_paid (updates only) leaves out: {report:#}"
    );
    let capture = report["capture"].as_array().unwrap();
    let rule = |name: &str| capture.iter().find(|c| c["rule"] == name).unwrap().clone();
    assert_eq!(rule("order_created")["events"], 12);
    assert_eq!(rule("invoice_paid")["events"], 6);
    let tenants = report["tenants"].as_array().unwrap();
    let acme_row = tenants.iter().find(|t| t["tenant"] == "acme").unwrap();
    assert_eq!(acme_row["expected_deliveries"], 20, "{acme_row:#}");
    assert_eq!(acme_row["gaps"], 0);

    // The same data hashes the same; the HTML report is written.
    let html = w.dir.path().join("report.html");
    let (since, until) = (
        report["parameters"]["since"].as_str().unwrap().to_owned(),
        report["parameters"]["until"].as_str().unwrap().to_owned(),
    );
    let out = run(walhook()
        .args(["reconcile", "--config"])
        .arg(&cfg)
        .args([
            "--since", &since, "--until", &until, "--format", "html", "--out",
        ])
        .arg(&html));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains(report["data_sha256"].as_str().unwrap()));
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("<svg") && page.contains(&since), "{page}");

    // The runs are on the API, the latest clean window in the metrics.
    let (s, page) = api.get(OPERATOR, "/v1/reconciliations").await;
    assert_eq!(s, 200, "{page}");
    assert_eq!(page["data"].as_array().unwrap().len(), 2, "{page:#}");
    assert_eq!(page["data"][0]["clean"], true);
    let metrics = api.metrics().await;
    assert!(
        metrics.contains("walhook_reconcile_gaps{class=\"missing_delivery\"} 0"),
        "{metrics}"
    );
    child.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_faults_are_classified_with_their_ids_and_repair_fixes_what_it_can() {
    let w = World::new().await;
    let Running {
        cfg,
        child,
        api,
        acme,
        globex,
    } = start(&w, "grace = \"5s\"\n").await;
    endpoint(&w, &api, &acme, "acme", &[]).await;
    endpoint(&w, &api, &globex, "globex", &[]).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    for i in 0..10i64 {
        let tenant = if i % 2 == 0 { "acme" } else { "globex" };
        w.shop
            .execute("INSERT INTO orders VALUES ($1, $2, 1)", &[&i, &tenant])
            .await
            .unwrap();
    }
    w.wait_count(
        "deliveries succeeded",
        "SELECT count(*) FROM walhook.deliveries WHERE status = 'succeeded'",
        10,
    )
    .await;
    // A capture incident: a truncate removes rows without row events.
    w.shop.batch_execute("TRUNCATE invoices").await.unwrap();
    w.wait_count(
        "capture incident",
        "SELECT count(*) FROM walhook.capture_incidents",
        1,
    )
    .await;

    // Four acme deliveries and one globex event to break, in order.
    let ids: Vec<(uuid::Uuid, uuid::Uuid)> = w
        .platform_sql
        .query(
            "SELECT id, event_id FROM walhook.deliveries WHERE tenant_id = 'acme' ORDER BY id LIMIT 3",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let (deleted, stuck, unattempted) = (ids[0].0, ids[1].0, ids[2].0);
    let dropped_event: uuid::Uuid = w
        .platform_sql
        .query_one(
            "SELECT event_id FROM walhook.deliveries WHERE tenant_id = 'globex' LIMIT 1",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let incident: i64 = w
        .platform_sql
        .query_one("SELECT min(id) FROM walhook.capture_incidents", &[])
        .await
        .unwrap()
        .get(0);
    // A delivery fan-out never made: no row, no attempts.
    w.platform_sql
        .batch_execute(&format!(
            "DELETE FROM walhook.deliveries WHERE id = '{deleted}'; \
             DELETE FROM walhook.attempts WHERE delivery_id = '{deleted}'"
        ))
        .await
        .unwrap();
    // Pending again, with no scheduling row: no dispatcher will claim it.
    w.platform_sql
        .execute(
            "UPDATE walhook.deliveries SET status = 'pending' WHERE id = $1",
            &[&stuck],
        )
        .await
        .unwrap();
    w.platform_sql
        .execute(
            "DELETE FROM walhook.attempts WHERE delivery_id = $1",
            &[&unattempted],
        )
        .await
        .unwrap();
    w.platform_sql
        .execute(
            "DELETE FROM walhook.events WHERE id = $1",
            &[&dropped_event],
        )
        .await
        .unwrap();

    let text = |u: uuid::Uuid| DeliveryId(*u.as_bytes()).to_string();
    let event_text = EventId(*dropped_event.as_bytes()).to_string();
    let (code, report) = reconcile(&cfg, &[]);
    assert_eq!(code, 3, "gaps exit with status 3: {report:#}");
    let ids = gap_ids(&report);
    for want in [
        format!("missing_delivery:{}", text(deleted)),
        format!("overdue_pending:{}", text(stuck)),
        format!("attempt_count_mismatch:{}", text(unattempted)),
        format!("missing_event:{event_text}"),
        format!("capture_incident:{incident}"),
    ] {
        assert!(ids.contains(&want), "{want} not in {ids:#?}");
    }
    let counts = &report["gap_counts"];
    assert_eq!(counts["missing_delivery"], 1, "{counts}");
    assert_eq!(counts["overdue_pending"], 1, "{counts}");
    assert_eq!(counts["attempt_count_mismatch"], 1, "{counts}");
    // The stored event and the ledger's minute both say it is missing.
    assert_eq!(counts["missing_event"], 2, "{counts}");
    assert!(
        ids.iter()
            .any(|i| i.starts_with("missing_event:") && i.contains('@')),
        "the ledger's minute: {ids:#?}"
    );
    assert_eq!(counts["capture_incident"], 1, "{counts}");
    assert_eq!(report["clean"], false);
    let gap = report["gaps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["class"] == "missing_delivery")
        .unwrap();
    assert_eq!(gap["tenant"], "acme");
    assert_eq!(gap["delivery_id"], text(deleted));

    // Repair: the missing delivery is made again and the stuck one
    // re-enqueued; the running dispatcher sends both.
    let (code, repaired) = reconcile(&cfg, &["--repair"]);
    assert_eq!(code, 3, "the other gaps remain: {repaired:#}");
    let repairs = repaired["repairs"].as_array().unwrap();
    let fixed = |class: &str| {
        repairs
            .iter()
            .find(|r| r["class"] == class)
            .map(|r| r["repaired"].as_u64().unwrap())
    };
    assert_eq!(fixed("missing_delivery"), Some(1), "{repairs:#?}");
    assert_eq!(fixed("overdue_pending"), Some(1), "{repairs:#?}");
    let audited: i64 = w
        .platform_sql
        .query_one(
            "SELECT count(*) FROM walhook.audit_log WHERE action = 'delivery.redriven' AND target = $1",
            &[&text(deleted)],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(audited, 1);
    w.wait_count(
        "the repaired deliveries sent",
        &format!(
            "SELECT count(*) FROM walhook.deliveries WHERE id IN ('{deleted}', '{stuck}') AND status = 'succeeded'"
        ),
        2,
    )
    .await;
    let (code, after) = reconcile(&cfg, &[]);
    assert_eq!(code, 3, "{after:#}");
    let counts = &after["gap_counts"];
    assert!(counts.get("missing_delivery").is_none(), "{counts}");
    assert!(counts.get("overdue_pending").is_none(), "{counts}");
    assert_eq!(counts["attempt_count_mismatch"], 1, "{counts}");
    assert_eq!(counts["missing_event"], 2, "{counts}");
    // A second repair has nothing left to do.
    let (_, again) = reconcile(&cfg, &["--repair"]);
    assert_eq!(again["repairs"], json!([]), "{again:#}");

    // The API: the operator sees every run, a tenant only its own gaps.
    let (s, page) = api.get(OPERATOR, "/v1/reconciliations").await;
    assert_eq!(s, 200, "{page}");
    let runs = page["data"].as_array().unwrap();
    assert_eq!(runs.len(), 4, "{page:#}");
    assert_eq!(runs[0]["clean"], false);
    assert!(runs[0]["gap_counts"]["missing_event"] == 2, "{page:#}");
    let (s, mine) = api.get(&globex, "/v1/reconciliations").await;
    assert_eq!(s, 200, "{mine}");
    let gaps = mine["data"][0]["report"]["gaps"].as_array().unwrap();
    assert!(!gaps.is_empty(), "{mine:#}");
    assert!(gaps.iter().all(|g| g["tenant"] == "globex"), "{mine:#}");
    let (s, acme_view) = api.get(&acme, "/v1/reconciliations").await;
    assert_eq!(s, 200);
    let acme_gaps = acme_view["data"][0]["report"]["gaps"].as_array().unwrap();
    assert!(
        acme_gaps
            .iter()
            .all(|g| g["tenant"] == "acme" && g["event_id"] != event_text),
        "{acme_view:#}"
    );
    let id = runs[0]["id"].as_i64().unwrap();
    let html = api
        .text_as(OPERATOR, &format!("/v1/reconciliations/{id}/report.html"))
        .await;
    assert!(html.contains(&event_text), "{html}");
    // A tenant's report is its own view of the run: globex's gaps and
    // name are not in it.
    let acme_html = api
        .text_as(&acme, &format!("/v1/reconciliations/{id}/report.html"))
        .await;
    assert!(acme_html.contains("acme"), "{acme_html}");
    assert!(
        !acme_html.contains(&event_text) && !acme_html.contains("globex"),
        "{acme_html}"
    );
    // Its contents list only what it draws: capture and the archive are
    // nobody's in particular and are the operator's page only.
    assert!(html.contains("href=\"#capture\"") && html.contains("href=\"#archive\""));
    assert!(
        !acme_html.contains("href=\"#capture\"") && !acme_html.contains("id=\"archive\""),
        "{acme_html}"
    );
    let metrics = api.metrics().await;
    assert!(
        metrics.contains("walhook_reconcile_gaps{class=\"missing_event\"} 2"),
        "{metrics}"
    );
    child.terminate();
}

/// A world's run whose orders were archived: walhook as it runs again
/// after `walhook archive --today` five days on, its config, and the day
/// the orders were made.
pub(crate) struct Archived {
    pub cfg: std::path::PathBuf,
    pub today: String,
    pub child: Child,
}

/// `orders` orders of acme and globex (in turn) delivered, then archived
/// by `walhook archive` as if five days later (the day's hot rows
/// dropped); walhook then runs again, since a window is reconciled only
/// once capture shows it is past the window's end.
pub(crate) async fn archived_orders(w: &World, orders: i64) -> Archived {
    w.endpoint("acme", "acme", &[]).await;
    w.endpoint("globex", "globex", &[]).await;
    let cfg = w.config("[reconcile]\nevery = \"0s\"\n");
    let child = Child::run(&cfg);
    w.wait_streaming().await;
    for i in 0..orders {
        let tenant = if i % 2 == 0 { "acme" } else { "globex" };
        w.shop
            .execute("INSERT INTO orders VALUES ($1, $2, 1)", &[&i, &tenant])
            .await
            .unwrap();
    }
    w.wait_count(
        "deliveries succeeded",
        "SELECT count(*) FROM walhook.deliveries WHERE status = 'succeeded'",
        orders,
    )
    .await;
    child.terminate();
    let today: String = w
        .platform_sql
        .query_one(
            "SELECT to_char((now() AT TIME ZONE 'UTC')::date, 'YYYY-MM-DD')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let later =
        (today.parse::<chrono::NaiveDate>().unwrap() + chrono::Duration::days(5)).to_string();
    let out = run(walhook()
        .args(["archive", "--config"])
        .arg(&cfg)
        .args(["--today", &later]));
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    let child = Child::run(&cfg);
    w.wait_streaming().await;
    Archived { cfg, today, child }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archived_days_are_verified_object_by_object() {
    let w = World::new().await;
    let Archived {
        cfg,
        today,
        child: _child,
    } = archived_orders(&w, 8).await;

    let (code, report) = reconcile(&cfg, &[]);
    assert_eq!(code, 0, "{report:#}");
    let f = &report["funnel"];
    assert_eq!(f["events"], 8, "{f:#}");
    assert_eq!(f["events_archived"], 8, "{f:#}");
    assert_eq!(f["deliveries_archived"], 8, "{f:#}");
    assert_eq!(f["attempts_archived"], 8, "{f:#}");
    let days = report["archive"].as_array().unwrap();
    assert_eq!(days.len(), 3, "{days:#?}");
    assert!(days.iter().all(|d| d["verified"] == true), "{days:#?}");

    // One part removed, one corrupted.
    let root = w.dir.path().join("walhook-archive");
    let part = |table: &str| {
        let dir = root.join(format!("table={table}/date={today}"));
        let bucket = std::fs::read_dir(&dir)
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        std::fs::read_dir(bucket)
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path()
    };
    std::fs::remove_file(part("attempts")).unwrap();
    let events_part = part("events");
    let mut bytes = std::fs::read(&events_part).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&events_part, bytes).unwrap();

    let (code, report) = reconcile(&cfg, &[]);
    assert_eq!(code, 3, "{report:#}");
    let ids = gap_ids(&report);
    assert!(
        ids.contains(&format!(
            "archive_object_missing:attempts/{today}/generation-0"
        )),
        "{ids:#?}"
    );
    assert!(
        ids.contains(&format!("archive_mismatch:events/{today}/generation-0")),
        "{ids:#?}"
    );
    let deliveries = report["archive"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["table"] == "deliveries")
        .unwrap()
        .clone();
    assert_eq!(deliveries["verified"], true, "{deliveries:#}");
    // Repair cannot bring back dropped rows: it says what to do instead.
    let (code, repaired) = reconcile(&cfg, &["--repair"]);
    assert_eq!(code, 3);
    let detail = repaired["gaps"][0]["detail"].as_str().unwrap();
    assert!(detail.contains("restore the object"), "{detail}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn walhook_run_reconciles_rolling_windows_on_its_own() {
    let w = World::new().await;
    w.endpoint("acme", "acme", &[]).await;
    let reports = w.dir.path().join("reports");
    let port = free_port();
    let cfg = w.config(&format!(
        "{}\n[reconcile]\nevery = \"10s\"\nwindow = \"10m\"\nsettle = \"0s\"\nreport_dir = {:?}\n",
        api_section(port),
        reports.display().to_string()
    ));
    let child = Child::run(&cfg);
    let api = Http::new(port);
    api.wait_ready().await;
    w.wait_streaming().await;
    for i in 0..5i64 {
        w.shop
            .execute("INSERT INTO orders VALUES ($1, 'acme', 1)", &[&i])
            .await
            .unwrap();
    }
    w.wait_count(
        "deliveries succeeded",
        "SELECT count(*) FROM walhook.deliveries WHERE status = 'succeeded'",
        5,
    )
    .await;
    // Runs come every 10 s; a window ends on a whole minute, so the first
    // that covers the deliveries' minute comes within 70 s.
    let deadline = std::time::Instant::now() + Duration::from_secs(100);
    let run = loop {
        let (s, page) = api.get(OPERATOR, "/v1/reconciliations").await;
        assert_eq!(s, 200, "{page}");
        let found = page["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["trigger"] == "scheduled");
        if let Some(r) = found {
            let (_, full) = api
                .get(OPERATOR, &format!("/v1/reconciliations/{}", r["id"]))
                .await;
            // A run that began before the deliveries were done may count
            // fewer; wait for one that saw them all.
            if full["report"]["funnel"]["succeeded"] == 5 {
                break full;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no scheduled reconciliation saw the 5 deliveries within 100 s: {page:#}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(run["clean"], true, "{run:#}");
    assert_eq!(run["report"]["funnel"]["captured_events"], 5, "{run:#}");
    let written: Vec<String> = std::fs::read_dir(&reports)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(written.iter().any(|f| f.ends_with(".html")), "{written:?}");
    assert!(written.iter().any(|f| f.ends_with(".json")), "{written:?}");
    child.terminate();
}
