//! Which tables a migration locks, and how hard: read from its SQL before
//! it runs (`walhook migrate --check`), so that an operator knows whether
//! applying it pauses the pipeline's writes.
//!
//! The reading is lexical: statements are split outside strings, quoted
//! names, comments and dollar-quoted bodies; a `DO` block's body is read as
//! statements too (a function's body is not: creating a function runs none
//! of it). A table the same migration creates is new, so nothing waits on
//! it. Lock modes are Postgres's ("Explicit Locking" in its manual).

/// The tables the pipeline writes all the time: a lock that blocks their
/// writes holds up capture, fan-out and dispatch while it lasts. Their
/// daily partitions (`<table>_<day>`) count too.
pub const HOT_TABLES: &[&str] = &["events", "deliveries", "attempts", "pending", "fanouts"];

/// A table lock a statement takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lock {
    /// The table, as the statement names it (without `walhook.`).
    pub table: String,
    /// The lock.
    pub mode: LockMode,
    /// The statement's start, for the operator.
    pub statement: String,
}

/// Postgres table lock modes, weakest first (those a migration takes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LockMode {
    /// Row changes (`INSERT`, `UPDATE`, `DELETE`): blocks no reader or
    /// writer, but touches every row it changes.
    RowExclusive,
    /// `CREATE INDEX CONCURRENTLY`, `VALIDATE CONSTRAINT`, `ATTACH
    /// PARTITION`, storage parameters: blocks no reader or writer.
    ShareUpdateExclusive,
    /// `CREATE INDEX`: blocks writers until it finishes.
    Share,
    /// `CREATE TRIGGER`, a foreign key: blocks writers.
    ShareRowExclusive,
    /// Most of `ALTER TABLE`, `DROP`, `TRUNCATE`: blocks readers and
    /// writers.
    AccessExclusive,
}

impl LockMode {
    /// Whether writers wait while it is held.
    pub fn blocks_writes(self) -> bool {
        self >= LockMode::Share
    }

    /// Its name in Postgres's manual, and what waits on it.
    pub fn describe(self) -> &'static str {
        match self {
            LockMode::RowExclusive => "ROW EXCLUSIVE (blocks nothing; changes rows)",
            LockMode::ShareUpdateExclusive => "SHARE UPDATE EXCLUSIVE (blocks no reads or writes)",
            LockMode::Share => "SHARE (blocks writes until it commits)",
            LockMode::ShareRowExclusive => "SHARE ROW EXCLUSIVE (blocks writes until it commits)",
            LockMode::AccessExclusive => {
                "ACCESS EXCLUSIVE (blocks reads and writes until it commits)"
            }
        }
    }
}

/// Whether `table` (without schema) is one of [`HOT_TABLES`] or a
/// partition of one.
pub fn is_hot(table: &str) -> bool {
    HOT_TABLES.iter().any(|h| {
        table == *h
            || table
                .strip_prefix(h)
                .is_some_and(|rest| rest.starts_with('_'))
    })
}

/// The locks on [`HOT_TABLES`] that `sql` takes.
pub fn hot_locks(sql: &str) -> Vec<Lock> {
    locks(sql)
        .into_iter()
        .filter(|l| is_hot(&l.table))
        .collect()
}

/// Every table lock `sql` takes on a table it did not create itself.
pub fn locks(sql: &str) -> Vec<Lock> {
    let mut created: Vec<String> = Vec::new();
    let mut out = Vec::new();
    for statement in split(sql) {
        read_statement(&statement, &mut created, &mut out);
    }
    out
}

fn read_statement(statement: &Statement, created: &mut Vec<String>, out: &mut Vec<Lock>) {
    // A statement of a PL/pgSQL block may follow the block's keywords.
    let words: Vec<&str> = statement
        .words
        .split_whitespace()
        .skip_while(|w| matches!(*w, "begin" | "then" | "else" | "loop"))
        .collect();
    let at = |i: usize| words.get(i).copied().unwrap_or("");
    // A table this migration created before this statement is new:
    // nothing else waits on it.
    let known: Vec<String> = created.clone();
    let mut lock = |table: &str, mode: LockMode| {
        let table = bare_name(table);
        if !known.contains(&table) {
            out.push(Lock {
                table,
                mode,
                statement: statement.head.clone(),
            });
        }
    };
    match (at(0), at(1)) {
        ("do", _) => {
            for body in &statement.bodies {
                for inner in split(body) {
                    read_statement(&inner, created, out);
                }
            }
        }
        ("create", _) if within(&words, "table", 3) => {
            let i = after(&words, "table", &["if", "not", "exists"]);
            let name = bare_name(at(i));
            if let Some(p) = words.iter().position(|w| *w == "partition")
                && at(p + 1) == "of"
            {
                lock(at(p + 2), LockMode::AccessExclusive);
            }
            created.push(name);
        }
        ("create", _) if within(&words, "index", 3) => {
            let Some(on) = words.iter().position(|w| *w == "on") else {
                return;
            };
            let table = if at(on + 1) == "only" {
                at(on + 2)
            } else {
                at(on + 1)
            };
            let mode = if words.contains(&"concurrently") {
                LockMode::ShareUpdateExclusive
            } else {
                LockMode::Share
            };
            lock(table, mode);
        }
        ("create", _) if within(&words, "trigger", 4) => {
            if let Some(on) = words.iter().position(|w| *w == "on") {
                lock(at(on + 1), LockMode::ShareRowExclusive);
            }
        }
        ("alter", "table") => {
            let i = after(&words, "table", &["if", "exists", "only"]);
            let rest = words[i.min(words.len())..].join(" ");
            let mode = if [
                "validate constraint",
                "attach partition",
                "set statistics",
                "set (",
                "reset (",
            ]
            .iter()
            .any(|p| rest.contains(p))
                || rest.contains("detach partition") && rest.contains("concurrently")
            {
                LockMode::ShareUpdateExclusive
            } else if rest.contains("foreign key")
                || rest.contains("enable trigger")
                || rest.contains("disable trigger")
            {
                LockMode::ShareRowExclusive
            } else {
                LockMode::AccessExclusive
            };
            lock(at(i), mode);
        }
        ("drop", "table") => {
            let i = after(&words, "table", &["if", "exists"]);
            for name in words[i.min(words.len())..]
                .iter()
                .take_while(|w| !matches!(**w, "cascade" | "restrict"))
            {
                lock(name.trim_end_matches(','), LockMode::AccessExclusive);
            }
        }
        ("truncate", _) => {
            let i = after(&words, "truncate", &["table", "only"]);
            lock(at(i), LockMode::AccessExclusive);
        }
        ("lock", _) => {
            let i = after(&words, "lock", &["table", "only"]);
            let mode = if statement.words.contains("in share mode") {
                LockMode::Share
            } else if statement.words.contains("in share update exclusive mode") {
                LockMode::ShareUpdateExclusive
            } else if statement.words.contains("in row exclusive mode") {
                LockMode::RowExclusive
            } else if statement.words.contains("in share row exclusive mode") {
                LockMode::ShareRowExclusive
            } else {
                LockMode::AccessExclusive
            };
            lock(at(i), mode);
        }
        ("cluster", _) | ("vacuum", "full") => {
            if let Some(name) = words.last() {
                lock(name, LockMode::AccessExclusive);
            }
        }
        ("reindex", "table") if !words.contains(&"concurrently") => lock(at(2), LockMode::Share),
        ("insert", "into") => lock(at(2), LockMode::RowExclusive),
        ("update", _) => {
            let i = after(&words, "update", &["only"]);
            lock(at(i), LockMode::RowExclusive);
        }
        ("delete", "from") => {
            let i = after(&words, "from", &["only"]);
            lock(at(i), LockMode::RowExclusive);
        }
        _ => {}
    }
}

/// Whether `word` is among the first `n` words (`CREATE [UNLOGGED] TABLE`,
/// `CREATE [UNIQUE] INDEX`, `CREATE [OR REPLACE] [CONSTRAINT] TRIGGER`).
fn within(words: &[&str], word: &str, n: usize) -> bool {
    words.iter().take(n).any(|w| *w == word)
}

/// The index of the first word after `word` that is not one of `skip`.
fn after(words: &[&str], word: &str, skip: &[&str]) -> usize {
    let mut i = words
        .iter()
        .position(|w| *w == word)
        .map_or(words.len(), |p| p + 1);
    while i < words.len() && skip.contains(&words[i]) {
        i += 1;
    }
    i
}

/// A name without its schema, quotes, column list or trailing punctuation.
fn bare_name(name: &str) -> String {
    let name = name.split('(').next().unwrap_or("");
    let name = name.trim_end_matches([',', ';']);
    let name = name.rsplit('.').next().unwrap_or(name);
    name.trim_matches('"').to_owned()
}

/// One statement: its words (lower case, outside strings and bodies,
/// which are left out), its start as written, and its dollar-quoted bodies.
#[derive(Debug, Default)]
struct Statement {
    words: String,
    head: String,
    bodies: Vec<String>,
}

/// Splits `sql` into statements at semicolons outside strings, quoted
/// names, comments and dollar-quoted bodies.
fn split(sql: &str) -> Vec<Statement> {
    let mut out = Vec::new();
    let mut cur = Statement::default();
    let mut raw = String::new();
    let chars: Vec<char> = sql.chars().collect();
    let mut i = 0;
    let finish = |cur: &mut Statement, raw: &mut String, out: &mut Vec<Statement>| {
        let head: String = raw.split_whitespace().collect::<Vec<_>>().join(" ");
        if !cur.words.trim().is_empty() {
            let mut st = std::mem::take(cur);
            st.head = head.chars().take(100).collect();
            out.push(st);
        }
        *cur = Statement::default();
        raw.clear();
    };
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        match c {
            '-' if next == Some('-') => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
                continue;
            }
            '/' if next == Some('*') => {
                i += 2;
                while i + 1 < chars.len() && !(chars[i] == '*' && chars[i + 1] == '/') {
                    i += 1;
                }
                i += 2;
                continue;
            }
            '\'' => {
                raw.push(c);
                i += 1;
                while i < chars.len() {
                    raw.push(chars[i]);
                    if chars[i] == '\'' {
                        if chars.get(i + 1) == Some(&'\'') {
                            raw.push('\'');
                            i += 2;
                            continue;
                        }
                        break;
                    }
                    i += 1;
                }
                cur.words.push_str(" '' ");
                i += 1;
                continue;
            }
            '"' => {
                // A quoted name is a word.
                let start = i;
                i += 1;
                while i < chars.len() && chars[i] != '"' {
                    i += 1;
                }
                let word: String = chars[start..(i + 1).min(chars.len())].iter().collect();
                raw.push_str(&word);
                cur.words.push_str(&word);
                i += 1;
                continue;
            }
            '$' => {
                // $tag$ … $tag$ (tag may be empty); a `$1` parameter is not one.
                let mut j = i + 1;
                while j < chars.len() && (chars[j].is_alphanumeric() || chars[j] == '_') {
                    j += 1;
                }
                let tag_is_body = chars.get(j) == Some(&'$')
                    && !chars.get(i + 1).is_some_and(|c| c.is_ascii_digit());
                if tag_is_body {
                    let tag: String = chars[i..=j].iter().collect();
                    let rest: String = chars[j + 1..].iter().collect();
                    let (body, consumed) = match rest.find(&tag) {
                        Some(end) => (rest[..end].to_owned(), end + tag.len()),
                        None => (rest.clone(), rest.len()),
                    };
                    raw.push_str(&tag);
                    cur.words.push_str(" $body$ ");
                    cur.bodies.push(body.clone());
                    raw.push_str(&body);
                    raw.push_str(&tag);
                    i = j + 1 + rest[..consumed].chars().count();
                    continue;
                }
            }
            ';' => {
                finish(&mut cur, &mut raw, &mut out);
                i += 1;
                continue;
            }
            _ => {}
        }
        raw.push(c);
        if c == '(' || c == ')' || c == ',' {
            cur.words.push(' ');
            cur.words.push(c);
            cur.words.push(' ');
        } else {
            cur.words.extend(c.to_lowercase());
        }
        i += 1;
    }
    finish(&mut cur, &mut raw, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn modes(sql: &str) -> Vec<(String, LockMode)> {
        locks(sql).into_iter().map(|l| (l.table, l.mode)).collect()
    }

    #[test]
    fn alter_table_takes_the_lock_its_form_needs() {
        assert_eq!(
            modes("ALTER TABLE walhook.deliveries ADD COLUMN note text;"),
            vec![("deliveries".into(), LockMode::AccessExclusive)]
        );
        assert_eq!(
            modes("alter table if exists only walhook.attempts validate constraint x;"),
            vec![("attempts".into(), LockMode::ShareUpdateExclusive)]
        );
        assert_eq!(
            modes("ALTER TABLE walhook.events SET (fillfactor = 90);"),
            vec![("events".into(), LockMode::ShareUpdateExclusive)]
        );
        assert_eq!(
            modes(
                "ALTER TABLE walhook.pending ADD CONSTRAINT f FOREIGN KEY (a) REFERENCES walhook.x (a);"
            ),
            vec![("pending".into(), LockMode::ShareRowExclusive)]
        );
    }

    #[test]
    fn an_index_blocks_writes_unless_built_concurrently() {
        assert_eq!(
            modes("CREATE INDEX attempts_by_x ON walhook.attempts (x);"),
            vec![("attempts".into(), LockMode::Share)]
        );
        assert_eq!(
            modes(
                "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS i ON ONLY walhook.\"deliveries\" USING btree (id);"
            ),
            vec![("deliveries".into(), LockMode::ShareUpdateExclusive)]
        );
        assert!(LockMode::Share.blocks_writes());
        assert!(!LockMode::ShareUpdateExclusive.blocks_writes());
    }

    #[test]
    fn a_table_the_migration_creates_is_not_a_wait() {
        let sql = "CREATE TABLE IF NOT EXISTS walhook.deliveries_new (id uuid);\n\
                   CREATE INDEX d ON walhook.deliveries_new (id);\n\
                   ALTER TABLE walhook.deliveries_new ADD COLUMN x int;";
        assert!(locks(sql).is_empty(), "{:?}", locks(sql));
        // A partition of a hot table locks its parent.
        assert_eq!(
            modes(
                "CREATE TABLE walhook.attempts_20261204 PARTITION OF walhook.attempts FOR VALUES FROM ('2026-12-04') TO ('2026-12-05');"
            ),
            vec![("attempts".into(), LockMode::AccessExclusive)]
        );
    }

    #[test]
    fn strings_comments_and_bodies_hide_nothing_and_invent_nothing() {
        let sql = "-- ALTER TABLE walhook.deliveries DROP COLUMN x;\n\
                   /* DROP TABLE walhook.events; */\n\
                   COMMENT ON TABLE walhook.attempts IS 'ALTER TABLE walhook.attempts; DROP TABLE x';\n\
                   CREATE FUNCTION walhook.f() RETURNS void LANGUAGE sql AS $f$ DELETE FROM walhook.pending $f$;\n\
                   DO $$ BEGIN ALTER TABLE walhook.fanouts ADD COLUMN y int; END $$;\n\
                   UPDATE walhook.deliveries SET x = $1;";
        assert_eq!(
            modes(sql),
            vec![
                ("fanouts".into(), LockMode::AccessExclusive),
                ("deliveries".into(), LockMode::RowExclusive),
            ]
        );
        let l = &locks(sql)[0];
        assert!(
            l.statement
                .contains("ALTER TABLE walhook.fanouts ADD COLUMN y int"),
            "{l:?}"
        );
    }

    #[test]
    fn hot_tables_and_their_partitions_are_hot() {
        assert!(is_hot("deliveries") && is_hot("deliveries_20261204") && is_hot("attempts"));
        assert!(!is_hot("endpoints") && !is_hot("deliveriesx") && !is_hot("archive_partitions"));
        let sql = "DROP TABLE IF EXISTS walhook.events_legacy, walhook.tenants CASCADE;";
        assert_eq!(
            hot_locks(sql),
            vec![Lock {
                table: "events_legacy".into(),
                mode: LockMode::AccessExclusive,
                statement: "DROP TABLE IF EXISTS walhook.events_legacy, walhook.tenants CASCADE"
                    .into(),
            }]
        );
    }

    #[test]
    fn a_table_renamed_away_and_created_again_is_locked_before_only() {
        let sql = "ALTER TABLE walhook.deliveries RENAME TO deliveries_legacy;\n\
                   CREATE TABLE walhook.deliveries (id uuid) PARTITION BY RANGE (id);\n\
                   CREATE INDEX d ON walhook.deliveries (id);";
        assert_eq!(
            modes(sql),
            vec![("deliveries".into(), LockMode::AccessExclusive)]
        );
    }

    #[test]
    fn a_function_returning_a_table_creates_none() {
        let sql = "CREATE OR REPLACE FUNCTION walhook.f() RETURNS TABLE (a int) LANGUAGE sql AS $$ SELECT 1 $$;\n\
                   CREATE INDEX i ON walhook.events (a);";
        assert_eq!(modes(sql), vec![("events".into(), LockMode::Share)]);
    }

    #[test]
    fn every_shipped_migration_reads_without_a_panic() {
        for m in super::super::MIGRATIONS {
            let _ = locks(m.sql);
        }
    }
}
