//! `walhook bench capture`.
//!
//! Loads N committed changes into a throwaway Postgres (single-row
//! transactions, then 100-row transactions), then in the same run drains them
//! twice from two slots: once with `pg_recvlogical` to /dev/null (the floor:
//! the server's own decoding and the wire), once with walhook's capture
//! (decode, match rules, canonical JSON, SHA-256, hand-off to a sink that
//! counts). The ratio of the two rates says what capture adds.

use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::{Context, bail};
use tokio_util::sync::CancellationToken;
use walhook_connectors::postgres::LogObserver;
use walhook_connectors::postgres::{PostgresSource, RuleConfig, RunOptions, SourceConfig};
use walhook_devkit::postgres::LocalPostgres;
use walhook_pipeline::capture::{CapturedTransaction, SinkError, TransactionSink};
use walhook_pipeline::log::Receipt;

/// Arguments of `walhook bench capture`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Changes committed one per transaction.
    #[arg(long, default_value_t = 20_000)]
    pub single: u64,
    /// Changes committed 100 per transaction.
    #[arg(long, default_value_t = 200_000)]
    pub batched: u64,
    /// Print only the JSON result.
    #[arg(long)]
    pub json: bool,
}

/// Counts events and drops them.
#[derive(Clone, Default)]
struct CountingSink(Arc<AtomicU64>);

impl TransactionSink for CountingSink {
    async fn hand_off(&mut self, tx: CapturedTransaction) -> Result<Receipt, SinkError> {
        self.0.fetch_add(tx.events.len() as u64, Ordering::Relaxed);
        Ok(Receipt::ready())
    }
}

const RULES: &str = r#"
[[rules]]
name = "order_created"
table = "orders"
operations = ["insert"]
event_type = "order.created"
tenant_column = "tenant_id"
object_id_column = "id"
object_version = "lsn"
"#;

#[derive(serde::Deserialize)]
struct Rules {
    rules: Vec<RuleConfig>,
}

/// Runs the benchmark.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let pg = LocalPostgres::start().await?;
    let url = pg.create_database("bench").await?;
    let db = pg.connect("bench").await?;
    db.batch_execute(
        "CREATE TABLE orders (id bigint PRIMARY KEY, tenant_id text NOT NULL, status text NOT NULL,
                              total numeric(12,2) NOT NULL, placed_at timestamptz NOT NULL DEFAULT now(),
                              tags text[] NOT NULL DEFAULT '{}', meta jsonb NOT NULL DEFAULT '{}')",
    )
    .await?;
    let source_cfg: SourceConfig = toml::from_str(&format!(
        "url = \"{url}\"\ncreate_slot = true\ncreate_publication = true\nheartbeat_interval = \"1h\""
    ))?;
    let rules: Rules = toml::from_str(RULES)?;
    let source = PostgresSource::prepare(source_cfg, rules.rules).await?;
    db.batch_execute("SELECT pg_create_logical_replication_slot('recvlogical', 'pgoutput')")
        .await?;

    let total = args.single + args.batched;
    let bar = progress_if(!args.json, total, "committing changes");
    let insert = "INSERT INTO orders (id, tenant_id, status, total, tags, meta) \
                  SELECT g, 'tenant-' || (g % 50), 'placed', (g % 1000) + 0.99, '{a,b}', \
                  jsonb_build_object('channel', 'web', 'items', g % 7) FROM generate_series($1::int8, $2::int8) g";
    let load_start = Instant::now();
    for i in 0..args.single {
        let id = i as i64;
        db.execute(insert, &[&id, &id]).await?;
        bar.inc(1);
    }
    let mut next = args.single as i64;
    let end = total as i64;
    while next < end {
        let last = (next + 99).min(end - 1);
        db.execute(insert, &[&next, &last]).await?;
        bar.inc((last - next + 1) as u64);
        next = last + 1;
    }
    bar.finish_and_clear();
    let load_secs = load_start.elapsed().as_secs_f64();
    let end_lsn: String = db
        .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
        .await?
        .get(0);
    // Something past the end position, so that both readers notice it.
    db.batch_execute("SELECT pg_logical_emit_message(false, 'bench.end', '')")
        .await?;

    // pg_recvlogical: decoding plus the wire, output discarded.
    let recv_start = Instant::now();
    let status = Command::new(pg.bin_dir().join("pg_recvlogical"))
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &pg.port().to_string(),
            "-U",
            "postgres",
            "-d",
            "bench",
        ])
        .args([
            "--slot",
            "recvlogical",
            "--start",
            "--no-loop",
            "-f",
            "/dev/null",
        ])
        .args(["-o", "proto_version=1", "-o", "publication_names=walhook"])
        .arg(format!("--endpos={end_lsn}"))
        .stdout(Stdio::null())
        .status()
        .context("cannot run pg_recvlogical")?;
    if !status.success() {
        bail!("pg_recvlogical failed: {status}");
    }
    let recv_secs = recv_start.elapsed().as_secs_f64();

    // walhook capture.
    let sink = CountingSink::default();
    let capture_start = Instant::now();
    let stats = source
        .run(
            sink.clone(),
            Arc::new(LogObserver),
            RunOptions {
                confirm: true,
                stop_when_caught_up: true,
            },
            CancellationToken::new(),
        )
        .await?;
    let capture_secs = capture_start.elapsed().as_secs_f64();
    let events = sink.0.load(Ordering::Relaxed);
    if events != total {
        bail!("capture handed on {events} events for {total} changes");
    }
    let capture_rate = events as f64 / capture_secs;
    let recv_rate = total as f64 / recv_secs;
    let result = serde_json::json!({
        "scenario": "capture",
        "changes": total,
        "single_row_transactions": args.single,
        "hundred_row_transactions": args.batched / 100,
        "load_seconds": load_secs,
        "capture": { "seconds": capture_secs, "events_per_second": capture_rate, "transactions": stats.transactions },
        "pg_recvlogical": { "seconds": recv_secs, "changes_per_second": recv_rate },
        "ratio_capture_to_pg_recvlogical": capture_rate / recv_rate,
    });
    if !args.json {
        println!(
            "capture benchmark: {total} changes ({} single-row transactions, {} of 100 rows)",
            args.single,
            args.batched / 100
        );
        println!("  {:<28} {:>12} {:>14}", "reader", "seconds", "changes/s");
        println!(
            "  {:<28} {:>12.2} {:>14.0}",
            "pg_recvlogical > /dev/null", recv_secs, recv_rate
        );
        println!(
            "  {:<28} {:>12.2} {:>14.0}",
            "walhook capture", capture_secs, capture_rate
        );
        println!(
            "  ratio capture / pg_recvlogical: {:.2}",
            capture_rate / recv_rate
        );
    }
    println!("{}", serde_json::to_string(&result)?);
    Ok(ExitCode::SUCCESS)
}

fn progress_if(show: bool, len: u64, what: &str) -> indicatif::ProgressBar {
    if show {
        walhook_cli::progress::bar(len, what)
    } else {
        indicatif::ProgressBar::hidden()
    }
}
