//! `walhook bench cold-reads`: reads of archived history through the API,
//! with what each request took from the store.
//!
//! A 30-day archive of a million deliveries (one more day stays hot) is
//! built once (`--dir` keeps it: the store, the ids sampled, and the
//! catalog tables, loaded into a fresh Postgres on the next run). Then,
//! over HTTP to an API in this process:
//!
//! - (a) a listing that matches nothing, walked through the whole archive
//!   page by page: latency and bytes read per request, against the
//!   per-request budget;
//! - (b) lookups of archived deliveries by id (the delivery, its event and
//!   its attempts): latency and bytes per request;
//! - (c) another tenant's hot listing alone and beside `--concurrent`
//!   clients of one tenant walking the archive at once, each sending its
//!   next page as soon as it has the last (and after a 429, once its
//!   Retry-After has passed), in five alternating rounds of each: how many
//!   of theirs got 429, and the other tenant's p99 alone and beside them
//!   (the ratio in one run).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::NaiveDate;
use futures::{SinkExt, TryStreamExt};
use walhook_archive::cold::{ColdHistory, ColdLimits, CountingStore};
use walhook_archive::objstore::{AnyStore, LocalDirStore};
use walhook_archive::table::Table;
use walhook_archive::{Archiver, PartitionReport, Progress, Settings};
use walhook_devkit::history::History;
use walhook_devkit::postgres::LocalPostgres;

/// Arguments of `walhook bench cold-reads`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Archived deliveries (one per event).
    #[arg(long, default_value_t = 1_000_000)]
    pub deliveries: u64,
    /// Archived days they are spread over.
    #[arg(long, default_value_t = 30)]
    pub days: u32,
    /// Tenants (one endpoint each); tenant-0 walks the archive, tenant-1
    /// lists its hot deliveries.
    #[arg(long, default_value_t = 10)]
    pub tenants: u32,
    /// Keep the archive here, and reuse it when it is already there.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Requests measured in (a) and in (b).
    #[arg(long, default_value_t = 200)]
    pub requests: usize,
    /// Clients of one tenant listing at once in (c).
    #[arg(long, default_value_t = 64)]
    pub concurrent: usize,
    /// `[api].cold_reads_per_tenant` of the API served.
    #[arg(long, default_value_t = walhook_api::settings::DEFAULT_COLD_READS_PER_TENANT)]
    pub reads_per_tenant: usize,
    /// Length of each phase of (c).
    #[arg(long, default_value = "10s", value_parser = walhook_pipeline::duration::parse)]
    pub phase: Duration,
    /// Also measure, for comparison, as many clients of one tenant
    /// listing the first page of its hot rows (no archive read at all).
    #[arg(long)]
    pub control: bool,
    /// Print only the JSON result.
    #[arg(long)]
    pub json: bool,
}

/// The operator token of the API this bench serves.
const OPERATOR: &str = "bench-operator-token-0123456789abcdef";

/// The catalog tables kept with the archive, in the order they load.
const KEPT: &[&str] = &[
    "tenants",
    "endpoints",
    "endpoint_versions",
    "deliveries",
    "archive_partitions",
    "archive_id_ranges",
    "archive_id_exceptions",
];

/// Rounds of (c): the other tenant's listing alone, then beside the crowd.
const ROUNDS: u32 = 5;

/// Ids kept to look up.
const SAMPLED_IDS: usize = 2000;

struct Bar(indicatif::ProgressBar);

impl Progress for Bar {
    fn rows(&self, n: u64) {
        self.0.inc(n);
    }
    fn finish(&self, _report: &PartitionReport) {}
}

/// What a kept archive was built from.
#[derive(Debug, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
struct Built {
    deliveries: u64,
    days: u32,
    tenants: u32,
    first_day: NaiveDate,
}

/// Fills, archives, keeps: the archive in `dir` for `args`.
async fn build(
    pg: &LocalPostgres,
    url: &str,
    dir: &Path,
    args: &Args,
    quiet: bool,
) -> anyhow::Result<Built> {
    let sql = pg.connect("walhook").await?;
    let first_day =
        chrono::Utc::now().date_naive() - chrono::Duration::days(i64::from(args.days) + 2);
    let per_day = args.deliveries.div_ceil(u64::from(args.days.max(1)));
    let history = History {
        first_day: first_day.to_string(),
        days: args.days + 1,
        events_per_day: per_day,
        tenants: args.tenants.max(2),
        endpoints_per_tenant: 1,
        first_lsn: 0x16_0000_0000,
    };
    let bar = progress_bar(
        u64::from(history.days) * per_day,
        "deliveries written",
        quiet,
    );
    sql.batch_execute(&history.setup_sql()).await?;
    for d in 0..history.days {
        sql.batch_execute(&history.day_sql(d))
            .await
            .with_context(|| format!("filling day {d}"))?;
        bar.inc(per_day);
    }
    bar.finish_and_clear();
    sql.batch_execute("VACUUM ANALYZE walhook.events, walhook.deliveries, walhook.attempts")
        .await?;
    let hot_day = first_day + chrono::Duration::days(i64::from(args.days));
    let ids: Vec<String> = sql
        .query(
            "SELECT tenant_id || ' ' || encode(uuid_send(id), 'hex') FROM walhook.deliveries \
             WHERE created_at < $1::text::date ORDER BY md5(id::text) LIMIT $2",
            &[&hot_day.to_string(), &(SAMPLED_IDS as i64)],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    std::fs::write(dir.join("ids.txt"), ids.join("\n"))?;
    let rows: i64 = sql
        .query_one("SELECT count(*) FROM walhook.deliveries", &[])
        .await?
        .get(0);
    let bar = progress_bar(rows as u64 * 3, "rows archived", quiet);
    let progress = Bar(bar.clone());
    let (store_dir, archive_url) = (dir.join("objects"), url.to_owned());
    let reports = walhook_cli::commands::archive::on_own_thread(move || async move {
        let platform = walhook_sql::Platform::new(&archive_url, 4)?;
        let store = LocalDirStore::open(&store_dir)?;
        let settings = Settings {
            hot_days: 1,
            today: Some(hot_day + chrono::Duration::days(1)),
            ..Settings::default()
        };
        Ok(Archiver::new(platform, store, settings)
            .run(&progress)
            .await?)
    })?;
    bar.finish_and_clear();
    let archived = reports
        .iter()
        .filter(|r| r.table == Table::Deliveries && r.outcome == walhook_archive::Outcome::Archived)
        .count();
    anyhow::ensure!(
        archived == args.days as usize,
        "{archived} days of deliveries were archived, not {}: {reports:?}",
        args.days
    );
    let kept = dir.join("catalog");
    std::fs::create_dir_all(&kept)?;
    for table in KEPT {
        let stream = sql
            .copy_out(&format!("COPY walhook.{table} TO STDOUT"))
            .await?;
        let chunks: Vec<bytes::Bytes> = stream.try_collect().await?;
        std::fs::write(kept.join(format!("{table}.copy")), chunks.concat())?;
    }
    let built = Built {
        deliveries: args.deliveries,
        days: args.days,
        tenants: args.tenants,
        first_day,
    };
    std::fs::write(dir.join("bench.json"), serde_json::to_vec_pretty(&built)?)?;
    Ok(built)
}

/// Loads a kept archive's catalog tables into the fresh database.
async fn load(pg: &LocalPostgres, dir: &Path) -> anyhow::Result<()> {
    let sql = pg.connect("walhook").await?;
    for table in KEPT {
        let bytes = std::fs::read(dir.join("catalog").join(format!("{table}.copy")))
            .with_context(|| format!("the kept archive in {} lacks {table}", dir.display()))?;
        let sink = sql
            .copy_in(&format!("COPY walhook.{table} FROM STDIN"))
            .await?;
        let mut sink = std::pin::pin!(sink);
        sink.send(bytes::Bytes::from(bytes)).await?;
        sink.as_mut().finish().await?;
    }
    Ok(())
}

fn progress_bar(len: u64, what: &str, quiet: bool) -> indicatif::ProgressBar {
    if quiet {
        indicatif::ProgressBar::hidden()
    } else {
        walhook_cli::progress::bar(len, what)
    }
}

/// An API over the archive, in this process.
struct Served {
    base: String,
    http: reqwest::Client,
    /// The other tenant's client, from an address of its own (127.0.0.2):
    /// the API shares connections and request slots per client address, and
    /// another customer does not share the crowd's.
    calm_http: reqwest::Client,
    cold: Arc<walhook_api::Cold>,
    /// Stops the server when dropped.
    _stop: tokio_util::sync::DropGuard,
    _server: std::thread::JoinHandle<anyhow::Result<()>>,
}

impl Served {
    fn start(url: &str, store_dir: &Path, reads_per_tenant: usize) -> anyhow::Result<Served> {
        let limits = walhook_api::ApiLimits {
            cold_reads_per_tenant: reads_per_tenant,
            ..walhook_api::ApiLimits::default()
        };
        let options = walhook_pgtls::ConnectOptions::parse(
            &walhook_pgtls::DatabaseUrl::new(url),
            "[platform]",
            &walhook_pgtls::TlsFields::default(),
        )?;
        let platform = walhook_api::connect(&options, &limits)?
            .with_keyring(walhook_sql::Keyring::ephemeral());
        let settings = walhook_api::ApiSettings::new(
            OPERATOR,
            walhook_pipeline::url_policy::UrlPolicy::default(),
        );
        let cold = Arc::new(ColdHistory::with_limits(
            platform.clone(),
            CountingStore::new(AnyStore::Local(LocalDirStore::open(store_dir)?)),
            walhook_archive::cold::DEFAULT_REPLAY_WINDOW,
            ColdLimits {
                reads_per_tenant: limits.cold_reads_per_tenant,
                ..ColdLimits::default()
            },
        ));
        let state =
            walhook_api::ApiState::new(platform, settings, Arc::new(walhook_api::Metrics::new()))
                .with_cold(cold.clone())?;
        // The server runs on threads of its own, as it would on its own
        // machine: the clients of this bench do not share its workers.
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let base = format!("http://{}", listener.local_addr()?);
        let stop = tokio_util::sync::CancellationToken::new();
        let serve_stop = stop.clone();
        let server = std::thread::Builder::new()
            .name("walhook-bench-api".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .enable_all()
                    .build()?;
                runtime.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener)?;
                    walhook_api::serve(listener, state, serve_stop).await?;
                    Ok::<(), anyhow::Error>(())
                })
            })?;
        Ok(Served {
            base,
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(256)
                .build()?,
            calm_http: reqwest::Client::builder()
                .local_address(std::net::IpAddr::from([127, 0, 0, 2]))
                .build()?,
            cold,
            _stop: stop.drop_guard(),
            _server: server,
        })
    }

    async fn key(&self, tenant: &str) -> anyhow::Result<String> {
        let resp = self
            .http
            .post(format!("{}/v1/tenants/{tenant}/api-keys", self.base))
            .bearer_auth(OPERATOR)
            .header("content-type", "application/json")
            .body(r#"{"name":"bench"}"#)
            .send()
            .await?;
        let status = resp.status();
        let body: serde_json::Value = serde_json::from_slice(&resp.bytes().await?)?;
        anyhow::ensure!(status == 201, "creating a key of {tenant}: {status} {body}");
        Ok(body["key"].as_str().context("a key")?.to_owned())
    }

    /// GET `path`: the status, the body, the time taken.
    async fn get(&self, key: &str, path: &str) -> anyhow::Result<(u16, serde_json::Value, f64)> {
        self.get_with(&self.http, key, path).await
    }

    /// GET `path` as a well-behaved client: after a 429 (the tenant's
    /// archive reads per minute) wait its `Retry-After` and ask again. The
    /// answered request's status, body and time.
    async fn get_patiently(
        &self,
        key: &str,
        path: &str,
    ) -> anyhow::Result<(u16, serde_json::Value, f64)> {
        loop {
            let (status, body, ms) = self.get(key, path).await?;
            if status != 429 {
                return Ok((status, body, ms));
            }
            let wait = body["quota"]["retry_after_seconds"].as_u64().unwrap_or(1);
            tokio::time::sleep(Duration::from_secs(wait)).await;
        }
    }

    async fn get_with(
        &self,
        http: &reqwest::Client,
        key: &str,
        path: &str,
    ) -> anyhow::Result<(u16, serde_json::Value, f64)> {
        let started = Instant::now();
        let resp = http
            .get(format!("{}{path}", self.base))
            .bearer_auth(key)
            .send()
            .await?;
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await?;
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        Ok((
            status,
            serde_json::from_slice(&bytes).unwrap_or_default(),
            ms,
        ))
    }
}

/// The path of the next page of a listing that matches nothing.
fn nothing(cursor: Option<&str>) -> String {
    let mut path = "/v1/webhook-deliveries?event_type=no.such.type&limit=50".to_owned();
    if let Some(c) = cursor {
        path.push_str("&cursor=");
        path.push_str(c);
    }
    path
}

/// The `q` quantile of `values` (sorted in place).
fn quantile(values: &mut [f64], q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(|a, b| a.total_cmp(b));
    let i = ((values.len() as f64 - 1.0) * q).round() as usize;
    values[i.min(values.len() - 1)]
}

/// p50, p99 and max of `values`.
fn summary(mut values: Vec<f64>) -> serde_json::Value {
    let p50 = quantile(&mut values, 0.5);
    let p99 = quantile(&mut values, 0.99);
    let max = values.last().copied().unwrap_or(0.0);
    serde_json::json!({ "p50": p50, "p99": p99, "max": max, "n": values.len() })
}

/// Runs the benchmark.
pub async fn run(args: Args) -> anyhow::Result<std::process::ExitCode> {
    let quiet = args.json;
    let temp = tempfile::tempdir()?;
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| temp.path().to_path_buf());
    std::fs::create_dir_all(&dir)?;
    let pg = LocalPostgres::start().await?;
    let url = pg.create_database("walhook").await?;
    let mut sql = pg.connect("walhook").await?;
    walhook_sql::migrate::run(&mut sql).await?;
    let wanted = |b: &Built| {
        b.deliveries == args.deliveries && b.days == args.days && b.tenants == args.tenants
    };
    let kept: Option<Built> = std::fs::read(dir.join("bench.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .filter(wanted);
    let started = Instant::now();
    let built = match kept {
        Some(b) => {
            if !quiet {
                eprintln!("reusing the archive in {}", dir.display());
            }
            load(&pg, &dir).await?;
            b
        }
        None => {
            if !quiet {
                eprintln!(
                    "building an archive of {} deliveries over {} days in {} …",
                    args.deliveries,
                    args.days,
                    dir.display()
                );
            }
            build(&pg, &url, &dir, &args, quiet).await?
        }
    };
    let setup_seconds = started.elapsed().as_secs_f64();
    let archive_bytes: i64 = sql
        .query_one(
            "SELECT coalesce(sum(byte_count), 0)::int8 FROM walhook.archive_partitions",
            &[],
        )
        .await?
        .get(0);
    let archived: i64 = sql
        .query_one(
            "SELECT coalesce(sum(row_count), 0)::int8 FROM walhook.archive_partitions WHERE table_name = 'deliveries'",
            &[],
        )
        .await?
        .get(0);
    let served = Served::start(&url, &dir.join("objects"), args.reads_per_tenant)?;
    let walker = served.key("tenant-0").await?;
    let calm = served.key("tenant-1").await?;
    let limits = served.cold.limits();

    // (a) A listing that matches nothing, walked through the archive.
    let mut latency = Vec::new();
    let mut bytes = Vec::new();
    let mut walk_requests = Vec::new();
    let mut cursor: Option<String> = None;
    let mut in_walk = 0;
    let bar = progress_bar(args.requests as u64, "listings (a)", quiet);
    for _ in 0..args.requests {
        let before = served.cold.store().totals();
        let (status, body, ms) = served
            .get_patiently(&walker, &nothing(cursor.as_deref()))
            .await?;
        anyhow::ensure!(status == 200, "a listing answered {status}: {body}");
        anyhow::ensure!(
            body["data"].as_array().is_some_and(|d| d.is_empty()),
            "the listing matched something: {body}"
        );
        latency.push(ms);
        bytes.push((served.cold.store().totals().bytes - before.bytes) as f64);
        in_walk += 1;
        cursor = body["next_cursor"].as_str().map(str::to_owned);
        if cursor.is_none() {
            walk_requests.push(in_walk);
            in_walk = 0;
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    let listing = serde_json::json!({
        "latency_ms": summary(latency),
        "bytes_read": summary(bytes),
        "requests_per_walk": walk_requests.first().copied(),
        "walks": walk_requests.len(),
    });

    // (b) Lookups by id: the delivery, its event, its attempts.
    let ids: Vec<(String, String)> = std::fs::read_to_string(dir.join("ids.txt"))?
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(t, hex)| (t.to_owned(), hex.to_owned()))
        .collect();
    let mut keys = std::collections::HashMap::new();
    let mut latency = Vec::new();
    let mut bytes = Vec::new();
    let bar = progress_bar(args.requests as u64, "lookups (b)", quiet);
    for (tenant, hex) in ids.iter().take(args.requests) {
        if !keys.contains_key(tenant) {
            keys.insert(tenant.clone(), served.key(tenant).await?);
        }
        let mut raw = [0u8; 16];
        for (i, b) in raw.iter_mut().enumerate() {
            *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)?;
        }
        let id = walhook_pipeline::ids::DeliveryId(raw);
        let before = served.cold.store().totals();
        let (status, body, ms) = served
            .get_patiently(&keys[tenant], &format!("/v1/webhook-deliveries/{id}"))
            .await?;
        anyhow::ensure!(status == 200, "looking up {id} answered {status}: {body}");
        anyhow::ensure!(
            body["attempts"].as_array().is_some_and(|a| !a.is_empty()),
            "{id} came back without attempts: {body}"
        );
        latency.push(ms);
        bytes.push((served.cold.store().totals().bytes - before.bytes) as f64);
        bar.inc(1);
    }
    bar.finish_and_clear();
    let lookup = serde_json::json!({
        "latency_ms": summary(latency),
        "bytes_read": summary(bytes),
    });

    // (c) Another tenant's hot listing alone and beside the crowd.
    let served = Arc::new(served);
    let archive_crowd = crowd(&served, &walker, &calm, &args, Walk::Archive, quiet).await?;
    let control = if args.control {
        Some(crowd(&served, &walker, &calm, &args, Walk::Hot, quiet).await?)
    } else {
        None
    };
    let figures = serde_json::json!({
        "archive": {
            "deliveries": archived,
            "days": built.days,
            "tenants": built.tenants,
            "bytes": archive_bytes,
            "setup_seconds": setup_seconds,
        },
        "budget": {
            "bytes_per_request": limits.bytes_per_request,
            "days_per_request": limits.days_per_request,
            "reads_per_tenant": limits.reads_per_tenant,
        },
        "listing_matching_nothing": listing,
        "lookup_by_id": lookup,
        "crowd": archive_crowd,
        "control_crowd_listing_hot_rows": control,
    });
    if !args.json {
        let f = &figures;
        println!(
            "archive: {} deliveries over {} days, {} Parquet bytes; budget {} bytes and {} days per request, {} reads at once per tenant",
            f["archive"]["deliveries"],
            f["archive"]["days"],
            f["archive"]["bytes"],
            f["budget"]["bytes_per_request"],
            f["budget"]["days_per_request"],
            f["budget"]["reads_per_tenant"]
        );
        let l = &f["listing_matching_nothing"];
        println!(
            "(a) listing matching nothing: p50 {:.1} ms, p99 {:.1} ms; bytes read p50 {}, p99 {}, max {}; {} requests walk the archive",
            l["latency_ms"]["p50"].as_f64().unwrap_or(0.0),
            l["latency_ms"]["p99"].as_f64().unwrap_or(0.0),
            l["bytes_read"]["p50"],
            l["bytes_read"]["p99"],
            l["bytes_read"]["max"],
            l["requests_per_walk"]
        );
        let b = &f["lookup_by_id"];
        println!(
            "(b) lookup by id: p50 {:.1} ms, p99 {:.1} ms; bytes read p50 {}, p99 {}, max {}",
            b["latency_ms"]["p50"].as_f64().unwrap_or(0.0),
            b["latency_ms"]["p99"].as_f64().unwrap_or(0.0),
            b["bytes_read"]["p50"],
            b["bytes_read"]["p99"],
            b["bytes_read"]["max"]
        );
        let c = &f["crowd"];
        println!(
            "(c) {} clients of one tenant walking the archive: {} answered, {} refused 429 ({} busy 503); the other tenant's hot listing p99 {:.1} ms alone, {:.1} ms beside them (ratio {:.2})",
            c["clients"],
            c["answered"],
            c["refused_429"],
            c["busy_503"],
            c["other_tenant_hot_listing_ms"]["alone"]["p99"]
                .as_f64()
                .unwrap_or(0.0),
            c["other_tenant_hot_listing_ms"]["beside"]["p99"]
                .as_f64()
                .unwrap_or(0.0),
            c["ratio_p99"].as_f64().unwrap_or(0.0)
        );
        let c = &f["control_crowd_listing_hot_rows"];
        if !c.is_null() {
            println!(
                "    control: as many clients of one tenant listing its hot rows (no archive): ratio {:.2}",
                c["ratio_p99"].as_f64().unwrap_or(0.0)
            );
        }
    }
    println!("{}", serde_json::to_string_pretty(&figures)?);
    Ok(std::process::ExitCode::SUCCESS)
}

/// What the crowd of (c) lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Walk {
    /// A listing that matches nothing, through every archived day.
    Archive,
    /// The first page of its hot rows (the control: no archive read).
    Hot,
}

/// `--concurrent` clients of `walker`'s tenant listing as `walk` says, in
/// alternating rounds with `calm`'s hot listing alone and beside them.
async fn crowd(
    served: &Arc<Served>,
    walker: &str,
    calm: &str,
    args: &Args,
    walk: Walk,
    quiet: bool,
) -> anyhow::Result<serde_json::Value> {
    let running = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, refused, busy) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..args.concurrent {
        let (served, key) = (served.clone(), walker.to_owned());
        let (running, stop) = (running.clone(), stop.clone());
        let (ok, refused, busy) = (ok.clone(), refused.clone(), busy.clone());
        clients.spawn(async move {
            let mut cursor: Option<String> = None;
            while !stop.load(Ordering::Relaxed) {
                if !running.load(Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
                let path = match walk {
                    Walk::Archive => nothing(cursor.as_deref()),
                    Walk::Hot => "/v1/webhook-deliveries?limit=50".to_owned(),
                };
                let (status, body, _) = served.get(&key, &path).await?;
                match status {
                    200 => {
                        ok.fetch_add(1, Ordering::Relaxed);
                        cursor = body["next_cursor"].as_str().map(str::to_owned);
                    }
                    429 | 503 => {
                        // As the answer says: come back after Retry-After
                        // (a 503 is the server's limit on requests at once).
                        if status == 429 {
                            refused.fetch_add(1, Ordering::Relaxed);
                        } else {
                            busy.fetch_add(1, Ordering::Relaxed);
                        }
                        let wait = Duration::from_secs(
                            body["quota"]["retry_after_seconds"].as_u64().unwrap_or(1),
                        );
                        let back = Instant::now() + wait;
                        while Instant::now() < back && !stop.load(Ordering::Relaxed) {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    }
                    other => anyhow::bail!("a crowd listing answered {other}: {body}"),
                }
            }
            Ok::<(), anyhow::Error>(())
        });
    }
    // Alternating rounds, so that whatever else the machine does falls on
    // both alike.
    let round = args.phase / ROUNDS;
    let (mut alone, mut beside) = (Vec::new(), Vec::new());
    let label = match walk {
        Walk::Archive => "hot listings (c)",
        Walk::Hot => "control (c)",
    };
    let bar = progress_bar(u64::from(ROUNDS) * 2, label, quiet);
    for _ in 0..ROUNDS {
        running.store(false, Ordering::Relaxed);
        // Let the crowd's requests in flight end before measuring alone.
        tokio::time::sleep(Duration::from_millis(300)).await;
        alone.extend(calm_listing(served, calm, round).await?);
        bar.inc(1);
        running.store(true, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(300)).await;
        beside.extend(calm_listing(served, calm, round).await?);
        bar.inc(1);
    }
    bar.finish_and_clear();
    stop.store(true, Ordering::Relaxed);
    while let Some(done) = clients.join_next().await {
        done??;
    }
    let (alone, beside) = (summary(alone), summary(beside));
    let ratio =
        beside["p99"].as_f64().unwrap_or(0.0) / alone["p99"].as_f64().unwrap_or(0.0).max(1e-9);
    Ok(serde_json::json!({
        "clients": args.concurrent,
        "answered": ok.load(Ordering::Relaxed),
        "refused_429": refused.load(Ordering::Relaxed),
        "busy_503": busy.load(Ordering::Relaxed),
        "other_tenant_hot_listing_ms": { "alone": alone, "beside": beside },
        "ratio_p99": ratio,
    }))
}

/// The first page of `key`'s deliveries (hot rows), again and again for
/// `length`: its latencies.
async fn calm_listing(served: &Served, key: &str, length: Duration) -> anyhow::Result<Vec<f64>> {
    let started = Instant::now();
    let mut latency = Vec::new();
    while started.elapsed() < length {
        let (status, body, ms) = served
            .get_with(&served.calm_http, key, "/v1/webhook-deliveries?limit=50")
            .await?;
        anyhow::ensure!(status == 200, "the hot listing answered {status}: {body}");
        latency.push(ms);
    }
    Ok(latency)
}
