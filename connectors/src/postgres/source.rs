//! The capture loop: slot → pgoutput → rules → sink → confirmed LSN.
//!
//! ```text
//!  pgwire-replication ──▶ decode ──▶ TransactionBuilder ──hand_off──▶ sink
//!        ▲  (keepalives answered by its worker,                        │ receipt
//!        │   even under back-pressure)                                 ▼
//!        └──── update_applied_lsn(end_lsn) ◀──── acker (in commit order)
//! ```
//!
//! The acker awaits receipts in the order transactions were handed off and
//! confirms a transaction's `end_lsn` only when it and all before it are
//! durable. Large transactions are handed off in chunks as they are read
//! (protocol version 1 sends only committed transactions, so a chunk can go
//! before the commit message), and confirmed once at their end.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use pgwire_replication::ReplicationClient;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use walhook_pipeline::capture::{
    CaptureObserver, ChangeSource, RunOptions, RunStats, TransactionSink,
};
use walhook_pipeline::failpoint;
use walhook_pipeline::ids::Lsn;
use walhook_pipeline::log::Receipt;

use super::catalog;
use super::config::{RuleConfig, RuleKind, SourceConfig, split_table};
use super::connect::{connect_sql, replication_config, stream_tls_error};
use super::error::CaptureError;
use super::rules::{MessageRule, compile};
use super::stream::{Flow, StreamState};

/// The prefix of walhook's own heartbeat messages.
pub const HEARTBEAT_PREFIX: &str = "walhook.heartbeat";

/// Session settings that fix the text form of values (see `value.rs`).
const SESSION_OPTIONS: &str = "-c datestyle=ISO,YMD -c timezone=UTC -c intervalstyle=iso_8601 \
                               -c extra_float_digits=3 -c bytea_output=hex";

/// A validated source, ready to run.
pub struct PostgresSource {
    pub(super) cfg: SourceConfig,
    /// The URL and TLS policy of `cfg`, parsed once.
    options: walhook_pgtls::ConnectOptions,
    /// Table rules by (schema, table).
    pub(super) table_rules: HashMap<(String, String), Vec<RuleConfig>>,
    pub(super) message_rules: Vec<MessageRule>,
    /// The event types the rules name, with their schema versions.
    event_types: Vec<(String, u32)>,
    /// Warnings from start-up, for the operator.
    pub warnings: Vec<String>,
    /// Where table rules' event shapes get their schema versions; without
    /// one, events carry the configured `schema_version`.
    pub(super) schemas: Option<Arc<dyn walhook_pipeline::capture::SchemaCatalog>>,
    /// Outbox rules' declared payload schemas, by rule name (read once).
    pub(super) declared: HashMap<String, Arc<super::declared::DeclaredSchemas>>,
    /// How far this source read from its slot before, once it did: a slot
    /// missing then was dropped under it, and is not silently created again.
    read_up_to: std::sync::Mutex<Option<Lsn>>,
}

impl PostgresSource {
    /// Validates the config, checks the database, and creates the slot and
    /// publication when the config asks for it; for a source that never
    /// read from its slot (see [`PostgresSource::prepare_resuming`]).
    pub async fn prepare(cfg: SourceConfig, rules: Vec<RuleConfig>) -> Result<Self, CaptureError> {
        Self::prepare_resuming(cfg, rules, None).await
    }

    /// As [`PostgresSource::prepare`], for a source that read from its slot
    /// up to `read_up_to` before (its saved checkpoint): a missing slot is
    /// then [`CaptureError::SlotGone`], never created again.
    pub async fn prepare_resuming(
        cfg: SourceConfig,
        rules: Vec<RuleConfig>,
        read_up_to: Option<Lsn>,
    ) -> Result<Self, CaptureError> {
        cfg.validate(&rules)?;
        let options = cfg.connect_options()?;
        let client = connect_sql(&options).await?;
        catalog::check_wal_level(&client).await?;
        let tables = catalog::rule_tables(&rules);
        let types = super::types::TypeMap::load(&client).await?;
        let infos: Vec<_> = catalog::load_tables(&client, &tables)
            .await?
            .into_iter()
            .map(|i| i.resolve_types(&types))
            .collect();
        let mut warnings = Vec::new();
        let mut table_rules: HashMap<(String, String), Vec<RuleConfig>> = HashMap::new();
        for rule in rules.iter().filter(|r| r.kind != RuleKind::Message) {
            let key = split_table(rule.table.as_deref().unwrap_or_default());
            let info = infos
                .iter()
                .find(|i| (i.schema.clone(), i.name.clone()) == key);
            if let Some(info) = info {
                let compiled = compile(rule, info)?;
                warnings.extend(compiled.warnings);
            }
            table_rules.entry(key).or_default().push(rule.clone());
        }
        if !tables.is_empty() {
            catalog::ensure_publication(&client, &cfg, &tables).await?;
        } else if cfg.create_publication {
            // Message rules only: a publication is still needed to stream.
            let exists = client
                .query_opt(
                    "SELECT 1 FROM pg_publication WHERE pubname = $1",
                    &[&cfg.publication],
                )
                .await
                .map_err(CaptureError::query("read pg_publication"))?;
            if exists.is_none() {
                client
                    .batch_execute(&format!(
                        "CREATE PUBLICATION {}",
                        catalog::quote_ident(&cfg.publication)
                    ))
                    .await
                    .map_err(CaptureError::query("create the publication"))?;
            }
        }
        catalog::ensure_slot(&client, &cfg, read_up_to).await?;
        let mut declared = HashMap::new();
        for rule in &rules {
            if let Some(d) = super::declared::DeclaredSchemas::load(rule)? {
                declared.insert(rule.name.clone(), d);
            }
        }
        let message_rules = rules
            .iter()
            .filter(|r| r.kind == RuleKind::Message)
            .map(|r| MessageRule::new(r).with_declared(declared.get(&r.name).cloned()))
            .collect();
        for w in &warnings {
            tracing::warn!("{w}");
        }
        let event_types = rule_event_types(&rules);
        Ok(PostgresSource {
            cfg,
            options,
            table_rules,
            message_rules,
            event_types,
            warnings,
            schemas: None,
            declared,
            read_up_to: std::sync::Mutex::new(read_up_to),
        })
    }

    /// Versions table rules' event shapes in `catalog`: a change of the
    /// columns a rule sends (a column added, dropped or retyped) makes a
    /// new schema version, registered with its JSON Schema before any event
    /// of that shape is made.
    pub fn with_schema_catalog(
        mut self,
        catalog: Arc<dyn walhook_pipeline::capture::SchemaCatalog>,
    ) -> Self {
        self.schemas = Some(catalog);
        self
    }

    /// The source's config.
    pub fn config(&self) -> &SourceConfig {
        &self.cfg
    }

    /// The event types the rules produce or declare (`event_types` of
    /// outbox and message rules), with their schema versions.
    pub fn event_types(&self) -> &[(String, u32)] {
        &self.event_types
    }

    /// Streams until `shutdown`, a definite error, or (with
    /// `stop_when_caught_up`) the position current at the start.
    #[allow(clippy::disallowed_methods)] // bare spawn: the acker's end is awaited (or it is aborted) by the run
    pub async fn run<S: TransactionSink>(
        &self,
        mut sink: S,
        observer: Arc<dyn CaptureObserver>,
        options: RunOptions,
        shutdown: CancellationToken,
    ) -> Result<RunStats, CaptureError> {
        let sql = connect_sql(&self.options).await?;
        let known = *self.read_up_to.lock().expect("not poisoned");
        let state = catalog::ensure_slot(&sql, &self.cfg, known).await?;
        // From now on this source has read from the slot.
        *self.read_up_to.lock().expect("not poisoned") =
            Some(known.unwrap_or(Lsn::ZERO).max(state.confirmed_flush));
        let mut rcfg = replication_config(&self.options, &self.cfg.slot, &self.cfg.publication)
            .with_start_lsn(pgwire_replication::Lsn::ZERO)
            .with_ack_lsn(pgwire_replication::Lsn::from_u64(state.confirmed_flush.0))
            .with_status_interval(self.cfg.status_interval)
            .with_wakeup_interval(Duration::from_secs(1))
            .with_buffer_size(4096)
            .with_options(SESSION_OPTIONS)
            .with_application_name(format!("walhook-capture-{}", self.cfg.name));
        let mut stop_at = None;
        if options.stop_when_caught_up {
            let row = sql
                .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
                .await
                .map_err(CaptureError::query("read the current WAL position"))?;
            let now: String = row.get(0);
            let now = Lsn::from_str(&now).unwrap_or(Lsn::ZERO);
            rcfg = rcfg.with_stop_lsn(pgwire_replication::Lsn::from_u64(now.0));
            stop_at = Some(now);
        }
        let mut client = ReplicationClient::connect(rcfg)
            .await
            .map_err(|e| stream_tls_error(e, &self.options))?;
        if stop_at.is_some() {
            // Something at or past the stop position must be decoded for
            // the stream to notice it: a heartbeat is.
            emit_heartbeat(&sql).await?;
        }

        let (ack_tx, ack_rx) = mpsc::channel::<(Lsn, Receipt)>(1024);
        let (confirmed_tx, mut confirmed_rx) = watch::channel(state.confirmed_flush);
        let acker = tokio::spawn(acker(ack_rx, confirmed_tx, observer.clone()));

        let types = super::types::TypeMap::load(&sql).await?;
        let mut stream = StreamState::new(self, observer.clone(), types);
        let mut heartbeat = tokio::time::interval(if self.cfg.heartbeat_interval.is_zero() {
            Duration::from_secs(3600 * 24 * 365)
        } else {
            self.cfg.heartbeat_interval
        });
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        heartbeat.tick().await;
        let mut stats = RunStats {
            confirmed: state.confirmed_flush,
            ..RunStats::default()
        };

        let result: Result<(), CaptureError> = loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break Ok(()),
                changed = confirmed_rx.changed() => {
                    if changed.is_err() {
                        // The acker ended: a receipt failed.
                        break Err(CaptureError::Sink(walhook_pipeline::capture::SinkError::Closed));
                    }
                    let lsn = *confirmed_rx.borrow_and_update();
                    stats.confirmed = lsn;
                    if options.confirm {
                        client.update_applied_lsn(pgwire_replication::Lsn::from_u64(lsn.0));
                    }
                }
                _ = heartbeat.tick() => {
                    if let Err(e) = emit_heartbeat(&sql).await {
                        tracing::warn!(error = %e, "heartbeat failed");
                    }
                    match catalog::slot_state(&sql, &self.cfg.slot).await {
                        Ok(Some(s)) if s.wal_status == "lost" => break Err(catalog::slot_lost(&self.cfg.slot, s.confirmed_flush)),
                        Ok(Some(s)) => {
                            observer.slot_lag(s.lag_bytes);
                            if s.lag_bytes as u64 > self.cfg.lag_warning_bytes {
                                tracing::warn!(slot = %self.cfg.slot, lag_bytes = s.lag_bytes, wal_status = %s.wal_status, "the slot retains much WAL; capture is behind");
                            }
                        }
                        Ok(None) => break Err(CaptureError::SlotGone {
                            slot: self.cfg.slot.clone(),
                            source_name: self.cfg.name.clone(),
                            read_up_to: stats.confirmed,
                        }),
                        Err(e) => tracing::warn!(error = %e, "could not read the slot's state"),
                    }
                }
                event = client.recv() => {
                    let event = match event {
                        Ok(Some(e)) => e,
                        Ok(None) => break Ok(()),
                        Err(e) => break Err(self.stream_error(&sql, e).await),
                    };
                    match stream.on_event(event, &sql, &mut sink, &ack_tx).await {
                        Ok(Flow::Continue) => {}
                        Ok(Flow::Stop) => break Ok(()),
                        Err(e) => break Err(e),
                    }
                }
            }
        };
        stats.transactions = stream.transactions;
        stats.changes = stream.changes;
        stats.events = stream.events;
        stats.incidents = stream.incidents;

        // Let durable work be confirmed before leaving (bounded).
        drop(ack_tx);
        if result.is_ok() {
            let drain = async {
                while confirmed_rx.changed().await.is_ok() {
                    let lsn = *confirmed_rx.borrow_and_update();
                    stats.confirmed = lsn;
                    if options.confirm {
                        client.update_applied_lsn(pgwire_replication::Lsn::from_u64(lsn.0));
                    }
                }
            };
            let all_durable = if tokio::time::timeout(Duration::from_secs(10), drain)
                .await
                .is_err()
            {
                tracing::warn!(
                    "in-flight transactions were not durable within 10 s; they will be read again"
                );
                acker.abort();
                true
            } else {
                // False when a receipt failed: the run ends with an error
                // even though it reached its end.
                acker.await.unwrap_or(false)
            };
            let _ = tokio::time::timeout(Duration::from_secs(5), client.shutdown()).await;
            // The worker does not report a last position when it stops (nor
            // after a stop LSN), so move the slot to what is durable now.
            if options.confirm {
                advance_slot(&sql, &self.cfg.slot, stats.confirmed).await?;
            }
            if !all_durable {
                return Err(CaptureError::Sink(
                    walhook_pipeline::capture::SinkError::Closed,
                ));
            }
        } else {
            acker.abort();
            client.abort();
        }
        result.map(|()| stats)
    }

    async fn stream_error(
        &self,
        sql: &tokio_postgres::Client,
        e: pgwire_replication::PgWireError,
    ) -> CaptureError {
        // The stream connects in the background, so its TLS failures
        // arrive here, with its first message.
        if e.is_tls() {
            return stream_tls_error(e, &self.options);
        }
        // When Postgres invalidates a slot it first terminates the session
        // reading it, then marks the slot lost: look for a short while.
        for attempt in 0..30 {
            match catalog::slot_state(sql, &self.cfg.slot).await {
                Ok(Some(s)) if s.wal_status == "lost" => {
                    return catalog::slot_lost(&self.cfg.slot, s.confirmed_flush);
                }
                Ok(Some(s)) if s.active_pid.is_none() && attempt >= 5 => break,
                Ok(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                Err(_) => break,
            }
        }
        CaptureError::Stream(e)
    }
}

impl ChangeSource for PostgresSource {
    type Error = CaptureError;

    fn name(&self) -> &str {
        &self.cfg.name
    }

    fn run<S: TransactionSink + 'static>(
        &self,
        sink: S,
        observer: Arc<dyn CaptureObserver>,
        options: RunOptions,
        shutdown: CancellationToken,
    ) -> impl std::future::Future<Output = Result<RunStats, CaptureError>> + Send {
        PostgresSource::run(self, sink, observer, options, shutdown)
    }
}

/// Moves the slot to `lsn` once no session holds it (no-op when it is
/// already there).
async fn advance_slot(
    sql: &tokio_postgres::Client,
    slot: &str,
    lsn: Lsn,
) -> Result<(), CaptureError> {
    for _ in 0..100 {
        let Some(state) = catalog::slot_state(sql, slot).await? else {
            return Ok(());
        };
        if state.confirmed_flush >= lsn {
            return Ok(());
        }
        if state.active_pid.is_none() {
            sql.execute(
                "SELECT pg_replication_slot_advance($1, $2::text::pg_lsn)",
                &[&slot, &lsn.to_string()],
            )
            .await
            .map_err(CaptureError::query(
                "advance the slot to the last durable position",
            ))?;
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tracing::warn!(%slot, %lsn, "the slot stayed in use; the last position will be confirmed by the next run");
    Ok(())
}

async fn emit_heartbeat(sql: &tokio_postgres::Client) -> Result<(), CaptureError> {
    sql.execute(
        "SELECT pg_logical_emit_message(false, $1, '')",
        &[&HEARTBEAT_PREFIX],
    )
    .await
    .map_err(CaptureError::query("emit a heartbeat message"))?;
    Ok(())
}

/// Awaits receipts in order and publishes the confirmed position; false
/// once a receipt failed (it then stops).
async fn acker(
    mut rx: mpsc::Receiver<(Lsn, Receipt)>,
    confirmed: watch::Sender<Lsn>,
    observer: Arc<dyn CaptureObserver>,
) -> bool {
    while let Some((lsn, receipt)) = rx.recv().await {
        if let Err(e) = receipt.await {
            tracing::error!(error = %e, %lsn, "events were not made durable; capture stops and will read them again");
            return false;
        }
        if lsn > *confirmed.borrow() {
            // Durable downstream, not yet confirmed to the server: a crash
            // here must make the slot hand the same events on again. Hit
            // once per transaction, so that tests can aim at the N-th one.
            failpoint::hit("capture.before_confirm");
            confirmed.send_replace(lsn);
            observer.confirmed(lsn);
        }
    }
    true
}

/// The event types `rules` produce or declare (`event_type`, `event_types`),
/// each with its rule's schema version, sorted, once each: what capture
/// registers in the catalog, and what `walhook api` registers at its own
/// start, so that endpoints can subscribe before capture first runs.
pub fn rule_event_types(rules: &[RuleConfig]) -> Vec<(String, u32)> {
    let mut types: Vec<(String, u32)> = rules
        .iter()
        .flat_map(|r| {
            r.event_type
                .iter()
                .chain(&r.event_types)
                .map(|t| (t.clone(), r.schema_version))
        })
        .collect();
    types.sort();
    types.dedup();
    types
}
