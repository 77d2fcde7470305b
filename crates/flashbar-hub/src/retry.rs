//! Backoff between attempts, interruptible by cancel.

use crate::config::RetryPolicy;
use crate::error::HubError;
use crate::CancelToken;
use std::time::Duration;

/// The pause before retry number `attempt` (1-based).
pub(crate) fn backoff(policy: &RetryPolicy, attempt: u32) -> Duration {
    let factor = 1u32
        .checked_shl(attempt.saturating_sub(1))
        .unwrap_or(u32::MAX);
    policy
        .base_delay
        .checked_mul(factor)
        .unwrap_or(policy.max_delay)
        .min(policy.max_delay)
}

/// Sleeps, unless cancelled first.
pub(crate) async fn pause(delay: Duration, cancel: &CancelToken) -> Result<(), HubError> {
    tokio::select! {
        _ = cancel.cancelled() => Err(HubError::Cancelled),
        _ = tokio::time::sleep(delay) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_then_caps() {
        let policy = RetryPolicy {
            max_retries: 10,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_millis(500),
        };
        let delays: Vec<u128> = (1..=5).map(|a| backoff(&policy, a).as_millis()).collect();
        assert_eq!(delays, vec![100, 200, 400, 500, 500]);
        assert_eq!(backoff(&policy, 40).as_millis(), 500);
    }
}
