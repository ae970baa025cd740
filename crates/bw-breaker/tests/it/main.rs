//! Integration tests of bw-breaker against a real redis-server (spawned per test by bw-testkit).

mod scripts;
mod support;
