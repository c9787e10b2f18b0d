//! Fan-out's writes: events and their deliveries in one transaction.

use std::time::SystemTime;

use tokio_postgres::types::PgLsn;
use uuid::Uuid;
use walhook_pipeline::delivery::NewDelivery;
use walhook_pipeline::event::Event;
use walhook_pipeline::ids::DeliveryId;
use walhook_pipeline::store::FanoutStore;

use crate::{Platform, StoreError};

impl Platform {
    /// Creates the daily partitions of `table` that `times` fall in, once
    /// per process and day for recent days. A day older than yesterday may
    /// have been archived and its partition dropped by another process
    /// (`walhook archive`), so a late row for it (an outbox row with an old
    /// `occurred_at`) checks the partition every time: rare, and it finds
    /// a partition instead of failing.
    pub(crate) async fn ensure_partitions(
        &self,
        client: &impl deadpool_postgres::GenericClient,
        table: &'static str,
        times: impl Iterator<Item = walhook_pipeline::time::Timestamp>,
    ) -> Result<(), StoreError> {
        let mut missing: Vec<(i64, SystemTime)> = Vec::new();
        let yesterday = walhook_pipeline::time::Timestamp::now()
            .unix_seconds()
            .div_euclid(86_400)
            - 1;
        {
            let known = self.partitions.lock();
            for t in times {
                let day = t.unix_seconds().div_euclid(86_400);
                if !known.contains(&(table, day)) && !missing.iter().any(|(d, _)| *d == day) {
                    missing.push((day, t.to_system_time()));
                }
            }
        }
        for (day, at) in missing {
            // NULL: another partition covers the day (the legacy partition
            // of deliveries, migration 0024), which the archive drops once
            // it is empty: not remembered, so the day gets a partition of
            // its own then.
            let own: Option<String> = client
                .query_one("SELECT walhook.ensure_day_partition($1, ($2::timestamptz AT TIME ZONE 'UTC')::date)", &[&table, &at])
                .await
                .map_err(StoreError::query("create a daily partition"))?
                .get(0);
            if own.is_some() && day >= yesterday {
                self.partitions.lock().insert((table, day));
            }
        }
        Ok(())
    }
}

impl Platform {
    /// Adds the types of `events` that the catalog does not list yet, once
    /// per process and type. Outbox rows and logical messages name their
    /// own types, which no rule declared; the catalog still shows them, so
    /// that tenants can find and subscribe to them.
    async fn catalogue_types(
        &self,
        client: &impl deadpool_postgres::GenericClient,
        events: &[Event],
    ) -> Result<(), StoreError> {
        let mut names: Vec<&str> = Vec::new();
        let mut versions: Vec<i32> = Vec::new();
        let mut sources: Vec<&str> = Vec::new();
        {
            let known = self.catalogued.lock();
            for e in events {
                let name = e.event_type.as_str();
                if !known.contains(name) && !names.contains(&name) {
                    names.push(name);
                    versions.push(e.schema_version as i32);
                    sources.push(&e.source);
                }
            }
        }
        if names.is_empty() {
            return Ok(());
        }
        client
            .execute(
                "INSERT INTO walhook.event_types (name, schema_version, source, description) \
                 SELECT n, v, s, 'first seen in a captured event' \
                 FROM unnest($1::text[], $2::int4[], $3::text[]) AS t(n, v, s) \
                 ON CONFLICT (name) DO NOTHING",
                &[&names, &versions, &sources],
            )
            .await
            .map_err(StoreError::query("add event types to the catalog"))?;
        self.catalogued
            .lock()
            .extend(names.iter().map(|n| (*n).to_owned()));
        Ok(())
    }
}

/// The planned deliveries passed as `$first`..`$first + 9`, as rows.
fn plan_rows(first: usize) -> String {
    crate::unnested(
        first,
        &[
            &crate::PLANNED_DELIVERY[..],
            &[
                ("created", "timestamptz"),
                ("expires", "timestamptz"),
                ("owner", "text"),
            ],
        ]
        .concat(),
    )
}

/// The plan rows of the deliveries passed as `$first`.. (one row per
/// event), returning the event ids and their delivery ids. `redo` leaves
/// out deliveries that have their row already (a primary-key probe each)
/// and plans that exist.
fn plans_sql(first: usize, redo: bool) -> String {
    format!(
        "INSERT INTO walhook.fanouts (event_id, event_occurred_at, tenant_id, event_type, delivery_ids, \
                                      endpoint_ids, config_versions, created_at, expires_at, lease_owner) \
         SELECT ev, occ, tenant, etype, array_agg(id ORDER BY id), array_agg(ep ORDER BY id), \
                array_agg(ver ORDER BY id), created, expires, owner \
         FROM {} AS t \
         {} \
         GROUP BY ev, occ, tenant, etype, created, expires, owner \
         {} \
         RETURNING event_id, delivery_ids",
        plan_rows(first),
        if redo {
            "WHERE (SELECT true FROM walhook.deliveries d WHERE d.id = t.id) IS NULL"
        } else {
            ""
        },
        if redo { "ON CONFLICT DO NOTHING" } else { "" }
    )
}

/// The events passed as `$1`..`$12`, inserted (`redo` leaves those
/// already stored as they are).
fn events_sql(redo: bool) -> String {
    format!(
        "INSERT INTO walhook.events (id, tenant_id, event_type, schema_version, object_id, object_version, \
                                     occurred_at, source, commit_lsn, tx_ordinal, payload, payload_sha256) \
         SELECT * FROM {} AS e {}",
        crate::unnested(
            1,
            &[
                ("id", "uuid"),
                ("tenant", "text"),
                ("etype", "text"),
                ("version", "int4"),
                ("object", "text"),
                ("object_version", "text"),
                ("occurred", "timestamptz"),
                ("source", "text"),
                ("lsn", "pg_lsn"),
                ("ordinal", "int4"),
                ("payload", "bytea"),
                ("sha", "bytea")
            ]
        ),
        if redo { "ON CONFLICT DO NOTHING" } else { "" }
    )
}

/// Events and their plans in one statement (one round trip, atomic
/// without an explicit transaction), with plain inserts: the first fan-out
/// of an event conflicts with nothing, and an `ON CONFLICT` clause costs
/// every row a second index search. A redo after a crash meets rows that
/// exist (unique violation) and takes [`MATERIALIZE_EVENTS`] and the
/// gap-filling plans instead.
static MATERIALIZE_FAST: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "WITH stored_events AS ({}), stored_plans AS ({}) SELECT unnest(delivery_ids) FROM stored_plans",
        events_sql(false),
        plans_sql(13, false)
    )
});

/// The redo's events: those already stored are left as they are.
static MATERIALIZE_EVENTS: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| events_sql(true));

/// The redo's plans: only missing ones are stored, of deliveries that
/// have no row yet (a plan stored, finished and removed before the crash
/// has rows for all its deliveries and comes back as nothing); returns
/// those deliveries. It also returns the deliveries without a row of plans
/// that this very batch stored before, untouched since: same owner, same
/// creation time (the batch's `now`, repeated exactly by a retry) and the
/// first lease. That is a first try that committed but whose answer was
/// lost with its connection: nobody else was handed those deliveries, and
/// their holder, alive, claims its own plans only when it starts. Plans
/// held by the deliveries topic (`routing::TOPIC_HELD`) give every
/// delivery without a row, whenever they were made: their jobs may not
/// have reached the topic before the crash, and the topic's dispatcher
/// leaves out those it already has. A plan of
/// an earlier run (another creation time), one claimed since (a later
/// lease) or one nobody holds is left to the claims that handle it. The
/// outer select reads the statement's snapshot, which does not show the
/// plans inserted by `stored_plans`: none comes back twice. Each plan is a
/// primary-key probe (`LATERAL … LIMIT 1`), never a join over the whole
/// queue (see `dispatch::first_rows::fresh_sql`).
static MATERIALIZE_PLANS: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "WITH stored_plans AS ({}) SELECT unnest(delivery_ids) FROM stored_plans \
         UNION ALL \
         SELECT t.id FROM {} AS t \
         CROSS JOIN LATERAL (SELECT p.delivery_ids FROM walhook.fanouts p \
                             WHERE p.event_id = t.ev AND p.lease_owner = t.owner AND p.lease_version = 1 \
                               AND (p.created_at = t.created OR t.owner = '{held}') LIMIT 1) p \
         WHERE t.id = ANY (p.delivery_ids) \
           AND (SELECT true FROM walhook.deliveries d WHERE d.id = t.id) IS NULL",
        plans_sql(1, true),
        plan_rows(1),
        held = walhook_pipeline::routing::TOPIC_HELD,
    )
});

/// Whether `e` is a unique violation (a row that exists already).
pub(crate) fn is_unique_violation(e: &tokio_postgres::Error) -> bool {
    e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION)
}

impl FanoutStore for Platform {
    async fn materialize(
        &self,
        events: &[Event],
        deliveries: &[NewDelivery],
    ) -> Result<Vec<DeliveryId>, walhook_pipeline::store::StoreError> {
        let mut client = self.client().await?;
        self.ensure_partitions(&client, "events", events.iter().map(|e| e.occurred_at))
            .await?;
        self.catalogue_types(&client, events).await?;

        let ids: Vec<Uuid> = events.iter().map(|e| Uuid::from_bytes(e.id.0)).collect();
        let tenants: Vec<&str> = events.iter().map(|e| e.tenant_id.as_str()).collect();
        let types: Vec<&str> = events.iter().map(|e| e.event_type.as_str()).collect();
        let versions: Vec<i32> = events.iter().map(|e| e.schema_version as i32).collect();
        let object_ids: Vec<Option<&str>> = events.iter().map(|e| e.object_id.as_deref()).collect();
        let object_versions: Vec<Option<&str>> =
            events.iter().map(|e| e.object_version.as_deref()).collect();
        let occurred: Vec<SystemTime> = events
            .iter()
            .map(|e| e.occurred_at.to_system_time())
            .collect();
        let sources: Vec<&str> = events.iter().map(|e| &*e.source).collect();
        let lsns: Vec<PgLsn> = events
            .iter()
            .map(|e| PgLsn::from(e.key.commit_lsn.0))
            .collect();
        let ordinals: Vec<i32> = events.iter().map(|e| e.key.tx_ordinal as i32).collect();
        let bodies: Vec<&[u8]> = events.iter().map(|e| e.payload.as_ref()).collect();
        let hashes: Vec<&[u8]> = events.iter().map(|e| e.payload_hash.as_slice()).collect();

        let d = deliveries;
        let d_ids: Vec<Uuid> = d.iter().map(|x| Uuid::from_bytes(x.id.0)).collect();
        let d_events: Vec<Uuid> = d.iter().map(|x| Uuid::from_bytes(x.event_id.0)).collect();
        let d_endpoints: Vec<Uuid> = d
            .iter()
            .map(|x| Uuid::from_bytes(x.endpoint_id.0))
            .collect();
        let d_tenants: Vec<&str> = d.iter().map(|x| x.tenant_id.as_str()).collect();
        let d_types: Vec<&str> = d.iter().map(|x| x.event_type.as_str()).collect();
        let d_occurred: Vec<SystemTime> = d
            .iter()
            .map(|x| x.event_occurred_at.to_system_time())
            .collect();
        let d_versions: Vec<i32> = d.iter().map(|x| x.endpoint_config_version).collect();
        let d_created: Vec<SystemTime> = d.iter().map(|x| x.created_at.to_system_time()).collect();
        let d_expires: Vec<SystemTime> = d.iter().map(|x| x.expires_at.to_system_time()).collect();
        let d_owners: Vec<Option<&str>> = d.iter().map(|x| x.lease_owner.as_deref()).collect();

        let event_params: [&(dyn tokio_postgres::types::ToSql + Sync); 12] = [
            &ids,
            &tenants,
            &types,
            &versions,
            &object_ids,
            &object_versions,
            &occurred,
            &sources,
            &lsns,
            &ordinals,
            &bodies,
            &hashes,
        ];
        let plan_params: [&(dyn tokio_postgres::types::ToSql + Sync); 10] = [
            &d_ids,
            &d_events,
            &d_endpoints,
            &d_tenants,
            &d_types,
            &d_occurred,
            &d_versions,
            &d_created,
            &d_expires,
            &d_owners,
        ];
        let made_of = |rows: Vec<tokio_postgres::Row>| -> Vec<DeliveryId> {
            rows.iter()
                .map(|r| DeliveryId(*r.get::<_, Uuid>(0).as_bytes()))
                .collect()
        };
        let fast = client
            .prepare_cached(&MATERIALIZE_FAST)
            .await
            .map_err(StoreError::query("prepare the fan-out write"))?;
        let all: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = event_params
            .iter()
            .chain(plan_params.iter())
            .copied()
            .collect();
        match client.query(&fast, &all).await {
            Ok(rows) => {
                crate::answer_lost("fanout.answer_lost")?;
                return Ok(made_of(rows));
            }
            Err(e) if is_unique_violation(&e) => {
                tracing::debug!("fan-out redoes events it stored before; filling gaps only");
            }
            Err(e) => return Err(StoreError::query("store events and plans")(e).into()),
        }

        // A redo (after a crash before the offset moved): fill gaps.
        let tx = client
            .transaction()
            .await
            .map_err(StoreError::query("begin fan-out"))?;
        let stmt = tx
            .prepare_cached(&MATERIALIZE_EVENTS)
            .await
            .map_err(StoreError::query("prepare the event insert"))?;
        tx.execute(&stmt, &event_params)
            .await
            .map_err(StoreError::query("insert events"))?;
        let mut made = Vec::new();
        if !deliveries.is_empty() {
            let stmt = tx
                .prepare_cached(&MATERIALIZE_PLANS)
                .await
                .map_err(StoreError::query("prepare the plan insert"))?;
            made = made_of(
                tx.query(&stmt, &plan_params)
                    .await
                    .map_err(StoreError::query("insert plans"))?,
            );
        }
        if !made.is_empty() {
            // Another reader of these events (a member that lost their
            // partition while frozen, and the one that took it over) may
            // have had its plan written out and removed while this insert
            // waited on that very row: the insert then went ahead, on a
            // snapshot older than those delivery rows. This statement's
            // snapshot is newer than that commit: deliveries that have a
            // row are not made here (their plan, complete, is tidied away).
            let ids: Vec<Uuid> = made.iter().map(|d| Uuid::from_bytes(d.0)).collect();
            made = made_of(
                tx.query(
                    "SELECT i FROM unnest($1::uuid[]) AS i \
                     WHERE (SELECT true FROM walhook.deliveries d WHERE d.id = i) IS NULL",
                    &[&ids],
                )
                .await
                .map_err(StoreError::query(
                    "check the plans against deliveries written meanwhile",
                ))?,
            );
        }
        crate::commit!(tx, client).map_err(StoreError::query("commit fan-out"))?;
        Ok(made)
    }
}
