-- The JSON Schema of every shape a table rule's events have had: one row
-- per (event type, version), kept forever (an old version stays readable).
-- A capture source registers a shape when a relation's columns are first
-- seen or change; the same shape (fingerprint) always gets the same
-- version, so a re-read of the slot after a crash makes the same bytes.
CREATE TABLE walhook.event_schemas (
    event_type   text NOT NULL,
    version      integer NOT NULL,
    fingerprint  text NOT NULL,
    schema       jsonb NOT NULL,
    source       text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (event_type, version),
    UNIQUE (event_type, fingerprint)
);
