-- What a stage set aside instead of failing (one bad record, a quarantined
-- endpoint, events of an unknown tenant), the truth about attempts whose
-- outcome is unknown, and clean stops of dispatcher nodes.

-- One open row per (stage, kind, subject); a repeat adds to `occurrences`.
-- Resolved incidents (a quarantined endpoint that loads again) keep their
-- row with `resolved_at` set.
CREATE TABLE walhook.incidents (
    id           bigserial PRIMARY KEY,
    stage        text NOT NULL,
    kind         text NOT NULL,
    -- What it is about: an event, delivery, endpoint or tenant id.
    subject      text NOT NULL,
    detail       text NOT NULL,
    occurrences  bigint NOT NULL DEFAULT 1,
    first_seen   timestamptz NOT NULL DEFAULT now(),
    last_seen    timestamptz NOT NULL DEFAULT now(),
    resolved_at  timestamptz
);
CREATE UNIQUE INDEX incidents_open ON walhook.incidents (stage, kind, subject)
    WHERE resolved_at IS NULL;
CREATE INDEX incidents_by_time ON walhook.incidents (last_seen);

-- Why an attempt is special, when it is: `previous_outcome_unknown` when
-- the attempt before it may have reached the receiver but its outcome was
-- never recorded (the dispatcher holding the delivery stopped without a
-- clean drain), so a receiver's duplicate is explainable from the history.
ALTER TABLE walhook.attempts ADD COLUMN note text;

-- Set by a dispatcher node that stopped cleanly (every attempt it started
-- is recorded); cleared when it starts again. A node whose lease lapsed
-- without it stopped uncleanly.
ALTER TABLE walhook.dispatch_nodes ADD COLUMN stopped_at timestamptz;

-- Two schema changes (or truncates) of different tables in one transaction
-- share kind, LSN and (no) ordinal and rule: the table tells them apart, so
-- that the second is not taken for a repeat of the first.
DROP INDEX walhook.capture_incidents_once;
CREATE UNIQUE INDEX capture_incidents_once ON walhook.capture_incidents
    (source, kind, commit_lsn, coalesce(tx_ordinal, -1), coalesce(rule, ''), coalesce(table_name, ''));
