//! Every precondition of capture checked at once, changing nothing, each
//! with its verdict and the exact fix (`walhook doctor`). Capture's own
//! start-up checks stop at the first problem and create the slot and the
//! publication when the config allows; these read the catalog only.

use super::catalog::{self, quote_ident};
use super::config::{RuleConfig, RuleKind, SourceConfig, split_table};
use super::connect::connect_sql;
use super::rules::compile;

/// A check's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// It holds.
    Ok,
    /// It holds, with advice.
    Warn,
    /// It does not hold: capture would refuse to start, or miss changes.
    Fail,
}

/// One check's outcome.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Finding {
    /// What was checked (`source.wal_level`, `rule.orders`, …).
    pub check: String,
    /// The verdict.
    pub verdict: Verdict,
    /// What was found.
    pub detail: String,
    /// What to run or change, when it does not hold.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Finding {
    /// A finding of `check`; `fix` says what to run or change.
    pub fn new(check: &str, verdict: Verdict, detail: String, fix: Option<&str>) -> Self {
        Finding {
            check: check.to_owned(),
            verdict,
            detail,
            fix: fix.map(str::to_owned),
        }
    }

    fn ok(check: &str, detail: String) -> Self {
        Finding::new(check, Verdict::Ok, detail, None)
    }

    fn fail(check: &str, detail: String, fix: String) -> Self {
        Finding::new(check, Verdict::Fail, detail, Some(&fix))
    }
}

fn quote_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// The findings as text: one line each, the fix under a failing or
/// warning one, and a last line with the verdict.
pub fn render(findings: &[Finding]) -> String {
    let mut out = String::new();
    for f in findings {
        let mark = match f.verdict {
            Verdict::Ok => "ok  ",
            Verdict::Warn => "WARN",
            Verdict::Fail => "FAIL",
        };
        out.push_str(&format!("{mark} {:<22} {}\n", f.check, f.detail));
        if let (Some(fix), true) = (&f.fix, f.verdict != Verdict::Ok) {
            out.push_str(&format!("     {:<22} fix: {fix}\n", ""));
        }
    }
    let failed = findings
        .iter()
        .filter(|f| f.verdict == Verdict::Fail)
        .count();
    if failed == 0 {
        out.push_str("everything walhook run needs holds\n");
    } else {
        out.push_str(&format!(
            "{failed} check{} failed: apply the fixes above, then run walhook doctor again\n",
            if failed == 1 { "" } else { "s" }
        ));
    }
    out
}

/// Checks the captured database against `cfg` and `rules`.
pub async fn check_source(cfg: &SourceConfig, rules: &[RuleConfig]) -> Vec<Finding> {
    let mut out = Vec::new();
    if let Err(e) = cfg.validate(rules) {
        out.push(Finding::fail(
            "source.config",
            e.to_string(),
            "correct the named setting in the config file".into(),
        ));
        return out;
    }
    let connected = async { connect_sql(&cfg.connect_options()?).await };
    let client: tokio_postgres::Client = match connected.await {
        Ok(c) => c,
        Err(e) => {
            out.push(Finding::fail(
                "source.connect",
                walhook_pipeline::supervise::error_chain(&e),
                "check [source].url (host, port, database, role) and its TLS settings, and that \
                 Postgres accepts connections from this host (pg_hba.conf)"
                    .into(),
            ));
            return out;
        }
    };
    if let Err(e) = checks(&client, cfg, rules, &mut out).await {
        out.push(Finding::fail(
            "source.catalog",
            walhook_pipeline::supervise::error_chain(&e),
            "the role must be able to read the system catalogs of the captured database".into(),
        ));
    }
    out
}

async fn checks(
    client: &tokio_postgres::Client,
    cfg: &SourceConfig,
    rules: &[RuleConfig],
    out: &mut Vec<Finding>,
) -> Result<(), tokio_postgres::Error> {
    // wal_level.
    let level: String = client.query_one("SHOW wal_level", &[]).await?.get(0);
    out.push(if level == "logical" {
        Finding::ok("source.wal_level", "wal_level = logical".into())
    } else {
        Finding::fail(
            "source.wal_level",
            format!("wal_level = {level}: logical replication needs logical"),
            "ALTER SYSTEM SET wal_level = logical; then restart Postgres".into(),
        )
    });

    // The role.
    let role = client
        .query_one(
            "SELECT current_user::text, rolreplication, rolsuper FROM pg_roles WHERE rolname = current_user",
            &[],
        )
        .await?;
    let (name, replication, superuser): (String, bool, bool) =
        (role.get(0), role.get(1), role.get(2));
    out.push(if replication || superuser {
        Finding::ok(
            "source.role",
            format!("role {name} may open replication connections"),
        )
    } else {
        Finding::fail(
            "source.role",
            format!(
                "role {name} lacks the REPLICATION attribute: the replication stream refuses it"
            ),
            format!("ALTER ROLE {} REPLICATION;", quote_ident(&name)),
        )
    });

    // Slots and senders.
    let limits = client
        .query_one(
            "SELECT current_setting('max_replication_slots')::int, \
                    current_setting('max_wal_senders')::int, \
                    (SELECT count(*)::int FROM pg_replication_slots), \
                    (SELECT count(*)::int FROM pg_stat_replication), \
                    current_setting('max_slot_wal_keep_size')",
            &[],
        )
        .await?;
    let (max_slots, max_senders, slots, senders, keep): (i32, i32, i32, i32, String) = (
        limits.get(0),
        limits.get(1),
        limits.get(2),
        limits.get(3),
        limits.get(4),
    );
    let slot = catalog::slot_state(client, &cfg.slot).await.ok().flatten();
    let slots_needed = slots + i32::from(slot.is_none());
    out.push(if slots_needed > max_slots {
        Finding::fail(
            "source.slots",
            format!(
                "{slots} of max_replication_slots = {max_slots} are in use, and slot {:?} needs one more",
                cfg.slot
            ),
            format!(
                "ALTER SYSTEM SET max_replication_slots = {}; then restart Postgres",
                slots_needed + 1
            ),
        )
    } else if senders + 1 > max_senders {
        Finding::fail(
            "source.slots",
            format!("{senders} of max_wal_senders = {max_senders} are streaming; capture needs one more"),
            format!(
                "ALTER SYSTEM SET max_wal_senders = {}; then restart Postgres",
                senders + 2
            ),
        )
    } else {
        Finding::ok(
            "source.slots",
            format!(
                "{slots} of {max_slots} replication slots and {senders} of {max_senders} WAL senders in use"
            ),
        )
    });

    // The slot itself.
    out.push(match &slot {
        None if cfg.create_slot => Finding::ok(
            "source.slot",
            format!("slot {:?} does not exist yet; walhook creates it at start (create_slot = true)", cfg.slot),
        ),
        None => Finding::fail(
            "source.slot",
            format!("slot {:?} does not exist and create_slot = false", cfg.slot),
            format!(
                "SELECT pg_create_logical_replication_slot({}, 'pgoutput'); or set create_slot = true under [source]",
                quote_literal(&cfg.slot)
            ),
        ),
        Some(s) if s.wal_status == "lost" => Finding::fail(
            "source.slot",
            format!("slot {:?} was invalidated: the WAL it held is gone", cfg.slot),
            "start walhook once with --accept-slot-loss (the gap is recorded and shown by `walhook reconcile`)".into(),
        ),
        Some(s) => {
            let mut detail = format!(
                "slot {:?} retains {} bytes of WAL (wal_status {})",
                cfg.slot, s.lag_bytes, s.wal_status
            );
            if let Some(pid) = s.active_pid {
                detail.push_str(&format!("; in use by backend {pid} (a walhook running now?)"));
            }
            if keep == "-1" {
                Finding::new(
                    "source.slot",
                    Verdict::Warn,
                    format!("{detail}; max_slot_wal_keep_size is unlimited, so a stopped capture lets WAL fill the disk"),
                    Some("ALTER SYSTEM SET max_slot_wal_keep_size = '50GB'; (a bound you can afford); then SELECT pg_reload_conf();"),
                )
            } else {
                Finding::ok(
                    "source.slot",
                    format!("{detail}; max_slot_wal_keep_size = {keep}"),
                )
            }
        }
    });

    // The publication and the rules' tables.
    let tables = catalog::rule_tables(rules);
    let publication = client
        .query_opt(
            "SELECT puballtables FROM pg_publication WHERE pubname = $1",
            &[&cfg.publication],
        )
        .await?;
    let published: Vec<(String, String)> = client
        .query(
            "SELECT schemaname::text, tablename::text FROM pg_publication_tables WHERE pubname = $1",
            &[&cfg.publication],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let quoted = |(s, t): &(String, String)| format!("{}.{}", quote_ident(s), quote_ident(t));
    match publication {
        None if cfg.create_publication => out.push(Finding::ok(
            "source.publication",
            format!(
                "publication {:?} does not exist yet; walhook creates it at start (create_publication = true)",
                cfg.publication
            ),
        )),
        None => out.push(Finding::fail(
            "source.publication",
            format!("publication {:?} does not exist", cfg.publication),
            format!(
                "CREATE PUBLICATION {} FOR TABLE {} WITH (publish_via_partition_root = true);",
                quote_ident(&cfg.publication),
                tables.iter().map(quoted).collect::<Vec<_>>().join(", ")
            ),
        )),
        Some(_) => {
            let missing: Vec<&(String, String)> =
                tables.iter().filter(|t| !published.contains(t)).collect();
            out.push(if missing.is_empty() {
                Finding::ok(
                    "source.publication",
                    format!(
                        "publication {:?} covers the rules' {} tables",
                        cfg.publication,
                        tables.len()
                    ),
                )
            } else if cfg.create_publication {
                Finding::ok(
                    "source.publication",
                    format!(
                        "publication {:?} lacks {}; walhook adds them at start (create_publication = true)",
                        cfg.publication,
                        missing.iter().map(|t| quoted(t)).collect::<Vec<_>>().join(", ")
                    ),
                )
            } else {
                let list = missing.iter().map(|t| quoted(t)).collect::<Vec<_>>().join(", ");
                Finding::fail(
                    "source.publication",
                    format!(
                        "publication {:?} does not include {list}: their changes are never published",
                        cfg.publication
                    ),
                    format!(
                        "ALTER PUBLICATION {} ADD TABLE {list};",
                        quote_ident(&cfg.publication)
                    ),
                )
            });
        }
    }

    // Each table rule against its table.
    let types = super::types::TypeMap::load(client).await.ok();
    for rule in rules.iter().filter(|r| r.kind != RuleKind::Message) {
        let check = format!("rule.{}", rule.name);
        let (schema, table) = split_table(rule.table.as_deref().unwrap_or_default());
        let info = match catalog::load_table(client, &schema, &table).await {
            Ok(Some(info)) => info,
            Ok(None) => {
                out.push(Finding::fail(
                    &check,
                    format!(
                        "the captured database has no table {schema}.{table} (or this role cannot see it)"
                    ),
                    "correct the rule's `table`, or create the table".into(),
                ));
                continue;
            }
            Err(e) => {
                out.push(Finding::fail(
                    &check,
                    walhook_pipeline::supervise::error_chain(&e),
                    "the role must be able to read the table's definition".into(),
                ));
                continue;
            }
        };
        let info = match &types {
            Some(t) => info.resolve_types(t),
            None => info,
        };
        let select: bool = client
            .query_one(
                "SELECT has_table_privilege(format('%I.%I', $1::text, $2::text), 'SELECT')",
                &[&schema, &table],
            )
            .await?
            .get(0);
        if !select {
            out.push(Finding::fail(
                &check,
                format!("role {name} may not SELECT from {schema}.{table}"),
                format!(
                    "GRANT SELECT ON {}.{} TO {};",
                    quote_ident(&schema),
                    quote_ident(&table),
                    quote_ident(&name)
                ),
            ));
            continue;
        }
        out.push(match compile(rule, &info) {
            Ok(compiled) if compiled.warnings.is_empty() => {
                Finding::ok(&check, format!("fits table {schema}.{table}"))
            }
            Ok(compiled) => Finding::new(&check, Verdict::Warn, compiled.warnings.join("; "), None),
            Err(e) => {
                // The message names the field and the fix; a change of the
                // table's replica identity is quoted in it as SQL.
                let message = e.to_string();
                let sql = message
                    .split('`')
                    .skip(1)
                    .step_by(2)
                    .find(|s| s.starts_with("ALTER TABLE"))
                    .map(|s| format!("{s};"));
                Finding::fail(
                    &check,
                    message.clone(),
                    sql.unwrap_or_else(|| "correct the rule's field as the message says".into()),
                )
            }
        });
    }
    Ok(())
}
