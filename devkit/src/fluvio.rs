//! A throwaway Fluvio cluster (one SC, one SPU) on loopback, for the tests
//! and benchmarks of the Fluvio log.
//!
//! No package registry serves the Fluvio server, so the cluster comes from
//! the `fluvio-run` and `fluvio` programs beside `local-cluster.sh` in a
//! tools directory (built from Fluvio's public source): `$WALHOOK_FLUVIO_TOOLS`
//! when set, else `shared/tools/fluvio` beside the checkout or beside a
//! folder above it. `WALHOOK_FLUVIO_ENDPOINT` names a running
//! cluster to use instead (then [`FluvioCluster::restart_spu`] is refused:
//! the test did not start that broker).
//!
//! Where neither exists, [`FluvioCluster::start`] returns `None` and prints
//! plainly that the test is skipped and why; `scripts/test.sh` sets
//! `WALHOOK_FLUVIO_REQUIRED=1` when it found the tools, and then a missing
//! cluster is a failure, never a skip.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Names a tools directory (with `local-cluster.sh`).
pub const TOOLS_ENV: &str = "WALHOOK_FLUVIO_TOOLS";
/// Names a running cluster's SC address, `host:port`.
pub const ENDPOINT_ENV: &str = "WALHOOK_FLUVIO_ENDPOINT";
/// Set to `1` to fail instead of skipping when no cluster can be had.
pub const REQUIRED_ENV: &str = "WALHOOK_FLUVIO_REQUIRED";

/// A Fluvio cluster for one test: started by it (and stopped by the PIDs it
/// started when dropped), or named by `WALHOOK_FLUVIO_ENDPOINT`.
#[derive(Debug)]
pub struct FluvioCluster {
    endpoint: String,
    started: Option<Started>,
}

#[derive(Debug)]
struct Started {
    script: PathBuf,
    dir: tempfile::TempDir,
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
        .find(|d| d.join("local-cluster.sh").is_file())
}

impl FluvioCluster {
    /// Starts a cluster for `test`, or says why it cannot and returns
    /// `None` (a skip), unless `WALHOOK_FLUVIO_REQUIRED=1` (then it panics).
    pub fn start(test: &str) -> Option<FluvioCluster> {
        if let Ok(endpoint) = std::env::var(ENDPOINT_ENV)
            && !endpoint.trim().is_empty()
        {
            return Some(FluvioCluster {
                endpoint: endpoint.trim().to_owned(),
                started: None,
            });
        }
        let Some(tools) = find_tools() else {
            let why = format!(
                "{test}: skipped: no Fluvio cluster: set {ENDPOINT_ENV} to a running cluster's SC \
                 address, or {TOOLS_ENV} to a directory with local-cluster.sh, bin/fluvio-run and bin/fluvio"
            );
            assert!(std::env::var(REQUIRED_ENV).as_deref() != Ok("1"), "{why}");
            eprintln!("{why}");
            return None;
        };
        let script = tools.join("local-cluster.sh");
        // A busy machine can make the SPU miss the script's start-up wait:
        // one more try, in a fresh directory, before the test fails.
        let mut tries = 0;
        let (dir, out) = loop {
            tries += 1;
            let dir = tempfile::Builder::new()
                .prefix("walhook-fluvio-")
                .tempdir()
                .expect("a temporary directory for the Fluvio cluster");
            let out = Command::new(&script)
                .arg("start")
                .arg(dir.path())
                .output()
                .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
            if out.status.success() || tries == 2 {
                break (dir, out);
            }
            eprintln!(
                "{test}: the Fluvio cluster did not start ({}); trying once more",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            let _ = Command::new(&script).arg("stop").arg(dir.path()).output();
        };
        assert!(
            out.status.success(),
            "{} start failed: {}\n{}",
            script.display(),
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(dir.path().join("sc.log")).unwrap_or_default()
        );
        let endpoint = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        Some(FluvioCluster {
            endpoint,
            started: Some(Started { script, dir }),
        })
    }

    /// The SC's public address, `host:port`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// `fluvio partition list` and `fluvio consumer list` of the cluster,
    /// for failure messages (empty when the CLI is not at hand).
    pub fn describe(&self) -> String {
        let Some(tools) = find_tools() else {
            return String::new();
        };
        let mut out = String::new();
        for args in [&["partition", "list"][..], &["consumer", "list"][..]] {
            if let Ok(o) = Command::new(tools.join("bin/fluvio"))
                .arg("-c")
                .arg(&self.endpoint)
                .args(args)
                .env("HOME", std::env::temp_dir())
                .output()
            {
                out.push_str(&String::from_utf8_lossy(&o.stdout));
                out.push_str(&String::from_utf8_lossy(&o.stderr));
            }
        }
        out
    }

    /// Kills the SPU with SIGKILL (a broker crash) and leaves it down until
    /// [`Self::restart_spu`]. Panics for a cluster this test did not start.
    pub fn kill_spu(&self) {
        let started = self.own();
        let pid = std::fs::read_to_string(started.dir.path().join("spu.pid"))
            .expect("the SPU's pid file")
            .trim()
            .to_owned();
        let _ = Command::new("kill").args(["-KILL", &pid]).status();
        // Gone once `kill -0` fails.
        for _ in 0..100 {
            let alive = Command::new("kill")
                .args(["-0", &pid])
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !alive {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        panic!("the SPU (pid {pid}) did not die of SIGKILL");
    }

    fn own(&self) -> &Started {
        self.started
            .as_ref()
            .expect("the SPU of a cluster named by WALHOOK_FLUVIO_ENDPOINT cannot be restarted")
    }

    /// Kills the SPU with SIGKILL (if it runs) and starts it again on the
    /// same ports and data (a broker crash). Panics for a cluster this test
    /// did not start.
    pub fn restart_spu(&self) {
        let started = self.own();
        let out = Command::new(&started.script)
            .arg("restart-spu")
            .arg(started.dir.path())
            .output()
            .expect("run local-cluster.sh restart-spu");
        assert!(
            out.status.success(),
            "restarting the SPU failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for FluvioCluster {
    fn drop(&mut self) {
        if let Some(started) = &self.started {
            let _ = Command::new(&started.script)
                .arg("stop")
                .arg(started.dir.path())
                .output();
        }
    }
}
