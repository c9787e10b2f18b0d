//! What `walhook init` proposes for each table: its kind (rows or an
//! outbox), its tenant, its object id, what a delete can carry, and the
//! replica identity the rules need. Pure: no database.

use super::TableShape;

/// Column names taken for the tenant, in order of preference.
pub const TENANT_COLUMNS: &[&str] = &[
    "tenant_id",
    "tenant",
    "org_id",
    "organization_id",
    "organisation_id",
    "account_id",
    "workspace_id",
    "team_id",
    "company_id",
];

/// The tenant given to tables without a tenant column.
pub const DEFAULT_TENANT: &str = "default";

const OUTBOX_TYPE_COLUMNS: &[&str] = &["event_type", "type", "message_type", "event_name", "topic"];
const OUTBOX_PAYLOAD_COLUMNS: &[&str] = &["payload", "data", "body", "event_data", "message"];
const OUTBOX_OBJECT_COLUMNS: &[&str] = &[
    "aggregate_id",
    "aggregateid",
    "entity_id",
    "object_id",
    "subject_id",
];

/// Where a table's events take their tenant from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TenantChoice {
    /// A column recognised by its name.
    Column {
        /// The column.
        name: String,
        /// It may hold null (such a row becomes an incident).
        nullable: bool,
    },
    /// No such column: one tenant for every row, to review.
    Fixed(String),
}

impl TenantChoice {
    fn column(&self) -> Option<&str> {
        match self {
            TenantChoice::Column { name, .. } => Some(name),
            TenantChoice::Fixed(_) => None,
        }
    }
}

/// What a delete event can carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delete {
    /// The replica identity's columns (and the tenant column when it is one
    /// of them): the table's identity stays as it is.
    Key(Vec<String>),
    /// The whole old row: the table has (or gets) `REPLICA IDENTITY FULL`.
    FullRow,
}

/// The kind of rule(s) proposed for a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProposalKind {
    /// Three rules: inserts, updates and deletes of rows.
    Rows {
        /// What the delete rule sends.
        delete: Delete,
    },
    /// An outbox: each inserted row carries its type and JSON payload.
    Outbox {
        /// The column holding the event type.
        type_column: String,
        /// The column holding the payload.
        payload_column: String,
    },
}

/// The proposal for one table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proposal {
    /// The table.
    pub table: TableShape,
    /// Rows or an outbox.
    pub kind: ProposalKind,
    /// Its tenant.
    pub tenant: TenantChoice,
    /// The object id's columns (empty: none; more than one: a composite key).
    pub object_id: Vec<String>,
    /// `walhook-setup.sql` sets `REPLICA IDENTITY FULL` on it.
    pub set_full_identity: bool,
    /// The rules' names start with this (unique within the plan).
    pub rule_base: String,
    /// The event types start with this.
    pub type_base: String,
    /// Things to review, written as comments above its rules.
    pub review: Vec<String>,
}

/// A table left out, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// `schema.table`.
    pub table: String,
    /// Why.
    pub why: String,
}

/// What `walhook init` proposes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// The tables that get rules.
    pub tables: Vec<Proposal>,
    /// The tables that do not.
    pub skipped: Vec<Skipped>,
}

/// Proposes rules for `tables`.
pub fn plan(tables: &[TableShape]) -> Plan {
    let mut out = Plan::default();
    let mut rule_bases = std::collections::BTreeSet::new();
    for t in tables {
        if t.unlogged {
            out.skipped.push(Skipped {
                table: t.qualified(),
                why: "UNLOGGED: its changes are not written to the WAL".into(),
            });
            continue;
        }
        if let Some(parent) = &t.partition_of {
            out.skipped.push(Skipped {
                table: t.qualified(),
                why: format!(
                    "a partition of {parent}: its changes are published under {parent}'s name"
                ),
            });
            continue;
        }
        if t.schema.contains('.') {
            out.skipped.push(Skipped {
                table: t.qualified(),
                why: "its schema's name holds a `.`, which `table = \"schema.table\"` cannot name"
                    .into(),
            });
            continue;
        }
        if t.columns.is_empty() {
            out.skipped.push(Skipped {
                table: t.qualified(),
                why: "it has no columns".into(),
            });
            continue;
        }
        out.tables.push(propose(t, &mut rule_bases));
    }
    out
}

fn propose(t: &TableShape, rule_bases: &mut std::collections::BTreeSet<String>) -> Proposal {
    let mut review = Vec::new();
    let tenant = match TENANT_COLUMNS
        .iter()
        .find_map(|want| t.columns.iter().find(|c| c.name.eq_ignore_ascii_case(want)))
    {
        Some(c) => {
            if !c.not_null {
                review.push(format!(
                    "the tenant column {:?} may be null; a row whose tenant is null becomes an \
                     incident instead of an event",
                    c.name
                ));
            }
            TenantChoice::Column {
                name: c.name.clone(),
                nullable: !c.not_null,
            }
        }
        None => {
            review.push(format!(
                "REVIEW: no tenant column found (looked for {}); every event goes to tenant \
                 {DEFAULT_TENANT:?}. Name the column with `tenant_column`, or keep one tenant",
                TENANT_COLUMNS.join(", ")
            ));
            TenantChoice::Fixed(DEFAULT_TENANT.into())
        }
    };
    let outbox = outbox_columns(t);
    let object_id = match &outbox {
        Some(_) => match OUTBOX_OBJECT_COLUMNS
            .iter()
            .find_map(|want| t.columns.iter().find(|c| c.name.eq_ignore_ascii_case(want)))
        {
            Some(c) => vec![c.name.clone()],
            None => t.primary_key.clone(),
        },
        None => t.primary_key.clone(),
    };
    if object_id.is_empty() {
        review.push("no primary key: its events carry no object id".into());
    } else if object_id.len() > 1 {
        review.push(format!(
            "a composite key: the object id is {} joined by `:`",
            object_id.join(", ")
        ));
    }
    let identity = t.identity_columns();
    let no_identity = matches!(&identity, Some(cols) if cols.is_empty());
    let (kind, set_full) = match outbox {
        Some((type_column, payload_column)) => (
            ProposalKind::Outbox {
                type_column,
                payload_column,
            },
            no_identity,
        ),
        None => {
            let mut needed: Vec<&str> = object_id.iter().map(String::as_str).collect();
            needed.extend(tenant.column());
            match identity {
                None => (
                    ProposalKind::Rows {
                        delete: Delete::FullRow,
                    },
                    false,
                ),
                Some(key)
                    if !key.is_empty() && needed.iter().all(|n| key.iter().any(|k| k == n)) =>
                {
                    (
                        ProposalKind::Rows {
                            delete: Delete::Key(key),
                        },
                        false,
                    )
                }
                Some(_) => (
                    ProposalKind::Rows {
                        delete: Delete::FullRow,
                    },
                    true,
                ),
            }
        }
    };
    if set_full {
        review.push(if no_identity {
            "no primary key (or REPLICA IDENTITY NOTHING): walhook-setup.sql sets REPLICA \
             IDENTITY FULL, without which a publication that carries updates and deletes makes \
             them fail"
                .to_owned()
        } else {
            "a delete carries only the key, and the tenant is not part of it: walhook-setup.sql \
             sets REPLICA IDENTITY FULL so that deletes carry the whole old row"
                .to_owned()
        });
    }
    let public = t.schema == "public";
    let mut rule_base = ident_part(&if public {
        t.name.clone()
    } else {
        format!("{}_{}", t.schema, t.name)
    });
    if !rule_bases.insert(rule_base.clone()) {
        let mut n = 2;
        while !rule_bases.insert(format!("{rule_base}_{n}")) {
            n += 1;
        }
        rule_base = format!("{rule_base}_{n}");
    }
    let type_base = if public {
        type_part(&t.name)
    } else {
        format!("{}.{}", type_part(&t.schema), type_part(&t.name))
    };
    Proposal {
        table: t.clone(),
        kind,
        tenant,
        object_id,
        set_full_identity: set_full,
        rule_base,
        type_base,
        review,
    }
}

/// An outbox's (type, payload) columns: a text type column and a JSON (or
/// text) payload column with the usual names, in a table named like an
/// outbox or whose payload is typed JSON.
fn outbox_columns(t: &TableShape) -> Option<(String, String)> {
    let find = |names: &[&str], types: &[&str]| {
        names.iter().find_map(|want| {
            t.columns.iter().find(|c| {
                c.name.eq_ignore_ascii_case(want) && types.contains(&c.base_type.as_str())
            })
        })
    };
    let ty = find(OUTBOX_TYPE_COLUMNS, &["text", "varchar", "bpchar", "name"])?;
    let payload = find(
        OUTBOX_PAYLOAD_COLUMNS,
        &["json", "jsonb", "text", "varchar"],
    )?;
    let typed_json = matches!(payload.base_type.as_str(), "json" | "jsonb");
    (t.name.to_ascii_lowercase().contains("outbox") || typed_json)
        .then(|| (ty.name.clone(), payload.name.clone()))
}

/// `name` made fit for a rule name (`[A-Za-z0-9_-]`), lower case.
fn ident_part(name: &str) -> String {
    let s: String = name
        .to_ascii_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    s.chars().take(80).collect()
}

/// `name` made fit for an event type's part: starts with a letter, then
/// letters, digits, `_` and `-`, lower case.
fn type_part(name: &str) -> String {
    let s = ident_part(name);
    let s = if s.starts_with(|c: char| c.is_ascii_alphabetic()) {
        s
    } else {
        format!("t{s}")
    };
    s.chars().take(50).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::postgres::init::ColumnShape;

    fn col(name: &str, base: &str, not_null: bool) -> ColumnShape {
        ColumnShape {
            name: name.into(),
            type_name: base.into(),
            base_type: base.into(),
            not_null,
        }
    }

    fn table(name: &str, columns: Vec<ColumnShape>, pk: &[&str]) -> TableShape {
        TableShape {
            schema: "public".into(),
            name: name.into(),
            columns,
            primary_key: pk.iter().map(|s| s.to_string()).collect(),
            identity_index: vec![],
            replica_identity: b'd',
            partitioned: false,
            partition_of: None,
            unlogged: false,
        }
    }

    #[test]
    fn a_tenant_in_the_key_keeps_the_identity_and_deletes_send_the_key() {
        let t = table(
            "Order Lines",
            vec![
                col("tenant_id", "text", true),
                col("order_id", "int8", true),
                col("line_no", "int4", true),
                col("sku", "text", true),
            ],
            &["tenant_id", "order_id", "line_no"],
        );
        let p = &plan(&[t]).tables[0];
        assert_eq!(p.rule_base, "order_lines");
        assert_eq!(p.type_base, "order_lines");
        assert!(!p.set_full_identity);
        assert_eq!(p.object_id, ["tenant_id", "order_id", "line_no"]);
        assert_eq!(
            p.kind,
            ProposalKind::Rows {
                delete: Delete::Key(vec![
                    "tenant_id".into(),
                    "order_id".into(),
                    "line_no".into()
                ])
            }
        );
    }

    #[test]
    fn a_tenant_outside_the_key_asks_for_full_identity() {
        let t = table(
            "invoices",
            vec![col("id", "int8", true), col("org_id", "int8", false)],
            &["id"],
        );
        let p = &plan(&[t]).tables[0];
        assert!(p.set_full_identity);
        assert_eq!(
            p.tenant,
            TenantChoice::Column {
                name: "org_id".into(),
                nullable: true
            }
        );
        assert!(p.review.iter().any(|r| r.contains("may be null")));
    }

    #[test]
    fn no_tenant_column_means_a_fixed_tenant_flagged_for_review() {
        let t = table("currencies", vec![col("code", "text", true)], &["code"]);
        let p = &plan(&[t]).tables[0];
        assert_eq!(p.tenant, TenantChoice::Fixed(DEFAULT_TENANT.into()));
        assert!(!p.set_full_identity, "the key carries what deletes need");
        assert!(p.review[0].starts_with("REVIEW"));
    }

    #[test]
    fn an_outbox_is_recognised_by_shape_and_uses_the_aggregate_id() {
        let t = table(
            "events_out",
            vec![
                col("id", "uuid", true),
                col("aggregate_id", "text", true),
                col("event_type", "text", true),
                col("payload", "jsonb", true),
            ],
            &["id"],
        );
        let p = &plan(&[t]).tables[0];
        assert_eq!(
            p.kind,
            ProposalKind::Outbox {
                type_column: "event_type".into(),
                payload_column: "payload".into()
            }
        );
        assert_eq!(p.object_id, ["aggregate_id"]);
        // A text payload in a table not named like an outbox is rows.
        let t = table(
            "notes",
            vec![
                col("id", "int8", true),
                col("type", "text", true),
                col("body", "text", true),
            ],
            &["id"],
        );
        assert!(matches!(
            plan(&[t]).tables[0].kind,
            ProposalKind::Rows { .. }
        ));
    }

    #[test]
    fn partitions_and_unlogged_tables_are_skipped_with_the_reason() {
        let mut part = table("m_2026", vec![col("id", "int8", true)], &["id"]);
        part.partition_of = Some("public.m".into());
        let mut cache = table("cache", vec![col("id", "int8", true)], &["id"]);
        cache.unlogged = true;
        let p = plan(&[part, cache]);
        assert!(p.tables.is_empty());
        assert!(p.skipped[0].why.contains("public.m"));
        assert!(p.skipped[1].why.contains("UNLOGGED"));
    }

    #[test]
    fn names_that_collide_or_start_badly_are_made_unique_and_valid() {
        let mut a = table("9lives", vec![col("id", "int8", true)], &[]);
        a.schema = "x".into();
        let b = table("x_9lives", vec![col("id", "int8", true)], &[]);
        let p = plan(&[a, b]);
        assert_eq!(p.tables[0].rule_base, "x_9lives");
        assert_eq!(p.tables[1].rule_base, "x_9lives_2");
        assert_eq!(p.tables[0].type_base, "x.t9lives");
        assert!(p.tables[0].set_full_identity, "no key: full identity");
    }
}
