//! Test kit: real `nats-server` (JetStream) and `redis-server` processes on free loopback ports, each in its
//! own temp dir, with stop / kill -9 / restart for fault injection, plus [`wait_until`].
//!
//! Only ever a dev-dependency. Binaries are found on `PATH`, or at `NATS_SERVER_BIN` / `REDIS_SERVER_BIN`;
//! `scripts/setup.sh` installs both on a fresh machine. Both servers are one process type (`process.rs`,
//! `ServerProcess`) with their own arguments ([`NatsServer`], [`RedisServer`]); clusters are several of them.

mod cluster;
mod nats;
mod ports;
mod process;
mod redis;
mod wait;

pub use cluster::{NatsCluster, RedisCluster};
pub use nats::NatsServer;
pub use ports::free_port;
pub use redis::RedisServer;
pub use wait::{check_pacing, wait_until};
