//! Concurrent calls of one key joined into one round trip.
//!
//! Each message of a fetched batch is prepared and sent by its own future, and many of them ask Redis the same
//! kind of question about the same key (a sender's late allowance, a number's customer service windows, a
//! portfolio's budget). One round trip each queues a call per message on the connection. Here the first call of
//! a key leads a round: the calls of the same key that arrive while it is being asked wait and go in the next
//! round together, as one call asking for all of them. The answer is the same as asking one at a time in
//! arrival order, the leader's own first; only the number of calls changes.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use tokio::sync::oneshot;

/// What a waiting call is told.
enum Turn<O> {
    /// Its round was answered.
    Answered(Result<O, String>),
    /// The round before it is over: it leads the next one, for itself and whoever waits with it.
    Lead,
}

type Queue<I, O> = Vec<(I, oneshot::Sender<Turn<O>>)>;

/// Per key, the calls waiting for the next round. A key has an entry while a round of it is being asked.
pub(crate) struct Rounds<I, O> {
    waiting: Mutex<HashMap<String, Queue<I, O>>>,
}

impl<I, O> Default for Rounds<I, O> {
    fn default() -> Self {
        Rounds { waiting: Mutex::default() }
    }
}

/// Hands the next round of `key` to a waiting call when the leader is done (or dropped), else ends the entry.
struct Leading<'a, I, O> {
    rounds: &'a Rounds<I, O>,
    key: &'a str,
}

impl<I, O> Drop for Leading<'_, I, O> {
    fn drop(&mut self) {
        let mut waiting = self.rounds.lock();
        let Some(queue) = waiting.get_mut(self.key) else { return };
        // A waiting call whose future was dropped meanwhile cannot lead: the next one does.
        while !queue.is_empty() {
            if queue.remove(0).1.send(Turn::Lead).is_ok() {
                return;
            }
        }
        waiting.remove(self.key);
    }
}

impl<I, O> Rounds<I, O> {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Queue<I, O>>> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<I: Clone, O> Rounds<I, O> {
    /// Calls waiting for the next round of `key` (None: no round of it under way).
    #[cfg(test)]
    pub(crate) fn waiting(&self, key: &str) -> Option<usize> {
        self.lock().get(key).map(Vec::len)
    }

    /// Whether no key has a round under way.
    #[cfg(test)]
    pub(crate) fn is_idle(&self) -> bool {
        self.lock().is_empty()
    }

    /// The answer for `item` of `key`: `ask(items)` answers a round's items in their order (Err: no answer, for
    /// every item of the round). Calls of the same key made meanwhile share one `ask`, the leader's item first.
    pub(crate) async fn call<F, Fut>(&self, key: &str, item: I, ask: F) -> Result<O, String>
    where
        F: FnOnce(Vec<I>) -> Fut,
        Fut: Future<Output = Result<Vec<O>, String>>,
    {
        let wait = {
            let mut waiting = self.lock();
            match waiting.get_mut(key) {
                Some(queue) => {
                    let (tx, rx) = oneshot::channel();
                    queue.push((item.clone(), tx));
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
                Ok(Turn::Answered(answer)) => return answer,
                Ok(Turn::Lead) => {}
                Err(_) => return Err("the round this call joined stopped unanswered".into()),
            }
        }
        let _leading = Leading { rounds: self, key };
        // Calls that are ready now (the rest of a batch) join this round rather than wait for the next.
        tokio::task::yield_now().await;
        let joined = std::mem::take(self.lock().get_mut(key).expect("a leader's entry stays while it leads"));
        let mut items = Vec::with_capacity(joined.len() + 1);
        items.push(item);
        items.extend(joined.iter().map(|(i, _)| i.clone()));
        let wanted = items.len();
        let answers = match ask(items).await {
            Ok(answers) if answers.len() == wanted => Ok(answers),
            Ok(answers) => Err(format!("{} answers for {wanted} calls", answers.len())),
            Err(e) => Err(e),
        };
        match answers {
            Ok(answers) => {
                let mut answers = answers.into_iter();
                let own = answers.next().expect("one answer per item");
                for ((_, tx), answer) in joined.into_iter().zip(answers) {
                    let _ = tx.send(Turn::Answered(Ok(answer)));
                }
                Ok(own)
            }
            Err(e) => {
                for (_, tx) in joined {
                    let _ = tx.send(Turn::Answered(Err(e.clone())));
                }
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test]
    async fn a_batch_of_calls_is_asked_in_two_rounds_and_each_gets_its_own_answer() {
        let rounds = Arc::new(Rounds::<u32, u32>::default());
        let asked = Arc::new(Mutex::new(Vec::new()));
        let calls = (0..6u32).map(|i| {
            let (rounds, asked) = (rounds.clone(), asked.clone());
            async move {
                let ask = |items: Vec<u32>| async move {
                    asked.lock().expect("asked").push(items.clone());
                    tokio::task::yield_now().await;
                    Ok(items.iter().map(|i| i * 10).collect())
                };
                rounds.call("portfolio", i, ask).await
            }
        });
        // Polled together, as a batch's futures are: the first leads alone, the rest join the next round.
        let answers = futures::future::join_all(calls).await;
        assert_eq!(answers, (0..6).map(|i| Ok(i * 10)).collect::<Vec<_>>());
        let asked = asked.lock().expect("asked").clone();
        assert_eq!(asked.iter().map(Vec::len).sum::<usize>(), 6, "each call asked once: {asked:?}");
        assert!(asked.len() <= 2, "one round trip per round: {asked:?}");
        assert!(rounds.is_idle());
    }

    #[tokio::test]
    async fn a_short_answer_fails_every_call_of_its_round() {
        let rounds = Rounds::<u32, u32>::default();
        let answer = rounds.call("k", 1, |_| async { Ok(vec![]) }).await;
        assert_eq!(answer, Err("0 answers for 1 calls".to_string()));
        assert!(rounds.is_idle());
    }
}
