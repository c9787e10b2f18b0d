//! `docs/analytics.md` runs: every `sql` block, in order, in one DuckDB
//! session over a real archive in which deliveries were replayed and days
//! archived again; each SELECT's answer equals its twin below, the same
//! question asked of the platform's rows as they were before they left
//! Postgres (`held.*`, kept up to date with the replays).

use crate::compaction::{Fixture, duckdb};
use crate::support::Kind;

/// The platform's answer to each SELECT of the page, in order: one
/// `json_build_array` per row.
const TWINS: &[&str] = &[
    "SELECT json_build_array('deliveries', count(*), count(DISTINCT id)) FROM held.deliveries \
     UNION ALL SELECT json_build_array('attempts', count(*), count(DISTINCT id)) FROM held.attempts \
     UNION ALL SELECT json_build_array('events', count(*), count(DISTINCT id)) FROM held.events",
    "SELECT json_build_array(endpoint_id::text, extract(epoch FROM date_trunc('hour', started_at))::float8, \
     avg(CASE WHEN outcome = 'succeeded' THEN 1 ELSE 0 END)::float8, count(*)) \
     FROM held.attempts GROUP BY endpoint_id, date_trunc('hour', started_at)",
    "SELECT json_build_array(d.tenant_id, percentile_cont(0.99) WITHIN GROUP (ORDER BY \
     floor(extract(epoch FROM a.started_at) * 1000) - floor(extract(epoch FROM d.event_occurred_at) * 1000))) \
     FROM held.deliveries d JOIN held.attempts a ON a.delivery_id = d.id AND a.number = 1 \
     AND a.trigger = 'auto' GROUP BY d.tenant_id",
    "SELECT json_build_array(tenant_id, count(*)::float8 / count(DISTINCT delivery_id)) \
     FROM held.attempts GROUP BY tenant_id",
    "SELECT json_build_array(created_at::date::text, event_type, count(*)) FROM held.deliveries \
     GROUP BY created_at::date, event_type",
    "SELECT json_build_array(tenant_id, status::text, count(*), sum(attempt_count)) FROM held.deliveries \
     GROUP BY tenant_id, status",
    "SELECT json_build_array(tenant_id, count(*), count(DISTINCT delivery_id)) FROM held.attempts \
     WHERE trigger = 'manual' GROUP BY tenant_id",
];

/// The blocks of a Markdown page fenced with exactly `fence`.
fn blocks_fenced(page: &str, fence: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in page.lines() {
        match (&mut current, line.trim_start()) {
            (None, open) if open == fence => current = Some(String::new()),
            (Some(b), "```") => {
                blocks.push(std::mem::take(b));
                current = None;
            }
            (Some(b), _) => {
                b.push_str(line);
                b.push('\n');
            }
            _ => {}
        }
    }
    blocks
}

/// A row made comparable: numbers to six decimals, the rest as JSON.
fn norm(row: &[serde_json::Value]) -> Vec<String> {
    row.iter()
        .map(|v| match v.as_f64() {
            Some(x) => format!("{x:.6}"),
            None => v.to_string(),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_duckdb_query_of_the_analytics_page_answers_as_the_platform_did() {
    answers_as_the_platform_did(Kind::Local).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_duckdb_query_of_the_analytics_page_answers_the_same_over_s3() {
    answers_as_the_platform_did(Kind::S3).await;
}

/// The page's blocks in one DuckDB session over an archive in a store of
/// `kind` (for S3, the page's S3 block in place of the local views, its
/// placeholders filled with the test server's), each SELECT's answer
/// compared with its twin.
async fn answers_as_the_platform_did(kind: Kind) {
    let f = Fixture::new_in(kind).await;
    f.replay_two().await;
    f.archive_all().await;
    let page =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/analytics.md"))
            .unwrap();
    let mut blocks = blocks_fenced(&page, "```sql");
    assert!(blocks.len() >= 5, "{blocks:?}");
    if let Some(server) = &f.s3 {
        let s3 = blocks_fenced(&page, "```sql s3");
        assert_eq!(s3.len(), 1, "one S3 block: {s3:?}");
        let host = server
            .endpoint()
            .trim_start_matches("http://")
            .trim_end_matches('/');
        let views = s3[0]
            .replace("INSTALL httpfs;", "")
            .replace("LOAD httpfs;", "LOAD '{httpfs}';")
            .replace("'ACCESS_KEY_ID'", &format!("'{}'", server.access_key()))
            .replace("'SECRET_ACCESS_KEY'", &format!("'{}'", server.secret_key()))
            .replace("'HOST:PORT'", &format!("'{host}'"))
            .replace("URL_STYLE 'path'", "URL_STYLE 'path', USE_SSL false")
            .replace(
                "s3://BUCKET/PREFIX/",
                &format!("s3://{}/cold/", server.bucket()),
            );
        blocks.retain(|b| !b.contains("CREATE VIEW"));
        blocks.insert(0, views);
        // DuckDB runs in an empty directory: every read goes to the server.
        std::fs::create_dir_all(f.root()).unwrap();
    }
    let answers = duckdb(&f.root(), &blocks);
    assert_eq!(
        answers.len(),
        TWINS.len(),
        "each SELECT of docs/analytics.md has its twin here: {:?}",
        answers.iter().map(|a| &a.0).collect::<Vec<_>>()
    );
    for ((query, rows), twin) in answers.iter().zip(TWINS) {
        let held: String = f
            .sql
            .query_one(
                &format!("SELECT coalesce(json_agg(r), '[]')::text FROM ({twin}) AS t(r)"),
                &[],
            )
            .await
            .unwrap()
            .get(0);
        let held: Vec<Vec<serde_json::Value>> = serde_json::from_str(&held).unwrap();
        let mut want: Vec<Vec<String>> = held.iter().map(|r| norm(r)).collect();
        let mut got: Vec<Vec<String>> = rows.iter().map(|r| norm(r)).collect();
        want.sort();
        got.sort();
        assert!(!got.is_empty(), "{query} answered nothing");
        assert_eq!(got, want, "{query}");
    }
}
