//! A throwaway platform database with the walhook schema, rows written
//! straight into the hot tables (as fan-out and dispatch leave them), and
//! the stores the archive writes to.

use chrono::NaiveDate;
use walhook_connectors::objstore::{S3Credentials, S3Settings, S3Store};
use walhook_devkit::postgres::LocalPostgres;
use walhook_devkit::s3::S3Server;
use walhook_sql::Platform;

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
