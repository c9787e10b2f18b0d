//! `walhook run`: every stage in one process.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use walhook_sql::Platform;

use crate::config::Config;

/// Arguments of `walhook run`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The config file (see walhook.example.toml).
    #[arg(long, short, env = "WALHOOK_CONFIG")]
    pub config: PathBuf,
}

/// Runs until SIGINT/SIGTERM, then stops intake, drains in-flight attempts
/// (up to [dispatch].drain_timeout) and exits.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let cfg = Config::load(&args.config)?;
    let p = cfg.platform()?;
    let keyring = cfg
        .secrets
        .keyring()
        .context("walhook run needs the master key that seals endpoint secrets")?;
    tracing::info!(
        key_id = keyring.current_id(),
        keys = keyring.key_ids().len(),
        "master keys loaded"
    );
    let platform = Platform::new(&p.url, p.max_connections)?.with_keyring(keyring);
    let shutdown = super::shutdown_on_signals();
    let running = crate::pipeline::start(&cfg, platform, shutdown.clone())
        .await
        .context("walhook could not start")?;
    tracing::info!(source = %cfg.source.name, slot = %cfg.source.slot, "walhook is running");
    running.wait().await?;
    tracing::info!("walhook stopped");
    Ok(ExitCode::SUCCESS)
}
