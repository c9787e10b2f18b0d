//! Reading one replication stream into transactions: pgoutput messages are
//! decoded, rules applied, events and incidents gathered per transaction and
//! handed to the sink in commit order (in chunks for large transactions),
//! each transaction's receipt queued for the acker.
//!
//! Each part handed off also tallies, per rule, the changes the rule looked
//! at and what became of them (event, filtered, incident): the capture
//! ledger's input. Changes that no rule owns (truncates, schema changes,
//! non-transactional messages, which have no commit) are not in it.

use std::collections::HashMap;
use std::sync::Arc;

use pgwire_replication::ReplicationEvent;
use tokio::sync::mpsc;
use walhook_pipeline::capture::{
    CapturedTransaction, Incident, IncidentKind, RuleTally, TransactionSink,
};
use walhook_pipeline::failpoint;
use walhook_pipeline::ids::Lsn;
use walhook_pipeline::log::Receipt;
use walhook_pipeline::time::Timestamp;

use super::error::CaptureError;
use super::pgoutput::{self, Message};
use super::rules::{Change, CompiledRule, Outcome, TableInfo, TxContext, compile};
use super::source::{HEARTBEAT_PREFIX, PostgresSource};
use super::types::TypeMap;
use walhook_pipeline::capture::CaptureObserver;

/// Events handed off per chunk of a large transaction.
const CHUNK_EVENTS: usize = 4096;

/// Event bytes handed off per chunk of a large transaction: memory stays
/// bounded however large the events are.
const CHUNK_BYTES: usize = 16 << 20;

/// Incidents of one transaction stored one by one; past this, they are
/// counted in one `incidents_summarised` incident at its commit (a
/// transaction of a million bad rows must not hold a million in memory).
const MAX_INCIDENTS_PER_TX: u32 = 1000;

pub(super) enum Flow {
    /// Keep reading.
    Continue,
    /// The stop position was reached.
    Stop,
}

/// A table's compiled rules and key columns.
struct BoundTable {
    info: TableInfo,
    keys: Vec<bool>,
    rules: Vec<CompiledRule>,
}

/// The transaction being read.
struct OpenTx {
    commit_lsn: Lsn,
    commit_time: Timestamp,
    ordinal: u32,
    pending: CapturedTransaction,
    /// Payload bytes of `pending.events`.
    pending_bytes: usize,
    receipts: Vec<Receipt>,
    /// The number of the part `pending` will be.
    next_part: u32,
    /// Incidents seen in the whole transaction.
    incident_count: u32,
    /// Of them, those counted but not stored one by one, by kind.
    summarised: Vec<(IncidentKind, u32)>,
}

pub(super) struct StreamState<'s> {
    source: &'s PostgresSource,
    name: Arc<str>,
    observer: Arc<dyn CaptureObserver>,
    tables: HashMap<u32, BoundTable>,
    /// Declared column types → the types their values are written as.
    types: TypeMap,
    tx: Option<OpenTx>,
    /// A relation whose columns changed, until its new schema version is
    /// known.
    changed_relation: Option<u32>,
    pub(super) transactions: u64,
    pub(super) changes: u64,
    pub(super) events: u64,
    pub(super) incidents: u64,
}

impl<'s> StreamState<'s> {
    pub(super) fn new(
        source: &'s PostgresSource,
        observer: Arc<dyn CaptureObserver>,
        types: TypeMap,
    ) -> Self {
        StreamState {
            source,
            name: source.cfg.name.as_str().into(),
            observer,
            tables: HashMap::new(),
            types,
            tx: None,
            changed_relation: None,
            transactions: 0,
            changes: 0,
            events: 0,
            incidents: 0,
        }
    }

    fn incident(&mut self, incident: Incident) {
        // Details may quote row data: cleaned and bounded before anything
        // logs or stores them.
        let incident = incident.bounded();
        self.incidents += 1;
        if let Some(tx) = self.tx.as_mut() {
            tx.incident_count += 1;
            if tx.incident_count > MAX_INCIDENTS_PER_TX {
                match tx.summarised.iter_mut().find(|(k, _)| *k == incident.kind) {
                    Some((_, n)) => *n += 1,
                    None => tx.summarised.push((incident.kind, 1)),
                }
                self.observer.incident(&incident);
                return;
            }
        }
        tracing::warn!(kind = incident.kind.as_str(), commit_lsn = ?incident.commit_lsn.map(|l| l.to_string()), rule = ?incident.rule, table = ?incident.table, "{}", incident.detail);
        self.observer.incident(&incident);
        if let Some(tx) = self.tx.as_mut() {
            tx.pending.incidents.push(incident);
        }
    }

    /// The tally of `rule` in the part being read.
    fn tally(&mut self, rule: &Arc<str>) -> Option<&mut RuleTally> {
        let tx = self.tx.as_mut()?;
        Some(RuleTally::entry(&mut tx.pending.ledger, rule))
    }

    /// Takes what `rule` made of a change it looked at.
    fn take_outcome(&mut self, rule: &Arc<str>, outcome: Outcome) {
        match outcome {
            Outcome::Event(e) => self.push_event(rule, *e),
            Outcome::Incident(i) => {
                if let Some(t) = self.tally(rule) {
                    t.incidents += 1;
                }
                self.incident(i);
            }
            Outcome::Skip => {
                if let Some(t) = self.tally(rule) {
                    t.filtered += 1;
                }
            }
        }
    }

    /// Takes an event `rule` made, unless it is larger than an event may
    /// be (then it is an incident naming its id and size, counted against
    /// the rule).
    fn push_event(&mut self, rule: &Arc<str>, event: walhook_pipeline::event::Event) {
        let max = self.source.cfg.max_event_bytes;
        if event.payload.len() > max {
            if let Some(t) = self.tally(rule) {
                t.incidents += 1;
            }
            self.incident(Incident {
                kind: IncidentKind::OversizedEvent,
                commit_lsn: Some(event.key.commit_lsn),
                tx_ordinal: Some(event.key.tx_ordinal),
                rule: Some(rule.to_string()),
                table: None,
                detail: format!(
                    "event {} ({}) would be {} bytes, over [source].max_event_bytes = {max}; it was not made",
                    event.id,
                    event.event_type,
                    event.payload.len()
                ),
            });
            return;
        }
        if let Some(tx) = self.tx.as_mut() {
            RuleTally::entry(&mut tx.pending.ledger, rule).events += 1;
            tx.pending_bytes += event.payload.len();
            tx.pending.events.push(event);
        }
    }

    pub(super) async fn on_event<S: TransactionSink>(
        &mut self,
        event: ReplicationEvent,
        sql: &tokio_postgres::Client,
        sink: &mut S,
        ack: &mpsc::Sender<(Lsn, Receipt)>,
    ) -> Result<Flow, CaptureError> {
        match event {
            ReplicationEvent::Begin {
                final_lsn,
                commit_time_micros,
                ..
            } => {
                let commit_lsn = Lsn(final_lsn.as_u64());
                let commit_time = Timestamp::from_pg_micros(commit_time_micros);
                self.tx = Some(OpenTx {
                    commit_lsn,
                    commit_time,
                    ordinal: 0,
                    pending: self.empty_tx(commit_lsn, commit_time),
                    pending_bytes: 0,
                    receipts: Vec::new(),
                    next_part: 0,
                    incident_count: 0,
                    summarised: Vec::new(),
                });
            }
            ReplicationEvent::XLogData { data, .. } => {
                let msg = pgoutput::decode(&data).map_err(CaptureError::Decode)?;
                if let Message::Relation(rel) = &msg {
                    // A type created since the stream started (a new
                    // domain). Its transaction's commit can be decoded a
                    // moment before other sessions see it (the commit record
                    // is flushed before the transaction leaves the process
                    // array), so read again until the type shows.
                    let mut tries = 0;
                    while rel
                        .columns
                        .iter()
                        .any(|c| self.types.is_unknown(c.type_oid))
                    {
                        if tries == 50 {
                            tracing::warn!(relation = %rel.name, "a column's type is still not in pg_type after 1 s; its values are written as text");
                            break;
                        }
                        if tries > 0 {
                            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                        }
                        self.types = TypeMap::load(sql).await?;
                        tries += 1;
                    }
                }
                let relation = match &msg {
                    Message::Relation(rel) => Some(rel.rel_id),
                    _ => None,
                };
                self.on_message(msg)?;
                if let Some(rel_id) = relation {
                    self.version_shapes(rel_id).await?;
                    if self.changed_relation.take() == Some(rel_id) {
                        self.schema_changed(rel_id);
                    }
                }
                let full = self.tx.as_ref().is_some_and(|t| {
                    t.pending.events.len() >= CHUNK_EVENTS
                        || t.pending_bytes >= CHUNK_BYTES
                        || t.pending.incidents.len() >= MAX_INCIDENTS_PER_TX as usize
                });
                if full {
                    self.hand_off_chunk(sink).await?;
                }
            }
            ReplicationEvent::Message {
                transactional,
                lsn,
                prefix,
                content,
            } => {
                if prefix == HEARTBEAT_PREFIX {
                    // Everything before a heartbeat has been read; once it
                    // is durable too, the slot may move past it.
                    if self.tx.is_none() {
                        ack.send((Lsn(lsn.as_u64()), Receipt::ready()))
                            .await
                            .map_err(|_| {
                                CaptureError::Sink(walhook_pipeline::capture::SinkError::Closed)
                            })?;
                    }
                    return Ok(Flow::Continue);
                }
                let Some(rule) = self
                    .source
                    .message_rules
                    .iter()
                    .find(|r| r.matches(&prefix))
                    .cloned()
                else {
                    return Ok(Flow::Continue);
                };
                let outcome = match (transactional, self.tx.as_mut()) {
                    (true, Some(tx)) => {
                        let ordinal = tx.ordinal;
                        tx.ordinal += 1;
                        tx.pending.change_count += 1;
                        RuleTally::entry(&mut tx.pending.ledger, rule.shared_name()).changes += 1;
                        let ctx = TxContext {
                            source: &self.name,
                            commit_lsn: tx.commit_lsn,
                            commit_time: tx.commit_time,
                            max_event_bytes: self.source.cfg.max_event_bytes,
                        };
                        rule.apply(&content, &ctx, ordinal)
                    }
                    _ => Outcome::Incident(Incident {
                        kind: IncidentKind::InvalidMessage,
                        commit_lsn: Some(Lsn(lsn.as_u64())),
                        tx_ordinal: None,
                        rule: Some(rule.name().to_owned()),
                        table: None,
                        detail: format!(
                            "a non-transactional message with prefix {prefix:?} has no commit time and \
                             cannot become an event; emit it with pg_logical_emit_message(true, …)"
                        ),
                    }),
                };
                self.changes += u64::from(transactional);
                if transactional && self.tx.is_some() {
                    self.take_outcome(rule.shared_name(), outcome);
                } else if let Outcome::Incident(i) = outcome {
                    // Outside a transaction: no commit, so no ledger window.
                    self.incident(i);
                }
            }
            ReplicationEvent::Commit { end_lsn, .. } => {
                let Some(mut tx) = self.tx.take() else {
                    return Ok(Flow::Continue);
                };
                if !tx.summarised.is_empty() {
                    let counted: Vec<String> = tx
                        .summarised
                        .iter()
                        .map(|(k, n)| format!("{} ×{n}", k.as_str()))
                        .collect();
                    let summary = Incident {
                        kind: IncidentKind::Summarised,
                        commit_lsn: Some(tx.commit_lsn),
                        tx_ordinal: None,
                        rule: None,
                        table: None,
                        detail: format!(
                            "this transaction had more than {MAX_INCIDENTS_PER_TX} incidents; the further ones \
                             were counted, not stored one by one: {}",
                            counted.join(", ")
                        ),
                    };
                    tracing::warn!(kind = summary.kind.as_str(), commit_lsn = %tx.commit_lsn, "{}", summary.detail);
                    tx.pending.incidents.push(summary);
                }
                let end_lsn = Lsn(end_lsn.as_u64());
                tx.pending.end_lsn = end_lsn;
                tx.pending.part = tx.next_part;
                self.transactions += 1;
                self.events += tx.pending.events.len() as u64;
                self.observer.transaction(&tx.pending);
                let receipt = sink.hand_off(tx.pending).await?;
                failpoint::hit("capture.after_handoff");
                tx.receipts.push(receipt);
                let receipts = tx.receipts;
                let all = Receipt::new(async move {
                    for r in receipts {
                        r.await?;
                    }
                    Ok(())
                });
                ack.send((end_lsn, all)).await.map_err(|_| {
                    CaptureError::Sink(walhook_pipeline::capture::SinkError::Closed)
                })?;
            }
            ReplicationEvent::KeepAlive { .. } => {}
            ReplicationEvent::StoppedAt { .. } => return Ok(Flow::Stop),
        }
        Ok(Flow::Continue)
    }

    fn empty_tx(&self, commit_lsn: Lsn, commit_time: Timestamp) -> CapturedTransaction {
        CapturedTransaction {
            source: self.name.clone(),
            commit_lsn,
            end_lsn: commit_lsn,
            commit_time,
            change_count: 0,
            part: 0,
            ledger: Vec::new(),
            events: Vec::new(),
            incidents: Vec::new(),
        }
    }

    /// Hands off what a large transaction has so far.
    async fn hand_off_chunk<S: TransactionSink>(
        &mut self,
        sink: &mut S,
    ) -> Result<(), CaptureError> {
        let fresh = {
            let tx = self.tx.as_ref().expect("checked by the caller");
            self.empty_tx(tx.commit_lsn, tx.commit_time)
        };
        let tx = self.tx.as_mut().expect("checked by the caller");
        let mut chunk = std::mem::replace(&mut tx.pending, fresh);
        chunk.part = tx.next_part;
        tx.next_part += 1;
        tx.pending_bytes = 0;
        self.events += chunk.events.len() as u64;
        let receipt = sink.hand_off(chunk).await?;
        // A part of a large transaction is handed off; its commit is not.
        failpoint::hit("capture.mid_transaction");
        tx.receipts.push(receipt);
        Ok(())
    }

    /// Records that relation `rel_id`'s columns changed, naming the schema
    /// version each of its rules' events now carry.
    fn schema_changed(&mut self, rel_id: u32) {
        let Some(table) = self.tables.get(&rel_id) else {
            return;
        };
        let versions: Vec<(String, u32)> = table
            .rules
            .iter()
            .filter_map(|r| Some((r.shape()?.event_type.to_string(), r.schema_version())))
            .collect();
        let columns: Vec<&str> = table.info.columns.iter().map(|c| c.name.as_str()).collect();
        let qualified = table.info.qualified();
        let detail =
            walhook_pipeline::capture::schema_change_detail(&qualified, &columns, &versions);
        self.incident(Incident {
            kind: IncidentKind::SchemaChange,
            commit_lsn: self.tx.as_ref().map(|t| t.commit_lsn),
            tx_ordinal: None,
            rule: None,
            table: Some(qualified),
            detail,
        });
    }

    /// Gives the rules of relation `rel_id` the catalog's schema version of
    /// their current shape (registering a new shape first).
    async fn version_shapes(&mut self, rel_id: u32) -> Result<(), CaptureError> {
        let Some(catalog) = self.source.schemas.clone() else {
            return Ok(());
        };
        let Some(table) = self.tables.get_mut(&rel_id) else {
            return Ok(());
        };
        for rule in &mut table.rules {
            let Some(shape) = rule.shape() else {
                continue;
            };
            let (event_type, base, columns) = (
                shape.event_type.to_string(),
                shape.base_version,
                shape.columns,
            );
            let fingerprint = format!("{base}|{}", super::schema::fingerprint(&columns));
            let schema_of = |v: u32| super::schema::event_schema(&event_type, v, &columns);
            let mut wait = std::time::Duration::from_millis(100);
            let version = loop {
                match catalog
                    .version_for(&event_type, base, &fingerprint, &schema_of)
                    .await
                {
                    Ok(v) => break v,
                    // Nothing of this shape is made before its version is
                    // known: retry a while, then stop capture (a restart
                    // reads the relation again).
                    Err(e) if e.is_transient() && wait < std::time::Duration::from_secs(10) => {
                        tracing::warn!(event_type = %event_type, error = %e, "could not register an event schema; retrying");
                        tokio::time::sleep(wait).await;
                        wait *= 2;
                    }
                    // The platform database's error, as a hand-off's would
                    // be: transient ones restart capture, the rest stop it.
                    Err(e) => return Err(walhook_pipeline::capture::SinkError::Store(e).into()),
                }
            };
            rule.set_schema_version(version);
        }
        Ok(())
    }

    fn bind(&self, info: TableInfo) -> Result<BoundTable, CaptureError> {
        let key = (info.schema.clone(), info.name.clone());
        let mut rules = Vec::new();
        if let Some(configs) = self.source.table_rules.get(&key) {
            for rule in configs {
                // A schema change that breaks a rule stops capture with the
                // message a bad config would get.
                let mut compiled = compile(rule, &info)?;
                compiled.set_declared(self.source.declared.get(&rule.name).cloned());
                rules.push(compiled);
            }
        }
        let keys = info.columns.iter().map(|c| c.key).collect();
        Ok(BoundTable { info, keys, rules })
    }

    fn on_message(&mut self, msg: Message<'_>) -> Result<(), CaptureError> {
        match msg {
            Message::Relation(rel) => {
                let info = TableInfo::from(&rel).resolve_types(&self.types);
                // Recorded once the new shape's schema version is known
                // (`schema_changed`), so the incident can name it.
                self.changed_relation = self
                    .tables
                    .get(&rel.rel_id)
                    .is_some_and(|old| old.info != info && !old.rules.is_empty())
                    .then_some(rel.rel_id);
                let bound = self.bind(info)?;
                self.tables.insert(rel.rel_id, bound);
            }
            Message::Insert { rel_id, new } => {
                self.on_change(rel_id, Change::Insert { new: &new })?
            }
            Message::Update { rel_id, old, new } => self.on_change(
                rel_id,
                Change::Update {
                    old: old.as_ref(),
                    new: &new,
                },
            )?,
            Message::Delete { rel_id, old } => {
                self.on_change(rel_id, Change::Delete { old: &old })?
            }
            Message::Truncate { rel_ids, options } => {
                let names: Vec<String> = rel_ids
                    .iter()
                    .filter_map(|id| self.tables.get(id))
                    .map(|t| t.info.qualified())
                    .collect();
                if let Some(tx) = self.tx.as_mut() {
                    tx.ordinal += 1;
                    tx.pending.change_count += 1;
                }
                self.changes += 1;
                let detail = format!(
                    "TRUNCATE{} of {}: its rows were removed without row changes, so no events were made for them",
                    if options & 1 == 1 { " CASCADE" } else { "" },
                    names.join(", ")
                );
                self.incident(Incident {
                    kind: IncidentKind::Truncate,
                    commit_lsn: self.tx.as_ref().map(|t| t.commit_lsn),
                    tx_ordinal: self.tx.as_ref().map(|t| t.ordinal - 1),
                    rule: None,
                    table: Some(names.join(", ")),
                    detail,
                });
            }
            Message::LogicalMessage { .. } | Message::Begin { .. } | Message::Commit { .. } => {
                // The transport turns these into events of their own.
            }
            Message::Origin { .. } | Message::Type { .. } => {}
        }
        Ok(())
    }

    fn on_change(&mut self, rel_id: u32, change: Change<'_, '_>) -> Result<(), CaptureError> {
        let Some(tx) = self.tx.as_mut() else {
            return Err(CaptureError::Definite(
                "a row change arrived outside a transaction".into(),
            ));
        };
        let ordinal = tx.ordinal;
        tx.ordinal += 1;
        tx.pending.change_count += 1;
        self.changes += 1;
        let Some(table) = self.tables.get(&rel_id) else {
            return Err(CaptureError::Definite(format!(
                "a change for relation {rel_id} arrived before its description"
            )));
        };
        let ctx = TxContext {
            source: &self.name,
            commit_lsn: tx.commit_lsn,
            commit_time: tx.commit_time,
            max_event_bytes: self.source.cfg.max_event_bytes,
        };
        let mut outcomes = Vec::new();
        for rule in &table.rules {
            let outcome = rule.apply(change, &table.keys, &ctx, ordinal);
            let tally = RuleTally::entry(&mut tx.pending.ledger, rule.shared_name());
            tally.changes += 1;
            match outcome {
                Outcome::Skip => tally.filtered += 1,
                other => outcomes.push((rule.shared_name().clone(), other)),
            }
        }
        for (rule, outcome) in outcomes {
            self.take_outcome(&rule, outcome);
        }
        Ok(())
    }
}
