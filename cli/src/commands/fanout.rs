//! `walhook fanout`: a worker process on the Fluvio log — fan-out of its
//! share of the events partitions, and the dispatcher that sends what it
//! fans out.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use walhook_pipeline::runtime::{FANOUT_GROUP, Leased, Share};

use crate::config::{Config, LogKind};
use crate::pipeline::{Roles, WorkerRole};

/// Arguments of `walhook fanout`.
#[derive(Debug, clap::Args)]
#[command(after_help = "Example (capture, two members and a standby dispatcher):
  walhook capture  --config walhook.toml
  walhook fanout   --config walhook.toml
  walhook fanout   --config walhook.toml
  walhook dispatch --config walhook.toml --node-id standby

Needs [log] kind = \"fluvio\". Each member joins the fan-out group in the
platform database (a slot, renewed four times per [log] member_lease) and
reads its share of the events partitions (consumer group \"fanout\"): the
partitions are split among the live members, and move when one joins,
leaves, or stops renewing (killed, frozen): within a lease, nothing read
twice beyond at-least-once, and a member that lost a partition cannot
commit its offset. Each member makes the deliveries of what it fans out
leased to its own dispatcher node (<[dispatch] node_id>-fanout-<slot>
unless --node-id) and sends them; a process that takes a slot over takes
back what the slot's node held, and any dispatcher node takes over what a
dead member's node held once its lease lapsed.

--member I/N fixes the share instead: member I of N reads the partitions
whose number is I modulo N. It holds a lease on its share too, and does
not start beside members that joined the group, nor beside fixed members
of another N (nor does a joined member start beside fixed ones); a second
process given the same I/N takes the share over and the first stops.

With [log] dispatch = \"by-endpoint\" a member only fans out: it sends the
deliveries to the deliveries topic, partitioned by endpoint, and the
members of `walhook dispatch` send them (one dispatcher decides each
endpoint's limits). See docs/scale-out.md.")]
pub struct Args {
    /// The config file.
    #[arg(long, short, env = "WALHOOK_CONFIG")]
    pub config: PathBuf,
    /// A fixed share instead of joining the group: member I (from 0) of N.
    #[arg(long, value_name = "I/N", value_parser = parse_member)]
    pub member: Option<(u32, u32)>,
    /// The dispatcher node id of this member (default
    /// <[dispatch] node_id>-fanout-<slot>, or -fanout-I with --member):
    /// unique among running processes.
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
    let keyring = cfg.secrets.keyring().context(
        "walhook fanout sends deliveries: it needs the master key that seals endpoint secrets",
    )?;
    let platform = cfg.platform()?.platform()?.with_keyring(keyring);
    let mut fixed = None;
    let (share, slot) = match args.member {
        Some((member, members)) => {
            if members > cfg.log.events_partitions {
                bail!(
                    "--member {member}/{members}: there are only {} events partitions ([log] events_partitions), \
                     so members beyond that would read nothing; run at most {} members or raise the partition \
                     count (for new topics)",
                    cfg.log.events_partitions,
                    cfg.log.events_partitions
                );
            }
            let partitions = walhook_pipeline::membership::share(
                cfg.log.events_partitions,
                member as usize,
                members as usize,
            );
            let group = fanout_group(&cfg);
            let (held, before) = platform
                .take_fixed_share(&group, &crate::pipeline::holder(), (member, members), cfg.log.member_lease)
                .await
                .map_err(|e| match e {
                    walhook_sql::StoreError::Refused(why) => anyhow::anyhow!("{why}"),
                    e => anyhow::Error::new(e).context(format!(
                        "could not take the share {member}/{members} of group {group} in the platform database \
                         (was `walhook migrate` run?)"
                    )),
                })?;
            if let Some(before) = before {
                tracing::warn!(
                    member,
                    members,
                    previous = %before,
                    "took over a fixed share whose lease was still live: if that process runs, it stops at \
                     its next renewal"
                );
            }
            tracing::info!(
                member,
                members,
                ?partitions,
                "fan-out member starting with a fixed share"
            );
            fixed = Some((group, members, held));
            (Share::Fixed(partitions.into_iter().collect()), member)
        }
        None => {
            let leased = join(&cfg, &platform).await?;
            let slot = leased.member.slot;
            (Share::Leased(leased), slot)
        }
    };
    let node_id = match args.node_id {
        Some(id) => check_node_id(&id)?,
        None => format!("{}-fanout-{slot}", cfg.dispatch.node_id),
    };
    tracing::info!(node = %node_id, "fan-out member's dispatcher node");
    let route = cfg.log.routes()?.map(|r| (r, cfg.log.deliveries_topic()));
    if route.is_some() {
        tracing::info!(
            topic = %cfg.log.deliveries_topic(),
            "fan-out member sending its deliveries to the deliveries topic ([log] dispatch = \"by-endpoint\"): run `walhook dispatch` members to send them"
        );
    }
    let tasks = fixed
        .iter()
        .map(|(group, members, held)| {
            fixed_lease(
                platform.clone(),
                group.clone(),
                *members,
                *held,
                cfg.log.member_lease,
            )
        })
        .collect();
    let roles = Roles {
        capture: false,
        workers: Some(WorkerRole {
            share,
            node_id,
            route,
        }),
        dispatch: None,
        tasks,
    };
    let exit = super::run_stages(
        &cfg,
        platform.clone(),
        roles,
        args.metrics_listen.as_deref(),
        "fanout",
    )
    .await;
    if let Some((group, members, held)) = fixed
        && let Err(e) = platform.leave_fixed_share(&group, members, held).await
    {
        tracing::warn!(error = %e, "could not give the fixed share up: it lapses with its lease");
    }
    exit
}

/// The fan-out group's key in the platform database.
fn fanout_group(cfg: &Config) -> String {
    walhook_pipeline::membership::MembershipSettings {
        topic: cfg.log.events_topic(),
        group: FANOUT_GROUP.to_owned(),
        partitions: cfg.log.events_partitions,
        lease: cfg.log.member_lease,
    }
    .key()
}

/// Renews a fixed share four times per lease; ends (which stops the
/// process) once the share is no longer this process's.
fn fixed_lease(
    platform: walhook_sql::Platform,
    group: String,
    members: u32,
    held: walhook_pipeline::membership::Member,
    lease: std::time::Duration,
) -> walhook_pipeline::runtime::Task {
    walhook_pipeline::runtime::Task::new("the fixed share's lease", move |stop| async move {
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(lease / 4) => {}
            }
            match platform
                .renew_fixed_share(&group, members, held, lease)
                .await
            {
                Ok(true) => {}
                Ok(false) => {
                    tracing::error!(
                        member = held.slot,
                        members,
                        "the fixed share is no longer this process's: another process took the same \
                         --member, or a member joined the group while this lease had lapsed; stopping"
                    );
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "could not renew the fixed share; trying again")
                }
            }
        }
    })
}

/// Joins the fan-out group of the events topic in the platform database.
async fn join(cfg: &Config, platform: &walhook_sql::Platform) -> anyhow::Result<Leased> {
    crate::pipeline::join_group(
        cfg,
        platform,
        &cfg.log.events_topic(),
        FANOUT_GROUP,
        cfg.log.events_partitions,
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
