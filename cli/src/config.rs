//! The walhook config file (TOML), with environment overrides.
//!
//! See `walhook.example.toml` at the repository root for every field with
//! comments. Environment variables override the file: `WALHOOK_PLATFORM_URL`
//! and `WALHOOK_SOURCE_URL`, so that passwords need not live in the file.

use std::path::Path;

use anyhow::{Context, bail};
use serde::Deserialize;
use walhook_connectors::http::EgressSettings;
use walhook_connectors::postgres::{RuleConfig, SourceConfig};
use walhook_pipeline::dispatch::policy::RetryPolicy;

/// The whole config file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The platform database (schema `walhook`).
    pub platform: Option<PlatformConfig>,
    /// The captured database.
    pub source: SourceConfig,
    /// Capture rules.
    #[serde(default)]
    pub rules: Vec<RuleConfig>,
    /// The log between the stages.
    #[serde(default)]
    pub log: LogConfig,
    /// Fan-out.
    #[serde(default)]
    pub fanout: FanoutConfig,
    /// Dispatch.
    #[serde(default)]
    pub dispatch: DispatchConfig,
    /// The retry schedule.
    #[serde(default)]
    pub retry: RetryPolicy,
    /// The per-endpoint circuit breaker.
    #[serde(default)]
    pub breaker: walhook_pipeline::dispatch::breaker::BreakerConfig,
    /// HTTP egress.
    #[serde(default)]
    pub egress: EgressSettings,
}

/// `[log]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `embedded` (the default; one process) or `fluvio`.
    pub kind: String,
    /// Partitions of the events topic (one fan-out worker each).
    pub events_partitions: u32,
    /// Partitions of the deliveries topic.
    pub deliveries_partitions: u32,
    /// Records held per partition before senders wait.
    pub capacity: usize,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            kind: "embedded".into(),
            events_partitions: 2,
            deliveries_partitions: 2,
            capacity: 20_000,
        }
    }
}

/// `[fanout]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FanoutConfig {
    /// Events per database transaction.
    pub batch_size: usize,
}

impl Default for FanoutConfig {
    fn default() -> Self {
        FanoutConfig { batch_size: 500 }
    }
}

/// `[dispatch]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DispatchConfig {
    /// This process's node id: unique among running processes, stable
    /// across restarts.
    pub node_id: String,
    /// Attempts in flight at most.
    pub max_in_flight: usize,
    /// Attempts in flight per endpoint (unless the endpoint sets its own).
    pub endpoint_max_in_flight: u32,
    /// Attempts in flight per tenant: one tenant with many bad endpoints
    /// cannot take every worker.
    pub tenant_max_in_flight: u32,
    /// Jobs queued in memory per endpoint before new ones wait in Postgres.
    pub endpoint_max_queued: usize,
    /// An endpoint failing without a success for this long is disabled
    /// (with an audit record and an `endpoint.disabled` event).
    #[serde(with = "walhook_pipeline::duration")]
    pub disable_after: std::time::Duration,
    /// How long a claim on a delivery lasts; longer than the request timeout.
    #[serde(with = "walhook_pipeline::duration")]
    pub lease: std::time::Duration,
    /// How often to look for due deliveries (retries, recovery).
    #[serde(with = "walhook_pipeline::duration")]
    pub sweep_interval: std::time::Duration,
    /// How long shutdown waits for attempts in flight.
    #[serde(with = "walhook_pipeline::duration")]
    pub drain_timeout: std::time::Duration,
}

impl Default for DispatchConfig {
    fn default() -> Self {
        let d = walhook_pipeline::dispatch::DispatchSettings::default();
        DispatchConfig {
            node_id: d.node_id,
            max_in_flight: d.max_in_flight,
            endpoint_max_in_flight: d.endpoint_max_in_flight,
            tenant_max_in_flight: d.tenant_max_in_flight,
            endpoint_max_queued: d.endpoint_max_queued,
            disable_after: d.disable_after,
            lease: d.lease,
            sweep_interval: d.sweep_interval,
            drain_timeout: d.drain_timeout,
        }
    }
}

/// `[platform]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlatformConfig {
    /// `postgres://…` of the platform database.
    pub url: String,
    /// Connections in the pool.
    #[serde(default = "default_connections")]
    pub max_connections: usize,
}

fn default_connections() -> usize {
    16
}

impl Config {
    /// Reads, parses and validates `path` (no database is touched).
    pub fn load(path: &Path) -> anyhow::Result<Config> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the config file {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("config file {}", path.display()))
    }

    /// Parses and validates config text, applying environment overrides.
    pub fn parse(text: &str) -> anyhow::Result<Config> {
        let mut cfg: Config =
            toml::from_str(text).map_err(|e| anyhow::anyhow!("{}", e.to_string().trim_end()))?;
        if let Ok(url) = std::env::var("WALHOOK_SOURCE_URL") {
            cfg.source.url = url;
        }
        if let Ok(url) = std::env::var("WALHOOK_PLATFORM_URL") {
            match cfg.platform.as_mut() {
                Some(p) => p.url = url,
                None => {
                    cfg.platform = Some(PlatformConfig {
                        url,
                        max_connections: default_connections(),
                    })
                }
            }
        }
        cfg.source.validate(&cfg.rules)?;
        if let Some(p) = &cfg.platform
            && p.max_connections == 0
        {
            bail!("[platform].max_connections = 0: give at least 1 (16 is a good start)");
        }
        cfg.retry
            .validate()
            .map_err(|e| anyhow::anyhow!("[retry]: {e}"))?;
        if cfg.log.kind != "embedded" {
            bail!(
                "[log].kind = {:?}: this build runs the embedded log only; remove the line (or write \"embedded\")",
                cfg.log.kind
            );
        }
        if cfg.log.events_partitions == 0 || cfg.log.deliveries_partitions == 0 {
            bail!("[log] partitions must be at least 1");
        }
        if cfg.dispatch.max_in_flight == 0
            || cfg.dispatch.endpoint_max_in_flight == 0
            || cfg.dispatch.tenant_max_in_flight == 0
        {
            bail!(
                "[dispatch] max_in_flight, endpoint_max_in_flight and tenant_max_in_flight must be at least 1"
            );
        }
        if cfg.breaker.failure_threshold == 0 {
            bail!("[breaker].failure_threshold must be at least 1 (5 is usual)");
        }
        if cfg.dispatch.lease <= cfg.egress.request_timeout {
            bail!(
                "[dispatch].lease ({:?}) must outlast [egress].request_timeout ({:?}), or two workers could send one attempt",
                cfg.dispatch.lease,
                cfg.egress.request_timeout
            );
        }
        if cfg.fanout.batch_size == 0 {
            bail!("[fanout].batch_size must be at least 1");
        }
        Ok(cfg)
    }

    /// The `[platform]` section, or an error saying how to add it.
    pub fn platform(&self) -> anyhow::Result<&PlatformConfig> {
        self.platform.as_ref().context(
            "this command needs the platform database: add [platform] url = \"postgres://…\" to the \
             config file or set WALHOOK_PLATFORM_URL",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_config_is_valid() {
        let cfg = Config::parse(include_str!("../../walhook.example.toml")).unwrap();
        assert_eq!(cfg.rules.len(), 3);
        assert!(!cfg.egress.allow_http_loopback);
        assert_eq!(
            cfg.retry.deadline,
            std::time::Duration::from_secs(24 * 3600)
        );
    }
}
