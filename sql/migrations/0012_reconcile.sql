-- Reconciliation runs (reconcile/): one row per run of `walhook reconcile`
-- or of the schedule inside `walhook run`, with the whole report, so that
-- the API, the metrics and the console show what was found without
-- running it again.
CREATE TABLE walhook.reconcile_runs (
    id           bigserial PRIMARY KEY,
    -- 'command' (walhook reconcile) or 'scheduled' ([reconcile] in walhook run).
    trigger      text NOT NULL CHECK (trigger IN ('command', 'scheduled')),
    since        timestamptz NOT NULL,
    until        timestamptz NOT NULL,
    -- The one tenant reconciled; NULL for every tenant.
    tenant_id    text,
    repair       boolean NOT NULL,
    -- No gap left unrepaired.
    clean        boolean NOT NULL,
    open_gaps    bigint NOT NULL,
    repaired     bigint NOT NULL,
    -- Gaps by class: {"missing_delivery": 2, …}.
    gap_counts   jsonb NOT NULL,
    -- The report's data hash (walhook.reconcile.report, data_sha256).
    data_sha256  text NOT NULL,
    report       jsonb NOT NULL,
    started_at   timestamptz NOT NULL,
    finished_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX reconcile_runs_recent ON walhook.reconcile_runs (id DESC);
CREATE INDEX reconcile_runs_by_tenant ON walhook.reconcile_runs (tenant_id, id DESC);
