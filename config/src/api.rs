//! `[api]`: the control plane's listen address, operator token, URL
//! policy and the limits that keep it from starving the pipeline or the
//! database.

use anyhow::bail;
use serde::Deserialize;
use walhook_pipeline::redact::Redacted;

use super::Config;

/// `[api]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiConfig {
    /// The address to listen on, e.g. `127.0.0.1:8080`.
    pub listen: String,
    /// The operator's bearer token (at least 32 characters and 128 bits of
    /// entropy, see `walhook_api::operator_token`; `walhook secrets
    /// generate-token` makes one); better set through
    /// WALHOOK_API_OPERATOR_TOKEN. Never printed (`Debug` shows
    /// `***`).
    #[serde(default)]
    pub operator_token: Option<Redacted<String>>,
    /// How long previous secrets keep signing after a rotation that does
    /// not name an overlap.
    #[serde(
        default = "default_rotation_overlap",
        with = "walhook_pipeline::duration"
    )]
    pub rotation_overlap: std::time::Duration,
    /// Ports endpoint URLs may use (https).
    #[serde(default = "default_allowed_ports")]
    pub allowed_ports: Vec<u16>,
    /// Connections in the API's own pool, apart from the pipeline's.
    #[serde(default = "default_api_connections")]
    pub max_connections: usize,
    /// Postgres cancels an API statement running longer than this.
    #[serde(
        default = "default_statement_timeout",
        with = "walhook_pipeline::duration"
    )]
    pub statement_timeout: std::time::Duration,
    /// A request taking longer is stopped and answered 503.
    #[serde(
        default = "default_request_timeout",
        with = "walhook_pipeline::duration"
    )]
    pub request_timeout: std::time::Duration,
    /// Requests handled at once; more wait up to a second, then get 503.
    #[serde(default = "default_max_concurrent_requests")]
    pub max_concurrent_requests: usize,
    /// How long `/metrics` and `/readyz` reuse their last database read.
    #[serde(default = "default_metrics_cache", with = "walhook_pipeline::duration")]
    pub metrics_cache: std::time::Duration,
    /// Endpoints per tenant (deleted ones do not count).
    #[serde(default = "default_max_endpoints_per_tenant")]
    pub max_endpoints_per_tenant: u32,
    /// Test events per tenant and minute.
    #[serde(default = "default_test_events_per_minute")]
    pub test_events_per_minute: u32,
    /// Ownership checks a tenant may ask for per endpoint and minute
    /// (`POST …/verify`).
    #[serde(default = "default_verify_requests_per_minute")]
    pub verify_requests_per_minute: u32,
    /// Archive reads one tenant may have at once; more are answered 429.
    #[serde(default = "default_cold_reads_per_tenant")]
    pub cold_reads_per_tenant: usize,
    /// Archive reads one tenant may start per minute; more are answered
    /// 429.
    #[serde(default = "default_cold_reads_per_minute")]
    pub cold_reads_per_minute: u32,
    /// Endpoints created through the API (and those whose URL's host
    /// changes) receive nothing until they prove a signed challenge with
    /// their secret.
    #[serde(default = "yes")]
    pub require_verification: bool,
    /// Where `/metrics` is served without a token (loopback by default),
    /// or `"off"`. On `listen`, `/metrics` needs the operator token or
    /// `metrics_token`.
    #[serde(default = "default_metrics_listen")]
    pub metrics_listen: String,
    /// A token that may read `/metrics` on `listen` (at least 32
    /// characters); better set through WALHOOK_API_METRICS_TOKEN.
    #[serde(default)]
    pub metrics_token: Option<Redacted<String>>,
    /// Reverse proxies (addresses or CIDRs) whose `X-Forwarded-For` names
    /// the client; without them every client behind a proxy shares the
    /// proxy's address and limits.
    #[serde(default)]
    pub trusted_proxies: Vec<String>,
    /// The URL browsers and clients use; when https, responses carry
    /// `Strict-Transport-Security`.
    #[serde(default)]
    pub public_url: Option<String>,
    /// An authenticated request's body must arrive within this.
    #[serde(
        default = "default_body_read_timeout",
        with = "walhook_pipeline::duration"
    )]
    pub body_read_timeout: std::time::Duration,
    /// Requests one client address, or one tenant, may have in progress.
    #[serde(default = "default_max_requests_per_client")]
    pub max_requests_per_client: usize,
    /// Connections one client address may hold open.
    #[serde(default = "default_max_connections_per_client")]
    pub max_connections_per_client: usize,
    /// Console sign-in attempts per minute, per address and per key tried.
    #[serde(default = "default_sign_in_attempts_per_minute")]
    pub sign_in_attempts_per_minute: u32,
    /// Failed authentications per minute, per address and per token.
    #[serde(default = "default_failed_authentications_per_minute")]
    pub failed_authentications_per_minute: u32,
}

fn default_metrics_listen() -> String {
    walhook_api::settings::DEFAULT_METRICS_LISTEN.to_owned()
}

fn default_body_read_timeout() -> std::time::Duration {
    walhook_api::settings::DEFAULT_BODY_READ_TIMEOUT
}

fn default_max_requests_per_client() -> usize {
    walhook_api::settings::DEFAULT_MAX_REQUESTS_PER_CLIENT
}

fn default_max_connections_per_client() -> usize {
    walhook_api::settings::DEFAULT_MAX_CONNECTIONS_PER_CLIENT
}

fn default_sign_in_attempts_per_minute() -> u32 {
    walhook_api::settings::DEFAULT_SIGN_IN_ATTEMPTS_PER_MINUTE
}

fn default_failed_authentications_per_minute() -> u32 {
    walhook_api::settings::DEFAULT_FAILED_AUTHENTICATIONS_PER_MINUTE
}

fn yes() -> bool {
    true
}

fn default_api_connections() -> usize {
    walhook_api::settings::DEFAULT_MAX_CONNECTIONS
}

fn default_statement_timeout() -> std::time::Duration {
    walhook_api::settings::DEFAULT_STATEMENT_TIMEOUT
}

fn default_request_timeout() -> std::time::Duration {
    walhook_api::settings::DEFAULT_REQUEST_TIMEOUT
}

fn default_max_concurrent_requests() -> usize {
    walhook_api::settings::DEFAULT_MAX_CONCURRENT_REQUESTS
}

fn default_metrics_cache() -> std::time::Duration {
    walhook_api::settings::DEFAULT_METRICS_CACHE
}

fn default_max_endpoints_per_tenant() -> u32 {
    walhook_api::settings::DEFAULT_MAX_ENDPOINTS_PER_TENANT
}

fn default_test_events_per_minute() -> u32 {
    walhook_api::settings::DEFAULT_TEST_EVENTS_PER_MINUTE
}

fn default_verify_requests_per_minute() -> u32 {
    walhook_api::settings::DEFAULT_VERIFY_REQUESTS_PER_MINUTE
}

fn default_cold_reads_per_tenant() -> usize {
    walhook_api::settings::DEFAULT_COLD_READS_PER_TENANT
}

fn default_cold_reads_per_minute() -> u32 {
    walhook_api::settings::DEFAULT_COLD_READS_PER_MINUTE
}

fn default_rotation_overlap() -> std::time::Duration {
    walhook_api::settings::DEFAULT_ROTATION_OVERLAP
}

fn default_allowed_ports() -> Vec<u16> {
    vec![443]
}

impl ApiConfig {
    /// Checks the section; names the field and the fix.
    pub fn validate(&self) -> anyhow::Result<()> {
        use walhook_api::settings::{MAX_ROTATION_OVERLAP, MIN_OPERATOR_TOKEN_LEN};
        if self.listen.parse::<std::net::SocketAddr>().is_err() {
            bail!(
                "[api].listen = {:?} is not an address; write host:port, e.g. \"127.0.0.1:8080\"",
                self.listen
            );
        }
        match &self.operator_token {
            None => bail!(
                "[api] has no operator token: set WALHOOK_API_OPERATOR_TOKEN (or [api].operator_token) to a random token of at least {MIN_OPERATOR_TOKEN_LEN} characters and 128 bits of entropy; make one with `walhook secrets generate-token`"
            ),
            Some(t) => walhook_api::operator_token::check(t.expose())?,
        }
        if self.rotation_overlap > MAX_ROTATION_OVERLAP {
            bail!(
                "[api].rotation_overlap ({:?}) is longer than the 7 days allowed",
                self.rotation_overlap
            );
        }
        if self.allowed_ports.is_empty() || self.allowed_ports.contains(&0) {
            bail!("[api].allowed_ports must list at least one port, none of them 0 (443 is usual)");
        }
        if self.metrics_listen != "off"
            && self.metrics_listen.parse::<std::net::SocketAddr>().is_err()
        {
            bail!(
                "[api].metrics_listen = {:?} is not an address; write host:port, e.g. \"{}\" \
                 (loopback), or \"off\" to serve /metrics only on [api].listen, with a token",
                self.metrics_listen,
                walhook_api::settings::DEFAULT_METRICS_LISTEN
            );
        }
        // The metrics token reads every tenant's and endpoint's series: the
        // same strength as the operator token.
        if let Some(t) = &self.metrics_token
            && let Err(weak) = walhook_api::operator_token::check(t.expose())
        {
            bail!(
                "[api].metrics_token (or WALHOOK_API_METRICS_TOKEN) is too weak: it {}; make one \
                 with `walhook secrets generate-token`, or leave it out and scrape [api].metrics_listen",
                weak.why
            );
        }
        walhook_api::client::TrustedProxies::parse(&self.trusted_proxies)?;
        if let Some(url) = &self.public_url {
            walhook_api::settings::parse_public_url(url)?;
        }
        self.limits().validate()?;
        Ok(())
    }

    /// The address of the metrics listener, `None` when it is `"off"`.
    pub fn metrics_listen(&self) -> Option<&str> {
        (self.metrics_listen != "off").then_some(self.metrics_listen.as_str())
    }

    /// The limits of this section.
    pub fn limits(&self) -> walhook_api::ApiLimits {
        walhook_api::ApiLimits {
            max_connections: self.max_connections,
            statement_timeout: self.statement_timeout,
            request_timeout: self.request_timeout,
            max_concurrent_requests: self.max_concurrent_requests,
            metrics_cache: self.metrics_cache,
            max_endpoints_per_tenant: self.max_endpoints_per_tenant,
            test_events_per_minute: self.test_events_per_minute,
            verify_requests_per_minute: self.verify_requests_per_minute,
            body_read_timeout: self.body_read_timeout,
            max_requests_per_client: self.max_requests_per_client,
            max_connections_per_client: self.max_connections_per_client,
            sign_in_attempts_per_minute: self.sign_in_attempts_per_minute,
            failed_authentications_per_minute: self.failed_authentications_per_minute,
            cold_reads_per_tenant: self.cold_reads_per_tenant,
            cold_reads_per_minute: self.cold_reads_per_minute,
        }
    }

    /// The API's settings, with the URL policy from this section and
    /// `[egress]` (loopback http only when egress allows it too).
    pub fn settings(&self, cfg: &Config) -> walhook_api::ApiSettings {
        let policy = walhook_pipeline::url_policy::UrlPolicy {
            allowed_ports: self.allowed_ports.clone(),
            allow_http_loopback: cfg.egress.allow_http_loopback,
        };
        let token = self.operator_token.clone().unwrap_or_default().into_inner();
        let mut settings = walhook_api::ApiSettings::new(token, policy);
        settings.rotation_overlap = self.rotation_overlap;
        settings.test_delivery_deadline = cfg.retry.deadline;
        settings.limits = self.limits();
        settings.replay_window = cfg.archive.replay_window;
        settings.retry_limits = cfg.retry.limits;
        settings.require_verification = self.require_verification;
        settings.metrics_token = self.metrics_token.clone();
        // Checked by validate().
        settings.trusted_proxies =
            walhook_api::client::TrustedProxies::parse(&self.trusted_proxies).unwrap_or_default();
        settings.public_url = self
            .public_url
            .as_deref()
            .and_then(|u| walhook_api::settings::parse_public_url(u).ok());
        settings
    }
}

#[cfg(test)]
mod tests {
    use crate::Config;

    const BASE: &str = "[source]\nurl = \"postgres://u@127.0.0.1/s\"\n\n[[rules]]\nname = \"m\"\nkind = \"message\"\nprefix = \"app\"\n";

    fn parse(api: &str) -> anyhow::Result<Config> {
        Config::parse(&format!("{BASE}\n[api]\n{api}"))
    }

    #[test]
    fn the_api_section_is_checked() {
        let token = "operator_token = \"Zk3q9VbX2mT8wLp4RsN7yC1dHf6GjQ0a\"";
        let cfg = parse(&format!("listen = \"127.0.0.1:0\"\n{token}")).unwrap();
        let api = cfg.api.as_ref().unwrap();
        assert_eq!(api.allowed_ports, vec![443]);
        assert_eq!(
            api.settings(&cfg).rotation_overlap,
            std::time::Duration::from_secs(86_400)
        );
        let err = |text: &str| format!("{:#}", parse(text).unwrap_err());
        assert!(err("listen = \"nowhere\"").contains("[api].listen"));
        assert!(err("listen = \"127.0.0.1:0\"").contains("WALHOOK_API_OPERATOR_TOKEN"));
        assert!(err("listen = \"127.0.0.1:0\"\noperator_token = \"short\"").contains("too weak"));
        // One character 32 times is long enough and still refused.
        let repeated = err(&format!(
            "listen = \"127.0.0.1:0\"\noperator_token = \"{}\"",
            "a".repeat(32)
        ));
        assert!(
            repeated.contains("too weak") && repeated.contains("walhook secrets generate-token"),
            "{repeated}"
        );
        assert!(
            err(&format!(
                "listen = \"127.0.0.1:0\"\n{token}\nallowed_ports = []"
            ))
            .contains("allowed_ports")
        );
        assert!(err(&format!("listen = \"127.0.0.1:0\"\n{token}\nbogus = 1")).contains("bogus"));
    }

    #[test]
    fn the_api_limits_have_defaults_and_are_checked() {
        let token = "operator_token = \"Zk3q9VbX2mT8wLp4RsN7yC1dHf6GjQ0a\"";
        let cfg = parse(&format!("listen = \"127.0.0.1:0\"\n{token}")).unwrap();
        let api = cfg.api.as_ref().unwrap();
        assert_eq!(api.limits(), walhook_api::ApiLimits::default());
        assert_eq!(api.settings(&cfg).limits, walhook_api::ApiLimits::default());
        // The token never prints.
        assert!(!format!("{cfg:?}").contains("Zk3q9VbX2mT8wLp4"));
        let set = parse(&format!(
            "listen = \"127.0.0.1:0\"\n{token}\nmax_connections = 3\nstatement_timeout = \"2s\"\n\
             request_timeout = \"5s\"\nmax_concurrent_requests = 9\nmetrics_cache = \"1s\"\n\
             max_endpoints_per_tenant = 7\ntest_events_per_minute = 11\nverify_requests_per_minute = 2\n\
             cold_reads_per_tenant = 3"
        ))
        .unwrap();
        let limits = set.api.as_ref().unwrap().limits();
        assert_eq!(
            (
                limits.max_connections,
                limits.statement_timeout.as_secs(),
                limits.request_timeout.as_secs(),
                limits.max_concurrent_requests,
                limits.metrics_cache.as_secs(),
                limits.max_endpoints_per_tenant,
                limits.test_events_per_minute,
                limits.verify_requests_per_minute,
                limits.cold_reads_per_tenant
            ),
            (3, 2, 5, 9, 1, 7, 11, 2, 3)
        );
        let err = |extra: &str| {
            format!(
                "{:#}",
                parse(&format!("listen = \"127.0.0.1:0\"\n{token}\n{extra}")).unwrap_err()
            )
        };
        for (line, field) in [
            ("max_connections = 0", "[api].max_connections"),
            ("statement_timeout = \"40s\"", "[api].statement_timeout"),
            (
                "max_concurrent_requests = 0",
                "[api].max_concurrent_requests",
            ),
            ("metrics_cache = \"0s\"", "[api].metrics_cache"),
            (
                "max_endpoints_per_tenant = 0",
                "[api].max_endpoints_per_tenant",
            ),
            ("test_events_per_minute = 0", "[api].test_events_per_minute"),
            (
                "verify_requests_per_minute = 0",
                "[api].verify_requests_per_minute",
            ),
        ] {
            let message = err(line);
            assert!(message.contains(field), "{line}: {message}");
        }
    }

    #[test]
    fn the_edge_settings_have_defaults_and_are_checked() {
        let token = "operator_token = \"Zk3q9VbX2mT8wLp4RsN7yC1dHf6GjQ0a\"";
        let cfg = parse(&format!("listen = \"127.0.0.1:0\"\n{token}")).unwrap();
        let api = cfg.api.as_ref().unwrap();
        assert_eq!(api.metrics_listen(), Some("127.0.0.1:9464"));
        let settings = api.settings(&cfg);
        assert!(settings.metrics_token.is_none() && settings.trusted_proxies.is_empty());
        assert!(!settings.strict_transport());
        let set = parse(&format!(
            "listen = \"127.0.0.1:0\"\n{token}\nmetrics_listen = \"off\"\n\
             metrics_token = \"Mt7rQ2xVb9KpL4wZs8NcY3gHd6JfE1aU\"\n\
             trusted_proxies = [\"10.0.0.0/8\", \"192.0.2.7\"]\n\
             public_url = \"https://hooks.example.com\"\nbody_read_timeout = \"5s\"\n\
             max_requests_per_client = 4\nmax_connections_per_client = 9\n\
             sign_in_attempts_per_minute = 3\nfailed_authentications_per_minute = 7"
        ))
        .unwrap();
        let api = set.api.as_ref().unwrap();
        assert_eq!(api.metrics_listen(), None);
        let settings = api.settings(&set);
        assert!(settings.strict_transport());
        assert!(
            settings
                .trusted_proxies
                .contains("10.1.2.3".parse().unwrap())
        );
        assert!(!format!("{set:?}").contains("metrics-0123"));
        let l = settings.limits;
        assert_eq!(
            (
                l.body_read_timeout.as_secs(),
                l.max_requests_per_client,
                l.max_connections_per_client,
                l.sign_in_attempts_per_minute,
                l.failed_authentications_per_minute
            ),
            (5, 4, 9, 3, 7)
        );
        let err = |extra: &str| {
            format!(
                "{:#}",
                parse(&format!("listen = \"127.0.0.1:0\"\n{token}\n{extra}")).unwrap_err()
            )
        };
        for (line, field) in [
            ("metrics_listen = \"nowhere\"", "[api].metrics_listen"),
            ("metrics_token = \"short\"", "[api].metrics_token"),
            (
                "trusted_proxies = [\"10.0.0.0/99\"]",
                "[api].trusted_proxies",
            ),
            ("public_url = \"hooks.example.com\"", "[api].public_url"),
            ("body_read_timeout = \"0s\"", "[api].body_read_timeout"),
            (
                "max_requests_per_client = 0",
                "[api].max_requests_per_client",
            ),
            (
                "max_connections_per_client = 0",
                "[api].max_connections_per_client",
            ),
            (
                "sign_in_attempts_per_minute = 0",
                "[api].sign_in_attempts_per_minute",
            ),
            (
                "failed_authentications_per_minute = 0",
                "[api].failed_authentications_per_minute",
            ),
            ("cold_reads_per_tenant = 0", "[api].cold_reads_per_tenant"),
            ("cold_reads_per_minute = 0", "[api].cold_reads_per_minute"),
        ] {
            let message = err(line);
            assert!(message.contains(field), "{line}: {message}");
        }
    }
}
