-- Which secrets signed an attempt, and which secret a config version had.
--
-- Attempts record the versions of the secrets that signed them, newest
-- first (two or more during a rotation overlap); rows written before this
-- migration have NULL (unknown).
ALTER TABLE walhook.attempts ADD COLUMN secret_versions int4[];

-- A secret rotation makes a new endpoint config version; each version
-- names the newest secret in force when it was made.
ALTER TABLE walhook.endpoint_versions ADD COLUMN secret_version integer;

-- A secret whose rotation overlap has ended is retired: it stops signing,
-- and the first node to notice writes an `endpoint.secret_retired` audit
-- record and sets this (once, whichever node notices). Found through
-- `endpoint_secrets_expires_at`.
ALTER TABLE walhook.endpoint_secrets ADD COLUMN retired_at timestamptz;
