-- Per-object ordering, opt-in per endpoint: 'per_object' attempts one
-- object's deliveries in commit order (the next waits while an earlier one
-- is pending); 'none' (the default) sends each as soon as limits allow.
-- Endpoint versions keep it like the other settings.
ALTER TABLE walhook.endpoints ADD COLUMN ordering text NOT NULL DEFAULT 'none'
    CONSTRAINT endpoints_ordering_known CHECK (ordering IN ('none', 'per_object'));
ALTER TABLE walhook.endpoint_versions ADD COLUMN ordering text;
