//! A throwaway Fluvio cluster on loopback, for the tests and benchmarks of
//! the Fluvio log: one SC and one or more SPUs, over plain TCP or TLS (with
//! client certificates when asked).
//!
//! ```text
//!  FluvioCluster::builder(test).spus(3).tls(tls).start()
//!    fluvio-run sc  --bind-public P [--tls … --bind-non-tls-public A]   ── endpoint() = P
//!    fluvio cluster spu register --id 5001.. (through A: the CLI speaks no TLS here)
//!    fluvio-run spu -i 5001.. -p Pi [--tls … --bind-non-tls-public Ai]  ── kill_spu_id / restart_spu_id
//! ```
//!
//! No package registry serves the Fluvio server, so the cluster comes from
//! the `fluvio-run` and `fluvio` programs of a tools directory (built from
//! Fluvio's public source): `$WALHOOK_FLUVIO_TOOLS` when set, else
//! `shared/tools/fluvio` beside the checkout or beside a folder above it.
//! `WALHOOK_FLUVIO_ENDPOINT` names a running cluster to use instead, for
//! tests that need one plain SPU (then [`FluvioCluster::restart_spu`] is
//! refused: the test did not start that broker).
//!
//! Where neither exists, [`FluvioCluster::start`] returns `None` and prints
//! plainly that the test is skipped and why; `scripts/test.sh` sets
//! `WALHOOK_FLUVIO_REQUIRED=1` when it found the tools, and then a missing
//! cluster is a failure, never a skip.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::tls::ServerCert;

/// Names a tools directory (with `bin/fluvio-run` and `bin/fluvio`).
pub const TOOLS_ENV: &str = "WALHOOK_FLUVIO_TOOLS";
/// Names a running cluster's SC address, `host:port`.
pub const ENDPOINT_ENV: &str = "WALHOOK_FLUVIO_ENDPOINT";
/// Set to `1` to fail instead of skipping when no cluster can be had.
pub const REQUIRED_ENV: &str = "WALHOOK_FLUVIO_REQUIRED";

/// The id of the first SPU; the others follow.
const FIRST_SPU: u32 = 5001;

/// A Fluvio cluster for one test: started by it (and its processes killed
/// when dropped), or named by `WALHOOK_FLUVIO_ENDPOINT`.
#[derive(Debug)]
pub struct FluvioCluster {
    endpoint: String,
    /// Where the CLI reaches the SC (its plain port on a TLS cluster).
    admin: String,
    started: Option<Started>,
}

#[derive(Debug)]
struct Started {
    tools: PathBuf,
    dir: tempfile::TempDir,
    sc: parking_lot::Mutex<Child>,
    spus: Vec<Spu>,
}

#[derive(Debug)]
struct Spu {
    id: u32,
    args: Vec<String>,
    ports: Vec<u16>,
    child: parking_lot::Mutex<Option<Child>>,
}

/// How a cluster speaks TLS: the certificate of its SC and SPUs (issued
/// for the domain clients check, and `*.domain`: Fluvio's client checks
/// each SPU as `<id>.<domain>`), and whether clients must show a
/// certificate signed by `ca_pem`.
#[derive(Debug, Clone)]
pub struct ClusterTls {
    /// The servers' certificate and key.
    pub server: ServerCert,
    /// The CA the servers trust for client certificates.
    pub ca_pem: String,
    /// `--enable-client-cert`: a client without a certificate signed by
    /// `ca_pem` is refused.
    pub client_certs: bool,
}

/// What cluster to start; see [`FluvioCluster::builder`].
#[derive(Debug)]
pub struct ClusterBuilder {
    test: String,
    spus: u32,
    tls: Option<ClusterTls>,
    own: bool,
}

/// The tools directory, if one is found.
pub fn find_tools() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os(TOOLS_ENV) {
        return Some(PathBuf::from(dir));
    }
    // `shared/tools/fluvio` beside the checkout or beside any folder above
    // it (a worktree or a clone may sit deeper than the main checkout).
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .skip(2)
        .map(|d| d.join("shared/tools/fluvio"))
        .find(|d| d.join("bin/fluvio-run").is_file())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port on 127.0.0.1")
}

fn wait_port(port: u16, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

impl FluvioCluster {
    /// Starts a one-SPU cluster without TLS for `test`, or says why it
    /// cannot and returns `None` (a skip), unless
    /// `WALHOOK_FLUVIO_REQUIRED=1` (then it panics).
    pub fn start(test: &str) -> Option<FluvioCluster> {
        Self::builder(test).start()
    }

    /// A cluster to shape before [`ClusterBuilder::start`].
    pub fn builder(test: &str) -> ClusterBuilder {
        ClusterBuilder {
            test: test.to_owned(),
            spus: 1,
            tls: None,
            own: false,
        }
    }
}

impl ClusterBuilder {
    /// How many SPUs (ids 5001, 5002, …); topics may then be replicated.
    pub fn spus(mut self, n: u32) -> Self {
        assert!(n >= 1, "a cluster needs at least one SPU");
        self.spus = n;
        self
    }

    /// Starts a cluster of its own even when a running one is named by
    /// `WALHOOK_FLUVIO_ENDPOINT` (its SPUs are to be killed).
    pub fn own(mut self) -> Self {
        self.own = true;
        self
    }

    /// The SC and SPUs speak TLS to clients.
    pub fn tls(mut self, tls: ClusterTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Starts the cluster, or says why it cannot and returns `None` (a
    /// skip), unless `WALHOOK_FLUVIO_REQUIRED=1` (then it panics). A cluster
    /// named by `WALHOOK_FLUVIO_ENDPOINT` serves only a plain one-SPU ask.
    pub fn start(self) -> Option<FluvioCluster> {
        let test = &self.test;
        if self.spus == 1
            && self.tls.is_none()
            && !self.own
            && let Ok(endpoint) = std::env::var(ENDPOINT_ENV)
            && !endpoint.trim().is_empty()
        {
            return Some(FluvioCluster {
                endpoint: endpoint.trim().to_owned(),
                admin: endpoint.trim().to_owned(),
                started: None,
            });
        }
        let Some(tools) = find_tools() else {
            let why = format!(
                "{test}: skipped: no Fluvio cluster: set {TOOLS_ENV} to a directory with bin/fluvio-run and \
                 bin/fluvio{}",
                if self.spus == 1 && self.tls.is_none() && !self.own {
                    format!(", or {ENDPOINT_ENV} to a running cluster's SC address")
                } else {
                    " (this test starts its own cluster)".to_owned()
                }
            );
            assert!(std::env::var(REQUIRED_ENV).as_deref() != Ok("1"), "{why}");
            eprintln!("{why}");
            return None;
        };
        // A busy machine can make an SPU miss the start-up wait: one more
        // try, in a fresh directory, before the test fails.
        match self.launch(&tools) {
            Ok(cluster) => Some(cluster),
            Err(first) => {
                eprintln!("{test}: the Fluvio cluster did not start ({first}); trying once more");
                match self.launch(&tools) {
                    Ok(cluster) => Some(cluster),
                    Err(again) => panic!("{test}: the Fluvio cluster did not start: {again}"),
                }
            }
        }
    }

    fn launch(&self, tools: &Path) -> Result<FluvioCluster, String> {
        let dir = tempfile::Builder::new()
            .prefix("walhook-fluvio-")
            .tempdir()
            .map_err(|e| format!("no temporary directory: {e}"))?;
        let path = dir.path();
        let tls_args = match &self.tls {
            None => Vec::new(),
            Some(tls) => {
                let write = |name: &str, text: &str| {
                    let p = path.join(name);
                    std::fs::write(&p, text).map(|()| p.display().to_string())
                };
                let cert = write("server.pem", &tls.server.cert_pem).map_err(|e| e.to_string())?;
                let key = write("server.key", &tls.server.key_pem).map_err(|e| e.to_string())?;
                let mut args = vec![
                    "--tls".into(),
                    "--server-cert".into(),
                    cert,
                    "--server-key".into(),
                    key,
                ];
                if tls.client_certs {
                    let ca = write("ca.pem", &tls.ca_pem).map_err(|e| e.to_string())?;
                    args.extend(["--enable-client-cert".into(), "--ca-cert".into(), ca]);
                }
                args
            }
        };
        let (sc_pub, sc_priv) = (free_port(), free_port());
        let mut sc_args: Vec<String> = vec![
            "sc".into(),
            "--local".into(),
            path.join("sc").display().to_string(),
            "--bind-public".into(),
            format!("127.0.0.1:{sc_pub}"),
            "--bind-private".into(),
            format!("127.0.0.1:{sc_priv}"),
        ];
        let admin_port = if self.tls.is_some() {
            let plain = free_port();
            sc_args.extend(tls_args.iter().cloned());
            sc_args.extend(["--bind-non-tls-public".into(), format!("127.0.0.1:{plain}")]);
            plain
        } else {
            sc_pub
        };
        let mut sc = spawn(tools, path, "sc.log", &sc_args)?;
        let admin = format!("127.0.0.1:{admin_port}");
        let fail = |sc: &mut Child, spus: &mut Vec<Spu>, why: String| {
            for spu in spus.iter_mut() {
                if let Some(c) = spu.child.get_mut().as_mut() {
                    kill(c);
                }
            }
            kill(sc);
            let log = std::fs::read_to_string(path.join("sc.log")).unwrap_or_default();
            Err(format!("{why}\n{log}"))
        };
        let mut spus = Vec::new();
        if !(wait_port(sc_pub, Duration::from_secs(30))
            && wait_port(admin_port, Duration::from_secs(30)))
        {
            return fail(
                &mut sc,
                &mut spus,
                "the SC did not listen within 30 s".into(),
            );
        }
        for i in 0..self.spus {
            let id = FIRST_SPU + i;
            let (public, private) = (free_port(), free_port());
            let out = cli(tools, path, &admin)
                .args(["cluster", "spu", "register", "--id", &id.to_string()])
                .args(["--public-server", &format!("127.0.0.1:{public}")])
                .args(["--private-server", &format!("127.0.0.1:{private}")])
                .output()
                .map_err(|e| format!("cannot run fluvio: {e}"))?;
            if !out.status.success() {
                return fail(
                    &mut sc,
                    &mut spus,
                    format!(
                        "registering SPU {id} failed: {}",
                        String::from_utf8_lossy(&out.stderr)
                    ),
                );
            }
            let data = path.join(format!("spu-{id}"));
            let mut args: Vec<String> = vec![
                "spu".into(),
                "-i".into(),
                id.to_string(),
                "-p".into(),
                format!("127.0.0.1:{public}"),
                "-v".into(),
                format!("127.0.0.1:{private}"),
                "--sc-addr".into(),
                format!("127.0.0.1:{sc_priv}"),
                "--log-base-dir".into(),
                data.display().to_string(),
            ];
            let mut ports = vec![public, private];
            if self.tls.is_some() {
                let plain = free_port();
                args.extend(tls_args.iter().cloned());
                args.extend(["--bind-non-tls-public".into(), format!("127.0.0.1:{plain}")]);
                ports.push(plain);
            }
            spus.push(Spu {
                id,
                args,
                ports,
                child: parking_lot::Mutex::new(None),
            });
        }
        for spu in &spus {
            match spu.launch(tools, path) {
                Ok(child) => *spu.child.lock() = Some(child),
                Err(e) => return fail(&mut sc, &mut spus, e),
            }
        }
        // The SC must see every SPU online before topics can be created.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let online = cli(tools, path, &admin)
                .args(["cluster", "spu", "list"])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).matches("Online").count())
                .unwrap_or(0);
            if online >= spus.len() {
                break;
            }
            if Instant::now() > deadline {
                let why = format!("{online} of {} SPUs came online within 30 s", spus.len());
                return fail(&mut sc, &mut spus, why);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(FluvioCluster {
            endpoint: format!("127.0.0.1:{sc_pub}"),
            admin,
            started: Some(Started {
                tools: tools.to_owned(),
                dir,
                sc: parking_lot::Mutex::new(sc),
                spus,
            }),
        })
    }
}

/// `fluvio-run ARGS` with its output appended to `dir/log`.
fn spawn(tools: &Path, dir: &Path, log: &str, args: &[String]) -> Result<Child, String> {
    let out = File::options()
        .create(true)
        .append(true)
        .open(dir.join(log))
        .map_err(|e| format!("cannot open {log}: {e}"))?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    Command::new(tools.join("bin/fluvio-run"))
        .args(args)
        .env(
            "RUST_LOG",
            std::env::var("FLUVIO_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", tools.join("bin/fluvio-run").display()))
}

/// The `fluvio` CLI against `admin`, with its profile kept in `dir` (not
/// in `~/.fluvio`).
fn cli(tools: &Path, dir: &Path, admin: &str) -> Command {
    let mut c = Command::new(tools.join("bin/fluvio"));
    c.arg("-c").arg(admin).env("HOME", dir).stdin(Stdio::null());
    c
}

impl Spu {
    fn launch(&self, tools: &Path, dir: &Path) -> Result<Child, String> {
        let mut child = spawn(tools, dir, &format!("spu-{}.log", self.id), &self.args)?;
        if self
            .ports
            .iter()
            .all(|p| wait_port(*p, Duration::from_secs(30)))
        {
            Ok(child)
        } else {
            kill(&mut child);
            Err(format!(
                "SPU {} did not listen within 30 s; see spu-{}.log",
                self.id, self.id
            ))
        }
    }
}

impl FluvioCluster {
    /// The SC's public address, `host:port` (TLS on a TLS cluster).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The ids of the SPUs this test started.
    pub fn spu_ids(&self) -> Vec<u32> {
        self.own().spus.iter().map(|s| s.id).collect()
    }

    /// `fluvio partition list` as JSON: each partition's spec and status
    /// (leader, replicas and their offsets), as the SC reports them; empty
    /// when the CLI is not at hand or does not answer.
    fn partitions(&self) -> Vec<serde_json::Value> {
        let Some(tools) = find_tools() else {
            return Vec::new();
        };
        cli(&tools, &std::env::temp_dir(), &self.admin)
            .args(["partition", "list", "-O", "json"])
            .output()
            .ok()
            .and_then(|o| serde_json::from_slice(&o.stdout).ok())
            .unwrap_or_default()
    }

    /// The SPU that leads `topic`'s `partition`, as the SC reports it.
    pub fn leader_of(&self, topic: &str, partition: u32) -> Option<u32> {
        self.leader_of_named(&format!("{topic}-{partition}"))
    }

    /// The SPU leading the partition named `name` (`<topic>-<partition>`,
    /// as [`FluvioCluster::lagging_replicas`] names it).
    pub fn leader_of_named(&self, name: &str) -> Option<u32> {
        self.partitions()
            .iter()
            .find(|p| p["name"] == name)
            .and_then(|p| p["status"]["leader"]["spu"].as_u64())
            .and_then(|id| u32::try_from(id).ok())
    }

    /// The replicas (SPU ids) that lag their partition's leader, as
    /// `(partition name, spu)`: a follower whose log ends before the
    /// leader's. Empty when every replica has caught up.
    pub fn lagging_replicas(&self) -> Vec<(String, u32)> {
        let mut lagging = Vec::new();
        for p in &self.partitions() {
            let leo = p["status"]["leader"]["leo"].as_i64().unwrap_or(0);
            for r in p["status"]["replicas"].as_array().into_iter().flatten() {
                if r["leo"].as_i64().unwrap_or(0) < leo
                    && let Some(spu) = r["spu"].as_u64().and_then(|s| u32::try_from(s).ok())
                {
                    lagging.push((p["name"].as_str().unwrap_or_default().to_owned(), spu));
                }
            }
        }
        lagging
    }

    /// `fluvio partition list` and `fluvio consumer list` of the cluster,
    /// for failure messages (empty when the CLI is not at hand).
    pub fn describe(&self) -> String {
        let Some(tools) = find_tools() else {
            return String::new();
        };
        let mut out = String::new();
        for args in [&["partition", "list"][..], &["consumer", "list"][..]] {
            if let Ok(o) = cli(&tools, &std::env::temp_dir(), &self.admin)
                .args(args)
                .output()
            {
                out.push_str(&String::from_utf8_lossy(&o.stdout));
                out.push_str(&String::from_utf8_lossy(&o.stderr));
            }
        }
        out
    }

    fn own(&self) -> &Started {
        self.started.as_ref().expect(
            "the SPUs of a cluster named by WALHOOK_FLUVIO_ENDPOINT cannot be killed or restarted",
        )
    }

    fn spu(&self, id: u32) -> &Spu {
        self.own()
            .spus
            .iter()
            .find(|s| s.id == id)
            .unwrap_or_else(|| panic!("this cluster has no SPU {id}"))
    }

    /// Kills the first SPU with SIGKILL (a broker crash) and leaves it down
    /// until [`Self::restart_spu`]. Panics for a cluster this test did not
    /// start.
    pub fn kill_spu(&self) {
        self.kill_spu_id(FIRST_SPU);
    }

    /// Kills the first SPU with SIGKILL (if it runs) and starts it again on
    /// the same ports and data (a broker crash). Panics for a cluster this
    /// test did not start.
    pub fn restart_spu(&self) {
        self.restart_spu_id(FIRST_SPU);
    }

    /// Kills SPU `id` with SIGKILL and leaves it down until
    /// [`Self::restart_spu_id`].
    pub fn kill_spu_id(&self, id: u32) {
        if let Some(mut child) = self.spu(id).child.lock().take() {
            kill(&mut child);
        }
    }

    /// Stops SPU `id`, deletes its copy of `partition` (`topic-N`), and
    /// starts it again: it fetches the partition afresh from the leader.
    /// What an operator does with a follower whose log diverged from the
    /// leader's and that Fluvio does not bring back by itself.
    pub fn reset_replica(&self, id: u32, partition: &str) {
        let started = self.own();
        let spu = self.spu(id);
        if let Some(mut child) = spu.child.lock().take() {
            kill(&mut child);
        }
        let replica = started
            .dir
            .path()
            .join(format!("spu-{id}/spu-logs-{id}/{partition}"));
        std::fs::remove_dir_all(&replica)
            .unwrap_or_else(|e| panic!("cannot remove {}: {e}", replica.display()));
        self.restart_spu_id(id);
    }

    /// Kills SPU `id` with SIGKILL (if it runs) and starts it again on the
    /// same ports and data.
    pub fn restart_spu_id(&self, id: u32) {
        let started = self.own();
        let spu = self.spu(id);
        let mut slot = spu.child.lock();
        if let Some(mut child) = slot.take() {
            kill(&mut child);
        }
        // The ports of the killed process may take a moment to be free.
        let mut tries = 0;
        loop {
            tries += 1;
            match spu.launch(&started.tools, started.dir.path()) {
                Ok(child) => {
                    *slot = Some(child);
                    return;
                }
                Err(e) if tries >= 3 => panic!("restarting SPU {id} failed: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(500)),
            }
        }
    }
}

/// Set to keep a started cluster's directory (data and logs) after the
/// test, for a look at what the brokers did; its path is printed.
pub const KEEP_ENV: &str = "WALHOOK_FLUVIO_KEEP";

impl Drop for FluvioCluster {
    fn drop(&mut self) {
        if let Some(started) = &mut self.started {
            if std::env::var_os(KEEP_ENV).is_some() {
                let dir = std::mem::replace(
                    &mut started.dir,
                    tempfile::tempdir().expect("a temporary directory"),
                );
                eprintln!(
                    "{KEEP_ENV}: the Fluvio cluster's directory is kept at {}",
                    dir.keep().display()
                );
            }
            for spu in &mut started.spus {
                if let Some(child) = spu.child.get_mut().as_mut() {
                    kill(child);
                }
            }
            kill(started.sc.get_mut());
        }
    }
}
