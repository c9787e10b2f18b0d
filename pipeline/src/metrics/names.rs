//! Metric names: one constant per metric, so that the registry, the
//! dashboard test and the docs name the same series. Counters get
//! `_total` when encoded.

/// API requests by method, route and status (counter).
pub const API_REQUESTS: &str = "walhook_api_requests";
/// API request durations by route (histogram, seconds).
pub const API_REQUEST_DURATION: &str = "walhook_api_request_duration_seconds";
/// Transactions capture read (counter).
pub const CAPTURE_TRANSACTIONS: &str = "walhook_capture_transactions";
/// Row changes capture read (counter).
pub const CAPTURE_CHANGES: &str = "walhook_capture_changes";
/// Events capture made (counter).
pub const CAPTURE_EVENTS: &str = "walhook_capture_events";
/// Capture incidents (counter).
pub const CAPTURE_INCIDENTS: &str = "walhook_capture_incidents";
/// Seconds from commit to capture reading the last transaction (gauge).
pub const CAPTURE_LAG: &str = "walhook_capture_lag_seconds";
/// Seconds the log's cluster has not answered, 0 while it answers (gauge;
/// Fluvio only, per stage process).
pub const LOG_UNREACHABLE: &str = "walhook_log_unreachable_seconds";
/// Records after a consumer group's committed position, by topic,
/// partition and group (gauge; Fluvio only, from every stage process).
pub const LOG_CONSUMER_LAG: &str = "walhook_log_consumer_lag";
/// Seconds the oldest record a consumer group has not read has waited
/// since it was produced, 0 when the group is caught up, by topic,
/// partition and group (gauge; Fluvio only, from every stage process).
pub const LOG_OLDEST_UNREAD_AGE: &str = "walhook_log_oldest_unread_age_seconds";
/// Partitions a fan-out member holds, by group and member slot (gauge;
/// members that joined without `--member`).
pub const MEMBER_PARTITIONS: &str = "walhook_member_partitions";
/// Partitions a fan-out member took, gave back or lost, by group and
/// member slot (counter).
pub const MEMBER_ASSIGNMENT_CHANGES: &str = "walhook_member_assignment_changes";
/// Commits a fan-out member's fence refused (the partition was no longer
/// its own), by group and member slot (counter).
pub const MEMBER_FENCED_COMMITS: &str = "walhook_member_fenced_commits";
/// WAL the replication slot retains, bytes (gauge).
pub const CAPTURE_SLOT_LAG: &str = "walhook_capture_slot_lag_bytes";
/// Seconds since a source's checkpoint moved, by source (gauge, SQL).
pub const CAPTURE_CHECKPOINT_AGE: &str = "walhook_capture_checkpoint_age_seconds";
/// Events fan-out processed (counter).
pub const FANOUT_EVENTS: &str = "walhook_fanout_events";
/// Deliveries fan-out made (counter).
pub const FANOUT_DELIVERIES: &str = "walhook_fanout_deliveries";
/// Events fan-out set aside because the platform database refused them
/// (counter; each is an incident).
pub const FANOUT_INCIDENTS: &str = "walhook_fanout_incidents";
/// Attempt results the platform database refused (counter; each is an
/// incident and the delivery is attempted again).
pub const DISPATCH_UNSTORABLE: &str = "walhook_dispatch_unstorable_results";
/// Endpoints quarantined because their row or secret cannot be loaded
/// (gauge).
pub const ENDPOINTS_QUARANTINED: &str = "walhook_endpoints_quarantined";
/// Attempts by trigger (`auto`, `manual`), outcome and error class
/// (counter).
pub const DISPATCH_ATTEMPTS: &str = "walhook_dispatch_attempts";
/// Seconds from commit to the first attempt's start (histogram).
pub const DISPATCH_FIRST_ATTEMPT_LATENCY: &str = "walhook_dispatch_first_attempt_latency_seconds";
/// Deliveries that succeeded (counter).
pub const DISPATCH_SUCCEEDED: &str = "walhook_dispatch_deliveries_succeeded";
/// Seconds from commit to the end of the attempt that succeeded
/// (histogram).
pub const DISPATCH_SUCCESS_LATENCY: &str = "walhook_dispatch_success_latency_seconds";
/// The number of the attempt that succeeded: how many tries deliveries
/// take (histogram).
pub const DISPATCH_ATTEMPTS_TO_SUCCESS: &str = "walhook_dispatch_attempts_to_success";
/// Deliveries that failed or ran out of retries (counter).
pub const DISPATCH_FAILED: &str = "walhook_dispatch_deliveries_failed";
/// Results not recorded because the lease moved on (counter).
pub const DISPATCH_STALE: &str = "walhook_dispatch_stale_results";
/// Automatic retries made (counter).
pub const DISPATCH_RETRIES: &str = "walhook_dispatch_retries";
/// Manual attempts (replays) made (counter).
pub const DISPATCH_MANUAL_ATTEMPTS: &str = "walhook_dispatch_manual_attempts";
/// Circuits opened (counter).
pub const DISPATCH_CIRCUITS_OPENED: &str = "walhook_dispatch_circuits_opened";
/// Endpoints disabled by dispatch, for 410 or failing too long (counter).
pub const DISPATCH_ENDPOINTS_DISABLED: &str = "walhook_dispatch_endpoints_disabled";
/// Seconds from an event's commit to its deliveries being durable
/// (fan-out committed past it) (histogram).
pub const FANOUT_LATENCY: &str = "walhook_fanout_latency_seconds";
/// Attempts by HTTP status class: `2xx` … `5xx`, `none` without a
/// response (counter).
pub const DISPATCH_ATTEMPTS_BY_STATUS_CLASS: &str = "walhook_dispatch_attempts_by_status_class";
/// Attempts by endpoint and status class, for the first
/// [`super::MAX_LABELLED`] endpoints seen, the rest as `other`
/// (counter).
pub const ENDPOINT_ATTEMPTS: &str = "walhook_endpoint_attempts";
/// Attempts by tenant and trigger (bounded like endpoints); with
/// [`TENANT_DELIVERIES_ENDED`] it gives retry amplification, attempts
/// per delivery (counter).
pub const TENANT_ATTEMPTS: &str = "walhook_tenant_attempts";
/// Deliveries that reached a final state, by tenant and state (counter).
pub const TENANT_DELIVERIES_ENDED: &str = "walhook_tenant_deliveries_ended";
/// Automatic attempts per delivery that ended, by tenant (histogram).
pub const TENANT_ATTEMPTS_PER_DELIVERY: &str = "walhook_tenant_attempts_per_delivery";
/// Times a ready delivery waited for a limit, by tenant and limit
/// (`rate_limit`, `endpoint_max_in_flight`, `tenant_budget`) (counter).
pub const DISPATCH_THROTTLED: &str = "walhook_dispatch_throttled";
/// Replays by outcome: `succeeded`, `failed`, `refused` (counter).
pub const DISPATCH_REPLAYS: &str = "walhook_dispatch_replays";
/// Attempts whose outcome nobody knows (out at a shutdown's end, or
/// their task failed): the receiver may have had them (counter).
pub const DISPATCH_UNKNOWN_OUTCOMES: &str = "walhook_dispatch_unknown_outcomes";
/// Attempts sent after an attempt of unknown outcome: each may be a
/// duplicate send the receiver deduplicates by `webhook-id` (counter).
pub const DISPATCH_ATTEMPTS_AFTER_UNKNOWN: &str = "walhook_dispatch_attempts_after_unknown";
/// Age of the oldest due delivery by kind, `new` (first attempt) or
/// `retry`, seconds (gauge, SQL).
pub const DELIVERIES_OLDEST_DUE_AGE: &str = "walhook_deliveries_oldest_due_age_seconds";
/// WAL a capture source's slot retained at its last checkpoint, bytes,
/// by source: the slot lag as `walhook api` sees it (gauge, SQL).
pub const CAPTURE_CHECKPOINT_SLOT_LAG: &str = "walhook_capture_checkpoint_slot_lag_bytes";
/// Pending deliveries (gauge, SQL).
pub const DELIVERIES_PENDING: &str = "walhook_deliveries_pending";
/// Age of the oldest pending delivery, seconds (gauge, SQL).
pub const DELIVERIES_OLDEST_PENDING_AGE: &str = "walhook_deliveries_oldest_pending_age_seconds";
/// Pending deliveries due but held by no dispatcher (gauge, SQL).
pub const DELIVERIES_OVERDUE_UNLEASED: &str = "walhook_deliveries_overdue_unleased";
/// Endpoints per circuit state (gauge, SQL).
pub const ENDPOINT_CIRCUITS: &str = "walhook_endpoint_circuits";
/// Rows archived to Parquet and dropped from the hot tables, by table
/// (gauge, SQL: from the archive catalog).
pub const ARCHIVE_ROWS: &str = "walhook_archive_rows";
/// Parquet bytes of those rows, by table (gauge, SQL).
pub const ARCHIVE_BYTES: &str = "walhook_archive_bytes";
/// Archive verifications that found an object or count not matching,
/// by table (gauge, SQL).
pub const ARCHIVE_VERIFICATION_FAILURES: &str = "walhook_archive_verification_failures";
/// Days that failed to archive and that no run has archived since, by
/// table (gauge, SQL: open `archive_day_failed` incidents). Their rows
/// stay hot; the incident says why.
pub const ARCHIVE_FAILED_DAYS: &str = "walhook_archive_failed_days";
/// Seconds since the oldest day still in the hot tables began, by table
/// (gauge, SQL): above the hot window plus a day, archiving is behind.
pub const ARCHIVE_OLDEST_HOT_AGE: &str = "walhook_archive_oldest_hot_age_seconds";
/// Transactions since the oldest row not yet frozen in the table's
/// partitions, by table (gauge, SQL: the largest `age(relfrozenxid)`).
/// Postgres starts an anti-wraparound vacuum of a partition at
/// `autovacuum_freeze_max_age`; day partitions skip insert-triggered
/// passes (migration 0027), so that pass is where their rows freeze.
pub const ARCHIVE_XID_AGE: &str = "walhook_archive_xid_age";
/// [`ARCHIVE_XID_AGE`] as a share of the effective
/// `autovacuum_freeze_max_age` (the cluster's setting, or a partition's own
/// storage parameter when lower), the largest over the table's partitions
/// (gauge, SQL): at 1 Postgres starts the anti-wraparound vacuum, whatever
/// the cluster is set to.
pub const ARCHIVE_FREEZE_PROGRESS: &str = "walhook_archive_freeze_progress";
/// Gaps the latest reconciliation over every tenant found, by class
/// (gauge, SQL: from `walhook.reconcile_runs`; 0 for classes it did
/// not find).
pub const RECONCILE_GAPS: &str = "walhook_reconcile_gaps";
/// Gaps the latest reconciliation left unrepaired (gauge, SQL).
pub const RECONCILE_OPEN_GAPS: &str = "walhook_reconcile_open_gaps";
/// The end of the latest window found clean, Unix seconds (gauge, SQL):
/// alert when it falls behind.
pub const RECONCILE_LAST_CLEAN: &str = "walhook_reconcile_last_clean_window_end_timestamp_seconds";
/// When the latest reconciliation ended, Unix seconds (gauge, SQL).
pub const RECONCILE_LAST_RUN: &str = "walhook_reconcile_last_run_timestamp_seconds";
/// 1 when the last scrape could read the platform database (gauge).
pub const METRICS_DATABASE_UP: &str = "walhook_metrics_database_up";
/// Requests and connections refused before they were served, by
/// reason (counter; the reasons are `walhook_api::metrics::Refusal`).
pub const API_REFUSALS: &str = "walhook_api_refusals";
