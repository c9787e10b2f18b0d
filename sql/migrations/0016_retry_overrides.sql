-- Retry schedules per tenant and per endpoint: JSON objects with any of
-- max_attempts, base_delay_seconds, max_delay_seconds, deadline_seconds;
-- NULL inherits (endpoint → tenant → [retry]). The API checks them against
-- [retry.limits]; dispatch clamps them into those limits again.
ALTER TABLE walhook.tenants ADD COLUMN retry_policy jsonb;
ALTER TABLE walhook.endpoints ADD COLUMN retry_policy jsonb;
ALTER TABLE walhook.endpoint_versions ADD COLUMN retry_policy jsonb;
