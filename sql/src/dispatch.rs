//! Dispatch's reads and writes: attempts, delivery states under leases, and
//! claims of due deliveries.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use uuid::Uuid;
use walhook_pipeline::delivery::{
    AttemptRecord, DeliveryJob, FirstWrite, ObjectOrder, Replay, Trigger,
};
use walhook_pipeline::event::{EventKey, EventType};
use walhook_pipeline::ids::{DeliveryId, EndpointId, EventId, Lsn, TenantId};
use walhook_pipeline::store::{DispatchStore, EndpointHealth, Release, Transition};
use walhook_pipeline::time::Timestamp;

use crate::tallies::{bin, latency_bucket};
use crate::{Platform, StoreError};

/// The number of parameters (arrays) of [`attempts_sql`]: 16 columns and
/// the bucket ([`crate::tallies::latency_bucket`]) of each attempt's commit -> start
/// latency when it is a delivery's first automatic attempt (NULL
/// otherwise).
const ATTEMPT_PARAMS: usize = 17;

/// The CTEs `a` (the attempts, inserted; `careful` skips those already
/// there) and `tallied`, `eh`, `am`, `fl`: what `a` inserted, added to the
/// tallies of `0020_attempt_tallies.sql` (only inserted rows count, so a
/// batch recorded again adds nothing). Each tally takes one upsert per key
/// and batch, in key order (two nodes meet the same rows in the same
/// order).
fn attempts_sql(careful: bool) -> String {
    format!(
        "a AS ( \
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
            SELECT a.endpoint_id, a.tenant_id, a.started_at, a.outcome = 'succeeded' AS ok, l.lat \
            FROM a JOIN (SELECT unnest($1::uuid[]) AS id, unnest($17::int2[]) AS lat) AS l ON l.id = a.id), \
        eh AS ( \
            INSERT INTO walhook.endpoint_hours AS h (endpoint_id, hour, tenant_id, attempts, succeeded) \
            SELECT endpoint_id, {hour}, min(tenant_id), count(*), count(*) FILTER (WHERE ok) \
            FROM tallied GROUP BY 1, 2 ORDER BY 1, 2 \
            ON CONFLICT (endpoint_id, hour) DO UPDATE \
            SET attempts = h.attempts + excluded.attempts, succeeded = h.succeeded + excluded.succeeded), \
        am AS ( \
            INSERT INTO walhook.attempt_minutes AS m (minute, attempts, succeeded, first_attempts) \
            SELECT {minute}, count(*), count(*) FILTER (WHERE ok), count(lat) \
            FROM tallied GROUP BY 1 ORDER BY 1 \
            ON CONFLICT (minute) DO UPDATE \
            SET attempts = m.attempts + excluded.attempts, succeeded = m.succeeded + excluded.succeeded, \
                first_attempts = m.first_attempts + excluded.first_attempts), \
        fl AS ( \
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
static INSERT_ATTEMPTS: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| format!("WITH {} SELECT count(*) FROM a", attempts_sql(true)));

/// The CTEs `u`, `gone`, `freed`: the deliveries' new states under their
/// leases, and the pending rows kept in step (a terminal delivery leaves
/// `pending`; one handed back becomes due for any node), for parameters
/// from `$first` on (9 arrays; the last, when each delivery was made,
/// names its day partition). The state change touches no indexed column
/// of `deliveries`: a HOT update.
fn states_sql(first: usize) -> String {
    format!(
        "u AS ( \
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
            DELETE FROM walhook.pending p USING u \
            WHERE p.delivery_id = u.id AND u.status <> 'pending'), \
        freed AS ( \
            UPDATE walhook.pending p SET lease_owner = NULL, next_attempt_at = u.next_attempt_at FROM u \
            WHERE p.delivery_id = u.id AND u.status = 'pending' AND u.lease_owner IS NULL)",
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

/// The CTEs `n`, `np`, `made`, `done`: the first rows of deliveries that
/// had none (planned by fan-out), for parameters from `$first` on (16
/// arrays), written only under their plan's current lease; their pending
/// rows; and the plans whose deliveries now all have rows, removed. `n`'s
/// rows are counted once per event (`made`), not once per plan: a count
/// inside the plan's condition would scan all of `n` for every plan, work
/// that grows with the square of the batch, and batches grow when
/// dispatch falls behind. A plan whose deliveries all came in this batch
/// (the common case) is done without reading `deliveries`; otherwise the
/// rows from before are counted by primary-key probes (they and `n`'s new
/// rows are disjoint: the statement's snapshot shows no row of `n`). `careful` adds
/// `ON CONFLICT DO NOTHING` (a row written by another writer is left as
/// it is and counts as stale).
fn fresh_sql(first: usize, careful: bool) -> String {
    format!(
        "n AS ( \
            INSERT INTO walhook.deliveries (id, event_id, endpoint_id, tenant_id, event_type, event_occurred_at, \
                endpoint_config_version, status, attempt_count, next_attempt_at, expires_at, lease_version, \
                lease_owner, lease_expires_at, last_http_status, last_error_class, created_at, updated_at) \
            SELECT x.id, x.ev, x.ep, x.tenant, x.etype, x.occ, x.ver, x.status::walhook.delivery_status, \
                   x.attempts, x.next_at, x.expires, x.lease, \
                   CASE WHEN x.hold IS NULL THEN NULL ELSE coalesce(x.holder, f.lease_owner) END, \
                   x.hold, x.http, x.err, \
                   x.created, now() \
            FROM {} AS x \
            JOIN walhook.fanouts f ON f.event_id = x.ev AND f.lease_version = x.lease \
            {} \
            RETURNING id, event_id, endpoint_id, created_at, next_attempt_at, lease_owner, status), \
        np AS ( \
            INSERT INTO walhook.pending (delivery_id, endpoint_id, created_at, next_attempt_at, lease_owner) \
            SELECT id, endpoint_id, created_at, next_attempt_at, lease_owner FROM n WHERE status = 'pending'), \
        made AS ( \
            SELECT event_id, count(*) AS fresh FROM n GROUP BY event_id), \
        done AS ( \
            DELETE FROM walhook.fanouts p USING made m \
            WHERE p.event_id = m.event_id \
              AND CASE WHEN m.fresh >= cardinality(p.delivery_ids) THEN true \
                       ELSE m.fresh + (SELECT count(*) FROM walhook.deliveries d \
                                      WHERE d.id = ANY (p.delivery_ids)) \
                            >= cardinality(p.delivery_ids) END)",
        crate::unnested(
            first,
            &[
                &crate::PLANNED_DELIVERY[..],
                &[
                    ("status", "text"),
                    ("attempts", "int4"),
                    ("next_at", "timestamptz"),
                    ("expires", "timestamptz"),
                    ("created", "timestamptz"),
                    ("hold", "timestamptz"),
                    ("lease", "int8"),
                    ("http", "int4"),
                    ("err", "text"),
                    ("holder", "text")
                ],
            ]
            .concat()
        ),
        if careful {
            "ON CONFLICT DO NOTHING"
        } else {
            ""
        }
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
        results.push("SELECT id FROM u");
        next += 9;
    }
    if fresh {
        ctes.push(fresh_sql(next, false));
        results.push("SELECT id FROM n");
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
        "WITH {}, {} SELECT id FROM u UNION ALL SELECT id FROM n",
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

/// First rows alone (transitions and hand-backs of deliveries that had
/// none), gap-filling.
static FRESH_ONLY: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| format!("WITH {} SELECT id FROM n", fresh_sql(1, true)));

/// Fan-out's plans (deliveries with no row yet) picked by `picked` (a
/// `SELECT event_id, lease_owner AS old_owner … FOR UPDATE SKIP LOCKED`),
/// taken under a new lease by `$1`, expanded into the deliveries that have
/// no row yet (asked as a scalar subquery, which the planner never turns
/// into a join: a primary-key probe per delivery, never a scan of
/// `deliveries`), in the column order of [`Platform::jobs_from_rows`] (a plan
/// whose deliveries all have rows gives one row with a NULL delivery, so
/// that every plan taken shows); `after_unknown` says whether an attempt
/// may have gone out unrecorded.
fn plans_claim_sql(picked: &str, after_unknown: &str) -> String {
    format!(
        "WITH picked AS ({picked}), \
         f AS ( \
            UPDATE walhook.fanouts p SET lease_version = p.lease_version + 1, lease_owner = $1 \
            FROM picked WHERE p.event_id = picked.event_id \
            RETURNING p.event_id, p.event_occurred_at, p.tenant_id, p.event_type, p.delivery_ids, \
                      p.endpoint_ids, p.config_versions, p.created_at, p.expires_at, p.lease_version, \
                      picked.old_owner) \
         SELECT x.id, f.event_id, x.ep, f.tenant_id, f.event_type, e.payload, 0, f.created_at, f.created_at, \
                f.expires_at, f.lease_version, x.ver, f.event_occurred_at, 0, {after_unknown}, \
                e.schema_version, e.object_id, (e.commit_lsn - '0/0'::pg_lsn)::int8, e.tx_ordinal \
         FROM f JOIN walhook.events e ON e.id = f.event_id AND e.occurred_at = f.event_occurred_at \
         LEFT JOIN LATERAL ( \
            SELECT * FROM unnest(f.delivery_ids, f.endpoint_ids, f.config_versions) AS u(id, ep, ver) \
            WHERE (SELECT true FROM walhook.deliveries d WHERE d.id = u.id) IS NULL) x ON true \
         ORDER BY f.event_id"
    )
}

/// This node's plans after a restart, made before this run began (`$5`),
/// in event order after `$3`.
static RECLAIM_PLANS: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    plans_claim_sql(
        "SELECT event_id, lease_owner AS old_owner FROM walhook.fanouts \
         WHERE lease_owner = $1 AND event_id > $3 AND created_at < $5 \
         ORDER BY event_id LIMIT $2 FOR UPDATE SKIP LOCKED",
        "$4::bool",
    )
});

/// Plans of nodes whose lease lapsed (`$3`), and plans nobody holds.
static CLAIM_PLANS: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    plans_claim_sql(
        "SELECT event_id, lease_owner AS old_owner FROM walhook.fanouts \
         WHERE lease_owner = ANY($3::text[]) OR lease_owner IS NULL \
         ORDER BY event_id LIMIT $2 FOR UPDATE SKIP LOCKED",
        "coalesce((SELECT n.stopped_at IS NULL FROM walhook.dispatch_nodes n WHERE n.node_id = f.old_owner), false)",
    )
});

/// Plans whose deliveries all have rows, left behind.
const TIDY_PLANS: &str = "\
DELETE FROM walhook.fanouts p \
WHERE p.created_at < now() - interval '10 seconds' \
  AND (SELECT count(*) FROM walhook.deliveries d WHERE d.id = ANY (p.delivery_ids)) >= cardinality(p.delivery_ids)";

/// Replay requests, one per delivery, of deliveries no other live node
/// holds (every attempt of a delivery goes through its holder, which keeps
/// attempt numbers unique); the manual attempt takes the next number of the
/// delivery's one sequence (automatic + manual attempts recorded).
const CLAIM_REPLAYS: &str = "\
WITH open AS ( \
    SELECT DISTINCT ON (q.delivery_id) q.id, q.delivery_id FROM walhook.replay_requests q \
    JOIN walhook.deliveries d ON d.id = q.delivery_id \
    WHERE q.done_at IS NULL AND (q.claimed_until IS NULL OR q.claimed_until < now()) \
      AND (d.status <> 'pending' OR d.lease_owner IS NULL OR d.lease_owner = $1 \
           OR NOT EXISTS (SELECT 1 FROM walhook.dispatch_nodes n \
                          WHERE n.node_id = d.lease_owner AND n.lease_until >= now())) \
    ORDER BY q.delivery_id, q.id \
    LIMIT $2), \
claimed AS ( \
    UPDATE walhook.replay_requests q SET claimed_by = $1, \
        claimed_until = now() + $3 * interval '1 millisecond' \
    FROM open WHERE q.id = open.id AND q.done_at IS NULL RETURNING q.id, q.delivery_id) \
UPDATE walhook.deliveries d SET manual_attempt_count = d.manual_attempt_count + 1, updated_at = now() \
FROM claimed, walhook.events e \
WHERE d.id = claimed.delivery_id AND e.id = d.event_id AND e.occurred_at = d.event_occurred_at \
RETURNING d.id, d.event_id, d.endpoint_id, d.tenant_id, d.event_type, e.payload, d.attempt_count, \
          d.created_at, d.next_attempt_at, d.expires_at, d.lease_version, d.endpoint_config_version, \
          d.event_occurred_at, d.manual_attempt_count, false, e.schema_version, \
          e.object_id, (e.commit_lsn - '0/0'::pg_lsn)::int8, e.tx_ordinal, claimed.id";

/// The claim update shared by the claims: `due` names the rows and says
/// whether an unrecorded attempt may have gone out (`after_unknown`).
const CLAIM_UPDATE: &str = "\
taken AS (UPDATE walhook.pending p SET lease_owner = $1 FROM due WHERE p.delivery_id = due.id) \
UPDATE walhook.deliveries d SET \
    lease_version = d.lease_version + 1, lease_owner = $1, lease_expires_at = NULL \
FROM due, walhook.events e \
WHERE d.id = due.id AND d.created_at = due.created AND d.status = 'pending' \
  AND e.id = d.event_id AND e.occurred_at = d.event_occurred_at \
RETURNING d.id, d.event_id, d.endpoint_id, d.tenant_id, d.event_type, e.payload, d.attempt_count, \
          d.created_at, d.next_attempt_at, d.expires_at, d.lease_version, d.endpoint_config_version, \
          d.event_occurred_at, d.manual_attempt_count, due.after_unknown, e.schema_version, \
          e.object_id, (e.commit_lsn - '0/0'::pg_lsn)::int8, e.tx_ordinal";

/// Due, unheld deliveries (the `pending_due` index), then those of nodes
/// whose lease lapsed (the `pending_held` index). A delivery is unheld
/// only once its holder recorded it, so nothing of it is unknown. Neither
/// takes a delivery whose replay a node has claimed and not yet recorded:
/// the replay may succeed, and a success ends the automatic schedule (the
/// same transaction closes the request and ends the delivery, so once the
/// request is done there is nothing pending to claim). A probe of the
/// partial index `replay_requests_by_delivery` per candidate row.
const CLAIM_UNHELD: &str = "\
WITH due AS ( \
    SELECT delivery_id AS id, created_at AS created, false AS after_unknown FROM walhook.pending \
    WHERE lease_owner IS NULL AND next_attempt_at <= now() \
      AND endpoint_id <> ALL($3::uuid[]) \
      AND NOT EXISTS (SELECT 1 FROM walhook.replay_requests q \
                      WHERE q.delivery_id = pending.delivery_id AND q.done_at IS NULL \
                        AND q.claimed_until >= now()) \
    ORDER BY next_attempt_at \
    LIMIT $2 \
    FOR UPDATE SKIP LOCKED), ";

/// A lapsed node that did not record a clean stop may have had attempts
/// out.
const CLAIM_ORPHANS: &str = "\
WITH due AS ( \
    SELECT p.delivery_id AS id, p.created_at AS created, coalesce(n.stopped_at IS NULL, true) AS after_unknown \
    FROM walhook.pending p LEFT JOIN walhook.dispatch_nodes n ON n.node_id = p.lease_owner \
    WHERE p.lease_owner = ANY($3::text[]) \
      AND NOT EXISTS (SELECT 1 FROM walhook.replay_requests q \
                      WHERE q.delivery_id = p.delivery_id AND q.done_at IS NULL \
                        AND q.claimed_until >= now()) \
    LIMIT $2 \
    FOR UPDATE OF p SKIP LOCKED), ";

const RECLAIM_OWN: &str = "\
WITH due AS ( \
    SELECT delivery_id AS id, created_at AS created, $4::bool AS after_unknown FROM walhook.pending \
    WHERE lease_owner = $1 AND delivery_id > $3 \
    ORDER BY delivery_id \
    LIMIT $2 \
    FOR UPDATE SKIP LOCKED), ";

/// That the delivery (`delivery`, to `endpoint`: SQL expressions) is in
/// the deliveries partition `$first`, of `$first + 1` partitions, with the
/// sharded endpoints and their shards in `$first + 2` and `$first + 3`
/// (`walhook.delivery_partition`, migration 0026).
fn in_partition(endpoint: &str, delivery: &str, first: usize) -> String {
    format!(
        "walhook.delivery_partition({endpoint}, {delivery}, ${n}::int4, \
            coalesce((SELECT s.k FROM unnest(${e}::uuid[], ${k}::int4[]) AS s(e, k) WHERE s.e = {endpoint}), 1)) \
         = ${first}::int4",
        n = first + 1,
        e = first + 2,
        k = first + 3,
    )
}

/// Deliveries of one partition held by any other node (an earlier holder
/// of the partition) that stopped cleanly or whose lease lapsed (it may
/// still be sending until then: `[dispatch] lease` outlasts a request):
/// `$1` node, `$2` limit, `$3..$6` the partition.
static CLAIM_SCOPED_HELD: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "WITH due AS ( \
            SELECT p.delivery_id AS id, p.created_at AS created, \
                   coalesce(n.stopped_at IS NULL, true) AS after_unknown \
            FROM walhook.pending p LEFT JOIN walhook.dispatch_nodes n ON n.node_id = p.lease_owner \
            WHERE p.lease_owner IS NOT NULL AND p.lease_owner <> $1 AND {} \
              AND (n.node_id IS NULL OR n.stopped_at IS NOT NULL OR n.lease_until < now()) \
              AND NOT EXISTS (SELECT 1 FROM walhook.replay_requests q \
                              WHERE q.delivery_id = p.delivery_id AND q.done_at IS NULL \
                                AND q.claimed_until >= now()) \
            LIMIT $2 \
            FOR UPDATE OF p SKIP LOCKED), {CLAIM_UPDATE}",
        in_partition("p.endpoint_id", "p.delivery_id", 3)
    )
});

/// Due deliveries of one partition that no node holds: `$1` node, `$2`
/// limit, `$3..$6` the partition, `$7` endpoints left alone.
static CLAIM_SCOPED_UNHELD: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "WITH due AS ( \
            SELECT p.delivery_id AS id, p.created_at AS created, false AS after_unknown \
            FROM walhook.pending p \
            WHERE p.lease_owner IS NULL AND p.next_attempt_at <= now() \
              AND p.endpoint_id <> ALL($7::uuid[]) AND {} \
              AND NOT EXISTS (SELECT 1 FROM walhook.replay_requests q \
                              WHERE q.delivery_id = p.delivery_id AND q.done_at IS NULL \
                                AND q.claimed_until >= now()) \
            ORDER BY p.next_attempt_at \
            LIMIT $2 \
            FOR UPDATE OF p SKIP LOCKED), {CLAIM_UPDATE}",
        in_partition("p.endpoint_id", "p.delivery_id", 3)
    )
});

/// [`CLAIM_REPLAYS`] of one partition's deliveries (`$4..$7`).
static CLAIM_REPLAYS_SCOPED: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let at = "ORDER BY q.delivery_id, q.id";
    assert!(CLAIM_REPLAYS.contains(at));
    CLAIM_REPLAYS.replacen(
        at,
        &format!("AND {} {at}", in_partition("d.endpoint_id", "d.id", 4)),
        1,
    )
});

/// The planned deliveries of one partition (`$1..$4`) held by the
/// deliveries topic that have no row yet, as jobs (the columns of
/// [`plans_claim_sql`]), the plans left as they are; `after_unknown` when
/// the partition's latest other dispatcher node (`$6`, a `LIKE` pattern,
/// other than `$5`) did not stop cleanly.
static TAKE_PARTITION: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT x.id, f.event_id, x.ep, f.tenant_id, f.event_type, e.payload, 0, f.created_at, f.created_at, \
                f.expires_at, f.lease_version, x.ver, f.event_occurred_at, 0, \
                coalesce((SELECT n.stopped_at IS NULL FROM walhook.dispatch_nodes n \
                          WHERE n.node_id LIKE $6 AND n.node_id <> $5 \
                          ORDER BY n.started_at DESC LIMIT 1), false), \
                e.schema_version, e.object_id, (e.commit_lsn - '0/0'::pg_lsn)::int8, e.tx_ordinal \
         FROM walhook.fanouts f \
         JOIN walhook.events e ON e.id = f.event_id AND e.occurred_at = f.event_occurred_at \
         CROSS JOIN LATERAL ( \
            SELECT * FROM unnest(f.delivery_ids, f.endpoint_ids, f.config_versions) AS u(id, ep, ver) \
            WHERE {} \
              AND (SELECT true FROM walhook.deliveries d WHERE d.id = u.id) IS NULL) x \
         WHERE f.lease_owner = '{}' \
         ORDER BY f.event_id, x.id",
        in_partition("u.ep", "u.id", 1),
        walhook_pipeline::routing::TOPIC_HELD
    )
});

/// The parameters that name a partition for [`in_partition`].
struct PartitionParams {
    partition: i32,
    partitions: i32,
    endpoints: Vec<Uuid>,
    shards: Vec<i32>,
}

impl PartitionParams {
    fn of(scope: &walhook_pipeline::routing::Scope) -> Self {
        PartitionParams {
            partition: scope.partition as i32,
            partitions: scope.partitions as i32,
            endpoints: scope.shards.iter().map(|(e, _)| uuid16(&e.0)).collect(),
            shards: scope.shards.iter().map(|(_, k)| *k as i32).collect(),
        }
    }

    /// A scoped statement's parameters: `before`, the partition's four,
    /// then `after`.
    fn around<'a>(&'a self, before: &[Param<'a>], after: &[Param<'a>]) -> Vec<Param<'a>> {
        let own: [Param<'a>; 4] = [
            &self.partition,
            &self.partitions,
            &self.endpoints,
            &self.shards,
        ];
        before
            .iter()
            .copied()
            .chain(own)
            .chain(after.iter().copied())
            .collect()
    }
}

/// A statement parameter.
type Param<'a> = &'a (dyn tokio_postgres::types::ToSql + Sync);

impl Platform {
    /// Runs `sql` (prepared once per connection) and reads its rows as
    /// jobs ([`Platform::jobs_from_rows`]); `what` names it in errors.
    #[allow(clippy::too_many_arguments)]
    async fn claimed(
        &self,
        client: &deadpool_postgres::Object,
        sql: &str,
        params: &[Param<'_>],
        what: &'static str,
        replays: bool,
        materialized: bool,
    ) -> Result<Vec<DeliveryJob>, StoreError> {
        let stmt = client
            .prepare_cached(sql)
            .await
            .map_err(StoreError::query(what))?;
        let rows = client
            .query(&stmt, params)
            .await
            .map_err(StoreError::query(what))?;
        self.jobs_from_rows(client, rows, replays, materialized)
            .await
    }
}

fn uuid16(b: &[u8; 16]) -> Uuid {
    Uuid::from_bytes(*b)
}

impl DispatchStore for Platform {
    async fn record(
        &self,
        attempts: &[AttemptRecord],
    ) -> Result<Vec<DeliveryId>, walhook_pipeline::store::StoreError> {
        let mut client = self.client().await?;
        self.ensure_partitions(&client, "attempts", attempts.iter().map(|a| a.started_at))
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
        let outcomes: Vec<&str> = a.iter().map(|x| x.outcome).collect();
        let errors: Vec<Option<&str>> = a.iter().map(|x| x.error_class).collect();
        let shas: Vec<Option<&[u8]>> = a
            .iter()
            .map(|x| x.response_sha256.as_ref().map(|h| h.as_slice()))
            .collect();
        let excerpts: Vec<Option<&str>> = a.iter().map(|x| x.response_excerpt.as_deref()).collect();
        let notes: Vec<Option<&str>> = a.iter().map(|x| x.note).collect();
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
                x.status.as_str(),
                x.attempt_count,
                x.next_attempt_at,
                x.hold_until,
                x.lease_version,
                x.http_status,
                x.error_class,
            );
        }
        self.ensure_partitions(&client, "deliveries", first.created_days())
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
        let u_errs: Vec<Option<&str>> = u.iter().map(|x| x.error_class).collect();
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
        let manual: Vec<&AttemptRecord> =
            a.iter().filter(|x| x.trigger == Trigger::Manual).collect();
        if manual.is_empty() {
            let (with_updates, with_fresh) = (!u.is_empty(), !fresh.is_empty());
            let fast = client
                .prepare_cached(
                    &RECORD_FAST[usize::from(with_updates) * 2 + usize::from(with_fresh)],
                )
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
                    tracing::debug!(
                        "attempts recorded before; recording the batch again carefully"
                    );
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
            let ok: Vec<bool> = manual.iter().map(|x| x.outcome == "succeeded").collect();
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

    async fn transition(
        &self,
        changes: &[Transition],
    ) -> Result<(), walhook_pipeline::store::StoreError> {
        let client = self.client().await?;
        let (fresh, changes): (Vec<&Transition>, Vec<&Transition>) =
            changes.iter().partition(|c| c.first_write.is_some());
        if !fresh.is_empty() {
            // Ended before their first attempt: their row says how.
            let now = Timestamp::now();
            let mut first = FreshRows::default();
            for c in &fresh {
                if let Some(w) = &c.first_write {
                    first.push(
                        c.delivery_id,
                        w,
                        c.status.as_str(),
                        0,
                        now,
                        None,
                        c.lease_version,
                        None,
                        Some(c.reason),
                    );
                }
            }
            first.write(self, &client, "end planned deliveries").await?;
        }
        if changes.is_empty() {
            return Ok(());
        }
        let ids: Vec<Uuid> = changes.iter().map(|c| uuid16(&c.delivery_id.0)).collect();
        let statuses: Vec<&str> = changes.iter().map(|c| c.status.as_str()).collect();
        let leases: Vec<i64> = changes.iter().map(|c| c.lease_version).collect();
        let reasons: Vec<&str> = changes.iter().map(|c| c.reason).collect();
        client
            .execute(
                "WITH u AS ( \
                   UPDATE walhook.deliveries d SET status = x.status::walhook.delivery_status, \
                     last_error_class = x.reason, lease_owner = NULL, lease_expires_at = NULL, updated_at = now() \
                   FROM unnest($1::uuid[], $2::text[], $3::int8[], $4::text[]) AS x(id, status, lease, reason) \
                   WHERE d.id = x.id AND d.lease_version = x.lease AND d.status = 'pending' \
                   RETURNING d.id) \
                 DELETE FROM walhook.pending p USING u WHERE p.delivery_id = u.id",
                &[&ids, &statuses, &leases, &reasons],
            )
            .await
            .map_err(StoreError::query("end deliveries"))?;
        Ok(())
    }

    async fn node_started(
        &self,
        node: &str,
        lease: Duration,
    ) -> Result<bool, walhook_pipeline::store::StoreError> {
        let client = self.client().await?;
        // The previous row's `stopped_at`, read before this start clears it.
        let row = client
            .query_one(
                "WITH before AS (SELECT stopped_at FROM walhook.dispatch_nodes WHERE node_id = $1), \
                 up AS (INSERT INTO walhook.dispatch_nodes (node_id, lease_until, started_at) \
                        VALUES ($1, now() + $2 * interval '1 millisecond', now()) \
                        ON CONFLICT (node_id) DO UPDATE SET lease_until = EXCLUDED.lease_until, \
                          started_at = now(), stopped_at = NULL, updated_at = now()) \
                 SELECT coalesce((SELECT stopped_at IS NOT NULL FROM before), \
                                 NOT EXISTS (SELECT 1 FROM before))",
                &[&node, &(lease.as_millis() as f64)],
            )
            .await
            .map_err(StoreError::query("register the dispatcher node"))?;
        // A new process holds none of the replays its predecessor claimed:
        // they may be claimed again at once (by this node or another).
        client
            .execute(
                "UPDATE walhook.replay_requests SET claimed_until = NULL \
                 WHERE done_at IS NULL AND claimed_by = $1 AND claimed_until IS NOT NULL",
                &[&node],
            )
            .await
            .map_err(StoreError::query(
                "release the replays of the node's previous run",
            ))?;
        Ok(row.get(0))
    }

    async fn node_stopped(&self, node: &str) -> Result<(), walhook_pipeline::store::StoreError> {
        let client = self.client().await?;
        client
            .execute(
                "UPDATE walhook.dispatch_nodes SET stopped_at = now(), updated_at = now() WHERE node_id = $1",
                &[&node],
            )
            .await
            .map_err(StoreError::query("record the node's clean stop"))?;
        Ok(())
    }

    async fn heartbeat(
        &self,
        node: &str,
        lease: Duration,
    ) -> Result<(), walhook_pipeline::store::StoreError> {
        let client = self.client().await?;
        client
            .execute(
                "INSERT INTO walhook.dispatch_nodes (node_id, lease_until) \
                 VALUES ($1, now() + $2 * interval '1 millisecond') \
                 ON CONFLICT (node_id) DO UPDATE SET lease_until = EXCLUDED.lease_until, stopped_at = NULL, updated_at = now()",
                &[&node, &(lease.as_millis() as f64)],
            )
            .await
            .map_err(StoreError::query("renew the node's lease"))?;
        // Replays this node claimed and still holds (one may wait long
        // behind an open circuit) stay its own while it lives: a lapsed
        // claim would be claimed again and sent twice.
        client
            .execute(
                "UPDATE walhook.replay_requests SET claimed_until = now() + $2 * interval '1 millisecond' \
                 WHERE done_at IS NULL AND claimed_by = $1 AND claimed_until IS NOT NULL",
                &[&node, &(lease.as_millis() as f64)],
            )
            .await
            .map_err(StoreError::query("renew the node's replay claims"))?;
        Ok(())
    }

    async fn claim_due(
        &self,
        node: &str,
        limit: usize,
        exclude: &[EndpointId],
    ) -> Result<Vec<DeliveryJob>, walhook_pipeline::store::StoreError> {
        let client = self.client().await?;
        let dead: Vec<String> = client
            .query(
                "SELECT node_id FROM walhook.dispatch_nodes WHERE lease_until < now() AND node_id <> $1",
                &[&node],
            )
            .await
            .map_err(StoreError::query("look for lapsed dispatcher nodes"))?
            .iter()
            .map(|r| r.get(0))
            .collect();
        // Deliveries of lapsed nodes first (with rows: begun, so earlier in
        // their objects' order than their plans), then fan-out's plans of
        // lapsed nodes and plans nobody holds.
        let mut jobs = Vec::new();
        if !dead.is_empty() {
            let stmt = client
                .prepare_cached(&format!("{CLAIM_ORPHANS}{CLAIM_UPDATE}"))
                .await
                .map_err(StoreError::query("prepare the orphan claim"))?;
            let rows = client
                .query(&stmt, &[&node, &(limit as i64), &dead])
                .await
                .map_err(StoreError::query("claim the deliveries of lapsed nodes"))?;
            if !rows.is_empty() {
                tracing::warn!(nodes = ?dead, count = rows.len(), "took over deliveries of dispatcher nodes whose lease lapsed");
            }
            jobs = self.jobs_from_rows(&client, rows, false, true).await?;
        }
        if jobs.len() < limit {
            let stmt = client
                .prepare_cached(&CLAIM_PLANS)
                .await
                .map_err(StoreError::query("prepare the claim of plans"))?;
            let rows = client
                .query(&stmt, &[&node, &((limit - jobs.len()) as i64), &dead])
                .await
                .map_err(StoreError::query("claim plans"))?;
            if !rows.is_empty() && !dead.is_empty() {
                tracing::warn!(nodes = ?dead, count = rows.len(), "took over planned deliveries of dispatcher nodes whose lease lapsed");
            }
            jobs.extend(self.jobs_from_rows(&client, rows, false, false).await?);
        }
        if jobs.len() < limit {
            let excluded: Vec<Uuid> = exclude.iter().map(|e| uuid16(&e.0)).collect();
            let stmt = client
                .prepare_cached(&format!("{CLAIM_UNHELD}{CLAIM_UPDATE}"))
                .await
                .map_err(StoreError::query("prepare the claim"))?;
            let rows = client
                .query(&stmt, &[&node, &((limit - jobs.len()) as i64), &excluded])
                .await
                .map_err(StoreError::query("claim due deliveries"))?;
            jobs.extend(self.jobs_from_rows(&client, rows, false, true).await?);
        }
        if !jobs.is_empty() {
            crate::answer_lost("dispatch.claim_answer_lost")?;
        }
        Ok(jobs)
    }

    async fn reclaim_own(
        &self,
        node: &str,
        after: Option<DeliveryId>,
        limit: usize,
        after_unknown: bool,
    ) -> Result<Vec<DeliveryJob>, walhook_pipeline::store::StoreError> {
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(&format!("{RECLAIM_OWN}{CLAIM_UPDATE}"))
            .await
            .map_err(StoreError::query("prepare the reclaim"))?;
        let after = uuid16(&after.map_or([0; 16], |d| d.0));
        let rows = client
            .query(&stmt, &[&node, &(limit as i64), &after, &after_unknown])
            .await
            .map_err(StoreError::query("reclaim this node's deliveries"))?;
        Ok(self.jobs_from_rows(&client, rows, false, true).await?)
    }

    async fn reclaim_plans(
        &self,
        node: &str,
        after: Option<EventId>,
        limit: usize,
        after_unknown: bool,
        before: Timestamp,
    ) -> Result<(Vec<DeliveryJob>, Option<EventId>), walhook_pipeline::store::StoreError> {
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(&RECLAIM_PLANS)
            .await
            .map_err(StoreError::query("prepare the reclaim of plans"))?;
        let after = uuid16(&after.map_or([0; 16], |e| e.0));
        let rows = client
            .query(
                &stmt,
                &[
                    &node,
                    &(limit as i64),
                    &after,
                    &after_unknown,
                    &before.to_system_time(),
                ],
            )
            .await
            .map_err(StoreError::query("reclaim this node's plans"))?;
        // A page of `limit` plans was taken (the last event continues it),
        // or fewer (done). Plans whose deliveries all have rows give no
        // jobs; the next tidy removes them.
        let next = rows
            .last()
            .map(|r| EventId(*r.get::<_, Uuid>(1).as_bytes()));
        let events: std::collections::HashSet<Uuid> = rows.iter().map(|r| r.get(1)).collect();
        let jobs = self.jobs_from_rows(&client, rows, false, false).await?;
        Ok((jobs, next.filter(|_| events.len() >= limit)))
    }

    async fn cancellations_after(
        &self,
        after: Option<i64>,
        limit: usize,
    ) -> Result<(Vec<DeliveryId>, i64), walhook_pipeline::store::StoreError> {
        Ok(self.read_cancellations(after, limit).await?)
    }

    async fn tidy_plans(&self) -> Result<u64, walhook_pipeline::store::StoreError> {
        let client = self.client().await?;
        Ok(client
            .execute(TIDY_PLANS, &[])
            .await
            .map_err(StoreError::query("remove finished plans"))?)
    }

    async fn expire_tallies(&self) -> Result<u64, walhook_pipeline::store::StoreError> {
        Ok(self.drop_old_tallies().await?)
    }

    async fn clean_queues(&self) -> Result<(), walhook_pipeline::store::StoreError> {
        let client = self.client().await?;
        // A table locked by someone else is skipped this time; a role that
        // does not own the tables gets a warning from the server, not an
        // error (autovacuum still cleans them then, only later).
        client
            .batch_execute("VACUUM (SKIP_LOCKED, TRUNCATE false) walhook.fanouts, walhook.pending")
            .await
            .map_err(StoreError::query("vacuum the queue tables"))?;
        Ok(())
    }

    async fn release(
        &self,
        releases: &[Release],
    ) -> Result<(), walhook_pipeline::store::StoreError> {
        let client = self.client().await?;
        let (fresh, releases): (Vec<&Release>, Vec<&Release>) =
            releases.iter().partition(|r| r.first_write.is_some());
        if !fresh.is_empty() {
            // Handed back before their first attempt: their row is written
            // pending and unheld, due at the given time.
            let mut first = FreshRows::default();
            for r in &fresh {
                if let Some(w) = &r.first_write {
                    first.push(
                        r.delivery_id,
                        w,
                        "pending",
                        0,
                        r.not_before,
                        None,
                        r.lease_version,
                        None,
                        None,
                    );
                }
            }
            first
                .write(self, &client, "hand planned deliveries back")
                .await?;
        }
        if releases.is_empty() {
            return Ok(());
        }
        let ids: Vec<Uuid> = releases.iter().map(|r| uuid16(&r.delivery_id.0)).collect();
        let leases: Vec<i64> = releases.iter().map(|r| r.lease_version).collect();
        let times: Vec<SystemTime> = releases
            .iter()
            .map(|r| r.not_before.to_system_time())
            .collect();
        client
            .execute(
                "WITH u AS ( \
                   UPDATE walhook.deliveries d SET lease_owner = NULL, lease_expires_at = NULL, \
                     next_attempt_at = greatest(d.next_attempt_at, x.t), updated_at = now() \
                   FROM unnest($1::uuid[], $2::int8[], $3::timestamptz[]) AS x(id, lease, t) \
                   WHERE d.id = x.id AND d.lease_version = x.lease AND d.status = 'pending' \
                   RETURNING d.id, d.next_attempt_at) \
                 UPDATE walhook.pending p SET lease_owner = NULL, next_attempt_at = u.next_attempt_at \
                 FROM u WHERE p.delivery_id = u.id",
                &[&ids, &leases, &times],
            )
            .await
            .map_err(StoreError::query("hand deliveries back"))?;
        Ok(())
    }

    async fn claim_scoped(
        &self,
        node: &str,
        limit: usize,
        exclude: &[EndpointId],
        scope: &walhook_pipeline::routing::Scope,
    ) -> Result<Vec<DeliveryJob>, walhook_pipeline::store::StoreError> {
        let client = self.client().await?;
        let part = PartitionParams::of(scope);
        // What an earlier holder of the partition held first (begun, so
        // earlier in their objects' order), then what is due.
        let mut jobs = self
            .claimed(
                &client,
                &CLAIM_SCOPED_HELD,
                &part.around(&[&node, &(limit as i64)], &[]),
                "claim the partition's deliveries other nodes held",
                false,
                true,
            )
            .await?;
        if !jobs.is_empty() {
            tracing::warn!(
                partition = scope.partition,
                count = jobs.len(),
                "took over deliveries of this partition that an earlier holder held"
            );
        }
        if jobs.len() < limit {
            let excluded: Vec<Uuid> = exclude.iter().map(|e| uuid16(&e.0)).collect();
            let rest = (limit - jobs.len()) as i64;
            jobs.extend(
                self.claimed(
                    &client,
                    &CLAIM_SCOPED_UNHELD,
                    &part.around(&[&node, &rest], &[&excluded]),
                    "claim the partition's due deliveries",
                    false,
                    true,
                )
                .await?,
            );
        }
        if !jobs.is_empty() {
            crate::answer_lost("dispatch.claim_answer_lost")?;
        }
        Ok(jobs)
    }

    async fn claim_replays_scoped(
        &self,
        node: &str,
        limit: usize,
        lease: Duration,
        scope: &walhook_pipeline::routing::Scope,
    ) -> Result<Vec<DeliveryJob>, walhook_pipeline::store::StoreError> {
        let client = self.client().await?;
        let part = PartitionParams::of(scope);
        let (limit, lease) = (limit as i64, lease.as_millis() as f64);
        Ok(self
            .claimed(
                &client,
                &CLAIM_REPLAYS_SCOPED,
                &part.around(&[&node, &limit, &lease], &[]),
                "claim replay requests of a partition",
                true,
                true,
            )
            .await?)
    }

    async fn take_partition(
        &self,
        node: &str,
        scope: &walhook_pipeline::routing::Scope,
    ) -> Result<Option<Vec<DeliveryJob>>, walhook_pipeline::store::StoreError> {
        let client = self.client().await?;
        let pattern = format!(
            "%{}%",
            walhook_pipeline::routing::node_suffix(scope.partition)
        );
        // An earlier holder's dispatcher that neither stopped nor lapsed
        // may still send what it read: not yet.
        let running: Vec<String> = client
            .query(
                "SELECT node_id FROM walhook.dispatch_nodes \
                 WHERE node_id LIKE $1 AND node_id <> $2 AND stopped_at IS NULL AND lease_until >= now()",
                &[&pattern, &node],
            )
            .await
            .map_err(StoreError::query(
                "look for earlier dispatchers of the partition",
            ))?
            .iter()
            .map(|r| r.get(0))
            .collect();
        if !running.is_empty() {
            tracing::info!(partition = scope.partition, nodes = ?running, "the partition's planned deliveries wait until its earlier dispatcher stops or its lease lapses");
            return Ok(None);
        }
        let part = PartitionParams::of(scope);
        Ok(Some(
            self.claimed(
                &client,
                &TAKE_PARTITION,
                &part.around(&[], &[&node, &pattern]),
                "read the partition's planned deliveries",
                false,
                false,
            )
            .await?,
        ))
    }

    async fn without_rows(
        &self,
        ids: &[DeliveryId],
    ) -> Result<Vec<DeliveryId>, walhook_pipeline::store::StoreError> {
        let client = self.client().await?;
        let ids: Vec<Uuid> = ids.iter().map(|d| uuid16(&d.0)).collect();
        let rows = client
            .query(
                "SELECT i FROM unnest($1::uuid[]) AS i \
                 WHERE (SELECT true FROM walhook.deliveries d WHERE d.id = i) IS NULL",
                &[&ids],
            )
            .await
            .map_err(StoreError::query("check jobs against the delivery rows"))?;
        Ok(rows
            .iter()
            .map(|r| DeliveryId(*r.get::<_, Uuid>(0).as_bytes()))
            .collect())
    }

    async fn claim_replays(
        &self,
        node: &str,
        limit: usize,
        lease: Duration,
    ) -> Result<Vec<DeliveryJob>, walhook_pipeline::store::StoreError> {
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(CLAIM_REPLAYS)
            .await
            .map_err(StoreError::query("prepare the replay claim"))?;
        let rows = client
            .query(
                &stmt,
                &[&node, &(limit as i64), &(lease.as_millis() as f64)],
            )
            .await
            .map_err(StoreError::query("claim replay requests"))?;
        Ok(self.jobs_from_rows(&client, rows, true, true).await?)
    }

    async fn reject_replay(
        &self,
        request_id: i64,
        reason: &str,
    ) -> Result<(), walhook_pipeline::store::StoreError> {
        let client = self.client().await?;
        client
            .execute(
                "UPDATE walhook.replay_requests SET done_at = now(), error = $2 WHERE id = $1 AND done_at IS NULL",
                &[&request_id, &reason],
            )
            .await
            .map_err(StoreError::query("close a replay request"))?;
        Ok(())
    }

    async fn record_verification(
        &self,
        endpoint: EndpointId,
        challenge: &str,
        result: Result<(), String>,
    ) -> Result<(), walhook_pipeline::store::StoreError> {
        Ok(self
            .record_verification_result(endpoint, challenge, result)
            .await?)
    }

    async fn disable_endpoint(
        &self,
        endpoint: EndpointId,
        reason: &str,
    ) -> Result<(), walhook_pipeline::store::StoreError> {
        Ok(self
            .disable_endpoint_for(endpoint, reason, "walhook")
            .await?)
    }

    async fn save_health(
        &self,
        all: &[EndpointHealth],
    ) -> Result<(), walhook_pipeline::store::StoreError> {
        // One row per endpoint: the latest state in the batch.
        let mut latest: HashMap<EndpointId, &EndpointHealth> = HashMap::new();
        for h in all {
            latest.insert(h.endpoint_id, h);
        }
        let h: Vec<&EndpointHealth> = latest.into_values().collect();
        let ids: Vec<Uuid> = h.iter().map(|x| uuid16(&x.endpoint_id.0)).collect();
        let since: Vec<Option<SystemTime>> = h
            .iter()
            .map(|x| x.failing_since.map(|t| t.to_system_time()))
            .collect();
        let failures: Vec<i32> = h.iter().map(|x| x.consecutive_failures as i32).collect();
        let circuits: Vec<&str> = h.iter().map(|x| x.circuit).collect();
        let until: Vec<Option<SystemTime>> = h
            .iter()
            .map(|x| x.open_until.map(|t| t.to_system_time()))
            .collect();
        let client = self.client().await?;
        client
            .execute(
                "INSERT INTO walhook.endpoint_health (endpoint_id, failing_since, consecutive_failures, circuit, opened_at, open_until, updated_at) \
                 SELECT u.id, u.since, u.failures, u.circuit, CASE WHEN u.circuit = 'open' THEN now() END, u.until, now() \
                 FROM unnest($1::uuid[], $2::timestamptz[], $3::int4[], $4::text[], $5::timestamptz[]) AS u(id, since, failures, circuit, until) \
                 WHERE EXISTS (SELECT 1 FROM walhook.endpoints WHERE id = u.id) \
                 ON CONFLICT (endpoint_id) DO UPDATE SET failing_since = EXCLUDED.failing_since, \
                   consecutive_failures = EXCLUDED.consecutive_failures, circuit = EXCLUDED.circuit, \
                   opened_at = CASE WHEN EXCLUDED.circuit = 'open' THEN coalesce(walhook.endpoint_health.opened_at, now()) END, \
                   open_until = EXCLUDED.open_until, updated_at = now()",
                &[&ids, &since, &failures, &circuits, &until],
            )
            .await
            .map_err(StoreError::query("save endpoint health"))?;
        Ok(())
    }

    async fn load_health(
        &self,
    ) -> Result<Vec<EndpointHealth>, walhook_pipeline::store::StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT h.endpoint_id, e.tenant_id, h.failing_since, h.consecutive_failures, h.circuit, h.open_until \
                 FROM walhook.endpoint_health h JOIN walhook.endpoints e ON e.id = h.endpoint_id \
                 WHERE e.deleted_at IS NULL",
                &[],
            )
            .await
            .map_err(StoreError::query("load endpoint health"))?;
        let mut out = Vec::new();
        for r in rows {
            let Ok(tenant_id) = TenantId::new(r.get::<_, String>(1)) else {
                continue;
            };
            let circuit: String = r.get(4);
            out.push(EndpointHealth {
                endpoint_id: EndpointId(*r.get::<_, Uuid>(0).as_bytes()),
                tenant_id,
                failing_since: r
                    .get::<_, Option<SystemTime>>(2)
                    .map(Timestamp::from_system_time),
                consecutive_failures: r.get::<_, i32>(3).max(0) as u32,
                circuit: match circuit.as_str() {
                    "open" => "open",
                    "half_open" => "half_open",
                    _ => "closed",
                },
                open_until: r
                    .get::<_, Option<SystemTime>>(5)
                    .map(Timestamp::from_system_time),
            });
        }
        Ok(out)
    }
}

/// One first row of a delivery that had none: the 17 arrays of
/// [`fresh_sql`].
#[derive(Default)]
struct FreshRows<'a> {
    ids: Vec<Uuid>,
    events: Vec<Uuid>,
    endpoints: Vec<Uuid>,
    tenants: Vec<&'a str>,
    types: Vec<&'a str>,
    occurred: Vec<SystemTime>,
    versions: Vec<i32>,
    statuses: Vec<&'static str>,
    attempts: Vec<i32>,
    next: Vec<SystemTime>,
    expires: Vec<SystemTime>,
    created: Vec<SystemTime>,
    hold: Vec<Option<SystemTime>>,
    leases: Vec<i64>,
    http: Vec<Option<i32>>,
    errs: Vec<Option<&'a str>>,
    holders: Vec<Option<&'a str>>,
}

impl<'a> FreshRows<'a> {
    #[allow(clippy::too_many_arguments)]
    fn push(
        &mut self,
        id: DeliveryId,
        w: &'a FirstWrite,
        status: &'static str,
        attempts: u32,
        next: Timestamp,
        hold: Option<Timestamp>,
        lease: i64,
        http: Option<u16>,
        err: Option<&'a str>,
    ) {
        self.ids.push(uuid16(&id.0));
        self.events.push(uuid16(&w.event_id.0));
        self.endpoints.push(uuid16(&w.endpoint_id.0));
        self.tenants.push(w.tenant_id.as_str());
        self.types.push(w.event_type.as_str());
        self.occurred.push(w.event_occurred_at.to_system_time());
        self.versions.push(w.config_version);
        self.statuses.push(status);
        self.attempts.push(attempts as i32);
        self.next.push(next.to_system_time());
        self.expires.push(w.expires_at.to_system_time());
        self.created.push(w.created_at.to_system_time());
        self.hold.push(hold.map(|t| t.to_system_time()));
        self.leases.push(lease);
        self.http.push(http.map(i32::from));
        self.errs.push(err);
        self.holders.push(w.holder.as_deref());
    }

    /// When the rows were made: the days whose partitions they need.
    fn created_days(&self) -> impl Iterator<Item = Timestamp> + '_ {
        self.created.iter().map(|t| Timestamp::from_system_time(*t))
    }

    /// Writes these rows alone ([`FRESH_ONLY`]), gap-filling.
    async fn write(
        &self,
        platform: &Platform,
        client: &deadpool_postgres::Object,
        what: &'static str,
    ) -> Result<(), StoreError> {
        platform
            .ensure_partitions(client, "deliveries", self.created_days())
            .await?;
        let stmt = client
            .prepare_cached(&FRESH_ONLY)
            .await
            .map_err(StoreError::query("prepare the first rows"))?;
        client
            .query(&stmt, &self.params())
            .await
            .map_err(StoreError::query(what))?;
        Ok(())
    }

    fn params(&self) -> [&(dyn tokio_postgres::types::ToSql + Sync); 17] {
        [
            &self.ids,
            &self.events,
            &self.endpoints,
            &self.tenants,
            &self.types,
            &self.occurred,
            &self.versions,
            &self.statuses,
            &self.attempts,
            &self.next,
            &self.expires,
            &self.created,
            &self.hold,
            &self.leases,
            &self.http,
            &self.errs,
            &self.holders,
        ]
    }
}

impl Platform {
    /// Jobs from rows of `CLAIM_UPDATE` or `CLAIM_REPLAYS` (the latter
    /// with the replay request id last). A row that cannot be read back
    /// (its tenant or type no longer valid) would otherwise stay claimed by
    /// this node forever: it is ended as failed, with an incident.
    async fn jobs_from_rows(
        &self,
        client: &impl deadpool_postgres::GenericClient,
        rows: Vec<tokio_postgres::Row>,
        replays: bool,
        materialized: bool,
    ) -> Result<Vec<DeliveryJob>, StoreError> {
        let mut jobs = Vec::with_capacity(rows.len());
        let mut unreadable: Vec<(Uuid, i64, String)> = Vec::new();
        for r in rows {
            // A plan taken whose deliveries all have rows: nothing to do.
            let Some(id) = r.get::<_, Option<Uuid>>(0) else {
                continue;
            };
            let tenant: String = r.get(3);
            let etype: String = r.get(4);
            let (tenant_id, event_type) = match (TenantId::new(tenant), EventType::new(&etype)) {
                (Ok(t), Ok(e)) => (t, e),
                (Err(e), _) | (_, Err(e)) => {
                    unreadable.push((id, r.get(10), e.to_string()));
                    continue;
                }
            };
            let payload: Vec<u8> = r.get(5);
            let ts = |i: usize| Timestamp::from_system_time(r.get::<_, SystemTime>(i));
            let manual_attempt_count = r.get::<_, i32>(13).max(0) as u32;
            let attempt_count = r.get::<_, i32>(6).max(0) as u32;
            jobs.push(DeliveryJob {
                delivery_id: DeliveryId(*id.as_bytes()),
                event_id: EventId(*r.get::<_, Uuid>(1).as_bytes()),
                endpoint_id: EndpointId(*r.get::<_, Uuid>(2).as_bytes()),
                tenant_id,
                event_type,
                payload: payload.into(),
                attempt_count,
                manual_attempt_count,
                after_unknown: r.get(14),
                materialized,
                created_at: ts(7),
                next_attempt_at: ts(8),
                expires_at: ts(9),
                lease_version: r.get(10),
                endpoint_config_version: r.get(11),
                event_occurred_at: ts(12),
                schema_version: r.get::<_, i32>(15).max(1) as u32,
                replay: replays.then(|| Replay {
                    request_id: r.get(19),
                    number: attempt_count + manual_attempt_count,
                }),
                order: r.get::<_, Option<String>>(16).map(|object| ObjectOrder {
                    object_id: object.into(),
                    key: EventKey {
                        commit_lsn: Lsn(r.get::<_, i64>(17) as u64),
                        tx_ordinal: r.get::<_, i32>(18) as u32,
                    },
                }),
            });
        }
        if !unreadable.is_empty() {
            self.end_unreadable(client, &unreadable, replays).await?;
        }
        Ok(jobs)
    }

    async fn end_unreadable(
        &self,
        client: &impl deadpool_postgres::GenericClient,
        rows: &[(Uuid, i64, String)],
        replays: bool,
    ) -> Result<(), StoreError> {
        use walhook_pipeline::incident::{IncidentKind, Stage, StageIncident};
        let ids: Vec<Uuid> = rows.iter().map(|r| r.0).collect();
        let leases: Vec<i64> = rows.iter().map(|r| r.1).collect();
        if replays {
            client
                .execute(
                    "UPDATE walhook.replay_requests SET done_at = now(), \
                       error = 'the delivery cannot be read back; see the incidents' \
                     WHERE delivery_id = ANY($1::uuid[]) AND done_at IS NULL",
                    &[&ids],
                )
                .await
                .map_err(StoreError::query(
                    "close replay requests of unreadable deliveries",
                ))?;
        } else {
            client
                .execute(
                    "WITH u AS ( \
                       UPDATE walhook.deliveries d SET status = 'failed', last_error_class = 'unreadable', \
                         lease_owner = NULL, lease_expires_at = NULL, updated_at = now() \
                       FROM unnest($1::uuid[], $2::int8[]) AS x(id, lease) \
                       WHERE d.id = x.id AND d.lease_version = x.lease AND d.status = 'pending' \
                       RETURNING d.id) \
                     DELETE FROM walhook.pending p USING u WHERE p.delivery_id = u.id",
                    &[&ids, &leases],
                )
                .await
                .map_err(StoreError::query("end unreadable deliveries"))?;
        }
        let incidents: Vec<StageIncident> = rows
            .iter()
            .map(|(id, _, why)| {
                let delivery = DeliveryId(*id.as_bytes());
                StageIncident::new(
                    Stage::Dispatch,
                    IncidentKind::UnreadableDelivery,
                    &delivery.to_string(),
                    &format!(
                        "delivery {delivery} could not be read back after it was claimed ({why}); it was \
                         ended as failed instead of being held forever"
                    ),
                )
            })
            .collect();
        for i in &incidents {
            i.log();
        }
        self.upsert_incidents(client, &incidents).await?;
        Ok(())
    }
}
