-- A tenant's own in-flight budget: attempts in flight at most for the
-- tenant on each dispatcher node, instead of [dispatch]
-- tenant_max_in_flight. NULL: the configured budget.
ALTER TABLE walhook.tenants ADD COLUMN max_in_flight integer
    CHECK (max_in_flight BETWEEN 1 AND 100000);
