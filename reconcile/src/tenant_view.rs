//! One tenant's view of a report: what a tenant may read of a run over
//! every tenant (its own funnel, its own gaps and explanations), as a
//! [`Report`] that [`crate::html::render`] draws like any other.
//!
//! A report over every tenant holds other tenants' ids, counts and gaps,
//! and rows that are about no tenant in particular (capture's ledger per
//! rule, archived days, explanations without a tenant, the funnel over
//! everyone). None of that is the tenant's to read: the view keeps only
//! what names the tenant, and makes the whole report's summary (funnel,
//! gap counts, repairs, verdict and data hash) again from that alone.
//!
//! The view starts from a clone of the report and clears what it cannot
//! keep, rather than building a new one field by field: a field added to
//! [`Report`] later must be judged here (kept, filtered or cleared), and
//! the unit test below, which looks for another tenant anywhere in the
//! view's JSON, fails until it is.

use std::collections::BTreeMap;

use crate::report::{Funnel, GapClass, Repair, Report};

/// The part of `report` that `tenant` may read, sealed again (its
/// `clean` and `data_sha256` are the view's own).
pub fn for_tenant(report: &Report, tenant: &str) -> Report {
    let mine = |t: &Option<String>| t.as_deref() == Some(tenant);
    let mut view = report.clone();
    let own = report.tenants.iter().find(|t| t.tenant == tenant);
    view.parameters.tenant = Some(tenant.to_owned());
    // Capture counts changes, checks its coverage of each source and
    // records schema changes before any tenant is known; archived days
    // are counted over every tenant.
    view.capture.clear();
    view.capture_coverage.clear();
    view.schema_changes.clear();
    view.archive.clear();
    view.funnel = own.map_or_else(Funnel::default, |t| t.funnel.clone());
    view.tenants.retain(|t| t.tenant == tenant);
    view.explained.retain(|e| mine(&e.tenant));
    // A source capture had not confirmed past the window's end leaves every
    // tenant's funnel incomplete: its `capture_behind` gap (about a source,
    // never a tenant) stays, so the tenant's view is not clean either.
    view.gaps
        .retain(|g| mine(&g.tenant) || g.class == GapClass::CaptureBehind);
    view.gap_counts = BTreeMap::new();
    for g in &view.gaps {
        *view.gap_counts.entry(g.class).or_default() += 1;
    }
    // The tenant's gaps past the report's list are counted in its funnel
    // row only (by class, the list is all there is).
    let listed = view.gaps.len() as u64;
    view.gaps_not_listed = own.map_or(0, |t| t.gaps.saturating_sub(listed));
    view.repairs = report
        .repairs
        .iter()
        .filter_map(|r| {
            let repaired = view
                .gaps
                .iter()
                .filter(|g| g.class == r.class && g.repaired)
                .count() as u64;
            (repaired > 0).then(|| Repair {
                class: r.class,
                repaired,
                action: r.action.clone(),
            })
        })
        .collect();
    view.seal();
    if view.gaps_not_listed > 0 {
        // Gaps the list did not carry are open as far as the view knows.
        view.clean = false;
    }
    view
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{
        ArchiveDay, CaptureRow, Explained, Explanation, Gap, GapClass, Parameters, TenantFunnel,
    };

    fn gap(class: GapClass, tenant: Option<&str>, id: &str, repaired: bool) -> Gap {
        Gap {
            id: format!("{}:{id}", class.as_str()),
            class,
            tenant: tenant.map(str::to_owned),
            event_id: None,
            delivery_id: Some(id.to_owned()),
            endpoint_id: None,
            detail: format!("about {id}"),
            repaired,
        }
    }

    fn funnel(events: u64) -> Funnel {
        Funnel {
            events,
            expected_deliveries: events,
            materialised_deliveries: events,
            ..Funnel::default()
        }
    }

    fn report() -> Report {
        let base = crate::report::tests::report();
        let mut r = Report {
            parameters: Parameters {
                repair: true,
                ..base.parameters
            },
            capture: vec![CaptureRow {
                source: "shop".into(),
                rule: "globex_orders".into(),
                changes: 9001,
                events: 9001,
                filtered: 0,
                incidents: 0,
                first_commit_lsn: None,
                last_commit_lsn: None,
            }],
            funnel: funnel(9004),
            tenants: vec![
                TenantFunnel {
                    tenant: "acme".into(),
                    funnel: funnel(3),
                    gaps: 2,
                },
                TenantFunnel {
                    tenant: "globex".into(),
                    funnel: funnel(9001),
                    gaps: 1,
                },
            ],
            explained: vec![
                Explained {
                    reason: Explanation::TypeNotSubscribed,
                    tenant: Some("acme".into()),
                    count: 1,
                },
                Explained {
                    reason: Explanation::TenantDisabled,
                    tenant: Some("globex".into()),
                    count: 7,
                },
                Explained {
                    reason: Explanation::FilteredByRule,
                    tenant: None,
                    count: 5,
                },
            ],
            archive: vec![ArchiveDay {
                table: "deliveries".into(),
                day: "2026-11-29".into(),
                generation: 1,
                state: walhook_archive::PartitionState::Verified.into(),
                rows: 9999,
                files: 1,
                verified: true,
                problem: None,
            }],
            gap_counts: BTreeMap::from([
                (GapClass::MissingDelivery, 2),
                (GapClass::OverduePending, 1),
                (GapClass::CaptureIncident, 1),
            ]),
            gaps: vec![
                gap(GapClass::MissingDelivery, Some("acme"), "dlv_acme1", true),
                gap(
                    GapClass::MissingDelivery,
                    Some("globex"),
                    "dlv_globex1",
                    true,
                ),
                gap(GapClass::OverduePending, Some("acme"), "dlv_acme2", false),
                gap(GapClass::CaptureIncident, None, "shop:globex_orders", false),
            ],
            repairs: vec![Repair {
                class: GapClass::MissingDelivery,
                repaired: 2,
                action: "made the missing deliveries".into(),
            }],
            ..base
        };
        r.seal();
        r
    }

    #[test]
    fn a_tenant_reads_its_own_funnel_and_gaps_and_nothing_of_another() {
        let view = for_tenant(&report(), "acme");
        assert_eq!(view.funnel, funnel(3));
        assert_eq!(view.parameters.tenant.as_deref(), Some("acme"));
        let ids: Vec<&str> = view.gaps.iter().map(|g| g.id.as_str()).collect();
        assert_eq!(
            ids,
            ["missing_delivery:dlv_acme1", "overdue_pending:dlv_acme2"]
        );
        assert_eq!(
            view.gap_counts,
            BTreeMap::from([
                (GapClass::MissingDelivery, 1),
                (GapClass::OverduePending, 1)
            ])
        );
        assert_eq!(view.repairs.len(), 1);
        assert_eq!(view.repairs[0].repaired, 1);
        assert_eq!(view.open_gaps(), 1);
        assert!(!view.clean);
        assert_eq!(view.data_sha256, view.data_hash());
        // Nothing of globex, nor any count over every tenant, anywhere in
        // the view: not its id, not its rule, not its numbers.
        let json = serde_json::to_string(&view).unwrap();
        for leak in [
            "globex",
            "9001",
            "9004",
            "9999",
            "dlv_globex1",
            "\"count\":5",
        ] {
            assert!(!json.contains(leak), "{leak} in {json}");
        }
        let html = crate::html::render_tenant_view(&view);
        for leak in ["globex", "9,001", "9,004", "9,999"] {
            assert!(!html.contains(leak), "{leak} in the page");
        }
        // The contents list what the page draws, and only that: the
        // sections about capture and the archive as a whole are not the
        // tenant's, and are neither drawn nor listed.
        for id in ["gap-classes", "tenants", "gaps", "repairs"] {
            assert!(html.contains(&format!("href=\"#{id}\"")), "{id} not listed");
            assert!(html.contains(&format!("<h2 id=\"{id}\"")), "{id} not drawn");
        }
        for id in ["archive", "coverage", "schema-changes", "capture"] {
            assert!(!html.contains(&format!("href=\"#{id}\"")), "{id} listed");
            assert!(!html.contains(&format!("<h2 id=\"{id}\"")), "{id} drawn");
        }
        let full = crate::html::render(&report());
        assert!(full.contains("href=\"#capture\"") && full.contains("<h2 id=\"capture\""));
    }

    #[test]
    fn a_tenant_without_activity_in_the_window_reads_an_empty_clean_view() {
        let view = for_tenant(&report(), "initech");
        assert_eq!(view.funnel, Funnel::default());
        assert!(view.gaps.is_empty() && view.tenants.is_empty());
        assert!(view.clean);
    }

    #[test]
    fn gaps_past_the_list_keep_the_view_from_being_clean() {
        let mut r = report();
        r.tenants[0].gaps = 5;
        let view = for_tenant(&r, "acme");
        assert_eq!(view.gaps_not_listed, 3);
        assert!(!view.clean);
    }

    #[test]
    fn a_window_capture_had_not_covered_is_not_clean_for_any_tenant() {
        let mut r = report();
        r.gaps
            .push(gap(GapClass::CaptureBehind, None, "shop", false));
        r.seal();
        let view = for_tenant(&r, "initech");
        assert_eq!(view.gaps.len(), 1, "{:?}", view.gaps);
        assert_eq!(view.gaps[0].class, GapClass::CaptureBehind);
        assert!(!view.clean);
    }
}
