//! Per-key request rate limit: one token bucket per key id.
//!
//! Memory is bounded: buckets exist only for authenticated keys (a
//! stranger's request is refused before it gets one), at most
//! [`MAX_BUCKETS`]; when full, the buckets that have refilled completely
//! (idle keys, which lose nothing by being forgotten) are dropped first,
//! and if none has, the whole map is reset.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use belfry_core::MonoTime;
use belfry_core::auth::KeyId;

/// Most buckets held at once.
pub const MAX_BUCKETS: usize = 100_000;

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    updated: MonoTime,
}

/// Token buckets of `rate` requests per second holding at most `burst`.
#[derive(Debug)]
pub struct RateLimiter {
    /// Requests per second; `0.0`: no limit.
    rate: f64,
    burst: f64,
    buckets: Mutex<HashMap<KeyId, Bucket>>,
}

impl RateLimiter {
    /// `rate` requests per second (0: off), `burst` at once (0: twice the
    /// rate, at least 1).
    pub fn new(rate: u32, burst: u32) -> RateLimiter {
        let burst = if burst == 0 {
            (f64::from(rate) * 2.0).max(1.0)
        } else {
            f64::from(burst)
        };
        RateLimiter {
            rate: f64::from(rate),
            burst,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    pub fn enabled(&self) -> bool {
        self.rate > 0.0
    }

    /// Takes one token for `key` at `now`; `Err(wait)` when none is left,
    /// with how long until one is.
    ///
    /// # Errors
    /// The wait until the next token.
    pub fn check(&self, key: &KeyId, now: MonoTime) -> Result<(), Duration> {
        if !self.enabled() {
            return Ok(());
        }
        let mut buckets = self
            .buckets
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        if buckets.len() >= MAX_BUCKETS && !buckets.contains_key(key) {
            let full_after = Duration::from_secs_f64(self.burst / self.rate);
            buckets.retain(|_, b| now.since(b.updated) < full_after);
            if buckets.len() >= MAX_BUCKETS {
                buckets.clear();
            }
        }
        let bucket = buckets.entry(key.clone()).or_insert(Bucket {
            tokens: self.burst,
            updated: now,
        });
        let elapsed = now.since(bucket.updated).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * self.rate).min(self.burst);
        // Concurrent requests read the clock before the lock: an earlier
        // `now` arriving late must not move the bucket's time back (the
        // interval would be refilled twice).
        bucket.updated = bucket.updated.max(now);
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - bucket.tokens) / self.rate))
        }
    }

    /// Buckets held (for tests of the bound).
    pub fn len(&self) -> usize {
        self.buckets
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: usize) -> KeyId {
        KeyId::parse(&format!("key_{n}")).unwrap()
    }

    #[test]
    fn off_by_default() {
        let limiter = RateLimiter::new(0, 0);
        let now = MonoTime::ZERO;
        for _ in 0..10_000 {
            assert!(limiter.check(&key(1), now).is_ok());
        }
        assert!(limiter.is_empty());
    }

    #[test]
    fn a_burst_then_the_rate() {
        let limiter = RateLimiter::new(10, 5);
        let start = MonoTime::ZERO;
        for _ in 0..5 {
            assert!(limiter.check(&key(1), start).is_ok());
        }
        let wait = limiter.check(&key(1), start).unwrap_err();
        assert!(wait <= Duration::from_millis(100) && wait > Duration::ZERO);
        // Another key has its own bucket.
        assert!(limiter.check(&key(2), start).is_ok());
        // 100 ms later one token is back, not two.
        let later = start.plus(Duration::from_millis(100));
        assert!(limiter.check(&key(1), later).is_ok());
        assert!(limiter.check(&key(1), later).is_err());
        // A request that read the clock earlier refills nothing, and does
        // not make the next one refill the same interval again.
        assert!(limiter.check(&key(1), start).is_err());
        assert!(limiter.check(&key(1), later).is_err());
    }

    #[test]
    fn memory_is_bounded() {
        let limiter = RateLimiter::new(1, 1);
        let now = MonoTime::ZERO;
        for n in 0..MAX_BUCKETS + 10 {
            let _ = limiter.check(&key(n), now);
        }
        assert!(limiter.len() <= MAX_BUCKETS);
    }
}
