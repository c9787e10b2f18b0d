-- Deliveries partitioned by day, step 3 of 3: the existing table becomes
-- the partition `deliveries_legacy` of a table partitioned by created_at,
-- attached without a scan (its range check was validated in step 2).
-- Locks are brief: the rename and the attach, no rewrite, no index build.
--
-- The key. A partitioned table's primary key must hold the partition
-- key, and a key on (id, created_at) would need a new index on the legacy
-- rows (a build under lock) and widen every entry. Instead each partition
-- carries its own primary key on id, the index the table always had, and
-- one row per (event, endpoint) across days rests on created_at being the
-- same wherever a delivery's row is written: it is the time fan-out
-- planned the delivery (the plan row's created_at, walhook.fanouts), which
-- both writers of first rows use (the node that planned it and a node
-- that took the plan over), and a plan is written only while none of its
-- deliveries has a row (the redo probes every partition by id).
--
-- A fresh install (no delivery yet) keeps no legacy partition: every day
-- gets its own from the start.
SET LOCAL lock_timeout = '10s';

DO $$
DECLARE
    bound timestamptz;
BEGIN
    SELECT substring(pg_get_constraintdef(oid) FROM '''([^'']+)''')::timestamptz INTO bound
    FROM pg_constraint
    WHERE conrelid = 'walhook.deliveries'::regclass AND conname = 'deliveries_legacy_range';

    ALTER TABLE walhook.deliveries RENAME TO deliveries_legacy;
    ALTER TABLE walhook.deliveries_legacy RENAME CONSTRAINT deliveries_pkey TO deliveries_legacy_pkey;
    ALTER INDEX walhook.deliveries_by_tenant RENAME TO deliveries_legacy_by_tenant;
    ALTER INDEX walhook.deliveries_by_endpoint RENAME TO deliveries_legacy_by_endpoint;

    CREATE TABLE walhook.deliveries (
        id                       uuid NOT NULL,
        event_id                 uuid NOT NULL,
        endpoint_id              uuid NOT NULL,
        tenant_id                text NOT NULL,
        event_type               text NOT NULL,
        event_occurred_at        timestamptz NOT NULL,
        endpoint_config_version  integer NOT NULL,
        status                   walhook.delivery_status NOT NULL DEFAULT 'pending',
        attempt_count            integer NOT NULL DEFAULT 0,
        manual_attempt_count     integer NOT NULL DEFAULT 0,
        next_attempt_at          timestamptz NOT NULL,
        expires_at               timestamptz NOT NULL,
        lease_version            bigint NOT NULL DEFAULT 0,
        lease_owner              text,
        lease_expires_at         timestamptz,
        last_http_status         integer,
        last_error_class         text,
        created_at               timestamptz NOT NULL DEFAULT now(),
        updated_at               timestamptz NOT NULL DEFAULT now(),
        CONSTRAINT deliveries_id_is_derived CHECK (
            uuid_send(id) = substring(uuid_send(event_id) FROM 1 FOR 8) || substring(sha256(
                '\x0000000000000013'::bytea || convert_to('walhook.delivery.v2', 'UTF8')
                || '\x0000000000000010'::bytea || uuid_send(event_id)
                || '\x0000000000000010'::bytea || uuid_send(endpoint_id)) FROM 1 FOR 8)
            OR uuid_send(id) = substring(sha256(
                '\x0000000000000013'::bytea || convert_to('walhook.delivery.v1', 'UTF8')
                || '\x0000000000000010'::bytea || uuid_send(event_id)
                || '\x0000000000000010'::bytea || uuid_send(endpoint_id)) FROM 1 FOR 16))
    ) PARTITION BY RANGE (created_at);

    IF EXISTS (SELECT 1 FROM walhook.deliveries_legacy) THEN
        EXECUTE format(
            'ALTER TABLE walhook.deliveries ATTACH PARTITION walhook.deliveries_legacy FOR VALUES FROM (MINVALUE) TO (%L)',
            bound);
    ELSE
        DROP TABLE walhook.deliveries_legacy;
    END IF;
END $$;

-- The API's listings (0005); on the legacy partition the indexes it had
-- are attached, not built again.
CREATE INDEX deliveries_by_tenant ON walhook.deliveries (tenant_id, created_at DESC, id DESC);
CREATE INDEX deliveries_by_endpoint ON walhook.deliveries (endpoint_id, created_at DESC, id DESC);

-- Creates the daily partition of `parent` holding `day`, if missing;
-- returns its name, or NULL when another partition covers the day (the
-- legacy partition of deliveries: rows of the day go there).
--
-- A day partition of deliveries has its primary key on id (see above) and
-- room in each page for the state change to stay in it (HOT, 0008).
CREATE OR REPLACE FUNCTION walhook.ensure_day_partition(parent text, day date) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    name text := parent || '_' || to_char(day, 'YYYYMMDD');
BEGIN
    IF to_regclass('walhook.' || name) IS NULL THEN
        BEGIN
            EXECUTE format(
                'CREATE TABLE walhook.%I PARTITION OF walhook.%I %s FOR VALUES FROM (%L) TO (%L) %s',
                name, parent,
                CASE WHEN parent = 'deliveries' THEN '(PRIMARY KEY (id))' ELSE '' END,
                (day::timestamp AT TIME ZONE 'UTC'), ((day + 1)::timestamp AT TIME ZONE 'UTC'),
                CASE WHEN parent = 'deliveries' THEN 'WITH (fillfactor = 80)' ELSE '' END);
        EXCEPTION
            WHEN duplicate_table THEN
                NULL; -- another session made it first
            WHEN invalid_object_definition THEN
                RETURN NULL; -- "would overlap partition": the legacy partition holds the day
        END;
    END IF;
    RETURN name;
END $$;
