-- Day partitions of the hot tables (events, deliveries, attempts) are not
-- vacuumed for their inserts alone (`autovacuum_vacuum_insert_threshold
-- = -1`, a per-table setting; the cluster's default stays).
--
-- Why. A partition takes a day of appends. Autovacuum's insert-triggered
-- pass visits it each time it grows by a fifth, and on these tables the
-- pass only sets visibility bits and hint bits: no statement of walhook
-- reads these partitions by an index-only scan, and a row is frozen only
-- once older than `vacuum_freeze_min_age` transactions, which the day's
-- rows mostly are not while the day is hot. Each pass dirties again every
-- page appended since the last one, a second write of the day's pages that
-- competes with the commits' WAL flushes. With durability on, near the
-- machine's capacity, those passes are what took the headroom
-- (docs/performance.md, "Day partitions without insert-triggered passes").
--
-- What is kept. Updates and deletes still trigger vacuums (a retried
-- delivery's row is updated), autoanalyze still keeps the statistics, and
-- freezing is still done: by the aggressive pass Postgres starts on its
-- own once a partition's age passes `autovacuum_freeze_max_age`, each page
-- frozen once, as it would have been. docs/operations.md says how to watch
-- the partitions' age and freeze a closed day by hand.
CREATE OR REPLACE FUNCTION walhook.ensure_day_partition(parent text, day date) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    name text := parent || '_' || to_char(day, 'YYYYMMDD');
BEGIN
    IF to_regclass('walhook.' || name) IS NULL THEN
        BEGIN
            EXECUTE format(
                'CREATE TABLE walhook.%I PARTITION OF walhook.%I %s FOR VALUES FROM (%L) TO (%L) WITH (%s)',
                name, parent,
                CASE WHEN parent = 'deliveries' THEN '(PRIMARY KEY (id))' ELSE '' END,
                (day::timestamp AT TIME ZONE 'UTC'), ((day + 1)::timestamp AT TIME ZONE 'UTC'),
                -- A delivery's page keeps room for its state change to stay
                -- in it (HOT, 0008).
                CASE WHEN parent = 'deliveries' THEN 'fillfactor = 80, ' ELSE '' END
                    || 'autovacuum_vacuum_insert_threshold = -1');
        EXCEPTION
            WHEN duplicate_table THEN
                NULL; -- another session made it first
            WHEN invalid_object_definition THEN
                RETURN NULL; -- "would overlap partition": the legacy partition holds the day
        END;
    END IF;
    RETURN name;
END $$;

-- The day partitions made before (the legacy partition of deliveries takes
-- no new rows and keeps its settings). A storage parameter takes SHARE
-- UPDATE EXCLUSIVE: readers and writers go on.
SET LOCAL lock_timeout = '10s';

DO $$
DECLARE
    part regclass;
BEGIN
    FOR part IN
        SELECT i.inhrelid::regclass
        FROM pg_inherits i
        JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent IN ('walhook.events'::regclass, 'walhook.deliveries'::regclass,
                              'walhook.attempts'::regclass)
          AND c.relname ~ '_[0-9]{8}$'
    LOOP
        EXECUTE format('ALTER TABLE %s SET (autovacuum_vacuum_insert_threshold = -1)', part);
    END LOOP;
END $$;
