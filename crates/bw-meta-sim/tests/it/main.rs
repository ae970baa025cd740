//! Tests of the Meta simulator through its HTTP surface, with reqwest as the client and a tiny axum receiver
//! for webhooks.

mod account;
mod ambiguous;
mod binary;
mod codes;
mod common;
mod faults;
mod limits;
mod oracle;
mod pacing;
mod portfolio;
mod scopes;
mod users;
mod versions;
mod webhooks;
