//! `walhook secrets`: master keys for endpoint secrets at rest, and the
//! API's operator token.
//!
//! Rotating the master key without downtime (docs/security.md):
//!
//! 1. `walhook secrets generate-key > new.key`;
//! 2. give every process the new key as `[secrets].master_key_file` and
//!    the previous one in `old_key_files`, and restart them one by one (new
//!    secrets are sealed under the new key, old rows still open);
//! 3. `walhook secrets rotate --config F` re-seals every row under the new
//!    key while deliveries go on;
//! 4. `walhook secrets status --config F` shows no row under the old key;
//!    remove it from `old_key_files`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use walhook_sql::Platform;
use walhook_sql::secrets::MasterKey;

use crate::config::Config;

/// Arguments of `walhook secrets`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The `walhook secrets` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Print a new master key (base64 of 32 random bytes) to stdout; store
    /// it in a file readable by walhook only (chmod 600).
    GenerateKey,
    /// Print a new API operator token (256 random bits, URL-safe base64) to
    /// stdout; give it to walhook as WALHOOK_API_OPERATOR_TOKEN (or
    /// [api].operator_token).
    GenerateToken,
    /// Re-seal every endpoint secret under the current master key (rows
    /// under old keys, or stored before encryption). Safe while walhook
    /// runs; idempotent.
    Rotate {
        /// The config file ([platform] and [secrets]).
        #[arg(long, short, env = "WALHOOK_CONFIG")]
        config: PathBuf,
        /// Rows per transaction.
        #[arg(long, default_value_t = 500)]
        batch: i64,
    },
    /// Count secret rows per master key id, and say which keys the config
    /// holds.
    Status {
        /// The config file ([platform] and [secrets]).
        #[arg(long, short, env = "WALHOOK_CONFIG")]
        config: PathBuf,
    },
}

fn platform(config: &std::path::Path) -> anyhow::Result<Platform> {
    let cfg = Config::load(config)?;
    let keyring = cfg.secrets.keyring()?;
    let p = cfg.platform()?;
    Ok(
        Platform::from_options(&p.connect_options()?, 2, &Default::default())?
            .with_keyring(keyring),
    )
}

/// Runs the subcommand.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    match args.command {
        Command::GenerateKey => {
            println!("{}", MasterKey::generate_text());
            Ok(ExitCode::SUCCESS)
        }
        Command::GenerateToken => {
            println!("{}", walhook_api::operator_token::generate());
            Ok(ExitCode::SUCCESS)
        }
        Command::Rotate { config, batch } => {
            let platform = platform(&config)?;
            platform.check().await.context(
                "the platform database is not ready: check [platform].url and run `walhook migrate`",
            )?;
            let current = platform.keyring()?.current_id().to_owned();
            let done = platform.reseal_secrets(batch).await?;
            if done.rows() == 0 {
                println!("every endpoint secret is already sealed under {current}");
            } else {
                for (key_id, rows) in &done.by_key {
                    println!("re-sealed {rows} secrets from {key_id} under {current}");
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Status { config } => {
            let platform = platform(&config)?;
            platform.check().await.context(
                "the platform database is not ready: check [platform].url and run `walhook migrate`",
            )?;
            let keyring = platform.keyring()?;
            let held = keyring.key_ids();
            println!("current key  {}", keyring.current_id());
            for (key_id, rows) in platform.secret_key_counts().await? {
                let state = if key_id == keyring.current_id() {
                    "current"
                } else if key_id == walhook_sql::secrets::PLAIN_KEY_ID {
                    "PLAINTEXT, refused (endpoints quarantined): run `walhook secrets rotate`"
                } else if held.contains(&key_id.as_str()) {
                    "old key, configured: run `walhook secrets rotate`"
                } else {
                    "NOT CONFIGURED: these rows cannot be opened"
                };
                println!("{key_id:<20} {rows:>8} rows  {state}");
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
