-- The id index of archived deliveries (issue 29): which day holds a
-- delivery id, so that a lookup by id (GET a delivery, its attempts, a
-- replay) reads one day's objects instead of scanning days newest first.
--
-- Delivery ids are led by their event's commit LSN (0007), so a day's ids
-- gather in a few narrow id ranges: one per source database, broken where
-- the WAL between two deliveries passes 64 MiB. archive/src/index.rs
-- writes them when a day's generation is verified, read from the id column
-- of the parts it wrote:
--
-- archive_id_ranges: ranges of ids; the ranges of different days never
--   overlap, so the range holding an id names its day (an index on lo
--   finds the one range with the largest lo below the id).
-- archive_id_exceptions: ids of a day that lie inside another day's range
--   (deliveries of a test event or an operational event, whose ids are not
--   led by an LSN, and the edges where two days' ranges meet). Looked up
--   first.
--
-- Days archived before this migration have `indexed` false: lookups search
-- them as before (newest first, pruned by their manifests' id ranges),
-- until the next archive round indexes them.
ALTER TABLE walhook.archive_partitions ADD COLUMN indexed boolean NOT NULL DEFAULT false;

CREATE TABLE walhook.archive_id_ranges (
    table_name  text NOT NULL,
    day         date NOT NULL,
    generation  integer NOT NULL,
    lo          uuid NOT NULL,
    hi          uuid NOT NULL,
    CHECK (lo <= hi),
    FOREIGN KEY (table_name, day, generation)
        REFERENCES walhook.archive_partitions (table_name, day, generation) ON DELETE CASCADE
);
CREATE INDEX archive_id_ranges_by_lo ON walhook.archive_id_ranges (table_name, lo);
CREATE INDEX archive_id_ranges_by_day ON walhook.archive_id_ranges (table_name, day, generation);

CREATE TABLE walhook.archive_id_exceptions (
    table_name  text NOT NULL,
    id          uuid NOT NULL,
    day         date NOT NULL,
    generation  integer NOT NULL,
    PRIMARY KEY (table_name, id, day, generation),
    FOREIGN KEY (table_name, day, generation)
        REFERENCES walhook.archive_partitions (table_name, day, generation) ON DELETE CASCADE
);
CREATE INDEX archive_id_exceptions_by_day ON walhook.archive_id_exceptions (table_name, day, generation);
