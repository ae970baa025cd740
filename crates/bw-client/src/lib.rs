//! Breakwater producer client: builds `SendRequest`s and submits them to ingest over NATS request/reply.
//!
//! [`Client::send`] publishes the request on `bw.send.v1.<phone_number_id>` and waits for the `IntakeReply`.
//! On a timeout or when no ingest instance is listening it retries with the same operation id, which is safe:
//! ingest deduplicates by operation id, so a request is stored at most once however often it is sent. A
//! rejected request is returned as a reply (`accepted == false`) without retrying, except
//! `REJECT_REASON_UNAVAILABLE`, which is retried like a timeout.
//!
//! Must not: invent operation ids on retry, or log message bodies and recipients.
//!
//! A producer is a tenant of the sender registry (docs/producers.md): it connects as its tenant's NATS user
//! `producer-<tenant>` with the inbox prefix `_INBOX_<tenant>` ([`tenant_options`]); ingest answers nowhere
//! else, and sends only from the tenant's own numbers.
//!
//! Following outcomes: [`follow`] binds the tenant's one durable consumer `feed-<tenant>` on the outcome feed
//! (BW_FEED, `bw.feed.v1.<tenant>.>` or one number's `bw.feed.v1.<tenant>.<phone_number_id>.>`), and
//! [`Client::status`] asks where one operation is. Both show the producer's own operation ids.
//!
//! Entry points: [`tenant_options`], [`Client::new`], [`Client::send`], [`Client::status`], [`follow`],
//! [`Request`] (builder).

use bw_proto::v1::{
    Category, IntakeReply, OutcomeEvent, RejectReason, SendRequest, StatusQuery, StatusReply, TemplatePayload,
    TextPayload, send_request::Payload,
};
use bw_wire::names;
use bw_wire::tenancy;
use prost::Message as _;
use std::collections::BTreeMap;
use std::time::Duration;

/// Why a send could not get an answer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No reply within the timeout on any try (ingest down, overloaded or unreachable).
    #[error("no reply from ingest for operation `{operation_id}` after {tries} tries: {last}")]
    NoReply { operation_id: String, tries: u32, last: String },
    /// Ingest answered, but not with an `IntakeReply`.
    #[error("reply for operation `{0}` is not an IntakeReply")]
    BadReply(String),
    /// The request could not be published (connection closed).
    #[error("cannot publish operation `{operation_id}`: {detail}")]
    Publish { operation_id: String, detail: String },
}

/// Retry and timeout settings.
#[derive(Debug, Clone)]
pub struct Options {
    /// How long to wait for one reply.
    pub timeout: Duration,
    /// Total tries (1 = no retry).
    pub tries: u32,
    /// Pause before the first retry; doubles after each retry.
    pub backoff: Duration,
    /// Longest pause between tries.
    pub max_backoff: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            timeout: Duration::from_secs(5),
            tries: 5,
            backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(2),
        }
    }
}

/// A producer client over an existing NATS connection. Cheap to clone.
#[derive(Clone)]
pub struct Client {
    nats: async_nats::Client,
    options: Options,
}

impl Client {
    /// A client with the default [`Options`].
    pub fn new(nats: async_nats::Client) -> Client {
        Client { nats, options: Options::default() }
    }

    /// A client with explicit options.
    pub fn with_options(nats: async_nats::Client, options: Options) -> Client {
        Client { nats, options }
    }

    /// Submits a request and returns ingest's answer (accepted, duplicate, or rejected with a reason).
    ///
    /// Retries timeouts, "no responders" and `REJECT_REASON_UNAVAILABLE` with the same operation id.
    pub async fn send(&self, request: &SendRequest) -> Result<IntakeReply, Error> {
        let subject = names::intake_subject(&request.phone_number_id);
        let payload: bytes::Bytes = request.encode_to_vec().into();
        let op = request.operation_id.clone();
        let tries = self.options.tries.max(1);
        let mut backoff = self.options.backoff;
        let mut last = String::new();
        for attempt in 1..=tries {
            let mut headers = async_nats::HeaderMap::new();
            bw_wire::trace::inject(&tracing::Span::current(), &mut headers);
            let req = async_nats::Request::new()
                .payload(payload.clone())
                .headers(headers)
                .timeout(Some(self.options.timeout));
            match self.nats.send_request(subject.clone(), req).await {
                Ok(msg) => {
                    let reply = IntakeReply::decode(msg.payload.as_ref()).map_err(|_| Error::BadReply(op.clone()))?;
                    if reply.accepted || reply.reason() != RejectReason::Unavailable {
                        return Ok(reply);
                    }
                    last = format!("ingest unavailable: {}", reply.error);
                }
                Err(e) => {
                    use async_nats::RequestErrorKind::*;
                    match e.kind() {
                        TimedOut | NoResponders => last = e.to_string(),
                        _ => return Err(Error::Publish { operation_id: op, detail: e.to_string() }),
                    }
                }
            }
            if attempt < tries {
                tracing::debug!(operation_id = %op, attempt, reason = %last, "retrying send");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(self.options.max_backoff);
            }
        }
        Err(Error::NoReply { operation_id: op, tries, last })
    }

    /// Asks ingest where an operation is (`bw.status.v1.<phone_number_id>`): the current state and its journey.
    /// `found == false` when the sender has no such operation. Retries timeouts like [`Client::send`].
    pub async fn status(&self, phone_number_id: &str, operation_id: &str) -> Result<StatusReply, Error> {
        let subject = names::status_subject(phone_number_id);
        let payload: bytes::Bytes = StatusQuery { operation_id: operation_id.to_string() }.encode_to_vec().into();
        let op = operation_id.to_string();
        let tries = self.options.tries.max(1);
        let mut backoff = self.options.backoff;
        let mut last = String::new();
        for attempt in 1..=tries {
            let req = async_nats::Request::new().payload(payload.clone()).timeout(Some(self.options.timeout));
            match self.nats.send_request(subject.clone(), req).await {
                Ok(msg) => return StatusReply::decode(msg.payload.as_ref()).map_err(|_| Error::BadReply(op.clone())),
                Err(e) => {
                    use async_nats::RequestErrorKind::*;
                    match e.kind() {
                        TimedOut | NoResponders => last = e.to_string(),
                        _ => return Err(Error::Publish { operation_id: op, detail: e.to_string() }),
                    }
                }
            }
            if attempt < tries {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(self.options.max_backoff);
            }
        }
        Err(Error::NoReply { operation_id: op, tries, last })
    }
}

/// Connect options of `tenant`'s producer connection: its NATS user `producer-<tenant>` with `password`, and
/// its inbox prefix `_INBOX_<tenant>`, the only subjects its user may subscribe to and the only ones ingest
/// replies to. Add servers, TLS or a name as usual, then `.connect(url)`.
pub fn tenant_options(tenant: &str, password: impl Into<String>) -> async_nats::ConnectOptions {
    with_tenant_inbox(
        async_nats::ConnectOptions::with_user_and_password(tenancy::nats_user(tenant), password.into()),
        tenant,
    )
}

/// `options` with `tenant`'s inbox prefix (for connections that authenticate otherwise, e.g. with a token or
/// credentials file).
pub fn with_tenant_inbox(options: async_nats::ConnectOptions, tenant: &str) -> async_nats::ConnectOptions {
    options.custom_inbox_prefix(tenancy::inbox_prefix(tenant))
}

/// Follows `tenant`'s outcomes through its durable consumer `feed-<tenant>` on BW_FEED: every state change of
/// every operation of the tenant, or of one of its numbers with `sender`, from where the consumer left off.
/// The filter is set (or changed) with the create request that carries it in its subject, the only one a
/// tenant's NATS user may use, and nothing reads the stream's info (a tenant may not list the feed's subjects).
/// Ack each [`FeedItem`] once handled; an unacked event comes again after 30 s. Events carry the producer's own
/// operation ids.
pub async fn follow(
    js: &async_nats::jetstream::Context,
    tenant: &str,
    sender: Option<&str>,
) -> Result<Feed, FeedError> {
    use async_nats::jetstream::consumer;
    if !tenancy::valid_tenant(tenant) {
        return Err(FeedError("tenant must be 1..=32 characters of [a-z0-9-]".into()));
    }
    let name = tenancy::feed_consumer(tenant);
    let filter = match sender {
        Some(phone) => tenancy::feed_sender_filter(tenant, phone),
        None => tenancy::feed_filter(tenant),
    };
    let stream = js.get_stream_no_info(names::FEED_STREAM).await.map_err(|e| FeedError(e.to_string()))?;
    let config = consumer::pull::Config {
        name: Some(name.clone()),
        durable_name: Some(name),
        filter_subject: filter,
        ack_policy: consumer::AckPolicy::Explicit,
        ack_wait: Duration::from_secs(30),
        ..Default::default()
    };
    // Create or update: an existing consumer of the tenant keeps its position and takes this filter.
    let consumer: consumer::PullConsumer =
        stream.create_consumer(config).await.map_err(|e| FeedError(e.to_string()))?;
    let messages = consumer.messages().await.map_err(|e| FeedError(e.to_string()))?;
    Ok(Feed { messages, sender: sender.map(str::to_string) })
}

/// The feed could not be followed (stream or consumer unavailable).
#[derive(Debug, thiserror::Error)]
#[error("outcome feed unavailable: {0}")]
pub struct FeedError(String);

/// A stream of outcome events (see [`follow`]).
pub struct Feed {
    messages: async_nats::jetstream::consumer::pull::Stream,
    /// The one number followed, if any.
    sender: Option<String>,
}

/// One event with its acknowledgement handle.
pub struct FeedItem {
    pub event: OutcomeEvent,
    message: async_nats::jetstream::Message,
}

impl FeedItem {
    /// Marks the event handled (the durable consumer moves past it).
    #[expect(
        clippy::disallowed_methods,
        reason = "the producer's own acknowledgement; producers do not link bw-common"
    )]
    pub async fn ack(&self) -> Result<(), FeedError> {
        self.message.ack().await.map_err(|e| FeedError(e.to_string()))
    }
}

impl Feed {
    /// The next event; None when the connection closes. Undecodable messages are acked and skipped, and so are
    /// events of another number when one number is followed: a consumer whose filter was narrowed still
    /// redelivers what it handed out under the broader filter, and the narrower follow has moved past them.
    #[expect(clippy::disallowed_methods, reason = "the producer client skips what it cannot decode; no bw-common here")]
    pub async fn next(&mut self) -> Option<Result<FeedItem, FeedError>> {
        use futures::StreamExt;
        loop {
            match self.messages.next().await? {
                Ok(message) => match OutcomeEvent::decode(message.payload.as_ref()) {
                    Ok(event) if self.sender.as_ref().is_none_or(|s| *s == event.phone_number_id) => {
                        return Some(Ok(FeedItem { event, message }));
                    }
                    _ => {
                        let _ = message.ack().await;
                    }
                },
                Err(e) => return Some(Err(FeedError(e.to_string()))),
            }
        }
    }
}

/// Builder of a [`SendRequest`].
///
/// ```text
/// let request = Request::text("order-42-confirm", "1001", "2002", "+5491155551234", "Your order shipped")
///     .category(Category::Transactional)
///     .deadline_unix_ms(now + 60_000)
///     .label("order", "42")
///     .build();
/// ```
#[derive(Debug, Clone)]
pub struct Request {
    inner: SendRequest,
}

impl Request {
    fn base(operation_id: &str, waba_id: &str, phone_number_id: &str, recipient: &str, payload: Payload) -> Request {
        Request {
            inner: SendRequest {
                operation_id: operation_id.to_string(),
                waba_id: waba_id.to_string(),
                phone_number_id: phone_number_id.to_string(),
                recipient: recipient.to_string(),
                category: Category::Transactional as i32,
                payload: Some(payload),
                ..Default::default()
            },
        }
    }

    /// A free-form text message (category transactional unless changed).
    pub fn text(operation_id: &str, waba_id: &str, phone_number_id: &str, recipient: &str, body: &str) -> Request {
        let payload = Payload::Text(TextPayload { body: body.to_string(), preview_url: false });
        Request::base(operation_id, waba_id, phone_number_id, recipient, payload)
    }

    /// A template message with positional body parameters (category transactional unless changed).
    pub fn template(
        operation_id: &str,
        waba_id: &str,
        phone_number_id: &str,
        recipient: &str,
        name: &str,
        language: &str,
    ) -> Request {
        let payload = Payload::Template(TemplatePayload {
            name: name.to_string(),
            language: language.to_string(),
            ..Default::default()
        });
        Request::base(operation_id, waba_id, phone_number_id, recipient, payload)
    }

    /// Sets the category (decides the priority lane).
    pub fn category(mut self, category: Category) -> Request {
        self.inner.category = category as i32;
        self
    }

    /// Appends a template body parameter (ignored for text messages).
    pub fn param(mut self, value: &str) -> Request {
        if let Some(Payload::Template(t)) = &mut self.inner.payload {
            t.body_parameters.push(value.to_string());
        }
        self
    }

    /// Sets raw template components (a JSON array), replacing the body parameters.
    pub fn components_json(mut self, json: &str) -> Request {
        if let Some(Payload::Template(t)) = &mut self.inner.payload {
            t.components_json = json.to_string();
        }
        self
    }

    /// Enables the link preview of a text message.
    pub fn preview_url(mut self, on: bool) -> Request {
        if let Some(Payload::Text(t)) = &mut self.inner.payload {
            t.preview_url = on;
        }
        self
    }

    /// Sets a deadline (Unix ms); past it the message is never sent.
    pub fn deadline_unix_ms(mut self, deadline: i64) -> Request {
        self.inner.deadline_unix_ms = deadline;
        self
    }

    /// Tells when the recipient last wrote (Unix ms), for the 24 h window rule.
    pub fn customer_last_inbound_unix_ms(mut self, at: i64) -> Request {
        self.inner.customer_last_inbound_unix_ms = at;
        self
    }

    /// Adds a label (no personal data).
    pub fn label(mut self, key: &str, value: &str) -> Request {
        self.inner.labels.insert(key.to_string(), value.to_string());
        self
    }

    /// Replaces all labels.
    pub fn labels(mut self, labels: BTreeMap<String, String>) -> Request {
        self.inner.labels = labels;
        self
    }

    /// The finished request.
    pub fn build(self) -> SendRequest {
        self.inner
    }
}

#[cfg(test)]
mod tests;
