//! Throwaway Postgres clusters.
//!
//! The first cluster of a machine runs `initdb` into a template directory
//! under the cache; every cluster after that copies the template, so a test
//! gets a cluster of its own in well under a second. Postgres refuses to run
//! as root, so under root the cluster's files belong to `nobody` and the
//! server runs as that user.
//!
//! The server is a child of a thread owned by [`LocalPostgres`], started with
//! `PR_SET_PDEATHSIG`: if the test process dies, even by SIGKILL, the kernel
//! kills the server too, so no cluster outlives its owner.

use std::io;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use walhook_pgtls::{Roots, RustlsConnector, SslMode, TlsOptions};

use crate::tls::{ServerCert, ServerTls};

/// Why a cluster could not be started.
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    /// No Postgres server binaries were found.
    #[error(
        "PostgreSQL server binaries (initdb, postgres) were not found on PATH, under \
         /usr/lib/postgresql/*/bin or in $WALHOOK_PG_BIN. Install them: on Debian or Ubuntu \
         `sudo apt-get install -y postgresql` (scripts/demo.sh does this when run as root), on \
         Fedora `sudo dnf install postgresql-server`, on macOS `brew install postgresql@16`; \
         or set WALHOOK_PG_BIN to the directory that holds initdb"
    )]
    BinariesMissing,
    /// A command failed.
    #[error("{what} failed: {detail}")]
    Command {
        /// The command.
        what: String,
        /// Its output or error.
        detail: String,
    },
    /// The server did not accept connections in time.
    #[error("Postgres did not become ready within {0:?}; its log is in {1}")]
    NotReady(Duration, PathBuf),
    /// File system trouble.
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
}

/// The directory holding `initdb` and `postgres`.
pub fn find_bin_dir() -> Result<PathBuf, PgError> {
    let has_server = |dir: &Path| dir.join("initdb").exists() && dir.join("postgres").exists();
    if let Ok(dir) = std::env::var("WALHOOK_PG_BIN") {
        // An explicit choice is the only one: no silent fallback.
        let dir = PathBuf::from(dir);
        return if has_server(&dir) {
            Ok(dir)
        } else {
            Err(PgError::BinariesMissing)
        };
    }
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/usr/lib/postgresql") {
        let mut versions: Vec<(u32, PathBuf)> = entries
            .filter_map(Result::ok)
            .filter_map(|e| {
                let v = e.file_name().to_string_lossy().parse::<u32>().ok()?;
                Some((v, e.path().join("bin")))
            })
            .collect();
        versions.sort();
        candidates.extend(versions.into_iter().rev().map(|(_, p)| p));
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            // Follow symlinks such as /usr/local/bin/initdb -> …/15/bin/initdb
            // so that `postgres` is found beside the real initdb.
            if let Ok(real) = std::fs::canonicalize(dir.join("initdb"))
                && let Some(parent) = real.parent()
            {
                candidates.push(parent.to_path_buf());
            }
        }
    }
    candidates
        .into_iter()
        .find(|d| has_server(d))
        .ok_or(PgError::BinariesMissing)
}

fn running_as_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The uid/gid the server runs as when we are root.
const NOBODY: u32 = 65534;

fn chown_tree(path: &Path) -> io::Result<()> {
    std::os::unix::fs::chown(path, Some(NOBODY), Some(NOBODY))?;
    if path.is_dir() {
        for entry in std::fs::read_dir(path)? {
            chown_tree(&entry?.path())?;
        }
    }
    Ok(())
}

fn run(cmd: &mut Command, what: &str) -> Result<(), PgError> {
    let out = cmd.output().map_err(|e| PgError::Command {
        what: what.into(),
        detail: e.to_string(),
    })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(PgError::Command {
            what: what.into(),
            detail: format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        })
    }
}

fn as_server_user(cmd: &mut Command) -> &mut Command {
    if running_as_root() {
        cmd.uid(NOBODY).gid(NOBODY);
    }
    cmd
}

fn copy_tree(from: &Path, to: &Path) -> io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// Settings every cluster gets; tests may add more.
/// Extra `name = value` settings for every cluster, `;`-separated.
pub const SETTINGS_ENV: &str = "WALHOOK_PG_SETTINGS";

const BASE_SETTINGS: &[(&str, &str)] = &[
    ("listen_addresses", "'127.0.0.1'"),
    ("wal_level", "logical"),
    ("max_wal_senders", "20"),
    ("max_replication_slots", "20"),
    ("wal_sender_timeout", "'10s'"),
    ("max_connections", "200"),
    ("shared_buffers", "'128MB'"),
    // Throwaway clusters: durability of the server itself is not under
    // test (walhook's processes are what the tests kill).
    ("fsync", "off"),
    ("synchronous_commit", "on"),
    ("full_page_writes", "off"),
    ("log_min_messages", "warning"),
    ("log_line_prefix", "'%m [%p] %d '"),
];

/// The settings of [`SETTINGS_ENV`]; a malformed item is an error that
/// names it, never silently left out.
fn settings_from_env() -> Result<Vec<(String, String)>, PgError> {
    parse_settings(&std::env::var(SETTINGS_ENV).unwrap_or_default())
}

fn parse_settings(text: &str) -> Result<Vec<(String, String)>, PgError> {
    let mut out = Vec::new();
    for item in text.split(';').map(str::trim).filter(|i| !i.is_empty()) {
        match item.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() && !v.trim().is_empty() => {
                out.push((k.trim().to_owned(), v.trim().to_owned()));
            }
            _ => {
                return Err(PgError::Command {
                    what: format!("read {SETTINGS_ENV}"),
                    detail: format!(
                        "{item:?} is not `name = value`; separate settings with `;`, for example \
                         {SETTINGS_ENV}=\"shared_preload_libraries = 'pg_stat_statements'; work_mem = '64MB'\""
                    ),
                });
            }
        }
    }
    Ok(out)
}

fn template_dir(bin: &Path) -> PathBuf {
    // Under root the server runs as `nobody`, which cannot enter root's
    // home: keep the template in the temporary directory then.
    let base = if running_as_root() {
        std::env::temp_dir()
    } else {
        std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .unwrap_or_else(std::env::temp_dir)
    };
    let tag: String = bin
        .to_string_lossy()
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .collect();
    base.join("walhook-cache")
        .join(format!("pg-template-v2-{tag}"))
}

/// Runs initdb once per machine and binary directory.
fn ensure_template(bin: &Path) -> Result<PathBuf, PgError> {
    let template = template_dir(bin);
    if template.join("PG_VERSION").exists() {
        return Ok(template);
    }
    let parent = template.parent().unwrap_or(Path::new("/tmp"));
    std::fs::create_dir_all(parent)?;
    if running_as_root() {
        std::fs::set_permissions(parent, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    }
    let staging = tempfile::Builder::new()
        .prefix("pg-template-")
        .tempdir_in(parent)?;
    let data = staging.path().join("data");
    if running_as_root() {
        chown_tree(staging.path())?;
    }
    run(
        as_server_user(
            Command::new(bin.join("initdb"))
                .args(["-D"])
                .arg(&data)
                .args([
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "-N",
                    "-E",
                    "UTF8",
                    "--locale=C",
                ])
                .current_dir(staging.path()),
        ),
        "initdb",
    )?;
    // Another process may have won the race; either copy is as good.
    match std::fs::rename(&data, &template) {
        Ok(()) => {}
        Err(_) if template.join("PG_VERSION").exists() => {}
        Err(e) => return Err(e.into()),
    }
    Ok(template)
}

fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Builds a [`LocalPostgres`] with extra settings.
#[derive(Debug, Default, Clone)]
pub struct Builder {
    settings: Vec<(String, String)>,
    tls: Option<ServerTls>,
}

impl Builder {
    /// Adds `name = value` to the server's settings (`value` as in
    /// `postgresql.conf`).
    pub fn setting(mut self, name: &str, value: &str) -> Self {
        self.settings.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Turns TLS on (`ssl = on`) with `cert`, a certificate for
    /// `localhost`/`127.0.0.1` from a [`crate::tls::TestCa`]. Plain
    /// connections are still accepted unless [`Builder::tls_only`].
    pub fn tls(mut self, cert: ServerCert) -> Self {
        self.tls = Some(ServerTls { cert, only: false });
        self
    }

    /// Accepts TCP connections over TLS only (`hostssl` in `pg_hba.conf`),
    /// like a server that requires TLS; needs [`Builder::tls`] first.
    pub fn tls_only(mut self) -> Self {
        if let Some(tls) = self.tls.as_mut() {
            tls.only = true;
        }
        self
    }

    /// Starts the cluster.
    pub async fn start(self) -> Result<LocalPostgres, PgError> {
        tokio::task::spawn_blocking(move || LocalPostgres::start_blocking(self.settings, self.tls))
            .await
            .map_err(|e| PgError::Command {
                what: "start".into(),
                detail: e.to_string(),
            })?
    }
}

/// A running throwaway cluster; stopped and deleted on drop.
#[derive(Debug)]
pub struct LocalPostgres {
    port: u16,
    dir: Option<tempfile::TempDir>,
    stop: Option<mpsc::Sender<()>>,
    keeper: Option<JoinHandle<()>>,
    bin: PathBuf,
    /// For a cluster with TLS: the connector devkit's own sessions use
    /// (encrypted, unverified: tests check verification themselves).
    tls: Option<RustlsConnector>,
}

impl LocalPostgres {
    /// Starts a cluster with the base settings.
    pub async fn start() -> Result<Self, PgError> {
        Builder::default().start().await
    }

    /// A builder for a cluster with extra settings.
    pub fn builder() -> Builder {
        Builder::default()
    }

    fn start_blocking(
        mut extra: Vec<(String, String)>,
        tls: Option<ServerTls>,
    ) -> Result<Self, PgError> {
        let bin = find_bin_dir()?;
        let template = ensure_template(&bin)?;
        let dir = tempfile::Builder::new().prefix("walhook-pg-").tempdir()?;
        let data = dir.path().join("data");
        copy_tree(&template, &data)?;
        let connector = match &tls {
            Some(tls) => {
                extra.splice(0..0, tls.install(&data)?);
                let options = TlsOptions::new(SslMode::Require, Roots::BuiltIn);
                Some(
                    RustlsConnector::new(&options).map_err(|e| PgError::Command {
                        what: "make devkit's TLS connector".into(),
                        detail: e.to_string(),
                    })?,
                )
            }
            None => None,
        };
        let mut conf = String::from("\n# walhook devkit\n");
        // For profiling: `WALHOOK_PG_SETTINGS="shared_preload_libraries =
        // 'pg_stat_statements'; log_min_duration_statement = 100"` adds
        // lines to every throwaway cluster (later lines win).
        let from_env = settings_from_env()?;
        for (k, v) in BASE_SETTINGS
            .iter()
            .map(|(k, v)| (*k, *v))
            .chain(extra.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .chain(from_env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        {
            conf.push_str(&format!("{k} = {v}\n"));
        }
        conf.push_str(&format!("unix_socket_directories = '{}'\n", data.display()));
        let conf_path = data.join("postgresql.conf");
        let mut existing = std::fs::read_to_string(&conf_path)?;
        existing.push_str(&conf);
        std::fs::write(&conf_path, existing)?;
        if running_as_root() {
            std::fs::set_permissions(
                dir.path(),
                std::os::unix::fs::PermissionsExt::from_mode(0o755),
            )?;
            chown_tree(&data)?;
        }
        std::fs::set_permissions(&data, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;

        let mut last_error = None;
        for _ in 0..5 {
            let port = free_port()?;
            match Self::spawn_server(&bin, &data, port) {
                Ok((stop, keeper)) => {
                    return Ok(LocalPostgres {
                        port,
                        dir: Some(dir),
                        stop: Some(stop),
                        keeper: Some(keeper),
                        bin,
                        tls: connector,
                    });
                }
                Err(e) => last_error = Some(e),
            }
        }
        Err(last_error.unwrap_or(PgError::NotReady(Duration::ZERO, data)))
    }

    /// Starts the server on a thread that owns it, and waits until it
    /// accepts connections.
    fn spawn_server(
        bin: &Path,
        data: &Path,
        port: u16,
    ) -> Result<(mpsc::Sender<()>, JoinHandle<()>), PgError> {
        let log_path = data.join("server.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)?;
        if running_as_root() {
            std::os::unix::fs::chown(&log_path, Some(NOBODY), Some(NOBODY))?;
        }
        let mut cmd = Command::new(bin.join("postgres"));
        cmd.arg("-D").arg(data).args(["-p", &port.to_string()]);
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        as_server_user(&mut cmd);
        // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches
        // no memory of the parent.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let (started_tx, started_rx) = mpsc::channel::<io::Result<u32>>();
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        let keeper = std::thread::Builder::new()
            .name(format!("postgres-{port}"))
            .spawn(move || {
                let mut child: Child = match cmd.spawn() {
                    Ok(c) => c,
                    Err(e) => {
                        let _ = started_tx.send(Err(e));
                        return;
                    }
                };
                let _ = started_tx.send(Ok(child.id()));
                // Wait for the owner to stop us (or to go away).
                let _ = stop_rx.recv();
                // SIGINT: fast shutdown (roll back, no checkpoint wait).
                // SAFETY: kill(2) on our own child's pid.
                unsafe {
                    libc::kill(child.id() as libc::pid_t, libc::SIGINT);
                }
                let deadline = Instant::now() + Duration::from_secs(10);
                loop {
                    match child.try_wait() {
                        Ok(Some(_)) => break,
                        Ok(None) if Instant::now() < deadline => {
                            std::thread::sleep(Duration::from_millis(20))
                        }
                        _ => {
                            let _ = child.kill();
                            let _ = child.wait();
                            break;
                        }
                    }
                }
            })?;
        let pid = started_rx
            .recv()
            .map_err(|_| PgError::Command {
                what: "postgres".into(),
                detail: "keeper thread died".into(),
            })?
            .map_err(|e| PgError::Command {
                what: "postgres".into(),
                detail: e.to_string(),
            })?;
        let deadline = Duration::from_secs(30);
        let start = Instant::now();
        while start.elapsed() < deadline {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
                && data.join("postmaster.pid").exists()
            {
                // Accepting TCP is not quite ready; pg_isready-like check.
                if Self::is_ready(bin, port) {
                    return Ok((stop_tx, keeper));
                }
            }
            // The server exited (port taken, bad setting): give up on this try.
            // SAFETY: kill with signal 0 only checks that the pid exists.
            if unsafe { libc::kill(pid as libc::pid_t, 0) } != 0 {
                let _ = stop_tx.send(());
                let _ = keeper.join();
                let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                return Err(PgError::Command {
                    what: "postgres".into(),
                    detail: log,
                });
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        let _ = stop_tx.send(());
        let _ = keeper.join();
        Err(PgError::NotReady(deadline, log_path))
    }

    fn is_ready(bin: &Path, port: u16) -> bool {
        Command::new(bin.join("pg_isready"))
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &port.to_string(),
                "-U",
                "postgres",
                "-q",
            ])
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    }

    /// The server's TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills the server and all its processes with SIGKILL (as a power cut
    /// looks to Postgres: no shutdown checkpoint, every connection gone),
    /// waits `down`, and starts it again on the same port and data
    /// directory; it replays its WAL before it accepts connections.
    pub async fn crash_and_restart(&mut self, down: Duration) -> Result<(), PgError> {
        let data = self.data_dir();
        let pid_file = std::fs::read_to_string(data.join("postmaster.pid"))?;
        let pid: i32 = pid_file
            .lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
            .ok_or_else(|| PgError::Command {
                what: "read postmaster.pid".into(),
                detail: pid_file.clone(),
            })?;
        let children = children_of(pid);
        // SAFETY: kill(2) on the cluster's own processes.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            for c in &children {
                libc::kill(*c, libc::SIGKILL);
            }
        }
        // The keeper reaps the postmaster; init reaps the rest.
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(keeper) = self.keeper.take() {
            let _ = tokio::task::spawn_blocking(move || keeper.join()).await;
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while children.iter().any(|c| alive(*c)) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(down).await;
        let bin = self.bin.clone();
        let port = self.port;
        let (stop, keeper) =
            tokio::task::spawn_blocking(move || Self::spawn_server(&bin, &data, port))
                .await
                .map_err(|e| PgError::Command {
                    what: "restart".into(),
                    detail: e.to_string(),
                })??;
        self.stop = Some(stop);
        self.keeper = Some(keeper);
        Ok(())
    }

    /// The directory with the server's binaries (for `pg_recvlogical`).
    pub fn bin_dir(&self) -> &Path {
        &self.bin
    }

    /// The data directory (its `server.log` helps when a test fails).
    pub fn data_dir(&self) -> PathBuf {
        self.dir
            .as_ref()
            .map(|d| d.path().join("data"))
            .unwrap_or_default()
    }

    /// A connection URL for `database` as the superuser `postgres`.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// A `tokio-postgres` connection to `database`, its connection task
    /// spawned (over TLS, unverified, when the cluster has TLS).
    pub async fn connect(
        &self,
        database: &str,
    ) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
        let mut config: tokio_postgres::Config = self.url(database).parse()?;
        let client = match &self.tls {
            Some(connector) => {
                config.ssl_mode(tokio_postgres::config::SslMode::Require);
                let (client, conn) = config.connect(connector.clone()).await?;
                tokio::spawn(watch_connection(conn));
                client
            }
            None => {
                let (client, conn) = config.connect(tokio_postgres::NoTls).await?;
                tokio::spawn(watch_connection(conn));
                client
            }
        };
        Ok(client)
    }

    /// Creates `name` (a fresh database for one test) and returns its URL.
    pub async fn create_database(&self, name: &str) -> Result<String, tokio_postgres::Error> {
        let admin = self.connect("postgres").await?;
        admin
            .batch_execute(&format!(
                "CREATE DATABASE \"{}\"",
                name.replace('"', "\"\"")
            ))
            .await?;
        Ok(self.url(name))
    }
}

/// A plain session to `url`, tried again every 100 ms for up to `within`
/// (a server restarting after a crash refuses connections meanwhile).
pub async fn connect_retrying(
    url: &str,
    within: Duration,
) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let deadline = Instant::now() + within;
    loop {
        match tokio_postgres::connect(url, tokio_postgres::NoTls).await {
            Ok((client, conn)) => {
                tokio::spawn(watch_connection(conn));
                return Ok(client);
            }
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// A session that opens itself again after an error: for writers that
/// outlive a server crash.
pub struct Reconnecting {
    url: String,
    client: Option<tokio_postgres::Client>,
}

impl Reconnecting {
    /// A session to `url`, opened at the first statement.
    pub fn new(url: impl Into<String>) -> Self {
        Reconnecting {
            url: url.into(),
            client: None,
        }
    }

    /// Runs `sql`, connecting first when needed (for up to 60 s). After an
    /// error the statement's outcome is unknown (it may have committed)
    /// and the next call opens a new session.
    pub async fn execute(
        &mut self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<u64, tokio_postgres::Error> {
        let client = match self.client.take() {
            Some(c) => c,
            None => connect_retrying(&self.url, Duration::from_secs(60)).await?,
        };
        let result = client.execute(sql, params).await;
        if result.is_ok() {
            self.client = Some(client);
        }
        result
    }
}

/// Waits until a walsender reads `slot` (writes committed before a first
/// start would not be captured); `false` after `within`.
pub async fn wait_slot_active(
    client: &tokio_postgres::Client,
    slot: &str,
    within: Duration,
) -> Result<bool, tokio_postgres::Error> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        let active = client
            .query_opt(
                "SELECT active FROM pg_replication_slots WHERE slot_name = $1",
                &[&slot],
            )
            .await?
            .map(|r| r.get::<_, bool>(0));
        if active == Some(true) {
            return Ok(true);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(false)
}

/// The processes whose parent is `pid` (from `/proc`).
fn children_of(pid: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|stat| {
                // The fields after the command (which may hold spaces).
                stat.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<i32>().ok())
                    == Some(pid)
            })
        })
        .collect()
}

/// Whether `pid` runs (a zombie does not).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next().map(|s| s != "Z"))
            .unwrap_or(false)
    })
}

/// Runs a devkit session's connection until it ends.
async fn watch_connection<S, T>(conn: tokio_postgres::Connection<S, T>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    if let Err(e) = conn.await {
        tracing::debug!(error = %e, "devkit connection ended");
    }
}

impl Drop for LocalPostgres {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(keeper) = self.keeper.take() {
            let _ = keeper.join();
        }
        if let Some(dir) = self.dir.take()
            && std::env::var_os("WALHOOK_KEEP_PG").is_some()
        {
            let kept = dir.keep();
            eprintln!("kept Postgres data in {}", kept.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extra_settings_parse_or_name_the_bad_item() {
        let ok =
            parse_settings(" shared_preload_libraries = 'pg_stat_statements' ; work_mem = '64MB';")
                .unwrap();
        assert_eq!(
            ok,
            [
                (
                    "shared_preload_libraries".to_owned(),
                    "'pg_stat_statements'".to_owned()
                ),
                ("work_mem".to_owned(), "'64MB'".to_owned()),
            ]
        );
        assert!(parse_settings("").unwrap().is_empty());
        let err = parse_settings("work_mem = '64MB'; fsync")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("\"fsync\"") && err.contains(SETTINGS_ENV),
            "{err}"
        );
        assert!(parse_settings("= on").is_err());
    }
}
