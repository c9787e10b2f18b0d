//! Capture through the `walhook` binary: trying rules, crashes, bad configs.

use walhook_devkit::postgres::LocalPostgres;

use crate::support::{run, stderr, stdout, walhook, write_config};

fn config(url: &str) -> String {
    config_with(url, "")
}

/// The config with `source_lines` added to `[source]`.
fn config_with(url: &str, source_lines: &str) -> String {
    format!(
        r#"
[source]
url = "{url}"
{source_lines}
create_slot = true
create_publication = true

[[rules]]
name = "order_created"
table = "orders"
operations = ["insert"]
event_type = "order.created"
tenant_column = "tenant_id"
object_id_column = "id"
"#
    )
}

async fn database(pg: &LocalPostgres) -> (String, tokio_postgres::Client) {
    let url = pg.create_database("shop").await.unwrap();
    let db = pg.connect("shop").await.unwrap();
    db.batch_execute(
        "CREATE TABLE orders (id bigint PRIMARY KEY, tenant_id text NOT NULL, total numeric)",
    )
    .await
    .unwrap();
    (url, db)
}

/// Killed after events were handed on but before the slot confirmed them:
/// the next run gives every event again, byte for byte, with the same ids.
#[tokio::test]
async fn a_crash_before_confirming_replays_identical_events() {
    let pg = LocalPostgres::start().await.unwrap();
    let (url, db) = database(&pg).await;
    let dir = tempfile::tempdir().unwrap();
    // No periodic status report within a run: a crashed run then confirms
    // nothing, so every event it handed on must come back. (A clean stop
    // still advances the slot to the last durable position.)
    let cfg = write_config(dir.path(), &config_with(&url, "status_interval = \"1h\""));
    // The slot must exist before the writes so that it sees them.
    let out = run(walhook()
        .args(["capture", "--stdout", "--until-caught-up", "--config"])
        .arg(&cfg));
    assert!(out.status.success(), "{}", stderr(&out));
    for i in 0..20 {
        db.batch_execute(&format!(
            "INSERT INTO orders VALUES ({i}, 'tenant-{}', {i}.25)",
            i % 3
        ))
        .await
        .unwrap();
    }
    for failpoint in [
        "capture.after_handoff=abort@5",
        "capture.before_confirm=abort@3",
    ] {
        let crashed = run(walhook()
            .args([
                "capture",
                "--stdout",
                "--confirm",
                "--until-caught-up",
                "--config",
            ])
            .arg(&cfg)
            .env("WALHOOK_FAILPOINTS", failpoint));
        assert!(
            !crashed.status.success(),
            "the failpoint {failpoint} did not fire"
        );
        let before_crash = stdout(&crashed);
        assert!(
            !before_crash.is_empty(),
            "nothing was handed on before {failpoint}"
        );
        let replay = run(walhook()
            .args(["capture", "--stdout", "--until-caught-up", "--config"])
            .arg(&cfg));
        assert!(replay.status.success(), "{}", stderr(&replay));
        let replayed = stdout(&replay);
        assert_eq!(
            replayed.lines().count(),
            20,
            "events missing after the crash at {failpoint}"
        );
        for line in before_crash.lines() {
            assert!(
                replayed.lines().any(|l| l == line),
                "{line} was not replayed identically"
            );
        }
    }
    // A clean confirmed run, then nothing is left to read.
    let clean = run(walhook()
        .args([
            "capture",
            "--stdout",
            "--confirm",
            "--until-caught-up",
            "--config",
        ])
        .arg(&cfg));
    assert_eq!(stdout(&clean).lines().count(), 20, "{}", stderr(&clean));
    let after = run(walhook()
        .args(["capture", "--stdout", "--until-caught-up", "--config"])
        .arg(&cfg));
    assert_eq!(stdout(&after), "", "confirmed events were read again");
    let first: serde_json::Value =
        serde_json::from_str(stdout(&clean).lines().next().unwrap()).unwrap();
    assert_eq!(first["type"], "order.created");
    assert_eq!(first["data"]["total"], serde_json::json!(0.25));
}

#[tokio::test]
async fn bad_configs_give_clear_errors_and_start_nothing() {
    let pg = LocalPostgres::start().await.unwrap();
    let (url, db) = database(&pg).await;
    let dir = tempfile::tempdir().unwrap();
    let good = config(&url);
    let cases = [
        (
            good.replace("table = \"orders\"", "table = \"orderz\""),
            "no table public.orderz",
        ),
        (
            good.replace("object_id_column = \"id\"", "object_id_column = \"uid\""),
            "no column \"uid\"",
        ),
        (
            good.replace("tenant_column = \"tenant_id\"\n", ""),
            "field `tenant_column`",
        ),
        (
            good.replace(
                "operations = [\"insert\"]",
                "operations = [\"update\"]\nwhen = [{ column = \"total\", changed = true }]",
            ),
            "REPLICA IDENTITY FULL",
        ),
        (good.replace("[[rules]]", "[[rules]\n"), "TOML parse error"),
        (
            good.replace("event_type = ", "evnt_type = "),
            "unknown field `evnt_type`",
        ),
    ];
    for (text, expected) in cases {
        let cfg = write_config(dir.path(), &text);
        let out = run(walhook()
            .args(["capture", "--stdout", "--until-caught-up", "--config"])
            .arg(&cfg));
        assert!(!out.status.success(), "accepted a bad config:\n{text}");
        let err = stderr(&out);
        assert!(err.contains(expected), "expected {expected:?} in:\n{err}");
        assert!(stdout(&out).is_empty());
    }
    let slots: i64 = db
        .query_one("SELECT count(*) FROM pg_replication_slots", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(slots, 0, "a bad config created a slot");
}

#[tokio::test]
async fn migrate_is_idempotent() {
    let pg = LocalPostgres::start().await.unwrap();
    let url = pg.create_database("platform").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        &format!("[platform]\nurl = \"{url}\"\n\n{}", config(&url)),
    );
    let first = run(walhook().args(["migrate", "--config"]).arg(&cfg));
    assert!(first.status.success(), "{}", stderr(&first));
    // Every migration this binary knows, in order (not a hard-coded list,
    // so that adding a migration does not edit this test).
    let versions: Vec<i32> = walhook_sql::migrate::MIGRATIONS
        .iter()
        .map(|m| m.version)
        .collect();
    assert!(
        stdout(&first).contains(&format!("applied migrations {versions:?}")),
        "{}",
        stdout(&first)
    );
    let second = run(walhook().args(["migrate", "--config"]).arg(&cfg));
    assert!(
        stdout(&second).contains("up to date"),
        "{}",
        stdout(&second)
    );
    let db = pg.connect("platform").await.unwrap();
    let n: i64 = db
        .query_one("SELECT count(*) FROM walhook.schema_migrations", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, versions.len() as i64);
    // A migration edited after it was applied is refused.
    db.batch_execute("UPDATE walhook.schema_migrations SET checksum = 'x' WHERE version = 1")
        .await
        .unwrap();
    let third = run(walhook().args(["migrate", "--config"]).arg(&cfg));
    assert!(!third.status.success());
    assert!(
        stderr(&third).contains("was changed after it was applied"),
        "{}",
        stderr(&third)
    );
}
