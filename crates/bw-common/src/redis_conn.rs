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
use redis::{Cmd, IntoConnectionInfo, Pipeline, RedisFuture, Value};
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

/// What a connection sends with `AUTH` (none when `password` is None).
#[derive(Clone, Default)]
struct Credentials {
    username: Option<String>,
    password: Option<String>,
}

impl Credentials {
    fn of(cfg: &RedisConfig) -> anyhow::Result<Credentials> {
        let given = |s: &str| Some(s.to_string()).filter(|s| !s.is_empty());
        let (username, password) = (given(&cfg.username), given(&cfg.password));
        if username.is_some() && password.is_none() {
            anyhow::bail!("redis.username is set without redis.password (an ACL user authenticates with both)");
        }
        Ok(Credentials { username, password })
    }
}

/// Connects as the config says (cluster when `cluster_nodes` is set), retrying for up to `wait` while Redis is
/// not reachable. `redis.password` (and `redis.username`) are sent with `AUTH` on every connection, reconnections
/// included, and win over credentials in the URLs. A refused or missing password fails at once with what to
/// fix (retrying cannot mend it); no error or log line carries the password.
pub async fn connect_config(cfg: &RedisConfig, wait: Duration) -> anyhow::Result<RedisConn> {
    let timeout = Duration::from_millis(cfg.timeout_ms);
    let credentials = Credentials::of(cfg)?;
    if cfg.cluster_nodes.is_empty() {
        Ok(RedisConn::Single(connect_single(&cfg.url, &credentials, timeout, wait).await?))
    } else {
        Ok(RedisConn::Cluster(connect_nodes(&cfg.cluster_nodes, &credentials, timeout, wait).await?))
    }
}

/// Connects a `ConnectionManager` (auto-reconnecting) with the URL's own credentials, if any, retrying for up
/// to `wait`. Services connect through [`connect_config`].
pub async fn connect(url: &str, timeout: Duration, wait: Duration) -> anyhow::Result<ConnectionManager> {
    connect_single(url, &Credentials::default(), timeout, wait).await
}

async fn connect_single(
    url: &str,
    credentials: &Credentials,
    timeout: Duration,
    wait: Duration,
) -> anyhow::Result<ConnectionManager> {
    let info = url.into_connection_info().map_err(|e| anyhow::anyhow!("invalid redis url: {:?}", e.kind()))?;
    let mut settings = info.redis_settings().clone();
    if let Some(username) = &credentials.username {
        settings = settings.set_username(username);
    }
    if let Some(password) = &credentials.password {
        settings = settings.set_password(password);
    }
    let client = redis::Client::open(info.set_redis_settings(settings))
        .map_err(|e| anyhow::anyhow!("invalid redis url: {:?}", e.kind()))?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout.max(Duration::from_millis(200))))
        .set_response_timeout(Some(timeout))
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_millis(500));
    retry(wait, || async {
        let mut conn = ConnectionManager::new_with_config(client.clone(), config.clone()).await?;
        // A server with a password answers a connection that sent none with NOAUTH, only at its first command.
        redis::cmd("PING").query_async::<String>(&mut conn).await?;
        Ok(conn)
    })
    .await
}

/// Connects to a Redis Cluster through any of its seed nodes, with the URLs' own credentials, if any, retrying
/// for up to `wait`. The cluster must be up (all slots covered): a half-formed cluster counts as not reachable
/// yet. Services connect through [`connect_config`].
pub async fn connect_cluster(nodes: &[String], timeout: Duration, wait: Duration) -> anyhow::Result<ClusterConnection> {
    connect_nodes(nodes, &Credentials::default(), timeout, wait).await
}

async fn connect_nodes(
    nodes: &[String],
    credentials: &Credentials,
    timeout: Duration,
    wait: Duration,
) -> anyhow::Result<ClusterConnection> {
    let mut builder = ClusterClientBuilder::new(nodes.to_vec())
        .connection_timeout(timeout.max(Duration::from_millis(200)))
        .response_timeout(timeout)
        .retries(2)
        .max_retry_wait(500);
    if let Some(username) = &credentials.username {
        builder = builder.username(username);
    }
    if let Some(password) = &credentials.password {
        builder = builder.password(password);
    }
    let client = builder.build().map_err(|e| anyhow::anyhow!("invalid redis cluster nodes: {:?}", e.kind()))?;
    retry(wait, || async {
        let mut conn = client.get_async_connection().await?;
        // The client connects before the slot map is complete; a command proves the cluster serves.
        redis::cmd("PING").query_async::<String>(&mut conn).await?;
        Ok(conn)
    })
    .await
}

/// What to fix when Redis refused this connection's credentials (or their absence): a deployment error that
/// retrying cannot mend. None for every other error. The texts name config keys, never a value.
fn access_refused(e: &redis::RedisError) -> Option<&'static str> {
    // The cluster client reports a node's refusal as an I/O error whose detail is that node's error.
    let detail = e.detail().unwrap_or_default();
    let says = |code: &str| e.code() == Some(code) || detail.contains(code);
    if e.kind() == redis::ErrorKind::AuthenticationFailed || says("AuthenticationFailed") || says("WRONGPASS") {
        Some(
            "redis refused the credentials: check redis.password (env BW_<SERVICE>__REDIS__PASSWORD) and, for an \
             ACL user, redis.username",
        )
    } else if says("NOAUTH") {
        Some("redis requires a password and none was sent: set redis.password (env BW_<SERVICE>__REDIS__PASSWORD)")
    } else if says("NOPERM") {
        Some("the redis user may not run the commands Breakwater needs: check its ACL rules (redis.username)")
    } else {
        None
    }
}

async fn retry<T, F, Fut>(wait: Duration, mut attempt: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = redis::RedisResult<T>>,
{
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let e = match attempt().await {
            Ok(conn) => return Ok(conn),
            Err(e) => e,
        };
        // The error's kind, code and detail never carry the password: the client sends it, never echoes it.
        if let Some(fix) = access_refused(&e) {
            return Err(anyhow::anyhow!("{fix}"));
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(anyhow::anyhow!("redis not reachable: {:?} {}", e.kind(), e.detail().unwrap_or("")));
        }
        tracing::warn!(error = ?e.kind(), "redis not reachable yet; retrying");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// PING with a timeout; true when Redis answered (on a cluster: the node the client picks).
pub async fn ping<C: ConnectionLike + Send>(conn: &mut C) -> bool {
    let cmd = redis::cmd("PING");
    let fut = cmd.query_async::<String>(conn);
    matches!(tokio::time::timeout(Duration::from_millis(500), fut).await, Ok(Ok(_)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bw_testkit::{RedisCluster, RedisServer};

    const PASSWORD: &str = "s3cret-redis-password";
    const WRONG: &str = "not-the-redis-password";
    const WAIT: Duration = Duration::from_secs(10);

    fn single(url: String, password: &str) -> RedisConfig {
        RedisConfig { password: password.into(), timeout_ms: 1000, ..RedisConfig::single(url) }
    }

    /// A Lua script through EVALSHA (EVAL on its first call), the way every breaker call reaches Redis.
    async fn script_runs(conn: &mut RedisConn, key: &str) -> bool {
        let script = redis::Script::new("redis.call('SET', KEYS[1], ARGV[1]) return redis.call('GET', KEYS[1])");
        matches!(script.key(key).arg("ok").invoke_async::<String>(conn).await.as_deref(), Ok("ok"))
    }

    /// Connecting with `cfg` fails at once with an error naming what to fix, and no password in it.
    async fn refused(cfg: &RedisConfig, fix: &str) {
        let error = match connect_config(cfg, WAIT).await {
            Ok(_) => panic!("connected with {cfg:?}"),
            Err(e) => format!("{e:#}"),
        };
        assert!(error.contains(fix) && error.contains("redis.password"), "{error}");
        assert!(!error.contains(PASSWORD) && !error.contains(WRONG), "a password leaked: {error}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_single_node_takes_the_right_password_and_refuses_none_or_a_wrong_one() {
        let mut server = RedisServer::start_with_password(PASSWORD);
        let mut conn = connect_config(&single(server.url(), PASSWORD), WAIT).await.expect("the right password");
        assert!(script_runs(&mut conn, "bw:auth:1").await);
        // Reconnections authenticate too.
        tokio::task::block_in_place(|| server.restart());
        let after_restart = bw_testkit::wait_until(WAIT, || {
            let mut conn = conn.clone();
            async move { script_runs(&mut conn, "bw:auth:2").await }
        });
        assert!(after_restart.await, "the connection came back with AUTH");
        refused(&single(server.url(), ""), "requires a password and none was sent").await;
        refused(&single(server.url(), WRONG), "refused the credentials").await;
    }

    #[tokio::test]
    async fn an_acl_user_connects_with_its_username_and_password() {
        let server = RedisServer::start_with_password(PASSWORD);
        let mut admin = connect_config(&single(server.url(), PASSWORD), WAIT).await.expect("default user");
        redis::cmd("ACL")
            .arg(&["SETUSER", "bw-dispatcher", "on", &format!(">{WRONG}x"), "~bw:*", "+@all"][..])
            .query_async::<()>(&mut admin)
            .await
            .expect("acl user");
        let user = |password: &str| RedisConfig { username: "bw-dispatcher".into(), ..single(server.url(), password) };
        let mut conn = connect_config(&user(&format!("{WRONG}x")), WAIT).await.expect("the ACL user");
        assert!(script_runs(&mut conn, "bw:auth:acl").await);
        refused(&user(PASSWORD), "refused the credentials").await;
        let error = connect_config(&user(""), WAIT).await.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(error.contains("redis.username is set without redis.password"), "{error}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cluster_takes_the_right_password_and_refuses_none_or_a_wrong_one() {
        let cluster = RedisCluster::start_with_password(PASSWORD);
        let nodes = |password: &str| RedisConfig {
            cluster_nodes: cluster.urls(),
            ..single("redis://unused.invalid:6379/".into(), password)
        };
        let mut conn = connect_config(&nodes(PASSWORD), WAIT).await.expect("the right password");
        assert_eq!(conn.kind(), "cluster");
        // Keys of many slots, spread over the masters: each node's connection authenticates.
        for i in 0..12 {
            assert!(script_runs(&mut conn, &format!("bw:auth:{{{i}}}")).await, "key {i}");
        }
        refused(&nodes(""), "requires a password and none was sent").await;
        refused(&nodes(WRONG), "refused the credentials").await;
    }
}
