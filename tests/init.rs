//! `walhook init` on a schema it never saw: the config it writes is
//! accepted as written (doctor passes once walhook-setup.sql ran, twice),
//! walhook runs under the least-privilege roles the SQL made, and a write
//! to each table becomes a delivered webhook.

use std::time::Duration;

use walhook_devkit::postgres::LocalPostgres;
use walhook_devkit::receiver::Receiver;
use walhook_sql::Platform;

use crate::support::{Child, create_endpoint_on, psql_file, run, stderr, stdout, walhook};

/// An ERP-like schema: composite keys, another schema, a table without a
/// tenant column, one without a primary key, an outbox, a partitioned
/// table, and things init must leave alone (an unlogged table, a view).
pub(crate) const ERP: &str = r#"
CREATE SCHEMA billing;
CREATE TABLE customers (id bigserial PRIMARY KEY, tenant_id text NOT NULL, name text NOT NULL,
                        notes text);
CREATE TABLE order_lines (tenant_id text NOT NULL, order_id bigint NOT NULL, line_no int NOT NULL,
                          sku text, qty int, PRIMARY KEY (tenant_id, order_id, line_no));
CREATE TABLE currencies (code char(3) PRIMARY KEY, name text NOT NULL);
CREATE TABLE billing.invoices (id uuid PRIMARY KEY, org_id text NOT NULL, amount numeric(12,2),
                               status text);
CREATE TABLE outbox (id bigserial PRIMARY KEY, tenant_id text NOT NULL, aggregate_id text NOT NULL,
                     event_type text NOT NULL, payload jsonb NOT NULL);
CREATE TABLE audit_log (account_id text NOT NULL, message text, at timestamptz DEFAULT now());
CREATE TABLE "Stock Levels" ("Warehouse" text, sku text, tenant_id text NOT NULL, qty int,
                             PRIMARY KEY ("Warehouse", sku));
CREATE TABLE metrics (tenant_id text NOT NULL, day date NOT NULL, value int,
                      PRIMARY KEY (tenant_id, day)) PARTITION BY RANGE (day);
CREATE TABLE metrics_2026 PARTITION OF metrics FOR VALUES FROM ('2026-01-01') TO ('2027-01-01');
CREATE UNLOGGED TABLE cache (k text PRIMARY KEY, v text);
CREATE VIEW big_customers AS SELECT * FROM customers;
"#;

/// The writes, one or more per table, and the event types they make.
const WRITES: &str = r#"
INSERT INTO customers (tenant_id, name) VALUES ('acme', 'Ada');
UPDATE customers SET notes = 'vip' WHERE name = 'Ada';
DELETE FROM customers WHERE name = 'Ada';
INSERT INTO order_lines VALUES ('acme', 7, 1, 'a:b%c', 2);
DELETE FROM order_lines WHERE order_id = 7;
INSERT INTO currencies VALUES ('EUR', 'Euro');
INSERT INTO billing.invoices VALUES ('6f1c2d3e-0000-4000-8000-000000000001', 'acme', 10.50, 'open');
INSERT INTO outbox (tenant_id, aggregate_id, event_type, payload)
     VALUES ('acme', 'order-7', 'order.shipped', '{"carrier": "dhl"}');
INSERT INTO audit_log (account_id, message) VALUES ('acme', 'hello');
UPDATE audit_log SET message = 'bye';
INSERT INTO "Stock Levels" VALUES ('North', 'sku-1', 'acme', 3);
INSERT INTO metrics VALUES ('acme', '2026-06-01', 42);
INSERT INTO cache VALUES ('k', 'v');
"#;

const EXPECTED: &[(&str, &str)] = &[
    ("acme", "customers.created"),
    ("acme", "customers.updated"),
    ("acme", "customers.deleted"),
    ("acme", "order_lines.created"),
    ("acme", "order_lines.deleted"),
    ("default", "currencies.created"),
    ("acme", "billing.invoices.created"),
    ("acme", "order.shipped"),
    ("acme", "audit_log.created"),
    ("acme", "audit_log.updated"),
    ("acme", "stock_levels.created"),
    ("acme", "metrics.created"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_writes_a_config_that_runs_as_written_under_least_privilege_roles() {
    let pg = LocalPostgres::start().await.unwrap();
    pg.create_database("erp").await.unwrap();
    let erp = pg.connect("erp").await.unwrap();
    erp.batch_execute(ERP).await.unwrap();
    let dir = tempfile::tempdir().unwrap();

    let out = run(walhook()
        .args(["init", "--source", &pg.url("erp"), "--out"])
        .arg(dir.path()));
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let said = stdout(&out);
    assert!(
        said.contains("public.currencies: REVIEW: no tenant column found"),
        "{said}"
    );
    assert!(said.contains("skipped public.cache: UNLOGGED"), "{said}");
    assert!(
        said.contains("skipped public.metrics_2026: a partition of public.metrics"),
        "{said}"
    );
    let config = dir.path().join("walhook.toml");
    let setup = dir.path().join("walhook-setup.sql");
    let toml = std::fs::read_to_string(&config).unwrap();
    assert!(
        toml.contains(r#"object_id_column = ["tenant_id", "order_id", "line_no"]"#),
        "{toml}"
    );
    assert!(toml.contains("kind = \"outbox\""), "{toml}");
    assert!(
        !toml.contains("big_customers"),
        "a view is not a table: {toml}"
    );
    assert!(
        toml.contains(&format!(
            "postgres://walhook_source@127.0.0.1:{}/erp",
            pg.port()
        )),
        "{toml}"
    );

    // A second init refuses to overwrite what the operator may have edited.
    let again = run(walhook()
        .args(["init", "--source", &pg.url("erp"), "--out"])
        .arg(dir.path()));
    assert!(!again.status.success());
    assert!(stderr(&again).contains("--force"), "{}", stderr(&again));

    // The setup SQL, as an administrator would run it: twice, since it
    // must be idempotent.
    for round in 0..2 {
        let out = psql_file(&pg, "erp", &setup);
        assert!(
            out.status.success(),
            "walhook-setup.sql failed in round {round}: {}{}",
            stdout(&out),
            stderr(&out)
        );
    }
    // Least privilege: neither role is a superuser, the source role reads
    // only the published tables, and the platform role owns only its schema.
    let roles = erp
        .query(
            "SELECT rolname::text, rolsuper, rolreplication, rolcreatedb, rolcreaterole \
               FROM pg_roles WHERE rolname LIKE 'walhook\\_%' ORDER BY 1",
            &[],
        )
        .await
        .unwrap();
    let roles: Vec<(String, bool, bool, bool, bool)> = roles
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
        .collect();
    assert_eq!(
        roles,
        [
            ("walhook_platform".into(), false, false, false, false),
            ("walhook_source".into(), false, true, false, false),
        ]
    );
    let reads_cache: bool = erp
        .query_one(
            "SELECT has_table_privilege('walhook_source', 'public.cache', 'SELECT')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        !reads_cache,
        "the source role reads only the published tables"
    );

    let walhook_cmd = |args: &[&str]| {
        let mut cmd = walhook();
        cmd.args(args).arg("--config").arg(&config);
        run(&mut cmd)
    };
    let out = walhook_cmd(&["migrate"]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let out = walhook_cmd(&["doctor"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "doctor on the config as written:\n{}{}",
        stdout(&out),
        stderr(&out)
    );

    // Endpoints for both tenants, on a local receiver. The one line added
    // to the config lets deliveries reach loopback: tests send nowhere else.
    let receiver = Receiver::start().await.unwrap();
    let keyring = walhook_sql::Keyring::new(
        walhook_sql::secrets::MasterKey::read_file(&dir.path().join("master.key")).unwrap(),
        vec![],
    );
    let platform = Platform::new(&pg.url("walhook"), 2)
        .unwrap()
        .with_keyring(keyring);
    for tenant in ["acme", "default"] {
        let (_, secret) =
            create_endpoint_on(&platform, tenant, &receiver.url(tenant), &[], |_| {}).await;
        receiver.set_secrets(tenant, vec![secret.expose_text()]);
    }
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str("\n[egress]\nallow_http_loopback = true\n");
    std::fs::write(&config, text).unwrap();

    let mut child = Child::run(&config);
    let active =
        walhook_devkit::postgres::wait_slot_active(&erp, "walhook", Duration::from_secs(60))
            .await
            .unwrap();
    assert!(active, "walhook did not start streaming as walhook_source");
    erp.batch_execute(WRITES).await.unwrap();
    let arrived = receiver
        .wait_until(Duration::from_secs(60), |r| r.len() >= EXPECTED.len())
        .await;
    let got: Vec<(String, String, serde_json::Value)> = receiver
        .received()
        .iter()
        .map(|r| {
            let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
            (
                r.path.clone(),
                body["type"].as_str().unwrap_or_default().to_owned(),
                body,
            )
        })
        .collect();
    assert!(
        arrived && child.running(),
        "{} of {} webhooks arrived: {got:#?}",
        got.len(),
        EXPECTED.len()
    );
    for (tenant, ty) in EXPECTED {
        assert!(
            got.iter().any(|(p, t, _)| p == tenant && t == ty),
            "no {ty} for {tenant}: {got:#?}"
        );
    }
    assert_eq!(got.len(), EXPECTED.len(), "nothing else arrived: {got:#?}");
    // The composite key's id escapes what would make it ambiguous.
    let line = got
        .iter()
        .find(|(_, t, _)| t == "order_lines.created")
        .unwrap();
    let line_body = line.2.to_string();
    assert!(line_body.contains("\"acme:7:1\""), "{line_body}");
    child.terminate();

    // A right that went missing: a day partition made by a superuser (say,
    // a manual migrate as postgres) is one walhook cannot drop or alter.
    // doctor names it with the statements that hand it back, and passes
    // once an administrator ran them.
    let admin = pg.connect("walhook").await.unwrap();
    admin
        .batch_execute(
            "SELECT walhook.ensure_day_partition('attempts', (now() AT TIME ZONE 'UTC')::date + 30)",
        )
        .await
        .unwrap();
    let out = walhook_cmd(&["doctor", "--json"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    let report: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let rights = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["check"] == "platform.rights")
        .unwrap_or_else(|| panic!("no platform.rights finding: {report:#}"));
    assert_eq!(rights["verdict"], "fail", "{rights:#}");
    assert!(
        rights["detail"]
            .as_str()
            .unwrap()
            .contains("1 tables or views"),
        "{rights:#}"
    );
    let fix = rights["fix"].as_str().unwrap();
    let sql = fix
        .strip_prefix("as a superuser on the platform database: ")
        .unwrap_or_else(|| panic!("{fix}"));
    admin.batch_execute(sql).await.unwrap();
    let out = walhook_cmd(&["doctor"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
}
