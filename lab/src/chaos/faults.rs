//! The fault catalogue of `walhook chaos`: every fault it can inject, which
//! of them a log can have, the faults a run asks for checked against them,
//! and the two kinds that need a helper to inject (a fault proxy's setting
//! for a `receiver-*` fault, a background task for a Postgres storm).

use std::time::Duration;

use walhook_devkit::faultproxy::Fault;
use walhook_devkit::postgres::LocalPostgres;

use super::storm;

/// Every fault `walhook chaos` can inject.
pub const FAULTS: &[&str] = &[
    "capture.after_handoff",
    "capture.mid_transaction",
    "capture.before_confirm",
    "fanout.before_materialize",
    "fanout.after_materialize",
    "fanout.after_commit",
    "dispatch.before_send",
    "dispatch.after_send",
    "dispatch.after_record",
    "sigkill",
    "postgres-kill",
    "receiver-reset",
    "receiver-blackhole",
    "receiver-latency",
    "receiver-slowclose",
    "receiver-trickle",
    "receiver-flap",
    "pg-connection-limit",
    "pg-cancel-storm",
    "lease-expiry",
    "spu-kill",
    "member-freeze",
];

/// The faults of a Fluvio cluster and its separate processes only.
const FLUVIO_ONLY: &[&str] = &["spu-kill", "member-freeze"];

/// How long a network fault or a Postgres storm lasts.
pub(super) const FAULT_HOLD: Duration = Duration::from_secs(3);

/// The proxy fault of a `receiver-*` fault.
pub(super) fn network_fault(fault: &str) -> Option<Fault> {
    Some(match fault {
        "receiver-reset" => Fault::ResetMidBody,
        "receiver-blackhole" => Fault::BlackHole,
        "receiver-latency" => Fault::Latency(Duration::from_millis(400)),
        "receiver-slowclose" => Fault::SlowClose(Duration::from_secs(3)),
        "receiver-trickle" => Fault::Trickle(Duration::from_millis(100)),
        "receiver-flap" => Fault::Flap(Duration::from_millis(700)),
        _ => return None,
    })
}

/// The faults of a run on the embedded log (`fluvio` false) or on Fluvio.
pub(super) fn faults_of(fluvio: bool) -> Vec<&'static str> {
    FAULTS
        .iter()
        .copied()
        .filter(|f| {
            if fluvio {
                *f != "lease-expiry"
            } else {
                !FLUVIO_ONLY.contains(f)
            }
        })
        .collect()
}

/// The faults asked for, checked against those of the log; `default` when
/// none, every one of the log's for `all`.
pub(super) fn chosen_faults(
    asked: &[String],
    default: &[&str],
    fluvio: bool,
) -> anyhow::Result<Vec<String>> {
    let known = faults_of(fluvio);
    if asked.is_empty() {
        return Ok(default.iter().map(|s| (*s).to_owned()).collect());
    }
    if asked == ["all"] {
        return Ok(known.iter().map(|s| (*s).to_owned()).collect());
    }
    for f in asked {
        if known.contains(&f.as_str()) {
            continue;
        }
        if FLUVIO_ONLY.contains(&f.as_str()) {
            anyhow::bail!(
                "--faults: {f:?} needs separate processes on a Fluvio cluster: add --log fluvio"
            );
        }
        if f == "lease-expiry" {
            anyhow::bail!(
                "--faults: \"lease-expiry\" freezes the one `walhook run` of the embedded log; with --log fluvio \
                 give member-freeze (a fan-out member frozen past its lease)"
            );
        }
        anyhow::bail!(
            "--faults: {f:?} is not a fault walhook chaos knows; give some of {}",
            known.join(", ")
        );
    }
    Ok(asked.to_vec())
}

/// Starts a Postgres storm in the background (it runs while the writes go
/// on); `None` for other faults.
pub(super) fn start_storm(
    fault: &str,
    pg: &LocalPostgres,
) -> Option<tokio::task::JoinHandle<anyhow::Result<String>>> {
    let admin = pg.url("postgres");
    match fault {
        "pg-connection-limit" => Some(tokio::spawn(async move {
            storm::connection_limit(&admin, FAULT_HOLD).await
        })),
        "pg-cancel-storm" => Some(tokio::spawn(async move {
            storm::cancel_storm(&admin, FAULT_HOLD).await
        })),
        _ => None,
    }
}
