-- Capture: checkpoints and incidents of each source, and the catalog of
-- event types the capture rules produce.

CREATE TABLE walhook.capture_checkpoints (
    source          text PRIMARY KEY,
    slot_name       text NOT NULL,
    -- What the slot confirms: every transaction that ended at or before it
    -- has its events durable downstream.
    confirmed_lsn   pg_lsn NOT NULL,
    slot_lag_bytes  bigint,
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- What capture saw that did not become an event: truncates, schema changes,
-- rows a rule could not turn into an event. Never dropped silently: stored
-- here and shown by reconciliation.
CREATE TABLE walhook.capture_incidents (
    id          bigserial PRIMARY KEY,
    source      text NOT NULL,
    kind        text NOT NULL,
    commit_lsn  pg_lsn,
    tx_ordinal  integer,
    rule        text,
    table_name  text,
    detail      text NOT NULL,
    seen_at     timestamptz NOT NULL DEFAULT now()
);
-- Reading the slot again after a crash sees the same incident again.
CREATE UNIQUE INDEX capture_incidents_once
    ON walhook.capture_incidents (source, kind, commit_lsn, coalesce(tx_ordinal, -1), coalesce(rule, ''));

CREATE TABLE walhook.event_types (
    name            text PRIMARY KEY,
    schema_version  integer NOT NULL,
    source          text NOT NULL,
    description     text NOT NULL DEFAULT '',
    updated_at      timestamptz NOT NULL DEFAULT now()
);
