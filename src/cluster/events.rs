//! The Kubernetes Events dxdp creates (isolation violations, unhealthy GPUs, failed validation):
//! one builder, so that every Event is named, sourced and bounded the same way (`warning`),
//! one limiter (`EventGate`: deduplication and a rate limit), one way to create an Event and
//! tell a refusal to drop from a failure to retry (`Cluster::post_event`), and one sender of a
//! feature's Events that ties them together and counts every outcome (`EventSender`).
//!
//! dxdp only creates Events (it never reads or updates one): each is a new object named as
//! client-go names them (`<object>.<time in hex>`, within the 253 characters of a name), a
//! `Warning` from the component `dxdp` on this node, its message cut at `MESSAGE_MAX` bytes.
//! dxdp needs `create` on events and nothing else, so repeats are counted in its metrics rather
//! than in the Event's `count`. An Event the API server refuses (4xx other than 409 and 429) is
//! dropped rather than retried, so that it holds back no other.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::Hash;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Api, PostParams};
use tokio::time::Instant;

use super::{say_once, Cluster};
use crate::observe::event_metrics::EventResult;
use crate::util::errors::chain;
use crate::util::retry::{random, Backoff};

/// The longest message dxdp writes into an Event or a node condition, in bytes (cut at a
/// character boundary).
pub(crate) const MESSAGE_MAX: usize = 1024;

/// `message` cut to at most [`MESSAGE_MAX`] bytes, at a character boundary.
pub(crate) fn bounded(mut message: String) -> String {
    if message.len() > MESSAGE_MAX {
        let mut end = MESSAGE_MAX;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
    }
    message
}

/// What one Warning Event says, and about what.
#[derive(Debug, Clone)]
pub(crate) struct Warning {
    /// The namespace the Event is created in.
    pub(crate) namespace: String,
    /// The object it is about.
    pub(crate) involved: ObjectReference,
    /// Another object it concerns (the node, a Job), if any.
    pub(crate) related: Option<ObjectReference>,
    /// The reason (`GPUIsolationViolation`, `GPUUnhealthy`, `GPUValidationFailed`).
    pub(crate) reason: &'static str,
    /// The action (`UseUnallocatedGPU`, `ReportDeviceHealth`, `Validate`).
    pub(crate) action: &'static str,
    /// The message (cut to [`MESSAGE_MAX`]).
    pub(crate) message: String,
}

/// The Warning Event `w` reported by dxdp on `node` at `now` (a new object each time).
pub(crate) fn warning(w: Warning, node: &str, now: Time) -> Event {
    let nanos = now.0.as_nanosecond();
    let suffix = format!(".{:x}", nanos.max(0));
    let mut prefix = w.involved.name.clone().unwrap_or_default();
    prefix.truncate(253 - suffix.len());
    Event {
        metadata: ObjectMeta {
            name: Some(format!("{prefix}{suffix}")),
            namespace: Some(w.namespace),
            ..ObjectMeta::default()
        },
        involved_object: w.involved,
        related: w.related,
        reason: Some(w.reason.into()),
        message: Some(bounded(w.message)),
        type_: Some("Warning".into()),
        action: Some(w.action.into()),
        source: Some(EventSource {
            component: Some("dxdp".into()),
            host: Some(node.to_string()),
        }),
        reporting_component: Some("dxdp".into()),
        reporting_instance: Some(node.to_string()),
        first_timestamp: Some(now.clone()),
        last_timestamp: Some(now),
        count: Some(1),
        ..Event::default()
    }
}

/// A reference to the pod container `container` of `namespace/pod`.
pub(crate) fn container_ref(namespace: &str, pod: &str, container: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(pod.to_string()),
        namespace: Some(namespace.to_string()),
        field_path: Some(format!("spec.containers{{{container}}}")),
        ..ObjectReference::default()
    }
}

/// A reference to the Node `node`.
pub(crate) fn node_ref(node: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node.to_string()),
        ..ObjectReference::default()
    }
}

/// How Events are deduplicated and rate-limited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventLimits {
    /// Events that may be sent at once.
    pub burst: u32,
    /// One more Event may be sent per this much time.
    pub every: Duration,
    /// No second Event for the same key (pod container and GPU, ...) within this time of the last one.
    pub dedup: Duration,
}

/// The limits of the isolation and `GPUUnhealthy` Events: 10 at once, then one a minute; one per
/// key (pod container and GPU, and for `GPUUnhealthy` the reason) an hour.
pub const EVENT_LIMITS: EventLimits = EventLimits {
    burst: 10,
    every: Duration::from_secs(60),
    dedup: Duration::from_secs(3600),
};

/// The deduplication and rate limit of Events (pure: the caller gives the time), by key `K`
/// (what makes two Events the same: a violation's pod container and GPU, an Unhealthy device's
/// holder and reason, a failed validation's checks).
#[derive(Debug)]
pub(crate) struct EventGate<K> {
    limits: EventLimits,
    tokens: u32,
    /// When the last token was added (or the bucket was last full).
    refilled: Instant,
    /// When the last Event per key was sent.
    sent: HashMap<K, Instant>,
}

impl<K: std::hash::Hash + Eq> EventGate<K> {
    /// A full bucket at `now`.
    pub(crate) fn new(limits: EventLimits, now: Instant) -> Self {
        EventGate {
            limits,
            tokens: limits.burst,
            refilled: now,
            sent: HashMap::new(),
        }
    }

    fn refill(&mut self, now: Instant) {
        if self.tokens >= self.limits.burst {
            self.refilled = now;
            return;
        }
        let every = self.limits.every.as_nanos().max(1);
        let gained = now.saturating_duration_since(self.refilled).as_nanos() / every;
        if gained > 0 {
            let gained = u32::try_from(gained).unwrap_or(u32::MAX);
            self.tokens = self.tokens.saturating_add(gained).min(self.limits.burst);
            self.refilled = if self.tokens >= self.limits.burst {
                now
            } else {
                self.refilled + self.limits.every * gained
            };
        }
    }

    /// Whether an Event for `key` was sent within the deduplication window before `now`.
    pub(crate) fn is_duplicate(&self, key: &K, now: Instant) -> bool {
        self.sent
            .get(key)
            .is_some_and(|t| now.saturating_duration_since(*t) < self.limits.dedup)
    }

    /// Takes one Event from the bucket; false when it is empty.
    pub(crate) fn take(&mut self, now: Instant) -> bool {
        self.refill(now);
        if self.tokens == 0 {
            return false;
        }
        self.tokens -= 1;
        true
    }

    /// When the next Event may be sent (after an empty [`EventGate::take`]).
    pub(crate) fn next_token(&self) -> Instant {
        self.refilled + self.limits.every
    }

    /// Records that an Event for `key` was sent at `now`, and forgets keys whose window ended.
    pub(crate) fn sent(&mut self, key: K, now: Instant) {
        let dedup = self.limits.dedup;
        self.sent
            .retain(|_, t| now.saturating_duration_since(*t) < dedup);
        self.sent.insert(key, now);
    }
}

/// What grants `create` on the Events about pods (isolation and `GPUUnhealthy`), or turns them
/// off ([`Voice::grant`]).
pub(crate) const POD_EVENTS_GRANT: &str = "the chart does with isolation.events or health.events true; or turn these Events off with isolation.events or health.events: false";

/// Why an Event could not be created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum EventError {
    /// Worth another try with backoff (the API server or the network, a conflict, throttling).
    Retry(String),
    /// The API server refused this Event (4xx other than 409 and 429): it is dropped, so that it
    /// does not hold back the others. `kind` names the refusal for logging once.
    Drop { kind: String, why: String },
}

/// Classifies the API server's refusal of an Event in `namespace` (`code`, Status `message`);
/// `grant` says what grants `create` on events for these Events (or turns them off).
pub(crate) fn event_refusal(code: u16, message: &str, namespace: &str, grant: &str) -> EventError {
    match code {
        409 | 429 => EventError::Retry(format!(
            "cannot create an Event in namespace {namespace}: {message} ({code})"
        )),
        403 if message.contains("is being terminated") => EventError::Drop {
            kind: "namespace terminating".into(),
            why: format!("namespace {namespace} is being terminated, the Event for its pod is dropped: {message}"),
        },
        403 => EventError::Drop {
            kind: "forbidden".into(),
            why: format!(
                "cannot create Events in namespace {namespace}: {message} (grant create on events: {grant}); the Event is dropped"
            ),
        },
        400..=499 => EventError::Drop {
            kind: code.to_string(),
            why: format!(
                "the API server refused an Event in namespace {namespace} ({code}): {message}; the Event is dropped"
            ),
        },
        _ => EventError::Retry(format!(
            "cannot create an Event in namespace {namespace}: {message} ({code})"
        )),
    }
}

impl Cluster {
    /// Creates `e` in its namespace (within the call timeout); `grant` as for [`event_refusal`].
    pub(crate) async fn post_event(&self, e: &Event, grant: &str) -> Result<(), EventError> {
        let namespace = e.metadata.namespace.as_deref().unwrap_or_default();
        let api: Api<Event> = Api::namespaced(self.client.clone(), namespace);
        let params = PostParams::default();
        match tokio::time::timeout(self.timeout, api.create(&params, e)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(kube::Error::Api(s))) => {
                Err(event_refusal(s.code, &s.message, namespace, grant))
            }
            Ok(Err(e)) => Err(EventError::Retry(format!(
                "cannot create an Event in namespace {}: {}",
                namespace,
                chain(&e)
            ))),
            Err(_) => Err(EventError::Retry(format!(
                "the API server did not answer an Event within {} s",
                self.timeout.as_secs_f64()
            ))),
        }
    }
}

/// How a feature's Events are named in the log.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Voice {
    /// What fails when an Event cannot be created (`cannot report a GPU isolation violation as
    /// an Event`).
    pub(crate) failing: &'static str,
    /// The Events, when they are created again after failures (`Events about GPU isolation
    /// violations`).
    pub(crate) resumed: &'static str,
    /// What grants `create` on events for them, or turns them off, said when the API server
    /// forbids one (`the chart does with validation.enabled`).
    pub(crate) grant: &'static str,
}

/// One feature's Events, from what lasts now (by key `K`, each with its value `V`) to Events on
/// the API server. A key not seen at the last [`update`](EventSender::update) is queued, unless
/// the feature's Events are off (counted `disabled`) or one was sent for it within the
/// deduplication window (`deduplicated`); a key that ends takes its queued Event with it.
/// Queued Events are sent in key order as the rate limit allows (held back ones counted
/// `rate_limited` once, and sent later while their key lasts). A refusal drops one Event
/// (counted `error`, said once per kind of refusal) so that it holds back no other; a failure
/// stops sending until a backoff delay has passed (counted `error`, said once per distinct
/// error).
pub(crate) struct EventSender<K, V> {
    cluster: Cluster,
    /// The Event for a value on a node at a time.
    event: fn(&V, &str, Time) -> Event,
    /// Counts an outcome in the feature's metric.
    count: Box<dyn Fn(EventResult) + Send + Sync>,
    voice: Voice,
    backoff: Backoff,
    gate: EventGate<K>,
    /// The keys at the last update.
    seen: BTreeSet<K>,
    /// The Events to send.
    pending: BTreeMap<K, V>,
    /// The queued keys already counted `rate_limited`.
    held_back: BTreeSet<K>,
    /// Failed attempts in a row.
    failures: u32,
    /// When sending may be tried again after a failure.
    retry_at: Option<Instant>,
    /// The last failure, said once.
    last_error: Option<String>,
    /// The kinds of refusal already said.
    dropped_said: BTreeSet<String>,
}

impl<K, V> std::fmt::Debug for EventSender<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventSender")
            .field("voice", &self.voice)
            .field("pending", &self.pending.len())
            .field("failures", &self.failures)
            .finish()
    }
}

impl<K: Ord + Hash + Clone, V: Clone> EventSender<K, V> {
    /// A sender of the Events `event` makes, through `cluster`, limited by `limits`, retried
    /// with `backoff`, outcomes counted by `count` and named in the log by `voice`.
    pub(crate) fn new(
        cluster: Cluster,
        limits: EventLimits,
        backoff: Backoff,
        voice: Voice,
        event: fn(&V, &str, Time) -> Event,
        count: impl Fn(EventResult) + Send + Sync + 'static,
    ) -> Self {
        EventSender {
            cluster,
            event,
            count: Box::new(count),
            voice,
            backoff,
            gate: EventGate::new(limits, Instant::now()),
            seen: BTreeSet::new(),
            pending: BTreeMap::new(),
            held_back: BTreeSet::new(),
            failures: 0,
            retry_at: None,
            last_error: None,
            dropped_said: BTreeSet::new(),
        }
    }

    /// Takes what lasts at `now` (`current`, by key), with the feature's Events `on` or off:
    /// new keys are queued or counted, queued Events take the latest value of their key, and
    /// those of keys that ended (all of them when the Events are off) are forgotten.
    pub(crate) fn update(
        &mut self,
        current: impl IntoIterator<Item = (K, V)>,
        on: bool,
        now: Instant,
    ) {
        let current: Vec<(K, V)> = current.into_iter().collect();
        let keys: BTreeSet<K> = current.iter().map(|(k, _)| k.clone()).collect();
        self.pending.retain(|k, _| keys.contains(k));
        self.held_back.retain(|k| keys.contains(k));
        for (key, v) in current {
            if self.seen.contains(&key) {
                if let Some(p) = self.pending.get_mut(&key) {
                    *p = v;
                }
            } else if !on {
                (self.count)(EventResult::Disabled);
            } else if self.gate.is_duplicate(&key, now) {
                (self.count)(EventResult::Deduplicated);
            } else {
                self.pending.insert(key, v);
            }
        }
        self.seen = keys;
        if !on {
            self.pending.clear();
            self.held_back.clear();
        }
    }

    /// Takes a one-off occurrence (a failed validation run; `None`: none) as a new key of
    /// [`update`](EventSender::update), even when it occurred before (once its deduplication
    /// window has passed); it replaces what was still queued, which is never sent late.
    pub(crate) fn occurred(&mut self, occurrence: Option<(K, V)>, on: bool, now: Instant) {
        self.update(None, on, now);
        self.update(occurrence, on, now);
    }

    /// Sends the queued Events as far as the rate limit and the backoff allow. Returns when to
    /// send again (the next token, or the retry after a failure); `None` when nothing waits.
    pub(crate) async fn send(&mut self) -> Option<Instant> {
        if self.retry_at.is_some_and(|t| Instant::now() < t) {
            return self.retry_at;
        }
        self.retry_at = None;
        while let Some((key, v)) = self
            .pending
            .first_key_value()
            .map(|(k, v)| (k.clone(), v.clone()))
        {
            if !self.gate.take(Instant::now()) {
                for k in self.pending.keys() {
                    if self.held_back.insert(k.clone()) {
                        (self.count)(EventResult::RateLimited);
                    }
                }
                return Some(self.gate.next_token());
            }
            let e = (self.event)(
                &v,
                self.cluster.node(),
                Time(k8s_openapi::jiff::Timestamp::now()),
            );
            match self.cluster.post_event(&e, self.voice.grant).await {
                Ok(()) => {
                    (self.count)(EventResult::Sent);
                    if self.failures > 0 {
                        tracing::info!(
                            "{} are created again after {} failed attempts",
                            self.voice.resumed,
                            self.failures
                        );
                    }
                    self.failures = 0;
                    self.last_error = None;
                    self.gate.sent(key.clone(), Instant::now());
                    self.pending.remove(&key);
                    self.held_back.remove(&key);
                }
                Err(EventError::Drop { kind, why }) => {
                    // Refused for good: counted, said once per kind, and the next one goes.
                    (self.count)(EventResult::Error);
                    let failing = self.voice.failing;
                    if self.dropped_said.insert(kind) {
                        tracing::warn!(
                            "{failing}: {why} (said once; device serving is not affected)"
                        );
                    } else {
                        tracing::debug!("{failing}: {why}");
                    }
                    self.pending.remove(&key);
                    self.held_back.remove(&key);
                }
                Err(EventError::Retry(why)) => {
                    (self.count)(EventResult::Error);
                    self.failures = self.failures.saturating_add(1);
                    say_once(&mut self.last_error, why, self.voice.failing);
                    let at = Instant::now() + self.backoff.delay(self.failures, random());
                    self.retry_at = Some(at);
                    return Some(at);
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dxdp_core::telemetry::PodRef;

    fn key(pod: &str) -> (PodRef, String) {
        (
            PodRef {
                namespace: "n".into(),
                pod: pod.into(),
                container: "c".into(),
            },
            "gpu-1".into(),
        )
    }

    /// A sender whose API server is never asked, and what it counts.
    #[allow(clippy::type_complexity)]
    fn unsent() -> (
        EventSender<&'static str, u32>,
        std::sync::Arc<std::sync::Mutex<Vec<EventResult>>>,
    ) {
        let counted = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let c = counted.clone();
        let cluster = Cluster::at_url("http://127.0.0.1:9", "node-1").unwrap();
        let sender = EventSender::new(
            cluster,
            EVENT_LIMITS,
            Backoff::pauses(Duration::from_secs(1), Duration::from_secs(2)),
            Voice {
                failing: "f",
                resumed: "r",
                grant: "g",
            },
            |_, _, _| Event::default(),
            move |r| c.lock().unwrap().push(r),
        );
        (sender, counted)
    }

    #[tokio::test]
    async fn the_sender_queues_new_keys_only_counts_the_rest_and_forgets_ended_ones() {
        // No API server is asked: only updates are tested here (sending is in
        // tests/cluster/isolation.rs and tests/cluster/health_cluster.rs).
        let (mut sender, counted) = unsent();
        let t0 = Instant::now();
        sender.update([("a", 1), ("b", 1)], true, t0);
        assert_eq!(sender.pending, BTreeMap::from([("a", 1), ("b", 1)]));
        // A key seen before is not queued again; a queued one takes its latest value.
        sender.update([("a", 2), ("b", 2)], true, t0);
        assert_eq!(sender.pending, BTreeMap::from([("a", 2), ("b", 2)]));
        // An ended key takes its Event with it.
        sender.update([("a", 3)], true, t0);
        assert_eq!(sender.pending, BTreeMap::from([("a", 3)]));
        // Off: a new key is counted disabled, and nothing stays queued.
        sender.update([("a", 3), ("c", 1)], false, t0);
        assert!(sender.pending.is_empty());
        assert_eq!(*counted.lock().unwrap(), vec![EventResult::Disabled]);
        // A key sent within the window is counted deduplicated when it starts again.
        sender.gate.sent("d", t0);
        sender.update([("d", 1)], true, t0);
        assert!(sender.pending.is_empty());
        assert_eq!(
            *counted.lock().unwrap(),
            vec![EventResult::Disabled, EventResult::Deduplicated]
        );
        assert_eq!(sender.send().await, None, "nothing to send");
    }

    #[tokio::test]
    async fn a_one_off_occurrence_replaces_the_queued_one_and_comes_again_after_the_window() {
        // No API server is asked: only what is queued is tested here (sending the validation's
        // Event is in validation::task's tests).
        let (mut sender, counted) = unsent();
        let t0 = Instant::now();
        sender.occurred(Some(("a", 1)), true, t0);
        sender.occurred(Some(("b", 1)), true, t0);
        assert_eq!(
            sender.pending,
            BTreeMap::from([("b", 1)]),
            "never sent late"
        );
        sender.occurred(None, true, t0);
        assert!(sender.pending.is_empty());
        // Sent: the same again within the window is counted, after it is queued again.
        sender.gate.sent("a", t0);
        sender.occurred(Some(("a", 2)), true, t0 + Duration::from_secs(3599));
        assert!(sender.pending.is_empty());
        sender.occurred(Some(("a", 3)), true, t0 + Duration::from_secs(3600));
        assert_eq!(sender.pending, BTreeMap::from([("a", 3)]));
        sender.occurred(Some(("c", 1)), false, t0 + Duration::from_secs(3600));
        assert!(sender.pending.is_empty());
        assert_eq!(
            *counted.lock().unwrap(),
            vec![EventResult::Deduplicated, EventResult::Disabled]
        );
    }

    #[test]
    fn refused_events_are_dropped_and_a_terminating_namespace_is_not_called_rbac() {
        let terminating = "events \"p.1\" is forbidden: unable to create new content in namespace a because it is being terminated";
        match event_refusal(403, terminating, "a", POD_EVENTS_GRANT) {
            EventError::Drop { kind, why } => {
                assert_eq!(kind, "namespace terminating");
                assert!(why.starts_with("namespace a is being terminated"), "{why}");
                assert!(!why.contains("grant"), "{why}");
            }
            other => panic!("{other:?}"),
        }
        match event_refusal(
            403,
            "events is forbidden: User cannot create resource",
            "a",
            POD_EVENTS_GRANT,
        ) {
            EventError::Drop { kind, why } => {
                assert_eq!(kind, "forbidden");
                assert!(why.contains("grant create on events"), "{why}");
            }
            other => panic!("{other:?}"),
        }
        for code in [400, 404, 422] {
            assert!(
                matches!(
                    event_refusal(code, "m", "a", POD_EVENTS_GRANT),
                    EventError::Drop { .. }
                ),
                "{code}"
            );
        }
        for code in [409, 429, 500, 503] {
            assert!(
                matches!(
                    event_refusal(code, "m", "a", POD_EVENTS_GRANT),
                    EventError::Retry(_)
                ),
                "{code}"
            );
        }
    }

    #[test]
    fn the_bucket_holds_a_burst_and_refills_one_per_period() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut gate: EventGate<(PodRef, String)> = EventGate::new(
            EventLimits {
                burst: 2,
                every: s(60),
                dedup: s(3600),
            },
            t0,
        );
        assert!(gate.take(t0));
        assert!(gate.take(t0));
        assert!(!gate.take(t0), "the burst is spent");
        assert_eq!(gate.next_token(), t0 + s(60));
        assert!(!gate.take(t0 + s(59)));
        assert!(gate.take(t0 + s(60)), "one token a minute");
        assert!(!gate.take(t0 + s(61)));
        // Long idle: the bucket fills up to the burst, not beyond.
        assert!(gate.take(t0 + s(10_000)));
        assert!(gate.take(t0 + s(10_000)));
        assert!(!gate.take(t0 + s(10_000)));
    }

    #[test]
    fn a_second_event_for_the_same_container_and_gpu_waits_for_the_window() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut gate = EventGate::new(EVENT_LIMITS, t0);
        assert!(!gate.is_duplicate(&key("p"), t0));
        gate.sent(key("p"), t0);
        assert!(gate.is_duplicate(&key("p"), t0 + s(3599)));
        assert!(!gate.is_duplicate(&key("q"), t0 + s(1)));
        assert!(!gate.is_duplicate(&key("p"), t0 + s(3600)));
        // Old entries are forgotten when another is recorded.
        gate.sent(key("q"), t0 + s(3600));
        assert_eq!(gate.sent.len(), 1);
    }
}
