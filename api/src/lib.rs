//! walhook's control plane: the REST API.
//!
//! ```text
//!  operator token ──▶ /v1/tenants, /v1/tenants/{id}/api-keys, /v1/audit-log
//!  tenant API key ──▶ /v1/webhook-endpoints[/{id}[/versions|/rotate-secret|/recover|/test]]
//!                     /v1/webhook-deliveries[/{id}[/replay|/cancel]], /v1/event-types, /v1/audit-log
//!  anyone        ──▶ /healthz, /readyz, /openapi.json
//!  metrics token ──▶ /metrics (or, with no token, on [api].metrics_listen: loopback)
//!  browser       ──▶ /console (pages over the routes above; see [`console`])
//!                          │
//!                          ▼
//!        platform Postgres (walhook-sql): endpoints + versions, secrets, deliveries,
//!        attempts, replay requests (carried out by the dispatcher), audit log
//! ```
//!
//! - [`server`], [`edge`], [`client`]: what every connection and request
//!   meets first: a header read timeout and connections capped per
//!   address; methods outside the standard set refused before anything
//!   else sees them; the client address (behind trusted proxies, from
//!   `X-Forwarded-For`); HSTS when the public URL is https.
//! - [`auth`]: bearer tokens; every tenant query is scoped to the caller's
//!   tenant, so another tenant's object is a 404 like a missing one.
//!   Failed authentications and console sign-ins are rate-limited per
//!   address and per credential ([`ratelimit`]).
//! - [`limits`], [`quota`], [`cache`]: what the API may take from the
//!   process and the database: requests at once (shared fairly between
//!   addresses and tenants), their duration and their bodies' duration,
//!   per-tenant quotas, and one database read per interval for the
//!   unauthenticated `/metrics` and `/readyz`. The API has its own small
//!   pool ([`connect`]) whose connections carry a `statement_timeout`.
//! - [`operator_token`]: the operator token's strength, checked at load.
//! - [`cold`]: archived history (listings paged through archived days
//!   within a budget, lookups in one day, reads at once per tenant).
//! - [`error`]: RFC 9457 problem documents naming the field at fault.
//! - [`extract`]: JSON bodies and query strings parsed into problems, not
//!   plain-text rejections.
//! - [`idempotency`]: `Idempotency-Key` on every POST.
//! - [`metrics`]: the Prometheus registry this service serves and the
//!   pipeline in the same process feeds.
//! - [`routes`]: one module per resource; [`openapi`] collects them into the
//!   document served at `/openapi.json` and committed as `api/openapi.json`.
//!
//! [`serve`] takes its listener and a shutdown token, so tests and
//! `walhook run` start it in-process; [`serve_metrics`] serves `/metrics`
//! alone on a listener of its own (`[api].metrics_listen`).

// Tests spawn freely; production code spawns through the supervisor.
#![cfg_attr(test, allow(clippy::disallowed_methods))]

pub mod auth;
pub mod cache;
pub mod client;
pub mod cold;
pub mod console;
pub mod cursor;
pub mod edge;
pub mod error;
pub mod extract;
pub mod idempotency;
pub mod keys;
pub mod limits;
pub mod metrics;
pub mod model;
pub mod openapi;
pub mod operator_token;
pub mod quota;
pub mod ratelimit;
pub mod routes;
pub mod server;
pub mod settings;
pub mod test_event;

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use walhook_sql::{Platform, StoreError};

pub use cold::Cold;
pub use error::ApiError;
pub use metrics::Metrics;
pub use settings::{ApiLimits, ApiSettings};

/// The API's own pool on the platform database at `url`: at most
/// `limits.max_connections` connections, each with `statement_timeout`
/// set, so that API traffic cannot take the pipeline's connections or hold
/// one with an endless query. Add the keyring with
/// [`Platform::with_keyring`].
pub fn connect(
    options: &walhook_pgtls::ConnectOptions,
    limits: &ApiLimits,
) -> Result<Platform, StoreError> {
    Platform::from_options(options, limits.max_connections, &limits.session())
}

/// What every handler shares.
#[derive(Clone)]
pub struct ApiState {
    /// The platform database (the API's own pool: [`connect`]).
    pub platform: Platform,
    /// The API's settings.
    pub settings: Arc<ApiSettings>,
    /// The metrics registry served at `/metrics`.
    pub metrics: Arc<Metrics>,
    /// Limits and caches shared by every request.
    pub(crate) guards: Arc<Guards>,
    /// Archived history, when the archive's store is configured: listings,
    /// details and replays of deliveries that left the hot tables.
    pub cold: Option<Arc<Cold>>,
    /// The threads archive reads run on ([`cold::ColdPool`]).
    pub(crate) cold_pool: Option<Arc<cold::ColdPool>>,
}

/// What requests share to stay within the limits.
#[derive(Debug)]
pub(crate) struct Guards {
    /// Requests at once and their duration.
    pub(crate) requests: Arc<limits::RequestLimits>,
    /// Test events per tenant and minute.
    pub(crate) test_events: quota::PerMinute,
    /// Ownership checks asked for per endpoint and minute.
    pub(crate) verify_requests: quota::PerMinute<walhook_pipeline::ids::EndpointId>,
    /// The last readiness check: `Err` holds the cause, for the log only.
    pub(crate) readiness: cache::TtlCache<Result<(), String>>,
    /// Prefixes of live API keys: made-up keys cost no query.
    pub(crate) key_prefixes: keys::KnownPrefixes,
    /// Live keys found in the last [`keys::VERIFIED_FOR`].
    pub(crate) verified_keys: keys::VerifiedKeys,
    /// Failed authentications per address and per token.
    pub(crate) failed_auths: ratelimit::Attempts,
    pub(crate) console: console::Console,
    /// Archive reads started per tenant and minute (keyed by a digest of
    /// the tenant id).
    pub(crate) cold_rate: ratelimit::RateTable<ratelimit::CredentialKey>,
    /// Archive reads refused per tenant, draining at the tenant's reads
    /// per minute: how many wait ahead of the next one refused, which sets
    /// its `Retry-After`.
    pub(crate) cold_queue: ratelimit::RateTable<ratelimit::CredentialKey>,
}

impl ApiState {
    /// The state of a server on `platform` with `settings`.
    pub fn new(platform: Platform, settings: ApiSettings, metrics: Arc<Metrics>) -> Self {
        let limits = settings.limits;
        ApiState {
            platform,
            settings: Arc::new(settings),
            guards: Arc::new(Guards {
                requests: Arc::new(limits::RequestLimits::new(&limits, metrics.clone())),
                test_events: quota::PerMinute::new(limits.test_events_per_minute),
                verify_requests: quota::PerMinute::new(limits.verify_requests_per_minute),
                readiness: cache::TtlCache::default(),
                key_prefixes: keys::KnownPrefixes::default(),
                verified_keys: keys::VerifiedKeys::default(),
                failed_auths: ratelimit::Attempts::new(limits.failed_authentications_per_minute),
                console: console::Console::new(limits.sign_in_attempts_per_minute),
                cold_rate: ratelimit::RateTable::with_burst(
                    limits.cold_reads_per_minute,
                    (limits.cold_reads_per_minute / 10).max(1),
                    ratelimit::MAX_TRACKED,
                ),
                cold_queue: ratelimit::RateTable::new(
                    limits.cold_reads_per_minute,
                    ratelimit::MAX_TRACKED,
                ),
            }),
            metrics,
            cold: None,
            cold_pool: None,
        }
    }

    /// The same state, reading archived history from `cold` (its reads
    /// and refusals are on `/metrics`).
    ///
    /// Starts the threads archive reads run on; fails when the system
    /// refuses a thread.
    pub fn with_cold(mut self, cold: Arc<Cold>) -> std::io::Result<Self> {
        self.cold_pool = Some(Arc::new(cold::ColdPool::new(cold::cold_threads())?));
        self.metrics
            .register_collector(Box::new(cold::ColdCollector(cold.clone())));
        self.cold = Some(cold);
        Ok(self)
    }

    /// Runs `read` of archived history for `tenant` on the archive read
    /// threads, with one of the tenant's read slots (`held`, or one taken
    /// here: a tenant at its cap is refused before anything is queued or
    /// read); `None` when no archive is configured.
    pub(crate) async fn cold_read<T, F, Fut>(
        &self,
        tenant: &walhook_pipeline::ids::TenantId,
        held: Option<walhook_archive::cold::Slot>,
        read: F,
    ) -> Result<Option<T>, ApiError>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Cold>, walhook_archive::cold::Slot) -> Fut,
        Fut:
            std::future::Future<Output = Result<T, walhook_archive::ArchiveError>> + Send + 'static,
    {
        match (&self.cold, &self.cold_pool) {
            (Some(cold), Some(pool)) => {
                let slot = match held {
                    Some(slot) => slot,
                    None => self.hold_cold(cold, tenant)?,
                };
                pool.run(read(cold.clone(), slot)).await.map(Some)
            }
            _ => Ok(None),
        }
    }

    /// One of `tenant`'s archive read slots, counted against its reads per
    /// minute: a `429` naming `cold_reads_per_minute` when it started
    /// that many (with the wait until the next), or `cold_reads_per_tenant`
    /// when it has that many in progress; either before anything is read.
    pub(crate) fn hold_cold(
        &self,
        cold: &Cold,
        tenant: &walhook_pipeline::ids::TenantId,
    ) -> Result<walhook_archive::cold::Slot, ApiError> {
        let key = ratelimit::CredentialKey::of(tenant.as_str());
        let now = std::time::Instant::now();
        if let Some(next) = self.guards.cold_rate.wait(key, now) {
            // Come back when the reads refused before this one had their
            // turn: clients that honour Retry-After then return spread
            // out at the rate reads are allowed, instead of all asking
            // again every second.
            let queue = &self.guards.cold_queue;
            let ahead = queue.take_and_count(key, now);
            let wait = next.max(std::time::Duration::from_secs_f64(
                ahead / queue.per_second(),
            ));
            let limit = self.settings.limits.cold_reads_per_minute;
            return Err(cold::reads_too_often(tenant.as_str(), limit, wait));
        }
        let slot = cold.hold(tenant)?;
        self.guards.cold_rate.take(key, now);
        Ok(slot)
    }

    /// How many times the live keys' prefixes were read (at most once a
    /// second, however many made-up keys arrive).
    pub fn key_prefix_reads(&self) -> u64 {
        self.guards.key_prefixes.reads()
    }

    /// How many times `/readyz` asked the database (at most once per
    /// `[api].metrics_cache`).
    pub fn readiness_checks(&self) -> u64 {
        self.guards.readiness.reads()
    }

    /// Console sessions held now.
    pub fn console_sessions(&self) -> usize {
        self.guards.console.session_count()
    }

    /// Console sessions held by `credential` (an API key or the operator
    /// token).
    pub fn console_sessions_held_by(&self, credential: &str) -> usize {
        self.guards.console.sessions_held_by(credential)
    }

    /// Entries of the attempt limits: (addresses, credentials) tracked for
    /// failed authentications.
    pub fn failed_auths_tracked(&self) -> (usize, usize) {
        self.guards.failed_auths.tracked()
    }

    /// Client addresses with requests in progress or waiting for a slot.
    pub fn clients_in_progress(&self) -> usize {
        self.guards.requests.clients_tracked()
    }
}

impl std::fmt::Debug for ApiState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiState")
            .field("platform", &self.platform)
            .finish_non_exhaustive()
    }
}

/// Why the service stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The listener failed.
    #[error("the API server failed")]
    Io(#[from] std::io::Error),
}

/// Serves the API on `listener` until `shutdown`, then finishes the
/// requests in progress. Also purges old idempotency records hourly.
#[allow(clippy::disallowed_methods)] // bare spawn: the purge task ends with the server, which awaits it
pub async fn serve(
    listener: TcpListener,
    state: ApiState,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    let purge = {
        let platform = state.platform.clone();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(std::time::Duration::from_secs(3600));
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tick.tick() => {}
                }
                match platform
                    .purge_idempotency_keys(idempotency::RETENTION_SECS)
                    .await
                {
                    Ok(n) if n > 0 => tracing::debug!(removed = n, "purged idempotency records"),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "could not purge idempotency records"),
                }
            }
        })
    };
    let connections = Arc::new(server::ConnectionLimits::new(
        state.settings.limits.max_connections_per_client,
        state.settings.trusted_proxies.clone(),
    ));
    let metrics = state.metrics.clone();
    let app = routes::router(state);
    let result = server::run(listener, app, connections, Some(metrics), shutdown).await;
    purge.abort();
    result.map_err(ServeError::Io)
}

/// Serves `GET /metrics` alone, without a token, on `listener` until
/// `shutdown`: the `[api].metrics_listen` address (loopback by default),
/// for a Prometheus on this host. The series are the same as on the
/// public listener, where reading them needs a token.
pub async fn serve_metrics(
    listener: TcpListener,
    state: ApiState,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    let app = routes::metrics_router(state);
    server::run(
        listener,
        app,
        Arc::new(server::ConnectionLimits::none()),
        None,
        shutdown,
    )
    .await
    .map_err(ServeError::Io)
}
