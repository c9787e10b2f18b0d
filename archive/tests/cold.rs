//! Cold reads against a real archive: listings page through archived days
//! with the hot listings' cursor, each request within its budget of days
//! and bytes (counted by a wrapper around the real store); a lookup by id
//! reads one day's objects; a tenant's reads at once are capped; the cache
//! of manifests and footers stays within its bound.

// Test code spawns freely.
#![allow(clippy::disallowed_methods)]

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use uuid::Uuid;
use walhook_archive::ArchiveError;
use walhook_archive::cold::{ColdHistory, ColdLimits, CountingStore};
use walhook_pipeline::delivery::DeliveryStatus;
use walhook_pipeline::ids::{DeliveryId, EndpointId, TenantId};
use walhook_pipeline::objstore::{ObjectInfo, ObjectStore, ObjectStoreError, PutReceipt};

use crate::support::{Kind, Row, archived, archived_with, filter, history, page_through};

/// Ids of a paged listing, in the order the pages gave them.
fn flatten(requests: &[crate::support::Request]) -> Vec<Uuid> {
    requests.iter().flat_map(|r| r.ids.clone()).collect()
}

fn assert_once(ids: &[Uuid]) {
    let set: HashSet<&Uuid> = ids.iter().collect();
    assert_eq!(set.len(), ids.len(), "a delivery was listed twice");
}

async fn paging_returns_every_match_once_newest_first(kind: Kind) {
    let a = archived(history(5, 60, 3, 2), kind).await;
    let cold = a.cold(ColdLimits {
        days_per_request: 2,
        ..ColdLimits::default()
    });
    // Everything of a tenant, pages of 7.
    let requests = page_through(&cold, filter("tenant-1"), 7).await;
    let got = flatten(&requests);
    let want = a.expected("tenant-1", |_| true);
    assert_eq!(want.len(), 5 * 20 * 2);
    assert_eq!(got, want, "not every delivery, or not newest first");
    assert_once(&got);
    // Every request read at most two days' objects.
    for r in &requests {
        let days: HashSet<&str> = r.keys.iter().filter_map(|k| k.split('/').nth(1)).collect();
        assert!(days.len() <= 2, "{days:?}");
    }

    // A filter that matches a few rows a day: short pages with a cursor
    // where the day budget ran out, the same rows in the end.
    let mut failed = filter("tenant-0");
    failed.status = Some(DeliveryStatus::Failed);
    let requests = page_through(&cold, failed, 3).await;
    let got = flatten(&requests);
    assert_eq!(got, a.expected("tenant-0", |r| r.status == "failed"));
    assert!(!got.is_empty());
    assert_once(&got);

    // One endpoint, one event type, inside a time window.
    let endpoint = a
        .deliveries
        .iter()
        .find(|r| r.tenant == "tenant-2")
        .unwrap()
        .endpoint;
    let since = a.deliveries[a.deliveries.len() * 3 / 4].created_at;
    let until = a.deliveries[a.deliveries.len() / 4].created_at;
    let mut narrow = filter("tenant-2");
    narrow.endpoint = Some(EndpointId(*endpoint.as_bytes()));
    narrow.event_type = Some("invoice.paid".into());
    narrow.since = Some(since);
    narrow.until = Some(until);
    let got = flatten(&page_through(&cold, narrow, 5).await);
    let want = a.expected("tenant-2", |r: &Row| {
        r.endpoint == endpoint
            && r.event_type == "invoice.paid"
            && r.created_at >= since
            && r.created_at < until
    });
    assert!(!want.is_empty());
    assert_eq!(got, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paging_through_archived_days_returns_every_match_once_newest_first() {
    paging_returns_every_match_once_newest_first(Kind::Local).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paging_through_archived_days_on_s3_returns_every_match_once_newest_first() {
    paging_returns_every_match_once_newest_first(Kind::S3).await;
}

/// Three days of 30,000 deliveries of one tenant (several pages of each
/// column a day).
async fn big_days(kind: Kind) -> crate::support::Archived {
    archived(history(3, 30_000, 1, 1), kind).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_holds_to_its_budget_of_days_and_bytes() {
    let a = big_days(Kind::Local).await;
    let archive_bytes: i64 = a
        .sql
        .query_one(
            "SELECT sum(byte_count)::int8 FROM walhook.archive_partitions WHERE table_name = 'deliveries'",
            &[],
        )
        .await
        .unwrap()
        .get(0);

    // A listing that matches nothing: one day per request, through all
    // three, each request under its bytes, together a sliver of the archive.
    let budget = 1024 * 1024;
    let cold = a.cold(ColdLimits {
        days_per_request: 1,
        bytes_per_request: budget,
        ..ColdLimits::default()
    });
    let mut nothing = filter("tenant-0");
    nothing.event_type = Some("no.such.type".into());
    let requests = page_through(&cold, nothing, 50).await;
    assert_eq!(requests.len(), 3, "one request per archived day");
    let mut total = 0;
    for r in &requests {
        assert!(r.ids.is_empty());
        assert!(
            r.bytes <= budget,
            "{} bytes read, the budget is {budget}",
            r.bytes
        );
        let days: HashSet<&str> = r.keys.iter().filter_map(|k| k.split('/').nth(1)).collect();
        assert!(days.len() <= 1, "{days:?}");
        total += r.bytes;
    }
    assert!(
        total * 10 < archive_bytes as u64,
        "{total} bytes read of an archive of {archive_bytes}"
    );

    // A filter that matches one row in ten, with a budget smaller than a
    // day: the cursor lands inside days, and still every row comes once.
    let budget = 650 * 1024;
    let cold = a.cold(ColdLimits {
        bytes_per_request: budget,
        ..ColdLimits::default()
    });
    let mut failed = filter("tenant-0");
    failed.status = Some(DeliveryStatus::Failed);
    let requests = page_through(&cold, failed, 250).await;
    let got = flatten(&requests);
    assert_eq!(got, a.expected("tenant-0", |r| r.status == "failed"));
    assert_once(&got);
    for r in &requests {
        assert!(
            r.bytes <= budget,
            "{} bytes read, the budget is {budget}",
            r.bytes
        );
    }
    // Some pages ended inside a day, at a cursor the budget set.
    let inside = requests
        .iter()
        .filter_map(|r| r.cursor)
        .filter(|(at, id)| {
            id.is_nil() && at.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() % 86_400 != 0
        })
        .count();
    assert!(inside > 0, "the budget never cut a day short");
}

/// A delivery of a test event (an id not led by an LSN) on the second day,
/// and one fanned out just after midnight for an event of the first day
/// (an id inside the first day's range, made on the second).
const STRAYS: &str = "SET TIME ZONE 'UTC';
INSERT INTO walhook.events (id, tenant_id, event_type, schema_version, object_id, object_version,
    occurred_at, source, commit_lsn, tx_ordinal, payload, payload_sha256)
VALUES ('f00dfeed-1234-4000-8000-000000000001', 'tenant-0', 'order.created', 1, 'test', NULL,
        '2026-03-02 12:00:00', 'walhook.api', '0/0', 0, '{\"test\":1}', sha256('{\"test\":1}')),
       (('00000016' || lpad(to_hex(30 * 4096 + 1), 8, '0') || '4000800000000002')::uuid,
        'tenant-0', 'order.created', 1, 'lag', NULL, '2026-03-01 23:59:59.9', 'history',
        '0/0'::pg_lsn + (x'1600000000'::int8 + 30 * 4096 + 1)::numeric, 0, '{\"lag\":1}', sha256('{\"lag\":1}'));
INSERT INTO walhook.deliveries (id, event_id, endpoint_id, tenant_id, event_type, event_occurred_at,
    endpoint_config_version, status, attempt_count, next_attempt_at, expires_at, created_at, updated_at,
    last_http_status)
SELECT (encode(substring(uuid_send(ev.id) FROM 1 FOR 8) || substring(sha256(
           '\\x0000000000000013'::bytea || convert_to('walhook.delivery.v2', 'UTF8')
           || '\\x0000000000000010'::bytea || uuid_send(ev.id)
           || '\\x0000000000000010'::bytea || uuid_send(ep.id)) FROM 1 FOR 8), 'hex'))::uuid,
       ev.id, ep.id, ev.tenant_id, ev.event_type, ev.occurred_at, 1, 'succeeded', 1,
       ev.occurred_at, ev.occurred_at + interval '1 day',
       greatest(ev.occurred_at, '2026-03-02 00:00:01'), greatest(ev.occurred_at, '2026-03-02 00:00:01'), 200
FROM walhook.events ev JOIN walhook.endpoints ep ON ep.tenant_id = ev.tenant_id
WHERE ev.object_id IN ('test', 'lag');
INSERT INTO walhook.attempts (id, delivery_id, endpoint_id, tenant_id, number, trigger,
    endpoint_config_version, started_at, finished_at, http_status, latency_ms, outcome)
SELECT md5(d.id::text || 'stray')::uuid, d.id, d.endpoint_id, d.tenant_id, 1, 'auto', 1,
       d.created_at + interval '10 ms', d.created_at + interval '15 ms', 200, 5, 'succeeded'
FROM walhook.deliveries d JOIN walhook.events ev ON ev.id = d.event_id
WHERE ev.object_id IN ('test', 'lag');";

async fn a_lookup_reads_one_day(kind: Kind) {
    let a = archived_with(history(6, 60, 2, 1), kind, STRAYS).await;
    let cold = a.cold(ColdLimits::default());
    let tenant = TenantId::new("tenant-0").unwrap();

    // Every delivery day is indexed; the lagging delivery is an exception.
    let indexed: i64 = a
        .sql
        .query_one(
            "SELECT count(*) FROM walhook.archive_partitions WHERE table_name = 'deliveries' AND indexed",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(indexed, 6);
    let exceptions: i64 = a
        .sql
        .query_one("SELECT count(*) FROM walhook.archive_id_exceptions", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(exceptions, 1);

    let day_of = |r: &Row| {
        chrono::DateTime::<chrono::Utc>::from(r.created_at)
            .date_naive()
            .to_string()
    };
    let picks: Vec<Row> = a
        .deliveries
        .iter()
        .filter(|r| r.tenant == "tenant-0")
        .step_by(17)
        .cloned()
        .chain(
            a.deliveries
                .iter()
                .filter(|r| {
                    r.id.to_string().starts_with("f00dfeed") || {
                        let b = r.id.as_bytes();
                        b[..8] == (0x16_0000_0000u64 + 30 * 4096 + 1).to_be_bytes()
                    }
                })
                .cloned(),
        )
        .collect();
    assert!(picks.len() > 6);
    for r in &picks {
        cold.store().take_keys();
        let id = DeliveryId(*r.id.as_bytes());
        let d = cold
            .delivery(&tenant, id, None)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{} not found", r.id));
        assert_eq!(d.id, id);
        let day = day_of(r);
        let keys = cold.store().take_keys();
        assert!(!keys.is_empty());
        for k in &keys {
            assert!(
                k.starts_with(&format!("table=deliveries/date={day}/")),
                "looking up a delivery of {day} read {k}"
            );
        }
        // Its event: the day it occurred; its attempts: the days of its life.
        let event = cold
            .event(&tenant, &d, None)
            .await
            .unwrap()
            .expect("its event");
        assert_eq!(event.record.id, d.event_id);
        let attempts = cold.attempts(&tenant, &d, 0, None).await.unwrap();
        assert_eq!(attempts.len(), d.attempt_count as usize, "{}", r.id);
        let event_day = chrono::DateTime::<chrono::Utc>::from(d.event_occurred_at)
            .date_naive()
            .to_string();
        for k in cold.store().take_keys() {
            assert!(
                k.starts_with(&format!("table=events/date={event_day}/"))
                    || k.starts_with(&format!("table=attempts/date={day}/")),
                "the event and attempts of a delivery of {day} read {k}"
            );
        }
    }
    // Another tenant's delivery, and an id never archived: nothing read.
    let other = a
        .deliveries
        .iter()
        .find(|r| r.tenant == "tenant-1")
        .unwrap();
    assert!(
        cold.delivery(&tenant, DeliveryId(*other.id.as_bytes()), None)
            .await
            .unwrap()
            .is_none()
    );
    cold.store().take_keys();
    let before = cold.store().totals();
    assert!(
        cold.delivery(&tenant, DeliveryId([0xee; 16]), None)
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(
        cold.store().totals(),
        before,
        "an unknown id read the store"
    );

    // Days archived before the index existed are still searched.
    a.sql
        .batch_execute(
            "DELETE FROM walhook.archive_id_ranges; DELETE FROM walhook.archive_id_exceptions; \
             UPDATE walhook.archive_partitions SET indexed = false",
        )
        .await
        .unwrap();
    let cold = a.cold(ColdLimits::default());
    for r in &picks {
        let id = DeliveryId(*r.id.as_bytes());
        assert!(cold.delivery(&tenant, id, None).await.unwrap().is_some());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_by_id_reads_one_days_objects() {
    a_lookup_reads_one_day(Kind::Local).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_by_id_on_s3_reads_one_days_objects() {
    a_lookup_reads_one_day(Kind::S3).await;
}

/// The real store, with reads held until the test lets them go.
#[derive(Clone)]
struct Gate<S> {
    inner: S,
    open: Arc<tokio::sync::Semaphore>,
    waiting: Arc<tokio::sync::Notify>,
}

impl<S: ObjectStore> ObjectStore for Gate<S> {
    async fn put(&self, key: &str, bytes: bytes::Bytes) -> Result<PutReceipt, ObjectStoreError> {
        self.inner.put(key, bytes).await
    }
    async fn get(&self, key: &str) -> Result<Option<bytes::Bytes>, ObjectStoreError> {
        self.waiting.notify_one();
        drop(self.open.acquire().await.unwrap());
        self.inner.get(key).await
    }
    async fn get_range(
        &self,
        key: &str,
        range: std::ops::Range<u64>,
    ) -> Result<Option<bytes::Bytes>, ObjectStoreError> {
        self.waiting.notify_one();
        drop(self.open.acquire().await.unwrap());
        self.inner.get_range(key, range).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, ObjectStoreError> {
        self.inner.list(prefix).await
    }
    async fn delete(&self, key: &str) -> Result<(), ObjectStoreError> {
        self.inner.delete(key).await
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_reads_past_its_cap_are_refused_and_others_go_on() {
    let a = archived(history(2, 40, 2, 1), Kind::Local).await;
    let gate = Gate {
        inner: CountingStore::new(a.store.clone()),
        open: Arc::new(tokio::sync::Semaphore::new(0)),
        waiting: Arc::new(tokio::sync::Notify::new()),
    };
    let cold = Arc::new(ColdHistory::with_limits(
        a.platform.clone(),
        gate.clone(),
        Duration::from_secs(86_400),
        ColdLimits {
            reads_per_tenant: 1,
            ..ColdLimits::default()
        },
    ));
    // The first listing of tenant-0 holds its slot, stopped at a read.
    let waiting = gate.waiting.notified();
    let first = tokio::spawn({
        let cold = cold.clone();
        async move { cold.list_deliveries(&filter("tenant-0"), None, None).await }
    });
    waiting.await;
    let refused = cold
        .list_deliveries(&filter("tenant-0"), None, None)
        .await
        .unwrap_err();
    assert!(
        matches!(
            refused,
            ArchiveError::TenantReadsBusy {
                limit: 1,
                current: 1,
                ..
            }
        ),
        "{refused:?}"
    );
    let tenant = TenantId::new("tenant-0").unwrap();
    let id = DeliveryId(
        *a.deliveries
            .iter()
            .find(|r| r.tenant == "tenant-0")
            .unwrap()
            .id
            .as_bytes(),
    );
    assert!(matches!(
        cold.delivery(&tenant, id, None).await,
        Err(ArchiveError::TenantReadsBusy { .. })
    ));
    assert_eq!(cold.stats().refused, 2);
    assert_eq!(
        gate.inner.totals().reads,
        0,
        "a refused read touched the store"
    );
    // Another tenant is not held back by tenant-0's cap.
    gate.open.add_permits(1_000_000);
    let other = cold
        .list_deliveries(&filter("tenant-1"), None, None)
        .await
        .unwrap();
    assert_eq!(other.rows.len(), 40);
    let first = first.await.unwrap().unwrap();
    assert_eq!(first.rows.len(), 40);
    // The slot is free again.
    cold.list_deliveries(&filter("tenant-0"), None, None)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_of_manifests_and_footers_stays_within_its_bound() {
    let a = archived(history(8, 30, 3, 1), Kind::Local).await;
    let bound = 48 * 1024;
    let cold = a.cold(ColdLimits {
        cache_bytes: bound,
        days_per_request: 8,
        ..ColdLimits::default()
    });
    for tenant in ["tenant-0", "tenant-1", "tenant-2"] {
        let got = flatten(&page_through(&cold, filter(tenant), 9).await);
        assert_eq!(got, a.expected(tenant, |_| true));
        let stats = cold.stats();
        assert!(
            stats.cache_bytes <= bound && stats.cache_capacity == bound,
            "{stats:?}"
        );
        assert!(stats.cache_entries > 0);
    }
    // With room for everything, a second walk reads no manifest or footer.
    let roomy = a.cold(ColdLimits::default());
    page_through(&roomy, filter("tenant-0"), 500).await;
    let before = roomy.store().totals();
    roomy.store().take_keys();
    page_through(&roomy, filter("tenant-0"), 500).await;
    let keys = roomy.store().take_keys();
    assert!(
        keys.iter().all(|k| k.ends_with(".parquet")),
        "a cached manifest was read again: {keys:?}"
    );
    assert!(roomy.store().totals().reads > before.reads);
}
