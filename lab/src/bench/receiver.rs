//! The benchmarks' receiver in a process of its own, so that the CPU and
//! memory the benchmark reports for walhook are walhook's alone.
//!
//! `walhook bench receiver` (hidden) serves a counting receiver on a free
//! loopback port, prints the address on one line and runs until its stdin
//! closes (the benchmark ended, however it ended). [`RemoteReceiver`] starts
//! it and reads and steers it over HTTP.

use std::net::SocketAddr;
use std::process::{ExitCode, Stdio};

use anyhow::Context;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use walhook_devkit::receiver::{Behaviour, Receiver};

/// Runs the receiver until stdin closes.
pub async fn serve() -> anyhow::Result<ExitCode> {
    let receiver = Receiver::start_counting().await?;
    println!("{}", receiver.addr());
    let mut sink = Vec::new();
    // EOF (or an error) on stdin: the benchmark is gone.
    let _ = tokio::io::stdin().read_to_end(&mut sink).await;
    drop(receiver);
    Ok(ExitCode::SUCCESS)
}

/// A counting receiver running in a child process.
#[derive(Debug)]
pub struct RemoteReceiver {
    child: tokio::process::Child,
    addr: SocketAddr,
    http: reqwest::Client,
}

impl RemoteReceiver {
    /// Starts `walhook bench receiver` (this same binary).
    pub async fn start() -> anyhow::Result<RemoteReceiver> {
        let exe =
            std::env::current_exe().context("cannot find this program to start the receiver")?;
        let mut child = tokio::process::Command::new(exe)
            .args(["bench", "receiver"])
            .env("WALHOOK_LOG", "error")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .context("cannot start the receiver process")?;
        let stdout = child.stdout.take().context("the receiver has no stdout")?;
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .await
            .context("the receiver did not say where it listens")?;
        let addr: SocketAddr = line
            .trim()
            .parse()
            .with_context(|| format!("the receiver printed {line:?}, not an address"))?;
        let http = reqwest::Client::builder().no_proxy().build()?;
        Ok(RemoteReceiver { child, addr, http })
    }

    /// The URL of endpoint `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}/{path}", self.addr)
    }

    /// Requests received so far.
    pub async fn count(&self) -> anyhow::Result<u64> {
        let text = self
            .http
            .get(format!("http://{}/_count", self.addr))
            .send()
            .await?
            .text()
            .await?;
        Ok(text.trim().parse()?)
    }

    /// Sets how `path` answers from now on.
    pub async fn set_behaviour(&self, path: &str, behaviour: &Behaviour) -> anyhow::Result<()> {
        let r = self
            .http
            .put(format!("http://{}/_behaviour/{path}", self.addr))
            .body(serde_json::to_vec(behaviour)?)
            .send()
            .await?;
        anyhow::ensure!(
            r.status().is_success(),
            "the receiver refused a behaviour: {}",
            r.status()
        );
        Ok(())
    }

    /// The receiver process's id (for its CPU time).
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }
}
