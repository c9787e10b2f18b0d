//! Capture's errors, each transient (retry) or definite (the operator acts).

use super::config::RuleError;

/// Why capture stopped or could not start.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// A rule does not fit the database or the config: fix the config.
    #[error(transparent)]
    Rule(#[from] RuleError),
    /// The database is not set up for capture; the message says what to run.
    #[error("{0}")]
    Definite(String),
    /// The slot was invalidated: WAL is gone; the message says what to do.
    #[error("{0}")]
    SlotLost(String),
    /// A query failed.
    #[error("could not {what}")]
    Query {
        /// What was being done.
        what: &'static str,
        /// The database error.
        #[source]
        source: tokio_postgres::Error,
    },
    /// The `[source]` connection settings cannot be used, or the SQL
    /// session's TLS setup failed before connecting (a missing
    /// `sslrootcert`).
    #[error(transparent)]
    Connect(#[from] walhook_pgtls::ConnectError),
    /// The replication stream's TLS failed (the SQL session, connected
    /// first with the same policy, gets walhook's own detailed errors).
    #[error(
        "TLS on the replication connection failed (sslmode={mode}, trusting {roots}); check sslrootcert, the server's certificate and its host name as for the SQL session"
    )]
    ReplicationTls {
        /// The mode in force.
        mode: walhook_pgtls::SslMode,
        /// The roots, described.
        roots: String,
        /// pgwire-replication's error.
        #[source]
        source: pgwire_replication::PgWireError,
    },
    /// The replication stream failed.
    #[error("the replication stream failed")]
    Stream(#[source] pgwire_replication::PgWireError),
    /// The stream sent a message the decoder refused.
    #[error("undecodable replication message")]
    Decode(#[source] super::pgoutput::DecodeError),
    /// Downstream refused the events.
    #[error("the sink failed")]
    Sink(#[from] walhook_pipeline::capture::SinkError),
}

impl CaptureError {
    /// A mapper for `map_err` on queries.
    pub fn query(what: &'static str) -> impl FnOnce(tokio_postgres::Error) -> CaptureError {
        move |source| CaptureError::Query { what, source }
    }

    /// Whether restarting capture may succeed without the operator.
    pub fn is_transient(&self) -> bool {
        match self {
            CaptureError::Query { source, .. } => {
                // A certificate that does not verify stays so until the
                // operator acts; the connector's error says so by type.
                if let Some(e) = walhook_pgtls::find_connect_error(source) {
                    return e.is_transient();
                }
                source.as_db_error().is_none() || source.is_closed()
            }
            CaptureError::Connect(e) => e.is_transient(),
            CaptureError::Stream(e) => {
                let text = e.to_string();
                e.is_transient()
                    || text.contains("is active for PID")
                    || text.contains("terminating connection")
                    || text.contains("the database system is")
            }
            CaptureError::Sink(_) => true,
            _ => false,
        }
    }
}
