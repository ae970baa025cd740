//! Late claims of one sender joined into one Redis round trip (`Worker::claim_late`).
//!
//! After a stall many sends of one sender miss their slots at once, and each asks the fleet-wide late
//! allowance (`claim_late.lua`) whether it may still go. One round trip each queued thousands of calls on the
//! Redis connection: the pipeline bench spent about a third of its time on them. Here the first claim of a
//! sender leads a round: the claims of the same sender that arrive while it is being asked wait and go in the
//! next round together, as one call asking for all of them. The allowance is the same bucket, so the fleet-wide
//! bound does not change; only the number of calls does.

use crate::rounds::Rounds;
use std::future::Future;

/// Per sender, the late claims of the round under way and of the next.
#[derive(Default)]
pub(crate) struct Coalescer {
    rounds: Rounds<(), bool>,
}

impl Coalescer {
    /// Whether one late send of sender `key` may go: `ask(n)` asks the allowance for `n` late sends at once and
    /// answers how many it granted (`None`: no answer). Claims of the same sender made meanwhile share one `ask`;
    /// its grants go in arrival order, the leader's own first.
    pub(crate) async fn claim<F, Fut>(&self, key: &str, ask: F) -> Option<bool>
    where
        F: FnOnce(u32) -> Fut,
        Fut: Future<Output = Option<u32>>,
    {
        let grant = |claims: Vec<()>| async move {
            let wanted = u32::try_from(claims.len()).unwrap_or(u32::MAX);
            let granted = ask(wanted).await.ok_or_else(|| "no answer".to_string())?;
            Ok((0..claims.len()).map(|i| (i as u64) < u64::from(granted)).collect())
        };
        self.rounds.call(key, (), grant).await.ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::{Arc, Mutex};

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
        until(|| c.rounds.waiting("sender") == Some(5)).await;
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
        assert!(c.rounds.is_idle(), "the sender's entry ends with its last round");
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
        assert!(c.rounds.is_idle());
    }

    #[tokio::test]
    async fn a_dropped_leader_hands_the_next_round_on() {
        let c = Arc::new(Coalescer::default());
        let stuck = {
            let c = c.clone();
            tokio::spawn(async move { c.claim("s", |_| std::future::pending::<Option<u32>>()).await })
        };
        until(|| c.rounds.waiting("s").is_some()).await;
        let next = {
            let c = c.clone();
            tokio::spawn(async move { c.claim("s", |n| async move { Some(n) }).await })
        };
        until(|| c.rounds.waiting("s") == Some(1)).await;
        stuck.abort();
        assert_eq!(next.await.expect("claim"), Some(true), "the waiting claim led its own round");
        assert!(c.rounds.is_idle());
    }
}
