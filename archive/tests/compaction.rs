//! A day archived again is compacted: after archived deliveries are
//! replayed (restored, sent again) and a late attempt reaches an archived
//! day, the next round leaves one live set per day in which DuckDB, over
//! the documented globs, counts each id once, with the states the platform
//! held; a crash in the middle of publication leaves each id once and the
//! next round finishes the job. Also: every DuckDB block of
//! `docs/analytics.md` runs against such an archive and gives what the
//! same question asked of the platform database gives.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use chrono::NaiveDate;
use uuid::Uuid;
use walhook_archive::cold::{ColdHistory, Restore};
use walhook_archive::layout::bucket_of;
use walhook_archive::objstore::{AnyStore, LocalDirStore};
use walhook_archive::{Archiver, Outcome, Settings};
use walhook_devkit::postgres::LocalPostgres;
use walhook_pipeline::ids::{DeliveryId, TenantId};
use walhook_pipeline::objstore::ObjectStore;
use walhook_sql::Platform;

use walhook_devkit::s3::S3Server;

use crate::support::{Kind, first_day, history, s3};

const DAYS: u32 = 3;

/// A platform database with three days of history archived into a local
/// directory, and a copy of its rows as the platform held them
/// (`held.deliveries`, `held.attempts`), kept up to date with what the
/// test changes.
pub(crate) struct Fixture {
    _pg: LocalPostgres,
    url: String,
    pub(crate) sql: tokio_postgres::Client,
    platform: Platform,
    dir: tempfile::TempDir,
    store: AnyStore,
    /// The S3-compatible server holding the archive, when it is not the
    /// local directory.
    pub(crate) s3: Option<S3Server>,
}

fn settings() -> Settings {
    Settings {
        hot_days: 1,
        today: Some(today()),
        ..Settings::default()
    }
}

fn today() -> NaiveDate {
    first_day() + chrono::Duration::days(i64::from(DAYS) + 2)
}

impl Fixture {
    /// The archive in a local directory.
    pub(crate) async fn new() -> Fixture {
        Fixture::new_in(Kind::Local).await
    }

    /// The archive in a store of `kind`.
    pub(crate) async fn new_in(kind: Kind) -> Fixture {
        let pg = LocalPostgres::start().await.unwrap();
        let url = pg.create_database("platform").await.unwrap();
        let sql = pg.connect("platform").await.unwrap();
        let mut migrate = pg.connect("platform").await.unwrap();
        walhook_sql::migrate::run(&mut migrate).await.unwrap();
        let h = history(DAYS, 60, 3, 2);
        sql.batch_execute(&h.setup_sql()).await.unwrap();
        for d in 0..DAYS {
            sql.batch_execute(&h.day_sql(d)).await.unwrap();
        }
        // The platform's rows as they were, for the checks after the drop.
        sql.batch_execute(
            "CREATE SCHEMA held; \
             CREATE TABLE held.deliveries AS SELECT * FROM walhook.deliveries; \
             CREATE TABLE held.attempts AS SELECT * FROM walhook.attempts; \
             CREATE TABLE held.events AS SELECT * FROM walhook.events;",
        )
        .await
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (store, s3) = match kind {
            Kind::Local => (
                AnyStore::Local(LocalDirStore::open(dir.path().join("archive")).unwrap()),
                None,
            ),
            Kind::S3 => {
                let (server, store) = s3().await;
                (AnyStore::S3(store), Some(server))
            }
        };
        let platform = Platform::new(&url, 4).unwrap();
        let f = Fixture {
            _pg: pg,
            url,
            sql,
            platform,
            dir,
            store,
            s3,
        };
        f.archive_all().await;
        f
    }

    pub(crate) fn root(&self) -> PathBuf {
        self.dir.path().join("archive")
    }

    /// One round; every table's day archived.
    pub(crate) async fn archive_all(&self) {
        let reports = Archiver::new(self.platform.clone(), self.store.clone(), settings())
            .run(&walhook_archive::archiver::Silent)
            .await
            .unwrap();
        assert!(
            reports.iter().all(|r| r.outcome == Outcome::Archived),
            "{reports:#?}"
        );
        let hot: i64 = self
            .sql
            .query_one(
                "SELECT (SELECT count(*) FROM walhook.deliveries) + (SELECT count(*) FROM walhook.attempts) \
                 + (SELECT count(*) FROM walhook.events)",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(hot, 0, "every row left the hot tables: {reports:#?}");
    }

    /// Replays two archived deliveries of the second day in different
    /// tenant buckets, as the API does: restored (delivery and event hot
    /// again, same ids), sent again with success, and the manual attempt
    /// recorded on the third (archived) day. Returns their ids.
    pub(crate) async fn replay_two(&self) -> Vec<Uuid> {
        let day = first_day() + chrono::Duration::days(1);
        let rows = self
            .sql
            .query(
                "SELECT id, tenant_id FROM held.deliveries WHERE created_at::date = $1::text::date \
                 AND status = 'failed' ORDER BY id",
                &[&day.to_string()],
            )
            .await
            .unwrap();
        let mut picked: Vec<(Uuid, String)> = Vec::new();
        for r in rows {
            let (id, tenant): (Uuid, String) = (r.get(0), r.get(1));
            if picked
                .iter()
                .all(|(_, t)| bucket_of(t, 16) != bucket_of(&tenant, 16))
            {
                picked.push((id, tenant));
            }
        }
        assert!(
            picked.len() >= 2,
            "two failed deliveries of tenants in different buckets: {picked:?}"
        );
        picked.truncate(2);
        let cold = ColdHistory::new(
            self.platform.clone(),
            self.store.clone(),
            std::time::Duration::from_secs(3650 * 86_400),
        );
        let attempt_day = first_day() + chrono::Duration::days(2);
        self.sql
            .execute(
                "SELECT walhook.ensure_day_partition('attempts', $1::text::date)",
                &[&attempt_day.to_string()],
            )
            .await
            .unwrap();
        for (id, tenant) in &picked {
            let tenant_id = TenantId::new(tenant).unwrap();
            let r = cold
                .restore(&tenant_id, DeliveryId(*id.as_bytes()), None)
                .await
                .unwrap();
            assert!(matches!(r, Restore::Restored), "{id}: {r:?}");
            for schema in ["walhook", "held"] {
                self.sql
                    .batch_execute(&format!(
                        "UPDATE {schema}.deliveries SET status = 'succeeded', attempt_count = attempt_count + 1, \
                         manual_attempt_count = manual_attempt_count + 1, last_http_status = 200, \
                         last_error_class = NULL, updated_at = now() WHERE id = '{id}'; \
                         INSERT INTO {schema}.attempts (id, delivery_id, endpoint_id, tenant_id, number, trigger, \
                           endpoint_config_version, started_at, finished_at, http_status, latency_ms, outcome) \
                         SELECT md5(d.id::text || 'manual')::uuid, d.id, d.endpoint_id, d.tenant_id, d.attempt_count, \
                           'manual', 1, '{attempt_day} 12:00:00+00', '{attempt_day} 12:00:00.005+00', 200, 5, 'succeeded' \
                         FROM {schema}.deliveries d WHERE d.id = '{id}'"
                    ))
                    .await
                    .unwrap();
            }
        }
        picked.into_iter().map(|(id, _)| id).collect()
    }

    /// What the platform held: every delivery's status and attempt count.
    async fn held_deliveries(&self) -> BTreeMap<String, (String, i64)> {
        self.sql
            .query(
                "SELECT id::text, status::text, attempt_count::int8 FROM held.deliveries",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), (r.get(1), r.get(2))))
            .collect()
    }

    async fn held_count(&self, table: &str) -> i64 {
        self.sql
            .query_one(&format!("SELECT count(*) FROM held.{table}"), &[])
            .await
            .unwrap()
            .get(0)
    }

    /// The keys in the store under `prefix`.
    async fn keys(&self, prefix: &str) -> Vec<String> {
        let mut keys: Vec<String> = self
            .store
            .list(prefix)
            .await
            .unwrap()
            .into_iter()
            .map(|o| o.key)
            .collect();
        keys.sort();
        keys
    }
}

fn python() -> PathBuf {
    std::env::var_os("WALHOOK_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("python3"))
}

/// Runs `statements` (SQL blocks, `;`-separated) in one DuckDB session
/// whose working directory is `root`; returns each SELECT's rows, values
/// made comparable (uuids as text, timestamps as epoch seconds, dates as
/// text).
pub(crate) fn duckdb(root: &Path, blocks: &[String]) -> Vec<(String, Vec<Vec<serde_json::Value>>)> {
    const RUNNER: &str = r#"
import datetime, decimal, json, os, sys, uuid
import duckdb
os.chdir(sys.argv[1])
con = duckdb.connect()
# DuckDB's httpfs extension from its pip package (the suite runs offline:
# `INSTALL httpfs` would download it), for the SQL's '{httpfs}'.
try:
    import duckdb_extension_httpfs
    HTTPFS = os.path.join(os.path.dirname(duckdb_extension_httpfs.__file__), 'extensions',
                          'v' + duckdb.__version__, 'httpfs.duckdb_extension')
except ImportError:
    HTTPFS = '(the pip package duckdb-extension-httpfs is not installed)'

def norm(v):
    if isinstance(v, uuid.UUID): return str(v)
    if isinstance(v, datetime.datetime): return v.timestamp()
    if isinstance(v, datetime.date): return v.isoformat()
    if isinstance(v, decimal.Decimal): return float(v)
    if isinstance(v, (bytes, bytearray)): return v.hex()
    return v
out = []
for block in json.load(sys.stdin):
    # Comment lines go first: a comment may hold a ';'.
    block = '\n'.join(l for l in block.splitlines() if not l.strip().startswith('--'))
    for stmt in block.split(';'):
        body = stmt.strip()
        if not body:
            continue
        cur = con.execute(body.replace('{httpfs}', HTTPFS))
        if body.upper().startswith(('SELECT', 'WITH')):
            out.append([body, [[norm(v) for v in r] for r in cur.fetchall()]])
print(json.dumps(out))
"#;
    use std::io::Write;
    let mut child = Command::new(python())
        .arg("-c")
        .arg(RUNNER)
        .arg(root)
        .env("TZ", "UTC")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("WALHOOK_PYTHON (a Python with duckdb) runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(serde_json::to_string(blocks).unwrap().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "duckdb failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// For each table, over the documented glob and a recursive one:
/// (rows, distinct ids).
fn counts(root: &Path) -> BTreeMap<String, (i64, i64)> {
    let mut blocks = Vec::new();
    let mut names = Vec::new();
    for t in ["deliveries", "attempts", "events"] {
        for glob in ["*/*/*.parquet", "**/*.parquet"] {
            names.push(format!("{t} {glob}"));
            blocks.push(format!(
                "SELECT count(*), count(DISTINCT id) FROM read_parquet('table={t}/{glob}', hive_partitioning = true)"
            ));
        }
    }
    duckdb(root, &blocks)
        .into_iter()
        .zip(names)
        .map(|((_, rows), name)| {
            let r = &rows[0];
            (name, (r[0].as_i64().unwrap(), r[1].as_i64().unwrap()))
        })
        .collect()
}

/// Each table's rows once each, as many as the platform held.
async fn assert_each_id_once(f: &Fixture) {
    let counts = counts(&f.root());
    for (name, (rows, ids)) in &counts {
        assert_eq!(rows, ids, "{name}: {rows} rows, {ids} ids: {counts:?}");
        let table = name.split(' ').next().unwrap();
        assert_eq!(*ids, f.held_count(table).await, "{name}: {counts:?}");
    }
}

/// The deliveries' statuses and attempt counts in the Parquet, as the
/// platform held them.
async fn assert_states_match(f: &Fixture) {
    let got: BTreeMap<String, (String, i64)> = duckdb(
        &f.root(),
        &["SELECT id::varchar, status, attempt_count FROM read_parquet('table=deliveries/*/*/*.parquet')".into()],
    )
    .remove(0)
    .1
    .into_iter()
    .map(|r| {
        (
            r[0].as_str().unwrap().to_owned(),
            (r[1].as_str().unwrap().to_owned(), r[2].as_i64().unwrap()),
        )
    })
    .collect();
    let held = f.held_deliveries().await;
    assert_eq!(got.len(), held.len());
    for (id, state) in &held {
        assert_eq!(got.get(id), Some(state), "delivery {id}");
    }
}

/// The must-show of issue 30: replays of archived deliveries and a second
/// round leave each id once, with the platform's states; cold reads see
/// the replayed state; no staged copy is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_day_archived_again_holds_each_id_once_with_its_latest_state() {
    let f = Fixture::new().await;
    let replayed = f.replay_two().await;
    f.archive_all().await;
    assert_each_id_once(&f).await;
    assert_states_match(&f).await;
    let day = first_day() + chrono::Duration::days(1);
    let manifest = format!("table=deliveries/date={day}/_manifest-g1.json");
    let keys = f.keys(&format!("table=deliveries/date={day}/")).await;
    assert!(keys.contains(&manifest), "{keys:?}");
    assert!(
        f.keys("_staging/").await.is_empty(),
        "staged copies are deleted"
    );
    let cold = ColdHistory::new(
        f.platform.clone(),
        f.store.clone(),
        std::time::Duration::from_secs(3650 * 86_400),
    );
    let held = f.held_deliveries().await;
    for id in replayed {
        let tenant: String = f
            .sql
            .query_one(
                "SELECT tenant_id FROM held.deliveries WHERE id = $1",
                &[&id],
            )
            .await
            .unwrap()
            .get(0);
        let d = cold
            .delivery(
                &TenantId::new(&tenant).unwrap(),
                DeliveryId(*id.as_bytes()),
                None,
            )
            .await
            .unwrap()
            .expect("the replayed delivery is archived");
        assert_eq!(d.status.as_str(), "succeeded");
        assert_eq!(i64::from(d.attempt_count), held[&id.to_string()].1);
    }
}

/// A round in a child process, with the failpoints of its environment;
/// run by [`a_crash_during_publication_leaves_each_id_once`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by a_crash_during_publication_leaves_each_id_once in a child process"]
async fn round_in_a_child() {
    let url = std::env::var("WALHOOK_TEST_PLATFORM").unwrap();
    let root = std::env::var("WALHOOK_TEST_STORE").unwrap();
    let store = AnyStore::Local(LocalDirStore::open(root).unwrap());
    let s = Settings {
        tables: vec![walhook_archive::table::Table::Deliveries],
        ..settings()
    };
    Archiver::new(Platform::new(&url, 2).unwrap(), store, s)
        .run(&walhook_archive::archiver::Silent)
        .await
        .unwrap();
}

/// A round killed after the first of two rewritten parts replaced its live
/// object: the catalog still says `written`, analysts see each id once
/// and every delivery, and the next round publishes the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_during_publication_leaves_each_id_once() {
    let f = Fixture::new().await;
    f.replay_two().await;
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "compaction::round_in_a_child",
            "--exact",
            "--ignored",
            "--nocapture",
        ])
        .env("WALHOOK_TEST_PLATFORM", &f.url)
        .env("WALHOOK_TEST_STORE", f.root())
        .env("WALHOOK_FAILPOINTS", "archive.mid_publish=abort@1")
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "the child was to die at the failpoint: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let state: String = f
        .sql
        .query_one(
            "SELECT state FROM walhook.archive_partitions WHERE table_name = 'deliveries' \
             AND day = $1::text::date ORDER BY generation DESC LIMIT 1",
            &[&(first_day() + chrono::Duration::days(1)).to_string()],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(state, "written", "the round died during publication");
    assert_eq!(f.keys("_staging/").await.len(), 2, "two parts were staged");
    let counts = counts(&f.root());
    let (rows, ids) = counts["deliveries */*/*.parquet"];
    assert_eq!(rows, ids, "{counts:?}");
    assert_eq!(ids, f.held_count("deliveries").await);

    f.archive_all().await;
    assert_each_id_once(&f).await;
    assert_states_match(&f).await;
    assert!(f.keys("_staging/").await.is_empty());
}
