//! Archived history over HTTP: days of deliveries archived by the real
//! archiver into a real store, served by the API with the store counted as
//! it is read. Listings page through archived days with the hot listings'
//! cursor; a filter on another tenant's endpoint is a 404 before anything
//! is read; a tenant over its archive reads at once gets a 429 naming the
//! limit, and another tenant does not.

// Test code spawns freely.
#![allow(clippy::disallowed_methods)]

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use walhook_api::{ApiLimits, ApiSettings, ApiState, Metrics};
use walhook_archive::cold::{ColdHistory, ColdLimits, CountingStore};
use walhook_archive::objstore::{AnyStore, LocalDirStore};
use walhook_archive::{Archiver, Settings};
use walhook_devkit::history::History;
use walhook_devkit::postgres::LocalPostgres;
use walhook_pipeline::ids::{DeliveryId, EndpointId};
use walhook_pipeline::url_policy::UrlPolicy;

use crate::support::{Answer, Api, OPERATOR, options, serve};

/// An API over a platform database whose older days are archived.
struct ColdApi {
    _pg: LocalPostgres,
    _dir: tempfile::TempDir,
    sql: tokio_postgres::Client,
    base: String,
    http: reqwest::Client,
    cold: Arc<walhook_api::Cold>,
    _stop: tokio_util::sync::CancellationToken,
    /// Every delivery, newest first: (tenant, id as the API shows it,
    /// endpoint as the API shows it).
    deliveries: Vec<(String, String, String)>,
}

/// `days` days of `events` events a day for 2 tenants with 2 endpoints
/// each; every day but the last is archived, the last stays hot.
async fn start(days: u32, events: u64, limits: ApiLimits, cold_limits: ColdLimits) -> ColdApi {
    let pg = LocalPostgres::start().await.unwrap();
    let url = pg.create_database("platform").await.unwrap();
    let mut sql = pg.connect("platform").await.unwrap();
    walhook_sql::migrate::run(&mut sql).await.unwrap();
    let first = chrono::Utc::now().date_naive() - chrono::Duration::days(i64::from(days) + 5);
    let history = History {
        first_day: first.to_string(),
        days,
        events_per_day: events,
        tenants: 2,
        endpoints_per_tenant: 2,
        first_lsn: 0x16_0000_0000,
    };
    sql.batch_execute(&history.setup_sql()).await.unwrap();
    for d in 0..days {
        sql.batch_execute(&history.day_sql(d)).await.unwrap();
    }
    let last = first + chrono::Duration::days(i64::from(days) - 1);
    // Every delivery, as the hot table had it before the archive; the
    // archive keeps the same ids and order.
    let mut deliveries = Vec::new();
    for r in sql
        .query(
            "SELECT tenant_id, id, endpoint_id FROM walhook.deliveries \
             ORDER BY created_at DESC, id DESC",
            &[],
        )
        .await
        .unwrap()
    {
        deliveries.push((
            r.get::<_, String>(0),
            DeliveryId(*r.get::<_, uuid::Uuid>(1).as_bytes()).to_string(),
            EndpointId(*r.get::<_, uuid::Uuid>(2).as_bytes()).to_string(),
        ));
    }
    let dir = tempfile::tempdir().unwrap();
    let store = AnyStore::Local(LocalDirStore::open(dir.path().join("archive")).unwrap());
    let archiver_platform = walhook_sql::Platform::new(&url, 2).unwrap();
    Archiver::new(
        archiver_platform,
        store.clone(),
        Settings {
            hot_days: 1,
            today: Some(last + chrono::Duration::days(1)),
            ..Settings::default()
        },
    )
    .run(&walhook_archive::archiver::Silent)
    .await
    .unwrap();
    let hot: i64 = sql
        .query_one("SELECT count(*) FROM walhook.deliveries", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(hot, (events * 2) as i64, "the last day stays hot");
    let platform = walhook_api::connect(&options(&url), &limits)
        .unwrap()
        .with_keyring(walhook_sql::Keyring::ephemeral());
    let mut settings = ApiSettings::new(
        OPERATOR,
        UrlPolicy {
            allow_http_loopback: true,
            ..UrlPolicy::default()
        },
    );
    settings.limits = limits;
    let cold = Arc::new(ColdHistory::with_limits(
        platform.clone(),
        CountingStore::new(store),
        Duration::from_secs(3650 * 86_400),
        cold_limits,
    ));
    let state = ApiState::new(platform, settings, Arc::new(Metrics::new()))
        .with_cold(cold.clone())
        .unwrap();
    let (base, stop) = serve(state).await;
    ColdApi {
        _pg: pg,
        _dir: dir,
        sql,
        base,
        http: reqwest::Client::new(),
        cold,
        _stop: stop,
        deliveries,
    }
}

impl ColdApi {
    /// The deliveries archived only (the hot table lost them).
    async fn archived_ids(&self, tenant: &str) -> Vec<String> {
        let hot: Vec<String> = self
            .sql
            .query("SELECT id FROM walhook.deliveries", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| DeliveryId(*r.get::<_, uuid::Uuid>(0).as_bytes()).to_string())
            .collect();
        self.deliveries
            .iter()
            .filter(|d| d.0 == tenant && !hot.contains(&d.1))
            .map(|d| d.1.clone())
            .collect()
    }

    async fn key(&self, tenant: &str) -> String {
        let k = self
            .http
            .post(format!("{}/v1/tenants/{tenant}/api-keys", self.base))
            .bearer_auth(OPERATOR)
            .json(&json!({"name": "tests"}))
            .send()
            .await
            .unwrap();
        let answer = Api::answer(k).await;
        assert_eq!(answer.status, 201, "{answer:?}");
        answer.body["key"].as_str().unwrap().to_owned()
    }

    async fn get(&self, key: &str, path: &str) -> Answer {
        Api::answer(
            self.http
                .get(format!("{}{path}", self.base))
                .bearer_auth(key)
                .send()
                .await
                .unwrap(),
        )
        .await
    }

    /// Every page of `query` (pages of `limit`): the ids in order, and the
    /// pages' sizes.
    async fn page_through(
        &self,
        key: &str,
        query: &str,
        limit: usize,
    ) -> (Vec<String>, Vec<usize>) {
        let mut ids = Vec::new();
        let mut sizes = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut path = format!("/v1/webhook-deliveries?limit={limit}{query}");
            if let Some(c) = &cursor {
                path.push_str(&format!("&cursor={c}"));
            }
            let page = self.get(key, &path).await;
            assert_eq!(page.status, 200, "{page:?}");
            let data = page.body["data"].as_array().unwrap();
            assert!(data.len() <= limit);
            sizes.push(data.len());
            ids.extend(data.iter().map(|d| d["id"].as_str().unwrap().to_owned()));
            match page.body["next_cursor"].as_str() {
                Some(c) => cursor = Some(c.to_owned()),
                None => return (ids, sizes),
            }
            assert!(sizes.len() < 1000, "the listing does not end");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_pages_from_hot_rows_through_archived_days_with_one_cursor() {
    let api = start(
        5,
        30,
        ApiLimits::default(),
        ColdLimits {
            days_per_request: 1,
            ..ColdLimits::default()
        },
    )
    .await;
    let key = api.key("tenant-0").await;
    let (ids, sizes) = api.page_through(&key, "", 7).await;
    let want: Vec<String> = api
        .deliveries
        .iter()
        .filter(|d| d.0 == "tenant-0")
        .map(|d| d.1.clone())
        .collect();
    assert_eq!(ids.len(), 5 * 15 * 2);
    assert_eq!(ids, want, "not every delivery once, newest first");
    // A filter that matches none of the archived days: pages without rows,
    // each with a cursor, one archived day a request.
    let (ids, sizes_nothing) = api.page_through(&key, "&event_type=no.such.type", 50).await;
    assert!(ids.is_empty());
    assert_eq!(sizes_nothing.len(), 4, "one request per archived day");
    assert!(sizes.len() > 5 * 30 / 7);
    // The archived ones are read from the archive: the hot table lost them.
    assert_eq!(api.archived_ids("tenant-0").await.len(), 4 * 15 * 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filter_on_another_tenants_endpoint_is_404_before_any_archive_read() {
    let api = start(3, 10, ApiLimits::default(), ColdLimits::default()).await;
    let key = api.key("tenant-0").await;
    let theirs = api
        .deliveries
        .iter()
        .find(|d| d.0 == "tenant-1")
        .unwrap()
        .2
        .clone();
    let ours = api
        .deliveries
        .iter()
        .find(|d| d.0 == "tenant-0")
        .unwrap()
        .2
        .clone();
    let before = api.cold.store().totals();
    for path in [
        format!("/v1/webhook-deliveries?endpoint_id={theirs}"),
        format!("/v1/webhook-deliveries?endpoint_id={theirs}&status=failed&limit=3"),
        "/v1/webhook-deliveries?endpoint_id=ep_0000000000000000000000000a".to_owned(),
    ] {
        let answer = api.get(&key, &path).await;
        answer.problem(404);
        assert!(!answer.body.to_string().contains("tenant-1"), "{answer:?}");
    }
    assert_eq!(
        api.cold.store().totals(),
        before,
        "a refused listing read the archive"
    );
    // The tenant's own endpoint lists its archived deliveries.
    let (ids, _) = api
        .page_through(&key, &format!("&endpoint_id={ours}"), 50)
        .await;
    let want: Vec<String> = api
        .deliveries
        .iter()
        .filter(|d| d.0 == "tenant-0" && d.2 == ours)
        .map(|d| d.1.clone())
        .collect();
    assert_eq!(ids, want);
    assert!(api.cold.store().totals().reads > before.reads);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_past_its_cold_reads_at_once_gets_429_naming_the_limit() {
    let limits = ApiLimits {
        cold_reads_per_tenant: 1,
        ..ApiLimits::default()
    };
    let api = Arc::new(
        start(
            8,
            200,
            limits,
            ColdLimits {
                reads_per_tenant: limits.cold_reads_per_tenant,
                ..ColdLimits::default()
            },
        )
        .await,
    );
    let busy_key = api.key("tenant-0").await;
    let calm_key = api.key("tenant-1").await;
    let mut refused = Vec::new();
    for _round in 0..5 {
        let burst: Vec<_> = (0..16)
            .map(|_| {
                let api = api.clone();
                let key = busy_key.clone();
                tokio::spawn(async move {
                    api.get(
                        &key,
                        "/v1/webhook-deliveries?event_type=no.such.type&limit=50",
                    )
                    .await
                })
            })
            .collect();
        // Another tenant's listing of its archive is not held back.
        let calm = api
            .get(&calm_key, "/v1/webhook-deliveries?event_type=no.such.type")
            .await;
        assert_eq!(calm.status, 200, "{calm:?}");
        for task in burst {
            let answer = task.await.unwrap();
            match answer.status.as_u16() {
                200 => {}
                // Past the archive reads at once; or, before that, past
                // the tenant's requests at once (half the pool's 8).
                429 if answer.body["quota"]["limit_name"] == "cold_reads_per_tenant" => {
                    refused.push(answer)
                }
                429 if answer.body["quota"]["limit_name"] == "cold_reads_per_minute" => {}
                429 if answer.body["quota"]["limit_name"] == "requests_per_tenant" => {
                    assert_eq!(answer.body["quota"]["limit"], 4, "{answer:?}");
                    assert!(answer.headers.contains_key("retry-after"), "{answer:?}");
                }
                _ => panic!("{answer:?}"),
            }
        }
        if !refused.is_empty() {
            break;
        }
    }
    assert!(!refused.is_empty(), "16 listings at once, none refused");
    let answer = &refused[0];
    answer.problem(429);
    assert_eq!(answer.body["quota"]["limit_name"], "cold_reads_per_tenant");
    assert_eq!(answer.body["quota"]["limit"], 1);
    assert_eq!(answer.headers["retry-after"], "1");
    assert!(
        answer.body["detail"]
            .as_str()
            .unwrap()
            .contains("[api].cold_reads_per_tenant"),
        "{answer:?}"
    );
    // Counted where operators look.
    let metrics = crate::support::metrics_at(&api.http, &api.base).await;
    let refusals: u64 = metrics
        .lines()
        .find(|l| l.starts_with("walhook_api_cold_reads_refused_total "))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no refusal counter in\n{metrics}"));
    assert!(refusals >= refused.len() as u64);
    assert!(metrics.contains("walhook_api_cold_read_bytes_total "));
}

/// Reads one after the other are bounded too: past
/// `[api].cold_reads_per_minute` a tenant's next archive read is a 429
/// naming the limit with the wait, before anything is read; another
/// tenant reads on.
#[tokio::test]
async fn a_tenant_past_its_cold_reads_per_minute_gets_429_with_the_wait() {
    let limits = ApiLimits {
        cold_reads_per_minute: 1,
        ..ApiLimits::default()
    };
    let api = start(4, 50, limits, ColdLimits::default()).await;
    let (busy, calm) = (api.key("tenant-0").await, api.key("tenant-1").await);
    let path = "/v1/webhook-deliveries?event_type=no.such.type&limit=50";
    let first = api.get(&busy, path).await;
    assert_eq!(first.status, 200, "{first:?}");
    let bytes = api.cold.store().totals().bytes;
    let refused = api.get(&busy, path).await;
    refused.problem(429);
    assert_eq!(refused.body["quota"]["limit_name"], "cold_reads_per_minute");
    assert_eq!(refused.body["quota"]["limit"], 1);
    let wait: u64 = refused.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&wait), "{refused:?}");
    assert_eq!(
        api.cold.store().totals().bytes,
        bytes,
        "the refused read read nothing"
    );
    assert_eq!(api.get(&calm, path).await.status, 200);
}
