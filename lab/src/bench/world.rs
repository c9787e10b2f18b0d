//! What the whole-path benchmarks share: a throwaway Postgres with an
//! `orders` table and the platform schema, a counting receiver in a process
//! of its own, tenants and endpoints, walhook running in-process, the
//! latency query, and the readings of the cost model (CPU per process, WAL
//! bytes).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use walhook_devkit::postgres::LocalPostgres;
use walhook_pipeline::ids::TenantId;
use walhook_sql::Platform;
use walhook_sql::endpoints::NewEndpoint;

use super::receiver::RemoteReceiver;
use walhook_cli::config::Config;
use walhook_cli::pipeline::Running;

const SCHEMA: &str =
    "CREATE TABLE orders (id bigint PRIMARY KEY, tenant_id text NOT NULL, status text NOT NULL,
                       total numeric(12,2) NOT NULL, placed_at timestamptz NOT NULL DEFAULT now())";

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

/// The automatic first attempts of `$1`'s orders with ids in `[$2, $3)`,
/// with their delivery `d` and event `e`: what the latency queries read.
const FIRST_ATTEMPTS: &str = "FROM walhook.attempts a JOIN walhook.deliveries d ON d.id = a.delivery_id \
     JOIN walhook.events e ON e.id = d.event_id AND e.occurred_at = d.event_occurred_at \
     WHERE a.number = 1 AND a.trigger = 'auto' AND e.tenant_id = $1 \
       AND e.object_id::int8 >= $2 AND e.object_id::int8 < $3";

/// A benchmark's world.
pub struct World {
    /// The cluster (kept alive).
    pub pg: LocalPostgres,
    /// The platform.
    pub platform: Platform,
    /// A SQL session on the platform database.
    pub platform_sql: tokio_postgres::Client,
    /// The receiver (counting only, in a process of its own).
    pub receiver: RemoteReceiver,
    shop_url: String,
    platform_url: String,
    /// The master key sealing endpoint secrets, for walhook processes
    /// started by the benchmark (`WALHOOK_MASTER_KEY`).
    pub master_key: String,
}

impl World {
    /// Starts Postgres and the receiver, creates the schemas.
    pub async fn start() -> anyhow::Result<World> {
        Self::start_with(&[]).await
    }

    /// [`World::start`] with extra Postgres settings (`name`, `value`).
    pub async fn start_with(settings: &[(&str, &str)]) -> anyhow::Result<World> {
        let mut builder = LocalPostgres::builder();
        for (name, value) in settings {
            builder = builder.setting(name, value);
        }
        let pg = builder.start().await?;
        let shop_url = pg.create_database("shop").await?;
        let platform_url = pg.create_database("walhook").await?;
        pg.connect("shop").await?.batch_execute(SCHEMA).await?;
        let mut platform_sql = pg.connect("walhook").await?;
        walhook_sql::migrate::run(&mut platform_sql).await?;
        // The database lives and dies with this run: so does its key (given
        // to the walhook processes the benchmark starts, if any).
        let master_key = walhook_sql::secrets::MasterKey::generate_text();
        let keyring = walhook_sql::Keyring::new(
            walhook_sql::secrets::MasterKey::parse(&master_key, "the benchmark's key")?,
            Vec::new(),
        );
        let platform = Platform::new(&platform_url, 16)?.with_keyring(keyring);
        let receiver = RemoteReceiver::start().await?;
        Ok(World {
            pg,
            platform,
            platform_sql,
            receiver,
            shop_url,
            platform_url,
            master_key,
        })
    }

    /// Creates `tenant` with `count` endpoints at receiver paths
    /// `{tenant}-{i}`, each allowed `max_in_flight` attempts.
    pub async fn endpoints(
        &self,
        tenant: &str,
        count: u32,
        max_in_flight: u32,
    ) -> anyhow::Result<Vec<String>> {
        let id = TenantId::new(tenant)?;
        self.platform.create_tenant(&id, tenant).await?;
        let mut paths = Vec::new();
        for i in 0..count {
            let path = format!("{tenant}-{i}");
            self.platform
                .create_endpoint(
                    &NewEndpoint {
                        tenant_id: id.clone(),
                        url: self.receiver.url(&path),
                        event_types: vec![],
                        description: String::new(),
                        rate_limit_per_sec: None,
                        max_in_flight: Some(max_in_flight),
                        enabled: true,
                        retry: Default::default(),
                        ordering: Default::default(),
                        verify: false,
                    },
                    "bench",
                )
                .await?;
            paths.push(path);
        }
        Ok(paths)
    }

    /// The config of a walhook run against this world; `egress` adds lines
    /// to `[egress]`, `extra` adds sections.
    pub fn config(&self, egress: &str, extra: &str) -> anyhow::Result<Config> {
        Config::parse(&self.config_text(egress, extra))
    }

    /// The text of [`World::config`].
    pub fn config_text(&self, egress: &str, extra: &str) -> String {
        format!(
            "[platform]\nurl = \"{}\"\nmax_connections = 16\n\n[source]\nurl = \"{}\"\n\
             create_slot = true\ncreate_publication = true\nstatus_interval = \"200ms\"\n\n\
             [egress]\nallow_http_loopback = true\n{egress}\n\n{extra}\n{RULES}",
            self.platform_url, self.shop_url
        )
    }

    /// Starts walhook in this process; `egress` adds lines to `[egress]`,
    /// `extra` adds sections.
    pub async fn run(
        &self,
        egress: &str,
        extra: &str,
        shutdown: CancellationToken,
    ) -> anyhow::Result<Running> {
        let cfg = self.config(egress, extra)?;
        walhook_cli::pipeline::start(&cfg, self.platform.clone(), shutdown).await
    }

    /// Starts walhook in this process with its REST API on a free loopback
    /// port (its own pool, as `walhook run` with `[api]` does); returns the
    /// port too.
    pub async fn run_with_api(
        &self,
        extra: &str,
        shutdown: CancellationToken,
    ) -> anyhow::Result<(Running, u16)> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let cfg = self.config(
            "",
            &format!(
                "{extra}\n[api]\nlisten = \"127.0.0.1:{port}\"\n\
                 metrics_listen = \"127.0.0.1:0\"\n\
                 operator_token = \"bench-operator-token-0123456789abcdef\"\n"
            ),
        )?;
        let metrics = Arc::new(walhook_api::Metrics::new());
        let running = walhook_cli::pipeline::start_observed(
            &cfg,
            self.platform.clone(),
            shutdown.clone(),
            Some(metrics.pipeline.clone()),
            Vec::new(),
        )
        .await?;
        metrics.register_collector(Box::new(walhook_cli::metrics::PipelineCollector::new(
            running.counters.clone(),
            running.directory.clone(),
        )));
        let api = walhook_cli::commands::api::section(&cfg)?;
        let pool = walhook_api::connect(&cfg.platform()?.connect_options()?, &api.limits())?
            .with_keyring(walhook_sql::Keyring::ephemeral());
        walhook_cli::commands::api::spawn(&cfg, pool, metrics, shutdown).await?;
        Ok((running, port))
    }

    /// Starts `writers` connections committing `batch` orders per
    /// transaction for `tenant`, ids from `first_id`, at `rate` orders per
    /// second in all; returns the count written so far and a stop token.
    pub async fn writers(
        &self,
        tenant: &str,
        first_id: i64,
        rate: f64,
        batch: i64,
        writers: u64,
    ) -> anyhow::Result<(
        Arc<AtomicU64>,
        CancellationToken,
        Vec<tokio::task::JoinHandle<anyhow::Result<()>>>,
    )> {
        let written = Arc::new(AtomicU64::new(0));
        let stop = CancellationToken::new();
        let mut tasks = Vec::new();
        let per_writer = (rate / batch as f64 / writers as f64).max(0.01);
        for w in 0..writers {
            let client = self.pg.connect("shop").await?;
            let (stop, written, tenant) = (stop.clone(), written.clone(), tenant.to_owned());
            tasks.push(tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / per_writer));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                let mut next = first_id + ((w as i64) << 36);
                let insert = client
                    .prepare("INSERT INTO orders (id, tenant_id, status, total) SELECT g, $3, 'placed', (g % 1000) + 0.5 FROM generate_series($1::int8, $2::int8) g")
                    .await?;
                while !stop.is_cancelled() {
                    tick.tick().await;
                    client.execute(&insert, &[&next, &(next + batch - 1), &tenant]).await?;
                    next += batch;
                    written.fetch_add(batch as u64, Ordering::Relaxed);
                }
                Ok(())
            }));
        }
        Ok((written, stop, tasks))
    }

    /// Commit→first-attempt latency percentiles (p50, p99, p99.9) in ms for
    /// `tenant`'s orders with ids in `[from, to)`.
    pub async fn first_attempt_latency(
        &self,
        tenant: &str,
        from: i64,
        to: i64,
    ) -> anyhow::Result<[f64; 3]> {
        let row = self
            .platform_sql
            .query_one(
                &format!(
                    "SELECT percentile_disc(ARRAY[0.5, 0.99, 0.999]) WITHIN GROUP \
                   (ORDER BY (extract(epoch FROM a.started_at - e.occurred_at) * 1000)::float8) \
                 {FIRST_ATTEMPTS}"
                ),
                &[&tenant, &from, &to],
            )
            .await?;
        let v: Vec<f64> = row.get::<_, Option<Vec<f64>>>(0).unwrap_or_default();
        Ok([0, 1, 2].map(|i| v.get(i).copied().unwrap_or(f64::NAN)))
    }
}

impl World {
    /// Per second of commit, for `tenant`'s orders with ids in `[from,
    /// to)`: the p99 of commit → first attempt (ms) and the attempts of
    /// `others` started in that second: when the tail happened and what
    /// ran beside it.
    pub async fn p99_by_second(
        &self,
        tenant: &str,
        from: i64,
        to: i64,
        others: &[&str],
    ) -> anyhow::Result<Vec<(f64, i64)>> {
        let others: Vec<String> = others.iter().map(|s| (*s).to_owned()).collect();
        let rows = self
            .platform_sql
            .query(
                &format!(
                    "WITH h AS ( \
                   SELECT date_trunc('second', e.occurred_at) s, \
                          extract(epoch FROM a.started_at - e.occurred_at) * 1000 ms \
                   {FIRST_ATTEMPTS}), \
                 o AS ( \
                   SELECT date_trunc('second', started_at) s, count(*) n \
                   FROM walhook.attempts WHERE tenant_id = ANY($4) GROUP BY 1) \
                 SELECT percentile_disc(0.99) WITHIN GROUP (ORDER BY h.ms)::float8, \
                        coalesce(max(o.n), 0)::int8 \
                 FROM h LEFT JOIN o USING (s) GROUP BY h.s ORDER BY h.s"
                ),
                &[&tenant, &from, &to, &others],
            )
            .await?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    /// p99 in ms of (commit → delivery made, delivery made → first attempt)
    /// for `tenant`'s orders with ids in `[from, to)`: which stage waits.
    pub async fn stage_p99(&self, tenant: &str, from: i64, to: i64) -> anyhow::Result<(f64, f64)> {
        let row = self
            .platform_sql
            .query_one(
                &format!("SELECT percentile_disc(0.99) WITHIN GROUP (ORDER BY (extract(epoch FROM d.created_at - e.occurred_at) * 1000)::float8), \
                        percentile_disc(0.99) WITHIN GROUP (ORDER BY (extract(epoch FROM a.started_at - d.created_at) * 1000)::float8) \
                 {FIRST_ATTEMPTS}"),
                &[&tenant, &from, &to],
            )
            .await?;
        Ok((
            row.get::<_, Option<f64>>(0).unwrap_or(f64::NAN),
            row.get::<_, Option<f64>>(1).unwrap_or(f64::NAN),
        ))
    }
}

/// Peak resident memory of this process, in KiB.
pub fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|n| n.parse().ok()))
        })
        .unwrap_or(0)
}

/// CPU seconds process `pid` has used so far (0 when it is gone).
pub fn process_cpu_seconds(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| stat_seconds(&s))
        .unwrap_or(0.0)
}

/// User + system seconds of a `/proc/PID/stat` line.
fn stat_seconds(stat: &str) -> Option<f64> {
    // Clock ticks per second: 100 on Linux unless the kernel says otherwise.
    const HZ: f64 = 100.0;
    // Fields after the command (which may hold spaces) in parentheses.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some((f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?) / HZ)
}

/// [`stat_seconds`] plus the CPU of the process's children that ended and
/// were waited for: a Postgres backend that exits during a measurement moves
/// its time into the postmaster's.
fn stat_seconds_with_children(stat: &str) -> Option<f64> {
    const HZ: f64 = 100.0;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let children = f.get(13)?.parse::<f64>().ok()? + f.get(14)?.parse::<f64>().ok()?;
    Some(stat_seconds(stat)? + children / HZ)
}

/// CPU time used so far, in seconds: (this process, every `postgres`
/// process, the whole machine busy), read from /proc.
pub fn cpu_seconds() -> (f64, f64, f64) {
    const HZ: f64 = 100.0;
    let ticks = stat_seconds;
    let own = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| ticks(&s))
        .unwrap_or(0.0);
    let mut postgres = 0.0;
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            if !entry
                .file_name()
                .to_string_lossy()
                .chars()
                .all(|c| c.is_ascii_digit())
            {
                continue;
            }
            if let Ok(stat) = std::fs::read_to_string(entry.path().join("stat"))
                && stat.contains("(postgres)")
            {
                postgres += stat_seconds_with_children(&stat).unwrap_or(0.0);
            }
        }
    }
    let busy = std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| {
            let line = s.lines().next()?.to_owned();
            let v: Vec<f64> = line
                .split_whitespace()
                .skip(1)
                .filter_map(|x| x.parse().ok())
                .collect();
            // user nice system idle iowait irq softirq steal
            Some((v.iter().sum::<f64>() - v.get(3)? - v.get(4)?) / HZ)
        })
        .unwrap_or(0.0);
    (own, postgres, busy)
}

/// What the platform database has written to its WAL so far.
#[derive(Debug, Clone, Copy, Default)]
pub struct WalReading {
    /// Bytes.
    pub bytes: f64,
    /// Records.
    pub records: f64,
    /// Full-page images.
    pub fpi: f64,
}

impl World {
    /// The cluster's WAL counters (`pg_stat_wal`, the whole cluster: the
    /// business writes are in it too).
    pub async fn wal(&self) -> anyhow::Result<WalReading> {
        let row = self
            .platform_sql
            .query_one(
                "SELECT wal_bytes::float8, wal_records::float8, wal_fpi::float8 FROM pg_stat_wal",
                &[],
            )
            .await?;
        Ok(WalReading {
            bytes: row.get(0),
            records: row.get(1),
            fpi: row.get(2),
        })
    }

    /// The cluster's durability and memory settings as it runs them
    /// (`WALHOOK_PG_SETTINGS` may have changed devkit's), for the result.
    pub async fn postgres_settings(&self) -> anyhow::Result<serde_json::Value> {
        let rows = self
            .platform_sql
            .query(
                "SELECT name, current_setting(name) FROM pg_settings \
                 WHERE name IN ('fsync', 'synchronous_commit', 'full_page_writes', 'wal_level', \
                                'shared_buffers', 'max_wal_size', 'checkpoint_timeout') ORDER BY name",
                &[],
            )
            .await?;
        Ok(serde_json::Value::Object(
            rows.iter()
                .map(|r| (r.get::<_, String>(0), serde_json::Value::String(r.get(1))))
                .collect(),
        ))
    }

    /// The top statements by total time, when `pg_stat_statements` is
    /// loaded: (query, calls, rows, total ms, µs per row).
    pub async fn statements(
        &self,
        limit: i64,
    ) -> anyhow::Result<Vec<(String, i64, i64, f64, f64)>> {
        self.platform_sql
            .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            .await?;
        let rows = self
            .platform_sql
            .query(
                "SELECT left(regexp_replace(query, '\\s+', ' ', 'g'), 90), calls, rows, total_exec_time, \
                        total_exec_time * 1000 / greatest(rows, 1) \
                 FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT $1",
                &[&limit],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
            .collect())
    }
}

/// What one platform table went through (`pg_stat_user_tables`, summed
/// over partitions).
#[derive(Debug, serde::Serialize)]
pub struct TableActivity {
    /// The table (partitions count under their parent).
    pub table: String,
    /// Sequential scans and the rows they read.
    pub seq_scans: i64,
    /// Rows read by sequential scans.
    pub seq_rows_read: i64,
    /// Index scans.
    pub index_scans: i64,
    /// Rows inserted.
    pub inserted: i64,
    /// Rows updated, and of those HOT (no index entry).
    pub updated: i64,
    /// HOT updates.
    pub hot_updated: i64,
    /// Rows deleted.
    pub deleted: i64,
}

impl World {
    /// The platform tables' activity since the cluster started, busiest
    /// first.
    pub async fn table_activity(&self) -> anyhow::Result<Vec<TableActivity>> {
        let rows = self
            .platform_sql
            .query(
                "SELECT regexp_replace(relname, '_[0-9]{8}$', ''), sum(seq_scan)::int8, sum(seq_tup_read)::int8, \
                        sum(coalesce(idx_scan, 0))::int8, sum(n_tup_ins)::int8, sum(n_tup_upd)::int8, \
                        sum(n_tup_hot_upd)::int8, sum(n_tup_del)::int8 \
                 FROM pg_stat_user_tables WHERE schemaname = 'walhook' \
                 GROUP BY 1 HAVING sum(n_tup_ins + n_tup_upd + n_tup_del + seq_tup_read) > 0 \
                 ORDER BY sum(n_tup_ins + n_tup_upd + n_tup_del) DESC",
                &[],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| TableActivity {
                table: r.get(0),
                seq_scans: r.get(1),
                seq_rows_read: r.get(2),
                index_scans: r.get(3),
                inserted: r.get(4),
                updated: r.get(5),
                hot_updated: r.get(6),
                deleted: r.get(7),
            })
            .collect())
    }
}

/// The commit this binary was built from ([`walhook_cli::BUILD_COMMIT`],
/// with "-dirty" when its sources differ from it), or "unknown".
pub fn build_commit() -> &'static str {
    walhook_cli::BUILD_COMMIT
}

#[cfg(test)]
mod tests {
    /// Built in a git checkout, the benchmarks' results name its commit:
    /// `WALHOOK_COMMIT` is set by `cli/build.rs` for the `cli` crate only,
    /// and a lab that read it for itself said "unknown".
    #[test]
    fn results_name_the_commit_of_a_git_checkout() {
        let head = std::process::Command::new("git")
            .args(["rev-parse", "--short=12", "HEAD"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .ok()
            .filter(|o| o.status.success());
        let Some(head) = head else {
            eprintln!("not a git checkout: nothing to compare the build commit with");
            return;
        };
        let head = String::from_utf8_lossy(&head.stdout).trim().to_owned();
        // "-dirty" when the sources differ from the commit (a build in a
        // working tree with changes).
        assert_eq!(super::build_commit().trim_end_matches("-dirty"), head);
    }
}
