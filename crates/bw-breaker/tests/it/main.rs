//! Integration tests of bw-breaker against a real redis-server (spawned per test by bw-testkit).

mod adaptive;
mod breaker;
mod budget;
mod cluster;
mod evidence;
mod faults;
mod late;
mod limits;
mod model;
mod order;
mod pair;
mod pool;
mod quota_signal;
mod scopes;
mod scripts;
mod support;
mod template_rules;
mod templates;
mod throughput;
