//! Status and inbound webhooks: Meta's envelope, signed with `X-Hub-Signature-256`, scheduled after acceptance,
//! batched per phone number, optionally duplicated, jittered or shuffled, retried with backoff when the receiver
//! fails, bounded by a queue capacity.

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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusKind {
    Sent,
    Delivered,
    Read,
    Failed(i64),
}

/// One status update to send.
#[derive(Debug, Clone)]
pub struct StatusEvent {
    pub phone_number_id: String,
    pub kind: StatusKind,
    pub wamid: String,
    pub recipient_id: String,
    pub biz_opaque_callback_data: Option<String>,
    pub category: String,
    pub conversation_id: String,
    /// Unix seconds the status happened.
    pub timestamp: u64,
}

#[derive(Debug)]
enum Item {
    Status(StatusEvent),
    /// A prepared `value` (inbound message) sent alone.
    Value {
        phone_number_id: String,
        value: Value,
    },
}

impl Item {
    fn phone(&self) -> &str {
        match self {
            Item::Status(s) => &s.phone_number_id,
            Item::Value { phone_number_id, .. } => phone_number_id,
        }
    }
}

/// Context shared with delivery tasks.
#[derive(Debug)]
pub struct Shared {
    pub config: RwLock<Arc<WebhookConfig>>,
    pub app_secret: RwLock<String>,
    pub waba_id: String,
    /// Display numbers per phone number id, and the default.
    pub displays: BTreeMap<String, String>,
    pub default_display: String,
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

impl Webhooks {
    /// Starts the scheduler; it stops when `cancel` fires.
    pub fn start(
        config: WebhookConfig,
        app_secret: String,
        waba_id: String,
        displays: (BTreeMap<String, String>, String),
        oracle: Arc<Oracle>,
        cancel: CancellationToken,
    ) -> anyhow::Result<Webhooks> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder().pool_max_idle_per_host(64).tcp_nodelay(true).build()?;
        let rng = Rng::new(config.seed);
        let shared = Arc::new(Shared {
            config: RwLock::new(Arc::new(config)),
            app_secret: RwLock::new(app_secret),
            waba_id,
            displays: displays.0,
            default_display: displays.1,
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

    /// Schedules the statuses of one accepted message: sent/delivered/read, or failed with `fail_code`.
    pub fn message_accepted(&self, base: StatusEvent, fail_code: Option<i64>) {
        self.message_accepted_with(base, fail_code, Duration::ZERO, false);
    }

    /// As [`Webhooks::message_accepted`], each status `extra_delay` later; with `withhold`, none is sent (a
    /// scenario window dropping status webhooks), counted in `statuses_withheld`.
    pub fn message_accepted_with(
        &self,
        base: StatusEvent,
        fail_code: Option<i64>,
        extra_delay: Duration,
        withhold: bool,
    ) {
        let cfg = self.config();
        if cfg.url.is_none() {
            return;
        }
        let fail_code = fail_code.or_else(|| {
            cfg.fail_recipients
                .iter()
                .find(|(number, _)| ids::wa_id(number) == base.recipient_id)
                .map(|(_, code)| *code)
        });
        let plan: Vec<(StatusKind, u64)> = match fail_code {
            Some(code) => vec![(StatusKind::Failed(code), cfg.sent_delay_ms.unwrap_or(0))],
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
        for (kind, delay_ms) in plan {
            let jitter = if cfg.jitter_ms > 0 { self.shared.rng.next_u64() % (cfg.jitter_ms + 1) } else { 0 };
            let delay = Duration::from_millis(delay_ms + jitter) + extra_delay;
            let mut ev = base.clone();
            ev.kind = kind;
            ev.timestamp = base.timestamp + delay.as_secs();
            let copies =
                if cfg.duplicate_rate > 0.0 && self.shared.rng.next_f64() < cfg.duplicate_rate { 2 } else { 1 };
            for _ in 0..copies {
                self.enqueue(now + delay, Item::Status(ev.clone()), cfg.queue_capacity);
            }
        }
    }

    /// Sends an inbound customer text message webhook now. Returns its wamid.
    pub fn inbound_text(&self, phone_number_id: &str, from: &str, name: &str, text: &str) -> Option<String> {
        let cfg = self.config();
        cfg.url.as_ref()?;
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
        let item = Item::Value { phone_number_id: phone_number_id.to_string(), value };
        self.enqueue(Instant::now(), item, cfg.queue_capacity).then_some(wamid)
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
            Item::Value { .. } => out.push((item.phone().to_string(), vec![item])),
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
    let inbound = count as u64 - statuses;
    let body = envelope(shared, &phone, &items);
    let done = |delivered: bool| {
        shared.pending.fetch_sub(count, Ordering::Relaxed);
        shared.oracle.webhooks(|w| {
            if delivered {
                w.statuses_delivered += statuses;
                w.inbound_delivered += inbound;
            } else {
                w.statuses_dropped += statuses;
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
    let mut value = match items.first() {
        Some(Item::Value { value, .. }) => value.clone(),
        _ => json!({ "statuses": items.iter().filter_map(|i| match i {
            Item::Status(s) => Some(status_json(s)),
            Item::Value { .. } => None,
        }).collect::<Vec<_>>() }),
    };
    value["messaging_product"] = json!("whatsapp");
    value["metadata"] = json!({ "display_phone_number": shared.displays.get(phone).unwrap_or(&shared.default_display), "phone_number_id": phone });
    json!({
        "object": "whatsapp_business_account",
        "entry": [{ "id": shared.waba_id, "changes": [{ "value": value, "field": "messages" }] }],
    })
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
        "recipient_id": s.recipient_id,
    });
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
        StatusKind::Failed(code) => v["errors"] = json!([crate::errors::webhook_error(code)]),
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
        };
        let v = status_json(&ev);
        assert_eq!(v["timestamp"], "1750030073");
        assert_eq!(v["biz_opaque_callback_data"], "op-1");
        assert_eq!(v["conversation"]["expiration_timestamp"], "1750116473");
        assert_eq!(v["pricing"]["pricing_model"], "PMP");
        let failed = status_json(&StatusEvent { kind: StatusKind::Failed(131026), ..ev });
        assert_eq!(failed["errors"][0]["code"], 131026);
        assert!(failed.get("pricing").is_none());
    }
}
