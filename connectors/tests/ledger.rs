//! The capture ledger under real capture: what each rule did, per minute of
//! commit time, counted once however often the slot sends a transaction.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use walhook_connectors::postgres::{PostgresSource, RunOptions};
use walhook_devkit::postgres::LocalPostgres;
use walhook_pipeline::capture::ledger::{LedgerSnapshot, PartKey};
use walhook_pipeline::capture::{
    CapturedTransaction, LedgerSink, RuleTally, SinkError, TransactionSink,
};
use walhook_pipeline::event::Event;
use walhook_pipeline::ids::Lsn;
use walhook_pipeline::log::{LogError, Receipt};
use walhook_pipeline::time::Timestamp;
use walhook_sql::Platform;

use crate::capture::{Collect, Incidents, Rules, config, setup};

/// A source database and a migrated platform database on one cluster.
struct World {
    _pg: LocalPostgres,
    db: tokio_postgres::Client,
    platform: Arc<Platform>,
    url: String,
}

async fn world(name: &str) -> World {
    let pg = LocalPostgres::start().await.unwrap();
    let (url, db) = setup(&pg, name).await;
    let platform_url = pg.create_database("platform").await.unwrap();
    let mut sql = pg.connect("platform").await.unwrap();
    walhook_sql::migrate::run(&mut sql).await.unwrap();
    let platform = Arc::new(Platform::new(&platform_url, 4).unwrap());
    World {
        _pg: pg,
        db,
        platform,
        url,
    }
}

/// Runs capture until it caught up, handing off through a [`LedgerSink`]
/// in front of `inner`.
async fn capture<S: TransactionSink + 'static>(
    source: &PostgresSource,
    platform: &Arc<Platform>,
    inner: S,
    confirm: bool,
) {
    let sink = LedgerSink::new(inner, platform.clone());
    let run = source.run(
        sink,
        Arc::new(Incidents::default()),
        RunOptions {
            confirm,
            stop_when_caught_up: true,
        },
        CancellationToken::new(),
    );
    // A run may end with an error when a test fails a receipt on purpose.
    let _ = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("capture did not catch up");
}

async fn ledger(platform: &Platform) -> LedgerSnapshot {
    platform.capture_ledger("main").await.unwrap()
}

/// The rule that made an event (the event types of the test rules).
fn rule_of(e: &Event) -> &'static str {
    match e.event_type.as_str() {
        "invoice.created" => "invoice_created",
        "invoice.paid" => "invoice_paid",
        "invoice.deleted" => "invoice_deleted",
        "invoice.voided" => "app_messages",
        _ => "order_changed",
    }
}

/// Events per (rule, minute of commit time).
fn events_per_window(events: &[Event]) -> BTreeMap<(String, Timestamp), u64> {
    let mut out = BTreeMap::new();
    for e in events {
        *out.entry((rule_of(e).to_owned(), e.occurred_at.minute_start()))
            .or_default() += 1;
    }
    out
}

/// The ledger's events per (rule, window), rows without events left out.
fn ledger_events(snap: &LedgerSnapshot) -> BTreeMap<(String, Timestamp), u64> {
    snap.rows
        .iter()
        .filter(|r| r.events > 0)
        .map(|r| ((r.rule.clone(), r.window), r.events))
        .collect()
}

/// Per rule, summed over windows: (changes, events, filtered, incidents).
fn totals(snap: &LedgerSnapshot) -> BTreeMap<String, (u64, u64, u64, u64)> {
    let mut out: BTreeMap<String, (u64, u64, u64, u64)> = BTreeMap::new();
    for r in &snap.rows {
        let t = out.entry(r.rule.clone()).or_default();
        t.0 += r.changes;
        t.1 += r.events;
        t.2 += r.filtered;
        t.3 += r.incidents;
    }
    out
}

#[tokio::test]
async fn the_ledger_counts_what_each_rule_did_per_minute_of_commit_time() {
    let w = world("ledger").await;
    w.db.batch_execute("ALTER TABLE orders ALTER COLUMN tenant_id DROP NOT NULL")
        .await
        .unwrap();
    let (cfg, mut rules) = config(&w.url, "max_event_bytes = 1024");
    let messages: Rules = toml::from_str(
        r#"
[[rules]]
name = "app_messages"
kind = "message"
prefix = "app"
"#,
    )
    .unwrap();
    rules.extend(messages.rules);
    let source = PostgresSource::prepare(cfg, rules).await.unwrap();
    let voided = r#"{"type": "invoice.voided", "tenant_id": "acme", "data": {"id": 1}}"#;
    for sql in [
        // Each invoice change is looked at by the three invoice rules.
        "INSERT INTO invoices (id, tenant_id, status, amount) VALUES (1, 'acme', 'open', 1)"
            .to_owned(),
        "UPDATE invoices SET status = 'paid' WHERE id = 1".to_owned(),
        // Already paid: the condition leaves it out.
        "UPDATE invoices SET amount = 2 WHERE id = 1".to_owned(),
        "DELETE FROM invoices WHERE id = 1".to_owned(),
        // A null tenant, an envelope over 1024 bytes, values over 1024
        // bytes: three incidents of order_changed; then one event.
        "INSERT INTO orders VALUES (1, NULL, 'new')".to_owned(),
        "INSERT INTO orders VALUES (2, 'acme', repeat('x', 900))".to_owned(),
        "INSERT INTO orders VALUES (3, 'acme', repeat('y', 2000))".to_owned(),
        "INSERT INTO orders VALUES (4, 'acme', 'new')".to_owned(),
        // A good and a bad transactional message in one transaction.
        format!(
            "BEGIN; SELECT pg_logical_emit_message(true, 'app', '{voided}'); \
             SELECT pg_logical_emit_message(true, 'app', 'not json'); COMMIT;"
        ),
        // Not transactional: an incident with no commit, not in the ledger.
        format!("SELECT pg_logical_emit_message(false, 'app', '{voided}')"),
    ] {
        w.db.batch_execute(&sql).await.unwrap();
    }
    let collected = Collect::default();
    capture(&source, &w.platform, collected.clone(), true).await;
    let snap = ledger(&w.platform).await;
    let tally = |c, e, f, i| (c, e, f, i);
    assert_eq!(
        totals(&snap),
        BTreeMap::from([
            // The source's own row: each change and transactional message
            // once (2 + 4 invoice + 4 order), however many rules read it.
            ("*".to_owned(), tally(10, 0, 0, 0)),
            ("app_messages".to_owned(), tally(2, 1, 0, 1)),
            ("invoice_created".to_owned(), tally(4, 1, 3, 0)),
            ("invoice_deleted".to_owned(), tally(4, 1, 3, 0)),
            ("invoice_paid".to_owned(), tally(4, 1, 3, 0)),
            ("order_changed".to_owned(), tally(4, 1, 0, 3)),
        ])
    );
    // Events per (rule, minute of commit time) are the events made.
    let events = collected.events();
    assert_eq!(events.len(), 5);
    assert_eq!(ledger_events(&snap), events_per_window(&events));
    for r in &snap.rows {
        assert_eq!(r.window, r.window.minute_start(), "{r:?}");
        if r.rule != "*" {
            assert_eq!(r.changes, r.events + r.filtered + r.incidents, "{r:?}");
        }
        // first/last are the commit LSNs of the first and last transaction
        // in which the rule looked at a change in that minute.
        let lsns: Vec<Lsn> = collected
            .txs
            .lock()
            .iter()
            .filter(|t| {
                t.commit_time.minute_start() == r.window
                    && t.ledger.iter().any(|l| r.rule == "*" || *l.rule == *r.rule)
            })
            .map(|t| t.commit_lsn)
            .collect();
        assert_eq!(r.first_commit_lsn, *lsns.iter().min().unwrap(), "{r:?}");
        assert_eq!(r.last_commit_lsn, *lsns.iter().max().unwrap(), "{r:?}");
        for e in events.iter().filter(|e| rule_of(e) == r.rule) {
            if e.occurred_at.minute_start() == r.window {
                assert!(
                    (r.first_commit_lsn..=r.last_commit_lsn).contains(&e.key.commit_lsn),
                    "{r:?} does not bound {}",
                    e.key.commit_lsn
                );
            }
        }
    }
    // The mark is the last transaction counted.
    let last = collected
        .txs
        .lock()
        .iter()
        .filter(|t| !t.ledger.is_empty())
        .map(|t| t.commit_lsn)
        .max()
        .unwrap();
    assert_eq!(
        snap.mark,
        Some(PartKey {
            commit_lsn: last,
            part: 0
        })
    );
}

#[tokio::test]
async fn reading_the_slot_again_counts_nothing_twice() {
    let w = world("again").await;
    let (cfg, rules) = config(&w.url, "");
    let source = PostgresSource::prepare(cfg, rules).await.unwrap();
    w.db.batch_execute(
        "INSERT INTO invoices (id, tenant_id, status, amount) SELECT g, 't' || (g % 3), 'open', g FROM generate_series(1, 50) g",
    )
    .await
    .unwrap();
    w.db.batch_execute("UPDATE invoices SET status = 'paid' WHERE id % 2 = 0")
        .await
        .unwrap();
    w.db.batch_execute("INSERT INTO orders VALUES (1, 'acme', 'new')")
        .await
        .unwrap();
    // Read without confirming: the slot sends everything again.
    let first = Collect::default();
    capture(&source, &w.platform, first.clone(), false).await;
    let once = ledger(&w.platform).await;
    // 50 inserts and 25 updates.
    assert_eq!(totals(&once)["invoice_created"], (75, 50, 25, 0));
    assert_eq!(totals(&once)["invoice_paid"], (75, 25, 50, 0));
    let second = Collect::default();
    capture(&source, &w.platform, second.clone(), false).await;
    assert_eq!(
        second.events(),
        first.events(),
        "the slot did not send the same transactions again"
    );
    assert_eq!(ledger(&w.platform).await, once, "a re-read was counted");
    // Confirming reads them a third time, still counted once.
    capture(&source, &w.platform, Collect::default(), true).await;
    assert_eq!(ledger(&w.platform).await, once);
    // What commits next is counted.
    w.db.batch_execute("INSERT INTO orders VALUES (2, 'acme', 'new')")
        .await
        .unwrap();
    capture(&source, &w.platform, Collect::default(), true).await;
    assert_eq!(
        totals(&ledger(&w.platform).await)["order_changed"],
        (2, 2, 0, 0)
    );
}

/// Fails the receipt of one part of every transaction it sees (the events
/// of that part never became durable).
#[derive(Clone)]
struct FailPart {
    part: u32,
    inner: Collect,
}

impl TransactionSink for FailPart {
    async fn hand_off(&mut self, tx: CapturedTransaction) -> Result<Receipt, SinkError> {
        let fail = tx.part == self.part;
        let receipt = self.inner.hand_off(tx).await?;
        if fail {
            return Ok(Receipt::new(async { Err(LogError::Closed) }));
        }
        Ok(receipt)
    }
}

#[tokio::test]
async fn a_chunked_transaction_read_again_after_a_failure_is_counted_once_and_completely() {
    let w = world("chunks").await;
    let (cfg, rules) = config(&w.url, "");
    let source = PostgresSource::prepare(cfg, rules).await.unwrap();
    w.db.batch_execute(
        "INSERT INTO orders SELECT g, 'acme', 'new' FROM generate_series(1, 10000) g",
    )
    .await
    .unwrap();
    w.db.batch_execute("INSERT INTO orders VALUES (20000, 'acme', 'after')")
        .await
        .unwrap();
    // The second chunk's events are not made durable: the first chunk is
    // counted, nothing after it, and the slot stays before the transaction.
    let failing = FailPart {
        part: 1,
        inner: Collect::default(),
    };
    capture(&source, &w.platform, failing.clone(), true).await;
    let big = failing.inner.txs.lock()[0].commit_lsn;
    let parts: Vec<u32> = failing.inner.txs.lock().iter().map(|t| t.part).collect();
    assert_eq!(parts[..2], [0, 1], "the transaction was not chunked");
    let partial = ledger(&w.platform).await;
    assert_eq!(totals(&partial)["order_changed"], (4096, 4096, 0, 0));
    assert_eq!(
        partial.mark,
        Some(PartKey {
            commit_lsn: big,
            part: 0
        })
    );
    let confirmed: String =
        w.db.query_one(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        confirmed.parse::<Lsn>().unwrap() <= big,
        "the slot moved past a failed part"
    );

    // Read again: the first chunk is left out, the rest counted once.
    let again = Collect::default();
    capture(&source, &w.platform, again.clone(), true).await;
    let parts: Vec<(Lsn, u32)> = again
        .txs
        .lock()
        .iter()
        .map(|t| (t.commit_lsn, t.part))
        .collect();
    assert_eq!(parts[..3], [(big, 0), (big, 1), (big, 2)]);
    let chunks: Vec<u32> = again
        .txs
        .lock()
        .iter()
        .take(3)
        .map(|t| t.ledger.iter().map(|l: &RuleTally| l.events).sum())
        .collect();
    assert_eq!(chunks, [4096, 4096, 1808]);
    let full = ledger(&w.platform).await;
    assert_eq!(totals(&full)["order_changed"], (10_001, 10_001, 0, 0));
    assert_eq!(ledger_events(&full), events_per_window(&again.events()));
    assert_eq!(full.mark.map(|m| m.part), Some(0));
    assert!(full.mark.unwrap().commit_lsn > big);
}
