//! The throwaway world a chaos run writes into: Postgres with the shop
//! (an `orders` table) and the platform database, three tenants with their
//! endpoints, each behind a fault proxy of its own in front of one loopback
//! receiver, and the `walhook` config that ties them together.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use walhook_devkit::faultproxy::FaultProxy;
use walhook_devkit::fluvio::FluvioCluster;
use walhook_devkit::postgres::{LocalPostgres, connect_retrying, wait_slot_active};
use walhook_devkit::receiver::Receiver;
use walhook_pipeline::event::EventType;
use walhook_pipeline::ids::TenantId;
use walhook_sql::Platform;
use walhook_sql::endpoints::NewEndpoint;

use super::process::Walhook;
use super::storm;

/// `[log] member_lease` of a chaos run on Fluvio; a frozen member stays
/// frozen this long and three seconds more.
pub(super) const MEMBER_LEASE: Duration = Duration::from_secs(4);

/// `[egress] request_timeout` of the chaos config: no attempt may last
/// longer than this and a second.
pub(super) const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

const SHOP: &str = "
    CREATE TABLE orders (id bigint PRIMARY KEY, tenant_id text NOT NULL,
                         status text NOT NULL DEFAULT 'placed', total numeric(12,2) NOT NULL);
    ALTER TABLE orders REPLICA IDENTITY FULL;
";

const RULES: &str = r#"
[[rules]]
name = "order_created"
table = "orders"
operations = ["insert"]
event_type = "order.created"
tenant_column = "tenant_id"
object_id_column = "id"

[[rules]]
name = "order_paid"
table = "orders"
operations = ["update"]
when = [{ column = "status", changed_to = "paid" }]
event_type = "order.paid"
tenant_column = "tenant_id"
object_id_column = "id"
"#;

pub(super) const TENANTS: &[&str] = &["acme", "globex", "initech"];

/// Orders `$1` to `$2` in one statement, the tenants taking turns.
pub(super) const INSERT_ORDERS: &str = "INSERT INTO orders (id, tenant_id, total) \
     SELECT g, (ARRAY['acme', 'globex', 'initech'])[1 + (g % 3)::int], 9.99 \
     FROM generate_series($1::bigint, $2::bigint) g";

/// One endpoint of the workload.
pub(super) struct Ep {
    tenant: &'static str,
    pub(super) path: String,
    /// Subscribed types; empty: every type.
    types: &'static [&'static str],
    pub(super) proxy: FaultProxy,
}

impl Ep {
    pub(super) fn wants(&self, tenant: &str, event_type: &str) -> bool {
        self.tenant == tenant && (self.types.is_empty() || self.types.contains(&event_type))
    }
}

/// The throwaway world of a chaos run: Postgres with the shop and the
/// platform, the receiver, the endpoints behind their fault proxies, and
/// `walhook run`'s config.
pub(super) struct World {
    dir: tempfile::TempDir,
    pub(super) pg: LocalPostgres,
    pub(super) cfg: PathBuf,
    pub(super) log: PathBuf,
    pub(super) receiver: Receiver,
    pub(super) endpoints: Vec<Ep>,
    /// The platform database as walhook's own role.
    pub(super) platform_url: String,
    /// The Fluvio cluster of a run with --log fluvio.
    pub(super) cluster: Option<std::sync::Arc<FluvioCluster>>,
}

impl World {
    /// Sets the world up; each tenant gets `all_per_tenant` endpoints for
    /// every type and one for `order.paid` only.
    pub(super) async fn start(all_per_tenant: usize) -> anyhow::Result<World> {
        World::start_on(all_per_tenant, None, None).await
    }

    /// [`World::start`], with the stages on `cluster` when given (and
    /// `[log] dispatch = "by-endpoint"` over `by_endpoint` deliveries
    /// partitions when given).
    pub(super) async fn start_on(
        all_per_tenant: usize,
        cluster: Option<FluvioCluster>,
        by_endpoint: Option<u32>,
    ) -> anyhow::Result<World> {
        let dir = tempfile::tempdir()?;
        let pg = LocalPostgres::start()
            .await
            .context("cannot start a throwaway Postgres")?;
        let shop_url = pg.create_database("shop").await?;
        pg.create_database("walhook").await?;
        storm::create_app_role(&pg, "walhook").await?;
        let platform_url = pg.url("walhook").replacen(
            "postgres://postgres@",
            &format!("postgres://{}@", storm::APP_ROLE),
            1,
        );
        pg.connect("shop").await?.batch_execute(SHOP).await?;
        walhook_sql::migrate::run(
            &mut connect_retrying(&platform_url, Duration::from_secs(10)).await?,
        )
        .await?;
        let key_file = dir.path().join("master.key");
        std::fs::write(&key_file, walhook_sql::secrets::MasterKey::generate_text())?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600))?;
        }
        let platform = Platform::new(&platform_url, 4)?.with_keyring(walhook_sql::Keyring::new(
            walhook_sql::secrets::MasterKey::read_file(&key_file)?,
            vec![],
        ));
        let receiver = Receiver::start().await?;
        let mut endpoints = Vec::new();
        for tenant in TENANTS {
            let id = TenantId::new(*tenant)?;
            platform.create_tenant(&id, tenant).await?;
            let mut kinds: Vec<(String, &'static [&'static str])> = (0..all_per_tenant)
                .map(|i| {
                    let name = if i == 0 {
                        "all".to_owned()
                    } else {
                        format!("all-{i}")
                    };
                    (name, &[][..])
                })
                .collect();
            kinds.push(("paid".to_owned(), &["order.paid"][..]));
            for (suffix, types) in kinds {
                let path = format!("{tenant}-{suffix}");
                let proxy = FaultProxy::start(receiver.addr()).await?;
                let (_, secret) = platform
                    .create_endpoint(
                        &NewEndpoint {
                            tenant_id: id.clone(),
                            url: proxy.url(&path),
                            event_types: types
                                .iter()
                                .map(|t| EventType::new(t))
                                .collect::<Result<_, _>>()?,
                            description: format!("chaos endpoint {path}"),
                            rate_limit_per_sec: None,
                            max_in_flight: None,
                            enabled: true,
                            retry: Default::default(),
                            ordering: Default::default(),
                            verify: false,
                        },
                        "chaos",
                    )
                    .await?;
                receiver.set_secrets(&path, vec![secret.expose_text()]);
                endpoints.push(Ep {
                    tenant,
                    path,
                    types,
                    proxy,
                });
            }
        }
        let cfg = dir.path().join("walhook.toml");
        std::fs::write(
            &cfg,
            format!(
                r#"
[platform]
url = "{platform_url}"

[source]
url = "{shop_url}"
create_slot = true
create_publication = true
heartbeat_interval = "1s"
status_interval = "200ms"

[retry]
base_delay = "100ms"
max_delay = "1s"
slow_down_floor = "200ms"
max_attempts = 100

[egress]
# Loopback receivers in plain http; production configs never set this.
allow_http_loopback = true
request_timeout = "{timeout}s"

[dispatch]
sweep_interval = "200ms"
lease = "10s"

{log}
[secrets]
master_key_file = {key:?}
{RULES}"#,
                key = key_file.display().to_string(),
                timeout = REQUEST_TIMEOUT.as_secs(),
                log = match &cluster {
                    None => String::new(),
                    Some(c) => format!(
                        // The cluster is the run's own: one set of topics.
                        "[log]\nkind = \"fluvio\"\nendpoint = \"{}\"\nevents_partitions = 4\n\
                         topic_prefix = \"chaos-\"\nmember_lease = \"{}s\"\n{}",
                        c.endpoint(),
                        MEMBER_LEASE.as_secs(),
                        by_endpoint.map_or(String::new(), |n| format!(
                            "dispatch = \"by-endpoint\"\ndeliveries_partitions = {n}\n"
                        ))
                    ),
                }
            ),
        )?;
        let log = dir.path().join("walhook.log");
        Ok(World {
            dir,
            pg,
            cfg,
            log,
            receiver,
            endpoints,
            platform_url,
            cluster: cluster.map(std::sync::Arc::new),
        })
    }

    /// Starts `walhook run` and waits until it reads the slot.
    pub(super) async fn start_walhook(&self) -> anyhow::Result<Walhook> {
        let walhook = Walhook::start(&self.cfg, &self.log, None)?;
        self.wait_streaming().await?;
        Ok(walhook)
    }

    /// Waits until capture reads the slot.
    pub(super) async fn wait_streaming(&self) -> anyhow::Result<()> {
        let shop = self.pg.connect("shop").await?;
        if !wait_slot_active(&shop, "walhook", Duration::from_secs(60)).await? {
            anyhow::bail!(
                "walhook did not start streaming within 60 s; its log: {}",
                self.log.display()
            );
        }
        Ok(())
    }

    /// Waits until the process `pid` holds a partition of its group (a
    /// member restarted with a failpoint joins again, and takes a share
    /// only once the others gave it up: a round written before then would
    /// never reach its failpoint).
    pub(super) async fn wait_holding(&self, pid: u32) -> anyhow::Result<()> {
        let sql = connect_retrying(&self.platform_url, Duration::from_secs(30)).await?;
        let holder = format!("% pid {pid}");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let held: i64 = sql
                .query_one(
                    "SELECT count(*) FROM walhook.stage_partitions p \
                     JOIN walhook.stage_members m ON m.grp = p.grp AND m.slot = p.slot AND m.epoch = p.epoch \
                     WHERE m.holder LIKE $1 AND m.lease_until > now()",
                    &[&holder],
                )
                .await?
                .get(0);
            if held > 0 {
                return Ok(());
            }
            if Instant::now() > deadline {
                anyhow::bail!(
                    "the restarted member (pid {pid}) took no partition within 60 s; its log: {}",
                    self.log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Keeps the temporary directory (walhook's log) and says where.
    pub(super) fn keep_log(self) {
        println!(
            "\nwalhook's log is in {} (kept)",
            self.dir.keep().join("walhook.log").display()
        );
    }
}
