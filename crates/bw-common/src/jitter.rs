//! The replay back-off schedule: decorrelated jitter with a per-attempt base and cap.
//!
//! When a replayed message fails transiently again the dispatcher puts it straight back in the DLQ with
//! `not_before_unix_ms = now + next_replay_delay(..)` and `previous_delay_ms` set to the result.

use rand::{Rng, RngExt};

/// Base delay per replay attempt (1st, 2nd, 3rd, 4th and later), milliseconds.
pub const REPLAY_BASE_MS: [u64; 4] = [1_000, 3_000, 8_000, 25_000];
/// Cap per replay attempt, milliseconds.
pub const REPLAY_CAP_MS: [u64; 4] = [3_000, 8_000, 25_000, 60_000];

/// Delay before replay may take a message again after its `replay_attempt`-th replay failed (1-based; 0 is
/// treated as 1, 4 and above use the last step): `min(cap, random(base, max(base, previous * 3)))`.
/// The result is always within `[base, cap]` of the attempt.
pub fn next_replay_delay<R: Rng + ?Sized>(replay_attempt: u32, previous_delay_ms: u64, rng: &mut R) -> u64 {
    let step = (replay_attempt.max(1) as usize - 1).min(REPLAY_BASE_MS.len() - 1);
    let (base, cap) = (REPLAY_BASE_MS[step], REPLAY_CAP_MS[step]);
    let high = previous_delay_ms.saturating_mul(3).max(base);
    let picked = if high > base { rng.random_range(base..=high) } else { base };
    picked.min(cap)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    fn check(attempt: u32, previous: u64, expect_min: u64, expect_max: u64) {
        let mut rng = SmallRng::seed_from_u64((u64::from(attempt) * 7919).wrapping_add(previous));
        for _ in 0..2_000 {
            let d = next_replay_delay(attempt, previous, &mut rng);
            assert!((expect_min..=expect_max).contains(&d), "attempt {attempt} prev {previous}: {d}");
        }
    }

    #[test]
    fn delays_follow_the_schedule() {
        check(0, 0, 1_000, 1_000);
        check(1, 0, 1_000, 1_000);
        check(1, 900, 1_000, 2_700);
        check(1, 10_000, 1_000, 3_000);
        check(2, 1_000, 3_000, 3_000);
        check(2, 2_000, 3_000, 6_000);
        check(3, 3_000, 8_000, 9_000);
        check(3, 50_000, 8_000, 25_000);
        check(4, 8_500, 25_000, 25_500);
        check(5, 25_000, 25_000, 60_000);
        check(9, u64::MAX, 25_000, 60_000);
    }

    #[test]
    fn delays_are_jittered_and_reach_the_cap() {
        let mut rng = SmallRng::seed_from_u64(42);
        let draws: Vec<u64> = (0..500).map(|_| next_replay_delay(5, 25_000, &mut rng)).collect();
        let distinct: std::collections::BTreeSet<u64> = draws.iter().copied().collect();
        assert!(distinct.len() > 100, "not jittered: {} distinct values", distinct.len());
        assert!(draws.contains(&60_000), "cap never reached");
        assert!(draws.iter().any(|d| *d < 40_000), "never below 40 s");
    }

    #[test]
    fn a_chain_of_failures_walks_the_schedule() {
        let mut rng = SmallRng::seed_from_u64(7);
        let mut previous = 0;
        for attempt in 1..=6u32 {
            let d = next_replay_delay(attempt, previous, &mut rng);
            let step = (attempt as usize - 1).min(3);
            assert!(d >= REPLAY_BASE_MS[step] && d <= REPLAY_CAP_MS[step], "attempt {attempt}: {d}");
            previous = d;
        }
    }
}
