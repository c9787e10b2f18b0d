//! A throwaway S3-compatible server: `s3s-fs`, which serves the S3 API from
//! a directory, so archive tests talk to a real server over real HTTP with
//! real SigV4 signatures.
//!
//! `scripts/ensure-s3.sh` installs the binary (`cargo install s3s-fs`); it is
//! found through `WALHOOK_S3S_FS` or in `$HOME/.cache/walhook-tools/bin`.
//! Without it [`S3Server::start`] fails with the command to run: tests that
//! need S3 fail, they never skip.
//!
//! Each server listens on a port of its own on 127.0.0.1 (the kernel picks
//! it; the server logs it), stores its objects in a temporary directory and
//! accepts one fixed key pair. A bucket is a directory of the root, so the
//! bucket is made before the server starts. Like the Postgres clusters, the
//! server is a child of a thread owned by [`S3Server`], started with
//! `PR_SET_PDEATHSIG`: it dies with the test process, even on SIGKILL.

use std::io;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The access key id every test server accepts.
pub const ACCESS_KEY: &str = "walhook-test-access";
/// The secret access key every test server accepts.
pub const SECRET_KEY: &str = "walhook-test-secret-key";
/// The region tests sign with (`s3s-fs` accepts any).
pub const REGION: &str = "us-east-1";
/// The environment variable that names the `s3s-fs` binary.
pub const BINARY_ENV: &str = "WALHOOK_S3S_FS";

/// How long a server may take to listen.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// Why a server could not be started.
#[derive(Debug, thiserror::Error)]
pub enum S3ServerError {
    /// The `s3s-fs` binary was not found.
    #[error(
        "the S3 test server s3s-fs was not found at {0}: run scripts/ensure-s3.sh (it installs \
         s3s-fs 0.14.1 into $HOME/.cache/walhook-tools with cargo install), or set \
         WALHOOK_S3S_FS to the binary"
    )]
    BinaryMissing(PathBuf),
    /// The bucket name cannot be a directory of the server's root.
    #[error("{0:?} is not a bucket name for the test server: use 3 to 63 of a-z, 0-9, '-'")]
    BadBucket(String),
    /// The server exited or never said where it listens.
    #[error("s3s-fs did not start within {0:?}; its log ({1}) says: {2}")]
    NotReady(Duration, PathBuf, String),
    /// File system or process trouble.
    #[error("I/O error while starting s3s-fs")]
    Io(#[from] io::Error),
}

/// Where the `s3s-fs` binary is: `$WALHOOK_S3S_FS` when set (and then only
/// there), else `$HOME/.cache/walhook-tools/bin/s3s-fs`.
pub fn find_binary() -> Result<PathBuf, S3ServerError> {
    locate(
        std::env::var_os(BINARY_ENV).map(PathBuf::from),
        std::env::var_os("HOME").map(PathBuf::from),
    )
}

fn locate(explicit: Option<PathBuf>, home: Option<PathBuf>) -> Result<PathBuf, S3ServerError> {
    // An explicit choice is the only one: no silent fallback.
    let path = explicit.unwrap_or_else(|| {
        home.unwrap_or_default()
            .join(".cache/walhook-tools/bin/s3s-fs")
    });
    if path.is_file() {
        Ok(path)
    } else {
        Err(S3ServerError::BinaryMissing(path))
    }
}

/// A running `s3s-fs` with one bucket; stopped and removed when dropped.
pub struct S3Server {
    endpoint: String,
    bucket: String,
    stop: Option<mpsc::Sender<()>>,
    keeper: Option<JoinHandle<()>>,
    dir: tempfile::TempDir,
}

impl std::fmt::Debug for S3Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Server")
            .field("endpoint", &self.endpoint)
            .field("bucket", &self.bucket)
            .finish_non_exhaustive()
    }
}

impl S3Server {
    /// Starts a server on 127.0.0.1 with an empty `bucket`, and waits until
    /// it accepts connections.
    pub async fn start(bucket: &str) -> Result<S3Server, S3ServerError> {
        let binary = find_binary()?;
        if bucket.len() < 3
            || bucket.len() > 63
            || !bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return Err(S3ServerError::BadBucket(bucket.to_owned()));
        }
        let dir = tempfile::Builder::new().prefix("walhook-s3-").tempdir()?;
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join(bucket))?;
        let log_path = dir.path().join("s3s-fs.log");
        let log = std::fs::File::create(&log_path)?;

        let mut cmd = Command::new(&binary);
        cmd.args(["--host", "127.0.0.1", "--port", "0"])
            .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
            .arg(&root)
            // The line that names the port is logged at info.
            .env("RUST_LOG", "s3s_fs=info,s3s=warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches no
        // memory of the parent.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let (started_tx, started_rx) = mpsc::channel::<io::Result<()>>();
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        // The death signal follows the thread that spawned the child, so a
        // thread of our own spawns it and lives as long as the server.
        let keeper = std::thread::Builder::new()
            .name("s3s-fs".into())
            .spawn(move || {
                let mut child: Child = match cmd.spawn() {
                    Ok(child) => child,
                    Err(e) => {
                        let _ = started_tx.send(Err(e));
                        return;
                    }
                };
                let _ = started_tx.send(Ok(()));
                // Wait for the owner to stop us (or to go away); end early
                // when the server exits on its own, so start() sees it.
                while let Err(mpsc::RecvTimeoutError::Timeout) =
                    stop_rx.recv_timeout(Duration::from_millis(50))
                {
                    if let Ok(Some(_)) = child.try_wait() {
                        return;
                    }
                }
                let _ = child.kill();
                let _ = child.wait();
            })?;
        let mut server = S3Server {
            endpoint: String::new(),
            bucket: bucket.to_owned(),
            stop: Some(stop_tx),
            keeper: Some(keeper),
            dir,
        };
        started_rx
            .recv()
            .map_err(|_| io::Error::other("the s3s-fs keeper thread died"))??;

        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let text = std::fs::read_to_string(&log_path).unwrap_or_default();
            if let Some(endpoint) = listening_at(&text)
                && tokio::net::TcpStream::connect(endpoint.trim_start_matches("http://"))
                    .await
                    .is_ok()
            {
                server.endpoint = endpoint;
                return Ok(server);
            }
            let exited = server.keeper.as_ref().is_none_or(|k| k.is_finished());
            if exited || Instant::now() > deadline {
                return Err(S3ServerError::NotReady(START_TIMEOUT, log_path, text));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The endpoint URL, `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The access key id the server accepts.
    pub fn access_key(&self) -> &str {
        ACCESS_KEY
    }

    /// The secret access key the server accepts.
    pub fn secret_key(&self) -> &str {
        SECRET_KEY
    }

    /// The bucket made at start.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The server's root directory (one folder per bucket), to inspect
    /// what landed on disk.
    pub fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    /// The environment a child process (the walhook binary, the AWS CLI)
    /// needs to reach this server through the AWS credential chain.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.to_owned()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.to_owned()),
            ("AWS_REGION", REGION.to_owned()),
            ("AWS_ENDPOINT_URL", self.endpoint.clone()),
        ]
    }

    /// Stops the server now (its files stay until drop): later requests
    /// find nothing listening.
    pub fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(keeper) = self.keeper.take() {
            let _ = keeper.join();
        }
    }
}

/// The endpoint in s3s-fs's "server is running at http://…" log line.
fn listening_at(log: &str) -> Option<String> {
    const MARK: &str = "server is running at ";
    let start = log.find(MARK)? + MARK.len();
    let url: String = log[start..]
        .chars()
        .take_while(|c| !c.is_whitespace())
        .collect();
    url.starts_with("http://").then_some(url)
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_endpoint_is_read_from_the_log() {
        let log = "  2026-11-30T13:06:15Z  INFO s3s_fs: server is running at \
                   http://127.0.0.1:37719\n    at src/main.rs:121\n";
        assert_eq!(listening_at(log).as_deref(), Some("http://127.0.0.1:37719"));
        assert_eq!(listening_at("INFO s3s_fs: authentication is enabled"), None);
    }

    #[test]
    fn a_missing_binary_says_how_to_install_it() {
        let nowhere = tempfile::tempdir().unwrap();
        let err = locate(None, Some(nowhere.path().to_path_buf())).unwrap_err();
        assert!(err.to_string().contains("scripts/ensure-s3.sh"), "{err}");
        let err = locate(Some(nowhere.path().join("s3s-fs")), None).unwrap_err();
        assert!(err.to_string().contains("scripts/ensure-s3.sh"), "{err}");
    }
}
