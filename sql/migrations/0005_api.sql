-- Control plane (REST API): tenant API keys, idempotency records, and the
-- indexes behind the API's listings.

-- Tenant API keys: random, shown once, stored as SHA-256 (the keys carry
-- 256 bits of entropy, so a fast hash is enough), revocable.
CREATE TABLE walhook.api_keys (
    id          uuid PRIMARY KEY,
    tenant_id   text NOT NULL REFERENCES walhook.tenants (id),
    name        text NOT NULL DEFAULT '',
    -- The first characters of the key, so people can tell keys apart.
    prefix      text NOT NULL,
    key_sha256  bytea NOT NULL UNIQUE,
    created_at  timestamptz NOT NULL DEFAULT now(),
    created_by  text NOT NULL,
    revoked_at  timestamptz,
    revoked_by  text
);
CREATE INDEX api_keys_by_tenant ON walhook.api_keys (tenant_id, created_at);

-- `Idempotency-Key` on POSTs: the first request with a key stores its hash
-- and, once done, its response; a retry with the same key and body gets that
-- response again, a different body is refused. Rows older than a day are
-- removed by the API.
CREATE TABLE walhook.idempotency_keys (
    principal       text NOT NULL,
    key             text NOT NULL,
    request_sha256  bytea NOT NULL,
    status          integer,
    response        bytea,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (principal, key)
);
CREATE INDEX idempotency_keys_by_age ON walhook.idempotency_keys (created_at);

-- Delivery listings: newest first per tenant or per endpoint, with keyset
-- (created_at, id) cursors.
CREATE INDEX deliveries_by_tenant ON walhook.deliveries (tenant_id, created_at DESC, id DESC);
CREATE INDEX deliveries_by_endpoint ON walhook.deliveries (endpoint_id, created_at DESC, id DESC);
-- Open replay requests of a delivery (recover skips deliveries with one).
CREATE INDEX replay_requests_by_delivery ON walhook.replay_requests (delivery_id) WHERE done_at IS NULL;
-- Endpoint listings per tenant in creation order.
CREATE INDEX endpoints_by_tenant_created ON walhook.endpoints (tenant_id, created_at, id) WHERE deleted_at IS NULL;
-- The operator's audit listing filtered by action.
CREATE INDEX audit_log_by_action ON walhook.audit_log (action, id);

-- The API's own event type: `POST /v1/webhook-endpoints/{id}/test` sends it.
INSERT INTO walhook.event_types (name, schema_version, source, description)
VALUES ('webhook.test', 1, 'walhook.api', 'A test event sent on request to one endpoint.')
ON CONFLICT (name) DO NOTHING;
