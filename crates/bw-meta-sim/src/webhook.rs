//! Status, inbound and account webhooks: Meta's envelope, signed with `X-Hub-Signature-256`, scheduled after
//! acceptance, batched per phone number, optionally duplicated, jittered or shuffled, retried with backoff when
//! the receiver fails, bounded by a queue capacity.
//!
//! Statuses go out under the WABA of their number (`entry[].id`), with `recipient_user_id` and a `contacts[]`
//! block when user ids are on (reference §4.4, §6): `recipient_user_id` on every status except the `failed`
//! status of a phone-addressed send; `contacts[]` on sent/delivered/read and never on failed; `recipient_id`
//! omitted when the user's phone cannot be shared; `profile.username` only on delivered and read. Other fields
//! (`account_update`, `message_template_status_update`, value-level errors, inbound messages...) are sent one
//! per POST in the envelope of §4.5 (`entry[].time` set).

use crate::config::WebhookConfig;
use crate::ids::{self, Rng};
use crate::oracle::Oracle;
use hmac::{Hmac, KeyInit, Mac};
use serde_json::{Value, json};
use sha2::Sha256;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::sync::{Semaphore, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

/// Which status update.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum StatusKind {
    #[default]
    Sent,
    Delivered,
    Read,
    Failed(i64),
}

/// One status update to send.
#[derive(Debug, Clone, Default)]
pub struct StatusEvent {
    pub phone_number_id: String,
    pub kind: StatusKind,
    pub wamid: String,
    /// The recipient's phone digits; empty when unknown.
    pub recipient_id: String,
    pub biz_opaque_callback_data: Option<String>,
    pub category: String,
    pub conversation_id: String,
    /// Unix seconds the status happened.
    pub timestamp: u64,
    /// The recipient's business-scoped user id (None: user ids off).
    pub recipient_user_id: Option<String>,
    /// Whether the phone may appear (false: `recipient_id` and `contacts[].wa_id` are omitted).
    pub phone_shared: bool,
    pub username: Option<String>,
    /// The send named the user by `recipient` (a user id) and not by `to`.
    pub by_user_id: bool,
    /// `error_data.details` of a failed status instead of the catalog's.
    pub fail_details: Option<String>,
}

/// How an accepted message fails later.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Failure {
    pub code: i64,
    /// Delay of the failed status after acceptance; None: `sent_delay_ms`.
    pub delay_ms: Option<u64>,
    /// A `sent` status first (at `sent_delay_ms`), then the failure.
    pub after_sent: bool,
    pub details: Option<String>,
}

impl Failure {
    pub fn code(code: i64) -> Failure {
        Failure { code, ..Failure::default() }
    }
}

/// How a delivered item is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Counted {
    Inbound,
    Field,
}

#[derive(Debug)]
enum Item {
    Status(StatusEvent),
    /// A prepared change (`field`, `value`) sent alone under `waba_id`.
    Change {
        /// Batching key only.
        phone_number_id: String,
        waba_id: String,
        field: String,
        value: Value,
        counted: Counted,
    },
}

impl Item {
    fn phone(&self) -> &str {
        match self {
            Item::Status(s) => &s.phone_number_id,
            Item::Change { phone_number_id, .. } => phone_number_id,
        }
    }
}

/// Context shared with delivery tasks.
#[derive(Debug)]
pub struct Shared {
    pub config: RwLock<Arc<WebhookConfig>>,
    pub app_secret: RwLock<String>,
    pub waba_id: String,
    /// WABA per phone number id (default `waba_id`).
    pub wabas: BTreeMap<String, String>,
    /// Display numbers per phone number id, and the default.
    pub displays: BTreeMap<String, String>,
    pub default_display: String,
    /// Statuses carry user ids and a `contacts[]` block.
    pub user_ids: bool,
    pub oracle: Arc<Oracle>,
    pending: AtomicUsize,
    rng: Rng,
    seq: AtomicU64,
}

/// The webhook sender. Cheap to share.
#[derive(Debug, Clone)]
pub struct Webhooks {
    shared: Arc<Shared>,
    tx: mpsc::UnboundedSender<(Instant, u64, Item)>,
}

/// What the webhook sender needs from the simulator's configuration.
#[derive(Debug, Clone)]
pub struct Setup {
    pub config: WebhookConfig,
    pub app_secret: String,
    pub waba_id: String,
    pub wabas: BTreeMap<String, String>,
    pub displays: BTreeMap<String, String>,
    pub default_display: String,
    pub user_ids: bool,
}

impl Webhooks {
    /// Starts the scheduler; it stops when `cancel` fires.
    pub fn start(setup: Setup, oracle: Arc<Oracle>, cancel: CancellationToken) -> anyhow::Result<Webhooks> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder().pool_max_idle_per_host(64).tcp_nodelay(true).build()?;
        let rng = Rng::new(setup.config.seed);
        let shared = Arc::new(Shared {
            config: RwLock::new(Arc::new(setup.config)),
            app_secret: RwLock::new(setup.app_secret),
            waba_id: setup.waba_id,
            wabas: setup.wabas,
            displays: setup.displays,
            default_display: setup.default_display,
            user_ids: setup.user_ids,
            oracle,
            pending: AtomicUsize::new(0),
            rng,
            seq: AtomicU64::new(0),
        });
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(schedule(shared.clone(), http, rx, cancel));
        Ok(Webhooks { shared, tx })
    }

    pub fn config(&self) -> Arc<WebhookConfig> {
        self.shared.config.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn set_config(&self, config: WebhookConfig) {
        self.shared.rng.reseed(config.seed);
        *self.shared.config.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(config);
    }

    /// Statuses queued or in flight.
    pub fn pending(&self) -> usize {
        self.shared.pending.load(Ordering::Relaxed)
    }

    fn enqueue(&self, due: Instant, item: Item, capacity: usize) -> bool {
        let n = if let Item::Status(_) = item { 1 } else { 0 };
        if self.shared.pending.fetch_add(1, Ordering::Relaxed) >= capacity {
            self.shared.pending.fetch_sub(1, Ordering::Relaxed);
            self.shared.oracle.webhooks(|w| w.statuses_dropped += n);
            return false;
        }
        self.shared.oracle.webhooks(|w| w.statuses_scheduled += n);
        let seq = self.shared.seq.fetch_add(1, Ordering::Relaxed);
        if self.tx.send((due, seq, item)).is_err() {
            self.shared.pending.fetch_sub(1, Ordering::Relaxed);
        }
        true
    }

    /// The display number of `phone_number_id`.
    pub fn display(&self, phone_number_id: &str) -> String {
        self.shared.displays.get(phone_number_id).unwrap_or(&self.shared.default_display).clone()
    }

    /// The `metadata` object of a value about `phone_number_id`.
    pub fn metadata(&self, phone_number_id: &str) -> Value {
        json!({ "display_phone_number": self.display(phone_number_id), "phone_number_id": phone_number_id })
    }

    /// The code `fail_recipients` gives messages to `wa_id`, if any.
    pub fn configured_failure(&self, wa_id: &str) -> Option<i64> {
        if wa_id.is_empty() {
            return None;
        }
        let cfg = self.config();
        cfg.fail_recipients.iter().find(|(number, _)| ids::wa_id(number) == wa_id).map(|(_, code)| *code)
    }

    /// Schedules the statuses of one accepted message: sent/delivered/read, or failed with `fail_code`.
    pub fn message_accepted(&self, base: StatusEvent, fail_code: Option<i64>) {
        self.message_accepted_with(base, fail_code, Duration::ZERO, false);
    }

    /// As [`Webhooks::message_accepted`], each status `extra_delay` later; with `withhold`, none is sent (a
    /// scenario window dropping status webhooks), counted in `statuses_withheld`. A recipient in
    /// `fail_recipients` fails with its code.
    pub fn message_accepted_with(
        &self,
        base: StatusEvent,
        fail_code: Option<i64>,
        extra_delay: Duration,
        withhold: bool,
    ) {
        let failure = fail_code.or_else(|| self.configured_failure(&base.recipient_id)).map(Failure::code);
        self.message_accepted_failing(base, failure, extra_delay, withhold);
    }

    /// Schedules the statuses of one accepted message: sent/delivered/read, or `failure` (optionally after a
    /// `sent`).
    pub fn message_accepted_failing(
        &self,
        base: StatusEvent,
        failure: Option<Failure>,
        extra_delay: Duration,
        withhold: bool,
    ) {
        let cfg = self.config();
        if cfg.url.is_none() {
            return;
        }
        let plan: Vec<(StatusKind, u64)> = match &failure {
            Some(f) => {
                let sent = cfg.sent_delay_ms.unwrap_or(0);
                let at = f.delay_ms.unwrap_or(sent);
                let mut plan = Vec::with_capacity(2);
                if f.after_sent {
                    plan.push((StatusKind::Sent, sent.min(at)));
                }
                plan.push((StatusKind::Failed(f.code), at));
                plan
            }
            None => [
                (StatusKind::Sent, cfg.sent_delay_ms),
                (StatusKind::Delivered, cfg.delivered_delay_ms),
                (StatusKind::Read, cfg.read_delay_ms),
            ]
            .into_iter()
            .filter_map(|(k, d)| d.map(|d| (k, d)))
            .collect(),
        };
        if withhold {
            let n = plan.len() as u64;
            self.shared.oracle.webhooks(|w| w.statuses_withheld += n);
            return;
        }
        if !extra_delay.is_zero() {
            let n = plan.len() as u64;
            self.shared.oracle.webhooks(|w| w.statuses_delayed += n);
        }
        let now = Instant::now();
        let details = failure.and_then(|f| f.details);
        for (kind, delay_ms) in plan {
            let jitter = if cfg.jitter_ms > 0 { self.shared.rng.next_u64() % (cfg.jitter_ms + 1) } else { 0 };
            // Saturating: a hostile scenario delay must not panic (a due time decades away is never reached).
            let delay = Duration::from_millis(delay_ms.saturating_add(jitter))
                .saturating_add(extra_delay)
                .min(Duration::from_secs(30 * 365 * 86_400));
            let mut ev = base.clone();
            ev.kind = kind;
            if matches!(kind, StatusKind::Failed(_)) {
                ev.fail_details = details.clone();
            }
            ev.timestamp = base.timestamp + delay.as_secs();
            let copies =
                if cfg.duplicate_rate > 0.0 && self.shared.rng.next_f64() < cfg.duplicate_rate { 2 } else { 1 };
            for _ in 0..copies {
                self.enqueue(now + delay, Item::Status(ev.clone()), cfg.queue_capacity);
            }
        }
    }

    /// Whether webhooks go anywhere.
    pub fn enabled(&self) -> bool {
        self.config().url.is_some()
    }

    /// Sends a `messages` value about `phone_number_id` (inbound message, value-level errors) after `delay`;
    /// `messaging_product` and `metadata` are added. false without a URL or when the queue is full.
    pub fn messages_value(&self, phone_number_id: &str, mut value: Value, inbound: bool, delay: Duration) -> bool {
        value["messaging_product"] = json!("whatsapp");
        value["metadata"] = self.metadata(phone_number_id);
        let waba = self.shared.wabas.get(phone_number_id).unwrap_or(&self.shared.waba_id).clone();
        let counted = if inbound { Counted::Inbound } else { Counted::Field };
        self.change_at(phone_number_id, &waba, "messages", value, counted, delay)
    }

    /// Sends one change of `field` for `waba_id` now. false without a URL or when the queue is full.
    pub fn change(&self, waba_id: &str, field: &str, value: Value) -> bool {
        self.change_at("", waba_id, field, value, Counted::Field, Duration::ZERO)
    }

    fn change_at(&self, phone: &str, waba: &str, field: &str, value: Value, counted: Counted, delay: Duration) -> bool {
        let cfg = self.config();
        if cfg.url.is_none() {
            return false;
        }
        let item = Item::Change {
            phone_number_id: phone.to_string(),
            waba_id: waba.to_string(),
            field: field.to_string(),
            value,
            counted,
        };
        self.enqueue(Instant::now() + delay, item, cfg.queue_capacity)
    }

    /// Sends an inbound customer text message webhook now (the phone only, no user id). Returns its wamid.
    pub fn inbound_text(&self, phone_number_id: &str, from: &str, name: &str, text: &str) -> Option<String> {
        let wa_id = ids::wa_id(from);
        let wamid = ids::wamid(&wa_id);
        let value = json!({
            "contacts": [{ "profile": { "name": name }, "wa_id": wa_id }],
            "messages": [{
                "from": wa_id,
                "id": wamid,
                "timestamp": (ids::now_ms() / 1000).to_string(),
                "type": "text",
                "text": { "body": text },
            }],
        });
        self.messages_value(phone_number_id, value, true, Duration::ZERO).then_some(wamid)
    }
}

/// `sha256=<hex hmac-sha256(secret, body)>`.
pub fn signature(secret: &str, body: &[u8]) -> String {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(secret.as_bytes()).expect("hmac takes keys of any length");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

type Heap = BinaryHeap<Reverse<(Instant, u64, HeapItem)>>;

/// Orders by time and sequence only.
#[derive(Debug)]
struct HeapItem(Item);
impl PartialEq for HeapItem {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl Eq for HeapItem {}
impl PartialOrd for HeapItem {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for HeapItem {
    fn cmp(&self, _: &Self) -> std::cmp::Ordering {
        std::cmp::Ordering::Equal
    }
}

async fn schedule(
    shared: Arc<Shared>,
    http: reqwest::Client,
    mut rx: mpsc::UnboundedReceiver<(Instant, u64, Item)>,
    cancel: CancellationToken,
) {
    let mut heap: Heap = BinaryHeap::new();
    let mut permits = Arc::new(Semaphore::new(1));
    let mut permits_size = 0usize;
    loop {
        let next_due = heap.peek().map(|Reverse((due, _, _))| *due);
        tokio::select! {
            biased;
            _ = cancel.cancelled() => return,
            msg = rx.recv() => match msg {
                Some((due, seq, item)) => heap.push(Reverse((due, seq, HeapItem(item)))),
                None => return,
            },
            _ = sleep_until_opt(next_due), if next_due.is_some() => {
                let cfg = shared.config.read().unwrap_or_else(|e| e.into_inner()).clone();
                if permits_size != cfg.concurrency.max(1) {
                    permits_size = cfg.concurrency.max(1);
                    permits = Arc::new(Semaphore::new(permits_size));
                }
                let horizon = Instant::now() + Duration::from_millis(cfg.batch_linger_ms);
                let mut due: Vec<Item> = Vec::new();
                while let Some(Reverse((at, _, _))) = heap.peek() {
                    if *at > horizon {
                        break;
                    }
                    if let Some(Reverse((_, _, HeapItem(item)))) = heap.pop() {
                        due.push(item);
                    }
                }
                for batch in make_batches(&shared, &cfg, due) {
                    let Ok(permit) = permits.clone().acquire_owned().await else { return };
                    let (shared, http, cfg, cancel) = (shared.clone(), http.clone(), cfg.clone(), cancel.clone());
                    tokio::spawn(async move {
                        deliver(&shared, &http, &cfg, batch, &cancel).await;
                        drop(permit);
                    });
                }
            }
        }
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    if let Some(at) = at {
        tokio::time::sleep_until(at).await;
    }
}

/// Groups due items per phone number into POST-sized batches.
fn make_batches(shared: &Shared, cfg: &WebhookConfig, due: Vec<Item>) -> Vec<(String, Vec<Item>)> {
    let mut per_phone: BTreeMap<String, Vec<Item>> = BTreeMap::new();
    let mut out = Vec::new();
    for item in due {
        match item {
            Item::Change { .. } => out.push((item.phone().to_string(), vec![item])),
            Item::Status(_) => per_phone.entry(item.phone().to_string()).or_default().push(item),
        }
    }
    for (phone, mut items) in per_phone {
        if cfg.shuffle_batches {
            for i in (1..items.len()).rev() {
                let j = (shared.rng.next_u64() % (i as u64 + 1)) as usize;
                items.swap(i, j);
            }
        }
        while !items.is_empty() {
            let rest = items.split_off(items.len().min(cfg.batch_max.max(1)));
            out.push((phone.clone(), std::mem::replace(&mut items, rest)));
        }
    }
    out
}

async fn deliver(
    shared: &Shared,
    http: &reqwest::Client,
    cfg: &WebhookConfig,
    batch: (String, Vec<Item>),
    cancel: &CancellationToken,
) {
    let (phone, items) = batch;
    let count = items.len();
    let statuses = items.iter().filter(|i| matches!(i, Item::Status(_))).count() as u64;
    let inbound = items.iter().filter(|i| matches!(i, Item::Change { counted: Counted::Inbound, .. })).count() as u64;
    let fields: Vec<String> = items
        .iter()
        .filter_map(|i| match i {
            Item::Change { field, counted: Counted::Field, .. } => Some(field.clone()),
            _ => None,
        })
        .collect();
    let body = envelope(shared, &phone, &items);
    let done = |delivered: bool| {
        shared.pending.fetch_sub(count, Ordering::Relaxed);
        shared.oracle.webhooks(|w| {
            if delivered {
                w.statuses_delivered += statuses;
                w.inbound_delivered += inbound;
                for f in &fields {
                    *w.fields_delivered.entry(f.clone()).or_default() += 1;
                }
            } else {
                w.statuses_dropped += statuses;
                w.fields_dropped += fields.len() as u64;
            }
        });
    };
    let Some(url) = cfg.url.clone() else {
        done(false);
        return;
    };
    let body = match serde_json::to_vec(&body) {
        Ok(b) => b,
        Err(e) => {
            warn!(error = %e, "cannot serialize webhook body");
            done(false);
            return;
        }
    };
    let secret = shared.app_secret.read().unwrap_or_else(|e| e.into_inner()).clone();
    let sig = signature(&secret, &body);
    let mut backoff = Duration::from_millis(cfg.retry_initial_ms);
    for attempt in 1..=cfg.max_attempts {
        let result = http
            .post(&url)
            .header("content-type", "application/json")
            .header("x-hub-signature-256", &sig)
            .timeout(Duration::from_millis(cfg.request_timeout_ms))
            .body(body.clone())
            .send()
            .await;
        match result {
            Ok(r) if r.status() == reqwest::StatusCode::OK => {
                shared.oracle.webhooks(|w| w.posts_ok += 1);
                done(true);
                return;
            }
            Ok(r) => debug!(status = r.status().as_u16(), attempt, "webhook receiver refused"),
            Err(e) => debug!(error = %e, attempt, "webhook post failed"),
        }
        shared.oracle.webhooks(|w| w.post_failures += 1);
        if attempt == cfg.max_attempts {
            break;
        }
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_millis(cfg.retry_max_ms.max(cfg.retry_initial_ms)));
    }
    warn!(statuses = count, phone_number_id = %phone, "webhook given up after retries");
    done(false);
}

fn envelope(shared: &Shared, phone: &str, items: &[Item]) -> Value {
    if let Some(Item::Change { waba_id, field, value, .. }) = items.first() {
        return json!({
            "object": "whatsapp_business_account",
            "entry": [{
                "id": waba_id,
                "time": ids::now_ms() / 1000,
                "changes": [{ "value": value, "field": field }],
            }],
        });
    }
    let statuses: Vec<&StatusEvent> = items
        .iter()
        .filter_map(|i| match i {
            Item::Status(s) => Some(s),
            Item::Change { .. } => None,
        })
        .collect();
    let mut value = json!({});
    if shared.user_ids {
        let contacts = contacts_json(&statuses);
        if !contacts.is_empty() {
            value["contacts"] = Value::Array(contacts);
        }
    }
    value["statuses"] = Value::Array(statuses.iter().map(|s| status_json(s)).collect());
    value["messaging_product"] = json!("whatsapp");
    value["metadata"] = json!({ "display_phone_number": shared.displays.get(phone).unwrap_or(&shared.default_display), "phone_number_id": phone });
    let waba = shared.wabas.get(phone).unwrap_or(&shared.waba_id);
    json!({
        "object": "whatsapp_business_account",
        "entry": [{ "id": waba, "changes": [{ "value": value, "field": "messages" }] }],
    })
}

/// The `contacts[]` block of a status batch: one entry per user of a sent, delivered or read status (never for
/// failed ones), with the phone only when it can be shared and the username only on delivered and read.
fn contacts_json(statuses: &[&StatusEvent]) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    for s in statuses {
        let Some(user_id) = &s.recipient_user_id else { continue };
        if matches!(s.kind, StatusKind::Failed(_)) {
            continue;
        }
        let idx = match out.iter().position(|c| c["user_id"] == user_id.as_str()) {
            Some(i) => i,
            None => {
                let mut c = json!({ "user_id": user_id });
                if s.phone_shared && !s.recipient_id.is_empty() {
                    c["wa_id"] = json!(s.recipient_id);
                }
                out.push(c);
                out.len() - 1
            }
        };
        if let Some(u) = &s.username
            && matches!(s.kind, StatusKind::Delivered | StatusKind::Read)
        {
            out[idx]["profile"] = json!({ "username": u });
        }
    }
    out
}

/// One `statuses[]` element in Meta's shape.
pub fn status_json(s: &StatusEvent) -> Value {
    let status = match s.kind {
        StatusKind::Sent => "sent",
        StatusKind::Delivered => "delivered",
        StatusKind::Read => "read",
        StatusKind::Failed(_) => "failed",
    };
    let mut v = json!({
        "id": s.wamid,
        "status": status,
        "timestamp": s.timestamp.to_string(),
    });
    if s.phone_shared && !s.recipient_id.is_empty() {
        v["recipient_id"] = json!(s.recipient_id);
    }
    if let Some(u) = &s.recipient_user_id
        && (s.by_user_id || !matches!(s.kind, StatusKind::Failed(_)))
    {
        v["recipient_user_id"] = json!(u);
    }
    if let Some(b) = &s.biz_opaque_callback_data {
        v["biz_opaque_callback_data"] = json!(b);
    }
    let pricing = json!({ "billable": true, "pricing_model": "PMP", "type": "regular", "category": s.category });
    match s.kind {
        StatusKind::Sent => {
            v["conversation"] = json!({
                "id": s.conversation_id,
                "expiration_timestamp": (s.timestamp + 24 * 3600).to_string(),
                "origin": { "type": s.category },
            });
            v["pricing"] = pricing;
        }
        StatusKind::Delivered => {
            v["conversation"] = json!({ "id": s.conversation_id, "origin": { "type": s.category } });
            v["pricing"] = pricing;
        }
        StatusKind::Read => {}
        StatusKind::Failed(code) => {
            v["errors"] = json!([crate::errors::webhook_error_with(code, s.fail_details.as_deref())]);
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_is_hex_hmac_sha256() {
        // RFC 4231 test case 2.
        let sig = signature("Jefe", b"what do ya want for nothing?");
        assert_eq!(sig, "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    }

    #[test]
    fn sent_status_has_conversation_and_pricing() {
        let ev = StatusEvent {
            phone_number_id: "p".into(),
            kind: StatusKind::Sent,
            wamid: "wamid.X".into(),
            recipient_id: "16505551234".into(),
            biz_opaque_callback_data: Some("op-1".into()),
            category: "utility".into(),
            conversation_id: "c".into(),
            timestamp: 1_750_030_073,
            recipient_user_id: Some("US.1349".into()),
            phone_shared: true,
            ..StatusEvent::default()
        };
        let v = status_json(&ev);
        assert_eq!(v["timestamp"], "1750030073");
        assert_eq!(v["biz_opaque_callback_data"], "op-1");
        assert_eq!(v["conversation"]["expiration_timestamp"], "1750116473");
        assert_eq!(v["pricing"]["pricing_model"], "PMP");
        assert_eq!((&v["recipient_id"], &v["recipient_user_id"]), (&json!("16505551234"), &json!("US.1349")));
        let failed = status_json(&StatusEvent { kind: StatusKind::Failed(131026), ..ev.clone() });
        assert_eq!(failed["errors"][0]["code"], 131026);
        assert!(failed.get("pricing").is_none());
        assert!(failed.get("recipient_user_id").is_none(), "not on failed statuses of phone-addressed sends");
        let by_id = StatusEvent { kind: StatusKind::Failed(131026), by_user_id: true, phone_shared: false, ..ev };
        let failed = status_json(&by_id);
        assert_eq!(failed["recipient_user_id"], "US.1349");
        assert!(failed.get("recipient_id").is_none(), "a phone that cannot be shared");
    }
}
