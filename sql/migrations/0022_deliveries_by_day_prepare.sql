-- Deliveries partitioned by the day they were made (issue 30), step 1 of 3.
--
-- A day of deliveries then leaves Postgres by dropping its partition, as
-- events and attempts do, instead of deleting rows one by one from the
-- hottest table (dead tuples, index bloat, vacuum work at the busiest
-- moment). The table is converted in place, online: the existing table
-- becomes the partition `deliveries_legacy` holding everything made before
-- the day after tomorrow (UTC), and new days get partitions of their own.
--
-- Attaching a table as a partition needs proof that its rows lie in the
-- partition's range, and a partitioned table cannot carry a NOT VALID
-- check that its partitions share. Both are proven by checks that this
-- step adds NOT VALID (a brief lock, no scan), that step 2 validates
-- (a scan that reads and writes go on beside), so that step 3 attaches
-- without scanning.
--
-- The bound is two days on: migrations 22 to 24 run back to back, and a
-- delivery's created_at comes from the clock of the node that planned it.
SET LOCAL lock_timeout = '10s';

DO $$
BEGIN
    EXECUTE format(
        'ALTER TABLE walhook.deliveries ADD CONSTRAINT deliveries_legacy_range CHECK (created_at < %L) NOT VALID',
        (((now() AT TIME ZONE 'UTC')::date + 2)::timestamp AT TIME ZONE 'UTC'));
END $$;
