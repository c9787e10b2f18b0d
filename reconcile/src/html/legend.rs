//! The words of the page: names of gap classes and explanations, and the
//! sentence that says what each means and what to do.

use std::fmt::{self, Display};

use super::Esc;
use crate::report::{Explanation, GapClass};

/// A class's name for people.
pub(super) fn class_label(class: GapClass) -> &'static str {
    match class {
        GapClass::MissingEvent => "Missing event",
        GapClass::UnexpectedEvent => "Unexpected event",
        GapClass::MissingDelivery => "Missing delivery",
        GapClass::UnexpectedDelivery => "Unexpected delivery",
        GapClass::OverduePending => "Overdue pending delivery",
        GapClass::AttemptCountMismatch => "Attempt count mismatch",
        GapClass::TerminalWithoutAttempt => "Terminal without attempt",
        GapClass::ArchiveMismatch => "Archive mismatch",
        GapClass::ArchiveObjectMissing => "Archive object missing",
        GapClass::CaptureIncident => "Capture incident",
        GapClass::CaptureBehind => "Capture behind",
    }
}

/// What a gap of the class means and what to do about it (the legend).
pub(super) fn class_legend(class: GapClass) -> &'static str {
    match class {
        GapClass::MissingEvent => {
            "Capture counted an event that is not stored, or a delivery names an event that is \
             not stored, so a change was lost between capture and the event store; read \
             capture's log for that source and minute, as --repair cannot re-create it."
        }
        GapClass::UnexpectedEvent => {
            "More events are stored for a source and minute than capture's ledger counted; find \
             the other writer (a second capture process, a manual insert) before trusting them."
        }
        GapClass::MissingDelivery => {
            "A subscription in force when the event occurred called for a delivery that does not \
             exist, so the customer was never sent the event; run with --repair to re-drive \
             fan-out for it."
        }
        GapClass::UnexpectedDelivery => {
            "A delivery exists that no subscription in force called for; check the endpoint's \
             subscription history and the audit log to learn what created it."
        }
        GapClass::OverduePending => {
            "A delivery has been due for longer than the grace period and no dispatcher holds \
             its lease, so nothing is sending it; check that dispatch runs, then run with \
             --repair to re-enqueue it."
        }
        GapClass::AttemptCountMismatch => {
            "The delivery's attempt count differs from the attempt rows recorded for it, so its \
             history is incomplete; inspect its attempts in the hot tables and the archive, as \
             --repair cannot fix it."
        }
        GapClass::TerminalWithoutAttempt => {
            "A delivery is marked succeeded or failed although no attempt was recorded for it, \
             so its outcome is unproven; find out how its state was set and replay it if the \
             customer may not have received it."
        }
        GapClass::ArchiveMismatch => {
            "An archived object or manifest differs from what its manifest or the catalog \
             recorded (hash, size or rows), so that day's cold history cannot be trusted as it \
             is; while the hot rows are still in Postgres, remove the manifest and run walhook \
             archive again, and once they are dropped restore the object from a copy."
        }
        GapClass::ArchiveObjectMissing => {
            "An archived object or manifest the catalog lists is gone from object storage, so \
             part of that day's history is lost; restore it from a backup or the bucket's \
             versions, as --repair cannot re-create it."
        }
        GapClass::CaptureIncident => {
            "Capture saw a row change it could not turn into an event, or data was removed or \
             skipped without row changes (a TRUNCATE, a slot reset), so no event exists for it; \
             read the incident in capture's log, fix the rule or the row, and tell the \
             customers concerned if the change mattered."
        }
        GapClass::CaptureBehind => {
            "Capture had not confirmed the source's WAL past the window's end, so changes \
             committed in the window may not be counted anywhere yet; check that capture runs \
             and keeps up (the slot's lag), then reconcile the window again."
        }
    }
}

/// A reason's name for people.
pub(super) fn explanation_label(reason: Explanation) -> &'static str {
    match reason {
        Explanation::FilteredByRule => "Filtered by rule",
        Explanation::EndpointDisabled => "Endpoint disabled",
        Explanation::EndpointDeleted => "Endpoint deleted",
        Explanation::EventBeforeEndpoint => "Event before endpoint",
        Explanation::TypeNotSubscribed => "Type not subscribed",
        Explanation::TenantUnknown => "Tenant unknown",
        Explanation::TenantDisabled => "Tenant disabled",
        Explanation::PendingQuarantined => "Pending: quarantined",
        Explanation::PendingCircuitOpen => "Pending: circuit open",
        Explanation::PendingEndpointDisabled => "Pending: endpoint disabled",
        Explanation::EndedWithoutAttempt => "Ended without attempt",
        Explanation::BeforeLedger => "Before the ledger",
        Explanation::SchemaChanged => "Schema changed",
        Explanation::EventArchived => "Event archived",
        Explanation::OperationalEvent => "Operational event",
        Explanation::LateAttempt => "Attempt recorded late",
    }
}

/// Why such a difference is expected, in one sentence.
pub(super) fn explanation_sentence(reason: Explanation) -> &'static str {
    match reason {
        Explanation::FilteredByRule => {
            "A capture rule's condition or operations left these changes out on purpose, so \
             they made no event."
        }
        Explanation::EndpointDisabled => {
            "The endpoint was disabled when the event occurred, so no delivery was owed to it."
        }
        Explanation::EndpointDeleted => {
            "The endpoint had been deleted before the event occurred, so no delivery was owed \
             to it."
        }
        Explanation::EventBeforeEndpoint => {
            "The event occurred before the endpoint was created, so no delivery was owed to it."
        }
        Explanation::TypeNotSubscribed => {
            "The endpoint's subscription did not list the event's type, so no delivery was owed \
             to it."
        }
        Explanation::TenantUnknown => {
            "The tenant is not registered, so its events reach no endpoint."
        }
        Explanation::TenantDisabled => "The tenant was disabled, so its events reach no endpoint.",
        Explanation::PendingQuarantined => {
            "These deliveries wait because their endpoint is quarantined, not because dispatch \
             stalled."
        }
        Explanation::PendingCircuitOpen => {
            "These deliveries wait because their endpoint's circuit breaker is open after \
             repeated failures, not because dispatch stalled."
        }
        Explanation::PendingEndpointDisabled => {
            "These deliveries wait because their endpoint, or its tenant, is disabled."
        }
        Explanation::EndedWithoutAttempt => {
            "These deliveries ended (exhausted or cancelled) without an attempt: their deadline \
             passed while they waited, or their endpoint was deleted."
        }
        Explanation::BeforeLedger => {
            "These events were committed before capture's ledger of their source began (or \
             came from a source without one), so the ledger cannot count them."
        }
        Explanation::SchemaChanged => {
            "A captured table's columns changed (added, dropped or retyped); its rows went on \
             as events of a new schema version, listed under the schema changes."
        }
        Explanation::EventArchived => {
            "These events are in archived days, so their deliveries are counted from the \
             archive's manifests instead of the hot tables."
        }
        Explanation::LateAttempt => {
            "A dispatcher node recorded these attempts after its lease had lapsed (it was \
             frozen or cut off while they were out); they stay in the history, and the delivery \
             is as the node that took it over left it."
        }
        Explanation::OperationalEvent => {
            "walhook made these events itself (test events, endpoint.disabled notices), so \
             their deliveries follow the request that made them, not the subscriptions."
        }
    }
}

/// One of the legend's sentences: escaped, with `--repair` kept on one line.
pub(super) struct Prose(pub(super) &'static str);

impl Display for Prose {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let escaped = Esc(self.0).to_string();
        f.write_str(&escaped.replace("--repair", "<code class=\"flag\">--repair</code>"))
    }
}
