//! A table's columns as capture sees them: where each column is, of what
//! type, and whether it is part of the replica identity. Built from the
//! catalog at start-up or from a pgoutput Relation message while streaming,
//! so that rules compile against the same description in both places.

use crate::postgres::pgoutput::Relation;
use crate::postgres::types::TypeMap;

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

    pub(super) fn index(&self, column: &str) -> Option<usize> {
        self.columns.iter().position(|c| c.name == column)
    }

    pub(super) fn is_full(&self) -> bool {
        self.replica_identity == b'f'
    }
}

impl TableInfo {
    /// Replaces each column's declared type by the type its values are
    /// written as (a domain by its base type; see [`crate::postgres::types`]).
    pub fn resolve_types(mut self, types: &TypeMap) -> Self {
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
