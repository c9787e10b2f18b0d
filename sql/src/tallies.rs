//! Reads of the attempt tallies (`0020_attempt_tallies.sql`): what the
//! console charts, without scanning the attempts partitions; and their
//! retention.

use std::time::SystemTime;

use walhook_pipeline::ids::{EndpointId, TenantId};

use crate::{Platform, StoreError};

/// How long the per-endpoint hours are kept.
const ENDPOINT_HOURS_KEPT: &str = "8 days";
/// How long the platform's minutes are kept.
const MINUTES_KEPT: &str = "2 days";

/// The start of the UTC `unit` (`hour`, `minute`) that `t` falls in, the
/// same in every session time zone (timestamp arithmetic only: `extract`
/// would go through `numeric`, slow enough to show in the record
/// statement's time).
pub(crate) fn bin(t: &str, unit: &str) -> String {
    format!("(date_trunc('{unit}', {t} AT TIME ZONE 'UTC') AT TIME ZONE 'UTC')")
}

/// The bucket of `ms` in `walhook.first_attempt_latency`: four per
/// doubling (the bucket's upper bound is `2^(b/4)` ms), so that a
/// quantile read from it is at most 19 % above the truth. Computed here,
/// not in the statement: Postgres's logarithms are slow enough to show in
/// the record statement's time.
pub fn latency_bucket(ms: u64) -> i16 {
    let b = (4.0 * (ms.max(1) as f64).log2()).ceil();
    b.clamp(0.0, 120.0) as i16
}

/// The upper bound (ms) of a bucket of `walhook.first_attempt_latency`.
pub fn latency_bucket_bound_ms(bucket: i16) -> f64 {
    2f64.powf(f64::from(bucket) / 4.0)
}

/// One hour of an endpoint's attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HourTally {
    /// The hour's start (UTC).
    pub hour: SystemTime,
    /// Attempts started in the hour.
    pub attempts: i64,
    /// Of them, succeeded.
    pub succeeded: i64,
}

/// An endpoint's circuit, as dispatch last wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CircuitRow {
    /// Its state.
    pub state: walhook_pipeline::dispatch::breaker::CircuitState,
    /// Failures in a row.
    pub consecutive_failures: i32,
    /// The first failure of the current run of failures.
    pub failing_since: Option<SystemTime>,
    /// When the circuit last opened.
    pub opened_at: Option<SystemTime>,
    /// An open circuit lets a probe through from then on.
    pub open_until: Option<SystemTime>,
}

/// One minute of the platform's attempts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MinuteTally {
    /// Unix seconds of the minute's start.
    pub minute: f64,
    /// Attempts started in the minute.
    pub attempts: i64,
    /// Of them, succeeded.
    pub succeeded: i64,
    /// First automatic attempts of deliveries.
    pub first_attempts: i64,
    /// Commit -> first attempt, median and 99th percentile (ms, the upper
    /// bound of the histogram bucket holding it), when first attempts with
    /// a known commit time started in the minute.
    pub first_latency_ms: Option<(f64, f64)>,
}

/// The platform's last hour.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LastHour {
    /// Minutes with attempts, oldest first.
    pub minutes: Vec<MinuteTally>,
    /// Commit -> first attempt over the whole hour, median and 99th
    /// percentile (ms, bucket upper bounds).
    pub first_latency_ms: Option<(f64, f64)>,
}

/// The upper bound of the bucket holding the `q` quantile of a histogram
/// given as (bucket, count) in bucket order.
fn quantile(buckets: &[(i16, i64)], q: f64) -> Option<f64> {
    let total: i64 = buckets.iter().map(|b| b.1).sum();
    if total == 0 {
        return None;
    }
    // The rank of the quantile's observation, 1-based.
    let rank = ((q * total as f64).ceil() as i64).max(1);
    let mut seen = 0;
    for &(bucket, n) in buckets {
        seen += n;
        if seen >= rank {
            return Some(latency_bucket_bound_ms(bucket));
        }
    }
    buckets.last().map(|b| latency_bucket_bound_ms(b.0))
}

impl Platform {
    /// `tenant`'s endpoint `id`: attempts per hour over the last `hours`
    /// hours (every hour present, oldest first, the current one last), and
    /// its circuit (None before its first attempt). None when the endpoint
    /// is not the tenant's.
    pub async fn endpoint_tallies(
        &self,
        tenant: &TenantId,
        id: EndpointId,
        hours: u32,
    ) -> Result<Option<(Vec<HourTally>, Option<CircuitRow>)>, StoreError> {
        let client = self.client().await?;
        let uid = uuid::Uuid::from_bytes(id.0);
        if !crate::endpoint_admin::is_tenants(&client, tenant, uid).await? {
            return Ok(None);
        }
        let span = i32::try_from(hours.max(1)).unwrap_or(i32::MAX) - 1;
        let rows = client
            .query(
                &format!("WITH now_hour AS (SELECT {} AS h) \
                 SELECT s.hour, coalesce(t.attempts, 0), coalesce(t.succeeded, 0) \
                 FROM now_hour, generate_series(now_hour.h - make_interval(hours => $2::int4), now_hour.h, interval '1 hour') AS s(hour) \
                 LEFT JOIN walhook.endpoint_hours t ON t.endpoint_id = $1 AND t.hour = s.hour \
                 ORDER BY s.hour", bin("now()", "hour")),
                &[&uid, &span],
            )
            .await
            .map_err(StoreError::query("read an endpoint's hours"))?;
        let hours = rows
            .iter()
            .map(|r| HourTally {
                hour: r.get(0),
                attempts: r.get(1),
                succeeded: r.get(2),
            })
            .collect();
        let circuit = client
            .query_opt(
                "SELECT circuit, consecutive_failures, failing_since, opened_at, open_until \
                 FROM walhook.endpoint_health WHERE endpoint_id = $1",
                &[&uid],
            )
            .await
            .map_err(StoreError::query("read an endpoint's circuit"))?
            .map(|r| {
                Ok::<_, StoreError>(CircuitRow {
                    state: crate::stored(r.get(0), "the circuit of endpoint", id)?,
                    consecutive_failures: r.get(1),
                    failing_since: r.get(2),
                    opened_at: r.get(3),
                    open_until: r.get(4),
                })
            })
            .transpose()?;
        Ok(Some((hours, circuit)))
    }

    /// The platform's attempts per minute over the last hour, oldest first
    /// (minutes without attempts left out).
    pub async fn attempts_by_minute(&self) -> Result<LastHour, StoreError> {
        let client = self.client().await?;
        let since = "now() - interval '1 hour'";
        let minutes = client
            .query(
                &format!(
                    "SELECT minute, extract(epoch FROM minute)::float8, attempts, succeeded, first_attempts \
                     FROM walhook.attempt_minutes WHERE minute > {since} ORDER BY minute"
                ),
                &[],
            )
            .await
            .map_err(StoreError::query("read attempts per minute"))?;
        let buckets = client
            .query(
                &format!(
                    "SELECT minute, bucket, attempts FROM walhook.first_attempt_latency \
                     WHERE minute > {since} ORDER BY minute, bucket"
                ),
                &[],
            )
            .await
            .map_err(StoreError::query("read first-attempt latency"))?;
        let mut by_minute: std::collections::HashMap<SystemTime, Vec<(i16, i64)>> =
            std::collections::HashMap::new();
        let mut hour: std::collections::BTreeMap<i16, i64> = std::collections::BTreeMap::new();
        for r in &buckets {
            let (bucket, n) = (r.get(1), r.get(2));
            by_minute.entry(r.get(0)).or_default().push((bucket, n));
            *hour.entry(bucket).or_default() += n;
        }
        let hour: Vec<(i16, i64)> = hour.into_iter().collect();
        let minutes = minutes
            .iter()
            .map(|r| {
                let at: SystemTime = r.get(0);
                let hist = by_minute.get(&at).map(Vec::as_slice).unwrap_or_default();
                MinuteTally {
                    minute: r.get(1),
                    attempts: r.get(2),
                    succeeded: r.get(3),
                    first_attempts: r.get(4),
                    first_latency_ms: quantile(hist, 0.5).zip(quantile(hist, 0.99)),
                }
            })
            .collect();
        Ok(LastHour {
            minutes,
            first_latency_ms: quantile(&hour, 0.5).zip(quantile(&hour, 0.99)),
        })
    }

    /// Drops tallies older than they are kept; returns how many rows.
    pub async fn drop_old_tallies(&self) -> Result<u64, StoreError> {
        let client = self.client().await?;
        let mut dropped = 0;
        for (table, column, kept) in [
            ("endpoint_hours", "hour", ENDPOINT_HOURS_KEPT),
            ("attempt_minutes", "minute", MINUTES_KEPT),
            ("first_attempt_latency", "minute", MINUTES_KEPT),
        ] {
            dropped += client
                .execute(
                    &format!(
                        "DELETE FROM walhook.{table} WHERE {column} < now() - interval '{kept}'"
                    ),
                    &[],
                )
                .await
                .map_err(StoreError::query("drop old attempt tallies"))?;
        }
        Ok(dropped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_name_the_bucket_holding_the_rank() {
        // 90 at ≤ 2^(8/4) = 4 ms, 10 at ≤ 2^(40/4) = 1024 ms.
        let h = [(8, 90), (40, 10)];
        assert_eq!(quantile(&h, 0.5), Some(4.0));
        assert_eq!(quantile(&h, 0.9), Some(4.0));
        assert_eq!(quantile(&h, 0.91), Some(1024.0));
        assert_eq!(quantile(&h, 0.99), Some(1024.0));
        assert_eq!(quantile(&[], 0.5), None);
    }

    #[test]
    fn a_latency_falls_in_a_bucket_at_most_19_percent_above_it() {
        for ms in [
            0u64, 1, 2, 3, 5, 7, 10, 99, 100, 101, 1_000, 65_432, 86_400_000,
        ] {
            let bound = latency_bucket_bound_ms(latency_bucket(ms));
            let ms = ms.max(1) as f64;
            assert!(
                bound >= ms - 1e-9 && bound < ms * 1.19 + 1e-9,
                "{ms} ms -> {bound}"
            );
        }
        // Beyond 2^30 ms (12 days) everything shares the last bucket.
        assert_eq!(latency_bucket(u64::MAX), 120);
    }
}
