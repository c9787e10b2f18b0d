//! What `walhook migrate --check` says: the pending migrations, the
//! strongest lock each takes on a table the pipeline writes, and whether
//! the schema is current.

use super::locks::Lock;
use super::{Migration, Status};

fn label(m: &Migration) -> String {
    format!("{:04}_{}", m.version, m.name)
}

/// The strongest lock per hot table `m` takes, strongest first.
fn hot_locks(m: &Migration) -> Vec<Lock> {
    let mut out: Vec<Lock> = Vec::new();
    for lock in super::locks::hot_locks(m.sql) {
        match out.iter_mut().find(|l| l.table == lock.table) {
            Some(l) if l.mode < lock.mode => *l = lock,
            Some(_) => {}
            None => out.push(lock),
        }
    }
    out.sort_by(|a, b| b.mode.cmp(&a.mode).then_with(|| a.table.cmp(&b.table)));
    out
}

/// What `walhook migrate --check` prints about `status`, and whether the
/// schema is current.
pub fn describe(status: &Status) -> (String, bool) {
    let mut out = String::new();
    let have = status.applied.last().copied().unwrap_or(0);
    let latest = super::latest();
    if !status.changed.is_empty() {
        for m in &status.changed {
            out.push_str(&format!(
                "migration {} was changed after it was applied (its SQL in this binary is not what ran): \
                 `walhook migrate` refuses to go on; run the binary that applied it, and ship schema changes \
                 as new migrations\n",
                label(m)
            ));
        }
    }
    if !status.unknown.is_empty() {
        out.push_str(&format!(
            "the schema holds versions {:?} that this binary does not know (it brings up to {latest}): \
             a newer walhook migrated this database; run that version\n",
            status.unknown
        ));
    }
    if status.pending.is_empty() {
        if status.changed.is_empty() && status.unknown.is_empty() {
            out.push_str(&format!(
                "schema walhook is current (version {have}); nothing to apply\n"
            ));
            return (out, true);
        }
        return (out, false);
    }
    let blocking = status
        .pending
        .iter()
        .any(|m| hot_locks(m).iter().any(|l| l.mode.blocks_writes()));
    out.push_str(&format!(
        "schema walhook is at version {have}; this binary brings version {latest}. {} pending:\n",
        if status.pending.len() == 1 {
            "1 migration".to_owned()
        } else {
            format!("{} migrations", status.pending.len())
        }
    ));
    for m in &status.pending {
        let held = hot_locks(m);
        if held.is_empty() {
            out.push_str(&format!(
                "  {}: no lock on a table the pipeline writes\n",
                label(m)
            ));
            continue;
        }
        out.push_str(&format!("  {}:\n", label(m)));
        for l in held {
            out.push_str(&format!(
                "    {} on {}: {}\n",
                l.mode.describe(),
                l.table,
                l.statement
            ));
        }
    }
    out.push_str("apply with `walhook migrate --config FILE`");
    if blocking {
        out.push_str(
            "; a lock that blocks writes holds capture, fan-out and dispatch back until its migration \
             commits (they wait, nothing is lost): apply it when a pause is acceptable",
        );
    }
    out.push('\n');
    (out, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(versions: &[i32]) -> Status {
        let all = super::super::MIGRATIONS;
        Status {
            applied: all
                .iter()
                .map(|m| m.version)
                .filter(|v| !versions.contains(v))
                .collect(),
            pending: all
                .iter()
                .filter(|m| versions.contains(&m.version))
                .collect(),
            ..Status::default()
        }
    }

    #[test]
    fn a_current_schema_passes_the_check() {
        let (text, current) = describe(&pending(&[]));
        assert!(current, "{text}");
        assert!(text.contains("is current"), "{text}");
    }

    #[test]
    fn pending_migrations_are_listed_with_their_locks_on_hot_tables() {
        // 0008 creates `pending` (a new table: no wait) and 0024 moves
        // deliveries into daily partitions.
        let latest = super::super::latest();
        let (text, current) = describe(&pending(&[8, 24]));
        assert!(!current);
        assert!(
            text.contains(&format!("brings version {latest}. 2 migrations pending")),
            "{text}"
        );
        assert!(text.contains("0024_deliveries_by_day:\n"), "{text}");
        assert!(text.contains("on deliveries"), "{text}");
        assert!(text.contains("walhook migrate --config"), "{text}");
    }

    #[test]
    fn a_schema_ahead_of_the_binary_fails_the_check() {
        let mut status = pending(&[]);
        status.unknown = vec![999];
        let (text, current) = describe(&status);
        assert!(!current);
        assert!(
            text.contains("[999]") && text.contains("newer walhook"),
            "{text}"
        );
    }
}
