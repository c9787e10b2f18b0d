//! `walhook archive` against a real pipeline run: three days of events,
//! deliveries and attempts become Parquet that DuckDB and pyarrow read with
//! the same counts and aggregates the hot tables held; crashes at every step
//! end in the same objects as an uninterrupted run; corrupted, missing and
//! miscounted objects stop the drop with an error that names them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use walhook_devkit::receiver::Behaviour;

use crate::support::{Child, PLATFORM_ROLE, World, python, run, stderr, stdout, walhook};

const TODAY_PLUS: i64 = 5;

/// Aggregates of the hot tables, as the analysts' queries compute them.
const SNAPSHOT_SQL: &str = r#"
SELECT json_build_object(
  'events', (SELECT json_object_agg(tenant_id, n) FROM (SELECT tenant_id, count(*) n FROM walhook.events GROUP BY 1) x),
  'event_bytes', (SELECT sum(length(payload)) FROM walhook.events),
  'event_days', (SELECT count(DISTINCT (occurred_at AT TIME ZONE 'UTC')::date) FROM walhook.events),
  'deliveries', (SELECT json_object_agg(k, n) FROM (SELECT tenant_id || '/' || status k, count(*) n FROM walhook.deliveries GROUP BY 1) x),
  'deliveries_by_endpoint', (SELECT json_object_agg(endpoint_id, n) FROM (SELECT endpoint_id::text endpoint_id, count(*) n FROM walhook.deliveries GROUP BY 1) x),
  'attempts', (SELECT json_object_agg(k, n) FROM (SELECT endpoint_id || '/' || outcome k, count(*) n FROM walhook.attempts GROUP BY 1) x),
  'attempt_latency_ms', (SELECT sum(latency_ms) FROM walhook.attempts)
)::text
"#;

/// The same aggregates from the Parquet files, with DuckDB and with pyarrow.
const CHECKER: &str = r#"
import json, sys, uuid, collections
import duckdb, pyarrow.dataset as ds
root = sys.argv[1]
def glob(t): return f"{root}/table={t}/*/*/*.parquet"
con = duckdb.connect()
def q(sql): return con.execute(sql).fetchall()
duck = {
  "events": {t: n for t, n in q(f"SELECT tenant_id, count(*) FROM read_parquet('{glob('events')}', hive_partitioning=true) GROUP BY 1")},
  "event_bytes": q(f"SELECT sum(octet_length(payload)) FROM read_parquet('{glob('events')}')")[0][0],
  "event_days": q(f"SELECT count(DISTINCT date) FROM read_parquet('{glob('events')}', hive_partitioning=true)")[0][0],
  "deliveries": {k: n for k, n in q(f"SELECT tenant_id || '/' || status, count(*) FROM read_parquet('{glob('deliveries')}') GROUP BY 1")},
  "deliveries_by_endpoint": {str(k): n for k, n in q(f"SELECT endpoint_id::varchar, count(*) FROM read_parquet('{glob('deliveries')}') GROUP BY 1")},
  "attempts": {k: n for k, n in q(f"SELECT endpoint_id::varchar || '/' || outcome, count(*) FROM read_parquet('{glob('attempts')}') GROUP BY 1")},
  "attempt_latency_ms": q(f"SELECT sum(latency_ms) FROM read_parquet('{glob('attempts')}')")[0][0],
}
def table(t):
  return ds.dataset(f"{root}/table={t}", format="parquet", partitioning="hive").to_table()
def u(v): return str(uuid.UUID(bytes=v)) if isinstance(v, bytes) else str(v)
ev, de, at = table("events"), table("deliveries"), table("attempts")
arrow = {
  "events": dict(collections.Counter(ev.column("tenant_id").to_pylist())),
  "event_bytes": sum(len(p) for p in ev.column("payload").to_pylist()),
  "event_days": len(set(str(d) for d in ev.column("date").to_pylist())),
  "deliveries": dict(collections.Counter(f"{t}/{s}" for t, s in zip(de.column("tenant_id").to_pylist(), de.column("status").to_pylist()))),
  "deliveries_by_endpoint": dict(collections.Counter(u(e) for e in de.column("endpoint_id").to_pylist())),
  "attempts": dict(collections.Counter(f"{u(e)}/{o}" for e, o in zip(at.column("endpoint_id").to_pylist(), at.column("outcome").to_pylist()))),
  "attempt_latency_ms": sum(at.column("latency_ms").to_pylist()),
}
types = {f.name: str(f.type) for f in at.schema}
print(json.dumps({"duckdb": duck, "pyarrow": arrow, "types": types,
                  "duck_uuid_type": q(f"SELECT typeof(id) FROM read_parquet('{glob('attempts')}') LIMIT 1")[0][0]}))
"#;

fn archive(cfg: &Path, today: &str, env: &[(&str, &str)]) -> std::process::Output {
    archive_tables(cfg, today, &[], env)
}

/// `walhook archive` of `tables` (all when empty) with `today` and `env`.
fn archive_tables(
    cfg: &Path,
    today: &str,
    tables: &[&str],
    env: &[(&str, &str)],
) -> std::process::Output {
    let mut cmd = walhook();
    cmd.args(["archive", "--config"])
        .arg(cfg)
        .args(["--today", today]);
    for t in tables {
        cmd.args(["--table", t]);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    run(&mut cmd)
}

/// Every object under `root`: relative path → bytes.
fn objects(root: &Path) -> BTreeMap<String, Vec<u8>> {
    fn walk(dir: &Path, root: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if p.is_dir() {
                walk(&p, root, out);
            } else if name.starts_with('.') && name.contains(".tmp-") {
                // A put cut off by a SIGKILL leaves its temporary file
                // (`.<name>.tmp-<random>`); the store never lists it, and
                // the next put of the key writes a new one.
            } else {
                let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
                out.insert(rel, std::fs::read(&p).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    if root.exists() {
        walk(root, root, &mut out);
    }
    out
}

async fn hot_rows(sql: &tokio_postgres::Client) -> (i64, i64, i64) {
    let r = sql
        .query_one(
            "SELECT (SELECT count(*) FROM walhook.events), (SELECT count(*) FROM walhook.deliveries), \
             (SELECT count(*) FROM walhook.attempts)",
            &[],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1), r.get(2))
}

/// Asserts that `out` (a `walhook archive` run) succeeded and left the hot
/// tables empty.
async fn assert_all_archived(w: &World, out: &std::process::Output) {
    assert!(out.status.success(), "{}\n{}", stdout(out), stderr(out));
    assert_eq!(
        hot_rows(&w.platform_sql).await,
        (0, 0, 0),
        "{}",
        stdout(out)
    );
}

/// A real run: 3 tenants, 4 endpoints (one failing every third request),
/// 60 orders; then the rows of two tenants are moved one and two days back,
/// so the run spans three days.
async fn three_days() -> (World, String) {
    let w = World::new().await;
    w.endpoint("acme", "acme-all", &[]).await;
    w.endpoint("acme", "acme-orders", &["order.created"]).await;
    w.endpoint("globex", "globex", &[]).await;
    w.endpoint("initech", "initech", &[]).await;
    w.receiver
        .set_behaviour("acme-all", Behaviour::FailEvery { n: 3, status: 503 });
    let child = Child::run(&w.config(""));
    w.wait_streaming().await;
    let tenants = ["acme", "globex", "initech"];
    for i in 0..60i64 {
        w.shop
            .execute(
                "INSERT INTO orders VALUES ($1, $2, 1)",
                &[&i, &tenants[(i % 3) as usize]],
            )
            .await
            .unwrap();
    }
    // acme: 20 orders × 2 endpoints, globex and initech 20 × 1.
    w.wait_count(
        "deliveries succeeded",
        "SELECT count(*) FROM walhook.deliveries WHERE status = 'succeeded'",
        80,
    )
    .await;
    child.terminate();
    for (tenant, back) in [("globex", 1), ("initech", 2)] {
        let shift = format!("interval '{back} days'");
        // As walhook's role, which owns the day partitions it makes.
        w.platform_sql
            .batch_execute(&format!(
                "SET ROLE {PLATFORM_ROLE};
                 SELECT walhook.ensure_day_partition(t, (now() AT TIME ZONE 'UTC')::date - {back}) \
                   FROM unnest(ARRAY['events', 'deliveries', 'attempts']) t;
                 UPDATE walhook.events SET occurred_at = occurred_at - {shift}, created_at = created_at - {shift} WHERE tenant_id = '{tenant}';
                 UPDATE walhook.deliveries SET event_occurred_at = event_occurred_at - {shift}, created_at = created_at - {shift}, \
                   updated_at = updated_at - {shift}, next_attempt_at = next_attempt_at - {shift}, expires_at = expires_at - {shift} WHERE tenant_id = '{tenant}';
                 UPDATE walhook.attempts SET started_at = started_at - {shift}, finished_at = finished_at - {shift} WHERE tenant_id = '{tenant}';
                 RESET ROLE;"
            ))
            .await
            .unwrap();
    }
    let today: chrono::NaiveDate = w
        .platform_sql
        .query_one(
            "SELECT to_char((now() AT TIME ZONE 'UTC')::date, 'YYYY-MM-DD')",
            &[],
        )
        .await
        .unwrap()
        .get::<_, String>(0)
        .parse()
        .unwrap();
    let later = (today + chrono::Duration::days(TODAY_PLUS)).to_string();
    (w, later)
}

/// The aggregates of the hot tables ([`SNAPSHOT_SQL`]).
async fn snapshot(w: &World) -> serde_json::Value {
    let text: String = w
        .platform_sql
        .query_one(SNAPSHOT_SQL, &[])
        .await
        .unwrap()
        .get(0);
    serde_json::from_str(&text).unwrap()
}

/// Hot attempts that started on `day` (YYYY-MM-DD).
async fn attempts_of_day(sql: &tokio_postgres::Client, day: &str) -> i64 {
    sql.query_one(
        "SELECT count(*) FROM walhook.attempts WHERE (started_at AT TIME ZONE 'UTC')::date = $1::text::date",
        &[&day],
    )
    .await
    .unwrap()
    .get(0)
}

/// A copy of the platform database, for a second archive of the same rows.
async fn clone_platform(w: &mut World, name: &str) -> String {
    let admin = w.pg.connect("postgres").await.unwrap();
    admin
        .batch_execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = 'platform' AND pid <> pg_backend_pid()",
        )
        .await
        .unwrap();
    admin
        .batch_execute(&format!("CREATE DATABASE {name} TEMPLATE platform"))
        .await
        .unwrap();
    w.platform_sql = w.pg.connect("platform").await.unwrap();
    w.platform_role_url(name)
}

fn config_for(w: &World, platform_url: &str, store: &Path) -> PathBuf {
    let text = std::fs::read_to_string(w.config("")).unwrap();
    let text = text.replacen(
        "[platform]\nurl = \"",
        &format!(
            "[archive]\npath = {:?}\n\n[platform]\nurl = \"",
            store.display().to_string()
        ),
        1,
    );
    let text = regex_free_replace_platform(&text, platform_url);
    let path = w.dir.path().join(format!(
        "archive-{}.toml",
        store.file_name().unwrap().to_string_lossy()
    ));
    std::fs::write(&path, text).unwrap();
    path
}

fn regex_free_replace_platform(text: &str, url: &str) -> String {
    let start = text.find("[platform]\nurl = \"").unwrap() + "[platform]\nurl = \"".len();
    let end = start + text[start..].find('"').unwrap();
    format!("{}{}{}", &text[..start], url, &text[end..])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_days_become_parquet_that_duckdb_and_pyarrow_read_back_exactly() {
    let (mut w, later) = three_days().await;
    let before = snapshot(&w).await;
    assert_eq!(before["event_days"], 3, "{before}");
    let clean_url = clone_platform(&mut w, "platform_clean").await;
    let crashed_store = w.dir.path().join("crashed");
    let clean_store = w.dir.path().join("clean");
    let crashed_cfg = config_for(&w, &w.platform_role_url("platform"), &crashed_store);
    let clean_cfg = config_for(&w, &clean_url, &clean_store);

    // --dry-run writes nothing and lists the nine due days.
    let mut cmd = walhook();
    cmd.args(["archive", "--dry-run", "--json", "--config"])
        .arg(&crashed_cfg)
        .args(["--today", &later]);
    let out = run(&mut cmd);
    assert!(out.status.success(), "{}", stderr(&out));
    let plan: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(plan.as_array().unwrap().len(), 9, "{plan}");
    assert!(
        plan.as_array()
            .unwrap()
            .iter()
            .all(|p| p["outcome"] == "due"),
        "{plan}"
    );
    assert!(objects(&crashed_store).is_empty());

    // Crash after a part, after a manifest, before and after a drop, then
    // finish.
    for fp in [
        "archive.after_part=abort@2",
        "archive.after_manifest=abort@2",
        "archive.before_drop=abort@3",
        "archive.after_drop=abort@1",
    ] {
        let out = archive(&crashed_cfg, &later, &[("WALHOOK_FAILPOINTS", fp)]);
        assert!(
            !out.status.success(),
            "{fp} did not crash: {}",
            stderr(&out)
        );
    }
    // And a SIGKILL in the middle of a run.
    let mut child = walhook()
        .args(["archive", "--config"])
        .arg(&crashed_cfg)
        .args(["--today", &later])
        .env("WALHOOK_FAILPOINTS", "archive.after_part=sleep(400)")
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    child.kill().unwrap();
    child.wait().unwrap();
    let out = archive(&crashed_cfg, &later, &[]);
    assert_all_archived(&w, &out).await;
    let again = archive(&crashed_cfg, &later, &[]);
    assert!(
        stdout(&again).contains("nothing is due"),
        "{}",
        stdout(&again)
    );

    let out = archive(&clean_cfg, &later, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let (crashed, clean) = (objects(&crashed_store), objects(&clean_store));
    assert_eq!(
        crashed.keys().collect::<Vec<_>>(),
        clean.keys().collect::<Vec<_>>(),
        "the crashed run left another object set"
    );
    for (k, v) in &clean {
        assert!(
            crashed[k] == *v,
            "{k} differs between the crashed and the clean run"
        );
    }
    assert_eq!(
        clean
            .keys()
            .filter(|k| k.ends_with("_manifest.json"))
            .count(),
        9
    );

    let got = read_back(&clean_store, &before);
    assert_eq!(got["duck_uuid_type"], "UUID", "{got}");
    assert!(
        got["types"]["started_at"]
            .as_str()
            .unwrap()
            .contains("timestamp[us, tz=UTC]"),
        "{got}"
    );
}

/// Runs the DuckDB and pyarrow checker over the archive at `root` and
/// asserts that both readers find the aggregates the hot tables held
/// (`before`); returns the checker's output.
fn read_back(root: &Path, before: &serde_json::Value) -> serde_json::Value {
    let out = Command::new(python())
        .args(["-c", CHECKER])
        .arg(root)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "checker: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for reader in ["duckdb", "pyarrow"] {
        for k in [
            "events",
            "event_bytes",
            "event_days",
            "deliveries",
            "deliveries_by_endpoint",
            "attempts",
            "attempt_latency_ms",
        ] {
            assert_eq!(
                normalise(&got[reader][k]),
                normalise(&before[k]),
                "{reader} {k}: archive {} vs hot {}",
                got[reader][k],
                before[k]
            );
        }
    }
    got
}

/// Numbers compared as numbers (DuckDB sums are big integers, Postgres's
/// `sum` is numeric in JSON).
fn normalise(v: &serde_json::Value) -> serde_json::Value {
    match v {
        serde_json::Value::Number(n) => serde_json::json!(n.as_f64()),
        serde_json::Value::Object(m) => {
            serde_json::Value::Object(m.iter().map(|(k, v)| (k.clone(), normalise(v))).collect())
        }
        other => other.clone(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_missing_and_miscounted_objects_stop_the_drop() {
    let (w, later) = three_days().await;
    let store = w.dir.path().join("store");
    let cfg = config_for(&w, &w.platform_role_url("platform"), &store);
    let attempts_only = |env: &[(&str, &str)]| archive_tables(&cfg, &later, &["attempts"], env);
    // Written and recorded, not yet verified.
    let out = attempts_only(&[("WALHOOK_FAILPOINTS", "archive.before_verify=exit@1")]);
    assert!(!out.status.success());
    let part = objects(&store)
        .into_keys()
        .find(|k| k.starts_with("table=attempts") && k.ends_with(".parquet"))
        .unwrap();
    let day = part
        .split('/')
        .nth(1)
        .unwrap()
        .trim_start_matches("date=")
        .to_string();
    let day_rows = || attempts_of_day(&w.platform_sql, &day);
    let hot = day_rows().await;
    assert!(hot > 0);
    let path = store.join(&part);
    let original = std::fs::read(&path).unwrap();

    let mut corrupt = original.clone();
    corrupt[original.len() / 2] ^= 0xff;
    std::fs::write(&path, &corrupt).unwrap();
    let out = attempts_only(&[]);
    assert!(!out.status.success());
    let text = stdout(&out) + &stderr(&out);
    assert!(
        text.contains(&part) && text.contains("SHA-256") && text.contains("Remove the manifest"),
        "{text}"
    );
    assert_eq!(day_rows().await, hot, "a corrupt object let rows go");

    std::fs::remove_file(&path).unwrap();
    let out = attempts_only(&[]);
    let text = stdout(&out) + &stderr(&out);
    assert!(
        !out.status.success() && text.contains(&part) && text.contains("missing"),
        "{text}"
    );
    assert_eq!(day_rows().await, hot);

    // A manifest whose counts do not match its parts (its hash recorded as
    // a buggy writer would have).
    std::fs::write(&path, &original).unwrap();
    let manifest_key = {
        let day = part.split('/').nth(1).unwrap();
        format!("table=attempts/{day}/_manifest.json")
    };
    let mpath = store.join(&manifest_key);
    let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(&mpath).unwrap()).unwrap();
    let files = m["files"].as_array_mut().unwrap();
    let entry = files
        .iter_mut()
        .find(|f| f["key"] == part.as_str())
        .unwrap();
    entry["rows"] = serde_json::json!(entry["rows"].as_u64().unwrap() + 1);
    m["row_count"] = serde_json::json!(m["row_count"].as_u64().unwrap() + 1);
    let bytes = serde_json::to_vec_pretty(&m).unwrap();
    std::fs::write(&mpath, &bytes).unwrap();
    w.platform_sql
        .execute(
            "UPDATE walhook.archive_partitions SET manifest_sha256 = $1 WHERE manifest_key = $2",
            &[
                &walhook_pipeline::objstore::sha256_hex(&bytes),
                &manifest_key,
            ],
        )
        .await
        .unwrap();
    let out = attempts_only(&[]);
    let text = stdout(&out) + &stderr(&out);
    assert!(
        !out.status.success() && text.contains("footer declares"),
        "{text}"
    );
    assert_eq!(day_rows().await, hot);

    let failures: i64 = w
        .platform_sql
        .query_one(
            "SELECT sum(verify_failures)::int8 FROM walhook.archive_partitions",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(failures, 3);

    // The fix the error gives: remove the manifest and run again.
    std::fs::remove_file(&mpath).unwrap();
    let out = attempts_only(&[]);
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    assert_eq!(hot_rows(&w.platform_sql).await.2, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_days_go_to_a_real_s3_server_and_read_back_exactly() {
    let s3 = walhook_devkit::s3::S3Server::start("walhook-archive")
        .await
        .expect("the S3-compatible test server (s3s-fs): run scripts/ensure-s3.sh");
    let (w, later) = three_days().await;
    let before = snapshot(&w).await;
    let text = std::fs::read_to_string(w.config("")).unwrap().replacen(
        "[platform]\n",
        &format!(
            "[archive]\nstore = \"s3\"\n\n[archive.s3]\nbucket = \"walhook-archive\"\nprefix = \"prod/cold\"\n\
             endpoint = \"{}\"\nforce_path_style = true\n\n[platform]\n",
            s3.endpoint()
        ),
        1,
    );
    let cfg = w.dir.path().join("s3.toml");
    std::fs::write(&cfg, text).unwrap();
    let env: Vec<(&str, String)> = s3.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    // A crash between a part and the manifest, then the whole run.
    let mut with_fp = env.clone();
    with_fp.push(("WALHOOK_FAILPOINTS", "archive.after_part=abort@3"));
    assert!(!archive(&cfg, &later, &with_fp).status.success());
    let out = archive(&cfg, &later, &env);
    assert_all_archived(&w, &out).await;
    assert!(
        stderr(&out).contains("s3://walhook-archive/prod/cold"),
        "{}",
        stderr(&out)
    );

    // What the server stored (s3s-fs keeps each object as a file).
    let root = s3.root().join("walhook-archive/prod/cold");
    let stored = objects(&root);
    assert_eq!(
        stored
            .keys()
            .filter(|k| k.ends_with("_manifest.json"))
            .count(),
        9,
        "{:?}",
        stored.keys()
    );
    read_back(&root, &before);
}

const VERIFY_PY: &str = r#"
import json, sys
from standardwebhooks.webhooks import Webhook
case = json.load(sys.stdin)
Webhook(case["secret"]).verify(case["body"].encode(), case["headers"])
print("ok")
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archived_deliveries_are_listed_read_and_replayed_with_the_same_id_and_bytes() {
    use crate::support::api::{Http, api_section, at, free_port, onboard};
    let (w, later) = three_days().await;
    let store = w.dir.path().join("store");
    let cfg = config_for(&w, &w.platform_role_url("platform"), &store);
    let out = archive(&cfg, &later, &[]);
    assert_all_archived(&w, &out).await;
    let sent = at(&w.receiver.received(), "globex");
    assert_eq!(sent.len(), 20);

    let port = free_port();
    let run_cfg = w.dir.path().join("run-api.toml");
    std::fs::write(
        &run_cfg,
        std::fs::read_to_string(&cfg).unwrap().replacen(
            "[platform]\n",
            &format!("{}\n[platform]\n", api_section(port)),
            1,
        ),
    )
    .unwrap();
    let child = Child::run(&run_cfg);
    let api = Http::new(port);
    api.wait_ready().await;
    let key = onboard(&w, &api, "globex").await;

    // The listing pages through archived days with the same ids.
    let mut listed = Vec::new();
    let mut path = "/v1/webhook-deliveries?limit=7".to_string();
    loop {
        let (s, page) = api.get(&key, &path).await;
        assert_eq!(s, 200, "{page}");
        for d in page["data"].as_array().unwrap() {
            listed.push(d["id"].as_str().unwrap().to_string());
        }
        match page["next_cursor"].as_str() {
            Some(c) => path = format!("/v1/webhook-deliveries?limit=7&cursor={c}"),
            None => break,
        }
    }
    let mut want: Vec<String> = sent.iter().map(|r| r.webhook_id.clone()).collect();
    let mut got = listed.clone();
    want.sort();
    got.sort();
    assert_eq!(got, want, "the archived listing differs from what was sent");
    assert_eq!(listed.len(), 20, "a delivery was listed twice");

    // The detail: exact body, attempts.
    let first = &sent[0];
    let (s, detail) = api
        .get(
            &key,
            &format!("/v1/webhook-deliveries/{}", first.webhook_id),
        )
        .await;
    assert_eq!(s, 200, "{detail}");
    let body: serde_json::Value = serde_json::from_slice(&first.body).unwrap();
    assert_eq!(detail["event"]["payload"], body);
    assert_eq!(
        detail["event"]["payload_sha256"],
        walhook_pipeline::objstore::sha256_hex(&first.body)
    );
    assert!(
        !detail["attempts"].as_array().unwrap().is_empty(),
        "{detail}"
    );
    assert_eq!(detail["delivery"]["status"], "succeeded", "{detail}");

    // A new secret (shown once) so that the official library can check the
    // replay's signature, then the replay of the archived delivery.
    let endpoint = detail["delivery"]["endpoint_id"]
        .as_str()
        .unwrap()
        .to_string();
    let (s, rotated) = api
        .post(
            &key,
            &format!("/v1/webhook-endpoints/{endpoint}/rotate-secret"),
            serde_json::json!({}),
        )
        .await;
    assert!(s == 200 || s == 201, "{rotated}");
    let secret = rotated["secret"].as_str().unwrap().to_string();
    w.receiver.set_secrets("globex", vec![secret.clone()]);
    let (s, accepted) = api
        .post(
            &key,
            &format!("/v1/webhook-deliveries/{}/replay", first.webhook_id),
            serde_json::json!({}),
        )
        .await;
    assert_eq!(s, 202, "{accepted}");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let replayed = loop {
        let again: Vec<_> = at(&w.receiver.received(), "globex")
            .into_iter()
            .filter(|r| r.webhook_id == first.webhook_id)
            .collect();
        if again.len() >= 2 {
            break again[1].clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the replay never arrived"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(replayed.body, first.body, "the replay's bytes differ");
    assert_eq!(replayed.verified, Some(true));
    let case = serde_json::json!({
        "secret": secret,
        "body": String::from_utf8(replayed.body.to_vec()).unwrap(),
        "headers": {
            "webhook-id": replayed.webhook_id,
            "webhook-timestamp": replayed.webhook_timestamp,
            "webhook-signature": replayed.signature,
        },
    });
    let mut py = Command::new(python())
        .args(["-c", VERIFY_PY])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    py.stdin
        .take()
        .unwrap()
        .write_all(case.to_string().as_bytes())
        .unwrap();
    let out = py.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "standardwebhooks refused the replay: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The detail now shows the archived attempt and the manual one.
    let (_, detail) = api
        .get(
            &key,
            &format!("/v1/webhook-deliveries/{}", first.webhook_id),
        )
        .await;
    let triggers: Vec<&str> = detail["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["trigger"].as_str().unwrap_or(""))
        .collect();
    assert!(
        triggers.contains(&"auto") && triggers.contains(&"manual"),
        "{detail}"
    );

    let metrics = api.metrics().await;
    let gauge = |name: &str| -> f64 {
        metrics
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} is not in /metrics:\n{metrics}"))
    };
    assert!(
        gauge("walhook_archive_rows{name=\"deliveries\"}") >= 80.0,
        "{metrics}"
    );
    assert!(
        gauge("walhook_archive_bytes{name=\"attempts\"}") > 0.0,
        "{metrics}"
    );
    assert_eq!(
        gauge("walhook_archive_verification_failures{name=\"events\"}"),
        0.0
    );
    // Today's attempts (the replay's) are hot: their partition's oldest
    // unfrozen row is some transactions old.
    assert!(
        gauge("walhook_archive_xid_age{name=\"attempts\"}") > 0.0,
        "{metrics}"
    );
    let progress = gauge("walhook_archive_freeze_progress{name=\"attempts\"}");
    assert!(progress > 0.0 && progress < 0.01, "{metrics}");
    child.terminate();

    // The restored delivery and event leave again, as generation 1 of
    // their days; the replay's attempt goes with today's attempts.
    let out = archive(&cfg, &later, &[]);
    assert_all_archived(&w, &out).await;
    let keys: Vec<String> = objects(&store).into_keys().collect();
    for t in ["events", "deliveries"] {
        assert!(
            keys.iter()
                .any(|k| k.starts_with(&format!("table={t}/")) && k.ends_with("_manifest-g1.json")),
            "no generation 1 of {t}: {keys:?}"
        );
    }
}

/// Postgres sorts rows by the tenant bucket and cold reads compute it in
/// Rust: the two must agree for every tenant id, non-ASCII included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_and_rust_put_every_tenant_in_the_same_bucket() {
    let pg = walhook_devkit::postgres::LocalPostgres::start()
        .await
        .unwrap();
    let sql = pg.connect("postgres").await.unwrap();
    let tenants: Vec<String> = (0..500)
        .map(|i| format!("tenant-{i}"))
        .chain(["", "acme", "テナント", "ünïcödé", "a b"].map(String::from))
        .collect();
    for buckets in [1u16, 16, 256] {
        let q = format!(
            "SELECT tenant_id, {} FROM unnest($1::text[]) AS t(tenant_id)",
            walhook_archive::layout::bucket_sql(2)
        );
        let rows = sql
            .query(&q, &[&tenants, &i32::from(buckets)])
            .await
            .unwrap();
        for r in rows {
            let t: String = r.get(0);
            let b: i32 = r.get(1);
            assert_eq!(
                b as u16,
                walhook_archive::layout::bucket_of(&t, buckets),
                "{t:?} of {buckets}"
            );
        }
    }
}

/// A row that reaches a day between its verification and its drop stops
/// the drop (nothing is lost) and the day is written anew with it; and one
/// archive round runs at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_rows_and_a_second_archiver_are_handled() {
    let (w, later) = three_days().await;
    let store = w.dir.path().join("store");
    let cfg = config_for(&w, &w.platform_role_url("platform"), &store);
    let attempts_only = |env: &[(&str, &str)]| archive_tables(&cfg, &later, &["attempts"], env);

    // Another round holds the lock: this one refuses, changing nothing.
    let lock_key: i64 = 0x7761_6c68_6172_6368;
    w.platform_sql
        .execute("SELECT pg_advisory_lock($1)", &[&lock_key])
        .await
        .unwrap();
    let out = attempts_only(&[]);
    let text = stdout(&out) + &stderr(&out);
    assert!(
        !out.status.success() && text.contains("another archive round"),
        "{text}"
    );
    assert!(objects(&store).is_empty());
    w.platform_sql
        .execute("SELECT pg_advisory_unlock($1)", &[&lock_key])
        .await
        .unwrap();

    // Verified, not yet dropped; then a late attempt row for that day.
    let out = attempts_only(&[("WALHOOK_FAILPOINTS", "archive.before_drop=exit@1")]);
    assert!(!out.status.success());
    let day: String = w
        .platform_sql
        .query_one(
            "SELECT to_char(day, 'YYYY-MM-DD') FROM walhook.archive_partitions WHERE state = 'verified'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let count = || attempts_of_day(&w.platform_sql, &day);
    let before = count().await;
    w.platform_sql
        .execute(
            "INSERT INTO walhook.attempts (id, delivery_id, endpoint_id, tenant_id, number, trigger, \
             endpoint_config_version, started_at, finished_at, http_status, latency_ms, outcome) \
             SELECT gen_random_uuid(), delivery_id, endpoint_id, tenant_id, 99, 'manual', 1, \
             started_at + interval '1 second', finished_at + interval '1 second', 200, 1, 'succeeded' \
             FROM walhook.attempts WHERE (started_at AT TIME ZONE 'UTC')::date = $1::text::date LIMIT 1",
            &[&day],
        )
        .await
        .unwrap();
    let out = attempts_only(&[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("rows arrived after the export"),
        "{}",
        stdout(&out)
    );
    assert_eq!(
        count().await,
        before + 1,
        "the late row was dropped unarchived"
    );

    // The next round writes the day anew, late row included.
    let out = attempts_only(&[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(count().await, 0);
    let manifest: serde_json::Value = serde_json::from_slice(
        &std::fs::read(store.join(format!("table=attempts/date={day}/_manifest.json"))).unwrap(),
    )
    .unwrap();
    assert_eq!(manifest["row_count"].as_i64().unwrap(), before + 1);

    // A delivery of an exported day changes before the drop, stamped
    // before the export began: a manual attempt whose transaction started
    // first and committed after the export's snapshot. The drop goes by
    // that snapshot, not by the stamp, and keeps the day hot.
    let deliveries_only = |env: &[(&str, &str)]| archive_tables(&cfg, &later, &["deliveries"], env);
    let out = deliveries_only(&[("WALHOOK_FAILPOINTS", "archive.before_drop=exit@1")]);
    assert!(!out.status.success());
    let row = w
        .platform_sql
        .query_one(
            "SELECT to_char(a.day, 'YYYY-MM-DD'), d.id::text, d.manual_attempt_count \
             FROM walhook.archive_partitions a \
             JOIN walhook.deliveries d ON (d.created_at AT TIME ZONE 'UTC')::date = a.day \
             WHERE a.table_name = 'deliveries' AND a.state = 'verified' ORDER BY d.id LIMIT 1",
            &[],
        )
        .await
        .unwrap();
    let (day, id, manual): (String, String, i32) = (row.get(0), row.get(1), row.get(2));
    w.platform_sql
        .execute(
            "UPDATE walhook.deliveries SET manual_attempt_count = manual_attempt_count + 1, \
             attempt_count = attempt_count + 1, updated_at = created_at WHERE id = $1::text::uuid",
            &[&id],
        )
        .await
        .unwrap();
    let hot_on_day = || async {
        w.platform_sql
            .query_one(
                "SELECT count(*) FROM walhook.deliveries WHERE (created_at AT TIME ZONE 'UTC')::date = $1::text::date",
                &[&day],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
    };
    let day_rows = hot_on_day().await;
    let out = deliveries_only(&[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("1 deliveries of the day changed after the export"),
        "{}",
        stdout(&out)
    );
    assert_eq!(hot_on_day().await, day_rows, "the changed day was dropped");

    // The next round writes the day anew, with the change, and drops it.
    let out = deliveries_only(&[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(hot_on_day().await, 0, "{}", stdout(&out));
    let read = std::process::Command::new(crate::support::python())
        .arg("-c")
        .arg(
            "import duckdb, sys; print(duckdb.connect().execute(\"SELECT manual_attempt_count FROM \
             read_parquet(?) WHERE id::varchar = ?\", [sys.argv[1], sys.argv[2]]).fetchall()[0][0])",
        )
        .arg(format!(
            "{}/table=deliveries/date={day}/*/*.parquet",
            store.display()
        ))
        .arg(&id)
        .output()
        .unwrap();
    assert!(
        read.status.success(),
        "{}",
        String::from_utf8_lossy(&read.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&read.stdout).trim(),
        (manual + 1).to_string(),
        "the archive holds the delivery's state before the change"
    );
}
