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
                source.as_db_error().is_none() || source.is_closed()
            }
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
