//! The soak's sampling: walhook's RSS and open descriptors read from
//! `/proc`, Postgres's sessions, slot lag and table sizes read in one
//! query, and the summaries of a window of samples that the verdict on
//! drift compares.

use std::time::Duration;

use serde::Serialize;
use walhook_devkit::postgres::connect_retrying;

use crate::chaos::storm;

/// One sample; `None` where the reading failed (Postgres down).
#[derive(Debug, Clone, Serialize)]
pub(super) struct Sample {
    /// Seconds since the writes began.
    pub(super) t: f64,
    pub(super) rss_mib: Option<f64>,
    pub(super) open_fds: Option<u64>,
    /// Sessions of walhook's platform role plus the walsender.
    pub(super) pg_sessions: Option<i64>,
    pub(super) slot_lag_mib: Option<f64>,
    /// `pending` and `fanouts`: rows that live until their work is done.
    pub(super) queue_tables_mib: Option<f64>,
    /// `events`, `deliveries`, `attempts`: the history (grows until archived).
    pub(super) history_tables_mib: Option<f64>,
    /// Requests the receiver answered since the previous sample, a second.
    pub(super) requests_per_sec: f64,
}

/// The resident set of process `pid`, from `/proc`.
pub(super) fn rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib / 1024.0)
}

/// The open descriptors of process `pid`, from `/proc`.
pub(super) fn open_fds(pid: u32) -> Option<u64> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64)
}

/// The size of tables, partitions included (a partitioned table's own
/// size is 0; a plain table has no partition tree).
macro_rules! tables_mib {
    ($($name:literal),+) => {
        concat!(
            "(SELECT sum(pg_total_relation_size(t.name::regclass) + COALESCE((\
               SELECT sum(pg_total_relation_size(p.relid)) FROM pg_partition_tree(t.name::regclass) p \
               WHERE p.relid <> t.name::regclass), 0))::float8 / 1048576 \
             FROM unnest(ARRAY[", $("'", $name, "'::text,",)+ "NULL]) t(name) WHERE t.name IS NOT NULL)"
        )
    };
}

const PG_SAMPLE: &str = concat!(
    "SELECT \
      (SELECT count(*) FROM pg_stat_activity WHERE usename = $1 OR backend_type = 'walsender'), \
      (SELECT (pg_current_wal_lsn() - confirmed_flush_lsn)::float8 / 1048576 \
         FROM pg_replication_slots WHERE slot_name = 'walhook'), ",
    tables_mib!("walhook.pending", "walhook.fanouts"),
    ", ",
    tables_mib!("walhook.events", "walhook.deliveries", "walhook.attempts"),
);

/// Postgres's part of a sample: sessions, slot lag, queue and history MiB.
pub(super) async fn pg_sample(
    session: &mut Option<tokio_postgres::Client>,
    url: &str,
) -> (Option<i64>, Option<f64>, Option<f64>, Option<f64>) {
    if session.as_ref().is_none_or(|c| c.is_closed()) {
        *session = connect_retrying(url, Duration::from_millis(500)).await.ok();
    }
    let Some(client) = session.as_ref() else {
        return (None, None, None, None);
    };
    match client.query_one(PG_SAMPLE, &[&storm::APP_ROLE]).await {
        Ok(row) => (row.get(0), row.get(1), row.get(2), row.get(3)),
        Err(_) => {
            *session = None;
            (None, None, None, None)
        }
    }
}

/// How a window of samples is summed up.
#[derive(Clone, Copy)]
pub(super) enum Summary {
    Mean,
    Median,
    Max,
}

/// `how` of `f` over the samples with `t` in `[from, to)` (0 when none).
pub(super) fn window<T: Into<f64> + Copy>(
    samples: &[Sample],
    from: f64,
    to: f64,
    f: impl Fn(&Sample) -> Option<T>,
    how: Summary,
) -> f64 {
    let mut values: Vec<f64> = samples
        .iter()
        .filter(|s| s.t >= from && s.t < to)
        .filter_map(|s| f(s).map(Into::into))
        .collect();
    if values.is_empty() {
        return 0.0;
    }
    match how {
        Summary::Mean => values.iter().sum::<f64>() / values.len() as f64,
        Summary::Max => values.iter().copied().fold(0.0, f64::max),
        Summary::Median => {
            values.sort_by(f64::total_cmp);
            values[values.len() / 2]
        }
    }
}
