//! Waiting on conditions and checking pacing in tests.

use std::time::Duration;

/// Polls `pred` until it returns true or `timeout` passes; returns whether it became true.
pub async fn wait_until<F, Fut>(timeout: Duration, mut pred: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if pred().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Checks that events at `times_ms` (any order) kept to `rate_per_s` with a burst of `burst`: over every window,
/// n events need at least (n - burst - 1) / rate seconds, with `slack_ms` added to each window for clock
/// granularity and jitter (and one event of slack). Returns the first window that broke the bound.
pub fn check_pacing(times_ms: &[i64], rate_per_s: f64, burst: f64, slack_ms: f64) -> Result<(), String> {
    let mut times = times_ms.to_vec();
    times.sort_unstable();
    for i in 0..times.len() {
        for j in i + 1..times.len() {
            let n = (j - i + 1) as f64;
            let elapsed_s = ((times[j] - times[i]) as f64 + slack_ms) / 1000.0;
            if n > rate_per_s * elapsed_s + burst + 1.0 {
                return Err(format!("{n} events in {elapsed_s:.3} s exceed {rate_per_s}/s + {burst}"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_pacing;

    #[test]
    fn paced_events_pass_and_a_burst_fails() {
        let paced: Vec<i64> = (0..40).map(|i| i * 25).collect();
        assert_eq!(check_pacing(&paced, 40.0, 5.0, 5.0), Ok(()));
        let burst: Vec<i64> = (0..40).map(|i| i / 10).collect();
        assert!(check_pacing(&burst, 40.0, 5.0, 5.0).is_err());
    }
}
