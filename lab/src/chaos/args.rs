//! The command line of `walhook chaos`: how many rounds, which faults, on
//! which log, and the soak's rate, pace and report directory.

use std::path::PathBuf;
use std::time::Duration;

/// Arguments of `walhook chaos`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Rounds to run; the faults take turns in an order the seed shuffles
    /// (as many rounds as faults give each fault one turn).
    #[arg(long, default_value_t = 10)]
    pub rounds: u32,
    /// The seed of every random choice (when a failpoint fires, when a kill
    /// comes, which endpoint a network fault hits); printed, so that a
    /// failing run can be repeated.
    #[arg(long)]
    pub seed: Option<u64>,
    /// The faults to inject, comma-separated (default: all):
    /// capture.after_handoff, capture.mid_transaction (a part of a
    /// 10,000-row transaction handed off, its commit not), capture.before_confirm,
    /// fanout.before_materialize, fanout.after_materialize,
    /// fanout.after_commit, dispatch.before_send, dispatch.after_send,
    /// dispatch.after_record (failpoints that abort walhook there), sigkill (of walhook at a random moment),
    /// postgres-kill (kill -9 of Postgres, restarted 0.5 s later),
    /// receiver-reset, receiver-blackhole, receiver-latency (400 ms),
    /// receiver-slowclose (3 s before the FIN), receiver-trickle (a byte
    /// every 100 ms) and receiver-flap (up and refused every 700 ms):
    /// network faults toward one endpoint for 3 s; pg-connection-limit (walhook's role may open no
    /// Postgres session for 3 s, its sessions ended) and pg-cancel-storm
    /// (every statement walhook runs cancelled for 3 s, as a too-short
    /// statement_timeout would), lease-expiry (walhook run frozen with
    /// SIGSTOP for 13 s, longer than its 10 s lease, while a standby
    /// `walhook dispatch` node takes over; then it goes on). With --soak
    /// the default is the faults that leave the walhook process running.
    #[arg(long, value_delimiter = ',')]
    pub faults: Vec<String>,
    /// The log between the stages: `embedded` (one `walhook run`) or
    /// `fluvio` (a throwaway Fluvio cluster from the Fluvio tools,
    /// WALHOOK_FLUVIO_TOOLS or ../shared/tools/fluvio; `walhook capture` and
    /// --members fan-out members as separate processes, joined to their
    /// group). On Fluvio the faults add spu-kill (SIGKILL of the SPU,
    /// restarted 2 s later) and member-freeze (a member frozen with SIGSTOP
    /// past its 4 s lease, then resumed), lease-expiry is left out, and a
    /// kill or failpoint hits the process whose stage it names (any of them
    /// for sigkill).
    #[arg(long, default_value = "embedded", value_parser = ["embedded", "fluvio"])]
    pub log: String,
    /// With --log fluvio: how many fan-out members run.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=8))]
    pub members: u32,
    /// With --log fluvio: `[log] dispatch = "by-endpoint"`: the fan-out
    /// members only fan out, and as many `walhook dispatch` members read
    /// the deliveries topic (that many partitions, at least 2); dispatch's
    /// failpoints and member-freeze then hit the dispatch members, fan-out's
    /// the fan-out members.
    #[arg(long)]
    pub by_endpoint: bool,
    /// Keep walhook's log (its processes' stderr) even when every round was
    /// clean; a run that is not clean always keeps it.
    #[arg(long)]
    pub keep_log: bool,
    /// Business writes per round.
    #[arg(long, default_value_t = 200)]
    pub writes: u32,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// How long to wait for a round's webhooks after its writes.
    #[arg(long, default_value = "120s", value_parser = walhook_pipeline::duration::parse)]
    pub settle: Duration,
    /// Instead of rounds, a soak: write --rate orders a second for this
    /// long (for example 1h), inject the next fault every --fault-every,
    /// sample walhook's RSS, open descriptors, Postgres sessions, slot lag
    /// and the hot tables' sizes, and judge everything at the end.
    #[arg(long, value_parser = walhook_pipeline::duration::parse)]
    pub soak: Option<Duration>,
    /// Soak: orders written a second (each an order.created event to three
    /// endpoints of its tenant; every fourth is paid 10 ms later, an
    /// order.paid event to four: 1.25 events and 4 deliveries per order).
    #[arg(long, default_value_t = 1000)]
    pub rate: u32,
    /// Soak: the pause between two faults.
    #[arg(long, default_value = "3m", value_parser = walhook_pipeline::duration::parse)]
    pub fault_every: Duration,
    /// Soak: how often to sample.
    #[arg(long, default_value = "10s", value_parser = walhook_pipeline::duration::parse)]
    pub sample_every: Duration,
    /// Soak: the directory for the report (soak.json, soak.html with its
    /// charts, soak.svg).
    #[arg(long, default_value = "soak-report")]
    pub report: PathBuf,
}
