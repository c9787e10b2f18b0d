//! One module per subcommand.

pub mod api;
pub mod archive;
pub mod bench;
pub mod capture;
pub mod check_url;
pub mod demo;
pub mod dispatch;
pub mod fanout;
pub mod migrate;
pub mod reconcile;
pub mod run;
pub mod secrets;

use tokio_util::sync::CancellationToken;

/// A token cancelled by SIGINT or SIGTERM.
pub fn shutdown_on_signals() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot listen for SIGTERM");
                    return;
                }
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        tracing::info!("shutting down");
        t.cancel();
    });
    token
}
