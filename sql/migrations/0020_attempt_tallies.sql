-- Tallies of attempts, written by the statement that records the attempts
-- (only attempts actually inserted count, so a batch recorded again adds
-- nothing): the console's 24-hour charts per endpoint and the pipeline
-- page's last hour, read without scanning the attempts partitions.
-- Upserted once per batch per key, not once per attempt; the updated
-- columns carry no index, so the upserts are HOT updates.

-- Per endpoint and UTC hour; kept 8 days.
CREATE TABLE walhook.endpoint_hours (
    endpoint_id  uuid NOT NULL,
    hour         timestamptz NOT NULL,
    tenant_id    text NOT NULL,
    attempts     int8 NOT NULL,
    succeeded    int8 NOT NULL,
    PRIMARY KEY (endpoint_id, hour)
) WITH (fillfactor = 70);
CREATE INDEX endpoint_hours_by_hour ON walhook.endpoint_hours (hour);

-- Across the platform, per minute; kept 2 days.
CREATE TABLE walhook.attempt_minutes (
    minute          timestamptz PRIMARY KEY,
    attempts        int8 NOT NULL,
    succeeded       int8 NOT NULL,
    first_attempts  int8 NOT NULL
) WITH (fillfactor = 70);

-- Commit -> first attempt latency per minute, as a histogram: bucket b
-- holds latencies in (2^((b-1)/4), 2^(b/4)] ms (bucket 0: up to 1 ms).
CREATE TABLE walhook.first_attempt_latency (
    minute    timestamptz NOT NULL,
    bucket    int2 NOT NULL,
    attempts  int8 NOT NULL,
    PRIMARY KEY (minute, bucket)
) WITH (fillfactor = 70);

-- The recent past, from the attempts already there (first-attempt
-- latency is not known for them: the event's commit time is not kept on
-- the attempt).
INSERT INTO walhook.endpoint_hours (endpoint_id, hour, tenant_id, attempts, succeeded)
SELECT endpoint_id, date_trunc('hour', started_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC',
       min(tenant_id), count(*), count(*) FILTER (WHERE outcome = 'succeeded')
FROM walhook.attempts WHERE started_at > now() - interval '25 hours'
GROUP BY 1, 2;
INSERT INTO walhook.attempt_minutes (minute, attempts, succeeded, first_attempts)
SELECT date_trunc('minute', started_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC',
       count(*), count(*) FILTER (WHERE outcome = 'succeeded'),
       count(*) FILTER (WHERE number = 1 AND trigger = 'auto')
FROM walhook.attempts WHERE started_at > now() - interval '2 hours'
GROUP BY 1;
