//! Capture against a real Postgres with `wal_level = logical`.

// Test code spawns freely.
#![allow(clippy::disallowed_methods)]

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;
use walhook_connectors::postgres::config::{RuleConfig, SourceConfig};
use walhook_connectors::postgres::{CaptureError, CaptureObserver, PostgresSource, RunOptions};
use walhook_devkit::postgres::LocalPostgres;
use walhook_pipeline::capture::{
    CapturedTransaction, Incident, IncidentKind, SinkError, TransactionSink,
};
use walhook_pipeline::event::Event;
use walhook_pipeline::ids::{EventId, Lsn};
use walhook_pipeline::log::Receipt;

/// Collects what capture hands off.
#[derive(Clone, Default)]
pub(crate) struct Collect {
    pub(crate) txs: Arc<Mutex<Vec<CapturedTransaction>>>,
}

impl Collect {
    pub(crate) fn events(&self) -> Vec<Event> {
        self.txs
            .lock()
            .iter()
            .flat_map(|t| t.events.clone())
            .collect()
    }
}

impl TransactionSink for Collect {
    async fn hand_off(&mut self, tx: CapturedTransaction) -> Result<Receipt, SinkError> {
        self.txs.lock().push(tx);
        Ok(Receipt::ready())
    }
}

#[derive(Default)]
pub(crate) struct Incidents(pub(crate) Mutex<Vec<Incident>>);

impl CaptureObserver for Incidents {
    fn incident(&self, incident: &Incident) {
        self.0.lock().push(incident.clone());
    }
}

const SCHEMA: &str = "
    CREATE TABLE invoices (
        id bigint PRIMARY KEY,
        tenant_id text NOT NULL,
        status text NOT NULL,
        amount numeric(12,2) NOT NULL,
        paid_at timestamptz,
        tags text[],
        meta jsonb,
        body text
    );
    ALTER TABLE invoices REPLICA IDENTITY FULL;
    ALTER TABLE invoices ALTER COLUMN body SET STORAGE EXTERNAL;
    CREATE TABLE orders (
        id bigint PRIMARY KEY,
        tenant_id text NOT NULL,
        state text NOT NULL
    );
    ALTER TABLE orders REPLICA IDENTITY FULL;
";

const RULES: &str = r#"
[[rules]]
name = "invoice_created"
table = "public.invoices"
operations = ["insert"]
event_type = "invoice.created"
tenant_column = "tenant_id"
object_id_column = "id"
object_version = "lsn"
exclude = ["body"]

[[rules]]
name = "invoice_paid"
table = "public.invoices"
operations = ["update"]
when = [{ column = "status", changed_to = "paid" }]
event_type = "invoice.paid"
tenant_column = "tenant_id"
object_id_column = "id"
include = ["id", "amount", "status", "paid_at"]

[[rules]]
name = "invoice_deleted"
table = "public.invoices"
operations = ["delete"]
event_type = "invoice.deleted"
tenant_column = "tenant_id"
object_id_column = "id"
include = ["id"]

[[rules]]
name = "order_changed"
table = "orders"
event_type = "order.changed"
tenant_column = "tenant_id"
object_id_column = "id"
"#;

#[derive(serde::Deserialize)]
pub(crate) struct Rules {
    pub(crate) rules: Vec<RuleConfig>,
}

/// Rules from TOML text.
fn rules_from(text: &str) -> Vec<RuleConfig> {
    toml::from_str::<Rules>(text).unwrap().rules
}

pub(crate) fn config(url: &str, extra: &str) -> (SourceConfig, Vec<RuleConfig>) {
    let source: SourceConfig = toml::from_str(&format!(
        "url = \"{url}\"\ncreate_slot = true\ncreate_publication = true\nheartbeat_interval = \"200ms\"\nstatus_interval = \"100ms\"\n{extra}"
    ))
    .unwrap();
    let rules: Rules = toml::from_str(RULES).unwrap();
    (source, rules.rules)
}

pub(crate) async fn setup(pg: &LocalPostgres, db: &str) -> (String, tokio_postgres::Client) {
    let url = pg.create_database(db).await.unwrap();
    let client = pg.connect(db).await.unwrap();
    client.batch_execute(SCHEMA).await.unwrap();
    (url, client)
}

async fn catch_up(source: &PostgresSource, confirm: bool) -> Collect {
    catch_up_with_incidents(source, confirm).await.0
}

/// Streams until caught up; what was handed off and the incidents seen.
async fn catch_up_with_incidents(
    source: &PostgresSource,
    confirm: bool,
) -> (Collect, Arc<Incidents>) {
    let sink = Collect::default();
    let observer = Arc::new(Incidents::default());
    let options = RunOptions {
        confirm,
        stop_when_caught_up: true,
    };
    tokio::time::timeout(
        Duration::from_secs(60),
        source.run(
            sink.clone(),
            observer.clone(),
            options,
            CancellationToken::new(),
        ),
    )
    .await
    .expect("capture did not catch up")
    .unwrap();
    (sink, observer)
}

fn data(e: &Event) -> serde_json::Value {
    serde_json::from_slice::<serde_json::Value>(&e.payload).unwrap()
}

#[tokio::test]
async fn changes_become_the_expected_events_in_commit_order() {
    let pg = LocalPostgres::start().await.unwrap();
    let (url, db) = setup(&pg, "changes").await;
    let (cfg, rules) = config(&url, "");
    let source = PostgresSource::prepare(cfg, rules).await.unwrap();
    // One call per transaction: a multi-statement simple query is one
    // transaction.
    for sql in [
        "INSERT INTO invoices (id, tenant_id, status, amount, tags, meta) VALUES (1, 'acme', 'open', 10.50, '{a,b}', '{\"z\": 1, \"a\": [true]}')",
        "BEGIN;
           INSERT INTO invoices (id, tenant_id, status, amount) VALUES (2, 'globex', 'open', 99999999.99);
           INSERT INTO orders VALUES (10, 'globex', 'new');
           UPDATE invoices SET status = 'paid', paid_at = '2026-11-29 10:11:44.5+00' WHERE id = 1;
         COMMIT",
        "UPDATE invoices SET status = 'paid' WHERE id = 1", // already paid: no event
        "UPDATE orders SET id = 11 WHERE id = 10",          // a primary-key change
        "DELETE FROM invoices WHERE id = 2",
        "DELETE FROM orders WHERE id = 11",
    ] {
        db.batch_execute(sql).await.unwrap();
    }
    let got = catch_up(&source, false).await;
    let events = got.events();
    let summary: Vec<(String, String, Option<String>)> = events
        .iter()
        .map(|e| {
            (
                e.event_type.to_string(),
                e.tenant_id.to_string(),
                e.object_id.clone(),
            )
        })
        .collect();
    let expect =
        |t: &str, tenant: &str, id: &str| (t.to_owned(), tenant.to_owned(), Some(id.to_owned()));
    assert_eq!(
        summary,
        vec![
            expect("invoice.created", "acme", "1"),
            expect("invoice.created", "globex", "2"),
            expect("order.changed", "globex", "10"),
            expect("invoice.paid", "acme", "1"),
            expect("order.changed", "globex", "11"),
            expect("invoice.deleted", "globex", "2"),
            expect("order.changed", "globex", "11"),
        ]
    );
    // Commit order, and ordinals inside the multi-statement transaction.
    let keys: Vec<_> = events.iter().map(|e| e.key).collect();
    assert!(keys.windows(2).all(|w| w[0] < w[1]), "{keys:?}");
    assert_eq!(events[1].key.commit_lsn, events[3].key.commit_lsn);
    assert_eq!(
        (
            events[1].key.tx_ordinal,
            events[2].key.tx_ordinal,
            events[3].key.tx_ordinal
        ),
        (0, 1, 2)
    );
    // Typed, canonical payloads.
    let created = data(&events[0]);
    assert_eq!(created["data"]["amount"], serde_json::json!(10.50));
    assert_eq!(created["data"]["tags"], serde_json::json!(["a", "b"]));
    assert_eq!(
        created["data"]["meta"],
        serde_json::json!({"a": [true], "z": 1})
    );
    assert!(
        created["data"].get("body").is_none(),
        "excluded column present"
    );
    assert_eq!(
        created["object_version"],
        serde_json::json!(events[0].key.commit_lsn.0)
    );
    let text = std::str::from_utf8(&events[1].payload).unwrap();
    assert!(text.contains(r#""amount":99999999.99"#), "{text}");
    assert_eq!(
        data(&events[3])["data"]["paid_at"],
        "2026-11-29T10:11:44.5Z"
    );
    assert_eq!(data(&events[3])["data"].as_object().unwrap().len(), 4);
    for e in &events {
        assert_eq!(
            e.id,
            EventId::derive("main", e.key.commit_lsn, e.key.tx_ordinal, &rule_of(e))
        );
        assert_eq!(data(e)["id"], e.id.to_string());
    }
}

fn rule_of(e: &Event) -> String {
    match e.event_type.as_str() {
        "invoice.created" => "invoice_created",
        "invoice.paid" => "invoice_paid",
        "invoice.deleted" => "invoice_deleted",
        _ => "order_changed",
    }
    .to_owned()
}

#[tokio::test]
async fn a_large_transaction_spanning_many_messages_is_complete() {
    let pg = LocalPostgres::start().await.unwrap();
    let (url, db) = setup(&pg, "large").await;
    let (cfg, rules) = config(&url, "");
    let source = PostgresSource::prepare(cfg, rules).await.unwrap();
    db.batch_execute("INSERT INTO orders SELECT g, 'acme', 'new' FROM generate_series(1, 10000) g")
        .await
        .unwrap();
    db.batch_execute("INSERT INTO orders VALUES (20000, 'acme', 'after')")
        .await
        .unwrap();
    let got = catch_up(&source, false).await;
    let events = got.events();
    assert_eq!(events.len(), 10_001);
    let big = &events[..10_000];
    assert!(
        big.iter()
            .all(|e| e.key.commit_lsn == big[0].key.commit_lsn)
    );
    assert!(
        big.iter()
            .enumerate()
            .all(|(i, e)| e.key.tx_ordinal == i as u32
                && e.object_id.as_deref() == Some(&(i + 1).to_string()[..]))
    );
    assert!(events[10_000].key.commit_lsn > big[0].key.commit_lsn);
    // Handed off in chunks, confirmed once.
    assert!(
        got.txs.lock().len() > 2,
        "the big transaction was not chunked"
    );
}

#[tokio::test]
async fn reading_again_without_confirming_gives_identical_events() {
    let pg = LocalPostgres::start().await.unwrap();
    let (url, db) = setup(&pg, "again").await;
    let (cfg, rules) = config(&url, "");
    let source = PostgresSource::prepare(cfg, rules).await.unwrap();
    db.batch_execute("INSERT INTO invoices (id, tenant_id, status, amount) SELECT g, 't' || (g % 3), 'open', g FROM generate_series(1, 50) g")
        .await
        .unwrap();
    db.batch_execute("UPDATE invoices SET status = 'paid' WHERE id % 2 = 0")
        .await
        .unwrap();
    let slot_before: String = db
        .query_one(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let first = catch_up(&source, false).await.events();
    let second = catch_up(&source, false).await.events();
    assert_eq!(first.len(), 75);
    assert_eq!(first, second, "a second read differs");
    let slot_after: String = db
        .query_one(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(slot_before, slot_after, "a dry run moved the slot");
    // Confirming moves the slot; the next read starts after.
    let third = catch_up(&source, true).await.events();
    assert_eq!(third, first);
    let fourth = catch_up(&source, true).await.events();
    assert!(
        fourth.is_empty(),
        "confirmed events were read again: {}",
        fourth.len()
    );
}

async fn toast_payload(identity: &str) -> serde_json::Value {
    let pg = LocalPostgres::start().await.unwrap();
    let (url, db) = setup(&pg, "toast").await;
    db.batch_execute(&format!("ALTER TABLE invoices REPLICA IDENTITY {identity}"))
        .await
        .unwrap();
    let rules = r#"
        [[rules]]
        name = "invoice_updated"
        table = "invoices"
        operations = ["update"]
        event_type = "invoice.updated"
        tenant_column = "tenant_id"
        include = ["id", "status", "body"]
    "#;
    let source_cfg: SourceConfig = toml::from_str(&format!(
        "url = \"{url}\"\ncreate_slot = true\ncreate_publication = true"
    ))
    .unwrap();
    let rules: Rules = toml::from_str(rules).unwrap();
    let source = PostgresSource::prepare(source_cfg, rules.rules)
        .await
        .unwrap();
    if identity == "DEFAULT" {
        assert!(
            source.warnings.iter().any(|w| w.contains("body")),
            "no TOAST warning: {:?}",
            source.warnings
        );
    }
    db.batch_execute("INSERT INTO invoices (id, tenant_id, status, amount, body) VALUES (1, 'acme', 'open', 1, repeat('0123456789abcdef', 1024))")
        .await
        .unwrap();
    db.batch_execute("UPDATE invoices SET status = 'paid' WHERE id = 1")
        .await
        .unwrap();
    let events = catch_up(&source, false).await.events();
    assert_eq!(events.len(), 1);
    data(&events[0])
}

#[tokio::test]
async fn unchanged_toast_under_default_identity_is_listed_never_null() {
    let v = toast_payload("DEFAULT").await;
    assert!(v["data"].get("body").is_none(), "body present: {v}");
    assert_eq!(v["unavailable"], serde_json::json!(["body"]));
    assert_eq!(v["data"]["status"], "paid");
}

#[tokio::test]
async fn unchanged_toast_under_full_identity_is_complete() {
    let v = toast_payload("FULL").await;
    assert_eq!(v["data"]["body"].as_str().unwrap().len(), 16 * 1024);
    assert!(v.get("unavailable").is_none());
}

#[tokio::test]
async fn truncate_is_counted_and_reported() {
    let pg = LocalPostgres::start().await.unwrap();
    let (url, db) = setup(&pg, "truncate").await;
    let (cfg, rules) = config(&url, "");
    let source = PostgresSource::prepare(cfg, rules).await.unwrap();
    for sql in [
        "INSERT INTO orders VALUES (1, 'acme', 'new')",
        "TRUNCATE orders",
        "INSERT INTO orders VALUES (2, 'acme', 'new')",
    ] {
        db.batch_execute(sql).await.unwrap();
    }
    let observer = Arc::new(Incidents::default());
    let sink = Collect::default();
    let stats = source
        .run(
            sink.clone(),
            observer.clone(),
            RunOptions {
                confirm: false,
                stop_when_caught_up: true,
            },
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(stats.incidents, 1);
    let incidents = observer.0.lock().clone();
    assert_eq!(incidents.len(), 1);
    assert_eq!(incidents[0].kind, IncidentKind::Truncate);
    assert_eq!(incidents[0].table.as_deref(), Some("public.orders"));
    assert_eq!(sink.events().len(), 2);
    let with_incident: Vec<_> = sink
        .txs
        .lock()
        .iter()
        .filter(|t| !t.incidents.is_empty())
        .map(|t| t.commit_lsn)
        .collect();
    assert_eq!(with_incident.len(), 1);
}

/// Outbox rows and logical messages name their own types; both become
/// events in commit order, the declared types are listed at start-up, and
/// malformed messages are incidents, never dropped silently.
#[tokio::test]
async fn outbox_rows_and_logical_messages_become_events() {
    let pg = LocalPostgres::start().await.unwrap();
    let (url, db) = setup(&pg, "outbox").await;
    db.batch_execute(
        "CREATE TABLE outbox (id bigserial PRIMARY KEY, tenant_id text NOT NULL, \
         aggregate_id text, event_type text NOT NULL, payload jsonb NOT NULL)",
    )
    .await
    .unwrap();
    let (cfg, _) = config(&url, "");
    let rules: Rules = toml::from_str(
        r#"
[[rules]]
name = "outbox"
kind = "outbox"
table = "public.outbox"
type_column = "event_type"
payload_column = "payload"
tenant_column = "tenant_id"
object_id_column = "aggregate_id"
event_types = ["order.shipped"]

[[rules]]
name = "app_messages"
kind = "message"
prefix = "app"
schema_version = 2
event_types = ["invoice.voided"]
"#,
    )
    .unwrap();
    let source = PostgresSource::prepare(cfg, rules.rules).await.unwrap();
    assert_eq!(
        source.event_types(),
        [
            ("invoice.voided".to_owned(), 2),
            ("order.shipped".to_owned(), 1)
        ]
    );
    let voided = r#"{"type": "invoice.voided", "tenant_id": "acme", "object_id": "7", "data": {"id": 7, "reason": "dup"}}"#;
    db.batch_execute(&format!(
        "BEGIN; \
         INSERT INTO outbox (tenant_id, aggregate_id, event_type, payload) \
           VALUES ('acme', 'o-1', 'order.shipped', '{{\"carrier\": \"ups\", \"parcels\": 2}}'); \
         SELECT pg_logical_emit_message(true, 'app', '{voided}'); \
         COMMIT;"
    ))
    .await
    .unwrap();
    for sql in [
        // Not transactional: it has no commit time, so no event.
        format!("SELECT pg_logical_emit_message(false, 'app', '{voided}')"),
        // Not JSON.
        "SELECT pg_logical_emit_message(true, 'app', 'voided invoice 7')".to_owned(),
        // Another prefix: not this source's.
        format!("SELECT pg_logical_emit_message(true, 'other', '{voided}')"),
        // A type no rule declared still becomes an event.
        "INSERT INTO outbox (tenant_id, event_type, payload) \
         VALUES ('globex', 'order.returned', '[1, 2]')"
            .to_owned(),
    ] {
        db.batch_execute(&sql).await.unwrap();
    }
    let (sink, observer) = catch_up_with_incidents(&source, false).await;
    let events = sink.events();
    let summary: Vec<(&str, &str, Option<&str>, u32)> = events
        .iter()
        .map(|e| {
            (
                e.event_type.as_str(),
                e.tenant_id.as_str(),
                e.object_id.as_deref(),
                e.schema_version,
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("order.shipped", "acme", Some("o-1"), 1),
            ("invoice.voided", "acme", Some("7"), 2),
            ("order.returned", "globex", None, 1),
        ]
    );
    assert_eq!(
        data(&events[0])["data"],
        serde_json::json!({"carrier": "ups", "parcels": 2})
    );
    assert_eq!(
        data(&events[1])["data"],
        serde_json::json!({"id": 7, "reason": "dup"})
    );
    assert_eq!(data(&events[2])["data"], serde_json::json!([1, 2]));
    // The outbox row and the message share a transaction: one commit LSN.
    assert_eq!(events[0].key.commit_lsn, events[1].key.commit_lsn);
    let incidents = observer.0.lock().clone();
    assert_eq!(incidents.len(), 2, "{incidents:?}");
    assert!(
        incidents
            .iter()
            .all(|i| i.kind == IncidentKind::InvalidMessage
                && i.rule.as_deref() == Some("app_messages")),
        "{incidents:?}"
    );
}

async fn slot_exists(db: &tokio_postgres::Client) -> bool {
    db.query_opt(
        "SELECT 1 FROM pg_replication_slots WHERE slot_name = 'walhook'",
        &[],
    )
    .await
    .unwrap()
    .is_some()
}

#[tokio::test]
async fn bad_rules_are_refused_before_anything_starts() {
    let pg = LocalPostgres::start().await.unwrap();
    let (url, db) = setup(&pg, "bad").await;
    db.batch_execute("CREATE TABLE plain (id int PRIMARY KEY, tenant text, status text)")
        .await
        .unwrap();
    let base = "name = \"r\"\nevent_type = \"x.y\"\n";
    let cases = [
        (
            "table = \"nope\"\ntenant_column = \"tenant\"",
            "no table public.nope",
        ),
        (
            "table = \"plain\"\ntenant_column = \"tenant\"\noperations = [\"insert\"]\ninclude = [\"colour\"]",
            "no column \"colour\"",
        ),
        (
            "table = \"plain\"\ntenant_column = \"tenant_id\"",
            "no column \"tenant_id\"",
        ),
        (
            "table = \"plain\"\ntenant_column = \"tenant\"",
            "deletes carry only the key",
        ),
        (
            "table = \"plain\"\ntenant_column = \"tenant\"\noperations = [\"update\"]\nwhen = [{ column = \"status\", changed_to = \"x\" }]",
            "ALTER TABLE public.plain REPLICA IDENTITY FULL",
        ),
    ];
    for (rule, expected) in cases {
        let source: SourceConfig = toml::from_str(&format!(
            "url = \"{url}\"\ncreate_slot = true\ncreate_publication = true"
        ))
        .unwrap();
        let rules: Rules = toml::from_str(&format!("[[rules]]\n{base}{rule}")).unwrap();
        let err = match PostgresSource::prepare(source, rules.rules).await {
            Ok(_) => panic!("accepted: {rule}"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains(expected), "{rule}: {err}");
        assert!(
            !slot_exists(&db).await,
            "a slot was created for a bad config"
        );
    }
    let pubs: i64 = db
        .query_one("SELECT count(*) FROM pg_publication", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(pubs, 0);
}

#[tokio::test]
async fn without_create_flags_the_error_says_what_to_run() {
    let pg = LocalPostgres::start().await.unwrap();
    let (url, _db) = setup(&pg, "flags").await;
    let (mut cfg, rules) = config(&url, "");
    cfg.create_publication = false;
    cfg.create_slot = false;
    let err = PostgresSource::prepare(cfg.clone(), rules.clone())
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("CREATE PUBLICATION \"walhook\" FOR TABLE \"public\".\"invoices\", \"public\".\"orders\""), "{err}");
    cfg.create_publication = true;
    let err = PostgresSource::prepare(cfg, rules)
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("pg_create_logical_replication_slot('walhook', 'pgoutput')"),
        "{err}"
    );
}

#[tokio::test]
async fn wal_level_below_logical_is_refused() {
    let pg = LocalPostgres::builder()
        .setting("wal_level", "replica")
        .setting("max_wal_senders", "2")
        .start()
        .await
        .unwrap();
    let (url, _db) = setup(&pg, "level").await;
    let (cfg, rules) = config(&url, "");
    let err = PostgresSource::prepare(cfg, rules)
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("wal_level = replica") && err.contains("ALTER SYSTEM SET wal_level = logical"),
        "{err}"
    );
}

async fn burn_wal(db: &tokio_postgres::Client, segments: usize) {
    for i in 0..segments {
        db.batch_execute(&format!(
            "INSERT INTO orders VALUES ({}, 'x', 'y')",
            100_000 + i
        ))
        .await
        .unwrap();
        db.batch_execute("SELECT pg_switch_wal()").await.unwrap();
    }
    db.batch_execute("CHECKPOINT").await.unwrap();
}

#[tokio::test]
async fn an_invalidated_slot_halts_capture_with_a_definite_error() {
    let pg = LocalPostgres::builder()
        .setting("max_slot_wal_keep_size", "'1MB'")
        .start()
        .await
        .unwrap();
    let (url, db) = setup(&pg, "lost").await;
    let (cfg, rules) = config(&url, "");
    let source = PostgresSource::prepare(cfg.clone(), rules.clone())
        .await
        .unwrap();
    // Capture runs but never confirms, so the slot keeps old WAL.
    let run = tokio::spawn(async move {
        source
            .run(
                Collect::default(),
                Arc::new(Incidents::default()),
                RunOptions {
                    confirm: false,
                    stop_when_caught_up: false,
                },
                CancellationToken::new(),
            )
            .await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    burn_wal(&db, 6).await;
    let result = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("capture kept running on a lost slot")
        .unwrap();
    match result {
        Err(CaptureError::SlotLost(msg)) => {
            assert!(
                msg.contains("is lost") && msg.contains("pg_drop_replication_slot('walhook')"),
                "{msg}"
            );
        }
        other => panic!("expected SlotLost, got {other:?}"),
    }
    // And a restart refuses to start.
    let err = PostgresSource::prepare(cfg, rules)
        .await
        .err()
        .expect("started on a lost slot");
    assert!(matches!(err, CaptureError::SlotLost(_)), "{err}");
}

#[tokio::test]
async fn heartbeats_advance_the_slot_while_the_captured_database_is_idle() {
    let pg = LocalPostgres::start().await.unwrap();
    let (url, db) = setup(&pg, "idle").await;
    pg.create_database("busy").await.unwrap();
    let busy = pg.connect("busy").await.unwrap();
    busy.batch_execute("CREATE TABLE noise (n int)")
        .await
        .unwrap();
    let (cfg, rules) = config(&url, "");
    let source = PostgresSource::prepare(cfg, rules).await.unwrap();
    let start: String = db
        .query_one(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let start: Lsn = start.parse().unwrap();
    let stop = CancellationToken::new();
    let stopper = stop.clone();
    let run = tokio::spawn(async move {
        source
            .run(
                Collect::default(),
                Arc::new(Incidents::default()),
                RunOptions {
                    confirm: true,
                    stop_when_caught_up: false,
                },
                stopper,
            )
            .await
    });
    busy.batch_execute("INSERT INTO noise SELECT generate_series(1, 200000)")
        .await
        .unwrap();
    let busy_end: String = busy
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .unwrap()
        .get(0);
    let busy_end: Lsn = busy_end.parse().unwrap();
    let mut advanced = false;
    for _ in 0..100 {
        let now: String = db
            .query_one(
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if now.parse::<Lsn>().unwrap() >= busy_end {
            advanced = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.cancel();
    run.await.unwrap().unwrap();
    assert!(
        advanced,
        "the slot stayed near {start} while another database wrote up to {busy_end}"
    );
}

/// A sink that holds every transaction until released.
#[derive(Clone)]
struct Gate {
    open: Arc<tokio::sync::Semaphore>,
    inner: Collect,
}

impl TransactionSink for Gate {
    async fn hand_off(&mut self, tx: CapturedTransaction) -> Result<Receipt, SinkError> {
        let permit = self.open.acquire().await.map_err(|_| SinkError::Closed)?;
        permit.forget();
        self.inner.hand_off(tx).await
    }
}

#[tokio::test]
async fn keepalives_are_answered_while_the_sink_applies_back_pressure() {
    let pg = LocalPostgres::builder()
        .setting("wal_sender_timeout", "'2s'")
        .start()
        .await
        .unwrap();
    let (url, db) = setup(&pg, "pressure").await;
    let (cfg, rules) = config(&url, "");
    let source = PostgresSource::prepare(cfg, rules).await.unwrap();
    let gate = Gate {
        open: Arc::new(tokio::sync::Semaphore::new(0)),
        inner: Collect::default(),
    };
    let run = {
        let gate = gate.clone();
        tokio::spawn(async move {
            source
                .run(
                    gate,
                    Arc::new(Incidents::default()),
                    RunOptions {
                        confirm: true,
                        stop_when_caught_up: false,
                    },
                    CancellationToken::new(),
                )
                .await
        })
    };
    db.batch_execute("INSERT INTO orders SELECT g, 'acme', 'new' FROM generate_series(1, 5) g")
        .await
        .unwrap();
    for i in 0..5 {
        db.batch_execute(&format!(
            "INSERT INTO orders VALUES ({}, 'acme', 'later')",
            100 + i
        ))
        .await
        .unwrap();
    }
    // Hold the sink shut for three wal_sender_timeouts.
    let mut pid_before: Option<i32> = None;
    for _ in 0..50 {
        pid_before = db
            .query_one("SELECT active_pid FROM pg_replication_slots", &[])
            .await
            .unwrap()
            .get(0);
        if pid_before.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(
        !run.is_finished(),
        "capture ended while the sink held back: {:?}",
        run.await
    );
    let pid_after: Option<i32> = db
        .query_one("SELECT active_pid FROM pg_replication_slots", &[])
        .await
        .unwrap()
        .get(0);
    assert!(pid_before.is_some());
    assert_eq!(
        pid_before, pid_after,
        "the walsender was replaced: the server timed the session out"
    );
    gate.open.add_permits(1000);
    let mut all = 0;
    for _ in 0..100 {
        all = gate.inner.events().len();
        if all == 10 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(all, 10);
    run.abort();
}

/// Domains are written as their base type, arrays of domains and of enums as
/// JSON arrays, also for a domain created while the stream runs.
#[tokio::test]
async fn domains_and_arrays_are_written_as_their_base_types() {
    let pg = LocalPostgres::start().await.unwrap();
    let (url, db) = setup(&pg, "domains").await;
    db.batch_execute(
        "CREATE DOMAIN money2 AS numeric(12,2) CHECK (VALUE >= 0);
         CREATE DOMAIN price AS money2;
         CREATE DOMAIN stamp AS timestamptz;
         CREATE DOMAIN doc AS jsonb;
         CREATE TYPE mood AS ENUM ('calm', 'angry');
         CREATE TABLE items (
             id bigint PRIMARY KEY,
             tenant_id text NOT NULL,
             amount money2,
             net price,
             amounts money2[],
             seen_at stamp,
             extra doc,
             mood mood,
             moods mood[],
             refs uuid[]
         );",
    )
    .await
    .unwrap();
    let (cfg, _) = config(&url, "");
    let rules = rules_from(
        r#"
[[rules]]
name = "item_changed"
table = "public.items"
operations = ["insert"]
event_type = "item.changed"
tenant_column = "tenant_id"
object_id_column = "id"
"#,
    );
    let source = PostgresSource::prepare(cfg, rules).await.unwrap();
    let sink = Collect::default();
    let shutdown = CancellationToken::new();
    let run = {
        let (sink, shutdown) = (sink.clone(), shutdown.clone());
        tokio::spawn(async move {
            source
                .run(
                    sink,
                    Arc::new(Incidents::default()),
                    RunOptions {
                        confirm: true,
                        stop_when_caught_up: false,
                    },
                    shutdown,
                )
                .await
        })
    };
    db.batch_execute(
        "INSERT INTO items VALUES (1, 'acme', 12.5, 3, '{1.25,NULL,7}', '2026-01-02 03:04:05.5+01', \
         '{\"a\": [1, 2]}', 'calm', '{calm,angry}', '{6f1c0f6e-8e0a-4d35-9d37-2a1b3c4d5e6f}')",
    )
    .await
    .unwrap();
    let wait_for = |n: usize| {
        let sink = sink.clone();
        async move {
            for _ in 0..300 {
                if sink.events().len() >= n {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            panic!("capture made {} events, not {n}", sink.events().len());
        }
    };
    wait_for(1).await;
    let first = data(&sink.events()[0]);
    let raw = String::from_utf8(sink.events()[0].payload.to_vec()).unwrap();
    let row = &first["data"];
    // Exact digits, as numbers: what a plain numeric(12,2) column gives.
    for exact in [
        r#""amount":12.50"#,
        r#""net":3.00"#,
        r#""amounts":[1.25,null,7.00]"#,
    ] {
        assert!(raw.contains(exact), "{exact} not in {raw}");
    }
    assert_eq!(row["seen_at"], "2026-01-02T02:04:05.5Z", "{first}");
    assert_eq!(row["extra"], serde_json::json!({"a": [1, 2]}), "{first}");
    assert_eq!(row["mood"], "calm", "{first}");
    assert_eq!(
        row["moods"],
        serde_json::json!(["calm", "angry"]),
        "{first}"
    );
    assert_eq!(
        row["refs"],
        serde_json::json!(["6f1c0f6e-8e0a-4d35-9d37-2a1b3c4d5e6f"]),
        "{first}"
    );

    // A domain the running stream has never seen.
    db.batch_execute(
        "CREATE DOMAIN qty AS int4 CHECK (VALUE > 0);
         ALTER TABLE items ADD COLUMN qty qty, ADD COLUMN qtys qty[];
         INSERT INTO items (id, tenant_id, qty, qtys) VALUES (2, 'acme', 4, '{1,2}');",
    )
    .await
    .unwrap();
    wait_for(2).await;
    let second = data(&sink.events()[1]);
    let row = &second["data"];
    assert_eq!(row["qty"], serde_json::json!(4), "{second}");
    assert_eq!(row["qtys"], serde_json::json!([1, 2]), "{second}");
    shutdown.cancel();
    run.await.unwrap().unwrap();
}

/// A rule on a partitioned table sees the changes of every partition, under
/// the parent's name (the publication publishes through the root).
#[tokio::test]
async fn a_partitioned_table_is_captured_under_its_own_name() {
    let pg = LocalPostgres::start().await.unwrap();
    let (url, db) = setup(&pg, "partitioned").await;
    db.batch_execute(
        "CREATE TABLE shipments (id bigint, tenant_id text NOT NULL, region text NOT NULL, \
           PRIMARY KEY (id, region)) PARTITION BY LIST (region);
         CREATE TABLE shipments_eu PARTITION OF shipments FOR VALUES IN ('eu');
         CREATE TABLE shipments_us PARTITION OF shipments FOR VALUES IN ('us');",
    )
    .await
    .unwrap();
    let (cfg, _) = config(&url, "");
    let rules = rules_from(
        r#"
[[rules]]
name = "shipment_created"
table = "public.shipments"
operations = ["insert"]
event_type = "shipment.created"
tenant_column = "tenant_id"
object_id_column = "id"
"#,
    );
    let source = PostgresSource::prepare(cfg.clone(), rules.clone())
        .await
        .unwrap();
    db.batch_execute(
        "INSERT INTO shipments VALUES (1, 'acme', 'eu'), (2, 'acme', 'us');
         CREATE TABLE shipments_ap PARTITION OF shipments FOR VALUES IN ('ap');
         INSERT INTO shipments VALUES (3, 'acme', 'ap');",
    )
    .await
    .unwrap();
    let got = catch_up(&source, true).await;
    let ids: Vec<String> = got
        .events()
        .iter()
        .map(|e| data(e)["data"]["id"].to_string())
        .collect();
    assert_eq!(
        ids,
        vec!["1", "2", "3"],
        "every partition's rows, in commit order"
    );
    // Preparing again finds the publication as it should be.
    PostgresSource::prepare(cfg.clone(), rules.clone())
        .await
        .unwrap();

    // A rule naming a partition is refused, naming the table to use.
    let mut on_partition = rules.clone();
    on_partition[0].table = Some("public.shipments_eu".into());
    let Err(err) = PostgresSource::prepare(cfg.clone(), on_partition).await else {
        panic!("a rule naming a partition was accepted");
    };
    let err = err.to_string();
    assert!(
        err.contains("is a partition of public.shipments") && err.contains("must name"),
        "{err}"
    );
    // A publication made by hand that publishes partitions under their own
    // names is refused with the statement that fixes it.
    db.batch_execute(
        "CREATE PUBLICATION by_leaf FOR TABLE shipments WITH (publish_via_partition_root = false)",
    )
    .await
    .unwrap();
    let mut by_leaf = cfg.clone();
    by_leaf.publication = "by_leaf".into();
    by_leaf.create_publication = false;
    by_leaf.slot = "by_leaf_slot".into();
    let Err(err) = PostgresSource::prepare(by_leaf, rules).await else {
        panic!("a publication that misses the partitions' rows was accepted");
    };
    let err = err.to_string();
    assert!(
        err.contains("SET (publish_via_partition_root = true)"),
        "{err}"
    );
}

/// Outbox and message rules may declare a JSON Schema per event type: a
/// payload that matches becomes an event, one that does not is an incident
/// naming the file and where it failed; a schema file that cannot be used
/// stops nothing but the start, naming the rule and the file.
#[tokio::test]
async fn declared_schemas_turn_mismatching_payloads_into_incidents() {
    let pg = LocalPostgres::start().await.unwrap();
    let (url, db) = setup(&pg, "declared").await;
    db.batch_execute(
        "CREATE TABLE outbox (id bigserial PRIMARY KEY, tenant_id text NOT NULL, \
         event_type text NOT NULL, payload jsonb NOT NULL)",
    )
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let shipped = dir.path().join("order-shipped.json");
    std::fs::write(
        &shipped,
        r#"{"type": "object", "required": ["carrier", "parcels"],
            "properties": {"carrier": {"type": "string"}, "parcels": {"type": "integer", "minimum": 1}}}"#,
    )
    .unwrap();
    let voided = dir.path().join("invoice-voided.json");
    std::fs::write(&voided, r#"{"type": "object", "required": ["id"]}"#).unwrap();
    let text = format!(
        r#"
[[rules]]
name = "outbox"
kind = "outbox"
table = "public.outbox"
type_column = "event_type"
payload_column = "payload"
tenant_column = "tenant_id"
schema_files = {{ "order.shipped" = "{}" }}

[[rules]]
name = "app_messages"
kind = "message"
prefix = "app"
schema_files = {{ "invoice.voided" = "{}" }}
"#,
        shipped.display(),
        voided.display()
    );
    let (cfg, _) = config(&url, "");
    let source = PostgresSource::prepare(cfg.clone(), rules_from(&text))
        .await
        .unwrap();
    db.batch_execute(
        "INSERT INTO outbox (tenant_id, event_type, payload) VALUES \
           ('acme', 'order.shipped', '{\"carrier\": \"ups\", \"parcels\": 2}'), \
           ('acme', 'order.shipped', '{\"carrier\": \"ups\", \"parcels\": \"two\"}'), \
           ('acme', 'order.returned', '{\"anything\": true}'); \
         SELECT pg_logical_emit_message(true, 'app', \
           '{\"type\": \"invoice.voided\", \"tenant_id\": \"acme\", \"data\": {\"id\": 7}}'); \
         SELECT pg_logical_emit_message(true, 'app', \
           '{\"type\": \"invoice.voided\", \"tenant_id\": \"acme\", \"data\": {\"reason\": \"dup\"}}');",
    )
    .await
    .unwrap();
    let (sink, observer) = catch_up_with_incidents(&source, false).await;
    let types: Vec<String> = sink
        .events()
        .iter()
        .map(|e| e.event_type.to_string())
        .collect();
    assert_eq!(
        types,
        ["order.shipped", "order.returned", "invoice.voided"],
        "a type without a declared schema passes; mismatches are no events"
    );
    let incidents = observer.0.lock().clone();
    let details: Vec<(IncidentKind, &str)> = incidents
        .iter()
        .map(|i| (i.kind, i.detail.as_str()))
        .collect();
    assert_eq!(incidents.len(), 2, "{details:?}");
    assert_eq!(incidents[0].kind, IncidentKind::InvalidRow);
    assert!(
        incidents[0].detail.contains("order-shipped.json")
            && incidents[0].detail.contains("/parcels"),
        "{details:?}"
    );
    assert_eq!(incidents[1].kind, IncidentKind::InvalidMessage);
    assert!(
        incidents[1].detail.contains("invoice-voided.json"),
        "{details:?}"
    );

    // Unusable schema files are refused at start, naming rule and file.
    std::fs::write(&voided, "{not json").unwrap();
    let Err(err) = PostgresSource::prepare(cfg.clone(), rules_from(&text)).await else {
        panic!("a schema file that is not JSON was accepted");
    };
    let err = err.to_string();
    assert!(
        err.contains("app_messages")
            && err.contains("schema_files")
            && err.contains("invoice-voided.json"),
        "{err}"
    );
    let table_rule = r#"
[[rules]]
name = "orders"
table = "public.orders"
event_type = "order.changed"
tenant_column = "tenant_id"
schema_files = { "order.changed" = "x.json" }
"#;
    let Err(err) = PostgresSource::prepare(cfg, rules_from(table_rule)).await else {
        panic!("schema_files on a table rule was accepted");
    };
    assert!(
        err.to_string().contains("derived from their columns"),
        "{err}"
    );
}
