//! Capture rules compiled against a table's columns, and applied to changes.
//!
//! A rule from the config names columns; a [`TableInfo`] (from the catalog at
//! start-up, or from a pgoutput Relation message while streaming) says where
//! they are, of what type, and which are part of the replica identity. The
//! same [`compile()`] runs in both places, so a rule that passes at start-up
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
//!
//! The parts:
//! - `table`: a table's columns as capture sees them ([`TableInfo`]).
//! - `compile`: a table or outbox rule bound to those columns
//!   ([`CompiledRule`]), refused with the fix when the WAL cannot serve it.
//! - `change`: a row change as the rules read it ([`Change`]: old and new
//!   values, unchanged TOAST) and the conditions decided on it.
//! - `apply`: a compiled rule applied to a change: skip, event or incident.
//! - `event`: the transaction context ([`TxContext`]), the [`Outcome`], and
//!   the one place an event's envelope is written.
//! - `message`: [`MessageRule`]s for transactional logical messages.

mod apply;
mod change;
mod compile;
mod event;
mod message;
mod table;
#[cfg(test)]
mod tests;

pub use change::Change;
pub use compile::{CompiledRule, Shape, compile};
pub use event::{Outcome, TxContext};
pub use message::MessageRule;
pub use table::{ColumnInfo, TableInfo};
