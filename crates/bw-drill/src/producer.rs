//! The drill's producer: a mixed flash-sale load (OTPs, order confirmations, support replies, promotions)
//! spread over several sender numbers, submitted through the producer client at a steady rate.

use bw_client::{Client, Request};
use bw_proto::v1::Category;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

/// What the producer did.
#[derive(Debug, Default)]
pub struct Produced {
    /// Operation ids ingest accepted (including duplicates of earlier accepted ones).
    pub accepted: Vec<String>,
    /// Requests ingest rejected, with the reason.
    pub rejected: Vec<(String, String)>,
    /// Requests that never got an answer (ingest down the whole time).
    pub unanswered: Vec<String>,
}

/// Live counters for the monitor.
#[derive(Debug, Default)]
pub struct ProducerProgress {
    pub submitted: AtomicU64,
    pub accepted: AtomicU64,
    pub rejected: AtomicU64,
}

/// The sender phone number ids the drill uses.
pub fn sender_ids(senders: usize) -> Vec<String> {
    (0..senders).map(|i| format!("10654035224{:04}", 2900 + i)).collect()
}

fn category_for(i: usize) -> Category {
    // A flash sale: mostly order confirmations and promotions, some OTPs and support replies.
    match i % 20 {
        0..=1 => Category::Authentication,
        2..=9 => Category::Transactional,
        10 => Category::Support,
        _ => Category::Marketing,
    }
}

/// Messages between an order confirmation and the shipping update to the same customer: more than the
/// producer's default concurrency (256), so the confirmation is accepted before the update is submitted (a
/// multiple of 20, so the update lands on a transactional slot of the category cycle).
pub const SHIPPING_UPDATE_GAP: usize = 300;

/// An OTP's deadline: Meta's default time-to-live of authentication templates (10 minutes).
pub const OTP_DEADLINE_MS: i64 = 10 * 60 * 1000;

/// The customer message `i` goes to. Slots 6..=9 of every 20 are shipping updates to the customer of the order
/// confirmation `SHIPPING_UPDATE_GAP` messages earlier (slots 2..=5): a fifth of the load goes to a repeat
/// recipient, so a later "your order shipped" can overtake the earlier "confirm your order" if order is not kept.
pub fn recipient_index(i: usize) -> usize {
    if matches!(i % 20, 6..=9) && i >= SHIPPING_UPDATE_GAP { i - SHIPPING_UPDATE_GAP - 4 } else { i }
}

/// Builds message `i` of the run (deterministic, so a run can be reproduced).
/// `wabas[k]` is the WABA of `senders[k]`.
pub fn build(run_id: &str, i: usize, wabas: &[String], senders: &[String]) -> bw_proto::v1::SendRequest {
    // The customer decides the sender too: a confirmation and its shipping update come from the same number.
    let customer = recipient_index(i);
    let sender = &senders[customer % senders.len()];
    let waba_id = wabas[customer % senders.len()].as_str();
    // Mostly distinct recipients, so the pair limit (Meta: about 1 per 6 s) is not the bottleneck of the drill.
    let recipient = format!("+549115{:07}", customer % 10_000_000);
    let category = category_for(i);
    let op = format!("{run_id}-{i:06}");
    let request = match category {
        Category::Support => Request::text(&op, waba_id, sender, &recipient, "Your order #1234 is on its way")
            .customer_last_inbound_unix_ms(bw_common::time::now_ms() - 60_000),
        Category::Authentication => Request::template(&op, waba_id, sender, &recipient, "otp_code", "es_AR")
            .param("123456")
            .deadline_unix_ms(bw_common::time::now_ms() + OTP_DEADLINE_MS),
        Category::Transactional if customer != i => {
            Request::template(&op, waba_id, sender, &recipient, "shipping_update", "es_AR").param("1234")
        }
        Category::Transactional => {
            Request::template(&op, waba_id, sender, &recipient, "order_confirmation", "es_AR").param("1234")
        }
        _ => Request::template(&op, waba_id, sender, &recipient, "flash_sale", "es_AR").param("40%"),
    };
    request.category(category).label("drill", run_id).build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipping_updates_follow_their_confirmation_to_the_same_customer_and_sender() {
        let senders = sender_ids(4);
        let wabas = vec!["w".to_string(); senders.len()];
        let mut repeats = 0;
        for i in 0..2_000 {
            let customer = recipient_index(i);
            if customer == i {
                continue;
            }
            repeats += 1;
            assert!(matches!(i % 20, 6..=9) && matches!(customer % 20, 2..=5), "{i} -> {customer}");
            assert!(i - customer >= SHIPPING_UPDATE_GAP);
            let (update, confirmation) = (build("r", i, &wabas, &senders), build("r", customer, &wabas, &senders));
            assert_eq!(update.recipient, confirmation.recipient);
            assert_eq!(update.phone_number_id, confirmation.phone_number_id);
            assert_eq!(
                (update.category(), confirmation.category()),
                (Category::Transactional, Category::Transactional)
            );
        }
        // A fifth of the load once the first gap has passed.
        assert_eq!(repeats, (2_000 - SHIPPING_UPDATE_GAP) / 5);
        let otp = build("r", 0, &wabas, &senders);
        assert!(otp.deadline_unix_ms > bw_common::time::now_ms() + OTP_DEADLINE_MS - 60_000);
    }
}

/// What the producer publishes.
#[derive(Debug, Clone)]
pub struct Load {
    pub run_id: String,
    /// The WABA of each sender, in the order of `senders`.
    pub wabas: Vec<String>,
    pub senders: Vec<String>,
    /// Messages in all.
    pub total: usize,
    /// Messages per second.
    pub rate: f64,
    /// Outstanding requests at most.
    pub concurrency: usize,
}

/// Submits `load.total` messages at `load.rate` per second with up to `load.concurrency` outstanding requests.
pub async fn produce(client: Client, load: Load, progress: Arc<ProducerProgress>) -> Produced {
    let Load { run_id, wabas, senders, total, rate, concurrency } = load;
    let out = Arc::new(Mutex::new(Produced::default()));
    let permits = Arc::new(tokio::sync::Semaphore::new(concurrency.max(1)));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..total {
        let due = started + Duration::from_secs_f64(i as f64 / rate.max(1.0));
        tokio::time::sleep_until(due.into()).await;
        let Ok(permit) = permits.clone().acquire_owned().await else { break };
        let request = build(&run_id, i, &wabas, &senders);
        let client = client.clone();
        let out = out.clone();
        let progress = progress.clone();
        tasks.spawn(async move {
            progress.submitted.fetch_add(1, Ordering::Relaxed);
            let result = client.send(&request).await;
            let mut out = out.lock().await;
            match result {
                Ok(reply) if reply.accepted => {
                    progress.accepted.fetch_add(1, Ordering::Relaxed);
                    out.accepted.push(request.operation_id.clone());
                }
                Ok(reply) => {
                    progress.rejected.fetch_add(1, Ordering::Relaxed);
                    out.rejected.push((request.operation_id.clone(), reply.error));
                }
                Err(_) => out.unanswered.push(request.operation_id.clone()),
            }
            drop(permit);
        });
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    match Arc::try_unwrap(out) {
        Ok(m) => m.into_inner(),
        Err(arc) => std::mem::take(&mut *arc.lock().await),
    }
}
