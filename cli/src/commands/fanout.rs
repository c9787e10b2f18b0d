//! `walhook fanout`: a worker process on the Fluvio log — fan-out of its
//! share of the events partitions, and the dispatcher that sends what it
//! fans out.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};

use crate::config::{Config, LogKind};
use crate::pipeline::{Roles, WorkerRole};

/// Arguments of `walhook fanout`.
#[derive(Debug, clap::Args)]
#[command(after_help = "Example (capture, two workers and a standby dispatcher):
  walhook capture  --config walhook.toml
  walhook fanout   --config walhook.toml --member 0/2
  walhook fanout   --config walhook.toml --member 1/2
  walhook dispatch --config walhook.toml --node-id standby

Needs [log] kind = \"fluvio\". Member I of N reads the events partitions
whose number is I modulo N (with consumer group \"fanout\"), makes their
deliveries in Postgres leased to its own dispatcher node (id
<[dispatch] node_id>-fanout-I unless --node-id), and sends them. A member
that restarts resumes at its group's committed offsets and takes back what
its node held; one that stays down is replaced by any dispatcher node once
its lease lapses. Run each member once: two processes with one member
number duplicate work (never deliveries: ids are derived and stored once).
See docs/scale-out.md.")]
pub struct Args {
    /// The config file.
    #[arg(long, short, env = "WALHOOK_CONFIG")]
    pub config: PathBuf,
    /// This process's share, I/N: member I (from 0) of N.
    #[arg(long, value_name = "I/N", value_parser = parse_member)]
    pub member: (u32, u32),
    /// The dispatcher node id of this member (default
    /// <[dispatch] node_id>-fanout-I): stable across its restarts, unique
    /// among running processes.
    #[arg(long, value_name = "ID")]
    pub node_id: Option<String>,
    /// Serve Prometheus metrics of this process at http://ADDR/metrics
    /// (and /healthz), for example 127.0.0.1:9464. No token is asked for and
    /// the labels name tenants and endpoints: keep it on loopback.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<String>,
}

/// Parses `I/N` with `I < N`.
pub fn parse_member(s: &str) -> Result<(u32, u32), String> {
    let bad = || {
        format!(
            "{s:?}: give the member as I/N, with 0 <= I < N, for example 0/2 (the first of two)"
        )
    };
    let (i, n) = s.split_once('/').ok_or_else(bad)?;
    let i: u32 = i.trim().parse().map_err(|_| bad())?;
    let n: u32 = n.trim().parse().map_err(|_| bad())?;
    if n == 0 || i >= n {
        return Err(bad());
    }
    Ok((i, n))
}

/// Checks a node id given on the command line.
pub fn check_node_id(id: &str) -> anyhow::Result<String> {
    let id = id.trim().to_owned();
    if id.is_empty() || id.len() > 128 || id.chars().any(char::is_control) {
        bail!(
            "--node-id {id:?}: give 1 to 128 characters without control characters, unique per process"
        );
    }
    Ok(id)
}

/// Runs until SIGINT/SIGTERM, then stops in order (fan-out finishes its
/// batch, dispatch drains its attempts in flight).
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let cfg = Config::load(&args.config)?;
    cfg.warn_unauthenticated_databases(false);
    if cfg.log.kind != LogKind::Fluvio {
        bail!(
            "walhook fanout needs a log shared between processes: set [log] kind = \"fluvio\" (and [log] endpoint) in {}, \
             or run every stage in one process with `walhook run`",
            args.config.display()
        );
    }
    let (member, members) = args.member;
    if members > cfg.log.events_partitions {
        bail!(
            "--member {member}/{members}: there are only {} events partitions ([log] events_partitions), so \
             members beyond that would read nothing; run at most {} members or raise the partition count \
             (for new topics)",
            cfg.log.events_partitions,
            cfg.log.events_partitions
        );
    }
    let node_id = match args.node_id {
        Some(id) => check_node_id(&id)?,
        None => format!("{}-fanout-{member}", cfg.dispatch.node_id),
    };
    let keyring = cfg.secrets.keyring().context(
        "walhook fanout sends deliveries: it needs the master key that seals endpoint secrets",
    )?;
    let platform = cfg.platform()?.platform()?.with_keyring(keyring);
    let partitions =
        walhook_pipeline::runtime::member_partitions(cfg.log.events_partitions, member, members);
    tracing::info!(member, members, ?partitions, node = %node_id, "fan-out member starting");
    let roles = Roles {
        capture: false,
        workers: Some(WorkerRole {
            partitions,
            node_id,
        }),
    };
    super::run_stages(
        &cfg,
        platform,
        roles,
        args.metrics_listen.as_deref(),
        "fanout",
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_are_i_of_n() {
        assert_eq!(parse_member("1/3"), Ok((1, 3)));
        assert_eq!(parse_member(" 0 / 1 "), Ok((0, 1)));
        for bad in ["3/3", "1", "a/2", "0/0", "-1/2", ""] {
            let err = parse_member(bad).unwrap_err();
            assert!(err.contains("I/N"), "{bad}: {err}");
        }
    }
}
