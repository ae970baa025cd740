//! What happens to a JetStream message once its handler is done, decided as a value and applied in one place.
//!
//! Every consumer (dispatcher, replay, webhook processor, reconciler, alerting) has handlers that return a
//! [`Settle`]: a typed [`Disposition`] (ack / nak after a delay / term / in progress) and the service's own typed
//! result (an enum implementing [`Label`]). [`apply`] is the only code that talks to the broker about the
//! message: it acks, naks or terminates it, records the `result` span field and counts the result in the
//! service's metric; [`progress`] is the one way to extend a message's ack wait. A handler never calls `ack`
//! or `ack_with` itself: clippy's `disallowed-methods` (clippy.toml) refuses it outside this module, and tests
//! and tools that settle messages themselves say why with `#[expect(clippy::disallowed_methods, reason)]`.

use async_nats::jetstream::{self, AckKind};
use std::time::Duration;

/// Shortest and longest delay of a nak: JetStream redelivers at once below the first and a message should
/// never sleep in the broker longer than the second without a record of why.
pub const NAK_DELAY_MIN: Duration = Duration::from_millis(20);
/// See [`NAK_DELAY_MIN`].
pub const NAK_DELAY_MAX: Duration = Duration::from_secs(300);

/// What the broker is told about a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Done with it: the message has reached its next place (or needed nothing).
    Ack,
    /// Redeliver it after this delay (clamped to [`NAK_DELAY_MIN`]..=[`NAK_DELAY_MAX`]).
    Nak(Duration),
    /// Never redeliver it (its bytes were kept elsewhere first).
    Term,
    /// Still working on it: extend the ack wait.
    Progress,
}

impl Disposition {
    /// The JetStream acknowledgement for this disposition.
    pub fn ack_kind(self) -> AckKind {
        match self {
            Disposition::Ack => AckKind::Ack,
            Disposition::Nak(delay) => AckKind::Nak(Some(delay.clamp(NAK_DELAY_MIN, NAK_DELAY_MAX))),
            Disposition::Term => AckKind::Term,
            Disposition::Progress => AckKind::Progress,
        }
    }

    /// Short label for logs.
    pub fn label(self) -> &'static str {
        match self {
            Disposition::Ack => "ack",
            Disposition::Nak(_) => "nak",
            Disposition::Term => "term",
            Disposition::Progress => "progress",
        }
    }
}

/// A typed handler result with a stable label (metric label value and span field).
pub trait Label: Copy + std::fmt::Debug {
    /// The label, `snake_case`, stable across releases (dashboards use it).
    fn label(self) -> &'static str;
}

/// What a handler decided: what to tell the broker, and what happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settle<R> {
    pub disposition: Disposition,
    pub result: R,
}

impl<R> Settle<R> {
    /// Ack with this result.
    pub fn ack(result: R) -> Settle<R> {
        Settle { disposition: Disposition::Ack, result }
    }
    /// Nak with a redelivery delay.
    pub fn nak(result: R, delay: Duration) -> Settle<R> {
        Settle { disposition: Disposition::Nak(delay), result }
    }
    /// Terminate (no redelivery).
    pub fn term(result: R) -> Settle<R> {
        Settle { disposition: Disposition::Term, result }
    }
}

/// Runs a handler's `work` on `msg`, telling the broker the message is in progress every `every` until it
/// finishes (work that may outlast the ack wait: a large webhook delivery, a slow callback receiver).
pub async fn with_progress<T>(
    msg: &jetstream::Message,
    every: Duration,
    work: impl std::future::Future<Output = T>,
) -> T {
    tokio::pin!(work);
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    loop {
        tokio::select! {
            done = &mut work => return done,
            _ = tick.tick() => progress(msg).await,
        }
    }
}

/// Tells the broker the handler is still working on `msg` (extends its ack wait). A signal the broker does
/// not take changes nothing: the message is redelivered after its ack wait and settled again.
#[expect(clippy::disallowed_methods, reason = "the one place that extends a message's ack wait")]
pub async fn progress(msg: &jetstream::Message) {
    let _ = msg.ack_with(Disposition::Progress.ack_kind()).await;
}

/// Applies a handler's decision to its message: the acknowledgement, the `result` field of `span` and the
/// service's result counter (`count`). An acknowledgement the broker does not take is logged at debug level:
/// the message is then redelivered after its ack wait and the handler, being idempotent, settles it again.
#[expect(clippy::disallowed_methods, reason = "the one place that settles a consumer's message")]
pub async fn apply<R: Label>(
    msg: &jetstream::Message,
    settle: Settle<R>,
    span: &tracing::Span,
    count: impl FnOnce(&'static str),
) {
    let label = settle.result.label();
    span.record("result", label);
    count(label);
    if let Err(e) = msg.ack_with(settle.disposition.ack_kind()).await {
        tracing::debug!(parent: span, result = label, disposition = settle.disposition.label(), error = %e, "acknowledgement not taken; the broker will redeliver");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn naks_are_clamped_to_the_broker_window() {
        let nak = |d: Duration| match Disposition::Nak(d).ack_kind() {
            AckKind::Nak(Some(delay)) => delay,
            other => panic!("a nak became {other:?}"),
        };
        assert_eq!(nak(Duration::ZERO), NAK_DELAY_MIN);
        assert_eq!(nak(Duration::from_secs(3_600)), NAK_DELAY_MAX);
        assert_eq!(nak(Duration::from_secs(2)), Duration::from_secs(2));
        assert!(matches!(Disposition::Term.ack_kind(), AckKind::Term));
        assert!(matches!(Disposition::Progress.ack_kind(), AckKind::Progress));
        assert!(matches!(Disposition::Ack.ack_kind(), AckKind::Ack));
    }
}
