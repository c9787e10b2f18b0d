-- Deliveries cancelled through the API (POST
-- /v1/webhook-deliveries/{id}/cancel), for the dispatcher nodes: each reads
-- the rows after the last it saw, every sweep, and drops those deliveries
-- from memory (a retry it had scheduled never goes out). Rows older than a
-- day are removed by later cancellations.
CREATE TABLE walhook.delivery_cancellations (
    seq          bigserial PRIMARY KEY,
    delivery_id  uuid NOT NULL,
    cancelled_at timestamptz NOT NULL DEFAULT now()
);
