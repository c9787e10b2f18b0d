//! Start-up checks against the captured database, and slot and publication
//! management.
//!
//! Every check that fails says what to run. A slot Postgres has invalidated
//! (`wal_status = 'lost'`, after `max_slot_wal_keep_size`) is a definite
//! error: the WAL between the slot's position and now is gone, and capture
//! must not pretend otherwise.

use std::fmt::Write as _;

use tokio_postgres::Client;
use walhook_pipeline::ids::Lsn;

use super::config::{RuleConfig, RuleKind, SourceConfig, split_table};
use super::error::CaptureError;
use super::rules::{ColumnInfo, TableInfo};

/// Quotes an identifier for SQL.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn quote_table(schema: &str, table: &str) -> String {
    format!("{}.{}", quote_ident(schema), quote_ident(table))
}

/// Fails unless `wal_level` is `logical`.
pub async fn check_wal_level(client: &Client) -> Result<(), CaptureError> {
    let row = client
        .query_one("SHOW wal_level", &[])
        .await
        .map_err(CaptureError::query("SHOW wal_level"))?;
    let level: String = row.get(0);
    if level != "logical" {
        return Err(CaptureError::Definite(format!(
            "the captured database has wal_level = {level}; logical replication needs \
             `ALTER SYSTEM SET wal_level = logical` and a restart of Postgres"
        )));
    }
    Ok(())
}

/// Reads a table's columns and replica identity from the catalog: the
/// columns pgoutput sends, so generated columns (which it leaves out) are
/// not among them, and a rule naming one is refused at start.
pub async fn load_table(
    client: &Client,
    schema: &str,
    table: &str,
) -> Result<Option<TableInfo>, CaptureError> {
    let sql = "SELECT c.relreplident::text, a.attname::text, a.atttypid::int8, \
                 coalesce(a.attnum = ANY(i.indkey::int2[]), false) \
               FROM pg_class c \
               JOIN pg_namespace n ON n.oid = c.relnamespace \
               JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped \
                 AND a.attgenerated = '' \
               LEFT JOIN pg_index i ON i.indrelid = c.oid AND \
                 CASE c.relreplident WHEN 'i' THEN i.indisreplident ELSE i.indisprimary END \
               WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p') \
               ORDER BY a.attnum";
    let rows = client
        .query(sql, &[&schema, &table])
        .await
        .map_err(CaptureError::query("read the table's columns"))?;
    let Some(first) = rows.first() else {
        return Ok(None);
    };
    let identity: String = first.get(0);
    let identity = identity.bytes().next().unwrap_or(b'd');
    let columns = rows
        .iter()
        .map(|r| {
            let type_oid: i64 = r.get(2);
            let in_key: bool = r.get(3);
            ColumnInfo {
                name: r.get(1),
                type_oid: type_oid as u32,
                key: in_key || identity == b'f',
            }
        })
        .collect();
    Ok(Some(TableInfo {
        schema: schema.to_owned(),
        name: table.to_owned(),
        replica_identity: identity,
        columns,
    }))
}

/// The tables the rules read, as (schema, table), without repeats.
pub fn rule_tables(rules: &[RuleConfig]) -> Vec<(String, String)> {
    let mut tables: Vec<(String, String)> = Vec::new();
    for rule in rules.iter().filter(|r| r.kind != RuleKind::Message) {
        if let Some(t) = &rule.table {
            let t = split_table(t);
            if !tables.contains(&t) {
                tables.push(t);
            }
        }
    }
    tables
}

/// The rules' tables that are partitioned, after refusing rules that name a
/// partition (its changes are published under its root's name).
async fn partitioned_tables(
    client: &Client,
    tables: &[(String, String)],
) -> Result<Vec<String>, CaptureError> {
    let mut partitioned = Vec::new();
    for (schema, table) in tables {
        let row = client
            .query_opt(
                "SELECT c.relkind = 'p', c.relispartition, \
                   (SELECT format('%I.%I', pn.nspname, pc.relname) FROM pg_inherits i \
                      JOIN pg_class pc ON pc.oid = i.inhparent JOIN pg_namespace pn ON pn.oid = pc.relnamespace \
                    WHERE i.inhrelid = c.oid LIMIT 1) \
                 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = $1 AND c.relname = $2",
                &[schema, table],
            )
            .await
            .map_err(CaptureError::query("read the tables' kinds"))?;
        let Some(row) = row else { continue };
        let (is_partitioned, is_partition, parent): (bool, bool, Option<String>) =
            (row.get(0), row.get(1), row.get(2));
        if is_partition {
            return Err(CaptureError::Definite(format!(
                "table {schema}.{table} is a partition of {}: its changes are published under the \
                 partitioned table's name, so a rule must name {} (it sees every partition's rows)",
                parent.as_deref().unwrap_or("another table"),
                parent.as_deref().unwrap_or("that table"),
            )));
        }
        if is_partitioned {
            partitioned.push(quote_table(schema, table));
        }
    }
    Ok(partitioned)
}

/// Makes sure the publication exists and covers the rules' tables. Rows of
/// a partitioned table's partitions are published under the partitioned
/// table's name (`publish_via_partition_root`), which is what rules name.
pub async fn ensure_publication(
    client: &Client,
    cfg: &SourceConfig,
    tables: &[(String, String)],
) -> Result<(), CaptureError> {
    let partitioned = partitioned_tables(client, tables).await?;
    let exists = client
        .query_opt(
            "SELECT pubinsert AND pubupdate AND pubdelete, pubviaroot FROM pg_publication WHERE pubname = $1",
            &[&cfg.publication],
        )
        .await
        .map_err(CaptureError::query("read pg_publication"))?;
    let list = tables
        .iter()
        .map(|(s, t)| quote_table(s, t))
        .collect::<Vec<_>>()
        .join(", ");
    match exists {
        None if cfg.create_publication => {
            let sql = format!(
                "CREATE PUBLICATION {} FOR TABLE {list} WITH (publish_via_partition_root = true)",
                quote_ident(&cfg.publication)
            );
            client
                .batch_execute(&sql)
                .await
                .map_err(CaptureError::query("create the publication"))?;
            tracing::info!(publication = %cfg.publication, tables = %list, "created publication");
            return Ok(());
        }
        None => {
            return Err(CaptureError::Definite(format!(
                "publication {:?} does not exist; run `CREATE PUBLICATION {} FOR TABLE {list} \
                 WITH (publish_via_partition_root = true);` in the \
                 captured database, or set `create_publication = true` under [source]",
                cfg.publication,
                quote_ident(&cfg.publication)
            )));
        }
        Some(row) => {
            let all_ops: bool = row.get(0);
            if !all_ops {
                tracing::warn!(publication = %cfg.publication, "the publication does not publish every insert, update and delete; rules for the missing operations see nothing");
            }
            let via_root: bool = row.get(1);
            if !via_root && !partitioned.is_empty() {
                let fix = format!(
                    "ALTER PUBLICATION {} SET (publish_via_partition_root = true)",
                    quote_ident(&cfg.publication)
                );
                if !cfg.create_publication {
                    return Err(CaptureError::Definite(format!(
                        "publication {:?} publishes the partitions of {} under their own names, which \
                         no rule names (their rows would be missed); run `{fix};` or set \
                         `create_publication = true` under [source]",
                        cfg.publication,
                        partitioned.join(", ")
                    )));
                }
                client
                    .batch_execute(&fix)
                    .await
                    .map_err(CaptureError::query("publish partitions through their root"))?;
                tracing::info!(publication = %cfg.publication, "the publication now publishes partitions through their partitioned table");
            }
        }
    }
    let published = client
        .query("SELECT schemaname::text, tablename::text FROM pg_publication_tables WHERE pubname = $1", &[&cfg.publication])
        .await
        .map_err(CaptureError::query("read pg_publication_tables"))?;
    let published: Vec<(String, String)> = published.iter().map(|r| (r.get(0), r.get(1))).collect();
    let missing: Vec<&(String, String)> =
        tables.iter().filter(|t| !published.contains(t)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    let missing_list = missing
        .iter()
        .map(|(s, t)| quote_table(s, t))
        .collect::<Vec<_>>()
        .join(", ");
    if cfg.create_publication {
        let sql = format!(
            "ALTER PUBLICATION {} ADD TABLE {missing_list}",
            quote_ident(&cfg.publication)
        );
        client
            .batch_execute(&sql)
            .await
            .map_err(CaptureError::query("add tables to the publication"))?;
        tracing::info!(publication = %cfg.publication, tables = %missing_list, "added tables to the publication");
        Ok(())
    } else {
        Err(CaptureError::Definite(format!(
            "publication {:?} does not include {missing_list}; run `ALTER PUBLICATION {} ADD TABLE {missing_list};` \
             or set `create_publication = true` under [source]",
            cfg.publication,
            quote_ident(&cfg.publication)
        )))
    }
}

/// A slot's state as `pg_replication_slots` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotState {
    /// What the slot last confirmed.
    pub confirmed_flush: Lsn,
    /// `reserved`, `extended`, `unreserved` or `lost`.
    pub wal_status: String,
    /// Bytes of WAL between the confirmed position and the current one.
    pub lag_bytes: i64,
    /// The backend streaming from it, if any.
    pub active_pid: Option<i32>,
}

/// Reads the slot's state; `None` when it does not exist.
pub async fn slot_state(client: &Client, slot: &str) -> Result<Option<SlotState>, CaptureError> {
    let row = client
        .query_opt(
            "SELECT plugin::text, database::text, coalesce(confirmed_flush_lsn, '0/0')::text, \
                    coalesce(wal_status, 'reserved'), \
                    coalesce(pg_current_wal_lsn() - confirmed_flush_lsn, 0)::int8, active_pid, \
                    current_database()::text \
             FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .map_err(CaptureError::query("read pg_replication_slots"))?;
    let Some(row) = row else {
        return Ok(None);
    };
    let plugin: Option<String> = row.get(0);
    let database: Option<String> = row.get(1);
    let current: String = row.get(6);
    if plugin.as_deref() != Some("pgoutput") {
        return Err(CaptureError::Definite(format!(
            "slot {slot:?} exists but uses plugin {plugin:?}; walhook needs a logical slot with pgoutput: \
             drop it (`SELECT pg_drop_replication_slot('{slot}')`) or name another slot in [source].slot"
        )));
    }
    if database.as_deref() != Some(current.as_str()) {
        return Err(CaptureError::Definite(format!(
            "slot {slot:?} belongs to database {database:?}, not {current:?}; name another slot in [source].slot"
        )));
    }
    let confirmed: String = row.get(2);
    let state = SlotState {
        confirmed_flush: confirmed.parse().unwrap_or(Lsn::ZERO),
        wal_status: row.get(3),
        lag_bytes: row.get(4),
        active_pid: row.get(5),
    };
    Ok(Some(state))
}

/// The definite error for a slot whose WAL Postgres removed.
pub fn slot_lost(slot: &str, confirmed: Lsn) -> CaptureError {
    CaptureError::SlotLost(format!(
        "replication slot {slot:?} is lost (wal_status = 'lost'): Postgres removed WAL the slot still \
         needed, because it fell behind more than max_slot_wal_keep_size. Changes committed after \
         {confirmed} cannot be read and capture has stopped. To resume: note the gap for \
         reconciliation, run `SELECT pg_drop_replication_slot('{slot}')`, and start walhook once \
         with --accept-slot-loss (it records the gap as a capture incident and creates the slot with \
         create_slot = true; the new slot starts from the current position)"
    ))
}

/// Makes sure the slot exists and is usable; returns its state.
/// `read_up_to`: how far this source read before (its saved checkpoint),
/// when it did; a missing slot is then not created again (see
/// [`CaptureError::SlotGone`]).
pub async fn ensure_slot(
    client: &Client,
    cfg: &SourceConfig,
    read_up_to: Option<Lsn>,
) -> Result<SlotState, CaptureError> {
    match slot_state(client, &cfg.slot).await? {
        Some(state) if state.wal_status == "lost" => {
            Err(slot_lost(&cfg.slot, state.confirmed_flush))
        }
        Some(state) => {
            if state.wal_status == "unreserved" {
                tracing::warn!(slot = %cfg.slot, lag_bytes = state.lag_bytes, "the slot's WAL is about to be removed (wal_status = unreserved); capture is too far behind");
            }
            Ok(state)
        }
        None if let Some(read_up_to) = read_up_to => Err(CaptureError::SlotGone {
            slot: cfg.slot.clone(),
            source_name: cfg.name.clone(),
            read_up_to,
        }),
        None if cfg.create_slot => {
            client
                .query_one(
                    "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
                    &[&cfg.slot],
                )
                .await
                .map_err(CaptureError::query("create the replication slot"))?;
            tracing::info!(slot = %cfg.slot, "created logical replication slot");
            slot_state(client, &cfg.slot).await?.ok_or_else(|| {
                CaptureError::Definite(format!(
                    "slot {:?} vanished right after it was created",
                    cfg.slot
                ))
            })
        }
        None => Err(CaptureError::Definite(format!(
            "replication slot {:?} does not exist; run `SELECT pg_create_logical_replication_slot('{}', 'pgoutput');` \
             in the captured database, or set `create_slot = true` under [source]",
            cfg.slot, cfg.slot
        ))),
    }
}

/// Loads every rule table, failing with the list of those missing.
pub async fn load_tables(
    client: &Client,
    tables: &[(String, String)],
) -> Result<Vec<TableInfo>, CaptureError> {
    let mut found = Vec::new();
    let mut missing = String::new();
    for (schema, table) in tables {
        match load_table(client, schema, table).await? {
            Some(info) => found.push(info),
            None => {
                let _ = write!(
                    missing,
                    "{}{schema}.{table}",
                    if missing.is_empty() { "" } else { ", " }
                );
            }
        }
    }
    if !missing.is_empty() {
        return Err(CaptureError::Definite(format!(
            "the captured database has no table {missing}; check the rules' `table` (schema.table) \
             and that the URL in [source] names the right database"
        )));
    }
    Ok(found)
}
