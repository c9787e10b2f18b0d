//! A table or outbox rule bound to a table's columns ([`compile`]): every
//! column it names is found, typed and checked against the replica
//! identity, so a rule the WAL cannot serve is refused with the fix, at
//! start-up and after a schema change alike.

use std::sync::Arc;

use walhook_pipeline::event::EventType;
use walhook_pipeline::ids::TenantId;

use super::table::TableInfo;
use crate::postgres::config::{
    Condition, ObjectVersion, Operation, RowSelector, RuleConfig, RuleError, RuleKind,
};
use crate::postgres::declared::DeclaredSchemas;
use crate::postgres::value::{may_be_toasted, oid};

#[derive(Debug, Clone)]
pub(super) enum CondOp {
    Equals(String),
    NotEquals(String),
    In(Vec<String>),
    IsNull(bool),
    Changed,
    ChangedTo(String),
    ChangedFrom(String),
}

#[derive(Debug, Clone)]
pub(super) struct CompiledCondition {
    pub(super) index: usize,
    pub(super) row: RowSelector,
    pub(super) op: CondOp,
}

/// Where a rule's events take their tenant from.
#[derive(Debug, Clone)]
pub(super) enum TenantSource {
    /// A column of the row.
    Column(usize),
    /// The rule's `tenant`, the same for every row.
    Fixed(TenantId),
}

#[derive(Debug, Clone)]
pub(super) enum VersionSource {
    Lsn,
    Column(usize),
}

/// A rule bound to a table's column positions.
#[derive(Debug, Clone)]
pub struct CompiledRule {
    pub(super) name: Arc<str>,
    pub(super) table: String,
    pub(super) ops: Vec<Operation>,
    pub(super) conditions: Vec<CompiledCondition>,
    pub(super) event_type: Option<EventType>,
    /// The version its events carry: the catalog's for the current shape.
    pub(super) schema_version: u32,
    /// The version the config names.
    schema_version_configured: u32,
    pub(super) tenant: TenantSource,
    /// The object id's columns (none: events carry no object id; more
    /// than one: a composite key).
    pub(super) object_id: Vec<usize>,
    pub(super) version: Option<VersionSource>,
    /// Payload columns sorted by name: (name, index, type).
    pub(super) payload: Vec<(String, usize, u32)>,
    /// Outbox: the type and payload columns.
    pub(super) outbox: Option<(usize, usize, u32)>,
    /// Outbox: the schemas the config declares for payloads.
    pub(super) declared: Option<Arc<DeclaredSchemas>>,
    /// Start-up advice that is not an error.
    pub warnings: Vec<String>,
}

fn full_identity_fix(table: &TableInfo) -> String {
    format!(
        "table {} has REPLICA IDENTITY {}; run `ALTER TABLE {} REPLICA IDENTITY FULL` so that \
         the WAL carries old values",
        table.qualified(),
        match table.replica_identity {
            b'd' => "DEFAULT",
            b'n' => "NOTHING",
            b'i' => "USING INDEX",
            _ => "FULL",
        },
        table.qualified()
    )
}

/// Binds `rule` to `table`, checking every column it names.
pub fn compile(rule: &RuleConfig, table: &TableInfo) -> Result<CompiledRule, RuleError> {
    let name = rule.name.as_str();
    let column = |field: &str, col: &str| {
        table.index(col).ok_or_else(|| {
            let known: Vec<&str> = table.columns.iter().map(|c| c.name.as_str()).collect();
            RuleError::new(
                name,
                field,
                format!(
                    "table {} has no column {col:?} (it has: {})",
                    table.qualified(),
                    known.join(", ")
                ),
            )
        })
    };
    let tenant_field = "tenant_column";
    let tenant = match (&rule.tenant, &rule.tenant_column) {
        (Some(fixed), _) => TenantSource::Fixed(
            TenantId::new(fixed.as_str())
                .map_err(|e| RuleError::new(name, "tenant", e.to_string()))?,
        ),
        (None, c) => TenantSource::Column(column(tenant_field, c.as_deref().unwrap_or_default())?),
    };
    let object_id = rule
        .object_id_column
        .as_ref()
        .map(|cs| {
            cs.columns()
                .into_iter()
                .map(|c| column("object_id_column", c))
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()?
        .unwrap_or_default();
    let version = match &rule.object_version {
        None => None,
        Some(ObjectVersion::Named(_)) => Some(VersionSource::Lsn),
        Some(ObjectVersion::Column { column: c }) => {
            Some(VersionSource::Column(column("object_version", c)?))
        }
    };
    let ops = if rule.kind == RuleKind::Outbox {
        vec![Operation::Insert]
    } else {
        rule.effective_operations()
    };
    let mut warnings = Vec::new();
    let full = table.is_full();
    let needs_old = |index: usize| !full && !table.columns[index].key;

    let mut conditions = Vec::new();
    for (i, c) in rule.when.iter().enumerate() {
        let field = format!("when[{i}].column");
        let index = column(&field, &c.column)?;
        if c.reads_old() && needs_old(index) {
            return Err(RuleError::new(
                name,
                &format!("when[{i}]"),
                format!(
                    "the condition reads the old value of {:?}, which the WAL carries only for key \
                     columns: {}",
                    c.column,
                    full_identity_fix(table)
                ),
            ));
        }
        conditions.push(CompiledCondition {
            index,
            row: c.row,
            op: cond_op(c),
        });
    }

    let deletes = ops.contains(&Operation::Delete);
    let check_delete_column = |field: &str, index: usize| {
        if deletes && needs_old(index) {
            Err(RuleError::new(
                name,
                field,
                format!(
                    "deletes carry only the key, and {:?} is not part of it: {}",
                    table.columns[index].name,
                    full_identity_fix(table)
                ),
            ))
        } else {
            Ok(())
        }
    };
    if let TenantSource::Column(i) = tenant {
        check_delete_column(tenant_field, i)?;
    }
    for i in &object_id {
        check_delete_column("object_id_column", *i)?;
    }
    if let Some(VersionSource::Column(i)) = version {
        check_delete_column("object_version", i)?;
    }

    let mut payload = Vec::new();
    let mut outbox = None;
    match rule.kind {
        RuleKind::Table => {
            for c in rule.include.iter().chain(&rule.exclude) {
                column(
                    if rule.include.is_empty() {
                        "exclude"
                    } else {
                        "include"
                    },
                    c,
                )?;
            }
            for (index, col) in table.columns.iter().enumerate() {
                let wanted = if rule.include.is_empty() {
                    !rule.exclude.contains(&col.name)
                } else {
                    rule.include.contains(&col.name)
                };
                if wanted {
                    check_delete_column(
                        if rule.include.is_empty() {
                            "exclude"
                        } else {
                            "include"
                        },
                        index,
                    )?;
                    payload.push((col.name.clone(), index, col.type_oid));
                }
            }
            payload.sort_by(|a, b| a.0.cmp(&b.0));
            if ops.contains(&Operation::Update) && !full {
                let toasty: Vec<&str> = payload
                    .iter()
                    .filter(|(_, _, t)| may_be_toasted(*t))
                    .map(|(n, _, _)| n.as_str())
                    .collect();
                if !toasty.is_empty() {
                    warnings.push(format!(
                        "rule {name:?}: columns {} of {} may be stored out of line (TOAST); an \
                         update that leaves them unchanged does not carry them, and the event then \
                         lists them under \"unavailable\". {}",
                        toasty.join(", "),
                        table.qualified(),
                        full_identity_fix(table)
                    ));
                }
            }
        }
        RuleKind::Outbox => {
            let t = column(
                "type_column",
                rule.type_column.as_deref().unwrap_or_default(),
            )?;
            let p = column(
                "payload_column",
                rule.payload_column.as_deref().unwrap_or_default(),
            )?;
            let ptype = table.columns[p].type_oid;
            if !matches!(ptype, oid::JSON | oid::JSONB | oid::TEXT | oid::VARCHAR) {
                return Err(RuleError::new(
                    name,
                    "payload_column",
                    format!(
                        "{:?} must be json, jsonb or text holding JSON",
                        table.columns[p].name
                    ),
                ));
            }
            outbox = Some((t, p, ptype));
        }
        RuleKind::Message => unreachable_message_rule(name)?,
    }
    if table.replica_identity == b'n' && ops.iter().any(|o| *o != Operation::Insert) {
        return Err(RuleError::new(
            name,
            "operations",
            format!(
                "table {} has REPLICA IDENTITY NOTHING, so updates and deletes are not published: \
                 give it a primary key or run `ALTER TABLE {} REPLICA IDENTITY FULL`",
                table.qualified(),
                table.qualified()
            ),
        ));
    }
    Ok(CompiledRule {
        name: rule.name.as_str().into(),
        table: table.qualified(),
        ops,
        conditions,
        event_type: rule
            .event_type
            .as_deref()
            .and_then(|t| EventType::new(t).ok()),
        schema_version: rule.schema_version,
        schema_version_configured: rule.schema_version,
        tenant,
        object_id,
        version,
        payload,
        outbox,
        declared: None,
        warnings,
    })
}

fn unreachable_message_rule(name: &str) -> Result<(), RuleError> {
    Err(RuleError::new(
        name,
        "kind",
        "message rules are not bound to a table",
    ))
}

fn cond_op(c: &Condition) -> CondOp {
    if let Some(v) = &c.equals {
        CondOp::Equals(v.pg_text())
    } else if let Some(v) = &c.not_equals {
        CondOp::NotEquals(v.pg_text())
    } else if let Some(vs) = &c.one_of {
        CondOp::In(vs.iter().map(|v| v.pg_text()).collect())
    } else if let Some(b) = c.is_null {
        CondOp::IsNull(b)
    } else if let Some(v) = &c.changed_to {
        CondOp::ChangedTo(v.pg_text())
    } else if let Some(v) = &c.changed_from {
        CondOp::ChangedFrom(v.pg_text())
    } else {
        CondOp::Changed
    }
}

impl CompiledRule {
    /// The rule's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The rule's name, shared (cloning it does not allocate).
    pub fn shared_name(&self) -> &Arc<str> {
        &self.name
    }

    /// For a table rule with a fixed type (not an outbox): what decides its
    /// payload's shape.
    pub fn shape(&self) -> Option<Shape> {
        if self.outbox.is_some() {
            return None;
        }
        Some(Shape {
            event_type: self.event_type.clone()?,
            base_version: self.schema_version_configured,
            columns: self
                .payload
                .iter()
                .map(|(name, _, t)| (name.clone(), *t))
                .collect(),
        })
    }

    /// Sets the schemas the config declares for an outbox rule's payloads.
    pub fn set_declared(&mut self, declared: Option<Arc<DeclaredSchemas>>) {
        self.declared = declared;
    }

    /// Sets the schema version its events carry (the catalog's version of
    /// the current shape).
    pub fn set_schema_version(&mut self, version: u32) {
        self.schema_version = version;
    }

    /// The schema version its events carry now.
    pub fn schema_version(&self) -> u32 {
        self.schema_version
    }
}

/// A table rule's payload shape.
#[derive(Debug, Clone)]
pub struct Shape {
    /// Its event type.
    pub event_type: EventType,
    /// The rule's configured `schema_version` (the first version of a type).
    pub base_version: u32,
    /// The columns `data` holds (name, type), by name.
    pub columns: Vec<(String, u32)>,
}
