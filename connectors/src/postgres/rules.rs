//! Capture rules compiled against a table's columns, and applied to changes.
//!
//! A rule from the config names columns; a [`TableInfo`] (from the catalog at
//! start-up, or from a pgoutput Relation message while streaming) says where
//! they are, of what type, and which are part of the replica identity. The
//! same [`compile`] runs in both places, so a rule that passes at start-up
//! cannot fail differently later, and a schema change that breaks a rule
//! stops capture with the same message a bad config gets.
//!
//! Old values: with `REPLICA IDENTITY DEFAULT` an update carries no old row
//! unless the key changed, and a delete carries only the key. A rule that
//! needs old values of other columns is refused unless the table has
//! `REPLICA IDENTITY FULL`, and the error says so.
//!
//! Unchanged TOAST: an update leaves large unchanged values out of the new
//! row. Under FULL the old row has them and we use it; otherwise the column is
//! left out of `data` and listed in the envelope's `unavailable` array (never
//! sent as null), and a condition on it is undecided: no event, an incident.

use std::sync::Arc;

use walhook_pipeline::canonical::{JsonWriter, canonical_members};
use walhook_pipeline::capture::{Incident, IncidentKind};
use walhook_pipeline::event::{
    Envelope, Event, EventKey, EventType, MAX_OBJECT_VERSION_BYTES, check_object_id,
};
use walhook_pipeline::ids::{EventId, Lsn, TenantId};
use walhook_pipeline::time::Timestamp;

use super::config::{
    Condition, ObjectVersion, Operation, RowSelector, RuleConfig, RuleError, RuleKind,
};
use super::declared::DeclaredSchemas;
use super::pgoutput::{ColumnValue, OldTuple, Relation, TupleData};
use super::value::{may_be_toasted, oid, write_text_value};

/// A table's columns as capture sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableInfo {
    /// The schema.
    pub schema: String,
    /// The table.
    pub name: String,
    /// `d`, `n`, `f` or `i`.
    pub replica_identity: u8,
    /// Columns in attribute order.
    pub columns: Vec<ColumnInfo>,
}

/// One column of a [`TableInfo`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnInfo {
    /// Its name.
    pub name: String,
    /// Its type OID.
    pub type_oid: u32,
    /// Part of the replica identity.
    pub key: bool,
}

impl TableInfo {
    /// `schema.table`.
    pub fn qualified(&self) -> String {
        format!("{}.{}", self.schema, self.name)
    }

    fn index(&self, column: &str) -> Option<usize> {
        self.columns.iter().position(|c| c.name == column)
    }

    fn is_full(&self) -> bool {
        self.replica_identity == b'f'
    }
}

impl TableInfo {
    /// Replaces each column's declared type by the type its values are
    /// written as (a domain by its base type; see [`super::types`]).
    pub fn resolve_types(mut self, types: &super::types::TypeMap) -> Self {
        for c in &mut self.columns {
            c.type_oid = types.effective(c.type_oid);
        }
        self
    }
}

impl From<&Relation<'_>> for TableInfo {
    fn from(r: &Relation<'_>) -> Self {
        TableInfo {
            schema: r.namespace.to_owned(),
            name: r.name.to_owned(),
            replica_identity: r.replica_identity,
            columns: r
                .columns
                .iter()
                .map(|c| ColumnInfo {
                    name: c.name.to_owned(),
                    type_oid: c.type_oid,
                    key: c.key,
                })
                .collect(),
        }
    }
}

#[derive(Debug, Clone)]
enum CondOp {
    Equals(String),
    NotEquals(String),
    In(Vec<String>),
    IsNull(bool),
    Changed,
    ChangedTo(String),
    ChangedFrom(String),
}

#[derive(Debug, Clone)]
struct CompiledCondition {
    index: usize,
    row: RowSelector,
    op: CondOp,
}

#[derive(Debug, Clone)]
enum VersionSource {
    Lsn,
    Column(usize),
}

/// A rule bound to a table's column positions.
#[derive(Debug, Clone)]
pub struct CompiledRule {
    name: Arc<str>,
    table: String,
    ops: Vec<Operation>,
    conditions: Vec<CompiledCondition>,
    event_type: Option<EventType>,
    /// The version its events carry: the catalog's for the current shape.
    schema_version: u32,
    /// The version the config names.
    schema_version_configured: u32,
    tenant: usize,
    object_id: Option<usize>,
    version: Option<VersionSource>,
    /// Payload columns sorted by name: (name, index, type).
    payload: Vec<(String, usize, u32)>,
    /// Outbox: the type and payload columns.
    outbox: Option<(usize, usize, u32)>,
    /// Outbox: the schemas the config declares for payloads.
    declared: Option<Arc<DeclaredSchemas>>,
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
    let tenant = column(
        tenant_field,
        rule.tenant_column.as_deref().unwrap_or_default(),
    )?;
    let object_id = rule
        .object_id_column
        .as_deref()
        .map(|c| column("object_id_column", c))
        .transpose()?;
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
    check_delete_column(tenant_field, tenant)?;
    if let Some(i) = object_id {
        check_delete_column("object_id_column", i)?;
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

/// A row change as the rules see it.
#[derive(Debug, Clone, Copy)]
pub enum Change<'a, 'b> {
    /// An insert.
    Insert {
        /// The new row.
        new: &'b TupleData<'a>,
    },
    /// An update.
    Update {
        /// The old row or key, when sent.
        old: Option<&'b OldTuple<'a>>,
        /// The new row.
        new: &'b TupleData<'a>,
    },
    /// A delete.
    Delete {
        /// The old row or key.
        old: &'b OldTuple<'a>,
    },
}

impl Change<'_, '_> {
    fn operation(&self) -> Operation {
        match self {
            Change::Insert { .. } => Operation::Insert,
            Change::Update { .. } => Operation::Update,
            Change::Delete { .. } => Operation::Delete,
        }
    }
}

/// A value read from a change: known (null or text) or not in the WAL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Val<'a> {
    Null,
    Text(&'a [u8]),
    Unknown,
}

fn val<'a>(v: Option<&ColumnValue<'a>>) -> Val<'a> {
    match v {
        Some(ColumnValue::Null) => Val::Null,
        Some(ColumnValue::Text(t)) | Some(ColumnValue::Binary(t)) => Val::Text(t),
        Some(ColumnValue::UnchangedToast) | None => Val::Unknown,
    }
}

struct Rows<'a, 'b> {
    change: Change<'a, 'b>,
    keys: &'b [bool],
}

impl<'a> Rows<'a, '_> {
    fn old_full(&self) -> Option<&TupleData<'a>> {
        match self.change {
            Change::Update {
                old: Some(OldTuple::Full(t)),
                ..
            }
            | Change::Delete {
                old: OldTuple::Full(t),
            } => Some(t),
            _ => None,
        }
    }

    fn new_value(&self, i: usize) -> Val<'a> {
        let new = match self.change {
            Change::Insert { new } | Change::Update { new, .. } => new,
            Change::Delete { .. } => return Val::Unknown,
        };
        match new.columns.get(i) {
            Some(ColumnValue::UnchangedToast) => {
                // Unchanged: the old row has it when the identity is FULL.
                self.old_full()
                    .map_or(Val::Unknown, |old| val(old.columns.get(i)))
            }
            other => val(other),
        }
    }

    fn old(&self, i: usize) -> Val<'a> {
        let key = self.keys.get(i).copied().unwrap_or(false);
        match self.change {
            Change::Insert { .. } => Val::Unknown,
            Change::Update {
                old: Some(OldTuple::Full(t)),
                ..
            }
            | Change::Delete {
                old: OldTuple::Full(t),
            } => val(t.columns.get(i)),
            Change::Update {
                old: Some(OldTuple::Key(t)),
                ..
            }
            | Change::Delete {
                old: OldTuple::Key(t),
            } => {
                if key {
                    val(t.columns.get(i))
                } else {
                    Val::Unknown
                }
            }
            // No old tuple: the key did not change, so the old key is the new.
            Change::Update { old: None, .. } => {
                if key {
                    self.new_value(i)
                } else {
                    Val::Unknown
                }
            }
        }
    }

    /// The row the event describes: the new row, or the old one for deletes.
    fn data(&self, i: usize) -> Val<'a> {
        match self.change {
            Change::Delete { .. } => self.old(i),
            _ => self.new_value(i),
        }
    }
}

fn eq(v: Val<'_>, text: &str) -> Option<bool> {
    match v {
        Val::Null => Some(false),
        Val::Text(t) => Some(t == text.as_bytes()),
        Val::Unknown => None,
    }
}

/// `IS DISTINCT FROM` for two values.
fn distinct(a: Val<'_>, b: Val<'_>) -> Option<bool> {
    match (a, b) {
        (Val::Unknown, _) | (_, Val::Unknown) => None,
        (Val::Null, Val::Null) => Some(false),
        (Val::Text(x), Val::Text(y)) => Some(x != y),
        _ => Some(true),
    }
}

impl CompiledCondition {
    fn holds(&self, rows: &Rows<'_, '_>) -> Option<bool> {
        let read = |row: RowSelector| match row {
            RowSelector::New => rows.data(self.index),
            RowSelector::Old => rows.old(self.index),
        };
        let op = rows.change.operation();
        match &self.op {
            CondOp::Equals(v) => eq(read(self.row), v),
            CondOp::NotEquals(v) => eq(read(self.row), v).map(|b| !b),
            CondOp::In(vs) => {
                let v = read(self.row);
                let mut any = Some(false);
                for candidate in vs {
                    match eq(v, candidate) {
                        Some(true) => return Some(true),
                        None => any = None,
                        Some(false) => {}
                    }
                }
                any
            }
            CondOp::IsNull(want) => match read(self.row) {
                Val::Unknown => None,
                v => Some((v == Val::Null) == *want),
            },
            CondOp::Changed => match op {
                Operation::Update => distinct(rows.old(self.index), rows.new_value(self.index)),
                _ => Some(false),
            },
            CondOp::ChangedTo(v) => match op {
                Operation::Insert => eq(rows.new_value(self.index), v),
                Operation::Update => {
                    let new_is = eq(rows.new_value(self.index), v)?;
                    let old_was = eq(rows.old(self.index), v)?;
                    Some(new_is && !old_was)
                }
                Operation::Delete => Some(false),
            },
            CondOp::ChangedFrom(v) => match op {
                Operation::Update => {
                    let old_was = eq(rows.old(self.index), v)?;
                    let new_is = eq(rows.new_value(self.index), v)?;
                    Some(old_was && !new_is)
                }
                _ => Some(false),
            },
        }
    }
}

/// The transaction a change belongs to.
#[derive(Debug, Clone, Copy)]
pub struct TxContext<'a> {
    /// The source's name.
    pub source: &'a str,
    /// The commit LSN.
    pub commit_lsn: Lsn,
    /// The commit time.
    pub commit_time: Timestamp,
    /// The largest event body allowed (`[source].max_event_bytes`).
    pub max_event_bytes: usize,
}

/// What applying a rule to a change gave.
#[derive(Debug)]
pub enum Outcome {
    /// The rule does not apply.
    Skip,
    /// An event.
    Event(Box<Event>),
    /// The rule applies but no event could be made.
    Incident(Incident),
}

fn text_of(v: Val<'_>) -> Option<String> {
    match v {
        Val::Text(t) => Some(String::from_utf8_lossy(t).into_owned()),
        _ => None,
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

    fn incident(
        &self,
        kind: IncidentKind,
        tx: &TxContext<'_>,
        ordinal: u32,
        detail: String,
    ) -> Outcome {
        Outcome::Incident(Incident {
            kind,
            commit_lsn: Some(tx.commit_lsn),
            tx_ordinal: Some(ordinal),
            rule: Some(self.name.to_string()),
            table: Some(self.table.clone()),
            detail,
        })
    }

    /// Applies the rule to the change at `ordinal` of transaction `tx`.
    pub fn apply(
        &self,
        change: Change<'_, '_>,
        keys: &[bool],
        tx: &TxContext<'_>,
        ordinal: u32,
    ) -> Outcome {
        if !self.ops.contains(&change.operation()) {
            return Outcome::Skip;
        }
        let rows = Rows { change, keys };
        for c in &self.conditions {
            match c.holds(&rows) {
                Some(true) => {}
                Some(false) => return Outcome::Skip,
                None => {
                    return self.incident(
                        IncidentKind::UndecidedCondition,
                        tx,
                        ordinal,
                        "a condition reads a value the WAL did not carry (unchanged TOAST); set \
                         REPLICA IDENTITY FULL on the table"
                            .into(),
                    );
                }
            }
        }
        let tenant = match rows.data(self.tenant) {
            Val::Text(t) => match TenantId::new(String::from_utf8_lossy(t)) {
                Ok(t) => t,
                Err(e) => {
                    return self.incident(
                        IncidentKind::InvalidRow,
                        tx,
                        ordinal,
                        format!("tenant column: {e}"),
                    );
                }
            },
            Val::Null => {
                return self.incident(
                    IncidentKind::InvalidRow,
                    tx,
                    ordinal,
                    "the tenant column is null".into(),
                );
            }
            Val::Unknown => {
                return self.incident(
                    IncidentKind::InvalidRow,
                    tx,
                    ordinal,
                    "the tenant column was not in the WAL".into(),
                );
            }
        };
        // Raw values bigger than an event may be are refused before any
        // envelope is built from them (memory stays bounded).
        let raw: usize = self
            .payload
            .iter()
            .map(|(_, i, _)| match rows.data(*i) {
                Val::Text(t) => t.len(),
                _ => 0,
            })
            .chain(self.outbox.map(|(_, p, _)| match rows.data(p) {
                Val::Text(t) => t.len(),
                _ => 0,
            }))
            .sum();
        if raw > tx.max_event_bytes {
            return self.incident(
                IncidentKind::OversizedEvent,
                tx,
                ordinal,
                format!(
                    "the row's payload values are {raw} bytes, over [source].max_event_bytes = {}; \
                     include fewer or smaller columns, or raise the limit",
                    tx.max_event_bytes
                ),
            );
        }
        let object_id = self.object_id.and_then(|i| text_of(rows.data(i)));
        if let Some(Err(problem)) = object_id.as_deref().map(check_object_id) {
            return self.incident(IncidentKind::InvalidRow, tx, ordinal, problem);
        }
        let object_version = match &self.version {
            None => None,
            Some(VersionSource::Lsn) => Some(tx.commit_lsn.0.to_string()),
            Some(VersionSource::Column(i)) => match rows.data(*i) {
                Val::Text(t) => {
                    let mut out = Vec::new();
                    write_text_value(&mut JsonWriter::new(&mut out), self.column_type(*i), t);
                    Some(String::from_utf8_lossy(&out).into_owned())
                }
                _ => None,
            },
        };
        let parts = |event_type: EventType, unavailable: Vec<String>| EventParts {
            rule: &self.name,
            tenant: tenant.clone(),
            event_type,
            schema_version: self.schema_version,
            object_id: object_id.clone(),
            object_version: object_version.clone(),
            unavailable,
        };
        match self.outbox {
            Some((type_index, payload_index, _)) => {
                let invalid = |detail: &str| {
                    self.incident(IncidentKind::InvalidRow, tx, ordinal, detail.into())
                };
                let Some(type_text) = text_of(rows.data(type_index)) else {
                    return invalid("the outbox type column is null");
                };
                let event_type = match EventType::new(&type_text) {
                    Ok(t) => t,
                    Err(e) => return invalid(&format!("outbox type: {e}")),
                };
                let Some(payload_text) = text_of(rows.data(payload_index)) else {
                    return invalid("the outbox payload is null or missing");
                };
                let mut data = Vec::new();
                if JsonWriter::new(&mut data)
                    .embedded_json(&payload_text)
                    .is_err()
                {
                    return invalid("the outbox payload is not JSON");
                }
                if let Some(declared) = &self.declared
                    && let Err(why) = declared.check(event_type.as_str(), &payload_text)
                {
                    return invalid(&why);
                }
                let data = String::from_utf8_lossy(&data).into_owned();
                parts(event_type, Vec::new()).build(tx, ordinal, |w| w.raw_value(&data))
            }
            None => {
                let Some(event_type) = self.event_type.clone() else {
                    return Outcome::Skip;
                };
                let unavailable: Vec<String> = self
                    .payload
                    .iter()
                    .filter(|(_, i, _)| rows.data(*i) == Val::Unknown)
                    .map(|(name, _, _)| name.clone())
                    .collect();
                parts(event_type, unavailable).build(tx, ordinal, |w| {
                    w.begin_object();
                    for (name, i, type_oid) in &self.payload {
                        match rows.data(*i) {
                            Val::Unknown => {}
                            Val::Null => {
                                w.key(name);
                                w.null();
                            }
                            Val::Text(t) => {
                                w.key(name);
                                write_text_value(w, *type_oid, t);
                            }
                        }
                    }
                    w.end_object();
                })
            }
        }
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

    fn column_type(&self, index: usize) -> u32 {
        self.payload
            .iter()
            .find(|(_, i, _)| *i == index)
            .map_or(oid::TEXT, |(_, _, t)| *t)
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

/// What a rule decided about a change; [`EventParts::build`] derives the
/// id, writes the envelope once and makes the event.
struct EventParts<'a> {
    rule: &'a str,
    tenant: TenantId,
    event_type: EventType,
    schema_version: u32,
    object_id: Option<String>,
    object_version: Option<String>,
    unavailable: Vec<String>,
}

impl EventParts<'_> {
    fn build(
        self,
        tx: &TxContext<'_>,
        ordinal: u32,
        write_data: impl FnOnce(&mut JsonWriter<'_>),
    ) -> Outcome {
        let id = EventId::derive(tx.source, tx.commit_lsn, ordinal, self.rule);
        let (payload, payload_hash) = Envelope {
            id,
            event_type: &self.event_type,
            tenant_id: &self.tenant,
            object_id: self.object_id.as_deref(),
            object_version_json: self.object_version.as_deref(),
            occurred_at: tx.commit_time,
            schema_version: self.schema_version,
            unavailable: &self.unavailable,
        }
        .write(write_data);
        Outcome::Event(Box::new(Event {
            id,
            source: tx.source.into(),
            key: EventKey {
                commit_lsn: tx.commit_lsn,
                tx_ordinal: ordinal,
            },
            tenant_id: self.tenant,
            event_type: self.event_type,
            schema_version: self.schema_version,
            object_id: self.object_id,
            object_version: self.object_version,
            occurred_at: tx.commit_time,
            payload,
            payload_hash,
        }))
    }
}

/// A message rule: transactional logical messages with a prefix.
#[derive(Debug, Clone)]
pub struct MessageRule {
    name: Arc<str>,
    prefix: String,
    schema_version: u32,
    /// The schemas the config declares for payloads.
    declared: Option<Arc<DeclaredSchemas>>,
}

impl MessageRule {
    /// From a validated config rule of kind `message`.
    pub fn new(rule: &RuleConfig) -> Self {
        MessageRule {
            name: rule.name.as_str().into(),
            prefix: rule.prefix.clone().unwrap_or_default(),
            schema_version: rule.schema_version,
            declared: None,
        }
    }

    /// With the schemas the config declares for payloads.
    pub fn with_declared(mut self, declared: Option<Arc<DeclaredSchemas>>) -> Self {
        self.declared = declared;
        self
    }

    /// Whether `prefix` is this rule's.
    pub fn matches(&self, prefix: &str) -> bool {
        self.prefix == prefix
    }

    /// The rule's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The rule's name, shared (cloning it does not allocate).
    pub fn shared_name(&self) -> &Arc<str> {
        &self.name
    }

    /// Makes the event of a transactional message whose content is
    /// `{"type": …, "tenant_id": …, "data": …, "object_id"?: …, "object_version"?: …}`.
    pub fn apply(&self, content: &[u8], tx: &TxContext<'_>, ordinal: u32) -> Outcome {
        let incident = |detail: String| {
            Outcome::Incident(Incident {
                kind: IncidentKind::InvalidMessage,
                commit_lsn: Some(tx.commit_lsn),
                tx_ordinal: Some(ordinal),
                rule: Some(self.name.to_string()),
                table: None,
                detail,
            })
        };
        if content.len() > tx.max_event_bytes {
            return Outcome::Incident(Incident {
                kind: IncidentKind::OversizedEvent,
                commit_lsn: Some(tx.commit_lsn),
                tx_ordinal: Some(ordinal),
                rule: Some(self.name.to_string()),
                table: None,
                detail: format!(
                    "the message is {} bytes, over [source].max_event_bytes = {}",
                    content.len(),
                    tx.max_event_bytes
                ),
            });
        }
        let Ok(text) = std::str::from_utf8(content) else {
            return incident("the message content is not UTF-8".into());
        };
        let members = match canonical_members(text) {
            Ok(m) => m,
            Err(e) => return incident(format!("the message content is not a JSON object: {e}")),
        };
        let get = |k: &str| {
            members
                .iter()
                .find(|(name, _)| name == k)
                .map(|(_, v)| v.as_str())
        };
        let string = |k: &str| get(k).and_then(|v| serde_json::from_str::<String>(v).ok());
        let event_type = match string("type").map(|t| EventType::new(&t)) {
            Some(Ok(t)) => t,
            Some(Err(e)) => {
                return incident(format!(
                    "\"type\": {e}: start with a letter, then letters, digits, `.`, `_`, `-`"
                ));
            }
            None => return incident("\"type\" must be a string".into()),
        };
        let tenant = match string("tenant_id").map(TenantId::new) {
            Some(Ok(t)) => t,
            Some(Err(e)) => {
                return incident(format!(
                    "\"tenant_id\": {e}: use 1 to 128 characters without control characters"
                ));
            }
            None => return incident("\"tenant_id\" must be a string".into()),
        };
        let Some(data) = get("data") else {
            return incident("\"data\" is missing".into());
        };
        if let Some(declared) = &self.declared
            && let Err(why) = declared.check(event_type.as_str(), data)
        {
            return incident(why);
        }
        let object_id = string("object_id");
        if let Some(Err(problem)) = object_id.as_deref().map(check_object_id) {
            return incident(format!("\"object_id\": {problem}"));
        }
        let object_version = get("object_version")
            .filter(|v| *v != "null")
            .map(str::to_owned);
        if let Some(v) = &object_version
            && v.len() > MAX_OBJECT_VERSION_BYTES
        {
            return incident(format!(
                "\"object_version\" is {} bytes of JSON; at most {MAX_OBJECT_VERSION_BYTES} are allowed",
                v.len()
            ));
        }
        for (key, _) in &members {
            if !matches!(
                key.as_str(),
                "type" | "tenant_id" | "data" | "object_id" | "object_version"
            ) {
                return incident(format!("unknown member {key:?}"));
            }
        }
        EventParts {
            rule: &self.name,
            tenant,
            event_type,
            schema_version: self.schema_version,
            object_id,
            object_version,
            unavailable: Vec::new(),
        }
        .build(tx, ordinal, |w| w.raw_value(data))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::postgres::config::RuleConfig;

    fn table(identity: u8) -> TableInfo {
        let col = |name: &str, type_oid, key| ColumnInfo {
            name: name.into(),
            type_oid,
            key,
        };
        TableInfo {
            schema: "public".into(),
            name: "invoices".into(),
            replica_identity: identity,
            columns: vec![
                col("id", oid::INT8, true),
                col("tenant_id", oid::TEXT, false),
                col("status", oid::TEXT, false),
                col("amount", oid::NUMERIC, false),
                col("notes", oid::TEXT, false),
            ],
        }
    }

    fn rule(text: &str) -> RuleConfig {
        toml::from_str(text).unwrap()
    }

    const PAID: &str = r#"name = "paid"
        table = "invoices"
        operations = ["update"]
        when = [{ column = "status", changed_to = "paid" }]
        event_type = "invoice.paid"
        tenant_column = "tenant_id"
        object_id_column = "id"
        object_version = "lsn"
        exclude = ["notes"]"#;

    fn tuple<'a>(values: &[Option<&'a str>]) -> TupleData<'a> {
        TupleData {
            columns: values
                .iter()
                .map(|v| match v {
                    None => ColumnValue::Null,
                    Some("<toast>") => ColumnValue::UnchangedToast,
                    Some(s) => ColumnValue::Text(s.as_bytes()),
                })
                .collect(),
        }
    }

    const TX: TxContext<'static> = TxContext {
        source: "main",
        commit_lsn: Lsn(0x100),
        commit_time: Timestamp(0),
        max_event_bytes: 1 << 20,
    };

    #[test]
    fn changed_to_needs_full_identity() {
        let err = compile(&rule(PAID), &table(b'd')).unwrap_err();
        assert_eq!(err.field, "when[0]");
        assert!(err.problem.contains("REPLICA IDENTITY FULL"), "{err}");
        compile(&rule(PAID), &table(b'f')).unwrap();
    }

    #[test]
    fn unknown_columns_are_named() {
        let bad = PAID.replace("object_id_column = \"id\"", "object_id_column = \"nope\"");
        let err = compile(&rule(&bad), &table(b'f')).unwrap_err();
        assert_eq!(err.field, "object_id_column");
        assert!(
            err.problem.contains("\"nope\"") && err.problem.contains("tenant_id"),
            "{err}"
        );
    }

    #[test]
    fn changed_to_fires_once() {
        let r = compile(&rule(PAID), &table(b'f')).unwrap();
        let keys = [true, true, true, true, true];
        let old = OldTuple::Full(tuple(&[
            Some("7"),
            Some("acme"),
            Some("open"),
            Some("10.50"),
            Some("n"),
        ]));
        let new = tuple(&[
            Some("7"),
            Some("acme"),
            Some("paid"),
            Some("10.50"),
            Some("<toast>"),
        ]);
        let Outcome::Event(e) = r.apply(
            Change::Update {
                old: Some(&old),
                new: &new,
            },
            &keys,
            &TX,
            3,
        ) else {
            panic!("no event")
        };
        assert_eq!(
            std::str::from_utf8(&e.payload).unwrap(),
            format!(
                r#"{{"data":{{"amount":10.50,"id":7,"status":"paid","tenant_id":"acme"}},"id":"{}","object_id":"7","object_version":256,"occurred_at":"1970-01-01T00:00:00.000000Z","schema_version":1,"tenant_id":"acme","type":"invoice.paid"}}"#,
                e.id
            )
        );
        assert_eq!(e.id, EventId::derive("main", Lsn(0x100), 3, "paid"));
        let again = OldTuple::Full(new.clone());
        assert!(matches!(
            r.apply(
                Change::Update {
                    old: Some(&again),
                    new: &new
                },
                &keys,
                &TX,
                4
            ),
            Outcome::Skip
        ));
    }

    #[test]
    fn unchanged_toast_is_never_null() {
        let all = r#"name = "upd"
            table = "invoices"
            operations = ["update"]
            event_type = "invoice.updated"
            tenant_column = "tenant_id""#;
        let keys = [true, false, false, false, false];
        let new = tuple(&[
            Some("7"),
            Some("acme"),
            Some("open"),
            Some("1"),
            Some("<toast>"),
        ]);
        // DEFAULT identity: listed as unavailable, left out of data.
        let r = compile(&rule(all), &table(b'd')).unwrap();
        assert!(r.warnings.iter().any(|w| w.contains("notes")));
        let Outcome::Event(e) = r.apply(
            Change::Update {
                old: None,
                new: &new,
            },
            &keys,
            &TX,
            0,
        ) else {
            panic!()
        };
        let v: serde_json::Value = serde_json::from_slice(&e.payload).unwrap();
        assert!(v["data"].get("notes").is_none());
        assert_eq!(v["unavailable"], serde_json::json!(["notes"]));
        // FULL identity: taken from the old row.
        let r = compile(&rule(all), &table(b'f')).unwrap();
        let old = OldTuple::Full(tuple(&[
            Some("7"),
            Some("acme"),
            Some("open"),
            Some("1"),
            Some("long text"),
        ]));
        let Outcome::Event(e) = r.apply(
            Change::Update {
                old: Some(&old),
                new: &new,
            },
            &keys,
            &TX,
            0,
        ) else {
            panic!()
        };
        let v: serde_json::Value = serde_json::from_slice(&e.payload).unwrap();
        assert_eq!(v["data"]["notes"], "long text");
        assert!(v.get("unavailable").is_none());
    }

    #[test]
    fn deletes_under_default_identity_need_key_columns() {
        let del = r#"name = "del"
            table = "invoices"
            operations = ["delete"]
            event_type = "invoice.deleted"
            tenant_column = "tenant_id"
            include = ["id"]"#;
        let err = compile(&rule(del), &table(b'd')).unwrap_err();
        assert_eq!(err.field, "tenant_column");
        let r = compile(&rule(del), &table(b'f')).unwrap();
        let old = OldTuple::Full(tuple(&[Some("7"), Some("acme"), None, None, None]));
        let Outcome::Event(e) = r.apply(Change::Delete { old: &old }, &[true; 5], &TX, 0) else {
            panic!()
        };
        assert!(
            std::str::from_utf8(&e.payload)
                .unwrap()
                .starts_with(r#"{"data":{"id":7},"#)
        );
    }

    #[test]
    fn null_tenants_become_incidents() {
        let ins = r#"name = "ins"
            table = "invoices"
            operations = ["insert"]
            event_type = "invoice.created"
            tenant_column = "tenant_id""#;
        let r = compile(&rule(ins), &table(b'd')).unwrap();
        let new = tuple(&[Some("7"), None, None, None, None]);
        let Outcome::Incident(i) = r.apply(Change::Insert { new: &new }, &[true; 5], &TX, 0) else {
            panic!()
        };
        assert_eq!(i.kind, IncidentKind::InvalidRow);
    }

    #[test]
    fn messages_carry_their_own_type_and_tenant() {
        let r = MessageRule::new(&rule(
            r#"name = "m"
            kind = "message"
            prefix = "app""#,
        ));
        let Outcome::Event(e) = r.apply(
            br#"{"type":"user.disabled","tenant_id":"acme","data":{"z":1,"a":2}}"#,
            &TX,
            2,
        ) else {
            panic!()
        };
        assert!(
            std::str::from_utf8(&e.payload)
                .unwrap()
                .starts_with(r#"{"data":{"a":2,"z":1},"#)
        );
        assert!(matches!(
            r.apply(br#"{"type":"x"}"#, &TX, 2),
            Outcome::Incident(_)
        ));
        assert!(matches!(r.apply(b"not json", &TX, 2), Outcome::Incident(_)));
    }
}
