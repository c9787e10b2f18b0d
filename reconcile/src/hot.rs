//! The hot tables of one window, read at one snapshot: events against the
//! deliveries fan-out's planner calls for, deliveries against their states
//! and attempts.
//!
//! Two sorted streams are merged, so memory stays flat however long the
//! window: the window's events by id, and its deliveries (rows and fan-out
//! plans) by event and endpoint. The window's rows of archived days
//! ([`crate::archived`]) join each stream in order, so they are judged by
//! the same rules; a row both hot and archived (restored for a replay)
//! counts once, as its hot row.

use std::collections::HashSet;
use std::pin::Pin;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Row, RowStream};
use uuid::Uuid;
use walhook_pipeline::delivery::DeliveryStatus;
use walhook_pipeline::event::EventType;
use walhook_pipeline::ids::{DeliveryId, EndpointId, EventId, TenantId};
use walhook_pipeline::time::Timestamp;

use crate::ReconcileError;
use crate::findings::{Findings, MAX_REPAIRS_PER_RUN, MissingDelivery, Overdue, gap};
use crate::history::{Decision, History};
use crate::report::{Explanation, GapClass};

/// What the hot stage reads, and what it needs to know about the rest of
/// the platform.
pub struct Context<'a> {
    /// The window's start.
    pub since: SystemTime,
    /// The window's end.
    pub until: SystemTime,
    /// The one tenant read, if one.
    pub tenant: Option<&'a str>,
    /// The planner's history.
    pub history: &'a History,
    /// Days whose events partition the archive dropped.
    pub archived_event_days: &'a HashSet<chrono::NaiveDate>,
    /// Deliveries created before this have attempts in archived days:
    /// their attempt counts are not compared with the hot table.
    pub hot_attempts_from: SystemTime,
    /// Deliveries with a replay under way (claimed, not recorded yet).
    pub replaying: &'a HashSet<[u8; 16]>,
    /// The snapshot's time.
    pub as_of: SystemTime,
    /// How long past due a pending delivery may wait.
    pub grace: Duration,
}

const EVENTS_SQL: &str = "\
SELECT id, tenant_id, event_type, occurred_at, commit_lsn = '0/0'::pg_lsn \
FROM walhook.events WHERE occurred_at >= $1 AND occurred_at < $2 AND ($3::text IS NULL OR tenant_id = $3) \
ORDER BY id";

/// Deliveries (rows, with their scheduling row, the liveness of their
/// holder and their attempts in the hot table) and fan-out plans'
/// deliveries that have no row yet, by event and endpoint. A plan's
/// delivery that has its row comes twice; the row wins.
///
/// Attempts count by number. A holder that takes a delivery over from a node
/// whose lease lapsed numbers its attempt past the one that may be out
/// (noting `previous_outcome_unknown`); when that node comes back and
/// records its attempt late, the history has one number more than the
/// delivery counts, which each such note explains.
const DELIVERIES_SQL: &str = "\
SELECT d.event_id, d.endpoint_id, d.id, d.tenant_id, d.status::text, \
       d.attempt_count + d.manual_attempt_count, coalesce(a.n, 0), d.created_at, \
       p.delivery_id IS NOT NULL, p.next_attempt_at, p.lease_owner, coalesce(n.lease_until >= $5, false), \
       d.event_occurred_at, 0, coalesce(a.u, 0) \
FROM walhook.deliveries d \
LEFT JOIN (SELECT delivery_id, count(*) AS n, sum(unknown) AS u FROM ( \
               SELECT delivery_id, number, max((note = 'previous_outcome_unknown')::int) AS unknown \
               FROM walhook.attempts WHERE started_at >= $4 GROUP BY 1, 2) numbered GROUP BY 1) a \
       ON a.delivery_id = d.id \
LEFT JOIN walhook.pending p ON p.delivery_id = d.id \
LEFT JOIN walhook.dispatch_nodes n ON n.node_id = p.lease_owner \
WHERE d.event_occurred_at >= $1 AND d.event_occurred_at < $2 AND ($3::text IS NULL OR d.tenant_id = $3) \
UNION ALL \
SELECT f.event_id, u.ep, u.id, f.tenant_id, 'planned', 0, 0, f.created_at, \
       false, f.created_at, f.lease_owner, coalesce(n.lease_until >= $5, false), f.event_occurred_at, 1, 0 \
FROM walhook.fanouts f CROSS JOIN LATERAL unnest(f.endpoint_ids, f.delivery_ids) AS u(ep, id) \
LEFT JOIN walhook.dispatch_nodes n ON n.node_id = f.lease_owner \
WHERE f.event_occurred_at >= $1 AND f.event_occurred_at < $2 AND ($3::text IS NULL OR f.tenant_id = $3) \
ORDER BY 1, 2, 14";

/// An event, hot or archived.
pub(crate) struct EventRow {
    pub(crate) id: [u8; 16],
    pub(crate) tenant: String,
    pub(crate) event_type: String,
    pub(crate) occurred_at: SystemTime,
    pub(crate) operational: bool,
    /// Read from an archived day.
    pub(crate) archived: bool,
}

/// A delivery, hot or archived, with its attempts.
pub(crate) struct DeliveryRow {
    pub(crate) event_id: [u8; 16],
    pub(crate) endpoint_id: [u8; 16],
    pub(crate) id: [u8; 16],
    tenant: String,
    /// Its status, or planned.
    status: RowStatus,
    counted: i64,
    hot_attempts: i64,
    /// Its attempts in archived days.
    cold_attempts: i64,
    created_at: SystemTime,
    has_schedule: bool,
    due_at: Option<SystemTime>,
    lease_owner: Option<String>,
    lease_live: bool,
    event_occurred_at: SystemTime,
    /// Attempt numbers noted as taken over from a node whose attempt may
    /// have been out.
    unknown_before: i64,
    /// Read from an archived day.
    archived: bool,
}

impl DeliveryRow {
    /// A delivery read from an archived day (terminal: no schedule, no
    /// lease).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn archived(
        event_id: [u8; 16],
        endpoint_id: [u8; 16],
        id: [u8; 16],
        tenant: String,
        status: RowStatus,
        counted: i64,
        created_at: SystemTime,
        event_occurred_at: SystemTime,
    ) -> Self {
        DeliveryRow {
            event_id,
            endpoint_id,
            id,
            tenant,
            status,
            counted,
            hot_attempts: 0,
            cold_attempts: 0,
            created_at,
            has_schedule: false,
            due_at: None,
            lease_owner: None,
            lease_live: false,
            event_occurred_at,
            unknown_before: 0,
            archived: true,
        }
    }
}

fn uuid_bytes(row: &Row, i: usize) -> [u8; 16] {
    *row.get::<_, Uuid>(i).as_bytes()
}

/// Where a delivery the reconciler reads stands: its row's status, or
/// planned (fan-out planned it; it has no row until its first attempt).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RowStatus {
    /// A delivery row's status.
    Row(DeliveryStatus),
    /// A plan's delivery without a row.
    Planned,
}

impl RowStatus {
    const PLANNED: &'static str = "planned";

    /// Parses the status column (or the plans' `planned`) of delivery `id`.
    pub(crate) fn parse(text: &str, id: [u8; 16]) -> Result<Self, ReconcileError> {
        if text == Self::PLANNED {
            return Ok(RowStatus::Planned);
        }
        DeliveryStatus::try_from(text)
            .map(RowStatus::Row)
            .map_err(|source| ReconcileError::Stored {
                row: format!("delivery {}", DeliveryId(id)),
                source,
            })
    }
}

impl std::fmt::Display for RowStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RowStatus::Row(s) => s.as_str(),
            RowStatus::Planned => Self::PLANNED,
        })
    }
}

fn event_row(r: &Row) -> Result<EventRow, ReconcileError> {
    Ok(EventRow {
        id: uuid_bytes(r, 0),
        tenant: r.get(1),
        event_type: r.get(2),
        occurred_at: r.get(3),
        operational: r.get(4),
        archived: false,
    })
}

fn delivery_row(r: &Row) -> Result<DeliveryRow, ReconcileError> {
    let id = uuid_bytes(r, 2);
    Ok(DeliveryRow {
        event_id: uuid_bytes(r, 0),
        endpoint_id: uuid_bytes(r, 1),
        id,
        tenant: r.get(3),
        status: RowStatus::parse(r.get(4), id)?,
        counted: i64::from(r.get::<_, i32>(5)),
        hot_attempts: r.get(6),
        cold_attempts: 0,
        created_at: r.get(7),
        has_schedule: r.get(8),
        due_at: r.get(9),
        lease_owner: r.get(10),
        lease_live: r.get(11),
        event_occurred_at: r.get(12),
        unknown_before: r.get(14),
        archived: false,
    })
}

type Rows = Pin<Box<RowStream>>;

async fn stream(
    client: &tokio_postgres::Client,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
    what: &'static str,
) -> Result<Rows, ReconcileError> {
    let rows = client
        .query_raw(sql, params.iter().copied())
        .await
        .map_err(ReconcileError::query(what))?;
    Ok(Box::pin(rows))
}

async fn next<T>(
    rows: &mut Rows,
    decode: fn(&Row) -> Result<T, ReconcileError>,
    what: &'static str,
) -> Result<Option<T>, ReconcileError> {
    match rows.next().await {
        None => Ok(None),
        Some(Ok(r)) => decode(&r).map(Some),
        Some(Err(e)) => Err(ReconcileError::query(what)(e)),
    }
}

/// A hot stream and the archived rows of the same order, merged: the
/// smaller key first, the hot row first on a tie.
struct Merged<T, K: Ord> {
    hot: Rows,
    decode: fn(&Row) -> Result<T, ReconcileError>,
    what: &'static str,
    key: fn(&T) -> K,
    next_hot: Option<T>,
    cold: std::iter::Peekable<std::vec::IntoIter<T>>,
}

impl<T, K: Ord> Merged<T, K> {
    async fn new(
        mut hot: Rows,
        decode: fn(&Row) -> Result<T, ReconcileError>,
        what: &'static str,
        key: fn(&T) -> K,
        cold: Vec<T>,
    ) -> Result<Self, ReconcileError> {
        let next_hot = next(&mut hot, decode, what).await?;
        Ok(Merged {
            hot,
            decode,
            what,
            key,
            next_hot,
            cold: cold.into_iter().peekable(),
        })
    }

    async fn next(&mut self) -> Result<Option<T>, ReconcileError> {
        let hot_first = match (&self.next_hot, self.cold.peek()) {
            (None, None) => return Ok(None),
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(h), Some(c)) => (self.key)(h) <= (self.key)(c),
        };
        if !hot_first {
            return Ok(self.cold.next());
        }
        let row = self.next_hot.take();
        self.next_hot = next(&mut self.hot, self.decode, self.what).await?;
        Ok(row)
    }
}

/// Reads the window's events on `events_client` and deliveries on
/// `deliveries_client` (both at one snapshot) and records what it finds.
pub(crate) async fn run(
    events_client: &tokio_postgres::Client,
    deliveries_client: &tokio_postgres::Client,
    ctx: &Context<'_>,
    archived: crate::archived::Sorted,
    findings: &mut Findings,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<(), ReconcileError> {
    let (since, until, tenant) = (ctx.since, ctx.until, ctx.tenant);
    let attempts_from = since - Duration::from_secs(3600);
    let events = stream(
        events_client,
        EVENTS_SQL,
        &[&since, &until, &tenant],
        "read the window's events",
    )
    .await?;
    let deliveries = stream(
        deliveries_client,
        DELIVERIES_SQL,
        &[&since, &until, &tenant, &attempts_from, &ctx.as_of],
        "read the window's deliveries",
    )
    .await?;
    let crate::archived::Sorted {
        events: cold_events,
        deliveries: cold_deliveries,
        attempts: cold_attempts,
    } = archived;
    let mut events = Merged::new(
        events,
        event_row,
        "read an event",
        |e: &EventRow| e.id,
        cold_events,
    )
    .await?;
    let mut deliveries = Merged::new(
        deliveries,
        delivery_row,
        "read a delivery",
        |d: &DeliveryRow| (d.event_id, d.endpoint_id),
        cold_deliveries,
    )
    .await?;
    let mut event = events.next().await?;
    let mut delivery = deliveries.next().await?;
    let mut read = 0u64;
    loop {
        // The next event id in either stream.
        let key = match (&event, &delivery) {
            (None, None) => break,
            (Some(e), None) => e.id,
            (None, Some(d)) => d.event_id,
            (Some(e), Some(d)) => e.id.min(d.event_id),
        };
        let this_event = match &event {
            Some(e) if e.id == key => {
                let e = event.take();
                event = events.next().await?;
                // The same event hot and archived: the hot one counts.
                while event.as_ref().is_some_and(|n| n.id == key) {
                    event = events.next().await?;
                }
                e
            }
            _ => None,
        };
        let mut group: Vec<DeliveryRow> = Vec::new();
        while let Some(mut d) = delivery.take_if(|d| d.event_id == key) {
            // A plan's delivery that has its row too, or an archived one
            // that has its hot row: the hot row came first.
            if group
                .last()
                .is_none_or(|last| last.endpoint_id != d.endpoint_id)
            {
                if let Some(a) = cold_attempts.get(&d.id) {
                    d.cold_attempts = a.numbers;
                    d.unknown_before += a.unknown;
                }
                group.push(d);
            }
            delivery = deliveries.next().await?;
        }
        read += 1 + group.len() as u64;
        if read >= 10_000 {
            progress(read);
            read = 0;
        }
        judge_event(key, this_event, &group, ctx, findings);
        for d in &group {
            judge_delivery(d, ctx, findings);
        }
    }
    progress(read);
    Ok(())
}

fn event_text(id: [u8; 16]) -> String {
    EventId(id).to_string()
}

/// Compares one event's deliveries with what the planner calls for.
fn judge_event(
    key: [u8; 16],
    event: Option<EventRow>,
    group: &[DeliveryRow],
    ctx: &Context<'_>,
    findings: &mut Findings,
) {
    let Some(event) = event else {
        // Deliveries of an event that is not among the window's hot events.
        let d = &group[0];
        let day = chrono::DateTime::<chrono::Utc>::from(d.event_occurred_at).date_naive();
        findings.count(&d.tenant, |f| {
            f.materialised_deliveries += group.len() as u64
        });
        if ctx.archived_event_days.contains(&day) {
            findings.count(&d.tenant, |f| f.expected_deliveries += group.len() as u64);
            findings.explain(
                Explanation::EventArchived,
                Some(&d.tenant),
                group.len() as u64,
            );
        } else {
            let mut g = gap(
                GapClass::MissingEvent,
                &event_text(key),
                Some(&d.tenant),
                format!(
                    "{} deliver{} name event {} (occurred {}), which is not stored",
                    group.len(),
                    if group.len() == 1 { "y" } else { "ies" },
                    event_text(key),
                    crate::window::rfc3339(d.event_occurred_at)
                ),
            );
            g.event_id = Some(event_text(key));
            findings.gap(g);
        }
        return;
    };
    let tenant = event.tenant.as_str();
    findings.count(tenant, |f| {
        f.events += 1;
        if event.archived {
            f.events_archived += 1;
        }
        f.materialised_deliveries += group.len() as u64;
    });
    if event.operational {
        findings.count(tenant, |f| f.expected_deliveries += group.len() as u64);
        findings.explain(
            Explanation::OperationalEvent,
            Some(tenant),
            group.len() as u64,
        );
        return;
    }
    let Ok(tenant_id) = TenantId::new(tenant) else {
        findings.explain(Explanation::TenantUnknown, Some(tenant), 1);
        return;
    };
    if !ctx.history.knows_tenant(&tenant_id) {
        findings.explain(Explanation::TenantUnknown, Some(tenant), 1);
        for d in group {
            unexpected(d, "the tenant is not registered", findings);
        }
        return;
    }
    let Ok(event_type) = EventType::new(&event.event_type) else {
        for d in group {
            unexpected(d, "the event's type is not a valid type", findings);
        }
        return;
    };
    let at = Timestamp::from_system_time(event.occurred_at);
    // The group is sorted by endpoint (the query's order).
    let present = |endpoint: &[u8; 16]| {
        group
            .binary_search_by(|d| d.endpoint_id.cmp(endpoint))
            .is_ok()
    };
    let mut wanted: Vec<[u8; 16]> = Vec::new();
    let mut matched = 0usize;
    for (endpoint, decision) in ctx.history.decide(&tenant_id, &event_type, at) {
        match decision {
            Decision::Expected(version) => {
                wanted.push(endpoint.id.0);
                if present(&endpoint.id.0) {
                    matched += 1;
                    continue;
                }
                let delivery = DeliveryId::derive(EventId(key), endpoint.id);
                let mut g = gap(
                    GapClass::MissingDelivery,
                    &delivery.to_string(),
                    Some(tenant),
                    format!(
                        "event {} ({}, occurred {}) was due to reach endpoint {} (config version {version}); \
                         no delivery exists{}",
                        event_text(key),
                        event.event_type,
                        crate::window::rfc3339(event.occurred_at),
                        endpoint.id,
                        if event.archived {
                            format!(
                                " in the archived day {} (its Parquet parts) nor in the hot tables",
                                chrono::DateTime::<chrono::Utc>::from(event.occurred_at)
                                    .date_naive()
                            )
                        } else {
                            String::new()
                        }
                    ),
                );
                g.event_id = Some(event_text(key));
                g.delivery_id = Some(delivery.to_string());
                g.endpoint_id = Some(endpoint.id.to_string());
                findings.gap(g);
                // Fan-out re-drives from the hot event; an archived one is
                // reported, not repaired.
                if !event.archived && findings.missing.len() < MAX_REPAIRS_PER_RUN {
                    findings.missing.push(MissingDelivery {
                        event_id: key,
                        endpoint_id: endpoint.id.0,
                        config_version: version,
                    });
                }
            }
            // A delivery that exists anyway is judged as unexpected below.
            Decision::NotExpected(reason) => {
                if !present(&endpoint.id.0) && reason != Explanation::TypeNotSubscribed {
                    findings.explain(reason, Some(tenant), 1);
                }
            }
        }
    }
    findings.count(tenant, |f| f.expected_deliveries += wanted.len() as u64);
    if matched != group.len() {
        wanted.sort_unstable();
        for d in group {
            if wanted.binary_search(&d.endpoint_id).is_err() {
                unexpected(
                    d,
                    "no subscription in force when the event occurred called for it",
                    findings,
                );
            }
        }
    }
}

fn unexpected(d: &DeliveryRow, why: &str, findings: &mut Findings) {
    let id = DeliveryId(d.id).to_string();
    let mut g = gap(
        GapClass::UnexpectedDelivery,
        &id,
        Some(&d.tenant),
        format!(
            "delivery {id} of event {} to endpoint {} ({}): {why}",
            event_text(d.event_id),
            EndpointId(d.endpoint_id),
            d.status
        ),
    );
    g.event_id = Some(event_text(d.event_id));
    g.delivery_id = Some(id);
    g.endpoint_id = Some(EndpointId(d.endpoint_id).to_string());
    findings.gap(g);
}

/// Checks one delivery's state against its schedule and its attempts.
fn judge_delivery(d: &DeliveryRow, ctx: &Context<'_>, findings: &mut Findings) {
    let tenant = d.tenant.as_str();
    let id = DeliveryId(d.id);
    let with_ids = |class: GapClass, detail: String| {
        let mut g = gap(class, &id.to_string(), Some(tenant), detail);
        g.event_id = Some(event_text(d.event_id));
        g.delivery_id = Some(id.to_string());
        g.endpoint_id = Some(EndpointId(d.endpoint_id).to_string());
        g
    };
    findings.count(tenant, |f| {
        if d.counted > 0 {
            f.attempted_deliveries += 1;
        }
        f.attempts_expected += d.counted as u64;
        f.attempts_hot += d.hot_attempts as u64;
        f.attempts_archived += d.cold_attempts as u64;
        if d.archived {
            f.deliveries_archived += 1;
        }
        match d.status {
            RowStatus::Row(DeliveryStatus::Succeeded) => f.succeeded += 1,
            RowStatus::Row(DeliveryStatus::Failed) => f.failed += 1,
            RowStatus::Row(DeliveryStatus::Exhausted) => f.exhausted += 1,
            RowStatus::Row(DeliveryStatus::Cancelled) => f.cancelled += 1,
            RowStatus::Row(DeliveryStatus::Pending) | RowStatus::Planned => {}
        }
    });
    let attempts_comparable =
        d.created_at >= ctx.hot_attempts_from && !ctx.replaying.contains(&d.id);
    let recorded = d.hot_attempts + d.cold_attempts;
    let late = recorded - d.counted;
    if attempts_comparable && late > 0 && late <= d.unknown_before {
        findings.explain(Explanation::LateAttempt, Some(tenant), late as u64);
    } else if attempts_comparable && d.counted != recorded {
        findings.gap(with_ids(
            GapClass::AttemptCountMismatch,
            format!(
                "delivery {id}{} counts {} attempt(s); the attempts recorded are {} ({} hot, {} archived)",
                if d.archived { " (archived)" } else { "" },
                d.counted,
                recorded,
                d.hot_attempts,
                d.cold_attempts
            ),
        ));
    }
    use DeliveryStatus::{Cancelled, Exhausted, Failed, Pending, Succeeded};
    match d.status {
        RowStatus::Row(Succeeded | Failed) if d.counted == 0 && recorded == 0 => {
            findings.gap(with_ids(
                GapClass::TerminalWithoutAttempt,
                format!("delivery {id} is {} but was never attempted", d.status),
            ));
        }
        RowStatus::Row(Exhausted | Cancelled) if d.counted == 0 => {
            findings.explain(Explanation::EndedWithoutAttempt, Some(tenant), 1);
        }
        RowStatus::Row(Pending) | RowStatus::Planned => pending(d, ctx, findings, with_ids),
        _ => {}
    }
}

fn pending(
    d: &DeliveryRow,
    ctx: &Context<'_>,
    findings: &mut Findings,
    with_ids: impl Fn(GapClass, String) -> crate::report::Gap,
) {
    let tenant = d.tenant.as_str();
    let due_at = d.due_at.unwrap_or(d.created_at);
    let due = due_at <= ctx.as_of;
    findings.count(tenant, |f| {
        if due {
            f.pending_due += 1
        } else {
            f.pending_scheduled += 1
        }
    });
    let planned = d.status == RowStatus::Planned;
    let problem = if !planned && !d.has_schedule {
        Some(
            "it has no scheduling row (walhook.pending), so no dispatcher will ever claim it"
                .to_string(),
        )
    } else if due_at + ctx.grace < ctx.as_of && !(d.lease_owner.is_some() && d.lease_live) {
        Some(format!(
            "it was due at {}, over {} s ago, and {}",
            crate::window::rfc3339(due_at),
            ctx.grace.as_secs(),
            match &d.lease_owner {
                Some(owner) if owner == walhook_pipeline::routing::TOPIC_HELD => {
                    "its job waits in the deliveries topic and no dispatch member sent it: check that \
                     `walhook dispatch` members run and hold every deliveries partition \
                     (walhook_member_partitions of group <prefix>deliveries/dispatch) and the topic's \
                     walhook_log_consumer_lag"
                        .to_string()
                }
                Some(owner) => format!("its holder {owner:?} is no longer alive"),
                None => "no dispatcher holds it".to_string(),
            }
        ))
    } else {
        None
    };
    let Some(problem) = problem else {
        return;
    };
    if let Some(paused) = ctx.history.paused(&EndpointId(d.endpoint_id)) {
        findings.explain(paused.explanation(), Some(tenant), 1);
        return;
    }
    findings.gap(with_ids(
        GapClass::OverduePending,
        format!(
            "pending delivery {}{}: {problem}",
            DeliveryId(d.id),
            if planned {
                " (fan-out's plan, no row yet)"
            } else {
                ""
            }
        ),
    ));
    if findings.overdue.len() < MAX_REPAIRS_PER_RUN {
        findings.overdue.push(Overdue {
            delivery_id: d.id,
            endpoint_id: d.endpoint_id,
            planned_event: planned.then_some(d.event_id),
        });
    }
}
