//! Late claims of one sender joined into one Redis round trip (`Worker::claim_late`).
//!
//! After a stall many sends of one sender miss their slots at once, and each asks the fleet-wide late
//! allowance (`claim_late.lua`) whether it may still go. One round trip each queued thousands of calls on the
//! Redis connection: the pipeline bench spent about a third of its time on them. Here the first claim of a
//! sender leads a round: the claims of the same sender that arrive while it is being asked wait and go in the
//! next round together, as one call asking for all of them. The allowance is the same bucket, so the fleet-wide
//! bound does not change; only the number of calls does.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use tokio::sync::oneshot;

/// What a waiting claim is told.
enum Turn {
    /// Its round was answered: whether it may go (`None`: Redis did not answer).
    Answered(Option<bool>),
    /// The round before it is over: it leads the next one, for itself and whoever waits with it.
    Lead,
}

/// Per sender, the claims waiting for the next round. A sender has an entry while a round of it is being asked.
#[derive(Default)]
pub(crate) struct Coalescer {
    waiting: Mutex<HashMap<String, Vec<oneshot::Sender<Turn>>>>,
}

/// Hands the next round of `key` to a waiting claim when the leader is done (or dropped), else ends the entry.
struct Leading<'a> {
    coalescer: &'a Coalescer,
    key: &'a str,
}

impl Drop for Leading<'_> {
    fn drop(&mut self) {
        let mut waiting = self.coalescer.lock();
        let Some(queue) = waiting.get_mut(self.key) else { return };
        // A waiting claim whose future was dropped meanwhile cannot lead: the next one does.
        while !queue.is_empty() {
            if queue.remove(0).send(Turn::Lead).is_ok() {
                return;
            }
        }
        waiting.remove(self.key);
    }
}

impl Coalescer {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<oneshot::Sender<Turn>>>> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether one late send of sender `key` may go: `ask(n)` asks the allowance for `n` late sends at once and
    /// answers how many it granted (`None`: no answer). Claims of the same sender made meanwhile share one `ask`;
    /// its grants go in arrival order, the leader's own first.
    pub(crate) async fn claim<F, Fut>(&self, key: &str, ask: F) -> Option<bool>
    where
        F: FnOnce(u32) -> Fut,
        Fut: Future<Output = Option<u32>>,
    {
        let wait = {
            let mut waiting = self.lock();
            match waiting.get_mut(key) {
                Some(queue) => {
                    let (tx, rx) = oneshot::channel();
                    queue.push(tx);
                    Some(rx)
                }
                None => {
                    waiting.insert(key.to_string(), Vec::new());
                    None
                }
            }
        };
        if let Some(rx) = wait {
            match rx.await {
                Ok(Turn::Answered(granted)) => return granted,
                Ok(Turn::Lead) => {}
                // Its leader was dropped mid-round: no answer for this claim (the caller's own allowance decides).
                Err(_) => return None,
            }
        }
        let _leading = Leading { coalescer: self, key };
        // Claims that are ready now (the rest of a stalled batch) join this round rather than wait for the next.
        tokio::task::yield_now().await;
        let joined = std::mem::take(self.lock().get_mut(key).expect("a leader's entry stays while it leads"));
        let wanted = u32::try_from(joined.len() + 1).unwrap_or(u32::MAX);
        let granted = ask(wanted).await;
        for (i, tx) in joined.into_iter().enumerate() {
            let _ = tx.send(Turn::Answered(granted.map(|g| g as usize > i + 1)));
        }
        granted.map(|g| g >= 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// An allowance of `tokens` late sends, answering after a pause (so claims made meanwhile must wait), that
    /// records what each call asked for.
    struct Allowance {
        tokens: AtomicU32,
        calls: Mutex<Vec<u32>>,
        gate: tokio::sync::Semaphore,
    }

    impl Allowance {
        fn new(tokens: u32) -> Arc<Self> {
            Arc::new(Allowance {
                tokens: AtomicU32::new(tokens),
                calls: Mutex::default(),
                gate: tokio::sync::Semaphore::new(0),
            })
        }
        async fn ask(&self, wanted: u32) -> Option<u32> {
            self.calls.lock().expect("calls").push(wanted);
            self.gate.acquire().await.expect("gate").forget();
            let have = self.tokens.load(Ordering::SeqCst);
            let granted = have.min(wanted);
            self.tokens.store(have - granted, Ordering::SeqCst);
            Some(granted)
        }
    }

    async fn until(what: impl Fn() -> bool) {
        while !what() {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn claims_made_while_a_round_is_asked_share_the_next_call_and_the_grants_go_in_order() {
        let c = Arc::new(Coalescer::default());
        let allowance = Allowance::new(3);
        let claim = |c: &Arc<Coalescer>, a: &Arc<Allowance>| {
            let (c, a) = (c.clone(), a.clone());
            tokio::spawn(async move { c.claim("sender", |n| async move { a.ask(n).await }).await })
        };
        let first = claim(&c, &allowance);
        until(|| allowance.calls.lock().expect("calls").len() == 1).await;
        let rest: Vec<_> = (0..5).map(|_| claim(&c, &allowance)).collect();
        until(|| c.lock().get("sender").is_some_and(|q| q.len() == 5)).await;
        allowance.gate.add_permits(1);
        assert_eq!(first.await.expect("claim"), Some(true));
        allowance.gate.add_permits(1);
        let mut answers = Vec::new();
        for r in rest {
            answers.push(r.await.expect("claim"));
        }
        // One call for the first claim, one for the five that came while it was asked: 2 of the 3 tokens left.
        assert_eq!(*allowance.calls.lock().expect("calls"), vec![1, 5]);
        assert_eq!(answers, vec![Some(true), Some(true), Some(false), Some(false), Some(false)]);
        assert!(c.lock().is_empty(), "the sender's entry ends with its last round");
    }

    #[tokio::test]
    async fn senders_are_asked_apart_and_no_answer_reaches_every_joined_claim() {
        let c = Arc::new(Coalescer::default());
        let asked = Arc::new(AtomicU32::new(0));
        let claims = ["a", "b", "a", "b"].map(|key| {
            let (c, asked) = (c.clone(), asked.clone());
            tokio::spawn(async move {
                c.claim(key, |n| async move {
                    asked.fetch_add(n, Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    None
                })
                .await
            })
        });
        for claim in claims {
            assert_eq!(claim.await.expect("claim"), None);
        }
        assert_eq!(asked.load(Ordering::SeqCst), 4, "every claim was asked for exactly once");
        assert!(c.lock().is_empty());
    }

    #[tokio::test]
    async fn a_dropped_leader_hands_the_next_round_on() {
        let c = Arc::new(Coalescer::default());
        let stuck = {
            let c = c.clone();
            tokio::spawn(async move { c.claim("s", |_| std::future::pending::<Option<u32>>()).await })
        };
        until(|| c.lock().contains_key("s")).await;
        let next = {
            let c = c.clone();
            tokio::spawn(async move { c.claim("s", |n| async move { Some(n) }).await })
        };
        until(|| c.lock().get("s").is_some_and(|q| q.len() == 1)).await;
        stuck.abort();
        assert_eq!(next.await.expect("claim"), Some(true), "the waiting claim led its own round");
        assert!(c.lock().is_empty());
    }
}
