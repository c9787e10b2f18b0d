//! The walhook processes of a chaos run: one `walhook run` on the embedded
//! log, or `walhook capture` and fan-out members (`walhook fanout`, joined
//! to their group) on a Fluvio cluster, with dispatch members (`walhook
//! dispatch`) when dispatch goes by endpoint. Whichever dies is started
//! again.

use std::path::PathBuf;

use super::process::Walhook;
use super::rounds::Rng;

/// What a process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    /// `walhook run`: every stage.
    Run,
    /// `walhook capture`.
    Capture,
    /// `walhook fanout`: fan-out and dispatch of its share (fan-out alone
    /// when dispatch members run).
    Member,
    /// `walhook dispatch` with `[log] dispatch = "by-endpoint"`: the
    /// dispatchers of its share of the deliveries partitions.
    Dispatcher,
}

impl Role {
    fn command(self) -> &'static [&'static str] {
        match self {
            Role::Run => &["run"],
            Role::Capture => &["capture"],
            Role::Member => &["fanout"],
            Role::Dispatcher => &["dispatch"],
        }
    }
}

/// The running processes, by position.
pub(super) struct Stages {
    cfg: PathBuf,
    log: PathBuf,
    procs: Vec<(Role, Walhook)>,
}

impl Stages {
    /// Starts `walhook run`, or capture, fan-out members and dispatch
    /// members (`(members, dispatchers)`).
    pub(super) fn start(
        cfg: PathBuf,
        log: PathBuf,
        members: Option<(u32, u32)>,
    ) -> anyhow::Result<Self> {
        let roles: Vec<Role> = match members {
            None => vec![Role::Run],
            Some((n, d)) => std::iter::once(Role::Capture)
                .chain((0..n).map(|_| Role::Member))
                .chain((0..d).map(|_| Role::Dispatcher))
                .collect(),
        };
        let mut procs = Vec::new();
        for role in roles {
            procs.push((role, Walhook::spawn(role.command(), &cfg, &log, None)?));
        }
        Ok(Stages { cfg, log, procs })
    }

    /// The process a fault aims at: capture's failpoints at capture,
    /// fan-out's and dispatch's at a member, anything else at any process.
    pub(super) fn target(&self, fault: &str, rng: &mut Rng) -> usize {
        let dispatchers = self.procs.iter().any(|(r, _)| *r == Role::Dispatcher);
        let fits = |role: Role| match role {
            Role::Run => true,
            Role::Capture => {
                !(fault.starts_with("fanout.")
                    || fault.starts_with("dispatch.")
                    || fault == "member-freeze")
            }
            Role::Member => {
                !(fault.starts_with("capture.") || dispatchers && fault.starts_with("dispatch."))
            }
            Role::Dispatcher => !(fault.starts_with("capture.") || fault.starts_with("fanout.")),
        };
        let candidates: Vec<usize> = (0..self.procs.len())
            .filter(|&i| fits(self.procs[i].0))
            .collect();
        candidates[rng.below(candidates.len() as u64) as usize]
    }

    /// Says which process `i` is.
    pub(super) fn name(&self, i: usize) -> String {
        let (role, walhook) = &self.procs[i];
        let what = match role {
            Role::Run => "walhook run",
            Role::Capture => "walhook capture",
            Role::Member => "a fan-out member",
            Role::Dispatcher => "a dispatch member",
        };
        format!("{what} (pid {})", walhook.pid())
    }

    /// Stops process `i` and starts its role again, with `failpoint`.
    pub(super) fn restart(&mut self, i: usize, failpoint: Option<&str>) -> anyhow::Result<()> {
        let role = self.procs[i].0;
        self.procs[i].1.stop();
        self.procs[i].1 = Walhook::spawn(role.command(), &self.cfg, &self.log, failpoint)?;
        Ok(())
    }

    /// SIGKILL of process `i` (started again by [`Self::restart_dead`]).
    pub(super) fn kill(&mut self, i: usize) {
        self.procs[i].1.kill();
    }

    /// Whether process `i` joins a group (a fan-out or dispatch member).
    pub(super) fn joins(&self, i: usize) -> bool {
        matches!(self.procs[i].0, Role::Member | Role::Dispatcher)
    }

    /// The pid of process `i`.
    pub(super) fn pid(&self, i: usize) -> u32 {
        self.procs[i].1.pid()
    }

    /// Starts every process that died again; whether one had.
    pub(super) fn restart_dead(&mut self) -> anyhow::Result<bool> {
        let mut any = false;
        for (role, walhook) in &mut self.procs {
            if !walhook.running() {
                *walhook = Walhook::spawn(role.command(), &self.cfg, &self.log, None)?;
                any = true;
            }
        }
        Ok(any)
    }

    /// Stops every process in order (SIGTERM).
    pub(super) fn stop(&mut self) {
        for (_, walhook) in &mut self.procs {
            walhook.stop();
        }
    }
}
