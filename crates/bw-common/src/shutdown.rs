//! Shutdown: one `CancellationToken` cancelled on SIGTERM or SIGINT, passed down to every task.
//! A second signal exits the process at once.

use tokio_util::sync::CancellationToken;

/// Returns a token cancelled on the first SIGTERM/SIGINT; a second signal exits with status 130.
pub fn signal_token() -> CancellationToken {
    let token = CancellationToken::new();
    let child = token.clone();
    tokio::spawn(async move {
        wait_signal().await;
        tracing::info!("shutdown signal received; finishing in-flight work (signal again to force)");
        child.cancel();
        wait_signal().await;
        tracing::warn!("second signal; exiting now");
        std::process::exit(130);
    });
    token
}

async fn wait_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
