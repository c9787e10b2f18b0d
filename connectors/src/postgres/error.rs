//! Capture's errors, each transient (retry) or definite (the operator acts).

use walhook_pipeline::capture::{SourceError, SourceErrorKind};
use walhook_pipeline::store::ErrorKind;

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
    /// The slot is gone although this source read from it before: a new
    /// slot would start at the current position and skip what the old one
    /// held, so capture stops until the operator accepts the gap.
    #[error(
        "replication slot {slot:?} does not exist, but source {source_name:?} has read from it up to {read_up_to}: \
         it was dropped, and the changes committed after {read_up_to} that it held cannot be read any more. \
         Capture has stopped rather than start a new slot and skip them without a trace. To go on from the \
         current position, start walhook once with --accept-slot-loss: it records the gap as a capture \
         incident (kind slot_reset, shown by `walhook reconcile`) and creates the slot (create_slot = true) \
         or asks you to; then re-send what the gap missed"
    )]
    SlotGone {
        /// The slot's name.
        slot: String,
        /// The source's name.
        source_name: String,
        /// How far this source had read (its last saved checkpoint).
        read_up_to: walhook_pipeline::ids::Lsn,
    },
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

    /// Whether restarting capture may succeed without the operator: decided
    /// from the SQLSTATE of a server error (see
    /// [`ErrorKind::of_sqlstate`]), or from the kind of a connection error.
    pub fn is_transient(&self) -> bool {
        self.kind() == SourceErrorKind::Transient
    }
}

impl SourceError for CaptureError {
    fn kind(&self) -> SourceErrorKind {
        if self.transient() {
            SourceErrorKind::Transient
        } else {
            SourceErrorKind::Definite
        }
    }
}

impl CaptureError {
    fn transient(&self) -> bool {
        match self {
            CaptureError::Query { source, .. } => {
                // A certificate that does not verify stays so until the
                // operator acts; the connector's error says so by type.
                if let Some(e) = walhook_pgtls::find_connect_error(source) {
                    return e.is_transient();
                }
                match source.code() {
                    Some(code) => ErrorKind::of_sqlstate(code.code()) == ErrorKind::Transient,
                    None => true,
                }
            }
            CaptureError::Connect(e) => e.is_transient(),
            CaptureError::Stream(e) => match e {
                pgwire_replication::PgWireError::Server(text) => sqlstate_in(text)
                    .is_some_and(|c| ErrorKind::of_sqlstate(c) == ErrorKind::Transient),
                e => e.is_transient(),
            },
            CaptureError::Sink(e) => e.is_transient(),
            _ => false,
        }
    }
}

/// The SQLSTATE of a server error as pgwire-replication renders it
/// (`… (SQLSTATE 55006)`): the crate keeps the code only in its text.
fn sqlstate_in(text: &str) -> Option<&str> {
    let at = text.rfind("SQLSTATE ")? + "SQLSTATE ".len();
    let code = text.get(at..at + 5)?;
    code.bytes()
        .all(|b| b.is_ascii_alphanumeric())
        .then_some(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_errors_are_classified_by_sqlstate() {
        let err = |t: &str| CaptureError::Stream(pgwire_replication::PgWireError::Server(t.into()));
        assert!(err("replication slot \"s\" is active for PID 7 (SQLSTATE 55006)").is_transient());
        assert!(
            err("terminating connection due to administrator command (SQLSTATE 57P01)")
                .is_transient()
        );
        assert!(!err("publication \"p\" does not exist (SQLSTATE 42704)").is_transient());
        assert!(!err("no code at all").is_transient());
        assert_eq!(sqlstate_in("x (SQLSTATE 57P03)"), Some("57P03"));
    }
}
