-- Tenants, endpoints and their secrets, events, deliveries and attempts.

CREATE TABLE walhook.tenants (
    id          text PRIMARY KEY,
    name        text NOT NULL,
    -- Share of dispatch capacity relative to other tenants.
    weight      integer NOT NULL DEFAULT 1 CHECK (weight BETWEEN 1 AND 1000),
    created_at  timestamptz NOT NULL DEFAULT now(),
    disabled_at timestamptz
);

CREATE TABLE walhook.endpoints (
    id                  uuid PRIMARY KEY,
    tenant_id           text NOT NULL REFERENCES walhook.tenants (id),
    url                 text NOT NULL,
    description         text NOT NULL DEFAULT '',
    -- Subscribed event types; empty means every type.
    event_types         text[] NOT NULL DEFAULT '{}',
    enabled             boolean NOT NULL DEFAULT true,
    disabled_reason     text,
    rate_limit_per_sec  integer CHECK (rate_limit_per_sec > 0),
    max_in_flight       integer CHECK (max_in_flight > 0),
    config_version      integer NOT NULL DEFAULT 1,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    deleted_at          timestamptz
);
CREATE INDEX endpoints_by_tenant ON walhook.endpoints (tenant_id) WHERE deleted_at IS NULL;

-- Every configuration an endpoint ever had; deliveries name the version
-- they were made with.
CREATE TABLE walhook.endpoint_versions (
    endpoint_id         uuid NOT NULL REFERENCES walhook.endpoints (id),
    version             integer NOT NULL,
    url                 text NOT NULL,
    description         text NOT NULL,
    event_types         text[] NOT NULL,
    enabled             boolean NOT NULL,
    rate_limit_per_sec  integer,
    max_in_flight       integer,
    changed_at          timestamptz NOT NULL DEFAULT now(),
    changed_by          text NOT NULL,
    PRIMARY KEY (endpoint_id, version)
);

CREATE TABLE walhook.endpoint_secrets (
    endpoint_id  uuid NOT NULL REFERENCES walhook.endpoints (id),
    version      integer NOT NULL,
    -- The secret as stored (see the secrets module for the format).
    secret       bytea NOT NULL,
    key_id       text NOT NULL DEFAULT 'plain',
    created_at   timestamptz NOT NULL DEFAULT now(),
    -- Set when a newer secret replaces this one: it keeps signing until then.
    expires_at   timestamptz,
    PRIMARY KEY (endpoint_id, version)
);

-- Bumped by every endpoint or secret change, so caches can notice cheaply.
CREATE TABLE walhook.config_epoch (
    id     boolean PRIMARY KEY DEFAULT true CHECK (id),
    epoch  bigint NOT NULL
);
INSERT INTO walhook.config_epoch VALUES (true, 1);

CREATE FUNCTION walhook.bump_config_epoch() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE walhook.config_epoch SET epoch = epoch + 1;
    RETURN NULL;
END $$;

CREATE TRIGGER endpoints_epoch AFTER INSERT OR UPDATE OR DELETE ON walhook.endpoints
    FOR EACH STATEMENT EXECUTE FUNCTION walhook.bump_config_epoch();
CREATE TRIGGER secrets_epoch AFTER INSERT OR UPDATE OR DELETE ON walhook.endpoint_secrets
    FOR EACH STATEMENT EXECUTE FUNCTION walhook.bump_config_epoch();
CREATE TRIGGER tenants_epoch AFTER INSERT OR UPDATE OR DELETE ON walhook.tenants
    FOR EACH STATEMENT EXECUTE FUNCTION walhook.bump_config_epoch();

-- Events: immutable bodies, partitioned by the day they occurred (UTC).
CREATE TABLE walhook.events (
    id              uuid NOT NULL,
    tenant_id       text NOT NULL,
    event_type      text NOT NULL,
    schema_version  integer NOT NULL,
    object_id       text,
    object_version  text,
    occurred_at     timestamptz NOT NULL,
    source          text NOT NULL,
    commit_lsn      pg_lsn NOT NULL,
    tx_ordinal      integer NOT NULL,
    payload         bytea NOT NULL,
    payload_sha256  bytea NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (id, occurred_at)
) PARTITION BY RANGE (occurred_at);

CREATE TYPE walhook.delivery_status AS ENUM ('pending', 'succeeded', 'failed', 'exhausted', 'cancelled');

-- One row per (event, endpoint). The id is derived from both, so fan-out
-- run twice fills gaps and never makes a second delivery. The check below
-- is that derivation (DeliveryId::derive: the first 16 bytes of SHA-256
-- over length-prefixed parts), so the primary key alone enforces one row
-- per pair: a UNIQUE (event_id, endpoint_id) index would cost a sixth index
-- entry on every insert and every non-HOT update, the hottest writes of
-- the platform (docs/performance.md).
CREATE TABLE walhook.deliveries (
    id                       uuid PRIMARY KEY,
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
    CONSTRAINT deliveries_id_is_derived CHECK (id = encode(substring(sha256(
        '\x0000000000000013'::bytea || convert_to('walhook.delivery.v1', 'UTF8')
        || '\x0000000000000010'::bytea || uuid_send(event_id)
        || '\x0000000000000010'::bytea || uuid_send(endpoint_id)) FROM 1 FOR 16), 'hex')::uuid)
);
-- Pending deliveries nobody holds (released retries, orphans once claimed,
-- operational and test events), by due time: what sweepers claim.
CREATE INDEX deliveries_due ON walhook.deliveries (next_attempt_at)
    WHERE status = 'pending' AND lease_owner IS NULL;
-- Pending deliveries a dispatcher node holds: reclaimed after a restart, or
-- by others when the node's lease lapses.
CREATE INDEX deliveries_held ON walhook.deliveries (lease_owner)
    WHERE status = 'pending' AND lease_owner IS NOT NULL;

CREATE TYPE walhook.attempt_trigger AS ENUM ('auto', 'manual');

-- Every HTTP try, partitioned by the day it started (UTC).
CREATE TABLE walhook.attempts (
    id                       uuid NOT NULL,
    delivery_id              uuid NOT NULL,
    endpoint_id              uuid NOT NULL,
    tenant_id                text NOT NULL,
    number                   integer NOT NULL,
    trigger                  walhook.attempt_trigger NOT NULL,
    endpoint_config_version  integer NOT NULL,
    started_at               timestamptz NOT NULL,
    finished_at              timestamptz NOT NULL,
    http_status              integer,
    latency_ms               integer NOT NULL,
    outcome                  text NOT NULL,
    error_class              text,
    response_sha256          bytea,
    response_excerpt         text,
    -- Led by the delivery: attempts are read by delivery only, and one
    -- index instead of a key plus a by-delivery index halves the index
    -- work of the attempt insert, a hot write (docs/performance.md).
    PRIMARY KEY (delivery_id, id, started_at)
) PARTITION BY RANGE (started_at);

-- Creates the daily partition of `parent` holding `day`, if missing.
CREATE FUNCTION walhook.ensure_day_partition(parent text, day date) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    name text := parent || '_' || to_char(day, 'YYYYMMDD');
BEGIN
    IF to_regclass('walhook.' || name) IS NULL THEN
        BEGIN
            EXECUTE format(
                'CREATE TABLE walhook.%I PARTITION OF walhook.%I FOR VALUES FROM (%L) TO (%L)',
                name, parent,
                (day::timestamp AT TIME ZONE 'UTC'), ((day + 1)::timestamp AT TIME ZONE 'UTC'));
        EXCEPTION WHEN duplicate_table THEN
            NULL; -- another session made it first
        END;
    END IF;
    RETURN name;
END $$;

CREATE TABLE walhook.audit_log (
    id         bigserial PRIMARY KEY,
    tenant_id  text,
    actor      text NOT NULL,
    action     text NOT NULL,
    target     text,
    detail     jsonb NOT NULL DEFAULT '{}',
    at         timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX audit_log_by_tenant ON walhook.audit_log (tenant_id, id);
