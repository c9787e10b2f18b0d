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
    /// The operator's bearer token (at least 32 characters); better set
    /// through WALHOOK_API_OPERATOR_TOKEN. Never printed (`Debug` shows
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
    /// Archive reads one tenant may have at once; more are answered 429.
    #[serde(default = "default_cold_reads_per_tenant")]
    pub cold_reads_per_tenant: usize,
    /// Endpoints created through the API (and those whose URL's host
    /// changes) receive nothing until they echo a signed challenge.
    #[serde(default = "yes")]
    pub require_verification: bool,
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

fn default_cold_reads_per_tenant() -> usize {
    walhook_api::settings::DEFAULT_COLD_READS_PER_TENANT
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
                "[api] has no operator token: set WALHOOK_API_OPERATOR_TOKEN (or [api].operator_token) to at least {MIN_OPERATOR_TOKEN_LEN} random characters, e.g. from `openssl rand -hex 32`"
            ),
            Some(t)
                if t.expose().len() < MIN_OPERATOR_TOKEN_LEN
                    || t.expose()
                        .chars()
                        .any(|c| c.is_whitespace() || c.is_control()) =>
            {
                bail!(
                    "[api].operator_token is too weak: give at least {MIN_OPERATOR_TOKEN_LEN} characters without spaces (e.g. `openssl rand -hex 32`)"
                )
            }
            Some(_) => {}
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
        self.limits().validate()?;
        Ok(())
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
            cold_reads_per_tenant: self.cold_reads_per_tenant,
        }
    }

    /// The API's settings, with the URL policy from this section and
    /// `[egress]` (loopback http only when egress allows it too).
    pub fn settings(&self, cfg: &Config) -> walhook_api::ApiSettings {
        let policy = walhook_connectors::http::policy::UrlPolicy {
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
        settings
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    const BASE: &str = "[source]\nurl = \"postgres://u@127.0.0.1/s\"\n\n[[rules]]\nname = \"m\"\nkind = \"message\"\nprefix = \"app\"\n";

    fn parse(api: &str) -> anyhow::Result<Config> {
        Config::parse(&format!("{BASE}\n[api]\n{api}"))
    }

    #[test]
    fn the_api_section_is_checked() {
        let token = "operator_token = \"0123456789abcdef0123456789abcdef\"";
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
        let token = "operator_token = \"0123456789abcdef0123456789abcdef\"";
        let cfg = parse(&format!("listen = \"127.0.0.1:0\"\n{token}")).unwrap();
        let api = cfg.api.as_ref().unwrap();
        assert_eq!(api.limits(), walhook_api::ApiLimits::default());
        assert_eq!(api.settings(&cfg).limits, walhook_api::ApiLimits::default());
        // The token never prints.
        assert!(!format!("{cfg:?}").contains("0123456789abcdef"));
        let set = parse(&format!(
            "listen = \"127.0.0.1:0\"\n{token}\nmax_connections = 3\nstatement_timeout = \"2s\"\n\
             request_timeout = \"5s\"\nmax_concurrent_requests = 9\nmetrics_cache = \"1s\"\n\
             max_endpoints_per_tenant = 7\ntest_events_per_minute = 11\ncold_reads_per_tenant = 2"
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
                limits.cold_reads_per_tenant
            ),
            (3, 2, 5, 9, 1, 7, 11, 2)
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
            ("cold_reads_per_tenant = 0", "[api].cold_reads_per_tenant"),
        ] {
            let message = err(line);
            assert!(message.contains(field), "{line}: {message}");
        }
    }
}
