//! The breaker's error type and its Redis call helpers.

/// Why a non-send-path breaker call failed.
#[derive(Debug, thiserror::Error)]
pub enum BreakerError {
    #[error("breaker has no redis connection")]
    NoRedis,
    #[error("redis call `{script}` timed out after {timeout_ms} ms")]
    Timeout { script: &'static str, timeout_ms: u64 },
    #[error("redis call failed: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("unexpected script reply: {0}")]
    BadReply(String),
}

/// Redis connection: a single node or a cluster (every key of a scope shares one hash tag, so the same
/// scripts run unchanged on both). Defined in `bw_common::redis_conn`, shared by every service.
pub use bw_common::redis_conn::RedisConn;

pub(crate) async fn invoke(conn: &RedisConn, inv: &redis::ScriptInvocation<'_>) -> redis::RedisResult<redis::Value> {
    let mut conn = conn.clone();
    inv.invoke_async(&mut conn).await
}

pub(crate) async fn sadd(conn: &RedisConn, key: &str, member: &str) -> redis::RedisResult<()> {
    let mut conn = conn.clone();
    redis::cmd("SADD").arg(key).arg(member).query_async::<()>(&mut conn).await
}
