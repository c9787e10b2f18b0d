//! A rolling upgrade while traffic flows: the previous release (the first
//! row of RELEASES.md, built by scripts/ensure-previous-release.sh and
//! named in WALHOOK_PREVIOUS_RELEASE) migrates and runs; the new
//! migrations are applied under it; a new-version dispatcher node joins
//! (both versions serve together); the old process is stopped and the new
//! one takes its place. Every order becomes exactly the webhooks it should,
//! and a webhook sent twice is one noted `previous_outcome_unknown`.

#![allow(clippy::disallowed_methods)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use crate::support::{
    Child, PLATFORM_ROLE, World, assert_recent_window_reconciles, run, stderr, stdout, walhook,
};

fn previous_release() -> PathBuf {
    let path = std::env::var_os("WALHOOK_PREVIOUS_RELEASE").map(PathBuf::from);
    match path {
        Some(p) if p.is_file() => p,
        _ => panic!(
            "WALHOOK_PREVIOUS_RELEASE must name the previous release's walhook: \
             scripts/test.sh sets it from scripts/ensure-previous-release.sh (RELEASES.md)"
        ),
    }
}

fn start(program: &Path, args: &[&str], cfg: &Path, log: &Path) -> Child {
    let file = std::fs::File::create(log).unwrap();
    Child(
        Command::new(program)
            .args(args)
            .arg("--config")
            .arg(cfg)
            .env("WALHOOK_LOG", "warn")
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", program.display())),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_upgrade_from_the_previous_release_loses_and_repeats_nothing() {
    let old = previous_release();
    let w = World::unmigrated().await;
    let cfg = w.config("[reconcile]\nevery = \"0s\"\n");
    let logs = w.dir.path();

    // Releases up to 0.1.0 ran `CREATE SCHEMA IF NOT EXISTS` even when the
    // schema existed, which needs CREATE on the database; later ones do not.
    w.platform_sql
        .batch_execute(&format!(
            "GRANT CREATE ON DATABASE platform TO {PLATFORM_ROLE}"
        ))
        .await
        .unwrap();
    let version = stdout(&run(Command::new(&old).arg("--version")));
    assert!(version.starts_with("walhook "), "{version}");
    let out = run(Command::new(&old).args(["migrate", "--config"]).arg(&cfg));
    assert!(
        out.status.success(),
        "old migrate: {}{}",
        stdout(&out),
        stderr(&out)
    );
    w.endpoint("acme", "acme", &["order.created"]).await;
    w.endpoint("globex", "globex", &[]).await;

    let old_run = start(&old, &["run"], &cfg, &logs.join("old-run.log"));
    w.wait_streaming().await;

    // Producers write all along: 40 orders a second, two tenants.
    let written = Arc::new(AtomicI64::new(0));
    let stop = tokio_util::sync::CancellationToken::new();
    let writer = {
        let (written, stop, url) = (written.clone(), stop.clone(), w.shop_url());
        tokio::spawn(async move {
            let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(conn);
            let mut id = 0i64;
            while !stop.is_cancelled() {
                id += 1;
                let tenant = if id % 2 == 0 { "acme" } else { "globex" };
                client
                    .execute("INSERT INTO orders VALUES ($1, $2, 1)", &[&id, &tenant])
                    .await
                    .unwrap();
                written.store(id, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;

    // The new migrations, applied while the old version runs.
    let out = run(walhook().args(["migrate", "--config"]).arg(&cfg));
    assert!(
        out.status.success(),
        "new migrate: {}{}",
        stdout(&out),
        stderr(&out)
    );
    let out = run(walhook().args(["migrate", "--check", "--config"]).arg(&cfg));
    assert!(
        out.status.success(),
        "nothing pending: {}{}",
        stdout(&out),
        stderr(&out)
    );
    tokio::time::sleep(Duration::from_secs(1)).await;

    // A new-version dispatcher node beside the old process.
    let new_dispatch = start(
        Path::new(env!("CARGO_BIN_EXE_walhook")),
        &["dispatch", "--node-id", "upgraded-dispatch"],
        &cfg,
        &logs.join("new-dispatch.log"),
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let serving: i64 = w
        .platform_sql
        .query_one(
            "SELECT count(*) FROM walhook.dispatch_nodes \
              WHERE node_id = 'upgraded-dispatch' AND lease_until > now()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        serving, 1,
        "the new-version node holds a lease beside the old process"
    );

    // The old process stops (SIGTERM drains it) and the new one replaces it.
    let status = old_run.terminate();
    assert!(status.success(), "the old release stopped with {status}");
    let new_run = start(
        Path::new(env!("CARGO_BIN_EXE_walhook")),
        &["run"],
        &cfg,
        &logs.join("new-run.log"),
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.cancel();
    writer.await.unwrap();
    let n = written.load(Ordering::SeqCst);
    assert!(n >= 100, "only {n} orders were written");

    w.wait_count("events captured", "SELECT count(*) FROM walhook.events", n)
        .await;
    // acme subscribes to order.created, globex to everything: one delivery
    // per order.
    w.wait_count(
        "deliveries succeeded",
        "SELECT count(*) FROM walhook.deliveries WHERE status = 'succeeded'",
        n,
    )
    .await;
    let received = w.receiver.received();
    let mut ids = std::collections::BTreeMap::<String, u32>::new();
    for r in &received {
        assert_eq!(r.verified, Some(true), "{r:?}");
        *ids.entry(r.webhook_id.clone()).or_default() += 1;
    }
    assert_eq!(
        ids.len() as i64,
        n,
        "every order reached its tenant once at least"
    );
    let repeated: i64 = ids.values().map(|c| i64::from(c - 1)).sum();
    let noted: i64 = w
        .platform_sql
        .query_one(
            "SELECT count(*) FROM walhook.attempts WHERE note = 'previous_outcome_unknown'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        repeated <= noted,
        "{repeated} webhooks were sent twice, only {noted} attempts say their previous outcome \
         was unknown"
    );
    assert_recent_window_reconciles(&cfg);
    assert!(new_run.terminate().success());
    assert!(new_dispatch.terminate().success());
}
