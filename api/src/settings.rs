//! The API's settings: who the operator is, which URLs endpoints may have,
//! the defaults of secret rotation and test deliveries, and the limits that
//! keep the API from starving the pipeline or the database ([`ApiLimits`]).

use std::time::Duration;

use walhook_pipeline::redact::Redacted;
use walhook_pipeline::url_policy::UrlPolicy;

/// The shortest operator token accepted.
pub const MIN_OPERATOR_TOKEN_LEN: usize = 32;

/// The default overlap of a secret rotation: the previous secret keeps
/// signing this long, so receivers can switch without a failed check.
pub const DEFAULT_ROTATION_OVERLAP: Duration = Duration::from_secs(24 * 3600);

/// The longest overlap a rotation may ask for.
pub const MAX_ROTATION_OVERLAP: Duration = Duration::from_secs(7 * 24 * 3600);

/// The default size of the API's own connection pool: small, so that the
/// API cannot take the connections fan-out and dispatch need.
pub const DEFAULT_MAX_CONNECTIONS: usize = 8;

/// The default time a request may take before it is answered 503.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The default `statement_timeout` of the API's connections: shorter than
/// the request timeout, so that Postgres stops a slow query before the
/// caller is answered (a dropped request does not stop the query by
/// itself).
pub const DEFAULT_STATEMENT_TIMEOUT: Duration = Duration::from_secs(10);

/// The default number of requests handled at once.
pub const DEFAULT_MAX_CONCURRENT_REQUESTS: usize = 64;

/// How long a request waits for a free slot when
/// `max_concurrent_requests` are in progress, before it is answered 503
/// with `Retry-After`: long enough to absorb a burst, short enough that a
/// saturated server says so quickly.
pub const QUEUE_WAIT: Duration = Duration::from_secs(1);

/// The default age up to which `/metrics` and `/readyz` reuse what they
/// last read from the database.
pub const DEFAULT_METRICS_CACHE: Duration = Duration::from_secs(5);

/// The default number of endpoints a tenant may have (deleted ones do not
/// count).
pub const DEFAULT_MAX_ENDPOINTS_PER_TENANT: u32 = 100;

/// The default number of test events a tenant may send per minute.
pub const DEFAULT_TEST_EVENTS_PER_MINUTE: u32 = 60;

/// The default number of ownership checks a tenant may ask for per
/// endpoint and minute (`POST …/verify`): enough to retry at once after
/// each fix of a receiver, too few for walhook to be a way of sending a
/// stream of requests to someone else's URL.
pub const DEFAULT_VERIFY_REQUESTS_PER_MINUTE: u32 = 5;
/// The default time an authenticated request's body may take to arrive.
pub const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The default number of requests one client address, or one tenant, may
/// have in progress at once (at most `max_concurrent_requests`).
pub const DEFAULT_MAX_REQUESTS_PER_CLIENT: usize = 16;

/// The default number of connections one client address may hold open.
pub const DEFAULT_MAX_CONNECTIONS_PER_CLIENT: usize = 64;

/// The default number of console sign-in attempts per minute, per client
/// address and per credential tried.
pub const DEFAULT_SIGN_IN_ATTEMPTS_PER_MINUTE: u32 = 10;

/// The default number of failed authentications per minute, per client
/// address and per credential presented.
pub const DEFAULT_FAILED_AUTHENTICATIONS_PER_MINUTE: u32 = 120;

/// The default address of the metrics listener: loopback, so that only
/// this host (a local Prometheus or agent) can read tenant and endpoint
/// series without a token.
pub const DEFAULT_METRICS_LISTEN: &str = "127.0.0.1:9464";
/// The default number of archive reads (listings reaching archived days,
/// lookups of archived deliveries, restores) one tenant may have at once.
pub const DEFAULT_COLD_READS_PER_TENANT: usize = walhook_archive::cold::DEFAULT_READS_PER_TENANT;

/// The default number of archive reads one tenant may start per minute
/// (10 a second, in bursts of at most a tenth of the minute's: 60).
pub const DEFAULT_COLD_READS_PER_MINUTE: u32 = 600;

/// The furthest back a recovery may start: older deliveries are past every
/// retry deadline and most archives' hot window, and a wider window is an
/// unbounded amount of work.
pub const MAX_RECOVER_WINDOW: Duration = Duration::from_secs(30 * 24 * 3600);

/// Limits on what the API may take from the process and the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiLimits {
    /// Connections in the API's own pool (`[api].max_connections`).
    pub max_connections: usize,
    /// `statement_timeout` of those connections (`[api].statement_timeout`).
    pub statement_timeout: Duration,
    /// The longest a request may take (`[api].request_timeout`).
    pub request_timeout: Duration,
    /// Requests handled at once (`[api].max_concurrent_requests`).
    pub max_concurrent_requests: usize,
    /// How long `/metrics` and `/readyz` reuse a database read
    /// (`[api].metrics_cache`).
    pub metrics_cache: Duration,
    /// Endpoints per tenant (`[api].max_endpoints_per_tenant`).
    pub max_endpoints_per_tenant: u32,
    /// Test events per tenant and minute (`[api].test_events_per_minute`).
    pub test_events_per_minute: u32,
    /// Ownership checks asked for per endpoint and minute
    /// (`[api].verify_requests_per_minute`).
    pub verify_requests_per_minute: u32,
    /// The longest an authenticated request's body may take to arrive
    /// (`[api].body_read_timeout`; capped by `request_timeout`).
    pub body_read_timeout: Duration,
    /// Requests one client address, or one tenant, may have in progress
    /// at once (`[api].max_requests_per_client`; at most
    /// `max_concurrent_requests` apply).
    pub max_requests_per_client: usize,
    /// Connections one client address may hold open
    /// (`[api].max_connections_per_client`; trusted proxies are exempt).
    pub max_connections_per_client: usize,
    /// Console sign-in attempts per minute, per client address and per
    /// credential (`[api].sign_in_attempts_per_minute`).
    pub sign_in_attempts_per_minute: u32,
    /// Failed authentications per minute, per client address and per
    /// credential (`[api].failed_authentications_per_minute`).
    pub failed_authentications_per_minute: u32,
    /// Archive reads one tenant may have at once
    /// (`[api].cold_reads_per_tenant`): more are answered 429.
    pub cold_reads_per_tenant: usize,
    /// Archive reads one tenant may start per minute
    /// (`[api].cold_reads_per_minute`): more are answered 429. Reads at
    /// once bound what a tenant holds; this bounds what it takes from the
    /// machine when its reads follow each other back to back.
    pub cold_reads_per_minute: u32,
}

impl Default for ApiLimits {
    fn default() -> Self {
        ApiLimits {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            statement_timeout: DEFAULT_STATEMENT_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            max_concurrent_requests: DEFAULT_MAX_CONCURRENT_REQUESTS,
            metrics_cache: DEFAULT_METRICS_CACHE,
            max_endpoints_per_tenant: DEFAULT_MAX_ENDPOINTS_PER_TENANT,
            test_events_per_minute: DEFAULT_TEST_EVENTS_PER_MINUTE,
            verify_requests_per_minute: DEFAULT_VERIFY_REQUESTS_PER_MINUTE,
            body_read_timeout: DEFAULT_BODY_READ_TIMEOUT,
            max_requests_per_client: DEFAULT_MAX_REQUESTS_PER_CLIENT,
            max_connections_per_client: DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
            sign_in_attempts_per_minute: DEFAULT_SIGN_IN_ATTEMPTS_PER_MINUTE,
            failed_authentications_per_minute: DEFAULT_FAILED_AUTHENTICATIONS_PER_MINUTE,
            cold_reads_per_tenant: DEFAULT_COLD_READS_PER_TENANT,
            cold_reads_per_minute: DEFAULT_COLD_READS_PER_MINUTE,
        }
    }
}

/// A setting out of range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("[api].{field} {message}")]
pub struct InvalidSetting {
    /// The field, as written in `[api]`.
    pub field: &'static str,
    /// What is wrong and the fix.
    pub message: String,
}

fn invalid(field: &'static str, message: impl Into<String>) -> InvalidSetting {
    InvalidSetting {
        field,
        message: message.into(),
    }
}

impl ApiLimits {
    /// Checks the limits; names the field and the fix.
    pub fn validate(&self) -> Result<(), InvalidSetting> {
        if self.max_connections == 0 {
            return Err(invalid(
                "max_connections",
                format!("is 0; give at least 1 ({DEFAULT_MAX_CONNECTIONS} is a good start)"),
            ));
        }
        if self.max_concurrent_requests == 0 {
            return Err(invalid(
                "max_concurrent_requests",
                format!("is 0; give at least 1 ({DEFAULT_MAX_CONCURRENT_REQUESTS} is usual)"),
            ));
        }
        if self.request_timeout < Duration::from_secs(1) {
            return Err(invalid(
                "request_timeout",
                format!(
                    "is {:?}; give at least \"1s\" (\"30s\" is usual)",
                    self.request_timeout
                ),
            ));
        }
        if self.statement_timeout.is_zero() || self.statement_timeout >= self.request_timeout {
            return Err(invalid(
                "statement_timeout",
                format!(
                    "is {:?}; give more than 0 and less than [api].request_timeout ({:?}), so that \
                     Postgres stops a slow query before the caller is answered",
                    self.statement_timeout, self.request_timeout
                ),
            ));
        }
        if self.metrics_cache.is_zero() {
            return Err(invalid(
                "metrics_cache",
                "is 0, which would let every scrape query the database; give e.g. \"5s\"",
            ));
        }
        if self.max_endpoints_per_tenant == 0 {
            return Err(invalid(
                "max_endpoints_per_tenant",
                format!("is 0; give at least 1 ({DEFAULT_MAX_ENDPOINTS_PER_TENANT} is usual)"),
            ));
        }
        if self.cold_reads_per_tenant == 0 {
            return Err(invalid(
                "cold_reads_per_tenant",
                format!(
                    "is 0, which would refuse every archive read; give at least 1 ({DEFAULT_COLD_READS_PER_TENANT} is usual)"
                ),
            ));
        }
        if self.cold_reads_per_minute == 0 {
            return Err(invalid(
                "cold_reads_per_minute",
                format!(
                    "is 0, which would refuse every archive read; give at least 1 ({DEFAULT_COLD_READS_PER_MINUTE} is usual)"
                ),
            ));
        }
        if self.test_events_per_minute == 0 {
            return Err(invalid(
                "test_events_per_minute",
                format!("is 0; give at least 1 ({DEFAULT_TEST_EVENTS_PER_MINUTE} is usual)"),
            ));
        }
        if self.verify_requests_per_minute == 0 {
            return Err(invalid(
                "verify_requests_per_minute",
                format!("is 0; give at least 1 ({DEFAULT_VERIFY_REQUESTS_PER_MINUTE} is usual)"),
            ));
        }
        if self.body_read_timeout < Duration::from_secs(1) {
            return Err(invalid(
                "body_read_timeout",
                format!(
                    "is {:?}; give at least \"1s\" (\"10s\" is usual)",
                    self.body_read_timeout
                ),
            ));
        }
        for (field, value, usual) in [
            (
                "max_requests_per_client",
                self.max_requests_per_client,
                DEFAULT_MAX_REQUESTS_PER_CLIENT,
            ),
            (
                "max_connections_per_client",
                self.max_connections_per_client,
                DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
            ),
        ] {
            if value == 0 {
                return Err(invalid(
                    field,
                    format!("is 0; give at least 1 ({usual} is usual)"),
                ));
            }
        }
        for (field, value, usual) in [
            (
                "sign_in_attempts_per_minute",
                self.sign_in_attempts_per_minute,
                DEFAULT_SIGN_IN_ATTEMPTS_PER_MINUTE,
            ),
            (
                "failed_authentications_per_minute",
                self.failed_authentications_per_minute,
                DEFAULT_FAILED_AUTHENTICATIONS_PER_MINUTE,
            ),
        ] {
            if value == 0 {
                return Err(invalid(
                    field,
                    format!(
                        "is 0, which would refuse every attempt; give at least 1 ({usual} is usual)"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// How long a body may take: `body_read_timeout`, never more than the
    /// whole request may.
    pub fn body_deadline(&self) -> Duration {
        self.body_read_timeout.min(self.request_timeout)
    }

    /// The requests one client address or tenant may have in progress:
    /// `max_requests_per_client`, never more than `max_concurrent_requests`.
    pub fn client_share(&self) -> usize {
        self.max_requests_per_client
            .min(self.max_concurrent_requests)
            .max(1)
    }

    /// The requests one tenant may have in progress: its
    /// [`client_share`](Self::client_share), and never more than half of
    /// the API's database connections (at least one), so that one tenant's
    /// requests can never hold every connection of the pool and another
    /// tenant's request never waits behind them for one.
    pub fn tenant_share(&self) -> usize {
        self.client_share().min((self.max_connections / 2).max(1))
    }

    /// The session options of the API's pool.
    pub fn session(&self) -> walhook_sql::SessionOptions {
        walhook_sql::SessionOptions {
            statement_timeout: Some(self.statement_timeout),
            application_name: Some("walhook-api".into()),
        }
    }
}

/// The API's settings.
#[derive(Debug, Clone)]
pub struct ApiSettings {
    /// The operator's bearer token (manages tenants and keys).
    pub operator_token: Redacted<String>,
    /// What endpoint URLs may be.
    pub url_policy: UrlPolicy,
    /// The overlap of a rotation that does not name one.
    pub rotation_overlap: Duration,
    /// When automatic retries of a test delivery stop (the `[retry]`
    /// deadline).
    pub test_delivery_deadline: Duration,
    /// Limits on requests, connections and tenants.
    pub limits: ApiLimits,
    /// How old an event may be for its deliveries to be replayed
    /// (`[archive] replay_window`, default 30 days), hot or archived.
    pub replay_window: Duration,
    /// The bounds of tenants' and endpoints' retry schedules
    /// (`[retry.limits]`).
    pub retry_limits: walhook_pipeline::retry::RetryLimits,
    /// Whether endpoints must pass an ownership check (prove a challenge)
    /// before anything is sent to them, at creation and whenever their URL's
    /// host changes (`[api] require_verification`, default on).
    pub require_verification: bool,
    /// A token that may read `/metrics` on the public listener besides
    /// the operator token (`[api].metrics_token`).
    pub metrics_token: Option<Redacted<String>>,
    /// Peers whose `X-Forwarded-For` names the client
    /// (`[api].trusted_proxies`); from any other peer the header is
    /// ignored.
    pub trusted_proxies: crate::client::TrustedProxies,
    /// The address browsers and clients use (`[api].public_url`); when it
    /// is https, every response carries `Strict-Transport-Security`.
    pub public_url: Option<url::Url>,
}

impl ApiSettings {
    /// Settings with the defaults and `operator_token`.
    pub fn new(operator_token: impl Into<String>, url_policy: UrlPolicy) -> Self {
        ApiSettings {
            operator_token: Redacted::new(operator_token.into()),
            url_policy,
            rotation_overlap: DEFAULT_ROTATION_OVERLAP,
            test_delivery_deadline: Duration::from_secs(24 * 3600),
            limits: ApiLimits::default(),
            replay_window: Duration::from_secs(30 * 86_400),
            retry_limits: Default::default(),
            require_verification: true,
            metrics_token: None,
            trusted_proxies: Default::default(),
            public_url: None,
        }
    }

    /// Whether responses carry `Strict-Transport-Security`: the API is
    /// reached over https (it never terminates TLS itself; a proxy in
    /// front does, and `public_url` says so).
    pub fn strict_transport(&self) -> bool {
        self.public_url
            .as_ref()
            .is_some_and(|u| u.scheme() == "https")
    }
}

/// Parses `[api].public_url`: an absolute http(s) URL naming only a host
/// and port (the console's links and redirects start at `/`).
pub fn parse_public_url(text: &str) -> Result<url::Url, InvalidSetting> {
    let fix = "write the scheme, host and port browsers use, e.g. \"https://hooks.example.com\"";
    let url = url::Url::parse(text).map_err(|e| {
        invalid(
            "public_url",
            format!("= {text:?} is not a URL ({e}); {fix}"),
        )
    })?;
    if !matches!(url.scheme(), "https" | "http") || url.host().is_none() {
        return Err(invalid(
            "public_url",
            format!("= {text:?} is not an http(s) URL with a host; {fix}"),
        ));
    }
    if !url.username().is_empty()
        || url.password().is_some()
        || url.path() != "/"
        || url.query().is_some()
        || url.fragment().is_some()
    {
        return Err(invalid(
            "public_url",
            format!(
                "= {text:?} has a user, path, query or fragment; the API is served at the root \
                 of its host: {fix}"
            ),
        ));
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_values_name_the_field() {
        ApiLimits::default().validate().unwrap();
        let field = |f: fn(&mut ApiLimits)| {
            let mut l = ApiLimits::default();
            f(&mut l);
            l.validate().unwrap_err().field
        };
        assert_eq!(field(|l| l.max_connections = 0), "max_connections");
        assert_eq!(
            field(|l| l.max_concurrent_requests = 0),
            "max_concurrent_requests"
        );
        assert_eq!(
            field(|l| l.request_timeout = Duration::ZERO),
            "request_timeout"
        );
        assert_eq!(
            field(|l| l.statement_timeout = l.request_timeout),
            "statement_timeout"
        );
        assert_eq!(field(|l| l.metrics_cache = Duration::ZERO), "metrics_cache");
        assert_eq!(
            field(|l| l.max_endpoints_per_tenant = 0),
            "max_endpoints_per_tenant"
        );
        assert_eq!(
            field(|l| l.test_events_per_minute = 0),
            "test_events_per_minute"
        );
        assert_eq!(
            field(|l| l.verify_requests_per_minute = 0),
            "verify_requests_per_minute"
        );
        assert_eq!(
            field(|l| l.body_read_timeout = Duration::ZERO),
            "body_read_timeout"
        );
        assert_eq!(
            field(|l| l.max_requests_per_client = 0),
            "max_requests_per_client"
        );
        assert_eq!(
            field(|l| l.max_connections_per_client = 0),
            "max_connections_per_client"
        );
        assert_eq!(
            field(|l| l.sign_in_attempts_per_minute = 0),
            "sign_in_attempts_per_minute"
        );
        assert_eq!(
            field(|l| l.failed_authentications_per_minute = 0),
            "failed_authentications_per_minute"
        );
        // The share never exceeds the slots.
        let small = ApiLimits {
            max_concurrent_requests: 4,
            ..ApiLimits::default()
        };
        assert_eq!(small.client_share(), 4);
        assert_eq!(ApiLimits::default().client_share(), 16);
        // A tenant holds at most half the database connections.
        assert_eq!(ApiLimits::default().tenant_share(), 4);
        let one = ApiLimits {
            max_connections: 1,
            ..ApiLimits::default()
        };
        assert_eq!(one.tenant_share(), 1);
        assert_eq!(small.tenant_share(), 4);
        assert_eq!(
            field(|l| l.cold_reads_per_tenant = 0),
            "cold_reads_per_tenant"
        );
        let message = ApiLimits {
            statement_timeout: Duration::from_secs(60),
            ..ApiLimits::default()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(
            message.starts_with("[api].statement_timeout") && message.contains("request_timeout"),
            "{message}"
        );
    }

    #[test]
    fn the_public_url_is_a_scheme_and_a_host() {
        let https = parse_public_url("https://hooks.example.com").unwrap();
        let mut s = ApiSettings::new("t", UrlPolicy::default());
        assert!(!s.strict_transport());
        s.public_url = Some(https);
        assert!(s.strict_transport());
        s.public_url = Some(parse_public_url("http://127.0.0.1:8080/").unwrap());
        assert!(!s.strict_transport());
        for bad in [
            "hooks.example.com",
            "ftp://hooks.example.com",
            "https://hooks.example.com/walhook",
            "https://user:pw@hooks.example.com",
            "https://hooks.example.com/?a=1",
        ] {
            let e = parse_public_url(bad).unwrap_err();
            assert_eq!(e.field, "public_url");
            assert!(e.message.contains(bad), "{e}");
        }
    }

    #[test]
    fn the_operator_token_never_prints() {
        let s = ApiSettings::new("operator-token-0123456789abcdef0123", UrlPolicy::default());
        assert!(!format!("{s:?}").contains("operator-token"));
        assert_eq!(
            s.operator_token.expose(),
            "operator-token-0123456789abcdef0123"
        );
    }
}
