-- Delivery ids are led by their event's commit LSN (DeliveryId::derive,
-- "walhook.delivery.v2"): the first 8 bytes of the event id, then the first
-- 8 bytes of SHA-256 over the length-prefixed parts. Ids that grow with the
-- WAL keep primary-key inserts at the right edge of the index instead of on
-- random pages (docs/performance.md). Rows made before keep their
-- "walhook.delivery.v1" ids (the first 16 bytes of the hash), so the check
-- accepts both; it compares bytes, without the text round trip of the first
-- version.
--
-- NOT VALID: every existing row already passed the first version's check,
-- which the second alternative repeats; new and updated rows are checked.
ALTER TABLE walhook.deliveries DROP CONSTRAINT deliveries_id_is_derived;
ALTER TABLE walhook.deliveries ADD CONSTRAINT deliveries_id_is_derived CHECK (
    uuid_send(id) = substring(uuid_send(event_id) FROM 1 FOR 8) || substring(sha256(
        '\x0000000000000013'::bytea || convert_to('walhook.delivery.v2', 'UTF8')
        || '\x0000000000000010'::bytea || uuid_send(event_id)
        || '\x0000000000000010'::bytea || uuid_send(endpoint_id)) FROM 1 FOR 8)
    OR uuid_send(id) = substring(sha256(
        '\x0000000000000013'::bytea || convert_to('walhook.delivery.v1', 'UTF8')
        || '\x0000000000000010'::bytea || uuid_send(event_id)
        || '\x0000000000000010'::bytea || uuid_send(endpoint_id)) FROM 1 FOR 16)
) NOT VALID;
