//! Conditions evaluated on the rows a read decodes, in the reader's
//! filter: each reads its own columns, and only for the rows the ones
//! before it kept, so a listing that matches nothing decodes the tenant
//! and filter columns of the tenant's pages and nothing else.

use arrow_array::cast::AsArray;
use arrow_array::types::TimestampMicrosecondType;
use arrow_array::{Array, BooleanArray, RecordBatch};
use arrow_schema::ArrowError;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ArrowPredicate, ArrowPredicateFn, RowFilter};
use parquet::schema::types::SchemaDescriptor;

use crate::table::Table;

/// A keyset position: UTC microseconds and an id, ordered as listings
/// order deliveries.
pub type Keyset = (i64, [u8; 16]);

/// One condition on the rows of a part.
#[derive(Debug, Clone)]
pub(crate) enum Pred {
    /// A text column equals a value.
    TextEq {
        /// The column.
        column: &'static str,
        /// The value.
        value: String,
    },
    /// A uuid column equals a value.
    UuidEq {
        /// The column.
        column: &'static str,
        /// The value.
        value: [u8; 16],
    },
    /// A timestamp column lies in `lo..=hi` (microseconds).
    Between {
        /// The column.
        column: &'static str,
        /// The smallest value kept.
        lo: i64,
        /// The largest value kept.
        hi: i64,
    },
    /// `(time, id)` lies in `lo..hi` (each bound optional).
    Keyset {
        /// The time column.
        time: &'static str,
        /// The smallest position kept.
        lo: Option<Keyset>,
        /// The first position not kept.
        hi: Option<Keyset>,
    },
}

impl Pred {
    fn columns(&self) -> Vec<&'static str> {
        match self {
            Pred::TextEq { column, .. }
            | Pred::UuidEq { column, .. }
            | Pred::Between { column, .. } => vec![column],
            Pred::Keyset { time, .. } => vec![time, "id"],
        }
    }

    fn eval(&self, batch: &RecordBatch) -> Result<BooleanArray, ArrowError> {
        let col = |name: &str| {
            batch
                .column_by_name(name)
                .ok_or_else(|| ArrowError::SchemaError(format!("no column {name}")))
        };
        let bad = |name: &str| ArrowError::SchemaError(format!("column {name} has another type"));
        Ok(match self {
            Pred::TextEq { column, value } => {
                let a = col(column)?
                    .as_string_opt::<i32>()
                    .ok_or_else(|| bad(column))?;
                a.iter().map(|v| Some(v == Some(value.as_str()))).collect()
            }
            Pred::UuidEq { column, value } => {
                let a = col(column)?
                    .as_fixed_size_binary_opt()
                    .ok_or_else(|| bad(column))?;
                (0..a.len())
                    .map(|i| Some(a.is_valid(i) && a.value(i) == value))
                    .collect()
            }
            Pred::Between { column, lo, hi } => {
                let a = col(column)?
                    .as_primitive_opt::<TimestampMicrosecondType>()
                    .ok_or_else(|| bad(column))?;
                a.iter()
                    .map(|v| Some(v.is_some_and(|v| *lo <= v && v <= *hi)))
                    .collect()
            }
            Pred::Keyset { time, lo, hi } => {
                let t = col(time)?
                    .as_primitive_opt::<TimestampMicrosecondType>()
                    .ok_or_else(|| bad(time))?;
                let ids = col("id")?
                    .as_fixed_size_binary_opt()
                    .ok_or_else(|| bad("id"))?;
                (0..t.len())
                    .map(|i| {
                        let mut id = [0u8; 16];
                        id.copy_from_slice(ids.value(i));
                        let k = (t.value(i), id);
                        Some(lo.is_none_or(|lo| k >= lo) && hi.is_none_or(|hi| k < hi))
                    })
                    .collect()
            }
        })
    }
}

/// The reader's filter for `preds`, in order, over `table`'s parts.
pub(crate) fn row_filter(table: Table, schema: &SchemaDescriptor, preds: Vec<Pred>) -> RowFilter {
    let predicates: Vec<Box<dyn ArrowPredicate>> = preds
        .into_iter()
        .map(|p| {
            let columns: Vec<usize> = p
                .columns()
                .iter()
                .filter_map(|c| table.column_index(c))
                .collect();
            let mask = ProjectionMask::roots(schema, columns);
            Box::new(ArrowPredicateFn::new(mask, move |batch| p.eval(&batch)))
                as Box<dyn ArrowPredicate>
        })
        .collect();
    RowFilter::new(predicates)
}
