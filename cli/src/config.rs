//! The walhook config file (TOML), with environment overrides.
//!
//! See `walhook.example.toml` at the repository root for every field with
//! comments. Environment variables override the file: `WALHOOK_PLATFORM_URL`
//! and `WALHOOK_SOURCE_URL`, so that passwords need not live in the file.

use std::path::Path;

use anyhow::{Context, bail};
use serde::Deserialize;
use walhook_connectors::postgres::{RuleConfig, SourceConfig};

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
