//! The configuration of a Postgres source and its capture rules.
//!
//! Rules live in the walhook config file (TOML), so producers change no code:
//!
//! ```toml
//! [[rules]]
//! name = "invoice_paid"
//! table = "public.invoices"
//! operations = ["update"]
//! when = [{ column = "status", changed_to = "paid" }]
//! event_type = "invoice.paid"
//! tenant_column = "tenant_id"
//! object_id_column = "id"
//! object_version = "lsn"
//! include = ["id", "amount_cents", "currency", "status"]
//! ```
//!
//! [`SourceConfig::validate`] checks everything that needs no database and
//! names the rule, the field and the fix; checks against the catalog happen
//! when capture starts (`postgres::rules`).
//!
//! This file holds the `[source]` section ([`SourceConfig`]), its defaults
//! and checks, and the [`RuleError`] every check returns; `rule` holds one
//! `[[rules]]` entry as written ([`RuleConfig`]) and its checks.

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use walhook_pgtls::DatabaseUrl;
use walhook_pgtls::{ConnectError, ConnectOptions, SslMode, TlsFields};

mod rule;
#[cfg(test)]
mod tests;

pub use rule::{
    Condition, ObjectIdColumns, ObjectVersion, Operation, RowSelector, RuleConfig, RuleKind,
    Scalar, split_table,
};

/// Default replication slot name.
pub const DEFAULT_SLOT: &str = "walhook";
/// Default publication name.
pub const DEFAULT_PUBLICATION: &str = "walhook";
/// Default interval between heartbeats.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(10);
/// Default interval between standby status updates.
pub const DEFAULT_STATUS_INTERVAL: Duration = Duration::from_secs(1);
/// Default largest event body (1 MiB): a bigger one becomes an incident.
pub const DEFAULT_MAX_EVENT_BYTES: usize = 1 << 20;
/// The largest `max_event_bytes` accepted (256 MiB).
pub const MAX_MAX_EVENT_BYTES: usize = 256 << 20;

/// Where and how to capture.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceConfig {
    /// The source's name; part of every event id, so never change it for a
    /// running source.
    #[serde(default = "default_name")]
    pub name: String,
    /// `postgres://user:password@host:port/database` of the business
    /// database. The user needs the REPLICATION attribute. libpq's
    /// `sslmode` and `sslrootcert` parameters apply to the SQL session and
    /// the replication stream alike. Its password never prints.
    pub url: DatabaseUrl,
    /// `sslmode` (`disable`, `prefer` (default), `require`, `verify-ca`,
    /// `verify-full`), when not in the URL; both may be given only alike.
    #[serde(default)]
    pub sslmode: Option<SslMode>,
    /// `sslrootcert`: the PEM file of the CA that signed the server's
    /// certificate (or `system` for the built-in roots), when not in the
    /// URL.
    #[serde(default)]
    pub sslrootcert: Option<PathBuf>,
    /// The logical replication slot.
    #[serde(default = "default_slot")]
    pub slot: String,
    /// The publication the slot reads.
    #[serde(default = "default_publication")]
    pub publication: String,
    /// Create the slot when it does not exist.
    #[serde(default)]
    pub create_slot: bool,
    /// Create the publication for the rules' tables when it does not exist.
    #[serde(default)]
    pub create_publication: bool,
    /// How often to emit a heartbeat message so that the slot advances while
    /// the captured database is idle but others write (0 turns it off).
    #[serde(default = "default_heartbeat", with = "walhook_pipeline::duration")]
    pub heartbeat_interval: Duration,
    /// How often to report the confirmed position to the server.
    #[serde(
        default = "default_status_interval",
        with = "walhook_pipeline::duration"
    )]
    pub status_interval: Duration,
    /// Warn when the slot retains more WAL than this many bytes.
    #[serde(default = "default_lag_warning")]
    pub lag_warning_bytes: u64,
    /// The largest event body (the JSON envelope) capture makes; a change
    /// that would make a bigger one becomes an incident naming its LSN and
    /// size, and capture goes on.
    #[serde(default = "default_max_event_bytes")]
    pub max_event_bytes: usize,
}

fn default_max_event_bytes() -> usize {
    DEFAULT_MAX_EVENT_BYTES
}

fn default_name() -> String {
    "main".into()
}
fn default_slot() -> String {
    DEFAULT_SLOT.into()
}
fn default_publication() -> String {
    DEFAULT_PUBLICATION.into()
}
fn default_heartbeat() -> Duration {
    DEFAULT_HEARTBEAT
}
fn default_status_interval() -> Duration {
    DEFAULT_STATUS_INTERVAL
}
fn default_lag_warning() -> u64 {
    1 << 30
}

/// A configuration problem, naming the rule, the field and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("capture rule {rule:?}, field `{field}`: {problem}")]
pub struct RuleError {
    /// The rule's name (or its position when it has none).
    pub rule: String,
    /// The field at fault.
    pub field: String,
    /// What is wrong and how to fix it.
    pub problem: String,
}

impl RuleError {
    /// A new error.
    pub fn new(rule: &str, field: &str, problem: impl Into<String>) -> Self {
        RuleError {
            rule: rule.into(),
            field: field.into(),
            problem: problem.into(),
        }
    }
}

impl SourceConfig {
    /// The connection settings of `url` and the TLS fields (checked, no
    /// file read). `channel_binding=require` needs `verify-full` here: the
    /// replication stream's client cannot bind (see
    /// [`super::connect::replication_config`]).
    pub fn connect_options(&self) -> Result<ConnectOptions, ConnectError> {
        let fields = TlsFields {
            sslmode: self.sslmode,
            sslrootcert: self.sslrootcert.clone(),
        };
        let options = ConnectOptions::parse(&self.url, "[source]", &fields)?;
        options.require_binding_everywhere(super::connect::STREAM_CLIENT)?;
        Ok(options)
    }

    /// Checks the source and its rules without touching a database.
    pub fn validate(&self, rules: &[RuleConfig]) -> Result<(), RuleError> {
        let ident_ok = |s: &str| {
            !s.is_empty()
                && s.len() <= 63
                && s.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        };
        if !ident_ok(&self.slot) {
            return Err(RuleError::new(
                "(source)",
                "source.slot",
                format!(
                    "{:?}: slot names use a-z, 0-9 and _ (at most 63)",
                    self.slot
                ),
            ));
        }
        if !ident_ok(&self.publication) {
            return Err(RuleError::new(
                "(source)",
                "source.publication",
                format!("{:?}: use a-z, 0-9 and _ (at most 63)", self.publication),
            ));
        }
        if self.name.is_empty() {
            return Err(RuleError::new(
                "(source)",
                "source.name",
                "must not be empty",
            ));
        }
        if !(1024..=MAX_MAX_EVENT_BYTES).contains(&self.max_event_bytes) {
            return Err(RuleError::new(
                "(source)",
                "source.max_event_bytes",
                format!(
                    "{} is out of range: give a size from 1024 to {MAX_MAX_EVENT_BYTES} bytes (default {DEFAULT_MAX_EVENT_BYTES})",
                    self.max_event_bytes
                ),
            ));
        }
        if rules.is_empty() {
            return Err(RuleError::new(
                "(none)",
                "rules",
                "no capture rules: add at least one [[rules]] table",
            ));
        }
        let mut names = HashSet::new();
        for (i, rule) in rules.iter().enumerate() {
            if rule.name == walhook_pipeline::capture::ledger::SOURCE_RULE {
                return Err(RuleError::new(
                    &rule.name,
                    "name",
                    "`*` names the source's own row in the capture ledger; give the rule another name",
                ));
            }
            if !names.insert(rule.name.as_str()) {
                return Err(RuleError::new(
                    &rule.name,
                    "name",
                    format!("rule #{} repeats this name; names must be unique", i + 1),
                ));
            }
            rule.validate()?;
        }
        Ok(())
    }
}
