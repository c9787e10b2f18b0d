//! Days of delivery history written straight into the platform database's
//! hot tables, as the pipeline would have left them: events with ids led
//! by their commit LSN, one delivery per endpoint of the event's tenant
//! (ids derived as the database checks them), one or two attempts each.
//! Benchmarks and tests archive them and read them back.
//!
//! All of it is SQL run by the caller on a migrated database; nothing here
//! talks to a server.

use std::fmt::Write as _;

/// What to write.
#[derive(Debug, Clone)]
pub struct History {
    /// The first day, `YYYY-MM-DD` (UTC).
    pub first_day: String,
    /// Days, one after the other.
    pub days: u32,
    /// Events per day.
    pub events_per_day: u64,
    /// Tenants (`tenant-0` …).
    pub tenants: u32,
    /// Endpoints per tenant: each event has a delivery per endpoint.
    pub endpoints_per_tenant: u32,
    /// The first commit LSN; each event's is 4,096 past the one before.
    pub first_lsn: u64,
}

impl History {
    /// The id of endpoint `j` (from 1) of tenant `i`.
    pub fn endpoint_sql(tenant: &str, j: &str) -> String {
        format!("md5('endpoint' || {tenant} || '/' || {j})::uuid")
    }

    /// Tenants and their endpoints (with a first config version).
    pub fn setup_sql(&self) -> String {
        let (t, e) = (self.tenants.max(1), self.endpoints_per_tenant.max(1));
        format!(
            "SET TIME ZONE 'UTC';
             INSERT INTO walhook.tenants (id, name) SELECT 'tenant-' || i, 'tenant ' || i
               FROM generate_series(0, {t} - 1) i ON CONFLICT DO NOTHING;
             INSERT INTO walhook.endpoints (id, tenant_id, url, created_at)
             SELECT {ep}, 'tenant-' || i, 'https://example.com/' || i || '/' || j,
                    '{first}'::timestamptz - interval '1 day'
             FROM generate_series(0, {t} - 1) i, generate_series(1, {e}) j ON CONFLICT DO NOTHING;
             INSERT INTO walhook.endpoint_versions (endpoint_id, version, url, description, event_types, enabled,
                 changed_at, changed_by)
             SELECT id, 1, url, '', '{{}}', true, created_at, 'history' FROM walhook.endpoints
             ON CONFLICT DO NOTHING;",
            ep = Self::endpoint_sql("i", "j"),
            first = self.first_day,
        )
    }

    /// The events, deliveries and attempts of day `d` (from 0).
    pub fn day_sql(&self, d: u32) -> String {
        let n = self.events_per_day.max(1);
        let t = self.tenants.max(1);
        let first = u64::from(d) * n;
        let mut sql = String::from("SET TIME ZONE 'UTC';\n");
        let day = format!("('{}'::date + {d})", self.first_day);
        let _ = write!(
            sql,
            "SELECT walhook.ensure_day_partition(p, {day}) FROM unnest(ARRAY['events', 'deliveries', 'attempts']) p;
             INSERT INTO walhook.events (id, tenant_id, event_type, schema_version, object_id, object_version,
                 occurred_at, source, commit_lsn, tx_ordinal, payload, payload_sha256)
             SELECT (lpad(to_hex(l.lsn), 16, '0') || substr(md5('event' || i), 1, 16))::uuid,
                    'tenant-' || (i % {t}), CASE WHEN (i / 7) % 3 = 0 THEN 'invoice.paid' ELSE 'order.created' END,
                    1, i::text, NULL,
                    {day}::timestamptz + ((i - {first}) * (86000.0 / {n}) + 1) * interval '1 second',
                    'history', '0/0'::pg_lsn + l.lsn::numeric, 0,
                    convert_to('{{\"id\":' || i || ',\"total\":' || (i % 997) || '}}', 'UTF8'),
                    sha256(convert_to('{{\"id\":' || i || ',\"total\":' || (i % 997) || '}}', 'UTF8'))
             FROM generate_series({first}, {first} + {n} - 1) i,
                  LATERAL (SELECT ({lsn}::int8 + i::int8 * 4096) AS lsn) l;
             INSERT INTO walhook.deliveries (id, event_id, endpoint_id, tenant_id, event_type, event_occurred_at,
                 endpoint_config_version, status, attempt_count, next_attempt_at, expires_at, created_at,
                 updated_at, last_http_status, last_error_class)
             SELECT (encode(substring(uuid_send(ev.id) FROM 1 FOR 8) || substring(sha256(
                        '\\x0000000000000013'::bytea || convert_to('walhook.delivery.v2', 'UTF8')
                        || '\\x0000000000000010'::bytea || uuid_send(ev.id)
                        || '\\x0000000000000010'::bytea || uuid_send(ep.id)) FROM 1 FOR 8), 'hex'))::uuid,
                    ev.id, ep.id, ev.tenant_id, ev.event_type, ev.occurred_at, 1,
                    (CASE WHEN get_byte(uuid_send(ev.id), 15) % 10 = 0 THEN 'failed' ELSE 'succeeded' END)::walhook.delivery_status,
                    CASE WHEN get_byte(uuid_send(ev.id), 15) % 10 = 0 THEN 2 ELSE 1 END,
                    ev.occurred_at, ev.occurred_at + interval '1 day',
                    ev.occurred_at + interval '50 ms', ev.occurred_at + interval '80 ms',
                    CASE WHEN get_byte(uuid_send(ev.id), 15) % 10 = 0 THEN 400 ELSE 200 END,
                    CASE WHEN get_byte(uuid_send(ev.id), 15) % 10 = 0 THEN 'http_4xx' END
             FROM walhook.events ev JOIN walhook.endpoints ep ON ep.tenant_id = ev.tenant_id
             WHERE ev.occurred_at >= {day} AND ev.occurred_at < {day} + 1;
             INSERT INTO walhook.attempts (id, delivery_id, endpoint_id, tenant_id, number, trigger,
                 endpoint_config_version, started_at, finished_at, http_status, latency_ms, outcome)
             SELECT md5(d.id::text || k)::uuid, d.id, d.endpoint_id, d.tenant_id, k, 'auto', 1,
                    d.created_at + k * interval '10 ms', d.created_at + k * interval '10 ms' + interval '5 ms',
                    CASE WHEN k < d.attempt_count THEN 503 ELSE d.last_http_status END, 5,
                    CASE WHEN k < d.attempt_count THEN 'retryable'
                         WHEN d.status = 'failed' THEN 'rejected' ELSE 'succeeded' END
             FROM walhook.deliveries d CROSS JOIN LATERAL generate_series(1, d.attempt_count) k
             WHERE d.created_at >= {day} AND d.created_at < {day} + 1;",
            lsn = self.first_lsn,
        );
        sql
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sql_names_every_day_and_table() {
        let h = History {
            first_day: "2026-01-01".into(),
            days: 2,
            events_per_day: 10,
            tenants: 2,
            endpoints_per_tenant: 1,
            first_lsn: 1 << 32,
        };
        let day = h.day_sql(1);
        assert!(day.contains("('2026-01-01'::date + 1)"));
        for table in ["events", "deliveries", "attempts"] {
            assert!(
                day.contains(&format!("INSERT INTO walhook.{table}")),
                "{table}"
            );
        }
        assert!(h.setup_sql().contains("walhook.tenants"));
    }
}
