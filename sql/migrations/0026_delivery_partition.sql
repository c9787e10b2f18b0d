-- The partition of the deliveries topic that a delivery belongs to, when
-- fan-out sends jobs through the topic keyed by endpoint
-- (`[log] dispatch = "by-endpoint"`, docs/scale-out.md). The dispatcher of
-- a partition claims only that partition's deliveries (due retries, those
-- an earlier holder of the partition held, replays, planned deliveries
-- whose job an earlier holder read), so that one dispatcher decides each
-- endpoint's limits. It must compute exactly what
-- `walhook_pipeline::routing::partition_of` computes:
--
--   (tail(endpoint) mod partitions + tail(delivery) mod shards) mod partitions
--
-- where tail() is the id's last four bytes as an unsigned big-endian
-- number (random in endpoint ids, hash bytes in delivery ids).
CREATE FUNCTION walhook.id_tail(id uuid) RETURNS int8
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT (get_byte(b, 12)::int8 << 24) | (get_byte(b, 13)::int8 << 16)
         | (get_byte(b, 14)::int8 << 8) | get_byte(b, 15)::int8
    FROM (SELECT uuid_send(id) AS b) AS t
$$;

CREATE FUNCTION walhook.delivery_partition(endpoint uuid, delivery uuid, partitions int4, shards int4)
RETURNS int4
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT ((walhook.id_tail(endpoint) % greatest(partitions, 1)
             + walhook.id_tail(delivery) % greatest(shards, 1)) % greatest(partitions, 1))::int4
$$;
