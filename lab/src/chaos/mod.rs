//! `walhook chaos`: seeded rounds of a realistic workload, each with one
//! injected fault, judged by a checker that trusts only the business
//! database and what the receivers logged.
//!
//! One throwaway Postgres (business and platform databases), three tenants
//! with two endpoints each on a loopback receiver, every endpoint behind a
//! fault proxy of its own, and `walhook run` as a child process (so that it
//! can be killed). Each round writes orders (inserts, some paid later),
//! injects one fault, restarts whatever died, waits for the round's
//! webhooks, and compares:
//!
//! - **lost**: a committed fact a subscribed endpoint never got a 2xx for;
//! - **unexpected**: a webhook for a fact that was not committed, or at an
//!   endpoint that did not subscribe to it;
//! - **unstable ids**: one fact at one endpoint under two `webhook-id`s;
//! - **bad signatures**: a request whose signature did not verify with the
//!   endpoint's secret;
//! - **duplicate sends**: 2xx answers beyond the first per fact and
//!   endpoint (allowed by at-least-once), and how many of them the history
//!   explains (attempts noted `previous_outcome_unknown`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use walhook_devkit::faultproxy::{Fault, FaultProxy};
use walhook_devkit::fluvio::FluvioCluster;
use walhook_devkit::postgres::{LocalPostgres, Reconnecting, connect_retrying, wait_slot_active};
use walhook_devkit::receiver::Receiver;
use walhook_pipeline::event::EventType;
use walhook_pipeline::ids::TenantId;
use walhook_sql::Platform;
use walhook_sql::endpoints::NewEndpoint;

/// Every fault `walhook chaos` can inject.
pub const FAULTS: &[&str] = &[
    "capture.after_handoff",
    "capture.mid_transaction",
    "capture.before_confirm",
    "fanout.before_materialize",
    "fanout.after_materialize",
    "fanout.after_commit",
    "dispatch.before_send",
    "dispatch.after_send",
    "dispatch.after_record",
    "sigkill",
    "postgres-kill",
    "receiver-reset",
    "receiver-blackhole",
    "receiver-latency",
    "receiver-slowclose",
    "receiver-trickle",
    "receiver-flap",
    "pg-connection-limit",
    "pg-cancel-storm",
    "lease-expiry",
    "spu-kill",
    "member-freeze",
];

/// The faults of a Fluvio cluster and its separate processes only.
const FLUVIO_ONLY: &[&str] = &["spu-kill", "member-freeze"];

/// `[log] member_lease` of a chaos run on Fluvio; a frozen member stays
/// frozen this long and three seconds more.
const MEMBER_LEASE: Duration = Duration::from_secs(4);

/// Orders in the large transaction of a `capture.mid_transaction` round:
/// more than two of capture's 4,096-event parts.
const LARGE_TX: i64 = 10_000;

mod soak;
mod stages;
mod storm;
mod svg;

/// How long a network fault or a Postgres storm lasts.
const FAULT_HOLD: Duration = Duration::from_secs(3);

/// `[egress] request_timeout` of the chaos config: no attempt may last
/// longer than this and a second.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// The proxy fault of a `receiver-*` fault.
fn network_fault(fault: &str) -> Option<Fault> {
    Some(match fault {
        "receiver-reset" => Fault::ResetMidBody,
        "receiver-blackhole" => Fault::BlackHole,
        "receiver-latency" => Fault::Latency(Duration::from_millis(400)),
        "receiver-slowclose" => Fault::SlowClose(Duration::from_secs(3)),
        "receiver-trickle" => Fault::Trickle(Duration::from_millis(100)),
        "receiver-flap" => Fault::Flap(Duration::from_millis(700)),
        _ => return None,
    })
}

/// Arguments of `walhook chaos`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Rounds to run; the faults take turns.
    #[arg(long, default_value_t = 10)]
    pub rounds: u32,
    /// The seed of every random choice (when a failpoint fires, when a kill
    /// comes, which endpoint a network fault hits); printed, so that a
    /// failing run can be repeated.
    #[arg(long)]
    pub seed: Option<u64>,
    /// The faults to inject, comma-separated (default: all):
    /// capture.after_handoff, capture.mid_transaction (a part of a
    /// 10,000-row transaction handed off, its commit not), capture.before_confirm,
    /// fanout.before_materialize, fanout.after_materialize,
    /// fanout.after_commit, dispatch.before_send, dispatch.after_send,
    /// dispatch.after_record (failpoints that abort walhook there), sigkill (of walhook at a random moment),
    /// postgres-kill (kill -9 of Postgres, restarted 0.5 s later),
    /// receiver-reset, receiver-blackhole, receiver-latency (400 ms),
    /// receiver-slowclose (3 s before the FIN), receiver-trickle (a byte
    /// every 100 ms) and receiver-flap (up and refused every 700 ms):
    /// network faults toward one endpoint for 3 s; pg-connection-limit (walhook's role may open no
    /// Postgres session for 3 s, its sessions ended) and pg-cancel-storm
    /// (every statement walhook runs cancelled for 3 s, as a too-short
    /// statement_timeout would), lease-expiry (walhook run frozen with
    /// SIGSTOP for 13 s, longer than its 10 s lease, while a standby
    /// `walhook dispatch` node takes over; then it goes on). With --soak
    /// the default is the faults that leave the walhook process running.
    #[arg(long, value_delimiter = ',')]
    pub faults: Vec<String>,
    /// The log between the stages: `embedded` (one `walhook run`) or
    /// `fluvio` (a throwaway Fluvio cluster from the Fluvio tools,
    /// WALHOOK_FLUVIO_TOOLS or ../shared/tools/fluvio; `walhook capture` and
    /// --members fan-out members as separate processes, joined to their
    /// group). On Fluvio the faults add spu-kill (SIGKILL of the SPU,
    /// restarted 2 s later) and member-freeze (a member frozen with SIGSTOP
    /// past its 4 s lease, then resumed), lease-expiry is left out, and a
    /// kill or failpoint hits the process whose stage it names (any of them
    /// for sigkill).
    #[arg(long, default_value = "embedded", value_parser = ["embedded", "fluvio"])]
    pub log: String,
    /// With --log fluvio: how many fan-out members run.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=8))]
    pub members: u32,
    /// With --log fluvio: `[log] dispatch = "by-endpoint"`: the fan-out
    /// members only fan out, and as many `walhook dispatch` members read
    /// the deliveries topic (that many partitions, at least 2); dispatch's
    /// failpoints and member-freeze then hit the dispatch members, fan-out's
    /// the fan-out members.
    #[arg(long)]
    pub by_endpoint: bool,
    /// Keep walhook's log (its processes' stderr) even when every round was
    /// clean; a run that is not clean always keeps it.
    #[arg(long)]
    pub keep_log: bool,
    /// Business writes per round.
    #[arg(long, default_value_t = 200)]
    pub writes: u32,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// How long to wait for a round's webhooks after its writes.
    #[arg(long, default_value = "120s", value_parser = walhook_pipeline::duration::parse)]
    pub settle: Duration,
    /// Instead of rounds, a soak: write --rate orders a second for this
    /// long (for example 1h), inject the next fault every --fault-every,
    /// sample walhook's RSS, open descriptors, Postgres sessions, slot lag
    /// and the hot tables' sizes, and judge everything at the end.
    #[arg(long, value_parser = walhook_pipeline::duration::parse)]
    pub soak: Option<Duration>,
    /// Soak: orders written a second (each an order.created event to three
    /// endpoints of its tenant; every fourth is paid 10 ms later, an
    /// order.paid event to four: 1.25 events and 4 deliveries per order).
    #[arg(long, default_value_t = 1000)]
    pub rate: u32,
    /// Soak: the pause between two faults.
    #[arg(long, default_value = "3m", value_parser = walhook_pipeline::duration::parse)]
    pub fault_every: Duration,
    /// Soak: how often to sample.
    #[arg(long, default_value = "10s", value_parser = walhook_pipeline::duration::parse)]
    pub sample_every: Duration,
    /// Soak: the directory for the report (soak.json, soak.html with its
    /// charts, soak.svg).
    #[arg(long, default_value = "soak-report")]
    pub report: PathBuf,
}

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

const TENANTS: &[&str] = &["acme", "globex", "initech"];

/// Orders `$1` to `$2` in one statement, the tenants taking turns.
const INSERT_ORDERS: &str = "INSERT INTO orders (id, tenant_id, total) \
     SELECT g, (ARRAY['acme', 'globex', 'initech'])[1 + (g % 3)::int], 9.99 \
     FROM generate_series($1::bigint, $2::bigint) g";

/// One endpoint of the workload.
struct Ep {
    tenant: &'static str,
    path: String,
    /// Subscribed types; empty: every type.
    types: &'static [&'static str],
    proxy: FaultProxy,
}

impl Ep {
    fn wants(&self, tenant: &str, event_type: &str) -> bool {
        self.tenant == tenant && (self.types.is_empty() || self.types.contains(&event_type))
    }
}

/// A deterministic generator (SplitMix64): the same seed, the same run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// What one round found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RoundResult {
    /// The round (from 1).
    pub round: u32,
    /// The fault injected.
    pub fault: String,
    /// How it was injected (the failpoint setting, the moment of a kill).
    pub injected: String,
    /// Facts committed in the round.
    pub facts: u64,
    /// Webhooks expected (facts × subscribed endpoints).
    pub expected: u64,
    /// Expected webhooks never answered 2xx.
    pub lost: u64,
    /// Webhooks for facts not committed, or at endpoints not subscribed.
    pub unexpected: u64,
    /// (fact, endpoint) pairs seen under more than one webhook-id.
    pub unstable_ids: u64,
    /// Requests whose signature did not verify.
    pub bad_signatures: u64,
    /// 2xx answers beyond the first per (fact, endpoint).
    pub duplicate_sends: u64,
    /// Whether walhook died in the round (and was started again).
    pub walhook_restarted: bool,
    /// Seconds from the round's last write until its last webhook arrived.
    pub settle_seconds: f64,
    /// The longest attempt started in the round (ms): at most the request
    /// timeout and a second (not judged in `lease-expiry` and
    /// `member-freeze` rounds: an attempt out when its process is frozen
    /// lasts as long as the freeze).
    pub slowest_attempt_ms: i64,
}

impl RoundResult {
    fn clean(&self) -> bool {
        self.lost == 0
            && self.unexpected == 0
            && self.unstable_ids == 0
            && self.bad_signatures == 0
            && (self.fault == "lease-expiry"
                || self.fault == "member-freeze"
                || self.slowest_attempt_ms <= (REQUEST_TIMEOUT.as_millis() + 1_000) as i64)
    }
}

/// The whole run.
#[derive(Debug, Serialize)]
pub struct ChaosReport {
    /// The seed.
    pub seed: u64,
    /// Every round.
    pub rounds: Vec<RoundResult>,
    /// Attempts the platform noted `previous_outcome_unknown` (sent,
    /// perhaps received, not recorded before a crash): the explanation of
    /// duplicate sends.
    pub attempts_after_unknown_outcome: i64,
    /// Whether every round was clean (lost, unexpected, unstable ids and
    /// bad signatures all 0).
    pub clean: bool,
}

/// `walhook run` as a child process, its log appended to a file.
struct Walhook {
    child: std::process::Child,
}

impl Walhook {
    fn start(cfg: &Path, log: &Path, failpoint: Option<&str>) -> anyhow::Result<Walhook> {
        Walhook::spawn(&["run"], cfg, log, failpoint)
    }

    /// A standby dispatcher node next to `walhook run`.
    fn start_standby(cfg: &Path, log: &Path) -> anyhow::Result<Walhook> {
        Walhook::spawn(&["dispatch", "--node-id", "chaos-standby"], cfg, log, None)
    }

    fn spawn(
        command: &[&str],
        cfg: &Path,
        log: &Path,
        failpoint: Option<&str>,
    ) -> anyhow::Result<Walhook> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        let mut cmd = std::process::Command::new(std::env::current_exe()?);
        cmd.args(command)
            .arg("--config")
            .arg(cfg)
            .env("WALHOOK_LOG", "warn")
            .env_remove("WALHOOK_FAILPOINTS")
            .stdout(std::process::Stdio::null())
            .stderr(file);
        if let Some(f) = failpoint {
            cmd.env("WALHOOK_FAILPOINTS", f);
        }
        Ok(Walhook {
            child: cmd.spawn().context("cannot start walhook run")?,
        })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends `signal` (a name `kill` knows: TERM, STOP, CONT).
    fn signal(&self, signal: &str) {
        signal_pid(self.child.id(), signal);
    }

    /// SIGTERM, then up to 30 s for the drain.
    fn stop(&mut self) {
        if !self.running() {
            return;
        }
        self.signal("TERM");
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.running() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        self.kill();
    }
}

fn signal_pid(pid: u32, signal: &str) {
    let _ = std::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status();
}

impl Drop for Walhook {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The throwaway world of a chaos run: Postgres with the shop and the
/// platform, the receiver, the endpoints behind their fault proxies, and
/// `walhook run`'s config.
struct World {
    dir: tempfile::TempDir,
    pg: LocalPostgres,
    cfg: PathBuf,
    log: PathBuf,
    receiver: Receiver,
    endpoints: Vec<Ep>,
    /// The platform database as walhook's own role.
    platform_url: String,
    /// The Fluvio cluster of a run with --log fluvio.
    cluster: Option<std::sync::Arc<FluvioCluster>>,
}

impl World {
    /// Sets the world up; each tenant gets `all_per_tenant` endpoints for
    /// every type and one for `order.paid` only.
    async fn start(all_per_tenant: usize) -> anyhow::Result<World> {
        World::start_on(all_per_tenant, None, None).await
    }

    /// [`World::start`], with the stages on `cluster` when given (and
    /// `[log] dispatch = "by-endpoint"` over `by_endpoint` deliveries
    /// partitions when given).
    async fn start_on(
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
    async fn start_walhook(&self) -> anyhow::Result<Walhook> {
        let walhook = Walhook::start(&self.cfg, &self.log, None)?;
        self.wait_streaming().await?;
        Ok(walhook)
    }

    /// Waits until capture reads the slot.
    async fn wait_streaming(&self) -> anyhow::Result<()> {
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
    async fn wait_holding(&self, pid: u32) -> anyhow::Result<()> {
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
    fn keep_log(self) {
        println!(
            "\nwalhook's log is in {} (kept)",
            self.dir.keep().join("walhook.log").display()
        );
    }
}

/// The faults of a run on the embedded log (`fluvio` false) or on Fluvio.
fn faults_of(fluvio: bool) -> Vec<&'static str> {
    FAULTS
        .iter()
        .copied()
        .filter(|f| {
            if fluvio {
                *f != "lease-expiry"
            } else {
                !FLUVIO_ONLY.contains(f)
            }
        })
        .collect()
}

/// The faults asked for, checked against those of the log; `default` when
/// none, every one of the log's for `all`.
fn chosen_faults(asked: &[String], default: &[&str], fluvio: bool) -> anyhow::Result<Vec<String>> {
    let known = faults_of(fluvio);
    if asked.is_empty() {
        return Ok(default.iter().map(|s| (*s).to_owned()).collect());
    }
    if asked == ["all"] {
        return Ok(known.iter().map(|s| (*s).to_owned()).collect());
    }
    for f in asked {
        if known.contains(&f.as_str()) {
            continue;
        }
        if FLUVIO_ONLY.contains(&f.as_str()) {
            anyhow::bail!(
                "--faults: {f:?} needs separate processes on a Fluvio cluster: add --log fluvio"
            );
        }
        if f == "lease-expiry" {
            anyhow::bail!(
                "--faults: \"lease-expiry\" freezes the one `walhook run` of the embedded log; with --log fluvio \
                 give member-freeze (a fan-out member frozen past its lease)"
            );
        }
        anyhow::bail!(
            "--faults: {f:?} is not a fault walhook chaos knows; give some of {}",
            known.join(", ")
        );
    }
    Ok(asked.to_vec())
}

/// Starts a Postgres storm in the background (it runs while the writes go
/// on); `None` for other faults.
fn start_storm(
    fault: &str,
    pg: &LocalPostgres,
) -> Option<tokio::task::JoinHandle<anyhow::Result<String>>> {
    let admin = pg.url("postgres");
    match fault {
        "pg-connection-limit" => Some(tokio::spawn(async move {
            storm::connection_limit(&admin, FAULT_HOLD).await
        })),
        "pg-cancel-storm" => Some(tokio::spawn(async move {
            storm::cancel_storm(&admin, FAULT_HOLD).await
        })),
        _ => None,
    }
}

/// Runs the chaos rounds, or the soak.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    if let Some(length) = args.soak {
        return soak::run(&args, length).await;
    }
    let fluvio = args.log == "fluvio";
    if args.by_endpoint && !fluvio {
        anyhow::bail!(
            "--by-endpoint puts a deliveries topic between fan-out and dispatch members on Fluvio: add --log fluvio"
        );
    }
    let faults = chosen_faults(&args.faults, &faults_of(fluvio), fluvio)?;
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let mut rng = Rng(seed);
    println!(
        "walhook chaos: {} rounds, seed {seed} (repeat with --seed {seed}), faults: {}",
        args.rounds,
        faults.join(", ")
    );

    let cluster = if fluvio {
        let Some(cluster) = FluvioCluster::builder("walhook chaos --log fluvio")
            .own()
            .start()
        else {
            anyhow::bail!(
                "--log fluvio starts a throwaway Fluvio cluster: set WALHOOK_FLUVIO_TOOLS to the directory with \
                 bin/fluvio-run and bin/fluvio (the Fluvio tools)"
            );
        };
        println!(
            "  on a Fluvio cluster at {}: walhook capture and {} fan-out members{}",
            cluster.endpoint(),
            args.members,
            if args.by_endpoint {
                format!(
                    ", {} dispatch members over a deliveries topic keyed by endpoint",
                    args.members
                )
            } else {
                String::new()
            }
        );
        Some(cluster)
    } else {
        None
    };
    let dispatchers = if args.by_endpoint { args.members } else { 0 };
    let mut world =
        World::start_on(1, cluster, args.by_endpoint.then_some(args.members.max(2))).await?;
    let mut stages = stages::Stages::start(
        world.cfg.clone(),
        world.log.clone(),
        fluvio.then_some((args.members, dispatchers)),
    )?;
    world.wait_streaming().await?;

    let mut next_id = 0i64;
    let mut results = Vec::new();
    let bar = walhook_cli::progress::bar(u64::from(args.rounds), "chaos rounds");
    for round in 1..=args.rounds {
        let fault = faults[(round as usize - 1) % faults.len()].clone();
        let mut injected = String::new();
        // The process the round's failpoint, kill or freeze aims at.
        let target = stages.target(&fault, &mut rng);
        // A failpoint needs walhook started with it.
        if fault.contains('.') {
            // Points hit once per batch (a part of the large transaction, a
            // fan-out chunk, a recorder batch, a slot confirmation) are hit
            // only a few times in a round, the more rarely the busier the
            // machine (bigger batches): k is 1 to 3 there; the points hit
            // per transaction or attempt take k up to a tenth of the writes.
            let hits = match fault.as_str() {
                "capture.mid_transaction" => 2,
                "capture.before_confirm"
                | "fanout.before_materialize"
                | "fanout.after_materialize"
                | "fanout.after_commit"
                | "dispatch.after_record" => 3,
                _ => u64::from(args.writes / 10).max(1),
            };
            let hit = 1 + rng.below(hits);
            injected = format!("{fault}=abort@{hit}");
            stages.restart(target, Some(&injected))?;
            if fluvio {
                injected = format!("{injected} in {}", stages.name(target));
                if stages.joins(target) {
                    world.wait_holding(stages.pid(target)).await?;
                }
            }
        }
        let kill_at = rng.below(u64::from(args.writes).max(1)) as u32;
        let victim = rng.below(world.endpoints.len() as u64) as usize;
        let first_id = next_id + 1;
        let round_started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        // A write's outcome may be unknown (a crash): the checker reads
        // what the database kept, so errors do not matter here.
        let mut writer = Reconnecting::new(world.pg.url("shop"));
        let mut restarted = false;
        let mut storm = None;
        let mut thaw = None;
        let mut standby = if fault == "lease-expiry" {
            Some(Walhook::start_standby(&world.cfg, &world.log)?)
        } else {
            None
        };
        for i in 0..args.writes {
            if i == kill_at {
                match fault.as_str() {
                    "sigkill" => {
                        injected = format!("SIGKILL of {} after {i} writes", stages.name(target));
                        stages.kill(target);
                    }
                    "spu-kill" => {
                        injected =
                            format!("SIGKILL of the SPU after {i} writes, restarted 2 s later");
                        let cluster = world
                            .cluster
                            .clone()
                            .context("spu-kill needs --log fluvio")?;
                        cluster.kill_spu();
                        thaw = Some(tokio::spawn(async move {
                            tokio::time::sleep(Duration::from_secs(2)).await;
                            let _ =
                                tokio::task::spawn_blocking(move || cluster.restart_spu()).await;
                        }));
                    }
                    "member-freeze" => {
                        let hold = MEMBER_LEASE + Duration::from_secs(3);
                        injected = format!(
                            "SIGSTOP of {} for {} s (its lease: {} s) after {i} writes",
                            stages.name(target),
                            hold.as_secs(),
                            MEMBER_LEASE.as_secs()
                        );
                        let pid = stages.pid(target);
                        signal_pid(pid, "STOP");
                        thaw = Some(tokio::spawn(async move {
                            tokio::time::sleep(hold).await;
                            signal_pid(pid, "CONT");
                        }));
                    }
                    "postgres-kill" => {
                        injected = format!("kill -9 of Postgres after {i} writes");
                        world
                            .pg
                            .crash_and_restart(Duration::from_millis(500))
                            .await?;
                    }
                    network if network.starts_with("receiver-") => {
                        let f = network_fault(network).unwrap_or(Fault::None);
                        injected = format!("{f:?} at {} for 3 s", world.endpoints[victim].path);
                        world.endpoints[victim].proxy.set(f);
                    }
                    "capture.mid_transaction" => {
                        let (first, last) = (next_id + 1, next_id + LARGE_TX);
                        next_id = last;
                        let _ = writer.execute(INSERT_ORDERS, &[&first, &last]).await;
                    }
                    "lease-expiry" => {
                        injected = format!("SIGSTOP of walhook run for 13 s after {i} writes");
                        let pid = stages.pid(target);
                        signal_pid(pid, "STOP");
                        thaw = Some(tokio::spawn(async move {
                            tokio::time::sleep(Duration::from_secs(13)).await;
                            signal_pid(pid, "CONT");
                        }));
                    }
                    other => storm = start_storm(other, &world.pg),
                }
            }
            // Mostly new orders; now and then one of this round's is paid.
            if next_id >= first_id && rng.below(4) == 0 {
                let id = first_id + rng.below((next_id - first_id + 1) as u64) as i64;
                let _ = writer
                    .execute(
                        "UPDATE orders SET status = 'paid' WHERE id = $1 AND status <> 'paid'",
                        &[&id],
                    )
                    .await;
            } else {
                next_id += 1;
                let tenant = TENANTS[rng.below(TENANTS.len() as u64) as usize];
                let _ = writer
                    .execute(
                        "INSERT INTO orders (id, tenant_id, total) VALUES ($1, $2, 9.99)",
                        &[&next_id, &tenant],
                    )
                    .await;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
            if stages.restart_dead()? {
                restarted = true;
                if injected.is_empty() {
                    injected = fault.clone();
                }
            }
        }
        if fault.starts_with("receiver-") {
            tokio::time::sleep(FAULT_HOLD).await;
            world.endpoints[victim].proxy.set(Fault::None);
        }
        if let Some(storm) = storm {
            injected = storm.await??;
        }
        if let Some(thaw) = thaw {
            thaw.await?;
        }
        let last_write = Instant::now();

        // What the business database kept of this round: the truth.
        let shop = connect_retrying(&world.pg.url("shop"), Duration::from_secs(30)).await?;
        let rows = shop
            .query(
                "SELECT id, tenant_id, status FROM orders WHERE id >= $1 AND id <= $2",
                &[&first_id, &next_id],
            )
            .await?;
        let mut expected: HashSet<(String, String, String)> = HashSet::new();
        let mut facts = 0u64;
        for r in &rows {
            let (id, tenant, status): (i64, String, String) = (r.get(0), r.get(1), r.get(2));
            let mut types = vec!["order.created"];
            if status == "paid" {
                types.push("order.paid");
            }
            for t in types {
                facts += 1;
                for ep in world.endpoints.iter().filter(|e| e.wants(&tenant, t)) {
                    expected.insert((ep.path.clone(), t.to_owned(), id.to_string()));
                }
            }
        }
        let in_round = |object: &str| {
            object
                .parse::<i64>()
                .is_ok_and(|id| id >= first_id && id <= next_id)
        };
        let deadline = Instant::now() + args.settle;
        loop {
            if stages.restart_dead()? {
                restarted = true;
            }
            let got = arrived(&world.receiver, &in_round);
            if expected.iter().all(|k| got.contains_key(k)) || Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let settle_seconds = last_write.elapsed().as_secs_f64();
        if let Some(mut node) = standby.take() {
            node.stop();
        }
        // A failpoint that did not fire must not leak into later rounds.
        if fault.contains('.') && !restarted {
            stages.restart(target, None)?;
        }
        // Late duplicates show within a moment.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut result = judge(&world.receiver, &expected, &in_round);
        result.slowest_attempt_ms = connect_retrying(&world.platform_url, Duration::from_secs(30))
            .await?
            .query_one(
                "SELECT coalesce(max(latency_ms), 0)::int8 FROM walhook.attempts \
                 WHERE started_at >= to_timestamp($1)",
                &[&round_started],
            )
            .await?
            .get(0);
        result.round = round;
        result.fault = fault;
        result.injected = injected;
        result.facts = facts;
        result.walhook_restarted = restarted;
        result.settle_seconds = (settle_seconds * 10.0).round() / 10.0;
        bar.inc(1);
        bar.set_message(format!(
            "round {round}: lost {}, dup {}",
            result.lost, result.duplicate_sends
        ));
        results.push(result);
    }
    bar.finish_and_clear();
    stages.stop();
    let platform_sql = connect_retrying(&world.platform_url, Duration::from_secs(30)).await?;
    let unknown: i64 = platform_sql
        .query_one(
            "SELECT count(*) FROM walhook.attempts WHERE note = 'previous_outcome_unknown'",
            &[],
        )
        .await?
        .get(0);
    let report = ChaosReport {
        seed,
        clean: results.iter().all(RoundResult::clean),
        rounds: results,
        attempts_after_unknown_outcome: unknown,
    };
    print_summary(&report);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if !report.clean || args.keep_log {
        world.keep_log();
    }
    Ok(if report.clean {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// (endpoint path, event type, object id) of a received request.
fn fact_of(r: &walhook_devkit::receiver::Received) -> Option<(String, String, String)> {
    let body: serde_json::Value = serde_json::from_slice(&r.body).ok()?;
    Some((
        r.path.clone(),
        body["type"].as_str()?.to_owned(),
        body["object_id"].as_str()?.to_owned(),
    ))
}

/// The 2xx arrivals of the round's facts, with their webhook-ids.
fn arrived(
    receiver: &Receiver,
    in_round: &impl Fn(&str) -> bool,
) -> HashMap<(String, String, String), Vec<String>> {
    let mut got: HashMap<_, Vec<String>> = HashMap::new();
    for r in receiver.received() {
        if !(200..300).contains(&r.status) {
            continue;
        }
        if let Some(f) = fact_of(&r)
            && in_round(&f.2)
        {
            got.entry(f).or_default().push(r.webhook_id.clone());
        }
    }
    got
}

fn judge(
    receiver: &Receiver,
    expected: &HashSet<(String, String, String)>,
    in_round: &impl Fn(&str) -> bool,
) -> RoundResult {
    let mut result = RoundResult {
        expected: expected.len() as u64,
        ..RoundResult::default()
    };
    let mut ids: HashMap<(String, String, String), HashSet<String>> = HashMap::new();
    for r in receiver.received() {
        let Some(f) = fact_of(&r) else {
            continue;
        };
        if !in_round(&f.2) {
            continue;
        }
        if r.verified == Some(false) {
            result.bad_signatures += 1;
        }
        ids.entry(f).or_default().insert(r.webhook_id.clone());
    }
    let got = arrived(receiver, in_round);
    result.lost = expected.iter().filter(|k| !got.contains_key(*k)).count() as u64;
    result.unexpected = ids.keys().filter(|k| !expected.contains(*k)).count() as u64;
    result.unstable_ids = ids.values().filter(|s| s.len() > 1).count() as u64;
    result.duplicate_sends = got.values().map(|v| v.len() as u64 - 1).sum();
    result
}

fn print_summary(report: &ChaosReport) {
    let mut by_fault: BTreeMap<&str, Vec<&RoundResult>> = BTreeMap::new();
    for r in &report.rounds {
        by_fault.entry(&r.fault).or_default().push(r);
    }
    println!(
        "\n  {:<26} {:>6} {:>8} {:>5} {:>10} {:>8} {:>8} {:>9} {:>9} {:>10}",
        "fault",
        "rounds",
        "webhooks",
        "lost",
        "unexpected",
        "unstable",
        "bad sig",
        "dup sends",
        "settle s",
        "slowest ms"
    );
    for (fault, rounds) in &by_fault {
        let sum = |f: fn(&RoundResult) -> u64| rounds.iter().map(|r| f(r)).sum::<u64>();
        let settle = rounds
            .iter()
            .map(|r| r.settle_seconds)
            .fold(0.0f64, f64::max);
        println!(
            "  {:<26} {:>6} {:>8} {:>5} {:>10} {:>8} {:>8} {:>9} {:>9.1} {:>10}",
            fault,
            rounds.len(),
            sum(|r| r.expected),
            sum(|r| r.lost),
            sum(|r| r.unexpected),
            sum(|r| r.unstable_ids),
            sum(|r| r.bad_signatures),
            sum(|r| r.duplicate_sends),
            settle,
            rounds
                .iter()
                .map(|r| r.slowest_attempt_ms)
                .max()
                .unwrap_or(0)
        );
    }
    println!(
        "\n  attempts noted previous_outcome_unknown (explained duplicates): {}",
        report.attempts_after_unknown_outcome
    );
    println!(
        "  {}",
        if report.clean {
            "clean: nothing lost, no unexpected webhook, stable ids, every signature verified, no attempt past the request timeout + 1 s"
        } else {
            "NOT CLEAN: see the rounds above"
        }
    );
}
