-- Endpoint secrets at rest: sealed with AES-256-GCM under a master key (see
-- sql/src/secrets.rs). `key_id` names the master key that sealed a row
-- ('plain' marks rows written before encryption: `walhook secrets rotate`
-- seals them). Every insert now says which key sealed it: no default.
ALTER TABLE walhook.endpoint_secrets ALTER COLUMN key_id DROP DEFAULT;

-- A master key rotation looks for rows under other keys.
CREATE INDEX endpoint_secrets_key_id ON walhook.endpoint_secrets (key_id);

-- The endpoint directory notices when a rotation overlap ends (the latest
-- expiry already passed), so an expired secret stops signing at once.
CREATE INDEX endpoint_secrets_expires_at ON walhook.endpoint_secrets (expires_at)
    WHERE expires_at IS NOT NULL;
