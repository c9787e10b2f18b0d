//! A row change as the rules read it, and the conditions decided on it.
//!
//! A value is known (null or text) or not in the WAL: an unchanged TOAST
//! value, or an old value of a non-key column without `REPLICA IDENTITY
//! FULL`. A condition that reads an unknown value is undecided (`None`),
//! never false.

use super::compile::{CompiledCondition, CondOp};
use crate::postgres::config::{Operation, RowSelector};
use crate::postgres::pgoutput::{ColumnValue, OldTuple, TupleData};

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
    pub(super) fn operation(&self) -> Operation {
        match self {
            Change::Insert { .. } => Operation::Insert,
            Change::Update { .. } => Operation::Update,
            Change::Delete { .. } => Operation::Delete,
        }
    }
}

/// A value read from a change: known (null or text) or not in the WAL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Val<'a> {
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

pub(super) struct Rows<'a, 'b> {
    pub(super) change: Change<'a, 'b>,
    pub(super) keys: &'b [bool],
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
    pub(super) fn data(&self, i: usize) -> Val<'a> {
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
    pub(super) fn holds(&self, rows: &Rows<'_, '_>) -> Option<bool> {
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
