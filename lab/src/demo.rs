//! `walhook demo`: business writes become verified webhooks, on one machine.
//!
//! Starts a throwaway Postgres with a shop schema (invoices, orders, users)
//! and the platform schema, two tenants with endpoints on local receivers
//! (one of them flaky), the whole pipeline on the embedded log. Every
//! endpoint first proves that its receiver holds its secret (the ownership
//! check of docs/api.md: the receivers answer the HMAC proof); then the demo
//! writes business rows with plain SQL for a while. The receivers verify
//! every signature with their own code. The summary compares what the demo
//! expects with what the receivers got; the exit status is 0 only when every
//! expected delivery succeeded.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio_util::sync::CancellationToken;
use walhook_devkit::postgres::LocalPostgres;
use walhook_devkit::receiver::{Behaviour, Receiver};
use walhook_pipeline::event::EventType;
use walhook_pipeline::ids::TenantId;
use walhook_sql::Platform;
use walhook_sql::endpoints::NewEndpoint;

use walhook_cli::config::Config;

/// Arguments of `walhook demo`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// How long to write business rows.
    #[arg(long, default_value = "15s", value_parser = walhook_pipeline::duration::parse)]
    pub duration: Duration,
    /// Business writes per second.
    #[arg(long, default_value_t = 40)]
    pub rate: u32,
    /// How long to wait for the last deliveries after writing stops.
    #[arg(long, default_value = "60s", value_parser = walhook_pipeline::duration::parse)]
    pub settle: Duration,
}

const SHOP: &str = "
    CREATE TABLE users (id bigint PRIMARY KEY, tenant_id text NOT NULL, email text NOT NULL,
                        disabled boolean NOT NULL DEFAULT false, created_at timestamptz NOT NULL DEFAULT now());
    CREATE TABLE orders (id bigint PRIMARY KEY, tenant_id text NOT NULL, user_id bigint NOT NULL,
                         status text NOT NULL DEFAULT 'placed', total numeric(12,2) NOT NULL,
                         items jsonb NOT NULL, placed_at timestamptz NOT NULL DEFAULT now());
    CREATE TABLE invoices (id bigint PRIMARY KEY, tenant_id text NOT NULL, order_id bigint NOT NULL,
                           status text NOT NULL DEFAULT 'open', amount numeric(12,2) NOT NULL,
                           currency char(3) NOT NULL DEFAULT 'EUR', paid_at timestamptz);
    -- Conditions on old values (changed_to) need the old row in the WAL.
    ALTER TABLE users REPLICA IDENTITY FULL;
    ALTER TABLE orders REPLICA IDENTITY FULL;
    ALTER TABLE invoices REPLICA IDENTITY FULL;
";

const RULES: &str = r#"
[[rules]]
name = "user_created"
table = "users"
operations = ["insert"]
event_type = "user.created"
tenant_column = "tenant_id"
object_id_column = "id"
include = ["id", "email", "created_at"]

[[rules]]
name = "user_disabled"
table = "users"
operations = ["update"]
when = [{ column = "disabled", changed_to = true }]
event_type = "user.disabled"
tenant_column = "tenant_id"
object_id_column = "id"
include = ["id", "email"]

[[rules]]
name = "order_created"
table = "orders"
operations = ["insert"]
event_type = "order.created"
tenant_column = "tenant_id"
object_id_column = "id"
object_version = "lsn"

[[rules]]
name = "order_shipped"
table = "orders"
operations = ["update"]
when = [{ column = "status", changed_to = "shipped" }]
event_type = "order.shipped"
tenant_column = "tenant_id"
object_id_column = "id"
object_version = "lsn"
include = ["id", "status", "user_id"]

[[rules]]
name = "invoice_paid"
table = "invoices"
operations = ["update"]
when = [{ column = "status", changed_to = "paid" }]
event_type = "invoice.paid"
tenant_column = "tenant_id"
object_id_column = "id"
object_version = "lsn"
"#;

struct DemoEndpoint {
    tenant: &'static str,
    path: &'static str,
    types: &'static [&'static str],
    flaky: bool,
}

const ENDPOINTS: &[DemoEndpoint] = &[
    DemoEndpoint {
        tenant: "acme",
        path: "acme/billing",
        types: &["invoice.paid"],
        flaky: false,
    },
    DemoEndpoint {
        tenant: "acme",
        path: "acme/everything",
        types: &[],
        flaky: false,
    },
    DemoEndpoint {
        tenant: "acme",
        path: "acme/fulfilment",
        types: &["order.created", "order.shipped"],
        flaky: true,
    },
    DemoEndpoint {
        tenant: "globex",
        path: "globex/orders",
        types: &["order.created", "order.shipped"],
        flaky: false,
    },
    DemoEndpoint {
        tenant: "globex",
        path: "globex/security",
        types: &["user.disabled"],
        flaky: false,
    },
];

/// What the demo writes, and so expects.
#[derive(Default)]
struct Ledger {
    changes: u64,
    /// (tenant, type) → events.
    events: HashMap<(&'static str, &'static str), u64>,
    next_id: i64,
    users: Vec<(i64, &'static str)>,
    orders: Vec<(i64, &'static str)>,
    invoices: Vec<(i64, &'static str)>,
}

impl Ledger {
    fn event(&mut self, tenant: &'static str, t: &'static str) {
        *self.events.entry((tenant, t)).or_default() += 1;
    }

    fn expected_per_endpoint(&self) -> BTreeMap<&'static str, u64> {
        ENDPOINTS
            .iter()
            .map(|ep| {
                let n = self
                    .events
                    .iter()
                    .filter(|((tenant, t), _)| {
                        *tenant == ep.tenant && (ep.types.is_empty() || ep.types.contains(t))
                    })
                    .map(|(_, n)| *n)
                    .sum();
                (ep.path, n)
            })
            .collect()
    }
}

/// One business write with plain SQL, chosen by `step`.
async fn write(db: &tokio_postgres::Client, ledger: &mut Ledger, step: u64) -> anyhow::Result<()> {
    // Whole cycles of six writes per tenant: two of acme's, then globex's.
    let tenant: &'static str = if (step / 6) % 3 == 2 {
        "globex"
    } else {
        "acme"
    };
    ledger.next_id += 1;
    let id = ledger.next_id;
    match step % 6 {
        0 | 3 => {
            db.execute(
                "INSERT INTO users (id, tenant_id, email) VALUES ($1, $2, $3)",
                &[&id, &tenant, &format!("user{id}@{tenant}.example")],
            )
            .await?;
            ledger.users.push((id, tenant));
            ledger.changes += 1;
            ledger.event(tenant, "user.created");
        }
        1 | 4 => {
            let user = ledger
                .users
                .iter()
                .rev()
                .find(|(_, t)| *t == tenant)
                .map_or(0, |u| u.0);
            let total = format!("{}.{:02}", 10 + id % 90, id % 100);
            db.execute(
                "INSERT INTO orders (id, tenant_id, user_id, total, items) VALUES ($1, $2, $3, $4::text::numeric, $5::text::jsonb)",
                &[&id, &tenant, &user, &total, &format!(r#"[{{"sku": "SKU-{}", "qty": {}}}]"#, id % 17, 1 + id % 3)],
            )
            .await?;
            db.execute(
                "INSERT INTO invoices (id, tenant_id, order_id, amount) VALUES ($1, $2, $1, $3::text::numeric)",
                &[&id, &tenant, &total],
            )
            .await?;
            ledger.changes += 2;
            ledger.orders.push((id, tenant));
            ledger.invoices.push((id, tenant));
            ledger.event(tenant, "order.created");
        }
        2 => {
            if let Some((inv, t)) = ledger.invoices.pop() {
                // Two statements, one transaction: pay the invoice, ship the order.
                db.batch_execute(&format!(
                    "BEGIN; UPDATE invoices SET status = 'paid', paid_at = now() WHERE id = {inv};
                     UPDATE orders SET status = 'shipped' WHERE id = {inv}; COMMIT;"
                ))
                .await?;
                ledger.changes += 2;
                ledger.event(t, "invoice.paid");
                ledger.event(t, "order.shipped");
            }
        }
        _ => {
            if let Some(pos) = ledger.users.iter().position(|(_, t)| *t == tenant) {
                let (user, t) = ledger.users.remove(pos);
                db.execute("UPDATE users SET disabled = true WHERE id = $1", &[&user])
                    .await?;
                ledger.changes += 1;
                ledger.event(t, "user.disabled");
            }
        }
    }
    Ok(())
}

fn count_ok(receiver: &Receiver) -> HashMap<String, HashSet<String>> {
    let mut ok: HashMap<String, HashSet<String>> = HashMap::new();
    for r in receiver.received() {
        if (200..300).contains(&r.status) {
            ok.entry(r.path).or_default().insert(r.webhook_id);
        }
    }
    ok
}

/// How long endpoints may take to pass their ownership check (the dispatcher
/// looks for waiting endpoints every second).
const VERIFY_WITHIN: Duration = Duration::from_secs(30);

/// Waits until every endpoint of `created` passed its ownership check.
async fn wait_verified(
    platform: &Platform,
    created: &[(TenantId, walhook_pipeline::ids::EndpointId)],
) -> anyhow::Result<()> {
    let started = Instant::now();
    for (tenant, id) in created {
        loop {
            let record = platform
                .endpoint_of_tenant(tenant, *id)
                .await?
                .with_context(|| format!("endpoint {id} is gone"))?;
            if !record.verification.pending {
                break;
            }
            if started.elapsed() > VERIFY_WITHIN {
                anyhow::bail!(
                    "endpoint {id} did not pass its ownership check within {VERIFY_WITHIN:?}: {}",
                    record
                        .verification
                        .last_error
                        .as_deref()
                        .unwrap_or("no check was answered")
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}

/// Runs the demo.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    println!(
        "walhook demo: business writes in Postgres become signed webhooks on local receivers.\n"
    );
    println!("  starting a throwaway Postgres (wal_level = logical) …");
    let pg = LocalPostgres::start()
        .await
        .context("cannot start a throwaway Postgres")?;
    let shop_url = pg.create_database("shop").await?;
    let platform_url = pg.create_database("walhook").await?;
    let shop = pg.connect("shop").await?;
    shop.batch_execute(SHOP).await?;
    let mut platform_sql = pg.connect("walhook").await?;
    walhook_sql::migrate::run(&mut platform_sql).await?;
    // The database lives and dies with this process: so does its key.
    let platform =
        Platform::new(&platform_url, 16)?.with_keyring(walhook_sql::Keyring::ephemeral());

    let receiver = Receiver::start().await?;
    println!("  receivers listening on {}; endpoints:", receiver.addr());
    let mut created = Vec::with_capacity(ENDPOINTS.len());
    for ep in ENDPOINTS {
        let tenant = TenantId::new(ep.tenant)?;
        platform.create_tenant(&tenant, ep.tenant).await?;
        let types: Vec<EventType> = ep
            .types
            .iter()
            .map(|t| EventType::new(t))
            .collect::<Result<_, _>>()?;
        let (id, secret) = platform
            .create_endpoint(
                &NewEndpoint {
                    tenant_id: tenant,
                    url: receiver.url(ep.path),
                    event_types: types,
                    description: format!("demo endpoint {}", ep.path),
                    rate_limit_per_sec: None,
                    max_in_flight: None,
                    enabled: true,
                    retry: Default::default(),
                    ordering: Default::default(),
                    // Like an endpoint made through the API: nothing is
                    // sent until its receiver answers the ownership proof.
                    verify: true,
                },
                "demo",
            )
            .await?;
        receiver.set_secrets(ep.path, vec![secret.expose_text()]);
        created.push((TenantId::new(ep.tenant)?, id));
        if ep.flaky {
            receiver.set_behaviour(ep.path, Behaviour::FailEvery { n: 3, status: 503 });
        }
        let subs = if ep.types.is_empty() {
            "every type".to_owned()
        } else {
            ep.types.join(", ")
        };
        println!(
            "    {:<7} {:<18} {id}  {subs}{}",
            ep.tenant,
            ep.path,
            if ep.flaky {
                "  (flaky: every 3rd request gets 503)"
            } else {
                ""
            }
        );
    }

    let cfg_text = format!(
        r#"
[platform]
url = "{platform_url}"

[source]
url = "{shop_url}"
create_slot = true
create_publication = true
heartbeat_interval = "2s"
status_interval = "500ms"

[retry]
base_delay = "200ms"
max_delay = "2s"
slow_down_floor = "500ms"

[egress]
# Demo receivers are plain http on loopback; production configs never set this.
allow_http_loopback = true

[dispatch]
sweep_interval = "500ms"
{RULES}"#
    );
    let cfg = Config::parse(&cfg_text)?;
    let shutdown = CancellationToken::new();
    let running = walhook_cli::pipeline::start(&cfg, platform.clone(), shutdown.clone()).await?;
    let proven = Instant::now();
    wait_verified(&platform, &created).await?;
    println!(
        "\n  every endpoint proved ownership in {:.1} s: each receiver answered the signed \
         challenge with HMAC-SHA256(its secret, \"walhook-verification.v1.\" + challenge)",
        proven.elapsed().as_secs_f64()
    );
    println!(
        "\n  capture, fan-out and dispatch are running; writing business rows with plain SQL for {:?} …",
        args.duration
    );

    let mut ledger = Ledger::default();
    let bar = walhook_cli::progress::bar(
        args.duration.as_secs().max(1) * u64::from(args.rate),
        "business writes",
    );
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs(1) / args.rate.max(1));
    let mut step = 0u64;
    while started.elapsed() < args.duration {
        tick.tick().await;
        write(&shop, &mut ledger, step).await?;
        step += 1;
        bar.inc(1);
        if step.is_multiple_of(20) {
            let ok: usize = count_ok(&receiver).values().map(HashSet::len).sum();
            bar.set_message(format!("{ok} webhooks delivered"));
        }
    }
    bar.finish_and_clear();

    let expected = ledger.expected_per_endpoint();
    let expected_total: u64 = expected.values().sum();
    println!("  {step} writes done; waiting for the last deliveries …");
    let settle = Instant::now();
    let done = |ok: &HashMap<String, HashSet<String>>| {
        expected
            .iter()
            .all(|(path, n)| ok.get(*path).map_or(0, HashSet::len) as u64 >= *n)
    };
    while !done(&count_ok(&receiver)) && settle.elapsed() < args.settle {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The auditor's view of the same run: every stage compared, while
    // capture still runs (a stopped capture cannot show it is past the
    // window's end, and the window would be reported `capture_behind`).
    let window = walhook_reconcile::Window::parse("-1h", "now", std::time::SystemTime::now())?;
    let window = walhook_reconcile::Window {
        until: window.until + Duration::from_secs(60),
        ..window
    };
    let reconciler = walhook_reconcile::Reconciler::<walhook_archive::objstore::LocalDirStore>::new(
        platform.clone(),
        None,
        cfg.reconcile.settings(&cfg.source, cfg.retry.deadline),
    );
    let report = reconciler
        .run(
            &walhook_reconcile::Request {
                window,
                tenant: None,
                repair: false,
            },
            &walhook_reconcile::reconciler::Silent,
        )
        .await
        .context("reconciling the demo's run")?;
    let html = std::env::temp_dir().join("walhook-demo-reconciliation.html");
    std::fs::write(&html, walhook_reconcile::html::render(&report))
        .with_context(|| format!("cannot write {}", html.display()))?;
    shutdown.cancel();
    let counters = running.counters.clone();
    running.wait().await?;
    let captured = counters
        .capture
        .changes
        .load(std::sync::atomic::Ordering::Relaxed);

    let ok = count_ok(&receiver);
    let received = receiver.received();
    let verified = received.iter().filter(|r| r.verified == Some(true)).count();
    let row = platform_sql
        .query_one(
            "SELECT (SELECT count(*) FROM walhook.events), (SELECT count(*) FROM walhook.deliveries), \
                    (SELECT count(*) FROM walhook.deliveries WHERE status = 'succeeded'), \
                    (SELECT count(*) FROM walhook.attempts), \
                    (SELECT count(*) FROM walhook.attempts WHERE number > 1)",
            &[],
        )
        .await?;
    let (events, made, succeeded, attempts, retries): (i64, i64, i64, i64, i64) =
        (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
    let expected_events: u64 = ledger.events.values().sum();

    println!("\n  per endpoint                 expected  delivered");
    let mut all_ok = true;
    for (path, n) in &expected {
        let got = ok.get(*path).map_or(0, HashSet::len) as u64;
        all_ok &= got >= *n;
        println!(
            "    {:<26} {:>8}  {:>9}{}",
            path,
            n,
            got,
            if got >= *n { "" } else { "  MISSING" }
        );
    }
    println!("\n  summary");
    println!(
        "    row changes written / captured             {:>8} / {captured}",
        ledger.changes
    );
    println!(
        "    events                                     {:>8}  (expected {expected_events})",
        events
    );
    println!(
        "    deliveries expected                        {:>8}",
        expected_total
    );
    println!("    deliveries made                            {:>8}", made);
    println!(
        "    deliveries succeeded                       {:>8}",
        succeeded
    );
    println!(
        "    attempts                                   {:>8}",
        attempts
    );
    println!(
        "    retries                                    {:>8}",
        retries
    );
    println!(
        "    signatures verified by the receivers       {:>8} of {} requests",
        verified,
        received.len()
    );
    all_ok &= events as u64 == expected_events
        && made as u64 == expected_total
        && succeeded as u64 == expected_total;
    all_ok &= verified == received.len() && captured == ledger.changes;

    println!(
        "\n  reconciliation: {} — {} source changes, captured {} events, {} deliveries expected, {} made, {} gaps",
        if report.clean { "CLEAN" } else { "GAPS FOUND" },
        report.funnel.captured_changes.unwrap_or(0),
        report.funnel.captured_events.unwrap_or(0),
        report.funnel.expected_deliveries,
        report.funnel.materialised_deliveries,
        report.open_gaps()
    );
    println!("    the auditor's report: {}", html.display());
    all_ok &= report.clean;
    if all_ok {
        println!("\n  every expected delivery succeeded, every signature verified.");
        Ok(ExitCode::SUCCESS)
    } else {
        println!("\n  some expected deliveries did not succeed (see above).");
        Ok(ExitCode::FAILURE)
    }
}
