//! Redis connection with bounded retry at start-up. Runtime failures are handled by callers
//! (the breaker library falls back to a local conservative mode).

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use std::time::Duration;

/// Connects a `ConnectionManager` (auto-reconnecting), retrying for up to `wait`.
pub async fn connect(url: &str, timeout: Duration, wait: Duration) -> anyhow::Result<ConnectionManager> {
    let client = redis::Client::open(url).map_err(|e| anyhow::anyhow!("invalid redis url: {e}"))?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout.max(Duration::from_millis(200))))
        .set_response_timeout(Some(timeout))
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_millis(500));
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match ConnectionManager::new_with_config(client.clone(), config.clone()).await {
            Ok(conn) => return Ok(conn),
            Err(e) if tokio::time::Instant::now() < deadline => {
                tracing::warn!(error = %e, "redis not reachable yet; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(anyhow::anyhow!("redis not reachable: {e}")),
        }
    }
}

/// PING with a timeout; true when Redis answered.
pub async fn ping(conn: &mut ConnectionManager) -> bool {
    let cmd = redis::cmd("PING");
    let fut = cmd.query_async::<String>(conn);
    matches!(tokio::time::timeout(Duration::from_millis(500), fut).await, Ok(Ok(_)))
}
