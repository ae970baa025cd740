//! Redis connection with bounded retry at start-up: a single node (`redis.url`) or a Redis Cluster
//! (`redis.cluster_nodes`, seed nodes). Runtime failures are handled by callers (the breaker library falls back
//! to a local conservative mode).
//!
//! Both kinds reconnect on their own: the single node through a `ConnectionManager`, the cluster through the
//! redis crate's cluster client, which follows MOVED / ASK redirections and refreshes its slot map. Every key of
//! a scope shares one hash tag (`names::scope_key`), so each script touches one slot and runs unchanged on both.

use crate::config::RedisConfig;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};
use std::time::Duration;

/// A Redis connection of either kind; cheap to clone (clones share the connection). Use it like any redis
/// connection (`query_async(&mut conn)`, `invoke_async(&mut conn)`).
#[derive(Clone)]
pub enum RedisConn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl RedisConn {
    /// "single node" or "cluster", for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            RedisConn::Single(_) => "single node",
            RedisConn::Cluster(_) => "cluster",
        }
    }
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConn::Single(c) => c.req_packed_command(cmd),
            RedisConn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            RedisConn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            RedisConn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConn::Single(c) => c.get_db(),
            RedisConn::Cluster(c) => c.get_db(),
        }
    }
}

/// Connects as the config says (cluster when `cluster_nodes` is set), retrying for up to `wait`.
pub async fn connect_config(cfg: &RedisConfig, wait: Duration) -> anyhow::Result<RedisConn> {
    let timeout = Duration::from_millis(cfg.timeout_ms);
    if cfg.cluster_nodes.is_empty() {
        Ok(RedisConn::Single(connect(&cfg.url, timeout, wait).await?))
    } else {
        Ok(RedisConn::Cluster(connect_cluster(&cfg.cluster_nodes, timeout, wait).await?))
    }
}

/// Connects a `ConnectionManager` (auto-reconnecting), retrying for up to `wait`.
pub async fn connect(url: &str, timeout: Duration, wait: Duration) -> anyhow::Result<ConnectionManager> {
    let client = redis::Client::open(url).map_err(|e| anyhow::anyhow!("invalid redis url: {:?}", e.kind()))?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout.max(Duration::from_millis(200))))
        .set_response_timeout(Some(timeout))
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_millis(500));
    retry(wait, || ConnectionManager::new_with_config(client.clone(), config.clone())).await
}

/// Connects to a Redis Cluster through any of its seed nodes, retrying for up to `wait`. The cluster must be
/// up (all slots covered): a half-formed cluster counts as not reachable yet.
pub async fn connect_cluster(nodes: &[String], timeout: Duration, wait: Duration) -> anyhow::Result<ClusterConnection> {
    let client = ClusterClientBuilder::new(nodes.to_vec())
        .connection_timeout(timeout.max(Duration::from_millis(200)))
        .response_timeout(timeout)
        .retries(2)
        .max_retry_wait(500)
        .build()
        .map_err(|e| anyhow::anyhow!("invalid redis cluster nodes: {:?}", e.kind()))?;
    retry(wait, || async {
        let mut conn = client.get_async_connection().await?;
        // The client connects before the slot map is complete; a command proves the cluster serves.
        redis::cmd("PING").query_async::<String>(&mut conn).await?;
        Ok(conn)
    })
    .await
}

async fn retry<T, F, Fut>(wait: Duration, mut attempt: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = redis::RedisResult<T>>,
{
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match attempt().await {
            Ok(conn) => return Ok(conn),
            // The error's kind and detail never carry the URL's password.
            Err(e) if tokio::time::Instant::now() < deadline => {
                tracing::warn!(error = ?e.kind(), "redis not reachable yet; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(anyhow::anyhow!("redis not reachable: {:?} {}", e.kind(), e.detail().unwrap_or(""))),
        }
    }
}

/// PING with a timeout; true when Redis answered (on a cluster: the node the client picks).
pub async fn ping<C: ConnectionLike + Send>(conn: &mut C) -> bool {
    let cmd = redis::cmd("PING");
    let fut = cmd.query_async::<String>(conn);
    matches!(tokio::time::timeout(Duration::from_millis(500), fut).await, Ok(Ok(_)))
}
