//! The state every handler shares.

use crate::{config::Config, keys, view};
use std::sync::Arc;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// What every handler shares.
pub struct App {
    pub cfg: Config,
    pub js: async_nats::jetstream::Context,
    pub buckets: bw_common::nats::Buckets,
    pub redis: Option<bw_common::redis_conn::RedisConn>,
    pub auth: keys::Auth,
    /// The latest view; a new value at most once per refresh.
    pub view: watch::Receiver<Arc<view::View>>,
    /// Asks the refresher for a new view now (after an action).
    pub refresh_now: Arc<tokio::sync::Notify>,
    /// Actions started in the background (incident replays), awaited on shutdown.
    pub tasks: tokio_util::task::TaskTracker,
    /// Cancelled at shutdown: live-refresh streams end, so the server can stop.
    pub stop: CancellationToken,
}

/// Shared handle of [`App`].
pub type Shared = Arc<App>;
