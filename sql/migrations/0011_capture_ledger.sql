-- The capture ledger (issue 12): what capture counted, per source, rule and
-- minute of commit time, so that reconciliation can compare it with the
-- events stored for that minute (an event's occurred_at is its
-- transaction's commit time).
--
-- Per row: changes = events + filtered + incidents. `changes` counts the
-- row changes of the rule's table (transactional messages with its prefix,
-- for a message rule); `filtered` those its operations or conditions left
-- out; `incidents` those it could not turn into an event (an event over
-- max_event_bytes included). first/last_commit_lsn bound the commit LSNs of
-- the transactions counted in the row.
--
-- Capture adds to a row only after the events it counts are durable, and
-- confirms the slot past a transaction only after its counts committed.
CREATE TABLE walhook.capture_ledger (
    source            text NOT NULL,
    rule              text NOT NULL,
    window_start      timestamptz NOT NULL,
    changes           bigint NOT NULL,
    events            bigint NOT NULL,
    filtered          bigint NOT NULL,
    incidents         bigint NOT NULL,
    first_commit_lsn  pg_lsn NOT NULL,
    last_commit_lsn   pg_lsn NOT NULL,
    updated_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (source, rule, window_start)
);

-- Exactly once: a large transaction is counted in parts (the chunks capture
-- hands off while reading it), each named by (commit_lsn, part), a key the
-- slot gives again when it sends the transaction again. The mark is the key
-- of the last part counted; the transaction that adds parts locks it, counts
-- only parts above it and moves it, so a part read again after a crash is
-- never counted twice.
--
-- started_at: when this source's ledger began. Transactions committed
-- before it may have been confirmed by a walhook without a ledger, so the
-- reconciler compares only minutes from it on.
CREATE TABLE walhook.capture_ledger_marks (
    source      text PRIMARY KEY,
    commit_lsn  pg_lsn NOT NULL,
    part        integer NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
