//! GPU isolation violations on the Kubernetes side: a Warning Event on the pod when a violation
//! starts ([`report_events`]), and with `isolation.policy: taint` a `NoSchedule` taint on the
//! node while any violation lasts ([`keep_taint`]). Both follow the violations the telemetry
//! task publishes (`telemetry::isolation`, through the daemon's wiring).
//!
//! Events: core/v1, reason [`EVENT_REASON`], one per start of a violation (a pod container using
//! one GPU it was not allocated), deduplicated (no second Event for the same container and GPU
//! within [`EventLimits::dedup`]) and rate-limited (a bucket of [`EventLimits::burst`] Events,
//! refilled by one every [`EventLimits::every`]; a violation held back gets its Event later if
//! it still lasts). dxdp needs `create` on events and nothing else: it never reads or updates an
//! Event, so repeats are counted here rather than in the Event's `count`.
//!
//! The taint: [`TAINT_KEY`]`:NoSchedule`, read-modify-write of `spec.taints` with a JSON merge
//! patch conditional on the Node's `resourceVersion` (the taints are one list on the API server:
//! a patch without the condition could drop a taint someone else added meanwhile). At start the
//! node is reconciled once the first audit is known (at the latest after the start grace): a
//! taint an earlier run left is removed when no violation is known, also with `policy: audit`.
//! Once on, the taint stays at least [`TAINT_MIN_HOLD`] (with `policy: taint`); the Node is
//! read again whenever a violation starts. An Event the API server refuses (4xx other than 409
//! and 429) is dropped rather than retried, so that it holds back no other.
//!
//! Every failure is logged once per distinct error, counted, and retried with backoff; device
//! serving never waits for any of it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams, PostParams};
use tokio::sync::watch;
use tokio::time::Instant;

use super::{Cluster, FIELD_MANAGER};
use crate::config::file::IsolationPolicy;
use crate::config::Config;
use crate::observe::isolation_metrics::{EventResult, IsolationMetrics, TaintResult};
use crate::util::errors::chain;
use crate::util::retry::{random, Backoff};
use dxdp_core::telemetry::isolation::Violation;
use dxdp_core::telemetry::PodRef;

/// The taint dxdp puts on its node while a violation lasts (`policy: taint`). dxdp owns this
/// key: it removes every taint with it when no violation lasts.
pub const TAINT_KEY: &str = "directx.microsoft.com/isolation-violation";

/// The taint's effect: new pods that do not tolerate it are not scheduled on the node; pods
/// running there keep running.
pub const TAINT_EFFECT: &str = "NoSchedule";

/// The reason of the Events.
pub const EVENT_REASON: &str = "GPUIsolationViolation";

/// How Events are deduplicated and rate-limited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventLimits {
    /// Events that may be sent at once.
    pub burst: u32,
    /// One more Event may be sent per this much time.
    pub every: Duration,
    /// No second Event for the same container and GPU within this time of the last one.
    pub dedup: Duration,
}

/// The daemon's limits: 10 at once, then one a minute; one per container and GPU an hour.
pub const EVENT_LIMITS: EventLimits = EventLimits {
    burst: 10,
    every: Duration::from_secs(60),
    dedup: Duration::from_secs(3600),
};

/// What identifies a violation: the pod container and the GPU it uses.
type Key = (PodRef, String);

/// The deduplication and rate limit of Events (pure: the caller gives the time), by key `K`
/// (here a violation's pod container and GPU; the `GPUUnhealthy` Events of `cluster::health`
/// use it too, with their own key).
#[derive(Debug)]
pub struct EventGate<K = Key> {
    limits: EventLimits,
    tokens: u32,
    /// When the last token was added (or the bucket was last full).
    refilled: Instant,
    /// When the last Event per key was sent.
    sent: HashMap<K, Instant>,
}

impl<K: std::hash::Hash + Eq> EventGate<K> {
    /// A full bucket at `now`.
    pub fn new(limits: EventLimits, now: Instant) -> Self {
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
    pub fn is_duplicate(&self, key: &K, now: Instant) -> bool {
        self.sent
            .get(key)
            .is_some_and(|t| now.saturating_duration_since(*t) < self.limits.dedup)
    }

    /// Takes one Event from the bucket; false when it is empty.
    pub fn take(&mut self, now: Instant) -> bool {
        self.refill(now);
        if self.tokens == 0 {
            return false;
        }
        self.tokens -= 1;
        true
    }

    /// When the next Event may be sent (after an empty [`EventGate::take`]).
    pub fn next_token(&self) -> Instant {
        self.refilled + self.limits.every
    }

    /// Records that an Event for `key` was sent at `now`, and forgets keys whose window ended.
    pub fn sent(&mut self, key: K, now: Instant) {
        let dedup = self.limits.dedup;
        self.sent
            .retain(|_, t| now.saturating_duration_since(*t) < dedup);
        self.sent.insert(key, now);
    }
}

/// The Event for a violation on `node` at `now` (a new object each time: dxdp only creates).
pub fn event(v: &Violation, node: &str, now: Time) -> Event {
    super::events::warning(
        super::events::Warning {
            namespace: v.pod.namespace.clone(),
            involved: super::events::container_ref(&v.pod.namespace, &v.pod.pod, &v.pod.container),
            related: Some(super::events::node_ref(node)),
            reason: EVENT_REASON,
            action: "UseUnallocatedGPU",
            message: format!(
                "{}. Windows does not confine a process-isolated container to its GPU; see dxdp's docs/isolation.md",
                v.message()
            ),
        },
        node,
        now,
    )
}

/// Why an Event could not be created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventError {
    /// Worth another try with backoff (the API server or the network, a conflict, throttling).
    Retry(String),
    /// The API server refused this Event (4xx other than 409 and 429): it is dropped, so that it
    /// does not hold back the others. `kind` names the refusal for logging once.
    Drop { kind: String, why: String },
}

/// Classifies the API server's refusal of an Event in `namespace` (`code`, Status `message`).
pub fn event_refusal(code: u16, message: &str, namespace: &str) -> EventError {
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
                "cannot create Events in namespace {namespace}: {message} (grant create on events: the chart does with isolation.events or health.events true; or turn these Events off with isolation.events or health.events: false); the Event is dropped"
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
    /// Creates the Event for `v` in its pod's namespace.
    async fn create_event(&self, v: &Violation) -> Result<(), EventError> {
        let e = event(v, &self.node, Time(k8s_openapi::jiff::Timestamp::now()));
        self.post_event(&v.pod.namespace, &e).await
    }

    /// Creates `e` in `namespace` (within the call timeout).
    pub(crate) async fn post_event(&self, namespace: &str, e: &Event) -> Result<(), EventError> {
        let api: Api<Event> = Api::namespaced(self.client.clone(), namespace);
        let params = PostParams::default();
        match tokio::time::timeout(self.timeout, api.create(&params, e)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(kube::Error::Api(s))) => Err(event_refusal(s.code, &s.message, namespace)),
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

    /// Puts dxdp's taint on the node (`on`) or takes every taint with its key off. Returns
    /// whether the node changed.
    pub async fn set_isolation_taint(&self, on: bool) -> Result<bool, String> {
        const CONFLICTS: u32 = 3;
        for _ in 0..CONFLICTS {
            let node = self.get_node().await.map_err(|e| e.to_string())?;
            let taints: Vec<Taint> = node
                .spec
                .as_ref()
                .and_then(|s| s.taints.clone())
                .unwrap_or_default();
            // Ours is the key with its effect; the key with another effect (set by hand) is
            // replaced when the taint is wanted, and removed with it.
            let done = if on {
                taints
                    .iter()
                    .any(|t| t.key == TAINT_KEY && t.effect == TAINT_EFFECT)
            } else {
                !taints.iter().any(|t| t.key == TAINT_KEY)
            };
            if done {
                return Ok(false);
            }
            let mut next: Vec<Taint> = taints.into_iter().filter(|t| t.key != TAINT_KEY).collect();
            if on {
                next.push(Taint {
                    key: TAINT_KEY.into(),
                    effect: TAINT_EFFECT.into(),
                    ..Taint::default()
                });
            }
            let body = serde_json::json!({
                "metadata": {"resourceVersion": node.metadata.resource_version},
                "spec": {"taints": next},
            });
            let params = PatchParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..PatchParams::default()
            };
            let patch = Patch::Merge(&body);
            match tokio::time::timeout(self.timeout, self.api.patch(&self.node, &params, &patch))
                .await
            {
                Ok(Ok(_)) => return Ok(true),
                // The node changed since it was read: read it again.
                Ok(Err(kube::Error::Api(s))) if s.code == 409 => continue,
                Ok(Err(kube::Error::Api(s))) if s.code == 403 => {
                    return Err(format!(
                        "cannot patch node {}: {} (grant patch on nodes: the chart does with nodeApi.enabled)",
                        self.node, s.message
                    ))
                }
                Ok(Err(e)) => return Err(format!("cannot patch node {}: {}", self.node, chain(&e))),
                Err(_) => {
                    return Err(format!(
                        "the API server did not answer a patch of node {} within {} s",
                        self.node,
                        self.timeout.as_secs_f64()
                    ))
                }
            }
        }
        Err(format!(
            "node {} changed under every one of {CONFLICTS} attempts to update its taints",
            self.node
        ))
    }
}

use dxdp_core::telemetry::isolation::Active;

/// Logs an error the first time it is seen (debug after), so that an outage is said once.
pub(super) fn say_once(last: &mut Option<String>, why: String, what: &str) {
    if last.as_deref() != Some(why.as_str()) {
        tracing::warn!("{what}: {why}; retrying with backoff (device serving is not affected)");
        *last = Some(why);
    } else {
        tracing::debug!("{what}: {why}");
    }
}

/// Sends an Event when a violation starts, deduplicated and rate-limited by `limits`, until
/// `active` closes. With `isolation.events: false` in `config`, nothing is sent.
pub async fn report_events(
    cluster: Cluster,
    mut active: watch::Receiver<Active>,
    config: watch::Receiver<Arc<Config>>,
    metrics: IsolationMetrics,
    limits: EventLimits,
    backoff: Backoff,
) {
    let mut gate = EventGate::new(limits, Instant::now());
    let mut seen: BTreeSet<Key> = BTreeSet::new();
    let mut pending: BTreeMap<Key, Violation> = BTreeMap::new();
    let mut held_back: BTreeSet<Key> = BTreeSet::new();
    let mut failures = 0u32;
    let mut retry_at: Option<Instant> = None;
    let mut last_error: Option<String> = None;
    let mut dropped_said: BTreeSet<String> = BTreeSet::new();
    loop {
        let now = Instant::now();
        let current: Vec<Violation> = active
            .borrow_and_update()
            .as_deref()
            .cloned()
            .unwrap_or_default();
        let keys: BTreeSet<Key> = current.iter().map(Violation::key).collect();
        pending.retain(|k, _| keys.contains(k));
        held_back.retain(|k| keys.contains(k));
        let send = config.borrow().isolation.events;
        for v in current {
            let key = v.key();
            if seen.contains(&key) {
                if let Some(p) = pending.get_mut(&key) {
                    *p = v;
                }
            } else if !send {
                metrics.event(EventResult::Disabled);
            } else if gate.is_duplicate(&key, now) {
                metrics.event(EventResult::Deduplicated);
            } else {
                pending.insert(key, v);
            }
        }
        seen = keys;
        if !send {
            pending.clear();
            held_back.clear();
        }
        let mut wake = retry_at;
        if retry_at.is_none_or(|t| now >= t) {
            retry_at = None;
            wake = None;
            while let Some((key, v)) = pending
                .first_key_value()
                .map(|(k, v)| (k.clone(), v.clone()))
            {
                if !gate.take(Instant::now()) {
                    for k in pending.keys() {
                        if held_back.insert(k.clone()) {
                            metrics.event(EventResult::RateLimited);
                        }
                    }
                    wake = Some(gate.next_token());
                    break;
                }
                match cluster.create_event(&v).await {
                    Ok(()) => {
                        metrics.event(EventResult::Sent);
                        if failures > 0 {
                            tracing::info!("Events about GPU isolation violations are created again after {failures} failed attempts");
                        }
                        failures = 0;
                        last_error = None;
                        gate.sent(key.clone(), Instant::now());
                        pending.remove(&key);
                        held_back.remove(&key);
                    }
                    Err(EventError::Drop { kind, why }) => {
                        // Refused for good: counted, said once per kind, and the next one goes.
                        metrics.event(EventResult::Error);
                        if dropped_said.insert(kind) {
                            tracing::warn!("cannot report a GPU isolation violation as an Event: {why} (said once; device serving is not affected)");
                        } else {
                            tracing::debug!(
                                "cannot report a GPU isolation violation as an Event: {why}"
                            );
                        }
                        pending.remove(&key);
                        held_back.remove(&key);
                    }
                    Err(EventError::Retry(why)) => {
                        metrics.event(EventResult::Error);
                        failures = failures.saturating_add(1);
                        say_once(
                            &mut last_error,
                            why,
                            "cannot report a GPU isolation violation as an Event",
                        );
                        retry_at = Some(Instant::now() + backoff.delay(failures, random()));
                        wake = retry_at;
                        break;
                    }
                }
            }
        }
        tokio::select! {
            changed = active.changed() => if changed.is_err() {
                // The telemetry side is gone (the daemon is stopping): wait to be stopped.
                std::future::pending::<()>().await;
            },
            () = sleep_until(wake) => {}
        }
    }
}

pub(super) async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// How long the taint waits for the first audit after a start before it counts as "no
/// violation known" (the telemetry sampler takes its first sample 2 s after the start).
pub const TAINT_START_GRACE: Duration = Duration::from_secs(60);

/// How long the taint stays at least once this run added it (or found it needed), so that use
/// that is brief but frequent does not open and close the node every sample.
pub const TAINT_MIN_HOLD: Duration = Duration::from_secs(600);

/// What the taint should be now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaintWant {
    /// On the node.
    On,
    /// Off the node.
    Off,
    /// Left as it is for this long, then decided again.
    Wait(Duration),
}

/// Decides the taint (pure): `violations` is how many last (`None`: no audit known yet),
/// `since_start` the time since this run started, `tainted_for` how long ago this run put the
/// taint on (or found it needed), `None` when it did not.
pub fn taint_want(
    policy: IsolationPolicy,
    violations: Option<usize>,
    since_start: Duration,
    start_grace: Duration,
    tainted_for: Option<Duration>,
    min_hold: Duration,
) -> TaintWant {
    match (policy, violations) {
        // The operator turned the policy off: at once.
        (IsolationPolicy::Audit, _) => TaintWant::Off,
        (IsolationPolicy::Taint, Some(n)) if n > 0 => TaintWant::On,
        (IsolationPolicy::Taint, None) if since_start < start_grace => {
            TaintWant::Wait(start_grace - since_start)
        }
        (IsolationPolicy::Taint, _) => match tainted_for {
            Some(t) if t < min_hold => TaintWant::Wait(min_hold - t),
            _ => TaintWant::Off,
        },
    }
}

/// Keeps dxdp's taint on the node while a violation lasts and `isolation.policy` is `taint`
/// (and for `min_hold` at least once it is on), and off otherwise, until both channels close.
/// A taint an earlier run left is removed once the first audit shows no violation, or after
/// `start_grace` when none comes. The Node is read again whenever a violation starts, so that
/// a taint removed by hand comes back.
pub async fn keep_taint(
    cluster: Cluster,
    mut active: watch::Receiver<Active>,
    mut config: watch::Receiver<Arc<Config>>,
    metrics: IsolationMetrics,
    backoff: Backoff,
    start_grace: Duration,
    min_hold: Duration,
) {
    let started = Instant::now();
    // What the node has, as dxdp last read or wrote it.
    let mut applied: Option<bool> = None;
    // When this run put the taint on, or found it needed.
    let mut tainted_at: Option<Instant> = None;
    let mut known_keys: BTreeSet<Key> = BTreeSet::new();
    let mut failures = 0u32;
    let mut last_error: Option<String> = None;
    let (mut active_open, mut config_open) = (true, true);
    loop {
        let policy = config.borrow_and_update().isolation.policy;
        let known = active.borrow_and_update().clone();
        let keys: BTreeSet<Key> = known
            .iter()
            .flat_map(|v| v.iter().map(Violation::key))
            .collect();
        if !keys.is_subset(&known_keys) {
            // A violation started: read the Node again rather than trust what was applied.
            applied = None;
        }
        known_keys = keys;
        let now = Instant::now();
        let want = taint_want(
            policy,
            known.as_ref().map(|v| v.len()),
            now.saturating_duration_since(started),
            start_grace,
            tainted_at.map(|t| now.saturating_duration_since(t)),
            min_hold,
        );
        let mut wake = None;
        match want {
            TaintWant::Wait(d) => wake = Some(now + d),
            TaintWant::On | TaintWant::Off => {
                let w = want == TaintWant::On;
                if applied != Some(w) {
                    match cluster.set_isolation_taint(w).await {
                        Ok(changed) => {
                            if changed && w {
                                metrics.taint_change(TaintResult::Added);
                                tracing::warn!(node = %cluster.node(), taint = TAINT_KEY, "node tainted {TAINT_KEY}:{TAINT_EFFECT} (isolation.policy: taint): a pod container uses a GPU it was not allocated, so no new pod is scheduled here until it stops");
                            } else if changed {
                                metrics.taint_change(TaintResult::Removed);
                                tracing::info!(node = %cluster.node(), taint = TAINT_KEY, "taint {TAINT_KEY} removed: no GPU isolation violation lasts (or the policy is audit)");
                            }
                            metrics.tainted(w);
                            applied = Some(w);
                            failures = 0;
                            last_error = None;
                        }
                        Err(why) => {
                            metrics.taint_change(TaintResult::Error);
                            failures = failures.saturating_add(1);
                            say_once(
                                &mut last_error,
                                why,
                                if w {
                                    "cannot taint the node for a GPU isolation violation"
                                } else {
                                    "cannot remove dxdp's isolation taint from the node"
                                },
                            );
                            wake = Some(Instant::now() + backoff.delay(failures, random()));
                        }
                    }
                }
                if applied == Some(true) && tainted_at.is_none() {
                    tainted_at = Some(Instant::now());
                } else if applied == Some(false) {
                    tainted_at = None;
                }
            }
        }
        if !active_open && !config_open && wake.is_none() {
            std::future::pending::<()>().await;
        }
        tokio::select! {
            changed = active.changed(), if active_open => active_open = changed.is_ok(),
            changed = config.changed(), if config_open => config_open = changed.is_ok(),
            () = sleep_until(wake) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dxdp_core::telemetry::isolation::{Adapter, ViolationKind};

    fn key(pod: &str) -> Key {
        (
            PodRef {
                namespace: "n".into(),
                pod: pod.into(),
                container: "c".into(),
            },
            "gpu-1".into(),
        )
    }

    #[test]
    fn refused_events_are_dropped_and_a_terminating_namespace_is_not_called_rbac() {
        let terminating = "events \"p.1\" is forbidden: unable to create new content in namespace a because it is being terminated";
        match event_refusal(403, terminating, "a") {
            EventError::Drop { kind, why } => {
                assert_eq!(kind, "namespace terminating");
                assert!(why.starts_with("namespace a is being terminated"), "{why}");
                assert!(!why.contains("grant"), "{why}");
            }
            other => panic!("{other:?}"),
        }
        match event_refusal(403, "events is forbidden: User cannot create resource", "a") {
            EventError::Drop { kind, why } => {
                assert_eq!(kind, "forbidden");
                assert!(why.contains("grant create on events"), "{why}");
            }
            other => panic!("{other:?}"),
        }
        for code in [400, 404, 422] {
            assert!(
                matches!(event_refusal(code, "m", "a"), EventError::Drop { .. }),
                "{code}"
            );
        }
        for code in [409, 429, 500, 503] {
            assert!(
                matches!(event_refusal(code, "m", "a"), EventError::Retry(_)),
                "{code}"
            );
        }
    }

    #[test]
    fn the_bucket_holds_a_burst_and_refills_one_per_period() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut gate: EventGate = EventGate::new(
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

    #[test]
    fn the_event_names_the_pod_container_and_both_adapters() {
        let v = Violation {
            pod: PodRef {
                namespace: "vision".into(),
                pod: "detect-0".into(),
                container: "worker".into(),
            },
            used: Adapter {
                device: "gpu-1".into(),
                luid: "0x00000000_0x00000002".into(),
                model: "T4".into(),
            },
            allocated: vec![Adapter {
                device: "gpu-0".into(),
                luid: "0x00000000_0x00000001".into(),
                model: "T4".into(),
            }],
            processes: 1,
            kind: ViolationKind::OtherDevice,
        };
        let now = Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).unwrap());
        let e = serde_json::to_value(event(&v, "node-1", now)).unwrap();
        // 1_700_000_000 s = 0x17979CFE362A0000 ns.
        assert_eq!(e["metadata"]["name"], "detect-0.17979cfe362a0000");
        assert_eq!(e["metadata"]["namespace"], "vision");
        assert_eq!(
            e["involvedObject"],
            serde_json::json!({"apiVersion": "v1", "kind": "Pod", "name": "detect-0", "namespace": "vision", "fieldPath": "spec.containers{worker}"})
        );
        assert_eq!(e["reason"], "GPUIsolationViolation");
        assert_eq!(e["type"], "Warning");
        assert_eq!(
            e["source"],
            serde_json::json!({"component": "dxdp", "host": "node-1"})
        );
        assert_eq!(e["related"]["kind"], "Node");
        assert_eq!(e["count"], 1);
        assert_eq!(
            e["message"],
            "container worker uses GPU gpu-1 (T4, LUID 0x00000000_0x00000002), which was not allocated to it (1 process); it was allocated gpu-0 (T4, LUID 0x00000000_0x00000001). Windows does not confine a process-isolated container to its GPU; see dxdp's docs/isolation.md"
        );
        // A long pod name is cut so that the Event's name stays within 253 characters.
        let mut long = v.clone();
        long.pod.pod = "p".repeat(253);
        let e = event(
            &long,
            "node-1",
            Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        );
        assert_eq!(e.metadata.name.as_deref().map(str::len), Some(253));
    }
}
