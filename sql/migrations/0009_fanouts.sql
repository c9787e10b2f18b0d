-- Fan-out's plan of each event whose deliveries are not all written yet:
-- which endpoints get it, with which config version, under which ids.
-- Fan-out stores one row per event here instead of one delivery row per
-- endpoint; the delivery's own row is written once, when there is
-- something to say about it (usually with its first attempt's outcome).
-- A delivery that succeeds at once then costs one row insert instead of an
-- insert and an update (docs/performance.md). The plan is deleted once each
-- of its deliveries has its row.
--
-- A delivery of a plan with no row yet is pending, has had no attempt, and
-- is held by the plan's lease (`lease_owner`, `lease_version`): a node that
-- restarts takes its plans back, others take those of a node whose lease
-- lapsed, and a row is written only under the plan's current lease.
CREATE TABLE walhook.fanouts (
    event_id           uuid PRIMARY KEY,
    event_occurred_at  timestamptz NOT NULL,
    tenant_id          text NOT NULL,
    event_type         text NOT NULL,
    delivery_ids       uuid[] NOT NULL,
    endpoint_ids       uuid[] NOT NULL,
    config_versions    int4[] NOT NULL,
    created_at         timestamptz NOT NULL,
    expires_at         timestamptz NOT NULL,
    lease_owner        text,
    lease_version      bigint NOT NULL DEFAULT 1
) WITH (
    -- Rows live for milliseconds: clean up often and without throttling.
    -- Dispatch also vacuums it every few seconds; the emptied pages at the
    -- end stay (cutting them off takes a lock that stalls every writer).
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 10000,
    autovacuum_vacuum_cost_delay = 0,
    vacuum_truncate = false
);
ALTER TABLE walhook.pending SET (vacuum_truncate = false);
CREATE INDEX fanouts_held ON walhook.fanouts (lease_owner) WHERE lease_owner IS NOT NULL;
CREATE INDEX fanouts_unheld ON walhook.fanouts (created_at) WHERE lease_owner IS NULL;
-- The API lists a tenant's deliveries, these included.
CREATE INDEX fanouts_by_tenant ON walhook.fanouts (tenant_id);
