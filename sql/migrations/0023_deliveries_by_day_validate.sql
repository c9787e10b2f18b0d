-- Deliveries partitioned by day, step 2 of 3: the checks of step 1 (and
-- the id derivation check of 0007, NOT VALID until now) are proven over
-- the existing rows. VALIDATE CONSTRAINT scans under SHARE UPDATE
-- EXCLUSIVE: dispatch, fan-out and the API keep reading and writing.
--
-- Every row passed the id check when it was written (0002 checked the
-- first derivation, 0007 accepts both), so this cannot fail on a database
-- that walhook wrote.
ALTER TABLE walhook.deliveries VALIDATE CONSTRAINT deliveries_legacy_range;
ALTER TABLE walhook.deliveries VALIDATE CONSTRAINT deliveries_id_is_derived;
