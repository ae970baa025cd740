//! Integration tests of bw-ingest against a real nats-server (JetStream) spawned per test.
//!
//! Each test starts its own server and runs the real `run_on` in-process; producers talk to it through
//! `bw-client`, raw NATS requests and HTTP; Meta is played by signed HTTP POSTs of its documented payloads.

mod accounts;
mod callback;
mod feed;
mod intake;
mod limits;
mod reconcile;
mod shared;
mod signals;
mod support;
mod tenancy;
mod webhooks;
