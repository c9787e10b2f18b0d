//! Failpoints: named places where tests make the process fail on purpose.
//!
//! Crash safety is proven by killing processes at the dangerous points
//! (DESIGN.md). A test sets `WALHOOK_FAILPOINTS` in a child's environment,
//! for example `capture.after_handoff=abort@3` (abort at the third hit), and
//! the child dies exactly there. Unset, a failpoint costs one atomic load.
//!
//! Actions: `abort` (SIGABRT, no clean-up, like a crash), `exit` (status 86),
//! `sleep(MS)`, `panic` (the task at the failpoint panics) and `end` (the
//! task at the failpoint returns as if its work were over: [`hit`] returns
//! `true`, and the caller ends its loop). An optional `@N` fires on the
//! N-th hit only.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The environment variable read once at the first failpoint.
pub const ENV: &str = "WALHOOK_FAILPOINTS";

#[derive(Debug)]
enum Action {
    Abort,
    Exit,
    Sleep(Duration),
    Panic,
    End,
}

#[derive(Debug)]
struct Point {
    action: Action,
    at_hit: Option<u64>,
    hits: AtomicU64,
}

fn registry() -> &'static HashMap<String, Point> {
    static POINTS: OnceLock<HashMap<String, Point>> = OnceLock::new();
    POINTS.get_or_init(|| {
        std::env::var(ENV)
            .map(|spec| parse(&spec))
            .unwrap_or_default()
    })
}

fn parse(spec: &str) -> HashMap<String, Point> {
    let mut points = HashMap::new();
    for item in spec
        .split([';', ','])
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        let Some((name, rest)) = item.split_once('=') else {
            tracing::warn!(item, "ignoring failpoint without '=ACTION'");
            continue;
        };
        let (action, at_hit) = match rest.split_once('@') {
            Some((a, n)) => (a, n.parse().ok()),
            None => (rest, None),
        };
        let action = match action {
            "abort" => Action::Abort,
            "exit" => Action::Exit,
            "panic" => Action::Panic,
            "end" => Action::End,
            other => match other
                .strip_prefix("sleep(")
                .and_then(|s| s.strip_suffix(')'))
            {
                Some(ms) => Action::Sleep(Duration::from_millis(ms.parse().unwrap_or(0))),
                None => {
                    tracing::warn!(item, "ignoring failpoint with an unknown action");
                    continue;
                }
            },
        };
        points.insert(
            name.to_owned(),
            Point {
                action,
                at_hit,
                hits: AtomicU64::new(0),
            },
        );
    }
    points
}

/// Fires the failpoint `name` if the environment configured it; `true`
/// when its action is `end` (the caller stops its task there; failpoints
/// whose caller cannot end ignore it).
pub fn hit(name: &str) -> bool {
    let Some(point) = registry().get(name) else {
        return false;
    };
    let n = point.hits.fetch_add(1, Ordering::SeqCst) + 1;
    if point.at_hit.is_some_and(|at| at != n) {
        return false;
    }
    match point.action {
        Action::Abort => {
            eprintln!("failpoint {name}: aborting (hit {n})");
            std::process::abort();
        }
        Action::Exit => {
            eprintln!("failpoint {name}: exiting (hit {n})");
            std::process::exit(86);
        }
        Action::Sleep(d) => std::thread::sleep(d),
        Action::Panic => panic!("failpoint {name}: panicking (hit {n})"),
        Action::End => {
            eprintln!("failpoint {name}: ending its task (hit {n})");
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_actions_and_hit_counts() {
        let points = parse("a=abort@3; b=sleep(5),c=exit, bad, d=launch, e=end@2, f=panic");
        assert!(matches!(points["e"].action, Action::End));
        assert!(matches!(points["f"].action, Action::Panic));
        assert!(matches!(points["a"].action, Action::Abort));
        assert_eq!(points["a"].at_hit, Some(3));
        assert!(matches!(points["b"].action, Action::Sleep(d) if d == Duration::from_millis(5)));
        assert!(matches!(points["c"].action, Action::Exit));
        assert!(!points.contains_key("bad") && !points.contains_key("d"));
    }
}
