//! End-to-end tests: real nats-server, redis-server, the Meta simulator, and the real services.

mod crash;
mod defaults;
mod dispatch;
mod examples;
mod flow;
mod fuzz;
mod incident;
mod order;
mod outage;
mod permissions;
mod priority;
mod redaction;
mod resilience;
mod skeleton;
mod tracing;
