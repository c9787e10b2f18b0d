//! The report: what one reconciliation of one window found, as JSON for
//! machines (format [`FORMAT`], version [`SCHEMA_VERSION`]; see
//! `docs/reconcile.md`) and as the HTML page of [`crate::html`].
//!
//! Everything in the report but `generated_at`, `parameters.as_of`,
//! `data_sha256` and how capture's progress looked when the report was made
//! (each `capture_coverage` entry but its `source` and `confirmed`) is the
//! report's data; `data_sha256` is the SHA-256 of that data in canonical
//! JSON, so two runs over the same window and the same rows carry the same
//! hash whenever they ran.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use walhook_archive::PartitionState;

/// The `format` field of every report.
pub const FORMAT: &str = "walhook.reconcile.report";

/// The version of the report's layout; bumped on any change that is not
/// a new optional field.
pub const SCHEMA_VERSION: u32 = 1;

/// Gaps listed one by one in a report at most; further ones are counted in
/// [`Report::gap_counts`] and [`Report::gaps_not_listed`].
pub const MAX_LISTED_GAPS: usize = 1000;

/// One reconciliation of one window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Always [`FORMAT`].
    pub format: String,
    /// [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// The walhook version that made it.
    pub software_version: String,
    /// When it was made (RFC 3339, UTC). Not part of the data hash.
    pub generated_at: String,
    /// What was reconciled.
    pub parameters: Parameters,
    /// Capture's ledger per source and rule, against the events stored.
    pub capture: Vec<CaptureRow>,
    /// Per source: whether capture had confirmed its WAL past the window's
    /// end (a window is clean only when every source's was).
    #[serde(default)]
    pub capture_coverage: Vec<SourceCoverage>,
    /// Column changes of captured tables in the window (explained as
    /// `schema_changed`), with the schema versions events carry after them.
    #[serde(default)]
    pub schema_changes: Vec<SchemaChange>,
    /// The funnel over every tenant of the window.
    pub funnel: Funnel,
    /// The funnel per tenant, by tenant id.
    pub tenants: Vec<TenantFunnel>,
    /// Differences that are not gaps, with their reasons.
    pub explained: Vec<Explained>,
    /// Archived days the window touches, with what verification found.
    pub archive: Vec<ArchiveDay>,
    /// Gaps by class (every gap, listed or not).
    pub gap_counts: BTreeMap<GapClass, u64>,
    /// The gaps, up to [`MAX_LISTED_GAPS`], ordered by class then id.
    pub gaps: Vec<Gap>,
    /// Gaps counted but not listed (over [`MAX_LISTED_GAPS`]).
    pub gaps_not_listed: u64,
    /// What `--repair` did (empty without it).
    pub repairs: Vec<Repair>,
    /// Whether no gap is left unexplained (unrepaired).
    pub clean: bool,
    /// SHA-256 (hex) of the report's data: everything above but
    /// `generated_at` and `parameters.as_of`, in canonical JSON.
    pub data_sha256: String,
}

/// The window and options of a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Parameters {
    /// Start of the window (inclusive), RFC 3339 UTC, whole minutes.
    pub since: String,
    /// End of the window (exclusive), RFC 3339 UTC, whole minutes.
    pub until: String,
    /// The one tenant reconciled, if one was asked for.
    pub tenant: Option<String>,
    /// Whether repairs were made.
    pub repair: bool,
    /// How long past its due time a pending delivery may wait before it
    /// counts as overdue, in seconds.
    pub grace_seconds: u64,
    /// The time the state was read at (RFC 3339 UTC): "due" and "overdue"
    /// are judged against it.
    pub as_of: String,
}

/// Capture's ledger of one rule of one source over the window, and the
/// events stored for that source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureRow {
    /// The source's name.
    pub source: String,
    /// The rule's name.
    pub rule: String,
    /// Row changes (and messages) the rule looked at.
    pub changes: u64,
    /// Events it made.
    pub events: u64,
    /// Changes its conditions or operations left out.
    pub filtered: u64,
    /// Changes it could not turn into an event (capture incidents).
    pub incidents: u64,
    /// The first and last commit LSN it saw in the window.
    pub first_commit_lsn: Option<String>,
    /// See `first_commit_lsn`.
    pub last_commit_lsn: Option<String>,
}

/// Whether capture had confirmed one source's WAL past the window's end.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceCoverage {
    /// The source's name.
    pub source: String,
    /// The time capture had to be past (RFC 3339 UTC): the window's end, or
    /// the run's start for a window that ends later.
    pub through: String,
    /// Whether capture had confirmed everything committed before `through`.
    pub confirmed: bool,
    /// How that is known, or why it is not, for people.
    pub evidence: String,
    /// The slot's confirmed position capture last saved.
    pub confirmed_lsn: Option<String>,
    /// The slot's lag in bytes when capture last measured it.
    pub slot_lag_bytes: Option<i64>,
    /// When capture last saved its position (RFC 3339 UTC).
    pub checkpoint_at: Option<String>,
    /// The commit LSN of the last transaction capture counted.
    pub last_commit_lsn: Option<String>,
    /// The minute of that commit (RFC 3339 UTC).
    pub last_commit_minute: Option<String>,
}

/// One column change of a captured table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchemaChange {
    /// The source's name.
    pub source: String,
    /// The table (`schema.table`).
    pub table: Option<String>,
    /// The commit LSN of the transaction that first wrote the new shape.
    pub commit_lsn: Option<String>,
    /// When capture saw it (RFC 3339 UTC).
    pub seen_at: String,
    /// The schema version each rule's events carry from the change on.
    pub versions: Vec<SchemaVersion>,
    /// Capture's description (the new columns).
    pub detail: String,
}

/// An event type's schema version after a change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchemaVersion {
    /// The event type.
    pub event_type: String,
    /// Its schema version (`GET /v1/event-types/{type}/schemas/{version}`).
    pub schema_version: u32,
}

/// The stages of one window, each counted from its own table.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Funnel {
    /// The source's row changes (and transactional messages) committed in
    /// the window, each counted once however many rules looked at it (the
    /// ledger's source rows; every tenant, so absent per tenant). Complete
    /// only when `capture_coverage` confirms every source.
    pub captured_changes: Option<u64>,
    /// Events capture made (ledger; absent per tenant).
    pub captured_events: Option<u64>,
    /// Events stored (hot and archived).
    pub events: u64,
    /// Of them, in archived days (manifests).
    pub events_archived: u64,
    /// Deliveries the subscriptions in force called for, for hot events.
    pub expected_deliveries: u64,
    /// Deliveries that exist (rows and fan-out plans), for hot events.
    pub materialised_deliveries: u64,
    /// Of them, those with at least one attempt.
    pub attempted_deliveries: u64,
    /// Terminal: succeeded.
    pub succeeded: u64,
    /// Terminal: failed (a permanent error, or a replay's outcome).
    pub failed: u64,
    /// Terminal: retries exhausted.
    pub exhausted: u64,
    /// Terminal: cancelled.
    pub cancelled: u64,
    /// Pending and due (an attempt may start now).
    pub pending_due: u64,
    /// Pending, next attempt in the future.
    pub pending_scheduled: u64,
    /// Attempts the deliveries count.
    pub attempts_expected: u64,
    /// Attempts in the hot table for those deliveries.
    pub attempts_hot: u64,
    /// Of the window's deliveries, those read from archived days (Parquet).
    pub deliveries_archived: u64,
    /// Of the window's attempts, those read from archived days (Parquet).
    pub attempts_archived: u64,
}

/// One tenant's funnel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantFunnel {
    /// The tenant.
    pub tenant: String,
    /// Its funnel.
    #[serde(flatten)]
    pub funnel: Funnel,
    /// Its gaps.
    pub gaps: u64,
}

/// Why a count differs from the one before it, when that is expected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Explanation {
    /// A rule's condition or operations left a change out.
    FilteredByRule,
    /// The endpoint was disabled when the event occurred.
    EndpointDisabled,
    /// The endpoint was deleted before the event occurred.
    EndpointDeleted,
    /// The event occurred before the endpoint was created.
    EventBeforeEndpoint,
    /// The endpoint's subscription did not list the event's type.
    TypeNotSubscribed,
    /// The tenant is not registered: its events reach no endpoint.
    TenantUnknown,
    /// The tenant was disabled.
    TenantDisabled,
    /// A pending delivery waits because its endpoint is quarantined.
    PendingQuarantined,
    /// A pending delivery waits because its endpoint's circuit is open.
    PendingCircuitOpen,
    /// A pending delivery waits because its endpoint is disabled (or its
    /// tenant is).
    PendingEndpointDisabled,
    /// A delivery ended (exhausted, cancelled) without an attempt: its
    /// deadline passed while it waited, or its endpoint was deleted.
    EndedWithoutAttempt,
    /// Events of a source in minutes before its ledger began.
    BeforeLedger,
    /// A captured table's columns changed (added, dropped, retyped): its
    /// rows go on as events of a new schema version (`schema_changes`).
    SchemaChanged,
    /// Deliveries of events in archived days: counted from the manifests.
    EventArchived,
    /// Events walhook made itself (test events, `endpoint.disabled`
    /// notices): their deliveries follow the request that made them, not
    /// the subscriptions, so they count as expected as made.
    OperationalEvent,
    /// An attempt a dispatcher node recorded after its lease had lapsed
    /// (it was frozen or cut off while the attempt was out): kept as
    /// history; the delivery's state is its next holder's.
    LateAttempt,
}

/// A difference that is not a gap.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Explained {
    /// Why.
    pub reason: Explanation,
    /// The tenant, when it is about one.
    pub tenant: Option<String>,
    /// How many.
    pub count: u64,
}

/// The classes of gaps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GapClass {
    /// Capture counted more events than are stored, or a delivery names
    /// an event that is not stored.
    MissingEvent,
    /// More events are stored than capture counted.
    UnexpectedEvent,
    /// A subscription in force called for a delivery that does not exist.
    MissingDelivery,
    /// A delivery exists that no subscription called for.
    UnexpectedDelivery,
    /// Pending, due longer than the grace, and no live lease holds it.
    OverduePending,
    /// The delivery's attempt counts differ from its attempt rows.
    AttemptCountMismatch,
    /// Succeeded or failed without any attempt.
    TerminalWithoutAttempt,
    /// An archived object or manifest does not match (hash, size, rows).
    ArchiveMismatch,
    /// An archived object or manifest is missing.
    ArchiveObjectMissing,
    /// Capture saw a change it could not turn into an event, or lost or
    /// withheld data (a TRUNCATE, a slot reset).
    CaptureIncident,
    /// Capture had not confirmed a source's WAL past the window's end: its
    /// changes may not all be counted yet.
    CaptureBehind,
}

impl GapClass {
    /// The name used in ids, metrics and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            GapClass::MissingEvent => "missing_event",
            GapClass::UnexpectedEvent => "unexpected_event",
            GapClass::MissingDelivery => "missing_delivery",
            GapClass::UnexpectedDelivery => "unexpected_delivery",
            GapClass::OverduePending => "overdue_pending",
            GapClass::AttemptCountMismatch => "attempt_count_mismatch",
            GapClass::TerminalWithoutAttempt => "terminal_without_attempt",
            GapClass::ArchiveMismatch => "archive_mismatch",
            GapClass::ArchiveObjectMissing => "archive_object_missing",
            GapClass::CaptureIncident => "capture_incident",
            GapClass::CaptureBehind => "capture_behind",
        }
    }

    /// Every class, in report order.
    pub const ALL: [GapClass; 11] = [
        GapClass::MissingEvent,
        GapClass::UnexpectedEvent,
        GapClass::MissingDelivery,
        GapClass::UnexpectedDelivery,
        GapClass::OverduePending,
        GapClass::AttemptCountMismatch,
        GapClass::TerminalWithoutAttempt,
        GapClass::ArchiveMismatch,
        GapClass::ArchiveObjectMissing,
        GapClass::CaptureIncident,
        GapClass::CaptureBehind,
    ];

    /// Whether `--repair` can fix gaps of this class.
    pub fn repairable(self) -> bool {
        matches!(self, GapClass::MissingDelivery | GapClass::OverduePending)
    }
}

impl std::fmt::Display for GapClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One gap.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gap {
    /// Stable across runs: `<class>:<subject>` (a delivery, event or
    /// object id, or a source and minute).
    pub id: String,
    /// Its class.
    pub class: GapClass,
    /// The tenant, when known.
    pub tenant: Option<String>,
    /// The event, when it is about one.
    pub event_id: Option<String>,
    /// The delivery, when it is about one.
    pub delivery_id: Option<String>,
    /// The endpoint, when it is about one.
    pub endpoint_id: Option<String>,
    /// What was found, for people.
    pub detail: String,
    /// Whether `--repair` fixed it in this run.
    pub repaired: bool,
}

/// One archived (table, day) the window touches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArchiveDay {
    /// `events`, `deliveries` or `attempts`.
    pub table: String,
    /// `YYYY-MM-DD`.
    pub day: String,
    /// The generation.
    pub generation: u32,
    /// Its catalog state (`written`, `verified`, `dropped`), or `failed`.
    pub state: ArchiveDayState,
    /// Rows the catalog recorded.
    pub rows: u64,
    /// Parts the catalog recorded.
    pub files: u64,
    /// Whether every object was read back and matched in this run.
    pub verified: bool,
    /// What did not match, when something did not.
    pub problem: Option<String>,
}

/// Where an [`ArchiveDay`] stands; written as its name (`verified`,
/// `failed`, …).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArchiveDayState {
    /// A generation in the archive catalog, in this state.
    Catalog(PartitionState),
    /// Not archived: an archive run failed on the day (an open
    /// `archive_day_failed` incident), and its rows are still hot.
    Failed,
}

impl ArchiveDayState {
    /// The name the report writes.
    pub fn as_str(self) -> &'static str {
        match self {
            ArchiveDayState::Catalog(state) => state.as_str(),
            ArchiveDayState::Failed => "failed",
        }
    }
}

impl From<PartitionState> for ArchiveDayState {
    fn from(state: PartitionState) -> Self {
        ArchiveDayState::Catalog(state)
    }
}

impl TryFrom<&str> for ArchiveDayState {
    type Error = walhook_pipeline::stored::UnknownName;

    fn try_from(text: &str) -> Result<Self, Self::Error> {
        if text == ArchiveDayState::Failed.as_str() {
            return Ok(ArchiveDayState::Failed);
        }
        PartitionState::try_from(text).map(ArchiveDayState::Catalog)
    }
}

walhook_pipeline::stored_text!(ArchiveDayState);

/// What `--repair` did for one class.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Repair {
    /// The class repaired.
    pub class: GapClass,
    /// How many gaps were fixed.
    pub repaired: u64,
    /// What was done, for people.
    pub action: String,
}

impl Report {
    /// Fills `clean` and `data_sha256` from the rest.
    pub fn seal(&mut self) {
        self.clean = self.gap_counts.values().sum::<u64>() == self.repaired_count();
        self.data_sha256 = self.data_hash();
    }

    /// Gaps fixed by this run's repairs.
    pub fn repaired_count(&self) -> u64 {
        self.repairs.iter().map(|r| r.repaired).sum()
    }

    /// Gaps found and not repaired.
    pub fn open_gaps(&self) -> u64 {
        self.gap_counts
            .values()
            .sum::<u64>()
            .saturating_sub(self.repaired_count())
    }

    /// The SHA-256 of the report's data (see the module's documentation).
    pub fn data_hash(&self) -> String {
        let mut value = serde_json::to_value(self).expect("a report serialises");
        if let Some(map) = value.as_object_mut() {
            map.remove("generated_at");
            map.remove("data_sha256");
            if let Some(p) = map.get_mut("parameters").and_then(|p| p.as_object_mut()) {
                p.remove("as_of");
            }
            // Capture's position and lag move on between two runs over the
            // same window; whether it had covered the window does not.
            if let Some(sources) = map
                .get_mut("capture_coverage")
                .and_then(|c| c.as_array_mut())
            {
                for source in sources.iter_mut().filter_map(|s| s.as_object_mut()) {
                    source.retain(|k, _| k == "source" || k == "confirmed");
                }
            }
        }
        // serde_json's maps are ordered (BTreeMap), so this is canonical.
        let bytes = serde_json::to_vec(&value).expect("a value serialises");
        let digest = Sha256::digest(&bytes);
        digest.iter().map(|b| format!("{b:02x}")).collect()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A report of nothing over one hour, for the tests of this crate to
    /// fill in.
    pub(crate) fn report() -> Report {
        Report {
            format: FORMAT.into(),
            schema_version: SCHEMA_VERSION,
            software_version: "0.1.0".into(),
            generated_at: "2026-11-30T10:00:00Z".into(),
            parameters: Parameters {
                since: "2026-11-30T09:00:00Z".into(),
                until: "2026-11-30T10:00:00Z".into(),
                tenant: None,
                repair: false,
                grace_seconds: 60,
                as_of: "2026-11-30T10:02:00Z".into(),
            },
            capture: Vec::new(),
            capture_coverage: Vec::new(),
            schema_changes: Vec::new(),
            funnel: Funnel::default(),
            tenants: Vec::new(),
            explained: Vec::new(),
            archive: Vec::new(),
            gap_counts: BTreeMap::new(),
            gaps: Vec::new(),
            gaps_not_listed: 0,
            repairs: Vec::new(),
            clean: false,
            data_sha256: String::new(),
        }
    }

    #[test]
    fn the_data_hash_ignores_when_and_changes_with_what() {
        let mut a = report();
        a.seal();
        let mut b = report();
        b.generated_at = "2026-12-01T00:00:00Z".into();
        b.parameters.as_of = "2026-12-01T00:00:00Z".into();
        b.seal();
        assert_eq!(a.data_sha256, b.data_sha256);
        assert_eq!(a.data_sha256.len(), 64);
        let mut c = report();
        c.funnel.events = 1;
        c.seal();
        assert_ne!(a.data_sha256, c.data_sha256);
    }

    #[test]
    fn the_data_hash_keeps_whether_capture_covered_the_window_not_its_lag() {
        let covered = |lag: i64, confirmed: bool| {
            let mut r = report();
            r.capture_coverage.push(SourceCoverage {
                source: "shop".into(),
                through: "2026-11-30T10:00:00Z".into(),
                confirmed,
                evidence: format!("the slot {lag} byte(s) behind"),
                confirmed_lsn: Some(format!("0/{lag:X}")),
                slot_lag_bytes: Some(lag),
                checkpoint_at: Some(format!("2026-11-30T10:0{}:00Z", lag % 10)),
                last_commit_lsn: None,
                last_commit_minute: None,
            });
            r.seal();
            r.data_sha256
        };
        assert_eq!(covered(12, true), covered(3456, true));
        assert_ne!(covered(12, true), covered(12, false));
    }

    #[test]
    fn a_report_is_clean_when_every_gap_was_repaired() {
        let mut r = report();
        r.seal();
        assert!(r.clean);
        r.gap_counts.insert(GapClass::MissingDelivery, 2);
        r.gap_counts.insert(GapClass::OverduePending, 1);
        r.repairs.push(Repair {
            class: GapClass::MissingDelivery,
            repaired: 2,
            action: String::new(),
        });
        r.seal();
        assert!(!r.clean);
        assert_eq!(r.open_gaps(), 1);
        r.repairs.push(Repair {
            class: GapClass::OverduePending,
            repaired: 1,
            action: String::new(),
        });
        r.seal();
        assert!(r.clean);
        // The JSON names classes in snake case, as ids and metrics do.
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["gap_counts"]["missing_delivery"], 2);
        for class in GapClass::ALL {
            assert_eq!(
                serde_json::to_value(class).unwrap(),
                serde_json::Value::String(class.as_str().into())
            );
        }
    }

    #[test]
    fn archive_day_states_are_written_as_their_names() {
        let states = PartitionState::ALL
            .iter()
            .map(|s| ArchiveDayState::from(*s))
            .chain([ArchiveDayState::Failed]);
        for state in states {
            let json = serde_json::to_value(state).unwrap();
            assert_eq!(json, serde_json::Value::String(state.to_string()));
            assert_eq!(
                serde_json::from_value::<ArchiveDayState>(json).unwrap(),
                state
            );
        }
        assert_eq!(
            serde_json::to_value(ArchiveDayState::Catalog(PartitionState::Verified)).unwrap(),
            "verified"
        );
        assert_eq!(
            serde_json::to_value(ArchiveDayState::Failed).unwrap(),
            "failed"
        );
        assert!(serde_json::from_str::<ArchiveDayState>("\"lost\"").is_err());
    }
}
