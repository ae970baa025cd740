//! Back-off: how long a message waits before it is tried again (jitter, doubling waits, the pause after a move
//! that could not complete) and the retry of one call after fixed pauses. Pure; every step uses it.

use rand::RngExt;
use std::time::Duration;

/// Redelivery delay after a move that could not complete (broker or ledger unavailable).
pub(crate) const RETRY_LATER: Duration = Duration::from_secs(1);

/// `base` doubled `doublings` times, at most `cap`: the back-off of every wait that grows each time a message
/// comes back (order waits, their redeliveries, the priority gate's holds).
pub(crate) fn doubled(base: u64, doublings: u32, cap: u64) -> u64 {
    base.saturating_mul(1u64 << doublings.min(32)).min(cap)
}

/// Decorrelated jitter: `min(cap, random(base, previous * 3))`.
pub(crate) fn decorrelated_jitter(base_ms: u64, cap_ms: u64, previous_ms: u64) -> u64 {
    let upper = previous_ms.saturating_mul(3).max(base_ms + 1);
    let pick = rand::rng().random_range(base_ms..upper);
    pick.min(cap_ms)
}

/// Runs `attempt` until it succeeds: once at once, then again after each of `pauses_ms`, running `before_retry`
/// after each pause. Returns the last result.
pub(crate) async fn retry_after_pauses<T, E, A, AF, B, BF>(
    pauses_ms: &[u64],
    mut before_retry: B,
    mut attempt: A,
) -> Result<T, E>
where
    A: FnMut() -> AF,
    AF: std::future::Future<Output = Result<T, E>>,
    B: FnMut() -> BF,
    BF: std::future::Future<Output = ()>,
{
    let mut result = attempt().await;
    for &pause_ms in pauses_ms {
        if result.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(pause_ms)).await;
        before_retry().await;
        result = attempt().await;
    }
    result
}

#[cfg(test)]
mod tests {
    use super::{decorrelated_jitter, retry_after_pauses};
    use std::cell::Cell;

    #[tokio::test(start_paused = true)]
    async fn retries_after_each_pause_until_success() {
        let (tries, hooks) = (Cell::new(0u32), Cell::new(0u32));
        let started = tokio::time::Instant::now();
        let result: Result<u32, ()> = retry_after_pauses(
            &[100, 300, 1_000],
            || async { hooks.set(hooks.get() + 1) },
            || async {
                tries.set(tries.get() + 1);
                if tries.get() == 3 { Ok(tries.get()) } else { Err(()) }
            },
        )
        .await;
        assert_eq!(result, Ok(3));
        assert_eq!(hooks.get(), 2, "the hook runs before each retry only");
        assert_eq!(started.elapsed().as_millis(), 400, "paused 100 then 300 ms");
    }

    #[tokio::test(start_paused = true)]
    async fn gives_the_last_error_after_the_last_pause() {
        let tries = Cell::new(0u32);
        let result: Result<(), u32> = retry_after_pauses(
            &[10, 20],
            || async {},
            || async {
                tries.set(tries.get() + 1);
                Err(tries.get())
            },
        )
        .await;
        assert_eq!(result, Err(3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_first_success_needs_no_pause() {
        let started = tokio::time::Instant::now();
        let result: Result<(), ()> = retry_after_pauses(&[1_000], || async {}, || async { Ok(()) }).await;
        assert_eq!(result, Ok(()));
        assert_eq!(started.elapsed().as_millis(), 0);
    }

    #[test]
    fn jitter_stays_between_base_and_cap() {
        let mut previous = 1_000;
        for _ in 0..1000 {
            let d = decorrelated_jitter(1_000, 60_000, previous);
            assert!((1_000..=60_000).contains(&d), "{d}");
            assert!(d < previous.max(1_000) * 3 + 1);
            previous = d;
        }
        assert_eq!(decorrelated_jitter(1_000, 1_000, 50_000), 1_000);
    }
}
