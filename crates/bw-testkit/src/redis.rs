//! A real `redis-server` on a free loopback port, no persistence unless asked.

use crate::process::{ServerKind, ServerProcess};
use std::ffi::OsString;

/// A real `redis-server` on a free loopback port, no persistence unless asked.
pub struct RedisServer(ServerProcess);

fn kind() -> ServerKind {
    ServerKind {
        name: "redis-server",
        bin_env: "REDIS_SERVER_BIN",
        dir_prefix: "bw-redis-",
        log_file: "redis.log",
        base_args: |port, dir, log| {
            let mut args: Vec<OsString> = vec!["--port".into(), port.to_string().into()];
            args.extend(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir"].map(OsString::from));
            args.push(dir.into());
            args.push("--logfile".into());
            args.push(log.into());
            args
        },
    }
}

impl RedisServer {
    /// Starts a server with persistence off.
    pub fn start() -> RedisServer {
        Self::start_with_args(Vec::new())
    }

    /// Starts a server that requires `password` (`requirepass`): a client must send it with `AUTH`.
    pub fn start_with_password(password: &str) -> RedisServer {
        Self::start_with_args(vec!["--requirepass".into(), password.into()])
    }

    /// Starts a server with extra arguments (for example cluster mode).
    pub fn start_with_args(extra_args: Vec<String>) -> RedisServer {
        RedisServer(ServerProcess::new(kind(), |_| extra_args, &[]).start())
    }

    /// OS process id while running (benchmarks read its CPU time from `/proc`).
    pub fn pid(&self) -> Option<u32> {
        self.0.pid()
    }

    /// Client URL, `redis://127.0.0.1:<port>/`, without credentials (a password goes with `AUTH`).
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.0.port())
    }

    /// TCP port.
    pub fn port(&self) -> u16 {
        self.0.port()
    }

    /// kill -9 the server. With persistence off its data is gone.
    pub fn kill(&mut self) {
        self.0.kill();
    }

    /// Graceful stop.
    pub fn stop(&mut self) {
        self.0.stop();
    }

    /// Starts the server again on the same port.
    pub fn restart(&mut self) {
        self.0.restart();
    }
}
