//! One capture rule as written in the config file (`[[rules]]`): its kinds,
//! operations and conditions, and the checks that need no database
//! ([`RuleConfig`]'s part of [`super::SourceConfig::validate`]).

use serde::Deserialize;
use walhook_pipeline::event::EventType;
use walhook_pipeline::ids::TenantId;

use super::RuleError;

/// Which row changes a rule reacts to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Operation {
    /// `INSERT`.
    Insert,
    /// `UPDATE`.
    Update,
    /// `DELETE`.
    Delete,
}

/// The kinds of capture rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleKind {
    /// Row changes of a business table become events.
    #[default]
    Table,
    /// Rows inserted into an outbox table carry their own type and payload.
    Outbox,
    /// Transactional `pg_logical_emit_message` calls with a prefix.
    Message,
}

/// A scalar in a condition, compared with the column's Postgres text form.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum Scalar {
    /// A boolean (`true` matches Postgres' `t`).
    Bool(bool),
    /// An integer.
    Integer(i64),
    /// A float, compared by its shortest text form.
    Float(f64),
    /// A string.
    String(String),
}

impl Scalar {
    /// The value as Postgres prints it in text format.
    pub fn pg_text(&self) -> String {
        match self {
            Scalar::Bool(true) => "t".into(),
            Scalar::Bool(false) => "f".into(),
            Scalar::Integer(i) => i.to_string(),
            Scalar::Float(f) => f.to_string(),
            Scalar::String(s) => s.clone(),
        }
    }
}

/// Which row a condition reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RowSelector {
    /// The row after the change (insert, update).
    #[default]
    New,
    /// The row before the change (update, delete).
    Old,
}

/// The column, or the columns of a composite key, that name the business
/// object: `object_id_column = "id"` or `object_id_column = ["order_id",
/// "line_no"]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum ObjectIdColumns {
    /// One column: its text is the object id.
    One(String),
    /// A composite key: the columns' texts joined by `:`, a `%` in a value
    /// written `%25` and a `:` written `%3A`, so that the id stays unique.
    Many(Vec<String>),
}

impl ObjectIdColumns {
    /// The columns, in key order.
    pub fn columns(&self) -> Vec<&str> {
        match self {
            ObjectIdColumns::One(c) => vec![c.as_str()],
            ObjectIdColumns::Many(cs) => cs.iter().map(String::as_str).collect(),
        }
    }
}

/// One condition; a rule's `when` list matches when all of them hold.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Condition {
    /// The column it reads.
    pub column: String,
    /// The row it reads (for `equals`, `not_equals`, `in`, `is_null`).
    #[serde(default)]
    pub row: RowSelector,
    /// The value equals this.
    pub equals: Option<Scalar>,
    /// The value is null or differs from this.
    pub not_equals: Option<Scalar>,
    /// The value is one of these.
    #[serde(rename = "in")]
    pub one_of: Option<Vec<Scalar>>,
    /// The value is (`true`) or is not (`false`) null.
    pub is_null: Option<bool>,
    /// The old and new values differ (updates).
    pub changed: Option<bool>,
    /// The new value is this and the old was not (inserts count as changes
    /// from nothing).
    pub changed_to: Option<Scalar>,
    /// The old value was this and the new is not (updates).
    pub changed_from: Option<Scalar>,
}

/// The object version: the commit LSN or a column.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum ObjectVersion {
    /// `"lsn"`: the commit LSN, an integer that grows with every commit.
    Named(String),
    /// `{ column = "version" }`: a column of the row.
    Column {
        /// The column.
        column: String,
    },
}

/// One capture rule as written in the config file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    /// A unique name; part of event ids, so keep it stable.
    pub name: String,
    /// The rule kind (`table` by default).
    #[serde(default)]
    pub kind: RuleKind,
    /// `schema.table` (or `table` in `public`) for table and outbox rules.
    pub table: Option<String>,
    /// The operations a table rule reacts to (all three by default).
    #[serde(default)]
    pub operations: Vec<Operation>,
    /// Conditions that must all hold.
    #[serde(default)]
    pub when: Vec<Condition>,
    /// The event type a table rule produces.
    pub event_type: Option<String>,
    /// The column naming the tenant.
    pub tenant_column: Option<String>,
    /// The one tenant of every event of the rule, for a table that holds no
    /// tenant column (reference data, a single-tenant database).
    pub tenant: Option<String>,
    /// The column, or the columns of a composite key, naming the business
    /// object.
    pub object_id_column: Option<ObjectIdColumns>,
    /// The object version: `"lsn"` or `{ column = "…" }`.
    pub object_version: Option<ObjectVersion>,
    /// Columns to put in the payload (all when empty).
    #[serde(default)]
    pub include: Vec<String>,
    /// Columns to leave out of the payload.
    #[serde(default)]
    pub exclude: Vec<String>,
    /// The payload schema version.
    #[serde(default = "default_schema_version")]
    pub schema_version: u32,
    /// Outbox rules: the column holding the event type.
    pub type_column: Option<String>,
    /// Outbox rules: the column holding the JSON payload.
    pub payload_column: Option<String>,
    /// Message rules: the prefix of the logical messages.
    pub prefix: Option<String>,
    /// Outbox and message rules: the event types the rule is expected to
    /// produce. They enter the event-type catalog at start-up, so that
    /// endpoints can subscribe before the first such event; a type that is
    /// not listed still becomes an event and enters the catalog when it is
    /// first fanned out.
    #[serde(default)]
    pub event_types: Vec<String>,
    /// Outbox and message rules: a JSON Schema file per event type that the
    /// payloads (`data`) of that type must match; a payload that does not
    /// is an incident, not an event. Paths are relative to the config file.
    #[serde(default)]
    pub schema_files: std::collections::BTreeMap<String, std::path::PathBuf>,
}

fn default_schema_version() -> u32 {
    1
}

/// Splits `schema.table` (default schema `public`).
pub fn split_table(name: &str) -> (String, String) {
    match name.split_once('.') {
        Some((schema, table)) => (schema.to_owned(), table.to_owned()),
        None => ("public".to_owned(), name.to_owned()),
    }
}

impl Condition {
    /// The operator of the condition, checking that there is exactly one.
    pub fn operator_count(&self) -> usize {
        [
            self.equals.is_some(),
            self.not_equals.is_some(),
            self.one_of.is_some(),
            self.is_null.is_some(),
            self.changed.is_some(),
            self.changed_to.is_some(),
            self.changed_from.is_some(),
        ]
        .iter()
        .filter(|b| **b)
        .count()
    }

    /// Whether the condition compares old and new values.
    pub fn compares_old_and_new(&self) -> bool {
        self.changed.is_some() || self.changed_to.is_some() || self.changed_from.is_some()
    }

    /// Whether the condition reads the old row.
    pub fn reads_old(&self) -> bool {
        self.compares_old_and_new() || self.row == RowSelector::Old
    }
}

impl RuleConfig {
    /// The operations, defaulting to all three.
    pub fn effective_operations(&self) -> Vec<Operation> {
        if self.operations.is_empty() {
            vec![Operation::Insert, Operation::Update, Operation::Delete]
        } else {
            self.operations.clone()
        }
    }

    /// Table and outbox rules: exactly one of `tenant_column` and `tenant`,
    /// and a fixed tenant must be a valid tenant id.
    fn check_tenant(&self) -> Result<(), RuleError> {
        let name = self.name.as_str();
        match (&self.tenant_column, &self.tenant) {
            (None, None) => Err(RuleError::new(
                name,
                "tenant_column",
                "name the column that holds the tenant id, or give `tenant = \"…\"` when every \
                 row belongs to one tenant",
            )),
            (Some(_), Some(_)) => Err(RuleError::new(
                name,
                "tenant",
                "give either tenant_column (read from each row) or tenant (one for all rows), \
                 not both",
            )),
            (None, Some(t)) => TenantId::new(t.as_str()).map(|_| ()).map_err(|e| {
                RuleError::new(name, "tenant", format!("{t:?} is not a tenant id: {e}"))
            }),
            (Some(_), None) => Ok(()),
        }
    }

    fn check_object_id_columns(&self) -> Result<(), RuleError> {
        if let Some(ObjectIdColumns::Many(cs)) = &self.object_id_column {
            let mut seen = std::collections::BTreeSet::new();
            if cs.is_empty() || cs.iter().any(|c| !seen.insert(c)) {
                return Err(RuleError::new(
                    &self.name,
                    "object_id_column",
                    "a list names the key's columns, at least one and each once",
                ));
            }
        }
        Ok(())
    }

    pub(super) fn validate(&self) -> Result<(), RuleError> {
        let name = self.name.as_str();
        let err = |field: &str, problem: String| Err(RuleError::new(name, field, problem));
        let forbid = |field: &str, present: bool, kind: &str| {
            if present {
                Err(RuleError::new(
                    name,
                    field,
                    format!("is not used by {kind} rules; remove it"),
                ))
            } else {
                Ok(())
            }
        };
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return err(
                "name",
                "use letters, digits, `_` and `-` only (it is part of event ids)".into(),
            );
        }
        if self.schema_version == 0 {
            return err("schema_version", "must be at least 1".into());
        }
        for (i, t) in self.event_types.iter().enumerate() {
            if EventType::new(t).is_err() {
                return err(
                    &format!("event_types[{i}]"),
                    format!(
                        "{t:?} is not a valid type: start with a letter, then letters, digits, `.`, `_`, `-`"
                    ),
                );
            }
        }
        for (i, c) in self.when.iter().enumerate() {
            if c.operator_count() != 1 {
                return err(
                    &format!("when[{i}]"),
                    "give exactly one of equals, not_equals, in, is_null, changed, changed_to, changed_from"
                        .into(),
                );
            }
            if c.changed == Some(false) {
                return err(
                    &format!("when[{i}].changed"),
                    "only `changed = true` is meaningful".into(),
                );
            }
            if c.compares_old_and_new() && c.row == RowSelector::Old {
                return err(
                    &format!("when[{i}].row"),
                    "changed/changed_to/changed_from read both rows; remove `row`".into(),
                );
            }
        }
        for t in self.schema_files.keys() {
            if EventType::new(t).is_err() {
                return err(
                    "schema_files",
                    format!(
                        "{t:?} is not a valid event type: start with a letter, then letters, digits, `.`, `_`, `-`"
                    ),
                );
            }
        }
        if self.kind == RuleKind::Table && !self.schema_files.is_empty() {
            return err(
                "schema_files",
                "table rules get a schema derived from their columns (GET /v1/event-types/{type}); \
                 schema_files is for outbox and message rules"
                    .into(),
            );
        }
        match self.kind {
            RuleKind::Table => {
                if self.table.is_none() {
                    return err(
                        "table",
                        "table rules need `table = \"schema.table\"`".into(),
                    );
                }
                match &self.event_type {
                    None => {
                        return err(
                            "event_type",
                            "table rules need an event type such as \"invoice.paid\"".into(),
                        );
                    }
                    Some(t) => {
                        if EventType::new(t).is_err() {
                            return err(
                                "event_type",
                                format!(
                                    "{t:?} is not a valid type: start with a letter, then letters, digits, `.`, `_`, `-`"
                                ),
                            );
                        }
                    }
                }
                self.check_tenant()?;
                self.check_object_id_columns()?;
                forbid(
                    "event_types",
                    !self.event_types.is_empty(),
                    "table (a table rule has the one `event_type`)",
                )?;
                if !self.include.is_empty() && !self.exclude.is_empty() {
                    return err("include", "give either include or exclude, not both".into());
                }
                forbid("type_column", self.type_column.is_some(), "table")?;
                forbid("payload_column", self.payload_column.is_some(), "table")?;
                forbid("prefix", self.prefix.is_some(), "table")?;
                let ops = self.effective_operations();
                for (i, c) in self.when.iter().enumerate() {
                    if c.compares_old_and_new() && ops.iter().all(|o| *o == Operation::Delete) {
                        return err(
                            &format!("when[{i}]"),
                            "a delete has no new row to compare".into(),
                        );
                    }
                    if c.row == RowSelector::Old && ops.contains(&Operation::Insert) {
                        return err(
                            &format!("when[{i}].row"),
                            "an insert has no old row; restrict `operations` to update/delete"
                                .into(),
                        );
                    }
                }
            }
            RuleKind::Outbox => {
                if self.table.is_none() {
                    return err(
                        "table",
                        "outbox rules need `table = \"schema.outbox_table\"`".into(),
                    );
                }
                for (field, value) in [
                    ("type_column", &self.type_column),
                    ("payload_column", &self.payload_column),
                ] {
                    if value.is_none() {
                        return err(field, format!("outbox rules need `{field}`"));
                    }
                }
                self.check_tenant()?;
                self.check_object_id_columns()?;
                forbid(
                    "event_type",
                    self.event_type.is_some(),
                    "outbox (the type comes from `type_column`)",
                )?;
                forbid(
                    "include",
                    !self.include.is_empty(),
                    "outbox (the payload column is the data)",
                )?;
                forbid("exclude", !self.exclude.is_empty(), "outbox")?;
                forbid("prefix", self.prefix.is_some(), "outbox")?;
                if self.effective_operations() != vec![Operation::Insert]
                    && !self.operations.is_empty()
                {
                    return err(
                        "operations",
                        "outbox rules read inserts only; remove `operations`".into(),
                    );
                }
            }
            RuleKind::Message => {
                match &self.prefix {
                    Some(p) if !p.is_empty() => {}
                    _ => {
                        return err(
                            "prefix",
                            "message rules need the `prefix` given to pg_logical_emit_message"
                                .into(),
                        );
                    }
                }
                for (field, present) in [
                    ("table", self.table.is_some()),
                    ("event_type", self.event_type.is_some()),
                    ("tenant_column", self.tenant_column.is_some()),
                    ("tenant", self.tenant.is_some()),
                    ("object_id_column", self.object_id_column.is_some()),
                    ("object_version", self.object_version.is_some()),
                    ("type_column", self.type_column.is_some()),
                    ("payload_column", self.payload_column.is_some()),
                    ("include", !self.include.is_empty()),
                    ("exclude", !self.exclude.is_empty()),
                    ("when", !self.when.is_empty()),
                    ("operations", !self.operations.is_empty()),
                ] {
                    forbid(
                        field,
                        present,
                        "message (the message's JSON carries type, tenant_id and data)",
                    )?;
                }
            }
        }
        if let Some(ObjectVersion::Named(n)) = &self.object_version
            && n != "lsn"
        {
            return err(
                "object_version",
                format!("{n:?} is not known: use \"lsn\" or {{ column = \"…\" }}"),
            );
        }
        Ok(())
    }
}
