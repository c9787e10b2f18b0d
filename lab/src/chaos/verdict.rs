//! The verdict on the rounds: what one round found when its webhooks were
//! compared with what the business database committed, the whole run's
//! report, and the summary table printed at the end.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;
use walhook_devkit::receiver::Receiver;

use super::world::REQUEST_TIMEOUT;

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
    pub(super) fn clean(&self) -> bool {
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
pub(super) fn arrived(
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

/// The round judged: its requests at the receiver against the webhooks
/// `expected` from what the business database committed.
pub(super) fn judge(
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

/// Prints the run as a table, one line a fault, and its verdict.
pub(super) fn print_summary(report: &ChaosReport) {
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
