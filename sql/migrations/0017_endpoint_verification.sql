-- Endpoint ownership checks. An endpoint with a challenge waits: its
-- deliveries are made and stay pending until its URL echoes the challenge
-- (dispatch/verify.rs). NULL challenge: verified, or created without the
-- requirement (endpoints from before this migration count as verified).
ALTER TABLE walhook.endpoints
    ADD COLUMN verification_challenge    text,
    ADD COLUMN verification_requested_at timestamptz,
    ADD COLUMN verified_at               timestamptz;

-- The last failed check of an endpoint's current challenge, for people. A
-- table of its own: a failure changes nothing dispatch reads, so it must
-- not bump the config epoch (every node would reload its directory).
CREATE TABLE walhook.endpoint_verification_failures (
    endpoint_id  uuid PRIMARY KEY REFERENCES walhook.endpoints (id),
    challenge    text NOT NULL,
    error        text NOT NULL,
    checked_at   timestamptz NOT NULL DEFAULT now()
);
