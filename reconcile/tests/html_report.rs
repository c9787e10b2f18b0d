//! The auditor's HTML report, opened in a real browser: headless Chromium
//! driven through chromedriver (WebDriver). The test measures the funnel
//! chart as rendered, checks that hostile values show as text and nothing
//! runs, and keeps a screenshot next to the page in
//! `target/reconcile-report/` for people to look at.
//!
//! Chromium and chromedriver come from `scripts/ensure-chromium.sh`; without
//! them the test fails, unless `WALHOOK_SKIP_BROWSER=1` says to skip it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use futures::FutureExt as _;
use serde_json::json;
use walhook_archive::PartitionState;
use walhook_devkit::browser::{Driver, Session, tool};
use walhook_reconcile::html;
use walhook_reconcile::report::{
    ArchiveDay, CaptureRow, Explained, Explanation, FORMAT, Funnel, Gap, GapClass, Parameters,
    Repair, Report, SCHEMA_VERSION, TenantFunnel,
};

/// A tenant id written by an attacker: it must show as text, never run.
const HOSTILE: &str = "<script>alert(1)</script>\"'&amp;";

/// The funnel's stages in the order the chart draws them.
const STAGES: [&str; 10] = [
    "captured_changes",
    "captured_events",
    "events",
    "expected_deliveries",
    "materialised_deliveries",
    "attempted_deliveries",
    "terminal",
    "pending",
    "attempts_expected",
    "attempts_hot",
];

fn funnel(scale: u64) -> Funnel {
    Funnel {
        captured_changes: None,
        captured_events: None,
        events: 6_240 * scale,
        events_archived: 1_800 * scale,
        expected_deliveries: 4_430 * scale,
        materialised_deliveries: 4_429 * scale,
        attempted_deliveries: 4_390 * scale,
        succeeded: 4_180 * scale,
        failed: 96 * scale,
        exhausted: 31 * scale,
        cancelled: 12 * scale,
        pending_due: 48 * scale,
        pending_scheduled: 61 * scale,
        attempts_expected: 5_120 * scale,
        attempts_hot: 5_118 * scale,
        deliveries_archived: 7_020 * scale,
        attempts_archived: 8_310 * scale,
    }
}

fn gap(class: GapClass, subject: &str, tenant: &str, detail: &str) -> Gap {
    Gap {
        id: format!("{class}:{subject}"),
        class,
        tenant: Some(tenant.to_owned()),
        event_id: Some("evt_2Yb7kq0c4d1e9f8a".to_owned()),
        delivery_id: subject.starts_with("dlv_").then(|| subject.to_owned()),
        endpoint_id: Some("ep_7Hn2q9WzVb3m".to_owned()),
        detail: detail.to_owned(),
        repaired: false,
    }
}

/// A realistic day: two tenants (one of them hostile), explained
/// differences, gaps of several classes, an archive day with a problem and
/// a repair.
fn report() -> Report {
    let acme = funnel(2);
    let hostile = funnel(1);
    let mut total = Funnel::default();
    for f in [&acme, &hostile] {
        total.events += f.events;
        total.events_archived += f.events_archived;
        total.expected_deliveries += f.expected_deliveries;
        total.materialised_deliveries += f.materialised_deliveries;
        total.attempted_deliveries += f.attempted_deliveries;
        total.succeeded += f.succeeded;
        total.failed += f.failed;
        total.exhausted += f.exhausted;
        total.cancelled += f.cancelled;
        total.pending_due += f.pending_due;
        total.pending_scheduled += f.pending_scheduled;
        total.attempts_expected += f.attempts_expected;
        total.attempts_hot += f.attempts_hot;
        total.deliveries_archived += f.deliveries_archived;
        total.attempts_archived += f.attempts_archived;
    }
    total.captured_changes = Some(21_380);
    total.captured_events = Some(18_722);
    let mut overdue = gap(
        GapClass::OverduePending,
        "dlv_0f3a9c2b7e11",
        "acme",
        "due since 2025-03-01T22:41:00Z (1h19m past the grace) and no live lease",
    );
    overdue.repaired = true;
    let mut missing = gap(
        GapClass::MissingDelivery,
        "evt_2Yb7kq0c4d1e9f8a/ep_7Hn2q9WzVb3m",
        HOSTILE,
        "subscription version 4 of the endpoint lists invoice.paid; no delivery exists",
    );
    missing.delivery_id = None;
    let mut archive = gap(
        GapClass::ArchiveMismatch,
        "attempts/2025-03-01/g1/part-0003.parquet",
        "acme",
        "object part-0003.parquet: SHA-256 differs from the manifest <b>&amp;</b>",
    );
    archive.tenant = None;
    archive.event_id = None;
    archive.endpoint_id = None;
    let mut report = Report {
        format: FORMAT.to_owned(),
        schema_version: SCHEMA_VERSION,
        software_version: "0.1.0 (7c1e2f4)".to_owned(),
        generated_at: "2025-03-02T00:07:12Z".to_owned(),
        parameters: Parameters {
            since: "2025-03-01T00:00:00Z".to_owned(),
            until: "2025-03-02T00:00:00Z".to_owned(),
            tenant: None,
            repair: true,
            grace_seconds: 900,
            as_of: "2025-03-02T00:06:30Z".to_owned(),
        },
        capture: vec![
            CaptureRow {
                source: "billing".to_owned(),
                rule: "invoice.paid".to_owned(),
                changes: 14_902,
                events: 12_244,
                filtered: 2_656,
                incidents: 2,
                first_commit_lsn: Some("0/1A2B3C40".to_owned()),
                last_commit_lsn: Some("0/1F00A9D8".to_owned()),
            },
            CaptureRow {
                source: "billing".to_owned(),
                rule: "customer.updated".to_owned(),
                changes: 6_478,
                events: 6_478,
                filtered: 0,
                incidents: 0,
                first_commit_lsn: Some("0/1A2B4410".to_owned()),
                last_commit_lsn: Some("0/1F009F20".to_owned()),
            },
        ],
        capture_coverage: Vec::new(),
        schema_changes: Vec::new(),
        funnel: total,
        tenants: vec![
            TenantFunnel {
                tenant: "acme".to_owned(),
                funnel: acme,
                gaps: 3,
            },
            TenantFunnel {
                tenant: HOSTILE.to_owned(),
                funnel: hostile,
                gaps: 2,
            },
        ],
        explained: vec![
            Explained {
                reason: Explanation::FilteredByRule,
                tenant: None,
                count: 2_656,
            },
            Explained {
                reason: Explanation::TypeNotSubscribed,
                tenant: Some("acme".to_owned()),
                count: 7_980,
            },
            Explained {
                reason: Explanation::EndpointDisabled,
                tenant: Some(HOSTILE.to_owned()),
                count: 1_782,
            },
            Explained {
                reason: Explanation::PendingCircuitOpen,
                tenant: Some("acme".to_owned()),
                count: 40,
            },
            Explained {
                reason: Explanation::EventArchived,
                tenant: None,
                count: 5_400,
            },
        ],
        archive: vec![
            ArchiveDay {
                table: "events".to_owned(),
                day: "2025-03-01".to_owned(),
                generation: 1,
                state: PartitionState::Verified.into(),
                rows: 5_400,
                files: 2,
                verified: true,
                problem: None,
            },
            ArchiveDay {
                table: "attempts".to_owned(),
                day: "2025-03-01".to_owned(),
                generation: 1,
                state: PartitionState::Verified.into(),
                rows: 24_930,
                files: 4,
                verified: false,
                problem: Some(
                    "part-0003.parquet: SHA-256 3f9a… differs from the manifest's 88c1…".to_owned(),
                ),
            },
        ],
        gap_counts: BTreeMap::from([
            (GapClass::MissingDelivery, 1),
            (GapClass::OverduePending, 1),
            (GapClass::AttemptCountMismatch, 1),
            (GapClass::ArchiveMismatch, 1),
            (GapClass::CaptureIncident, 2),
        ]),
        gaps: vec![
            missing,
            overdue,
            gap(
                GapClass::AttemptCountMismatch,
                "dlv_91c0d2e4aa07",
                HOSTILE,
                "attempt_count is 4, the attempts table holds 3 rows",
            ),
            archive,
            gap(
                GapClass::CaptureIncident,
                "billing/2025-03-01T13:07",
                "acme",
                "rule invoice.paid: column tenant_id is NULL in 2 changes",
            ),
        ],
        gaps_not_listed: 1,
        repairs: vec![Repair {
            class: GapClass::OverduePending,
            repaired: 1,
            action: "re-enqueued 1 overdue delivery for dispatch".to_owned(),
        }],
        clean: false,
        data_sha256: String::new(),
    };
    report.seal();
    report
}

/// Where the report and its screenshot go: the workspace's
/// `target/reconcile-report/`, found at run time because CI shares one build
/// between checkouts.
fn output_dir() -> PathBuf {
    let manifest = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let dir = Path::new(&manifest)
        .join("..")
        .join("target")
        .join("reconcile-report");
    std::fs::create_dir_all(&dir).expect("the report directory");
    dir.canonicalize().expect("an absolute report directory")
}

#[tokio::test]
async fn the_report_reads_well_in_a_real_browser() {
    let report = report();
    assert_eq!(report.open_gaps(), 5);
    let page = html::render(&report);
    assert!(
        !page.to_lowercase().contains("<script"),
        "a script tag in the page"
    );
    assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;&quot;&#39;&amp;amp;"));
    let dir = output_dir();
    let file = dir.join("report.html");
    std::fs::write(&file, &page).expect("the report is written");
    eprintln!("report written to {}", file.display());

    let chromium = tool("WALHOOK_CHROMIUM", "/usr/bin/chromium");
    let chromedriver = tool("WALHOOK_CHROMEDRIVER", "/usr/bin/chromedriver");
    let (Some(chromium), Some(chromedriver)) = (chromium, chromedriver) else {
        if std::env::var("WALHOOK_SKIP_BROWSER").as_deref() == Ok("1") {
            println!(
                "SKIPPED the browser test of the HTML report (WALHOOK_SKIP_BROWSER=1): \
                 Chromium or chromedriver is not installed; the page was still written to {}",
                file.display()
            );
            return;
        }
        panic!(
            "Chromium (/usr/bin/chromium or WALHOOK_CHROMIUM) or chromedriver \
             (/usr/bin/chromedriver or WALHOOK_CHROMEDRIVER) is not installed: run \
             scripts/ensure-chromium.sh (or set WALHOOK_SKIP_BROWSER=1 to skip this test)"
        );
    };

    let driver = Driver::start(&chromedriver).await;
    let profile = tempfile::tempdir().expect("a profile directory");
    let session = Session::new(&driver, &chromium, profile.path()).await;
    // Close the browser whatever the checks find, then report what they found.
    let checks = std::panic::AssertUnwindSafe(check_page(&session, &report, &file, &dir));
    let outcome = checks.catch_unwind().await;
    session.close().await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

async fn check_page(session: &Session, report: &Report, file: &Path, dir: &Path) {
    let url = format!("file://{}", file.display());
    session.post("/url", json!({ "url": url })).await;

    let title = session.get("/title").await;
    assert_eq!(
        title.as_str(),
        Some("walhook reconciliation 2025-03-01T00:00:00Z to 2025-03-02T00:00:00Z")
    );
    assert!(
        session.find("script").await.is_empty(),
        "a script element exists"
    );
    assert!(
        session.find("img").await.is_empty(),
        "an img element exists"
    );

    // The verdict: visible text, above the fold.
    let verdict = session.find("#verdict").await;
    assert_eq!(verdict.len(), 1);
    assert_eq!(session.text(&verdict[0]).await, "5 open gaps");
    let [_, y, w, h] = session.rect(&verdict[0]).await;
    assert!(
        w > 0.0 && h > 0.0 && y < 400.0,
        "the verdict is not visible at the top"
    );

    // The hostile tenant shows as the very text it is.
    let mut shown = 0;
    for cell in session.find(".tenant").await {
        if session.text(&cell).await == HOSTILE {
            shown += 1;
        }
    }
    assert!(
        shown >= 3,
        "the hostile tenant is shown as text {shown} times, not >= 3"
    );

    // The funnel chart, as laid out by the browser.
    let viewport = session.rect(&session.find("html").await[0]).await[2];
    let chart = session.find("svg#funnel").await;
    assert_eq!(chart.len(), 1);
    let [cx, _, cw, _] = session.rect(&chart[0]).await;
    assert!(
        cx >= 0.0 && cx + cw <= viewport + 0.5,
        "the chart overflows the viewport"
    );
    let mut bars = Vec::new();
    for bar in session.find("svg#funnel rect.bar").await {
        let stage = session.attribute(&bar, "data-stage").await;
        let value: u64 = session
            .attribute(&bar, "data-value")
            .await
            .parse()
            .expect("a count");
        let [x, y, width, _] = session.rect(&bar).await;
        bars.push((stage, value, x, y, width));
    }
    let stages: Vec<&str> = bars.iter().map(|b| b.0.as_str()).collect();
    assert_eq!(stages, STAGES, "the chart's stages, in order");
    assert!(
        bars.windows(2).all(|p| p[0].3 < p[1].3),
        "bars are not drawn top to bottom"
    );
    let f = &report.funnel;
    let expected = [
        f.captured_changes.unwrap(),
        f.captured_events.unwrap(),
        f.events,
        f.expected_deliveries,
        f.materialised_deliveries,
        f.attempted_deliveries,
        f.succeeded + f.failed + f.exhausted + f.cancelled,
        f.pending_due + f.pending_scheduled,
        f.attempts_expected,
        f.attempts_hot,
    ];
    let (largest, widest) = bars
        .iter()
        .fold((0, 0.0f64), |(v, w), b| (v.max(b.1), w.max(b.4)));
    for ((stage, value, x, _, width), want) in bars.iter().zip(expected) {
        assert_eq!(*value, want, "{stage}: data-value");
        assert!(
            *width > 0.0,
            "{stage}: a count of {value} drawn {width} px wide"
        );
        assert!(
            *x >= 0.0 && x + width <= viewport + 0.5,
            "{stage}: outside the viewport"
        );
        // Drawn to scale: width / widest = value / largest, within a pixel.
        let scaled = widest * *value as f64 / largest as f64;
        assert!(
            (width - scaled).abs() < 1.0,
            "{stage}: {width} px, {scaled} px to scale"
        );
    }
    for a in &bars {
        for b in &bars {
            if a.1 > b.1 {
                assert!(
                    a.4 >= b.4,
                    "{} ({}) is narrower than {} ({})",
                    a.0,
                    a.1,
                    b.0,
                    b.1
                );
            }
        }
    }
    assert!(widest > 300.0, "the largest bar is only {widest} px wide");

    // Keep what the browser showed: the top of the page, and the chart.
    screenshot(session, "/screenshot", &dir.join("report.png")).await;
    let chart = format!("/element/{}/screenshot", chart[0]);
    screenshot(session, &chart, &dir.join("report-funnel.png")).await;
}

/// Saves a WebDriver screenshot (base64 PNG), checking it is a picture.
async fn screenshot(session: &Session, path: &str, file: &Path) {
    let png = session.get(path).await;
    let png = base64::engine::general_purpose::STANDARD
        .decode(png.as_str().expect("base64 text"))
        .expect("a base64 screenshot");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "{path} is not a PNG");
    assert!(
        png.len() > 10 * 1024,
        "{path} is {} bytes: blank?",
        png.len()
    );
    std::fs::write(file, &png).expect("the screenshot is written");
    eprintln!("screenshot written to {}", file.display());
}
