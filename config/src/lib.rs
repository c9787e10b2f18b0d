//! The walhook config file (TOML), with environment overrides.
//!
//! See `walhook.example.toml` at the repository root for every field with
//! comments. Environment variables override the file: `WALHOOK_PLATFORM_URL`,
//! `WALHOOK_SOURCE_URL`, `WALHOOK_API_OPERATOR_TOKEN` and
//! `WALHOOK_API_METRICS_TOKEN`, so that passwords
//! and tokens need not live in the file; `WALHOOK_MASTER_KEY` and
//! `WALHOOK_OLD_MASTER_KEYS` give master keys (read when the keyring is
//! built, never kept in [`Config`]).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::Deserialize;
use walhook_connectors::http::EgressSettings;
use walhook_connectors::postgres::{RuleConfig, SourceConfig};
use walhook_pgtls::DatabaseUrl;
use walhook_pgtls::{ConnectError, ConnectOptions, SslMode, TlsFields};
use walhook_pipeline::redact::Redacted;
use walhook_pipeline::retry::RetryPolicy;
use walhook_sql::Keyring;
use walhook_sql::secrets::MasterKey;

mod api;
mod archive;
mod reconcile;

pub use api::ApiConfig;
pub use archive::ArchiveConfig;
pub use reconcile::ReconcileConfig;

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
    /// The control-plane API; `walhook run` serves it when present.
    pub api: Option<ApiConfig>,
    /// Master keys for endpoint secrets at rest.
    #[serde(default)]
    pub secrets: SecretsConfig,
    /// Cold history: where day partitions go once they leave Postgres.
    #[serde(default)]
    pub archive: ArchiveConfig,
    /// Reconciliation: the schedule inside `walhook run`, and how gaps are
    /// judged.
    #[serde(default)]
    pub reconcile: ReconcileConfig,
    /// Set by `--accept-slot-loss` (never by the file): when the slot this
    /// source read from is gone, record the gap and start a new one.
    #[serde(skip)]
    pub accept_slot_loss: bool,
}

/// `[secrets]`: the master keys that seal endpoint secrets at rest.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SecretsConfig {
    /// A file holding the current master key: base64 of 32 random bytes
    /// (`walhook secrets generate-key`). Relative paths are read from the
    /// config file's folder. `WALHOOK_MASTER_KEY` (the key itself)
    /// overrides it.
    pub master_key_file: Option<PathBuf>,
    /// Files of older master keys that may still open secrets while the
    /// master key is rotated. `WALHOOK_OLD_MASTER_KEYS` (keys separated by
    /// commas) adds to them.
    pub old_key_files: Vec<PathBuf>,
}

/// The environment variable holding the current master key.
pub const MASTER_KEY_ENV: &str = "WALHOOK_MASTER_KEY";
/// The environment variable holding old master keys, comma-separated.
pub const OLD_MASTER_KEYS_ENV: &str = "WALHOOK_OLD_MASTER_KEYS";

impl SecretsConfig {
    /// Reads the keys (files and environment) into a keyring. There is no
    /// fallback key: a process that made one up would seal secrets that no
    /// later process can open.
    pub fn keyring(&self) -> anyhow::Result<Keyring> {
        let current = match std::env::var(MASTER_KEY_ENV) {
            Ok(text) if !text.trim().is_empty() => MasterKey::parse(&text, MASTER_KEY_ENV)?,
            _ => match &self.master_key_file {
                Some(path) => MasterKey::read_file(path)?,
                None => return Err(walhook_sql::secrets::SecretsError::NoKeyring.into()),
            },
        };
        let mut old = Vec::new();
        for path in &self.old_key_files {
            old.push(MasterKey::read_file(path)?);
        }
        if let Ok(list) = std::env::var(OLD_MASTER_KEYS_ENV) {
            for (i, text) in list.split(',').filter(|t| !t.trim().is_empty()).enumerate() {
                old.push(MasterKey::parse(
                    text,
                    &format!("key {} of {OLD_MASTER_KEYS_ENV}", i + 1),
                )?);
            }
        }
        Ok(Keyring::new(current, old))
    }

    /// Reads relative key paths from `dir`.
    fn resolve_paths(&mut self, dir: &Path) {
        let resolve = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = dir.join(&*p);
            }
        };
        if let Some(p) = self.master_key_file.as_mut() {
            resolve(p);
        }
        self.old_key_files.iter_mut().for_each(resolve);
    }
}

/// `[log]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `embedded` (the default; one process) or `fluvio`.
    pub kind: LogKind,
    /// Partitions of the events topic (one fan-out worker each).
    pub events_partitions: u32,
    /// Partitions of the in-process deliveries topic.
    pub deliveries_partitions: u32,
    /// Records held per partition before senders wait (embedded log, and
    /// the in-process deliveries topic).
    pub capacity: usize,
    /// Fluvio: the streaming controller's public address, `host:port`.
    pub endpoint: String,
    /// Fluvio: replicas per partition of the topics walhook creates.
    pub replication: u32,
    /// Fluvio: the prefix of walhook's topic names (one prefix per
    /// deployment sharing a cluster).
    pub topic_prefix: String,
    /// Fluvio: how long the cluster may fail to answer before a stage
    /// process stops with an error naming it (until then it retries, on
    /// new connections, and capture resumes from the slot).
    #[serde(with = "walhook_pipeline::duration")]
    pub give_up_after: std::time::Duration,
    /// Fluvio: how long the cluster keeps the events topic's records (set
    /// when walhook creates the topic; an existing topic that keeps them for
    /// less is refused). A member down for longer stops at the gap.
    #[serde(with = "walhook_pipeline::duration")]
    pub retention: std::time::Duration,
    /// Fluvio: the size of the topic's log segments in bytes (retention
    /// removes whole segments).
    pub segment_size: u32,
    /// Fluvio: the lease of a `walhook fanout` member that joined without
    /// `--member`. It renews four times per lease; when it stops renewing
    /// (killed, frozen, cut off from the platform database), its
    /// partitions go to the other members once the lease lapsed.
    #[serde(with = "walhook_pipeline::duration")]
    pub member_lease: std::time::Duration,
    /// Fluvio: plain TCP to a cluster on another machine. Refused unless
    /// set, and warned about at start: anyone on the path could read the
    /// events or forge some.
    pub insecure: bool,
    /// Fluvio: TLS to the cluster (`[log.tls]`).
    pub tls: Option<LogTls>,
    /// Fluvio: who sends what fan-out makes. `with-fanout` (the default):
    /// the dispatcher inside each `walhook fanout` member, so an endpoint's
    /// limits apply per member. `by-endpoint`: the deliveries topic
    /// (`deliveries_partitions` partitions, keyed by endpoint), read by the
    /// members of `walhook dispatch`: one dispatcher decides each
    /// endpoint's in-flight cap, rate limit and circuit.
    pub dispatch: LogDispatch,
    /// Fluvio, `dispatch = "by-endpoint"`: endpoints too busy for one
    /// dispatcher, split over this many neighbouring deliveries partitions
    /// (`"ep_…" = 4`); their limits then apply per shard.
    pub endpoint_shards: std::collections::BTreeMap<String, u32>,
}

/// `[log] dispatch`: where fan-out's deliveries are sent from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LogDispatch {
    /// By the dispatcher in the fan-out member's own process.
    WithFanout,
    /// Through the deliveries topic, partitioned by endpoint, by the
    /// members of `walhook dispatch`.
    ByEndpoint,
}

/// `[log.tls]`: TLS to the Fluvio cluster, with a client certificate when
/// the cluster demands one.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogTls {
    /// The PEM file of the CA that signed the cluster's certificates
    /// (relative to the config file); absent: the built-in Mozilla roots.
    pub ca_file: Option<PathBuf>,
    /// walhook's client certificate, PEM (with `key_file`).
    pub cert_file: Option<PathBuf>,
    /// The private key of `cert_file`, PEM.
    pub key_file: Option<PathBuf>,
    /// The name the cluster's certificates are checked against (the SPUs'
    /// as `<spu id>.<domain>`); the endpoint's host when absent.
    pub domain: Option<String>,
    /// `verify-full` (the default: chain and name) or `verify-ca` (chain
    /// only).
    #[serde(default)]
    pub mode: LogTlsMode,
}

/// `[log.tls].mode`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum LogTlsMode {
    /// The chain and the name.
    #[default]
    #[serde(rename = "verify-full")]
    VerifyFull,
    /// The chain only.
    #[serde(rename = "verify-ca")]
    VerifyCa,
}

/// Which log runs between the stages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogKind {
    /// In-process; every stage in one `walhook run`.
    Embedded,
    /// A Fluvio cluster; stages may run as separate processes.
    Fluvio,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            kind: LogKind::Embedded,
            events_partitions: 4,
            deliveries_partitions: 2,
            capacity: 20_000,
            endpoint: "127.0.0.1:9003".into(),
            replication: 1,
            topic_prefix: "walhook-".into(),
            give_up_after: std::time::Duration::from_secs(300),
            insecure: false,
            tls: None,
            retention: std::time::Duration::from_secs(7 * 24 * 3600),
            segment_size: 100 << 20,
            member_lease: std::time::Duration::from_secs(10),
            dispatch: LogDispatch::WithFanout,
            endpoint_shards: Default::default(),
        }
    }
}

impl LogConfig {
    /// The events topic's name.
    pub fn events_topic(&self) -> String {
        match self.kind {
            LogKind::Embedded => walhook_pipeline::runtime::EVENTS.to_owned(),
            LogKind::Fluvio => {
                format!("{}{}", self.topic_prefix, walhook_pipeline::runtime::EVENTS)
            }
        }
    }

    /// The deliveries topic's name (`dispatch = "by-endpoint"`).
    pub fn deliveries_topic(&self) -> String {
        format!(
            "{}{}",
            self.topic_prefix,
            walhook_pipeline::runtime::DELIVERIES
        )
    }

    /// Where each delivery goes in the deliveries topic, with `dispatch =
    /// "by-endpoint"`; `None` otherwise.
    pub fn routes(
        &self,
    ) -> anyhow::Result<Option<std::sync::Arc<walhook_pipeline::routing::Routes>>> {
        if self.dispatch != LogDispatch::ByEndpoint {
            return Ok(None);
        }
        let mut shards = std::collections::BTreeMap::new();
        for (endpoint, k) in &self.endpoint_shards {
            let id: walhook_pipeline::ids::EndpointId = endpoint.trim().parse().map_err(|_| {
                anyhow::anyhow!(
                    "[log.endpoint_shards] {endpoint:?}: not an endpoint id; give the id the API shows \
                     (\"ep_\" and 26 characters), for example \"ep_01hv…\" = 4"
                )
            })?;
            shards.insert(id, *k);
        }
        let routes = walhook_pipeline::routing::Routes::new(self.deliveries_partitions, shards)
            .map_err(|e| anyhow::anyhow!("[log.endpoint_shards]: {e}"))?;
        Ok(Some(std::sync::Arc::new(routes)))
    }

    /// The Fluvio client's settings.
    pub fn fluvio_settings(&self) -> walhook_connectors::fluvio::FluvioSettings {
        walhook_connectors::fluvio::FluvioSettings {
            replication: self.replication,
            give_up_after: self.give_up_after,
            tls: self.fluvio_tls(),
            retention: self.retention,
            segment_size: self.segment_size,
            ..walhook_connectors::fluvio::FluvioSettings::new(self.endpoint.clone())
        }
    }

    /// The endpoint's host, without brackets around an IPv6 address.
    fn endpoint_host(&self) -> &str {
        let host = self
            .endpoint
            .trim()
            .rsplit_once(':')
            .map_or(self.endpoint.trim(), |(h, _)| h);
        host.strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host)
    }

    /// `[log.tls]` as the Fluvio client takes it.
    fn fluvio_tls(&self) -> Option<walhook_connectors::fluvio::FluvioTls> {
        use walhook_connectors::fluvio::{ClientIdentity, FluvioTls, TlsVerify};
        let tls = self.tls.as_ref()?;
        Some(FluvioTls {
            ca_file: tls.ca_file.clone(),
            client: tls
                .cert_file
                .clone()
                .zip(tls.key_file.clone())
                .map(|(cert_file, key_file)| ClientIdentity {
                    cert_file,
                    key_file,
                }),
            domain: tls
                .domain
                .clone()
                .unwrap_or_else(|| self.endpoint_host().to_owned()),
            verify: match tls.mode {
                LogTlsMode::VerifyFull => TlsVerify::Full,
                LogTlsMode::VerifyCa => TlsVerify::Ca,
            },
        })
    }

    /// Whether walhook sends the events in clear to another machine
    /// (`insecure = true` let it): the warning to log at start.
    pub fn exposure(&self) -> Option<String> {
        (self.kind == LogKind::Fluvio
            && self.tls.is_none()
            && !walhook_pgtls::exposure::is_local_host(self.endpoint_host()))
        .then(|| {
            format!(
                "[log] insecure = true: the events go to the Fluvio cluster at {} in clear, without TLS; \
                 anyone on the network path can read them, or forge events that walhook then signs and \
                 delivers. Set [log.tls] (docs/scale-out.md)",
                self.endpoint
            )
        })
    }

    /// Resolves `[log.tls]`'s files against the config's folder.
    fn resolve_paths(&mut self, dir: &Path) {
        if let Some(tls) = self.tls.as_mut() {
            for p in [&mut tls.ca_file, &mut tls.cert_file, &mut tls.key_file]
                .into_iter()
                .flatten()
            {
                if p.is_relative() {
                    *p = dir.join(&*p);
                }
            }
        }
    }

    /// Reads `[log.tls]`'s files, so that one that cannot serve is refused
    /// now, naming the field and the file.
    fn check_files(&self) -> anyhow::Result<()> {
        match (self.kind, self.fluvio_tls()) {
            (LogKind::Fluvio, Some(tls)) => tls.check(),
            _ => Ok(()),
        }
    }

    fn validate(&self) -> anyhow::Result<()> {
        if self.events_partitions == 0 || self.deliveries_partitions == 0 {
            bail!("[log] partitions must be at least 1");
        }
        match self.dispatch {
            LogDispatch::ByEndpoint if self.kind != LogKind::Fluvio => bail!(
                "[log] dispatch = \"by-endpoint\" needs a log between processes: set [log] kind = \"fluvio\", \
                 or remove it (the embedded log sends from the one process, where each endpoint's limits are \
                 decided in one place already)"
            ),
            LogDispatch::WithFanout if !self.endpoint_shards.is_empty() => bail!(
                "[log.endpoint_shards] splits endpoints over deliveries partitions, which only [log] dispatch = \
                 \"by-endpoint\" has: set it, or remove [log.endpoint_shards]"
            ),
            _ => {}
        }
        self.routes()?;
        if self.kind == LogKind::Fluvio {
            let endpoint = self.endpoint.trim();
            let port_ok = endpoint.rsplit_once(':').is_some_and(|(host, port)| {
                !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0)
            });
            if !port_ok {
                bail!(
                    "[log].endpoint = {:?}: give the Fluvio SC's public address as host:port, for example \"127.0.0.1:9003\"",
                    self.endpoint
                );
            }
            if self.replication == 0 {
                bail!(
                    "[log].replication = 0: give at least 1 (the number of SPUs that keep each partition)"
                );
            }
            if let Some(tls) = &self.tls {
                if tls.cert_file.is_some() != tls.key_file.is_some() {
                    bail!(
                        "[log.tls]: cert_file and key_file go together (walhook's client certificate and its \
                         private key); give both, or neither when the cluster does not ask for a client certificate"
                    );
                }
                let taken = if tls.domain.is_none() {
                    format!(
                        " (none was given, so the host of [log].endpoint = {:?} was taken)",
                        self.endpoint
                    )
                } else {
                    String::new()
                };
                if let Some(client) = self.fluvio_tls() {
                    walhook_connectors::fluvio::check_domain(&client.domain, client.verify)
                        .map_err(|e| anyhow::anyhow!("{e}{taken}"))?;
                }
            } else if !self.insecure && self.exposure().is_some() {
                bail!(
                    "[log].endpoint = {:?} is not on this machine, and without [log.tls] the events would travel \
                     in clear: anyone on the path could read them or forge events that walhook signs and delivers. \
                     Add [log.tls] with ca_file (and cert_file and key_file when the cluster demands client \
                     certificates), or set [log] insecure = true to accept plain TCP",
                    self.endpoint
                );
            }
            if self.retention < std::time::Duration::from_secs(10) {
                bail!(
                    "[log].retention = {:?}: give at least \"10s\" (Fluvio's least); it should outlast the \
                     longest time a fan-out member may be down (the default is \"7d\")",
                    self.retention
                );
            }
            if self.segment_size < 1024 {
                bail!(
                    "[log].segment_size = {}: give at least 1024 bytes (Fluvio's least; the default is 104857600)",
                    self.segment_size
                );
            }
            if self.member_lease < std::time::Duration::from_secs(2)
                || self.member_lease > std::time::Duration::from_secs(600)
            {
                bail!(
                    "[log].member_lease = {:?}: give \"2s\" to \"10m\" (the default is \"10s\"): shorter \
                     leases lapse on a busy database's pauses, longer ones leave a dead member's partitions \
                     unread for that long",
                    self.member_lease
                );
            }
            if self.give_up_after < std::time::Duration::from_secs(10) {
                bail!(
                    "[log].give_up_after = {:?}: give at least \"10s\" (a broker restart takes seconds; \
                     the default is \"5m\")",
                    self.give_up_after
                );
            }
            let name = self.events_topic();
            if name.len() > 63
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                || name.starts_with('-')
            {
                bail!(
                    "[log].topic_prefix = {:?}: Fluvio topic names use a-z, 0-9 and '-' (at most 63 characters, not starting with '-'); try \"walhook-\"",
                    self.topic_prefix
                );
            }
        }
        Ok(())
    }
}

/// `[fanout]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FanoutConfig {
    /// Events per database transaction.
    pub batch_size: usize,
    /// After a batch of fewer than [`walhook_pipeline::fanout::LINGER_BELOW`]
    /// events, how long to wait before reading the next one: fewer, larger
    /// transactions under load, for at most this much latency.
    #[serde(with = "walhook_pipeline::duration")]
    pub linger: std::time::Duration,
}

impl Default for FanoutConfig {
    fn default() -> Self {
        FanoutConfig {
            batch_size: 500,
            linger: walhook_pipeline::fanout::DEFAULT_LINGER,
        }
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
    /// Jobs queued in memory per endpoint with an open circuit before new
    /// ones wait in Postgres.
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
    /// `postgres://…` of the platform database, with libpq's `sslmode` and
    /// `sslrootcert` parameters if wanted. Its password never prints.
    pub url: DatabaseUrl,
    /// `sslmode`, when not in the URL (both only when alike).
    #[serde(default)]
    pub sslmode: Option<SslMode>,
    /// `sslrootcert` (a CA file, or `system`), when not in the URL.
    /// Relative paths are read from the config file's folder.
    #[serde(default)]
    pub sslrootcert: Option<PathBuf>,
    /// Connections in the pool.
    #[serde(default = "default_connections")]
    pub max_connections: usize,
}

impl PlatformConfig {
    /// The connection settings of `url` and the TLS fields.
    pub fn connect_options(&self) -> Result<ConnectOptions, ConnectError> {
        let fields = TlsFields {
            sslmode: self.sslmode,
            sslrootcert: self.sslrootcert.clone(),
        };
        ConnectOptions::parse(&self.url, "[platform]", &fields)
    }

    /// The platform database's pool (reads `sslrootcert`; connects
    /// nothing yet).
    pub fn platform(&self) -> anyhow::Result<walhook_sql::Platform> {
        Ok(walhook_sql::Platform::from_options(
            &self.connect_options()?,
            self.max_connections,
            &walhook_sql::SessionOptions::default(),
        )?)
    }
}

fn default_connections() -> usize {
    16
}

impl Config {
    /// Logs a warning, once at start, for each database URL this command
    /// connects with (`[platform].url`, and `[source].url` when `source`)
    /// that reaches another machine under an `sslmode` below
    /// `verify-full` (see `walhook_pgtls::exposure`).
    pub fn warn_unauthenticated_databases(&self, source: bool) {
        if source && let Ok(options) = self.source.connect_options() {
            options.warn_if_exposed();
        }
        if let Some(platform) = &self.platform
            && let Ok(options) = platform.connect_options()
        {
            options.warn_if_exposed();
        }
    }

    /// Reads, parses and validates `path` (no database is touched).
    pub fn load(path: &Path) -> anyhow::Result<Config> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the config file {}", path.display()))?;
        let mut cfg =
            Self::parse(&text).with_context(|| format!("config file {}", path.display()))?;
        if let Some(dir) = path.parent() {
            cfg.secrets.resolve_paths(dir);
            cfg.archive.resolve_paths(dir);
            cfg.reconcile.resolve_paths(dir);
            cfg.log.resolve_paths(dir);
            // Declared payload schemas are read from the config's folder.
            for rule in &mut cfg.rules {
                for file in rule.schema_files.values_mut() {
                    if file.is_relative() {
                        *file = dir.join(&*file);
                    }
                }
            }
            // The sections' CA files, like key files, are read from the
            // config's folder; an `sslrootcert` in a URL stays as libpq
            // reads it (from the working directory).
            let resolve = |p: &mut Option<PathBuf>| {
                if let Some(p) = p.as_mut()
                    && p.is_relative()
                    && p != Path::new(walhook_pgtls::SYSTEM_ROOTS)
                {
                    *p = dir.join(&*p);
                }
            };
            resolve(&mut cfg.source.sslrootcert);
            if let Some(platform) = cfg.platform.as_mut() {
                resolve(&mut platform.sslrootcert);
            }
        }
        cfg.log
            .check_files()
            .with_context(|| format!("config file {}", path.display()))?;
        Ok(cfg)
    }

    /// Parses and validates config text, applying environment overrides.
    pub fn parse(text: &str) -> anyhow::Result<Config> {
        let mut cfg: Config =
            toml::from_str(text).map_err(|e| anyhow::anyhow!("{}", e.to_string().trim_end()))?;
        if let Ok(url) = std::env::var("WALHOOK_SOURCE_URL") {
            cfg.source.url = DatabaseUrl::new(url);
        }
        if let Ok(url) = std::env::var("WALHOOK_PLATFORM_URL") {
            let url = DatabaseUrl::new(url);
            match cfg.platform.as_mut() {
                Some(p) => p.url = url,
                None => {
                    cfg.platform = Some(PlatformConfig {
                        url,
                        sslmode: None,
                        sslrootcert: None,
                        max_connections: default_connections(),
                    })
                }
            }
        }
        if let Ok(token) = std::env::var("WALHOOK_API_OPERATOR_TOKEN")
            && let Some(api) = cfg.api.as_mut()
        {
            api.operator_token = Some(Redacted::new(token));
        }
        if let Ok(token) = std::env::var("WALHOOK_API_METRICS_TOKEN")
            && let Some(api) = cfg.api.as_mut()
        {
            api.metrics_token = Some(Redacted::new(token));
        }
        cfg.source.validate(&cfg.rules)?;
        cfg.source.connect_options()?;
        if let Some(p) = &cfg.platform {
            p.connect_options()?;
        }
        if let Some(api) = &cfg.api {
            api.validate()?;
        }
        cfg.archive.validate()?;
        cfg.reconcile.validate()?;
        if let Some(p) = &cfg.platform
            && p.max_connections == 0
        {
            bail!("[platform].max_connections = 0: give at least 1 (16 is a good start)");
        }
        cfg.retry
            .validate()
            .map_err(|e| anyhow::anyhow!("[retry]: {e}"))?;
        cfg.log.validate()?;
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
        if cfg.fanout.linger > std::time::Duration::from_secs(1) {
            bail!(
                "[fanout].linger is {:?}; at most 1s (it delays every event of a quiet moment; 0s turns it off)",
                cfg.fanout.linger
            );
        }
        if cfg.fanout.batch_size == 0 {
            bail!("[fanout].batch_size must be at least 1");
        }
        cfg.egress.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
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
mod tests;
