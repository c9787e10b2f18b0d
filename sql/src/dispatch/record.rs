//! Recording a batch of attempts: the attempt rows with their tallies, the
//! deliveries' states after them and the first rows of deliveries fan-out
//! planned, in one statement on the common path; a careful transaction when
//! part of the batch was written before (a redo) or it holds manual
//! attempts.

use std::collections::HashMap;
use std::time::SystemTime;

use uuid::Uuid;
use walhook_pipeline::delivery::{
    AttemptNote, AttemptRecord, FirstWrite, LastError, OutcomeKind, Trigger,
};
use walhook_pipeline::dispatch::outcome::ErrorClass;
use walhook_pipeline::ids::DeliveryId;
#[cfg(doc)]
use walhook_pipeline::store::DispatchStore;

use super::first_rows::{FreshRows, fresh_sql};
use super::uuid16;
use crate::tallies::{bin, latency_bucket};
use crate::{Platform, StoreError};

/// The number of parameters (arrays) of [`attempts_sql`]: 16 columns and
/// the bucket ([`crate::tallies::latency_bucket`]) of each attempt's commit -> start
/// latency when it is a delivery's first automatic attempt (NULL
/// otherwise).
const ATTEMPT_PARAMS: usize = 17;

/// The CTEs `inserted` (the attempts; `careful` skips those already
/// there) and `tallied`, `hour_tallies`, `minute_tallies`,
/// `latency_tallies`: what `inserted` holds, added to the tallies of
/// `0020_attempt_tallies.sql` (only inserted rows count, so a
/// batch recorded again adds nothing). Each tally takes one upsert per key
/// and batch, in key order (two nodes meet the same rows in the same
/// order).
fn attempts_sql(careful: bool) -> String {
    format!(
        "inserted AS ( \
            INSERT INTO walhook.attempts (id, delivery_id, endpoint_id, tenant_id, number, trigger, \
                endpoint_config_version, started_at, finished_at, http_status, latency_ms, \
                outcome, error_class, response_sha256, response_excerpt, note, secret_versions) \
            SELECT id, del, ep, tenant, num, trig::walhook.attempt_trigger, ver, st, fin, http, \
                   greatest(0, (extract(epoch FROM fin - st) * 1000)::int4), outcome, err, sha, excerpt, note, \
                   ('{{' || secrets || '}}')::int4[] \
            FROM {} AS t \
            {} \
            RETURNING id, endpoint_id, tenant_id, started_at, outcome), \
        tallied AS ( \
            SELECT inserted.endpoint_id, inserted.tenant_id, inserted.started_at, inserted.outcome = 'succeeded' AS ok, l.lat \
            FROM inserted JOIN (SELECT unnest($1::uuid[]) AS id, unnest($17::int2[]) AS lat) AS l ON l.id = inserted.id), \
        hour_tallies AS ( \
            INSERT INTO walhook.endpoint_hours AS h (endpoint_id, hour, tenant_id, attempts, succeeded) \
            SELECT endpoint_id, {hour}, min(tenant_id), count(*), count(*) FILTER (WHERE ok) \
            FROM tallied GROUP BY 1, 2 ORDER BY 1, 2 \
            ON CONFLICT (endpoint_id, hour) DO UPDATE \
            SET attempts = h.attempts + excluded.attempts, succeeded = h.succeeded + excluded.succeeded), \
        minute_tallies AS ( \
            INSERT INTO walhook.attempt_minutes AS m (minute, attempts, succeeded, first_attempts) \
            SELECT {minute}, count(*), count(*) FILTER (WHERE ok), count(lat) \
            FROM tallied GROUP BY 1 ORDER BY 1 \
            ON CONFLICT (minute) DO UPDATE \
            SET attempts = m.attempts + excluded.attempts, succeeded = m.succeeded + excluded.succeeded, \
                first_attempts = m.first_attempts + excluded.first_attempts), \
        latency_tallies AS ( \
            INSERT INTO walhook.first_attempt_latency AS f (minute, bucket, attempts) \
            SELECT {minute}, lat, count(*) \
            FROM tallied WHERE lat IS NOT NULL GROUP BY 1, 2 ORDER BY 1, 2 \
            ON CONFLICT (minute, bucket) DO UPDATE SET attempts = f.attempts + excluded.attempts)",
        crate::unnested(
            1,
            &[
                ("id", "uuid"),
                ("del", "uuid"),
                ("ep", "uuid"),
                ("tenant", "text"),
                ("num", "int4"),
                ("trig", "text"),
                ("ver", "int4"),
                ("st", "timestamptz"),
                ("fin", "timestamptz"),
                ("http", "int4"),
                ("outcome", "text"),
                ("err", "text"),
                ("sha", "bytea"),
                ("excerpt", "text"),
                ("note", "text"),
                ("secrets", "text")
            ]
        ),
        if careful {
            "ON CONFLICT DO NOTHING"
        } else {
            ""
        },
        hour = bin("started_at", "hour"),
        minute = bin("started_at", "minute"),
    )
}

/// The attempts alone (the careful path), skipping those already there.
static INSERT_ATTEMPTS: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!("WITH {} SELECT count(*) FROM inserted", attempts_sql(true))
});

/// The CTEs `new_states`, `gone`, `freed`: the deliveries' new states under their
/// leases, and the pending rows kept in step (a terminal delivery leaves
/// `pending`; one handed back becomes due for any node), for parameters
/// from `$first` on (9 arrays; the last, when each delivery was made,
/// names its day partition). The state change touches no indexed column
/// of `deliveries`: a HOT update. `pending` is reached through its primary
/// key (`= ANY (ARRAY(…))`), whatever its size: a queue of retries that
/// grew behind failing endpoints is never hashed whole for one batch.
fn states_sql(first: usize) -> String {
    format!(
        "new_states AS ( \
            UPDATE walhook.deliveries d SET \
                status = x.status::walhook.delivery_status, \
                attempt_count = greatest(d.attempt_count, x.attempts), \
                next_attempt_at = x.next_at, \
                lease_owner = CASE WHEN x.hold IS NULL THEN NULL ELSE d.lease_owner END, \
                lease_expires_at = x.hold, \
                last_http_status = x.http, \
                last_error_class = x.err, \
                updated_at = now() \
            FROM {} AS x \
            WHERE d.id = x.id AND d.created_at = x.created AND d.lease_version = x.lease \
              AND d.status = 'pending' \
            RETURNING d.id, d.status, d.lease_owner, d.next_attempt_at), \
        gone AS ( \
            DELETE FROM walhook.pending p \
            WHERE p.delivery_id = ANY (ARRAY(SELECT id FROM new_states WHERE status <> 'pending'))), \
        freed AS ( \
            UPDATE walhook.pending p SET lease_owner = NULL, next_attempt_at = s.next_attempt_at FROM new_states s \
            WHERE p.delivery_id = ANY (ARRAY(SELECT id FROM new_states WHERE status = 'pending' AND lease_owner IS NULL)) \
              AND p.delivery_id = s.id)",
        crate::unnested(
            first,
            &[
                ("id", "uuid"),
                ("status", "text"),
                ("attempts", "int4"),
                ("next_at", "timestamptz"),
                ("hold", "timestamptz"),
                ("lease", "int8"),
                ("http", "int4"),
                ("err", "text"),
                ("created", "timestamptz")
            ]
        )
    )
}

/// Attempts with their tallies, the states after them (`updates`: 9
/// arrays) and the first rows of deliveries that had none (`fresh`: 17
/// arrays), in one statement (one round trip, atomic without an explicit
/// transaction), inserts plain: only a redo meets existing rows, and takes
/// [`RECORD_CAREFUL`] after [`INSERT_ATTEMPTS`]. A part with no rows is left out of the
/// statement rather than run empty.
fn record_fast_sql(updates: bool, fresh: bool) -> String {
    let mut ctes = vec![attempts_sql(false)];
    let mut results = Vec::new();
    // After the attempt insert's parameters.
    let mut next = ATTEMPT_PARAMS + 1;
    if updates {
        ctes.push(states_sql(next));
        results.push("SELECT id FROM new_states");
        next += 9;
    }
    if fresh {
        ctes.push(fresh_sql(next, false));
        results.push("SELECT id FROM first_rows");
    }
    if results.is_empty() {
        results.push("SELECT NULL::uuid WHERE false");
    }
    format!("WITH {} {}", ctes.join(", "), results.join(" UNION ALL "))
}

/// [`record_fast_sql`] for each combination of parts, by index
/// `updates as usize * 2 + fresh as usize`.
static RECORD_FAST: std::sync::LazyLock<[String; 4]> = std::sync::LazyLock::new(|| {
    [
        record_fast_sql(false, false),
        record_fast_sql(false, true),
        record_fast_sql(true, false),
        record_fast_sql(true, true),
    ]
});

/// The states and first rows alone, gap-filling (the careful path, after
/// the attempts' own insert).
static RECORD_CAREFUL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "WITH {}, {} SELECT id FROM new_states UNION ALL SELECT id FROM first_rows",
        states_sql(1),
        fresh_sql(10, true)
    )
});

/// The deliveries' states after manual attempts (`$1` ids, `$2` whether
/// each succeeded, `$3` its HTTP status): a success ends a pending, failed
/// or exhausted delivery as succeeded, without its lease (whoever holds it
/// records later results as history only), and out of `pending`.
const RECORD_MANUAL: &str = "\
WITH ended AS ( \
    UPDATE walhook.deliveries d SET \
        status = CASE WHEN m.ok AND d.status IN ('pending', 'failed', 'exhausted') \
                      THEN 'succeeded'::walhook.delivery_status ELSE d.status END, \
        lease_owner = CASE WHEN m.ok AND d.status = 'pending' THEN NULL ELSE d.lease_owner END, \
        lease_expires_at = CASE WHEN m.ok AND d.status = 'pending' THEN NULL ELSE d.lease_expires_at END, \
        last_http_status = m.http, updated_at = now() \
    FROM unnest($1::uuid[], $2::bool[], $3::int4[]) AS m(id, ok, http) WHERE d.id = m.id \
    RETURNING d.id, d.status) \
DELETE FROM walhook.pending p USING ended WHERE p.delivery_id = ended.id AND ended.status <> 'pending'";

/// [`DispatchStore::record`] on Postgres.
pub(super) async fn record(
    platform: &Platform,
    attempts: &[AttemptRecord],
) -> Result<Vec<DeliveryId>, walhook_pipeline::store::StoreError> {
    let mut client = platform.client().await?;
    platform
        .ensure_partitions(&client, "attempts", attempts.iter().map(|a| a.started_at))
        .await?;
    let a = attempts;
    let ids: Vec<Uuid> = a.iter().map(|x| uuid16(&x.attempt_id.0)).collect();
    let deliveries: Vec<Uuid> = a.iter().map(|x| uuid16(&x.delivery_id.0)).collect();
    let endpoints: Vec<Uuid> = a.iter().map(|x| uuid16(&x.endpoint_id.0)).collect();
    let tenants: Vec<&str> = a.iter().map(|x| x.tenant_id.as_str()).collect();
    let numbers: Vec<i32> = a.iter().map(|x| x.number as i32).collect();
    let triggers: Vec<&str> = a.iter().map(|x| x.trigger.as_str()).collect();
    let versions: Vec<i32> = a.iter().map(|x| x.endpoint_config_version).collect();
    let started: Vec<SystemTime> = a.iter().map(|x| x.started_at.to_system_time()).collect();
    let finished: Vec<SystemTime> = a.iter().map(|x| x.finished_at.to_system_time()).collect();
    let statuses: Vec<Option<i32>> = a.iter().map(|x| x.http_status.map(i32::from)).collect();
    let outcomes: Vec<&str> = a.iter().map(|x| x.outcome.as_str()).collect();
    let errors: Vec<Option<&str>> = a
        .iter()
        .map(|x| x.error_class.map(ErrorClass::as_str))
        .collect();
    let shas: Vec<Option<&[u8]>> = a
        .iter()
        .map(|x| x.response_sha256.as_ref().map(|h| h.as_slice()))
        .collect();
    let excerpts: Vec<Option<&str>> = a.iter().map(|x| x.response_excerpt.as_deref()).collect();
    let notes: Vec<Option<&str>> = a.iter().map(|x| x.note.map(AttemptNote::as_str)).collect();
    let first_latency: Vec<Option<i16>> = a
        .iter()
        .map(|x| {
            (x.trigger == Trigger::Auto && x.number == 1).then(|| {
                let ms = x.started_at.since(x.event_occurred_at).as_millis();
                latency_bucket(u64::try_from(ms).unwrap_or(u64::MAX))
            })
        })
        .collect();
    // One array per attempt: unnest cannot take an array of arrays of
    // different lengths, so each travels as the list's text.
    let secret_versions: Vec<String> = a
        .iter()
        .map(|x| {
            let list: Vec<String> = x.secret_versions.iter().map(i32::to_string).collect();
            list.join(",")
        })
        .collect();
    let attempt_params: [&(dyn tokio_postgres::types::ToSql + Sync); ATTEMPT_PARAMS] = [
        &ids,
        &deliveries,
        &endpoints,
        &tenants,
        &numbers,
        &triggers,
        &versions,
        &started,
        &finished,
        &statuses,
        &outcomes,
        &errors,
        &shas,
        &excerpts,
        &notes,
        &secret_versions,
        &first_latency,
    ];

    // One state per delivery: the latest attempt's (an UPDATE … FROM
    // with two source rows for one target applies either). A delivery
    // whose row is written by this batch may have a later attempt in
    // it too (a near retry): the row is written with the latest state.
    let mut latest: HashMap<DeliveryId, &AttemptRecord> = HashMap::new();
    let mut first_writes: HashMap<DeliveryId, &FirstWrite> = HashMap::new();
    for r in a.iter().filter(|x| x.trigger == Trigger::Auto) {
        if let Some(w) = &r.first_write {
            first_writes.insert(r.delivery_id, w);
        }
        match latest.get(&r.delivery_id) {
            Some(prev) if prev.number > r.number => {}
            _ => {
                latest.insert(r.delivery_id, r);
            }
        }
    }
    // Deliveries that have their row are updated; those planned by
    // fan-out and attempted for the first time get their row now.
    let (fresh, u): (Vec<&AttemptRecord>, Vec<&AttemptRecord>) = latest
        .into_values()
        .partition(|x| first_writes.contains_key(&x.delivery_id));
    let mut first = FreshRows::default();
    for x in &fresh {
        first.push(
            x.delivery_id,
            first_writes[&x.delivery_id],
            x.status,
            x.attempt_count,
            x.next_attempt_at,
            x.hold_until,
            x.lease_version,
            x.http_status,
            x.error_class.map(LastError::Attempt),
        );
    }
    platform
        .ensure_partitions(&client, "deliveries", first.created_days())
        .await?;
    let fresh_params = first.params();
    let u_ids: Vec<Uuid> = u.iter().map(|x| uuid16(&x.delivery_id.0)).collect();
    let u_statuses: Vec<&str> = u.iter().map(|x| x.status.as_str()).collect();
    let u_counts: Vec<i32> = u.iter().map(|x| x.attempt_count as i32).collect();
    let u_next: Vec<SystemTime> = u
        .iter()
        .map(|x| x.next_attempt_at.to_system_time())
        .collect();
    let u_hold: Vec<Option<SystemTime>> = u
        .iter()
        .map(|x| x.hold_until.map(|t| t.to_system_time()))
        .collect();
    let u_leases: Vec<i64> = u.iter().map(|x| x.lease_version).collect();
    let u_http: Vec<Option<i32>> = u.iter().map(|x| x.http_status.map(i32::from)).collect();
    let u_errs: Vec<Option<&str>> = u
        .iter()
        .map(|x| x.error_class.map(ErrorClass::as_str))
        .collect();
    let u_created: Vec<SystemTime> = u
        .iter()
        .map(|x| x.delivery_created_at.to_system_time())
        .collect();
    let update_params: [&(dyn tokio_postgres::types::ToSql + Sync); 9] = [
        &u_ids,
        &u_statuses,
        &u_counts,
        &u_next,
        &u_hold,
        &u_leases,
        &u_http,
        &u_errs,
        &u_created,
    ];
    let stale_of = |rows: &[tokio_postgres::Row]| -> Vec<DeliveryId> {
        let applied: std::collections::HashSet<Uuid> = rows.iter().map(|r| r.get(0)).collect();
        u.iter()
            .chain(fresh.iter())
            .filter(|x| !applied.contains(&uuid16(&x.delivery_id.0)))
            .map(|x| x.delivery_id)
            .collect()
    };

    // The common batch (automatic attempts only): one statement, one
    // round trip, plain inserts (attempt ids are new unless a write of
    // this batch committed before an error hid it: then the careful
    // path below).
    let manual: Vec<&AttemptRecord> = a.iter().filter(|x| x.trigger == Trigger::Manual).collect();
    if manual.is_empty() {
        let (with_updates, with_fresh) = (!u.is_empty(), !fresh.is_empty());
        let fast = client
            .prepare_cached(&RECORD_FAST[usize::from(with_updates) * 2 + usize::from(with_fresh)])
            .await
            .map_err(StoreError::query("prepare the attempt record"))?;
        let mut all: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = attempt_params.to_vec();
        if with_updates {
            all.extend(update_params.iter().copied());
        }
        if with_fresh {
            all.extend(fresh_params.iter().copied());
        }
        match client.query(&fast, &all).await {
            Ok(rows) => return Ok(stale_of(&rows)),
            Err(e) if crate::fanout::is_unique_violation(&e) => {
                tracing::debug!("attempts recorded before; recording the batch again carefully");
            }
            Err(e) => return Err(StoreError::query("record attempts")(e).into()),
        }
    }

    let tx = client
        .transaction()
        .await
        .map_err(StoreError::query("begin recording"))?;
    let stmt = tx
        .prepare_cached(&INSERT_ATTEMPTS)
        .await
        .map_err(StoreError::query("prepare the attempt insert"))?;
    tx.query_one(&stmt, &attempt_params)
        .await
        .map_err(StoreError::query("insert attempts"))?;

    let stmt = tx
        .prepare_cached(&RECORD_CAREFUL)
        .await
        .map_err(StoreError::query("prepare the delivery update"))?;
    let careful: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = update_params
        .iter()
        .chain(fresh_params.iter())
        .copied()
        .collect();
    let rows = tx
        .query(&stmt, &careful)
        .await
        .map_err(StoreError::query("update deliveries"))?;
    // Manual attempts, after the automatic ones' states (an automatic
    // attempt of the batch still counts): the replay request is done,
    // and a success ends the delivery as succeeded, a pending one too,
    // which leaves `pending` so that no node claims it again (a holder's
    // later result is not applied: it is no longer pending).
    if !manual.is_empty() {
        let req: Vec<i64> = manual
            .iter()
            .map(|x| x.replay_request.unwrap_or(0))
            .collect();
        let att: Vec<Uuid> = manual.iter().map(|x| uuid16(&x.attempt_id.0)).collect();
        let del: Vec<Uuid> = manual.iter().map(|x| uuid16(&x.delivery_id.0)).collect();
        let ok: Vec<bool> = manual
            .iter()
            .map(|x| x.outcome == OutcomeKind::Succeeded)
            .collect();
        let http: Vec<Option<i32>> = manual
            .iter()
            .map(|x| x.http_status.map(i32::from))
            .collect();
        tx.execute(
            "UPDATE walhook.replay_requests q SET done_at = now(), attempt_id = u.att \
             FROM unnest($1::int8[], $2::uuid[]) AS u(id, att) WHERE q.id = u.id",
            &[&req, &att],
        )
        .await
        .map_err(StoreError::query("close replay requests"))?;
        tx.execute(RECORD_MANUAL, &[&del, &ok, &http])
            .await
            .map_err(StoreError::query("record manual attempts"))?;
    }

    crate::commit!(tx, client).map_err(StoreError::query("commit attempts"))?;
    Ok(stale_of(&rows))
}
