//! Compaction: a day archived again becomes one live set in which each id
//! lies in one part, holding its latest row.
//!
//! ```text
//!  live set before (the last compacted generation, or every generation
//!  of a day archived before compaction) ── parts named by manifests
//!     │ hot rows of the day (COPY, sorted)
//!     ├─ id already in a live part ──► that part's replacements
//!     └─ id new to the day ─────────► new parts (numbered from g × 10,000)
//!     ▼
//!  rewritten parts (the old rows in their order, a replaced row in its
//!  place) and new parts, staged at `_staging/gN/<key>.staged`
//!     ▼ manifest gN (`compaction`: merged generations, carried rows, the
//!       parts written) · catalog `written`
//!  verify the staged parts                           archive.before_publish
//!     ▼
//!  publish: each written part replaces (or becomes) its live key,
//!  one object at a time                              archive.mid_publish
//!     ▼
//!  verify the live set · catalog `verified` · drop · staged copies deleted
//! ```
//!
//! Why analysts see each id once at every step: a rewritten part keeps its
//! key and its ids (only a row's later state differs, and the day column,
//! tenant and id of a row never change), so each object replaced is one
//! atomic swap of the same ids; a new part holds only ids no live part
//! holds. Until publication the staged copies are outside every glob over
//! the layout. Nothing is deleted or overwritten before the staged parts
//! were read back and matched, and a crash anywhere is finished by the
//! next run (publication is idempotent).

use std::collections::{BTreeMap, HashMap, HashSet};

use arrow_array::{Array, ArrayRef, RecordBatch, new_null_array};
use bytes::Bytes;
use chrono::NaiveDate;
use walhook_pipeline::failpoint;
use walhook_pipeline::objstore::ObjectStore;

use crate::ArchiveError;
use crate::archiver::Archiver;
use crate::copy::CopyReader;
use crate::dates::NaiveDateSql;
use crate::encode::{decode, encode};
use crate::layout::staged_key;
use crate::manifest::{Compaction, FileEntry, Manifest};
use crate::part::PartBuilder;
use crate::table::Table;

/// A day's live set before this generation, and the hot rows that replace
/// rows of it.
pub(crate) struct Merge {
    table: Table,
    /// The generations whose manifests name the live parts.
    merged: Vec<u32>,
    /// The live parts.
    files: Vec<FileEntry>,
    /// The ids of the live parts read so far (read only for parts whose
    /// bucket and id range admit a hot row).
    ids: HashMap<usize, HashSet<[u8; 16]>>,
    /// Hot rows replacing rows of a live part, by part.
    replacements: BTreeMap<usize, PartBuilder>,
    id_col: usize,
}

impl Merge {
    /// The merge of `table`'s day over the live set `manifests` (oldest
    /// generation first).
    pub(crate) fn new(table: Table, manifests: Vec<Manifest>) -> Self {
        let merged = manifests.iter().map(|m| m.generation).collect();
        let files = manifests.into_iter().flat_map(|m| m.files).collect();
        Merge {
            table,
            merged,
            files,
            ids: HashMap::new(),
            replacements: BTreeMap::new(),
            id_col: table.column_index("id").expect("every table has an id"),
        }
    }

    /// Takes the hot row in `copy` (of tenant bucket `bucket`) if a live
    /// part holds its id; returns whether it did.
    pub(crate) async fn absorb<S: ObjectStore>(
        &mut self,
        store: &S,
        copy: &CopyReader,
        bucket: u16,
    ) -> Result<bool, ArchiveError> {
        let Some(id) = copy
            .field(self.id_col)
            .and_then(|v| <[u8; 16]>::try_from(v).ok())
        else {
            return Ok(false);
        };
        let text = uuid::Uuid::from_bytes(id).hyphenated().to_string();
        // Newest generation first: on a day archived before compaction an
        // id may lie in two generations, and the later holds its state.
        for i in (0..self.files.len()).rev() {
            let f = &self.files[i];
            if f.tenant_bucket != bucket || text < f.id_range.0 || text > f.id_range.1 {
                continue;
            }
            if !self.ids.contains_key(&i) {
                let ids = part_ids(store, self.table, &self.files[i]).await?;
                self.ids.insert(i, ids);
            }
            if self.ids[&i].contains(&id) {
                self.replacements
                    .entry(i)
                    .or_insert_with(|| PartBuilder::new(self.table))
                    .push(copy)?;
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Writes the rewritten parts to their staged keys and adds every live
    /// part (rewritten or carried) to `manifest`, whose own new parts are
    /// `new_parts` (already staged); sets its compaction.
    pub(crate) async fn finish<S: ObjectStore>(
        mut self,
        store: &S,
        manifest: &mut Manifest,
        new_parts: Vec<String>,
    ) -> Result<(), ArchiveError> {
        let generation = manifest.generation;
        let mut written = new_parts;
        let mut carried = 0u64;
        for (i, f) in std::mem::take(&mut self.files).into_iter().enumerate() {
            let Some(mut builder) = self.replacements.remove(&i) else {
                carried += f.rows;
                manifest.add(f);
                continue;
            };
            let (hot, _) = builder.finish()?;
            carried += f.rows - hot.num_rows() as u64;
            let old = read_part(store, self.table, &f).await?;
            let batch = replace(self.table, &old, &hot)?;
            let bytes = encode(self.table, &batch)?;
            let receipt = store.put(&staged_key(&f.key, generation), bytes).await?;
            written.push(f.key.clone());
            manifest.add(FileEntry {
                bytes: receipt.size,
                sha256: receipt.sha256,
                ..f
            });
        }
        written.sort();
        manifest.compaction = Some(Compaction {
            merged: self.merged,
            carried_rows: carried,
            written,
        });
        Ok(())
    }
}

/// The ids in one live part.
async fn part_ids<S: ObjectStore>(
    store: &S,
    table: Table,
    file: &FileEntry,
) -> Result<HashSet<[u8; 16]>, ArchiveError> {
    let batch = read_part(store, table, file).await?;
    let ids = crate::cold::rows::uuid_column(&batch, "id")?;
    Ok((0..ids.len())
        .filter_map(|i| ids.value(i).try_into().ok())
        .collect())
}

/// Every row of a live part in the current layout (a column a part of an
/// older layout lacks is null).
async fn read_part<S: ObjectStore>(
    store: &S,
    table: Table,
    file: &FileEntry,
) -> Result<RecordBatch, ArchiveError> {
    // The object at the key, not checked against this entry's SHA-256: a
    // run that stopped half-way through publication left either this
    // entry's object or a later state of the same rows, and both are whole.
    let bytes: Bytes = store
        .get(&file.key)
        .await?
        .ok_or_else(|| ArchiveError::Shape {
            table,
            column: "manifest",
            detail: format!(
                "{} is named by the day's live manifest but missing from the store",
                file.key
            ),
        })?;
    let schema = table.schema();
    let mut batches = Vec::new();
    for b in decode(bytes)? {
        let columns = schema
            .fields()
            .iter()
            .map(|field| match b.column_by_name(field.name()) {
                Some(c) => Ok(c.clone()),
                None if field.is_nullable() => Ok(new_null_array(field.data_type(), b.num_rows())),
                None => Err(ArchiveError::Shape {
                    table,
                    column: "part",
                    detail: format!("{} has no column {}", file.key, field.name()),
                }),
            })
            .collect::<Result<Vec<ArrayRef>, _>>()?;
        batches.push(RecordBatch::try_new(schema.clone(), columns).map_err(ArchiveError::Arrow)?);
    }
    arrow_select::concat::concat_batches(&schema, &batches).map_err(ArchiveError::Arrow)
}

/// `old` with each row whose id is in `hot` replaced by `hot`'s row, in
/// place: the part's order (tenant, time, id) is kept, since a row's
/// tenant, day column and id never change.
fn replace(
    table: Table,
    old: &RecordBatch,
    hot: &RecordBatch,
) -> Result<RecordBatch, ArchiveError> {
    let hot_ids = crate::cold::rows::uuid_column(hot, "id")?;
    let by_id: HashMap<&[u8], usize> = (0..hot_ids.len()).map(|i| (hot_ids.value(i), i)).collect();
    let old_ids = crate::cold::rows::uuid_column(old, "id")?;
    let picks: Vec<(usize, usize)> = (0..old_ids.len())
        .map(|i| match by_id.get(old_ids.value(i)) {
            Some(&h) => (1, h),
            None => (0, i),
        })
        .collect();
    let columns = (0..old.num_columns())
        .map(|c| {
            arrow_select::interleave::interleave(
                &[old.column(c).as_ref() as &dyn Array, hot.column(c).as_ref()],
                &picks,
            )
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(ArchiveError::Arrow)?;
    RecordBatch::try_new(table.schema(), columns).map_err(ArchiveError::Arrow)
}

impl<S: ObjectStore> Archiver<S> {
    /// The live set of `table`'s day before a new generation: the manifests
    /// of its archived generations from the last compacted one on (oldest
    /// first); empty when the day was never archived or has expired.
    pub(crate) async fn live_set(
        &self,
        table: Table,
        day: NaiveDate,
    ) -> Result<Vec<Manifest>, ArchiveError> {
        let rows = self
            .platform
            .client()
            .await?
            .query(
                "SELECT manifest_key FROM walhook.archive_partitions WHERE table_name = $1 \
                 AND day = $2 AND state IN ('verified', 'dropped') ORDER BY generation",
                &[&table.name(), &NaiveDateSql(day)],
            )
            .await
            .map_err(ArchiveError::query("read the archive catalog"))?;
        let mut manifests = Vec::new();
        for r in rows {
            let key: String = r.get(0);
            let bytes = self
                .store
                .get(&key)
                .await?
                .ok_or_else(|| ArchiveError::Shape {
                    table,
                    column: "manifest",
                    detail: format!(
                        "{key} is named by the archive catalog but missing from the store"
                    ),
                })?;
            let m = Manifest::from_bytes(&bytes).map_err(|e| ArchiveError::Shape {
                table,
                column: "manifest",
                detail: format!("{key} does not parse: {e}"),
            })?;
            if m.compaction.is_some() {
                manifests.clear();
            }
            manifests.push(m);
        }
        Ok(manifests)
    }

    /// Puts each part a compacted generation wrote under its live key,
    /// from its staged copy (idempotent: a part already published is
    /// written again with the same bytes).
    pub(crate) async fn publish(&self, manifest: &Manifest) -> Result<(), ArchiveError> {
        let Some(c) = &manifest.compaction else {
            return Ok(());
        };
        failpoint::hit("archive.before_publish");
        for key in &c.written {
            let staged = staged_key(key, manifest.generation);
            let bytes = self
                .store
                .get(&staged)
                .await?
                .ok_or_else(|| ArchiveError::Shape {
                    table: Table::parse(&manifest.table).unwrap_or(Table::Deliveries),
                    column: "manifest",
                    detail: format!("{staged} was verified but is missing from the store"),
                })?;
            self.store.put(key, bytes).await?;
            failpoint::hit("archive.mid_publish");
        }
        Ok(())
    }

    /// Deletes the staged copies of a published generation.
    pub(crate) async fn clear_staged(&self, manifest: &Manifest) -> Result<(), ArchiveError> {
        if let Some(c) = &manifest.compaction {
            for key in &c.written {
                self.store
                    .delete(&staged_key(key, manifest.generation))
                    .await?;
            }
        }
        Ok(())
    }
}
