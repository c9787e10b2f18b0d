//! Helpers shared by the end-to-end tests.

#![allow(dead_code)]

pub mod api;
pub mod hostile;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

/// The `walhook` binary built for these tests.
pub fn walhook() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_walhook"));
    cmd.env("WALHOOK_LOG", "warn");
    cmd
}

/// Writes `text` as `walhook.toml` in `dir`.
pub fn write_config(dir: &Path, text: &str) -> PathBuf {
    let path = dir.join("walhook.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// Runs `cmd` to completion, returning its output.
pub fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("cannot run walhook")
}

/// Runs `walhook chaos ARGS --json F`, which must succeed; its report and
/// its standard output.
pub fn run_chaos(args: &[&str]) -> (serde_json::Value, String) {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("chaos.json");
    let out = run(walhook().arg("chaos").args(args).arg("--json").arg(&json));
    let text = stdout(&out);
    assert!(out.status.success(), "{text}\n{}", stderr(&out));
    let report = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    (report, text)
}

/// Stdout as text.
pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Stderr as text.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

use walhook_devkit::postgres::LocalPostgres;
use walhook_devkit::receiver::Receiver;
use walhook_pipeline::event::EventType;
use walhook_pipeline::ids::{EndpointId, TenantId};
use walhook_sql::Platform;
use walhook_sql::endpoints::NewEndpoint;

/// The business schema the end-to-end tests write to.
pub const SHOP_SCHEMA: &str = "
    CREATE TABLE invoices (id bigint PRIMARY KEY, tenant_id text NOT NULL, status text NOT NULL,
                           amount_cents bigint NOT NULL, currency text NOT NULL DEFAULT 'EUR');
    ALTER TABLE invoices REPLICA IDENTITY FULL;
    CREATE TABLE orders (id bigint PRIMARY KEY, tenant_id text NOT NULL, total numeric(12,2) NOT NULL);
    CREATE TABLE users (id bigint PRIMARY KEY, tenant_id text NOT NULL, email text NOT NULL,
                        disabled boolean NOT NULL DEFAULT false);
    ALTER TABLE users REPLICA IDENTITY FULL;
";

/// Rules over the shop schema.
pub const SHOP_RULES: &str = r#"
[[rules]]
name = "invoice_paid"
table = "invoices"
operations = ["update"]
when = [{ column = "status", changed_to = "paid" }]
event_type = "invoice.paid"
tenant_column = "tenant_id"
object_id_column = "id"
object_version = "lsn"

[[rules]]
name = "order_created"
table = "orders"
operations = ["insert"]
event_type = "order.created"
tenant_column = "tenant_id"
object_id_column = "id"

[[rules]]
name = "user_disabled"
table = "users"
operations = ["update"]
when = [{ column = "disabled", changed_to = true }]
event_type = "user.disabled"
tenant_column = "tenant_id"
object_id_column = "id"
include = ["id", "email"]
"#;

/// The role walhook captures as (REPLICATION, SELECT on the shop tables).
pub const SOURCE_ROLE: &str = "walhook_source";
/// The role that owns the platform schema.
pub const PLATFORM_ROLE: &str = "walhook_platform";

/// Runs the least-privilege walhook-setup.sql that `walhook init` writes
/// for the shop schema (the source part on the shop's cluster, the
/// platform part on the platform's); returns the URLs of the captured and
/// the platform database as the two roles.
async fn least_privilege(
    pg: &LocalPostgres,
    ppg: &LocalPostgres,
    shop: &tokio_postgres::Client,
    dir: &Path,
) -> (String, String) {
    use walhook_connectors::postgres::init::{self, render};
    let shapes = init::introspect(shop, &init::Selection::default())
        .await
        .unwrap();
    let plan = init::plan(&shapes);
    let source_url = role_url(SOURCE_ROLE, pg, "shop");
    let platform_url = role_url(PLATFORM_ROLE, ppg, "platform");
    let targets = render::Targets {
        source_url: source_url.clone(),
        platform_url: platform_url.clone(),
        source_database: "shop".into(),
        platform_database: "platform".into(),
        source_name: "main".into(),
        slot: "walhook".into(),
        publication: "walhook".into(),
        source_role: SOURCE_ROLE.into(),
        platform_role: PLATFORM_ROLE.into(),
        master_key_file: "master.key".into(),
    };
    for (cluster, database, sql, name) in [
        (
            pg,
            "shop",
            render::source_setup_sql(&plan, &targets),
            "setup-source.sql",
        ),
        (
            ppg,
            "postgres",
            render::platform_setup_sql(&targets),
            "setup-platform.sql",
        ),
    ] {
        let file = dir.join(name);
        std::fs::write(&file, sql).unwrap();
        let out = psql_file(cluster, database, &file);
        assert!(
            out.status.success(),
            "{name}: {}{}",
            stdout(&out),
            stderr(&out)
        );
    }
    (source_url, platform_url)
}

/// `database` of `pg` as `role` (no password: the test clusters trust
/// loopback).
fn role_url(role: &str, pg: &LocalPostgres, database: &str) -> String {
    format!("postgres://{role}@127.0.0.1:{}/{database}", pg.port())
}

/// Runs the SQL file `file` with psql on `database` as the superuser,
/// stopping at the first error (as an administrator applies
/// walhook-setup.sql).
pub fn psql_file(pg: &LocalPostgres, database: &str, file: &Path) -> Output {
    run(Command::new(pg.bin_dir().join("psql"))
        .arg(pg.url(database))
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-f"])
        .arg(file))
}

/// Creates `tenant` (if new) on `platform` and an endpoint of it at `url`
/// for `types` (all when empty), with settings changed by `tweak`; returns
/// its id and signing secret.
pub async fn create_endpoint_on(
    platform: &Platform,
    tenant: &str,
    url: &str,
    types: &[&str],
    tweak: impl FnOnce(&mut NewEndpoint),
) -> (EndpointId, walhook_pipeline::signing::SigningSecret) {
    let tenant_id = TenantId::new(tenant).unwrap();
    platform.create_tenant(&tenant_id, tenant).await.unwrap();
    let mut endpoint = NewEndpoint {
        tenant_id,
        url: url.to_owned(),
        event_types: types.iter().map(|t| EventType::new(t).unwrap()).collect(),
        description: String::new(),
        rate_limit_per_sec: None,
        max_in_flight: None,
        enabled: true,
        retry: Default::default(),
        ordering: Default::default(),
        verify: false,
    };
    tweak(&mut endpoint);
    platform.create_endpoint(&endpoint, "test").await.unwrap()
}

/// A plain connection to `url`, its driver spawned.
#[allow(clippy::disallowed_methods)] // bare spawn: a test connection's driver
async fn connect_as(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
}

/// A shop database, a platform database and a receiver.
pub struct World {
    /// The cluster (of both databases, unless [`World::new_split`]).
    pub pg: LocalPostgres,
    /// The platform database's own cluster, with [`World::new_split`].
    pub platform_pg: Option<LocalPostgres>,
    /// The business database.
    pub shop: tokio_postgres::Client,
    /// The platform.
    pub platform: Platform,
    /// A SQL session on the platform database.
    pub platform_sql: tokio_postgres::Client,
    /// The receiver.
    pub receiver: Receiver,
    /// The config file's directory.
    pub dir: tempfile::TempDir,
    /// The master key file (in `dir`) that `platform` and the config use.
    pub master_key_file: PathBuf,
    /// The shop database as the source role (what walhook captures as).
    source_url: String,
    /// The platform database as the platform role.
    platform_url: String,
}

/// The Python of the test tools (`WALHOOK_PYTHON`, else the virtualenv
/// `scripts/test.sh` makes, else `python3`).
pub fn python() -> PathBuf {
    if let Ok(p) = std::env::var("WALHOOK_PYTHON") {
        return PathBuf::from(p);
    }
    let venv = PathBuf::from(std::env::var("HOME").unwrap_or_default())
        .join(".cache/walhook-venv/bin/python");
    if venv.exists() {
        venv
    } else {
        PathBuf::from("python3")
    }
}

/// Writes a fresh master key to `dir/name` (mode 600); returns its path.
pub fn write_master_key(dir: &Path, name: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, walhook_sql::secrets::MasterKey::generate_text()).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

impl World {
    /// Starts Postgres, creates both databases, migrates, starts a receiver.
    pub async fn new() -> World {
        World::start(false, true).await
    }

    /// As [`World::new`], with the platform schema left for a `walhook
    /// migrate` to create (the upgrade test migrates with an older binary).
    pub async fn unmigrated() -> World {
        World::start(false, false).await
    }

    /// As [`World::new`], with the platform database on a cluster of its
    /// own (`platform_pg`), so that each can fail alone.
    pub async fn new_split() -> World {
        World::start(true, true).await
    }

    async fn start(split: bool, migrate: bool) -> World {
        let pg = LocalPostgres::start().await.unwrap();
        let platform_pg = if split {
            Some(LocalPostgres::start().await.unwrap())
        } else {
            None
        };
        pg.create_database("shop").await.unwrap();
        let ppg = platform_pg.as_ref().unwrap_or(&pg);
        ppg.create_database("platform").await.unwrap();
        let shop = pg.connect("shop").await.unwrap();
        shop.batch_execute(SHOP_SCHEMA).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        // walhook runs as the least-privilege roles of walhook-setup.sql,
        // as `walhook init` writes it for this schema; the test itself
        // (producers, assertions) keeps the superuser.
        let (source_url, platform_url) = least_privilege(&pg, ppg, &shop, dir.path()).await;
        if migrate {
            let mut owner = connect_as(&platform_url).await;
            walhook_sql::migrate::run(&mut owner).await.unwrap();
        }
        let platform_sql = ppg.connect("platform").await.unwrap();
        let master_key_file = write_master_key(dir.path(), "master.key");
        let keyring = walhook_sql::Keyring::new(
            walhook_sql::secrets::MasterKey::read_file(&master_key_file).unwrap(),
            vec![],
        );
        // The test's own hand on the platform (tenants, endpoints, seeded
        // history) is walhook's role too: what it creates (a day's
        // partition) is then what walhook's processes own.
        let platform = Platform::new(&platform_url, 4)
            .unwrap()
            .with_keyring(keyring);
        let receiver = Receiver::start().await.unwrap();
        World {
            pg,
            platform_pg,
            shop,
            platform,
            platform_sql,
            receiver,
            dir,
            master_key_file,
            source_url,
            platform_url,
        }
    }

    /// Adds `table` (created by a test after the world started) to what
    /// the source role may read and the publication carries, as an
    /// administrator re-running walhook-setup.sql would.
    pub async fn publish(&self, table: &str) {
        self.shop
            .batch_execute(&format!(
                "GRANT SELECT ON {table} TO {SOURCE_ROLE}; ALTER PUBLICATION walhook ADD TABLE {table};"
            ))
            .await
            .unwrap();
    }

    /// The platform database `database` of the platform's cluster, as the
    /// platform role.
    pub fn platform_role_url(&self, database: &str) -> String {
        role_url(
            PLATFORM_ROLE,
            self.platform_pg.as_ref().unwrap_or(&self.pg),
            database,
        )
    }

    /// Registers an endpoint on the receiver at `path`; the receiver
    /// verifies its signatures.
    pub async fn endpoint(&self, tenant: &str, path: &str, types: &[&str]) -> EndpointId {
        self.endpoint_with(tenant, path, types, |_| {}).await
    }

    /// [`World::endpoint`] with settings changed by `tweak` (its cap, its
    /// retries…).
    pub async fn endpoint_with(
        &self,
        tenant: &str,
        path: &str,
        types: &[&str],
        tweak: impl FnOnce(&mut NewEndpoint),
    ) -> EndpointId {
        let (id, secret) = self
            .create_endpoint(tenant, &self.receiver.url(path), types, tweak)
            .await;
        self.receiver.set_secrets(path, vec![secret.expose_text()]);
        id
    }

    /// Registers an endpoint of `tenant` at any `url` (no signature
    /// checks); returns its id.
    pub async fn endpoint_at(&self, tenant: &str, url: &str, types: &[&str]) -> EndpointId {
        self.create_endpoint(tenant, url, types, |_| {}).await.0
    }

    /// Creates `tenant` (if new) and an endpoint of it at `url`, with
    /// settings changed by `tweak`; returns its id and signing secret.
    pub async fn create_endpoint(
        &self,
        tenant: &str,
        url: &str,
        types: &[&str],
        tweak: impl FnOnce(&mut NewEndpoint),
    ) -> (EndpointId, walhook_pipeline::signing::SigningSecret) {
        create_endpoint_on(&self.platform, tenant, url, types, tweak).await
    }

    /// The business database's URL.
    pub fn shop_url(&self) -> String {
        self.pg.url("shop")
    }

    /// Waits until `walhook run` streams from the slot (writes before the
    /// slot exists are not captured).
    pub async fn wait_streaming(&self) {
        let active = walhook_devkit::postgres::wait_slot_active(
            &self.shop,
            "walhook",
            Duration::from_secs(30),
        )
        .await
        .unwrap();
        assert!(active, "walhook did not start streaming within 30 s");
    }

    /// Polls the platform database until `sql` (one `int8`) reaches `want`;
    /// panics after 60 s naming `what` and the state.
    pub async fn wait_count(&self, what: &str, sql: &str, want: i64) {
        let n = self
            .count_reaching(sql, want, Duration::from_secs(60))
            .await;
        if n < want {
            panic!("{what}: {n} of {want} after 60 s; {}", self.state().await);
        }
    }

    /// Polls the count `sql` until it reaches `want` or `limit` has passed;
    /// the last count.
    pub async fn count_reaching(&self, sql: &str, want: i64, limit: Duration) -> i64 {
        let deadline = std::time::Instant::now() + limit;
        loop {
            let n: i64 = self.platform_sql.query_one(sql, &[]).await.unwrap().get(0);
            if n >= want || std::time::Instant::now() > deadline {
                return n;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Panics unless every pending delivery, and only a pending one, has its
    /// row in `walhook.pending` (the invariant every status change keeps).
    pub async fn assert_pending_consistent(&self) {
        let row = self
            .platform_sql
            .query_one(
                "SELECT (SELECT count(*) FROM walhook.deliveries d WHERE d.status = 'pending' \
                           AND NOT EXISTS (SELECT 1 FROM walhook.pending p WHERE p.delivery_id = d.id)), \
                        (SELECT count(*) FROM walhook.pending p WHERE NOT EXISTS \
                           (SELECT 1 FROM walhook.deliveries d WHERE d.id = p.delivery_id AND d.status = 'pending'))",
                &[],
            )
            .await
            .unwrap();
        let (missing, extra): (i64, i64) = (row.get(0), row.get(1));
        assert_eq!(
            (missing, extra),
            (0, 0),
            "pending deliveries without a pending row, and pending rows of deliveries that are not pending"
        );
    }

    /// Panics unless every delivery fan-out planned has its row (call once
    /// every delivery is done).
    pub async fn assert_plans_written(&self) {
        let missing: i64 = self
            .platform_sql
            .query_one(
                "SELECT count(*) FROM walhook.fanouts f CROSS JOIN LATERAL unnest(f.delivery_ids) AS x(id) \
                 WHERE NOT EXISTS (SELECT 1 FROM walhook.deliveries d WHERE d.id = x.id)",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(missing, 0, "planned deliveries that never got their row");
    }

    /// Counts of the platform's tables and the receiver's requests, for
    /// failure messages.
    pub async fn state(&self) -> String {
        let row = self
            .platform_sql
            .query_one(
                "SELECT (SELECT count(*) FROM walhook.events), (SELECT count(*) FROM walhook.deliveries), \
                        (SELECT count(*) FROM walhook.deliveries WHERE status = 'succeeded'), \
                        (SELECT count(*) FROM walhook.attempts), \
                        (SELECT count(*) FROM walhook.capture_incidents), \
                        (SELECT string_agg(DISTINCT coalesce(last_error_class, '-'), ',') FROM walhook.deliveries)",
                &[],
            )
            .await
            .unwrap();
        let (e, d, s, a, i): (i64, i64, i64, i64, i64) =
            (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
        let errors: Option<String> = row.get(5);
        // Plans left (deliveries waiting for their first row) and attempts
        // of deliveries that have no row: both say where a delivery stopped.
        let plans: Vec<String> = self
            .platform_sql
            .query(
                "SELECT format('%s: %s of %s written, lease %s v%s', f.event_id, \
                        (SELECT count(*) FROM walhook.deliveries d WHERE d.id = ANY (f.delivery_ids)), \
                        cardinality(f.delivery_ids), coalesce(f.lease_owner, '-'), f.lease_version) \
                 FROM walhook.fanouts f ORDER BY f.event_id LIMIT 5",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        let rowless: Vec<String> = self
            .platform_sql
            .query(
                "SELECT format('%s (%s attempts)', a.delivery_id, count(*)) FROM walhook.attempts a \
                 WHERE NOT EXISTS (SELECT 1 FROM walhook.deliveries d WHERE d.id = a.delivery_id) \
                 GROUP BY a.delivery_id LIMIT 5",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        format!(
            "events {e}, deliveries {d} ({s} succeeded), attempts {a}, incidents {i}, errors {errors:?}, requests received {}, \
             plans left {plans:?}, attempted deliveries without a row {rowless:?}",
            self.receiver.count()
        )
    }

    /// The config for `walhook run` against this world (with the world's
    /// master key, unless `extra` has a `[secrets]` section).
    pub fn config(&self, extra: &str) -> PathBuf {
        let secrets = if extra.contains("[secrets]") {
            String::new()
        } else {
            format!(
                "[secrets]\nmaster_key_file = {:?}\n",
                self.master_key_file.display().to_string()
            )
        };
        write_config(
            self.dir.path(),
            &format!(
                r#"
{secrets}
[platform]
url = "{}"

[source]
url = "{}"
create_slot = true
create_publication = false
heartbeat_interval = "1s"
status_interval = "200ms"

[retry]
base_delay = "100ms"
max_delay = "1s"
slow_down_floor = "200ms"
max_attempts = 50

[egress]
allow_http_loopback = true
request_timeout = "5s"

[dispatch]
sweep_interval = "200ms"
lease = "10s"

{extra}
{SHOP_RULES}
"#,
                self.platform_url, self.source_url
            ),
        )
    }
}

/// A running `walhook run` child, killed when dropped.
pub struct Child(pub std::process::Child);

impl Child {
    /// Starts `walhook run --config cfg`.
    pub fn run(cfg: &Path) -> Child {
        Child::run_with_env(cfg, &[])
    }

    /// Starts `walhook api --config cfg`.
    pub fn api(cfg: &Path) -> Child {
        Child(
            walhook()
                .args(["api", "--config"])
                .arg(cfg)
                .spawn()
                .expect("cannot start walhook api"),
        )
    }

    /// Starts `walhook run --config cfg` with `env` added to the
    /// environment.
    pub fn run_with_env(cfg: &Path, env: &[(&str, &str)]) -> Child {
        let child = walhook()
            .args(["run", "--config"])
            .arg(cfg)
            .env(
                "WALHOOK_LOG",
                std::env::var("WALHOOK_TEST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .envs(env.iter().copied())
            .spawn()
            .expect("cannot start walhook run");
        Child(child)
    }

    /// Starts `walhook <command> --config cfg <args>` with `env` added.
    pub fn stage(command: &str, cfg: &Path, args: &[&str], env: &[(&str, &str)]) -> Child {
        let child = walhook()
            .args([command, "--config"])
            .arg(cfg)
            .args(args)
            .env(
                "WALHOOK_LOG",
                std::env::var("WALHOOK_TEST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .envs(env.iter().copied())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start walhook {command}: {e}"));
        Child(child)
    }

    /// Starts `walhook run --config cfg` with `env` added, its stderr (the
    /// log) written to `log`.
    pub fn run_logged(cfg: &Path, env: &[(&str, &str)], log: &Path) -> Child {
        Child::run_with(cfg, env, &[], log)
    }

    /// `walhook run --config cfg ARGS…` with `env`, stderr into `log`.
    pub fn run_with(cfg: &Path, env: &[(&str, &str)], args: &[&str], log: &Path) -> Child {
        let file = std::fs::File::create(log).unwrap();
        let child = walhook()
            .args(["run", "--config"])
            .arg(cfg)
            .args(args)
            .env("WALHOOK_LOG", "warn")
            .envs(env.iter().copied())
            .stderr(file)
            .spawn()
            .expect("cannot start walhook run");
        Child(child)
    }

    /// Waits up to `limit` for the process to exit by itself.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + limit;
        while std::time::Instant::now() < deadline {
            if let Some(status) = self.0.try_wait().unwrap() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// Whether the process still runs.
    pub fn running(&mut self) -> bool {
        self.0.try_wait().unwrap().is_none()
    }

    /// Sends `sig` (a name `kill` knows: STOP, CONT, …).
    pub fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.0.id().to_string())
            .status()
            .unwrap();
        assert!(status.success(), "kill -{sig}");
    }

    /// SIGKILL, no clean-up.
    pub fn kill(mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }

    /// SIGTERM, then the exit status. The signal is sent once the process
    /// catches it: a SIGTERM that arrives before walhook's handler is in
    /// place kills it (a test that stops a process it just started would
    /// otherwise see a failed exit that no user's shutdown ever has).
    pub fn terminate(mut self) -> std::process::ExitStatus {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !catches_sigterm(self.0.id()) && std::time::Instant::now() < deadline {
            if self.0.try_wait().unwrap().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // SAFETY-free: `kill` the command sends SIGTERM.
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.0.id().to_string())
            .status();
        let status = self.0.wait().unwrap();
        std::mem::forget(self);
        status
    }
}

/// Whether process `pid` has a handler for SIGTERM (signal 15: bit 14 of
/// `SigCgt` in `/proc/PID/status`).
fn catches_sigterm(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            let mask = status.lines().find_map(|l| l.strip_prefix("SigCgt:"))?;
            u64::from_str_radix(mask.trim(), 16).ok()
        })
        .is_some_and(|mask| mask & (1 << 14) != 0)
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `walhook reconcile` over the last ten minutes (and the next two)
/// with `cfg`, and panics unless it finds every stage in agreement.
pub fn assert_recent_window_reconciles(cfg: &Path) {
    let now = chrono::Utc::now();
    let fmt =
        |t: chrono::DateTime<chrono::Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let (since, until) = (
        fmt(now - chrono::Duration::minutes(10)),
        fmt(now + chrono::Duration::minutes(2)),
    );
    let out = run(walhook()
        .args(["reconcile", "--config"])
        .arg(cfg)
        .args(["--since", &since, "--until", &until]));
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
}
