-- The archive's catalog: one row per generation of one table's day written
-- to object storage (archive/). The manifest in the store is the record of
-- what the objects hold; this row says how far the protocol got, so that a
-- run knows what to verify or drop next and the API, the reconciler and the
-- metrics know which days are cold without listing the store.
--
-- state: 'written' (parts and manifest stored), 'verified' (every object read
-- back and matched), 'dropped' (the hot rows are gone), 'expired' (the
-- objects were deleted by [archive] retention_days).
CREATE TABLE walhook.archive_partitions (
    table_name       text NOT NULL CHECK (table_name IN ('events', 'deliveries', 'attempts')),
    day              date NOT NULL,
    generation       integer NOT NULL CHECK (generation >= 0),
    state            text NOT NULL CHECK (state IN ('written', 'verified', 'dropped', 'expired')),
    manifest_key     text NOT NULL,
    manifest_sha256  text NOT NULL,
    row_count        bigint NOT NULL,
    byte_count       bigint NOT NULL,
    file_count       integer NOT NULL,
    store            text NOT NULL,
    written_at       timestamptz NOT NULL DEFAULT now(),
    verified_at      timestamptz,
    dropped_at       timestamptz,
    expired_at       timestamptz,
    -- Verifications of this generation that found an object or the hot
    -- table not matching (walhook_archive_verification_failures).
    verify_failures  integer NOT NULL DEFAULT 0,
    PRIMARY KEY (table_name, day, generation)
);

-- A replay request outlives the delivery row it names: the archive deletes
-- a day's terminal deliveries (their history is in Parquet), and the
-- request stays as the record of who asked for the replay. An open request
-- keeps its delivery hot (the archive waits for it), so the dispatcher
-- always finds the row it replays.
ALTER TABLE walhook.replay_requests DROP CONSTRAINT replay_requests_delivery_id_fkey;
