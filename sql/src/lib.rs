//! The platform database: schema `walhook`.
//!
//! ```text
//!  migrations/*.sql ──▶ migrate ──▶ walhook.{capture_checkpoints, tenants, endpoints,
//!                                           events, deliveries, attempts, audit_log, …}
//!  capture ─checkpoints, incidents─▶ │ ◀─ events + deliveries ─ fan-out
//!                                    │ ◀─ attempts, states ──── dispatch
//! ```
//!
//! - [`migrate`]: versioned, idempotent migrations embedded in the binary.
//! - [`Platform`]: a connection pool and the queries each stage runs; one
//!   module per stage ([`capture`], [`fanout`], [`dispatch`]) and for the
//!   control plane ([`tenants`], [`endpoint_admin`], [`deliveries`],
//!   [`replay`], [`rotation`], [`audit`], [`idempotency`], [`gauges`],
//!   [`incidents`]). Its connections honour libpq's
//!   `sslmode`/`sslrootcert` through [`walhook_pgtls`] (rustls).
//! - [`secrets`]: endpoint signing secrets sealed at rest (AES-256-GCM)
//!   under the [`Keyring`] given to [`Platform::with_keyring`].

// Tests spawn freely; production code spawns through the supervisor.
#![cfg_attr(test, allow(clippy::disallowed_methods))]

pub mod audit;
pub mod cancel;
pub mod capture;
pub mod deliveries;
pub mod directory;
pub mod dispatch;
pub mod endpoint_admin;
pub mod endpoints;
pub mod fanout;
pub mod gauges;
pub mod idempotency;
pub mod incidents;
pub mod membership;
pub mod migrate;
pub mod reconcile;
pub mod replay;
pub mod rotation;
pub mod schemas;
pub mod secrets;
pub mod tallies;
pub mod tenants;
pub mod verification;

pub use secrets::Keyring;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use walhook_pgtls::DatabaseUrl;
use walhook_pgtls::{ConnectError, ConnectOptions, TlsFields};
use walhook_pipeline::store::ErrorKind;

/// Errors talking to the platform database.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The URL or its TLS settings cannot be used (the message names the
    /// parameter or file; it never quotes the URL, which may hold a
    /// password).
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// The pool could not be built.
    #[error("cannot build the platform database's connection pool")]
    PoolBuild(#[source] deadpool_postgres::BuildError),
    /// No connection could be made or kept.
    #[error("cannot reach the platform database")]
    Pool(#[from] deadpool_postgres::PoolError),
    /// A statement failed.
    #[error("platform database error while trying to {what}")]
    Query {
        /// What was being done.
        what: &'static str,
        /// The database error.
        #[source]
        source: tokio_postgres::Error,
    },
    /// The schema is older or newer than this binary.
    #[error("{0}")]
    Schema(String),
    /// A stored name (a status, an outcome, a class) this version does not
    /// know: the row was written by a newer version or edited by hand.
    #[error("{row}: {source}")]
    Stored {
        /// The row (`delivery dlv_…`).
        row: String,
        /// The value and the names this version knows.
        #[source]
        source: walhook_pipeline::stored::UnknownName,
    },
    /// A secret could not be sealed or opened (no keyring, an unknown
    /// master key, an altered row): the operator must act.
    #[error(transparent)]
    Secrets(#[from] secrets::SecretsError),
    /// What was asked conflicts with what runs (the message says what and
    /// how to resolve it): the operator must act.
    #[error("{0}")]
    Refused(String),
}

impl StoreError {
    /// A mapper for `map_err` on queries.
    pub fn query(what: &'static str) -> impl FnOnce(tokio_postgres::Error) -> StoreError {
        move |source| StoreError::Query { what, source }
    }

    /// What the failure means for the caller, from the SQLSTATE (or, for
    /// errors without one, from their kind): see
    /// [`walhook_pipeline::store::ErrorKind`].
    pub fn kind(&self) -> ErrorKind {
        match self {
            StoreError::Pool(deadpool_postgres::PoolError::Backend(e)) => connect_kind(e),
            StoreError::Pool(deadpool_postgres::PoolError::Closed) => ErrorKind::Definite,
            StoreError::Pool(_) => ErrorKind::Transient,
            StoreError::Query { source, .. } => kind_of(source),
            StoreError::Connect(e) if e.is_transient() => ErrorKind::Transient,
            _ => ErrorKind::Definite,
        }
    }

    /// Whether retrying may help (connection trouble, serialization
    /// failures, timeouts) rather than the operator having to act.
    pub fn is_transient(&self) -> bool {
        self.kind() == ErrorKind::Transient
    }
}

/// The kind of a tokio-postgres error: by SQLSTATE when the server sent
/// one; an error without one is the connection's (closed, reset, I/O).
pub fn kind_of(e: &tokio_postgres::Error) -> ErrorKind {
    match e.code() {
        Some(code) => ErrorKind::of_sqlstate(code.code()),
        None => ErrorKind::Transient,
    }
}

/// Whether a failed connection may succeed when tried again: not when the
/// server's certificate did not verify or the settings are wrong
/// ([`ConnectError::is_transient`]), nor when the server refused the
/// client (SQLSTATE class 28, e.g. `pg_hba.conf` demands TLS or the
/// password is wrong: [`ErrorKind::of_sqlstate`] says definite); the
/// operator acts then.
fn connect_kind(e: &tokio_postgres::Error) -> ErrorKind {
    if let Some(c) = walhook_pgtls::find_connect_error(e) {
        return if c.is_transient() {
            ErrorKind::Transient
        } else {
            ErrorKind::Definite
        };
    }
    kind_of(e)
}

/// Whether libpq `options` set `name`: `-c name=…`, `-cname=…` or
/// `--name=…` (not a longer setting that starts with `name`).
fn sets(options: &str, name: &str) -> bool {
    options.split_whitespace().any(|w| {
        w.strip_prefix("-c")
            .unwrap_or(w)
            .trim_start_matches('-')
            .strip_prefix(name)
            .is_some_and(|rest| rest.starts_with('='))
    })
}

/// Settings every connection of a pool starts with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionOptions {
    /// Postgres cancels a statement that runs longer (`statement_timeout`),
    /// so that one slow query cannot hold a connection indefinitely.
    pub statement_timeout: Option<std::time::Duration>,
    /// Shown in `pg_stat_activity`, so an operator can tell the pools
    /// apart; a name in the URL wins.
    pub application_name: Option<String>,
}

impl SessionOptions {
    /// Adds the options to `cfg`, after any the URL gave, and turns JIT
    /// compilation off unless the URL's options set `jit` themselves.
    ///
    /// walhook's statements are short, and Postgres decides to compile one
    /// from the planner's cost estimate alone: a stale estimate (a queue
    /// table that was large when it was last analyzed) made the plan
    /// tidier's few-millisecond delete spend about half a second of CPU
    /// compiling, every 30 s, under load (docs/performance.md).
    ///
    /// It also plans every execution of a prepared statement for the
    /// tables as they are then (`plan_cache_mode = force_custom_plan`),
    /// unless the URL's options set `plan_cache_mode`. The queue tables
    /// (`fanouts`, `pending`) empty out whenever walhook catches up, and a
    /// generic plan cached then (after five executions) believed them
    /// empty for good: the recorder's statement scanned all of `fanouts`
    /// for each row of a batch, took seconds once the queue refilled, and
    /// stalled dispatch until the plan was replaced. A custom plan sees
    /// each table's current size; it costs a planning per execution
    /// (docs/performance.md, "Plans that outlive the queue").
    fn apply(&self, cfg: &mut tokio_postgres::Config) {
        let from_url = cfg.get_options().unwrap_or_default().to_owned();
        let mut options = vec![from_url.clone()];
        if let Some(timeout) = self.statement_timeout {
            // At least 1 ms: 0 would turn the timeout off.
            let ms = timeout.as_millis().max(1);
            options.push(format!("-c statement_timeout={ms}"));
        }
        let sets_jit = sets(&from_url, "jit");
        if !sets_jit {
            options.push("-c jit=off".to_owned());
        }
        if !sets(&from_url, "plan_cache_mode") {
            options.push("-c plan_cache_mode=force_custom_plan".to_owned());
        }
        options.retain(|o| !o.is_empty());
        cfg.options(options.join(" "));
        if let Some(name) = &self.application_name
            && cfg.get_application_name().is_none()
        {
            cfg.application_name(name);
        }
    }
}

/// The platform database: a pool of connections, and the keyring that
/// seals and opens endpoint secrets.
#[derive(Clone)]
pub struct Platform {
    pool: Pool,
    keyring: Option<std::sync::Arc<Keyring>>,
    /// Daily partitions known to exist: (table, day since 1970).
    partitions: std::sync::Arc<parking_lot::Mutex<std::collections::HashSet<(&'static str, i64)>>>,
    /// Event types known to be in the catalog (see `fanout`).
    catalogued: std::sync::Arc<parking_lot::Mutex<std::collections::HashSet<String>>>,
    /// When the prepared statements were last dropped, and the time until
    /// the next drop (see [`REPLAN_EVERY`]).
    replanned: std::sync::Arc<parking_lot::Mutex<(std::time::Instant, std::time::Duration)>>,
}

/// How often every connection's prepared statements are dropped and
/// prepared again. Postgres keeps a prepared statement's generic plan
/// until the statistics of its tables change, and autovacuum may take
/// minutes to analyze them: a plan made while a table was small (a fresh
/// install, `walhook.fanouts` between bursts) scans the whole table on
/// every batch once it has grown, and a backlog would never drain. A new
/// plan scales each table's row estimate by its current size, so the hot
/// statements go back to primary-key probes within this time. Tables grow
/// fastest from empty, so the first drops come sooner: after 1 s, then
/// 2, 4, 8 and 16 s.
pub const REPLAN_EVERY: std::time::Duration = std::time::Duration::from_secs(20);

impl std::fmt::Debug for Platform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Platform")
            .field("status", &self.pool.status())
            .field(
                "keyring",
                &self.keyring.as_ref().map(|k| k.current_id().to_owned()),
            )
            .finish()
    }
}

impl Platform {
    /// A pool of up to `max_connections` connections to `url`, with the
    /// TLS settings of its parameters (`?sslmode=verify-full&sslrootcert=…`,
    /// see [`walhook_pgtls`]). Nothing is connected until first use;
    /// [`Platform::check`] connects at once.
    ///
    /// Without [`Platform::with_keyring`], everything that touches endpoint
    /// secrets (creating an endpoint, rotating or loading secrets) fails
    /// with [`secrets::SecretsError::NoKeyring`].
    pub fn new(url: &str, max_connections: usize) -> Result<Self, StoreError> {
        Self::with_session(url, max_connections, &SessionOptions::default())
    }

    /// Like [`Platform::new`], with `session` applied to every connection
    /// when it is opened (as startup options, so no extra round trip).
    pub fn with_session(
        url: &str,
        max_connections: usize,
        session: &SessionOptions,
    ) -> Result<Self, StoreError> {
        let options =
            ConnectOptions::parse(&DatabaseUrl::new(url), "[platform]", &TlsFields::default())?;
        Self::from_options(&options, max_connections, session)
    }

    /// A pool of up to `max_connections` connections made with `options`
    /// (a URL and the `[platform]` section's TLS fields), `session` applied
    /// to each. Reads `sslrootcert` now, so that a missing file stops
    /// start-up.
    pub fn from_options(
        options: &ConnectOptions,
        max_connections: usize,
        session: &SessionOptions,
    ) -> Result<Self, StoreError> {
        let mut cfg = options.config().clone();
        session.apply(&mut cfg);
        let manager = Manager::from_config(
            cfg,
            options.connector()?,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(max_connections.max(1))
            .build()
            .map_err(StoreError::PoolBuild)?;
        Ok(Platform {
            pool,
            keyring: None,
            partitions: Default::default(),
            catalogued: Default::default(),
            replanned: std::sync::Arc::new(parking_lot::Mutex::new((
                std::time::Instant::now(),
                std::time::Duration::from_secs(1),
            ))),
        })
    }

    /// The same platform, sealing and opening endpoint secrets with
    /// `keyring`.
    pub fn with_keyring(mut self, keyring: Keyring) -> Self {
        self.keyring = Some(std::sync::Arc::new(keyring));
        self
    }

    /// The keyring, or the error that says how to configure one.
    pub fn keyring(&self) -> Result<&Keyring, StoreError> {
        self.keyring
            .as_deref()
            .ok_or(StoreError::Secrets(secrets::SecretsError::NoKeyring))
    }

    /// Connects once and checks that the schema is migrated.
    pub async fn check(&self) -> Result<(), StoreError> {
        let client = self.pool.get().await?;
        migrate::check_current(&**client).await
    }

    /// A connection from the pool.
    pub async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        {
            let mut replanned = self.replanned.lock();
            let (last, gap) = *replanned;
            if last.elapsed() >= gap {
                *replanned = (std::time::Instant::now(), (gap * 2).min(REPLAN_EVERY));
                self.pool.manager().statement_caches.clear();
            }
        }
        Ok(self.pool.get().await?)
    }
}

/// Commits transaction `$tx` of connection `$client` (an expression with
/// `.await`, inside an async fn) and leaves the connection fit for the
/// pool either way. `Transaction::commit` marks the transaction finished
/// before it sends `COMMIT`; a cancel that strikes the `COMMIT` before it
/// begins (a statement timeout, an operator's `pg_cancel_backend`) leaves
/// the session inside an aborted transaction block, and every statement of
/// whoever takes the connection next fails with "current transaction is
/// aborted" (found by the chaos soak's cancel storm: fan-out stopped the
/// process). After a failed `COMMIT` this sends `ROLLBACK`, which ends such
/// a block (and only warns when the `COMMIT` had ended it).
#[macro_export]
macro_rules! commit {
    ($tx:ident, $client:ident) => {{
        #[allow(clippy::disallowed_methods)] // the one place that commits
        let done = $tx.commit().await;
        if done.is_err() {
            let _ = $client.batch_execute("ROLLBACK").await;
        }
        done
    }};
}

/// The leading columns of a delivery as fan-out plans it and as its first
/// row repeats it: id, event, endpoint, tenant, event type, when the event
/// occurred, the endpoint's config version (for [`unnested`]).
pub(crate) const PLANNED_DELIVERY: [(&str, &str); 7] = [
    ("id", "uuid"),
    ("ev", "uuid"),
    ("ep", "uuid"),
    ("tenant", "text"),
    ("etype", "text"),
    ("occ", "timestamptz"),
    ("ver", "int4"),
];

/// Rows from array parameters, one array per column from `$first` on,
/// as a subquery for `FROM`: `(SELECT unnest($3::uuid[]) AS id,
/// unnest($4::text[]) AS status)`. The arrays are unnested side by side in
/// the select list rather than by a multi-argument `unnest(…)` in `FROM`,
/// which stores every column of every row in a tuple store of its own
/// before the rows are put together: on the hot statements that cost
/// about a microsecond per row of 16 columns, half of a plain insert's
/// work (docs/performance.md). Arrays of one statement have the same
/// length, so both forms give the same rows.
pub(crate) fn unnested(first: usize, columns: &[(&str, &str)]) -> String {
    let list = columns
        .iter()
        .enumerate()
        .map(|(i, (name, ty))| format!("unnest(${}::{ty}[]) AS {name}", first + i))
        .collect::<Vec<_>>()
        .join(", ");
    format!("(SELECT {list})")
}

/// Crash tests: after a write that committed, the failpoint `point` (action
/// `end`) loses its answer, as when the connection breaks between the two:
/// the caller is told the write failed for a transient reason.
/// Reads a stored name back into its enum (see `walhook_pipeline::stored`):
/// a value this version does not know is a data error naming the row, the
/// value and the names it knows, never a silent default.
pub(crate) fn stored<T>(text: &str, row: &str, id: impl std::fmt::Display) -> Result<T, StoreError>
where
    T: for<'a> TryFrom<&'a str, Error = walhook_pipeline::stored::UnknownName>,
{
    T::try_from(text).map_err(|source| StoreError::Stored {
        row: format!("{row} {id}"),
        source,
    })
}

/// [`stored`] for a nullable column.
pub(crate) fn stored_opt<T>(
    text: Option<&str>,
    row: &str,
    id: impl std::fmt::Display,
) -> Result<Option<T>, StoreError>
where
    T: for<'a> TryFrom<&'a str, Error = walhook_pipeline::stored::UnknownName>,
{
    text.map(|t| stored(t, row, id)).transpose()
}

pub(crate) fn answer_lost(point: &'static str) -> Result<(), walhook_pipeline::store::StoreError> {
    if walhook_pipeline::failpoint::hit(point) {
        return Err(walhook_pipeline::store::StoreError::transient(
            format!("the write committed but its answer was lost (failpoint {point})"),
            std::io::Error::from(std::io::ErrorKind::ConnectionReset),
        ));
    }
    Ok(())
}

impl From<StoreError> for walhook_pipeline::store::StoreError {
    fn from(e: StoreError) -> Self {
        walhook_pipeline::store::StoreError {
            message: e.to_string(),
            kind: e.kind(),
            source: Some(Box::new(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_options_join_the_urls() {
        use std::str::FromStr;
        let session = SessionOptions {
            statement_timeout: Some(std::time::Duration::from_secs(10)),
            application_name: Some("walhook-api".into()),
        };
        let mut cfg =
            tokio_postgres::Config::from_str("postgres://u@h/d?options=-c%20work_mem%3D4MB")
                .unwrap();
        session.apply(&mut cfg);
        assert_eq!(
            cfg.get_options(),
            Some(
                "-c work_mem=4MB -c statement_timeout=10000 -c jit=off -c plan_cache_mode=force_custom_plan"
            )
        );
        assert_eq!(cfg.get_application_name(), Some("walhook-api"));
        let mut named =
            tokio_postgres::Config::from_str("postgres://u@h/d?application_name=mine").unwrap();
        session.apply(&mut named);
        assert_eq!(named.get_application_name(), Some("mine"));
        assert_eq!(
            named.get_options(),
            Some("-c statement_timeout=10000 -c jit=off -c plan_cache_mode=force_custom_plan")
        );
    }

    #[test]
    fn jit_is_off_unless_the_url_says_otherwise() {
        use std::str::FromStr;
        let mut plain = tokio_postgres::Config::from_str("postgres://u@h/d").unwrap();
        SessionOptions::default().apply(&mut plain);
        assert_eq!(
            plain.get_options(),
            Some("-c jit=off -c plan_cache_mode=force_custom_plan")
        );
        let mut chosen =
            tokio_postgres::Config::from_str("postgres://u@h/d?options=-c%20jit%3Don").unwrap();
        SessionOptions::default().apply(&mut chosen);
        assert_eq!(
            chosen.get_options(),
            Some("-c jit=on -c plan_cache_mode=force_custom_plan")
        );
        let mut tuned =
            tokio_postgres::Config::from_str("postgres://u@h/d?options=-c%20jit_above_cost%3D1000")
                .unwrap();
        SessionOptions::default().apply(&mut tuned);
        assert_eq!(
            tuned.get_options(),
            Some("-c jit_above_cost=1000 -c jit=off -c plan_cache_mode=force_custom_plan")
        );
    }

    #[test]
    fn every_execution_is_planned_unless_the_url_says_otherwise() {
        use std::str::FromStr;
        let mut chosen = tokio_postgres::Config::from_str(
            "postgres://u@h/d?options=-c%20plan_cache_mode%3Dauto",
        )
        .unwrap();
        SessionOptions::default().apply(&mut chosen);
        assert_eq!(
            chosen.get_options(),
            Some("-c plan_cache_mode=auto -c jit=off")
        );
    }
}
