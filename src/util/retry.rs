//! Retry delays: the one capped exponential backoff every retry in dxdp uses (registrations
//! with the kubelet, calls to the Kubernetes API server, task restarts, failed accepts and
//! binds, telemetry reads), with "equal jitter" where many nodes could retry in lockstep.

use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// How a call is retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The first retry delay (before jitter).
    pub initial: Duration,
    /// The longest retry delay (before jitter).
    pub max: Duration,
    /// How long one call may take.
    pub timeout: Duration,
}

impl Backoff {
    /// Delays from `initial` doubling to `max`, for a loop that only pauses between tries (its
    /// `timeout` is `max`, and unused).
    pub(crate) const fn pauses(initial: Duration, max: Duration) -> Backoff {
        Backoff {
            initial,
            max,
            timeout: max,
        }
    }

    /// The base delay before retry number `failures` (1 for the first retry): `initial`
    /// doubled per earlier failure, at most `max`.
    pub(crate) fn base(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(31);
        self.initial.saturating_mul(1u32 << doublings).min(self.max)
    }

    /// The delay actually slept: uniformly between half the base delay and the base delay
    /// ("equal jitter"), so that many nodes restarted together do not retry in lockstep.
    /// `random` is any 64-bit value.
    pub(crate) fn delay(&self, failures: u32, random: u64) -> Duration {
        let base = self.base(failures);
        let half = base / 2;
        let span = (base - half).as_nanos() as u64;
        let extra = if span == 0 { 0 } else { random % (span + 1) };
        half + Duration::from_nanos(extra)
    }
}

/// A random 64-bit value from the standard library's per-process random keys.
pub(crate) fn random() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0x5eed);
    h.finish()
}
