//! The outcome of a Kubernetes Event dxdp tried to create, as the `result` label the Event
//! counters share (`dxdp_isolation_events_total`, `dxdp_health_events_total`; both are counted by
//! `cluster::events::EventSender`).
//!
//! Names and labels are a public interface; `docs/observability.md` lists them.

/// What became of one Kubernetes Event: the `result` label of `dxdp_isolation_events_total` and
/// `dxdp_health_events_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventResult {
    /// Created on the API server.
    Sent,
    /// The API server refused it or did not answer (retried with backoff while what it reports
    /// lasts; a refusal is dropped).
    Error,
    /// Not sent: an Event for the same key (pod container and device, and for `GPUUnhealthy` the
    /// reason) was sent within the deduplication window.
    Deduplicated,
    /// Held back by the rate limit (sent later if what it reports still lasts).
    RateLimited,
    /// Not sent: the feature's Events are off (`isolation.events`, `health.events`).
    Disabled,
}

impl EventResult {
    /// The label value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            EventResult::Sent => "sent",
            EventResult::Error => "error",
            EventResult::Deduplicated => "deduplicated",
            EventResult::RateLimited => "rate_limited",
            EventResult::Disabled => "disabled",
        }
    }

    /// Every result (their series are created at start, at 0).
    pub(crate) const ALL: [EventResult; 5] = [
        EventResult::Sent,
        EventResult::Error,
        EventResult::Deduplicated,
        EventResult::RateLimited,
        EventResult::Disabled,
    ];
}
