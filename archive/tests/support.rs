//! The tests' worlds: a throwaway platform database with the walhook
//! schema and rows written straight into the hot tables (as fan-out and
//! dispatch leave them, [`World`]), or days of history
//! ([`walhook_devkit::history`]) archived by the real archiver into a real
//! store ([`archived`]: a local directory, or the S3-compatible `s3s-fs`).

#![allow(dead_code)]

use std::time::{Duration, SystemTime};

use chrono::NaiveDate;
use uuid::Uuid;
use walhook_archive::cold::{ColdHistory, ColdLimits, CountingStore};
use walhook_archive::objstore::{AnyStore, LocalDirStore, S3Credentials, S3Settings, S3Store};
use walhook_archive::{Archiver, Settings};
use walhook_devkit::history::History;
use walhook_devkit::postgres::LocalPostgres;
use walhook_devkit::s3::S3Server;
use walhook_sql::Platform;
use walhook_sql::deliveries::DeliveryFilter;

/// A migrated platform database.
pub struct World {
    /// The cluster (stopped on drop).
    _pg: LocalPostgres,
    /// A session for the test's own SQL.
    pub sql: tokio_postgres::Client,
    /// The pool the archiver uses.
    pub platform: Platform,
}

impl World {
    /// A new cluster with the walhook schema.
    pub async fn new() -> World {
        let pg = LocalPostgres::start().await.unwrap();
        let mut sql = pg.connect("postgres").await.unwrap();
        walhook_sql::migrate::run(&mut sql).await.unwrap();
        let platform = Platform::new(&pg.url("postgres"), 4).unwrap();
        World {
            _pg: pg,
            sql,
            platform,
        }
    }

    /// `n` events of `tenant` on `day`, each with a payload of `bytes`
    /// bytes that does not compress (SHA-256 blocks), one second apart
    /// from `second`.
    pub async fn events(&self, tenant: &str, day: NaiveDate, second: i32, n: i32, bytes: i32) {
        self.sql
            .execute(
                "SELECT walhook.ensure_day_partition('events', $1::text::date)",
                &[&day.to_string()],
            )
            .await
            .unwrap();
        // One statement per event keeps each transaction (and the memory
        // Postgres builds the payload in) to one event.
        for i in second..second + n {
            self.sql
                .execute(
                    "INSERT INTO walhook.events (id, tenant_id, event_type, schema_version, occurred_at, \
                     source, commit_lsn, tx_ordinal, payload, payload_sha256) \
                     SELECT gen_random_uuid(), $1::text, 'order.created', 1, \
                       $2::text::timestamptz + $3::int4 * interval '1 second', 'shop', \
                       ('0/' || to_hex($3::int4 + 1))::pg_lsn, 0, p.payload, sha256(p.payload) \
                     FROM (SELECT substring(string_agg(sha256(convert_to($1::text || ':' || $3::int4 || ':' || j, 'UTF8')), ''::bytea) \
                       FROM 1 FOR $4::int4) AS payload FROM generate_series(0, $4::int4 / 32) j) p",
                    &[&tenant, &format!("{day} 00:00:00+00"), &i, &bytes],
                )
                .await
                .unwrap();
        }
    }

    /// `n` attempts on `day` (one delivery each), all with a 32-byte
    /// response SHA-256.
    pub async fn attempts(&self, day: NaiveDate, n: i32) {
        self.sql
            .execute(
                "SELECT walhook.ensure_day_partition('attempts', $1::text::date)",
                &[&day.to_string()],
            )
            .await
            .unwrap();
        self.sql
            .execute(
                "INSERT INTO walhook.attempts (id, delivery_id, endpoint_id, tenant_id, number, trigger, \
                 endpoint_config_version, started_at, finished_at, http_status, latency_ms, outcome, \
                 response_sha256, response_excerpt) \
                 SELECT gen_random_uuid(), gen_random_uuid(), '00000000-0000-0000-0000-0000000000e1', 'acme', 1, \
                   'auto', 1, $1::text::timestamptz + i * interval '1 minute', \
                   $1::text::timestamptz + i * interval '1 minute' + interval '20 ms', 200, 20, 'succeeded', \
                   sha256(i::text::bytea), 'ok' \
                 FROM generate_series(1, $2) i",
                &[&format!("{day} 00:00:00+00"), &n],
            )
            .await
            .unwrap();
    }

    /// Rows of `table`'s day partition still hot (0 once dropped).
    pub async fn hot(&self, table: &str, day: NaiveDate) -> i64 {
        let name = format!("walhook.{table}_{}", day.format("%Y%m%d"));
        let exists: bool = self
            .sql
            .query_one("SELECT to_regclass($1) IS NOT NULL", &[&name])
            .await
            .unwrap()
            .get(0);
        if !exists {
            return 0;
        }
        self.sql
            .query_one(&format!("SELECT count(*) FROM {name}"), &[])
            .await
            .unwrap()
            .get(0)
    }
}

/// The S3-compatible test server and a store on it (multipart uploads
/// above 16 MiB, as in production).
pub async fn s3() -> (S3Server, S3Store) {
    let server = S3Server::start("walhook-archive")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let store = S3Store::connect(S3Settings {
        prefix: "cold".into(),
        endpoint: Some(server.endpoint().to_owned()),
        force_path_style: true,
        credentials: Some(S3Credentials {
            access_key_id: server.access_key().to_owned(),
            secret_access_key: server.secret_key().to_owned().into(),
        }),
        ..S3Settings::new(server.bucket())
    })
    .await
    .unwrap();
    (server, store)
}

/// A day well before "today" in the tests' settings.
pub fn day(n: u32) -> NaiveDate {
    NaiveDate::from_ymd_opt(2026, 3, n).unwrap()
}

/// "Today" for the tests' settings: every [`day`] of March is due.
pub fn today() -> NaiveDate {
    NaiveDate::from_ymd_opt(2026, 4, 10).unwrap()
}

/// Which store the archive goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A local directory.
    Local,
    /// `s3s-fs` over loopback.
    S3,
}

/// An archived history and what it was made from.
pub struct Archived {
    /// The cluster (kept alive).
    pub pg: LocalPostgres,
    /// The platform database.
    pub platform: Platform,
    /// A session on it.
    pub sql: tokio_postgres::Client,
    /// The store the archive wrote.
    pub store: AnyStore,
    /// The history written.
    pub history: History,
    /// Every delivery as the hot table held it: (tenant, created_at, id,
    /// endpoint, event type, status), newest first.
    pub deliveries: Vec<Row>,
    _dir: tempfile::TempDir,
    _s3: Option<S3Server>,
}

/// One delivery as the hot table held it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// Its tenant.
    pub tenant: String,
    /// When it was made.
    pub created_at: SystemTime,
    /// Its id.
    pub id: Uuid,
    /// Its endpoint.
    pub endpoint: Uuid,
    /// Its event type.
    pub event_type: String,
    /// Its status.
    pub status: String,
}

/// The first day of every history.
pub fn first_day() -> NaiveDate {
    NaiveDate::from_ymd_opt(2026, 3, 1).unwrap()
}

/// `days` days of `events_per_day` events for `tenants` tenants with
/// `endpoints` endpoints each.
pub fn history(days: u32, events_per_day: u64, tenants: u32, endpoints: u32) -> History {
    History {
        first_day: first_day().to_string(),
        days,
        events_per_day,
        tenants,
        endpoints_per_tenant: endpoints,
        first_lsn: 0x16_0000_0000,
    }
}

/// Fills `history`, archives every table into a store of `kind`.
pub async fn archived(history: History, kind: Kind) -> Archived {
    archived_with(history, kind, "").await
}

/// [`archived`], running `extra` SQL after the fill, before the archive.
pub async fn archived_with(history: History, kind: Kind, extra: &str) -> Archived {
    let pg = LocalPostgres::start().await.unwrap();
    let url = pg.create_database("platform").await.unwrap();
    let mut sql = pg.connect("platform").await.unwrap();
    walhook_sql::migrate::run(&mut sql).await.unwrap();
    sql.batch_execute(&history.setup_sql()).await.unwrap();
    for d in 0..history.days {
        sql.batch_execute(&history.day_sql(d)).await.unwrap();
    }
    if !extra.is_empty() {
        sql.batch_execute(extra).await.unwrap();
    }
    let deliveries = sql
        .query(
            "SELECT tenant_id, created_at, id, endpoint_id, event_type, status::text \
             FROM walhook.deliveries ORDER BY created_at DESC, id DESC",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| Row {
            tenant: r.get(0),
            created_at: r.get(1),
            id: r.get(2),
            endpoint: r.get(3),
            event_type: r.get(4),
            status: r.get(5),
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let (store, s3) = match kind {
        Kind::Local => (
            AnyStore::Local(LocalDirStore::open(dir.path().join("archive")).unwrap()),
            None,
        ),
        Kind::S3 => {
            let server = S3Server::start("walhook-cold")
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let settings = S3Settings {
                prefix: "archive".into(),
                endpoint: Some(server.endpoint().to_owned()),
                force_path_style: true,
                credentials: Some(S3Credentials {
                    access_key_id: server.access_key().to_owned(),
                    secret_access_key: server.secret_key().to_owned().into(),
                }),
                ..S3Settings::new(server.bucket())
            };
            (
                AnyStore::S3(S3Store::connect(settings).await.unwrap()),
                Some(server),
            )
        }
    };
    let platform = Platform::new(&url, 4).unwrap();
    let settings = Settings {
        hot_days: 1,
        today: Some(first_day() + chrono::Duration::days(i64::from(history.days) + 2)),
        ..Settings::default()
    };
    let reports = Archiver::new(platform.clone(), store.clone(), settings)
        .run(&walhook_archive::archiver::Silent)
        .await
        .unwrap();
    assert!(
        reports
            .iter()
            .all(|r| r.outcome == walhook_archive::Outcome::Archived),
        "{reports:#?}"
    );
    let left: i64 = sql
        .query_one("SELECT count(*) FROM walhook.deliveries", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0, "every delivery left the hot table");
    Archived {
        pg,
        platform,
        sql,
        store,
        history,
        deliveries,
        _dir: dir,
        _s3: s3,
    }
}

impl Archived {
    /// Cold history over the store, counting reads (and keeping the keys).
    pub fn cold(&self, limits: ColdLimits) -> ColdHistory<CountingStore<AnyStore>> {
        ColdHistory::with_limits(
            self.platform.clone(),
            CountingStore::with_key_log(self.store.clone()),
            Duration::from_secs(3650 * 86_400),
            limits,
        )
    }

    /// The deliveries of `tenant` that `keep` admits, newest first.
    pub fn expected(&self, tenant: &str, keep: impl Fn(&Row) -> bool) -> Vec<Uuid> {
        self.deliveries
            .iter()
            .filter(|r| r.tenant == tenant && keep(r))
            .map(|r| r.id)
            .collect()
    }
}

/// A listing filter of `tenant`.
pub fn filter(tenant: &str) -> DeliveryFilter {
    DeliveryFilter {
        tenant: walhook_pipeline::ids::TenantId::new(tenant).unwrap(),
        endpoint: None,
        event_type: None,
        status: None,
        since: None,
        until: None,
        before: None,
        limit: 50,
    }
}

/// One request as the API makes it.
#[derive(Debug, Clone)]
pub struct Request {
    /// Ids returned, newest first.
    pub ids: Vec<Uuid>,
    /// Bytes the store served for it.
    pub bytes: u64,
    /// Keys read.
    pub keys: Vec<String>,
    /// The cursor it gave.
    pub cursor: Option<(SystemTime, Uuid)>,
}

/// Pages through `filter` with pages of `limit` as the API does (it asks
/// for one row more than it shows; a full page's cursor is its last row, a
/// short page's the listing's resume position): every request.
pub async fn page_through(
    cold: &ColdHistory<CountingStore<AnyStore>>,
    mut filter: DeliveryFilter,
    limit: usize,
) -> Vec<Request> {
    let mut out = Vec::new();
    filter.limit = limit as i64 + 1;
    loop {
        let before = cold.store().totals();
        cold.store().take_keys();
        let page = cold.list_deliveries(&filter, None, None).await.unwrap();
        let after = cold.store().totals();
        assert_eq!(
            page.bytes,
            after.bytes - before.bytes,
            "the page's own count"
        );
        let mut rows = page.rows;
        let cursor = if rows.len() > limit {
            rows.truncate(limit);
            rows.last()
                .map(|r| (r.created_at, Uuid::from_bytes(r.id.0)))
        } else {
            page.resume
        };
        out.push(Request {
            ids: rows.iter().map(|r| Uuid::from_bytes(r.id.0)).collect(),
            bytes: after.bytes - before.bytes,
            keys: cold.store().take_keys(),
            cursor,
        });
        match cursor {
            Some(c) => filter.before = Some(c),
            None => return out,
        }
        assert!(out.len() < 10_000, "the listing does not end");
    }
}
