-- The scheduling state of every delivery that is not terminal yet, in a
-- table of its own. A delivery's row then carries no index on a column its
-- state change writes (status, lease, next attempt), so finishing a
-- delivery is a HOT update (no new index entries, pruned in the page) plus a
-- delete here, where the previous design re-inserted the row into three
-- indexes and removed it from a fourth (docs/performance.md).
--
-- The invariant, kept by every statement that changes a delivery's status:
-- a delivery has a row here exactly while its status is 'pending'.
CREATE TABLE walhook.pending (
    delivery_id      uuid PRIMARY KEY,
    endpoint_id      uuid NOT NULL,
    created_at       timestamptz NOT NULL,
    next_attempt_at  timestamptz NOT NULL,
    -- The dispatcher node holding it in memory; NULL: due for any node to
    -- claim at next_attempt_at.
    lease_owner      text
) WITH (
    fillfactor = 90,
    -- Rows live for milliseconds: clean up often and without throttling.
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 10000,
    autovacuum_vacuum_cost_delay = 0
);
-- What a node held (reclaimed after a restart, or by others when its lease
-- lapses), and what is due for anyone.
CREATE INDEX pending_held ON walhook.pending (lease_owner) WHERE lease_owner IS NOT NULL;
CREATE INDEX pending_due ON walhook.pending (next_attempt_at) WHERE lease_owner IS NULL;

INSERT INTO walhook.pending (delivery_id, endpoint_id, created_at, next_attempt_at, lease_owner)
SELECT id, endpoint_id, created_at, next_attempt_at, lease_owner
FROM walhook.deliveries WHERE status = 'pending';

DROP INDEX walhook.deliveries_due;
DROP INDEX walhook.deliveries_held;

-- Room in each page for the state change to stay in it (HOT).
ALTER TABLE walhook.deliveries SET (fillfactor = 80);
