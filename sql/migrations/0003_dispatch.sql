-- Dispatch engine: manual replays, circuit breakers and endpoint health,
-- operational events.

-- A replay asked for through the API: the dispatcher makes one manual
-- attempt on the delivery (same id, same bytes, current secret) and marks
-- the request done. The automatic schedule is not touched.
CREATE TABLE walhook.replay_requests (
    id            bigserial PRIMARY KEY,
    delivery_id   uuid NOT NULL REFERENCES walhook.deliveries (id),
    requested_by  text NOT NULL,
    requested_at  timestamptz NOT NULL DEFAULT now(),
    claimed_by    text,
    claimed_until timestamptz,
    done_at       timestamptz,
    attempt_id    uuid,
    -- Why the request could not be carried out (endpoint disabled, deleted).
    error         text
);
CREATE INDEX replay_requests_open ON walhook.replay_requests (requested_at) WHERE done_at IS NULL;

-- Per endpoint: when it started failing without a success since, and its
-- circuit. Kept so that a restart does not forget a long outage.
CREATE TABLE walhook.endpoint_health (
    endpoint_id        uuid PRIMARY KEY REFERENCES walhook.endpoints (id),
    failing_since      timestamptz,
    consecutive_failures integer NOT NULL DEFAULT 0,
    circuit            text NOT NULL DEFAULT 'closed',
    opened_at          timestamptz,
    open_until         timestamptz,
    updated_at         timestamptz NOT NULL DEFAULT now()
);

-- Dispatcher nodes and their leases. A node holds the deliveries whose
-- lease_owner names it for as long as it renews its own lease here; when it
-- stops renewing (a crash), other nodes claim them. One row per node, not
-- one renewal per delivery.
CREATE TABLE walhook.dispatch_nodes (
    node_id      text PRIMARY KEY,
    lease_until  timestamptz NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now()
);
