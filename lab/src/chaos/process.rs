//! One `walhook` process of a chaos run, started as a child of the chaos
//! command (so that a fault can kill, freeze or restart it), its stderr
//! appended to the run's log.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;

/// `walhook run` as a child process, its log appended to a file.
pub(super) struct Walhook {
    child: std::process::Child,
}

impl Walhook {
    pub(super) fn start(
        cfg: &Path,
        log: &Path,
        failpoint: Option<&str>,
    ) -> anyhow::Result<Walhook> {
        Walhook::spawn(&["run"], cfg, log, failpoint)
    }

    /// A standby dispatcher node next to `walhook run`.
    pub(super) fn start_standby(cfg: &Path, log: &Path) -> anyhow::Result<Walhook> {
        Walhook::spawn(&["dispatch", "--node-id", "chaos-standby"], cfg, log, None)
    }

    pub(super) fn spawn(
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

    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(super) fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub(super) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends `signal` (a name `kill` knows: TERM, STOP, CONT).
    fn signal(&self, signal: &str) {
        signal_pid(self.child.id(), signal);
    }

    /// SIGTERM, then up to 30 s for the drain.
    pub(super) fn stop(&mut self) {
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

/// Sends `signal` (a name `kill` knows) to the process `pid`.
pub(super) fn signal_pid(pid: u32, signal: &str) {
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
