//! A token bucket that starts empty, so a drain that begins (for example when a breaker closes) ramps up
//! instead of bursting.

use std::time::Duration;
use tokio::time::Instant;

/// Token bucket of `rate` tokens per second holding at most `burst` tokens.
#[derive(Debug)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A bucket that starts empty. `rate` must be positive; `burst` is raised to at least 1.
    pub fn new(rate_per_s: f64, burst: f64) -> TokenBucket {
        debug_assert!(rate_per_s > 0.0, "rate must be positive");
        TokenBucket { rate: rate_per_s.max(0.001), burst: burst.max(1.0), tokens: 0.0, last: Instant::now() }
    }

    /// Changes the rate (for example when the breaker ramp fraction changes), keeping the tokens.
    pub fn set_rate(&mut self, rate_per_s: f64) {
        self.refill();
        self.rate = rate_per_s.max(0.001);
    }

    /// Current rate, tokens per second.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    fn refill(&mut self) {
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        self.last = now;
    }

    /// Takes a token if one is available now.
    pub fn try_take(&mut self) -> bool {
        self.refill();
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// How long until a token is available (zero if one is).
    pub fn wait_time(&mut self) -> Duration {
        self.refill();
        if self.tokens >= 1.0 { Duration::ZERO } else { Duration::from_secs_f64((1.0 - self.tokens) / self.rate) }
    }

    /// Waits for a token and takes it.
    pub async fn take(&mut self) {
        loop {
            let wait = self.wait_time();
            if wait.is_zero() && self.try_take() {
                return;
            }
            tokio::time::sleep(wait.max(Duration::from_millis(1))).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn grants_at_most_rate_times_elapsed_plus_burst() {
        let mut bucket = TokenBucket::new(50.0, 5.0);
        assert!(!bucket.try_take(), "starts empty");
        let start = Instant::now();
        let mut granted = 0u32;
        while start.elapsed() < Duration::from_secs(10) {
            bucket.take().await;
            granted += 1;
        }
        let bound = 50.0 * start.elapsed().as_secs_f64() + 5.0;
        assert!(f64::from(granted) <= bound, "{granted} > {bound}");
        assert!(granted >= 490, "too slow: {granted}");
    }

    #[tokio::test(start_paused = true)]
    async fn idle_time_only_fills_up_to_the_burst() {
        let mut bucket = TokenBucket::new(100.0, 3.0);
        tokio::time::sleep(Duration::from_secs(60)).await;
        let mut immediate = 0;
        while bucket.try_take() {
            immediate += 1;
        }
        assert_eq!(immediate, 3);
    }
}

/// A shared pacing gate: concurrent movers pass it one at a time at the bucket's rate, right before they
/// change the ledger and publish, so publish times stay smooth however the I/O before it jitters. Closing it
/// makes every waiter give up (the breaker opened, shutdown).
#[derive(Debug)]
pub struct Gate {
    bucket: tokio::sync::Mutex<TokenBucket>,
    open: std::sync::atomic::AtomicBool,
}

impl Gate {
    /// An open gate over a bucket that starts empty.
    pub fn new(rate_per_s: f64, burst: f64) -> Gate {
        Gate {
            bucket: tokio::sync::Mutex::new(TokenBucket::new(rate_per_s, burst)),
            open: std::sync::atomic::AtomicBool::new(true),
        }
    }

    /// Waits for a token (waiters are served in order). False when the gate is or got closed.
    pub async fn pass(&self) -> bool {
        if !self.is_open() {
            return false;
        }
        let mut bucket = self.bucket.lock().await;
        if !self.is_open() {
            return false;
        }
        bucket.take().await;
        self.is_open()
    }

    /// Closes the gate for good.
    pub fn close(&self) {
        self.open.store(false, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn is_open(&self) -> bool {
        self.open.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Changes the rate (for example with the breaker's ramp fraction).
    pub async fn set_rate(&self, rate_per_s: f64) {
        self.bucket.lock().await.set_rate(rate_per_s);
    }
}
