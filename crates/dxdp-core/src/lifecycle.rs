//! The node's lifecycle around its GPUs, as pure rules: when the startup taint (a taint the node
//! registers with, e.g. `directx.microsoft.com/gpu-not-ready:NoSchedule`) comes off, which pods
//! holding an Unhealthy device are evicted and how often, and when dxdp cordons and uncordons
//! the node (`health.remediation`). The daemon's side (reading the Node, PodResources, the
//! Eviction API) is `health::lifecycle` in the `dxdp` crate (startup taint, evictions, cordon);
//! docs/health.md#remediation and docs/install.md#startup-taint tell the operator.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::time::Duration;

use crate::quote::quote;

/// The default startup taint of the install recipes (docs/install.md).
pub const DEFAULT_STARTUP_TAINT: &str = "directx.microsoft.com/gpu-not-ready:NoSchedule";

/// A taint's effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TaintEffect {
    /// `NoSchedule`.
    NoSchedule,
    /// `PreferNoSchedule`.
    PreferNoSchedule,
    /// `NoExecute`.
    NoExecute,
}

impl TaintEffect {
    /// The name the API server uses.
    pub fn as_str(self) -> &'static str {
        match self {
            TaintEffect::NoSchedule => "NoSchedule",
            TaintEffect::PreferNoSchedule => "PreferNoSchedule",
            TaintEffect::NoExecute => "NoExecute",
        }
    }
}

/// A taint dxdp is configured to manage: its key and effect (a value, as `kubectl taint` and
/// kubelet's `--register-with-taints` allow, is accepted and not compared: AKS requires one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManagedTaint {
    /// The key (`directx.microsoft.com/gpu-not-ready`).
    pub key: String,
    /// The effect.
    pub effect: TaintEffect,
}

impl ManagedTaint {
    /// Parses `key:Effect` or `key=value:Effect` (the kubelet's `--register-with-taints`
    /// form); the message says what is wrong and what to write.
    pub fn parse(text: &str) -> Result<ManagedTaint, String> {
        let t = text.trim();
        let bad = |why: &str| {
            format!(
                "taint {} {why}: write key:Effect, e.g. {DEFAULT_STARTUP_TAINT}",
                quote(text)
            )
        };
        let (key_value, effect) = t.rsplit_once(':').ok_or_else(|| bad("has no effect"))?;
        let effect = match effect {
            "NoSchedule" => TaintEffect::NoSchedule,
            "PreferNoSchedule" => TaintEffect::PreferNoSchedule,
            "NoExecute" => TaintEffect::NoExecute,
            _ => {
                return Err(bad(
                    "has an effect that is not NoSchedule, PreferNoSchedule or NoExecute",
                ))
            }
        };
        let key = key_value.split_once('=').map_or(key_value, |(k, _)| k);
        if !valid_key(key) {
            return Err(bad("has a key that is not a label-style key (prefix/name, at most 63 characters of letters, digits, '-', '_', '.' in the name)"));
        }
        Ok(ManagedTaint {
            key: key.to_string(),
            effect,
        })
    }

    /// Whether a taint of the node (`key`, `effect` as the API server lists them) is this one.
    pub fn matches(&self, key: &str, effect: &str) -> bool {
        self.key == key && self.effect.as_str() == effect
    }
}

impl fmt::Display for ManagedTaint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.key, self.effect.as_str())
    }
}

/// A qualified key as Kubernetes takes one for labels and taints: an optional DNS prefix and
/// `/`, then a name of 1 to 63 characters, alphanumeric at both ends.
fn valid_key(key: &str) -> bool {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '.'))
    });
    name_ok && prefix_ok
}

/// What the startup taint's rule decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartupTaint {
    /// Keep it, for this reason (said in the log once).
    Keep(String),
    /// Remove it: the node's GPUs are schedulable (and, with the gate, validated).
    Remove,
}

/// The node's state the startup taint's rule reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartupFacts<'a> {
    /// How many served devices are Healthy (0: nothing to schedule; the taint stays).
    pub healthy_served: usize,
    /// Why the Node's `status.allocatable` does not show a served resource with healthy devices
    /// yet, one sentence each (empty: it shows them all).
    pub capacity_gaps: &'a [String],
    /// `validation.gate`: the taint waits for a passed validation too.
    pub gate: bool,
    /// `validation.enabled`.
    pub validation_enabled: bool,
    /// The Node's `directx.microsoft.com/validated` label (`true`, `false`; `None`: absent).
    pub validated: Option<&'a str>,
}

/// Whether the startup taint comes off now: once every served resource that has healthy devices
/// shows them in the Node's allocatable (and there is at least one), and, with
/// `validation.gate`, once the last validation passed (`validated=true`).
pub fn startup_taint(f: &StartupFacts<'_>) -> StartupTaint {
    if f.healthy_served == 0 {
        return StartupTaint::Keep("no served GPU is Healthy".into());
    }
    if !f.capacity_gaps.is_empty() {
        return StartupTaint::Keep(f.capacity_gaps.join("; "));
    }
    if f.gate {
        if !f.validation_enabled {
            return StartupTaint::Keep(
                "validation.gate is on, but validation.enabled is off: no validation will pass (turn validation on, or the gate off)".into(),
            );
        }
        match f.validated {
            Some("true") => {}
            Some("false") => {
                return StartupTaint::Keep(
                    "validation.gate: the last validation failed (label directx.microsoft.com/validated=false; see the GPUValidationFailed Event)".into(),
                )
            }
            _ => {
                return StartupTaint::Keep(
                    "validation.gate: waiting for a validation to pass (label directx.microsoft.com/validated)".into(),
                )
            }
        }
    }
    StartupTaint::Remove
}

/// The node-level fatal signal of `health.remediation.cordon`: every served device is Unhealthy
/// (and there is at least one). One bad GPU of several is a device matter (evicting its pods);
/// a node none of whose GPUs can serve is a node matter.
pub fn node_fatal(served: usize, unhealthy: usize) -> bool {
    served > 0 && unhealthy >= served
}

/// What dxdp does with the node's `spec.unschedulable` now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CordonWant {
    /// Cordon it and mark the cordon as dxdp's.
    Cordon,
    /// Lift dxdp's own cordon (and its mark).
    Uncordon,
    /// The node is schedulable again but dxdp's mark is still there (an operator uncordoned
    /// it): take the mark off, and leave the node alone for the rest of this fatal episode.
    ClearMark,
    /// Nothing to do.
    Leave,
}

/// The node as the cordon rule reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CordonFacts {
    /// How long the node-level fatal signal has lasted (`None`: it does not hold).
    pub fatal_for: Option<Duration>,
    /// `health.remediation.gracePeriod`.
    pub grace: Duration,
    /// The Node's `spec.unschedulable`.
    pub unschedulable: bool,
    /// Whether the Node carries dxdp's cordon mark.
    pub marked: bool,
    /// Whether dxdp already cordoned (or found its cordon lifted) in this fatal episode.
    pub acted_this_episode: bool,
}

/// Decides the cordon: dxdp cordons once per fatal episode after the grace period, never marks
/// or lifts a cordon it did not place, lifts its own once the signal no longer holds, and
/// respects an operator who uncordoned its cordon (no second cordon until the signal clears and
/// comes back).
pub fn cordon_want(f: CordonFacts) -> CordonWant {
    let fatal = f.fatal_for.is_some();
    let due = f.fatal_for.is_some_and(|d| d >= f.grace);
    match (f.unschedulable, f.marked) {
        (true, true) if !fatal => CordonWant::Uncordon,
        (true, true) => CordonWant::Leave,
        // Someone else's cordon: never touched, never marked.
        (true, false) => CordonWant::Leave,
        (false, true) => CordonWant::ClearMark,
        (false, false) if due && !f.acted_this_episode => CordonWant::Cordon,
        (false, false) => CordonWant::Leave,
    }
}

/// Whether a device Unhealthy for `unhealthy_for` is past `grace` (its holders are evicted).
pub fn evict_due(unhealthy_for: Duration, grace: Duration) -> bool {
    unhealthy_for >= grace
}

/// At most this many evictions per [`EVICTION_WINDOW`] on one node, whatever happens.
pub const EVICTIONS_PER_WINDOW: usize = 10;
/// The window of [`EVICTIONS_PER_WINDOW`].
pub const EVICTION_WINDOW: Duration = Duration::from_secs(60);
/// A pod evicted (or found gone) is not evicted again for this long: it may stay listed by the
/// kubelet while it terminates.
pub const EVICTED_MEMORY: Duration = Duration::from_secs(30 * 60);

/// The bound on evictions: no pod twice within [`EVICTED_MEMORY`], at most
/// [`EVICTIONS_PER_WINDOW`] attempts per [`EVICTION_WINDOW`], and a refused pod (a
/// PodDisruptionBudget's 429, an API error) tried again only after its own delay. Times are
/// milliseconds of any monotonic clock.
#[derive(Debug, Clone, Default)]
pub struct EvictionBound<K: Ord + Clone> {
    attempts: VecDeque<u64>,
    evicted: BTreeMap<K, u64>,
    retry_at: BTreeMap<K, u64>,
}

impl<K: Ord + Clone> EvictionBound<K> {
    /// An empty bound.
    pub fn new() -> Self {
        EvictionBound {
            attempts: VecDeque::new(),
            evicted: BTreeMap::new(),
            retry_at: BTreeMap::new(),
        }
    }

    fn forget_old(&mut self, now: u64) {
        let window = EVICTION_WINDOW.as_millis() as u64;
        while self
            .attempts
            .front()
            .is_some_and(|t| now.saturating_sub(*t) >= window)
        {
            self.attempts.pop_front();
        }
        let memory = EVICTED_MEMORY.as_millis() as u64;
        self.evicted.retain(|_, t| now.saturating_sub(*t) < memory);
    }

    /// Whether `key` may be evicted now; when it may, the attempt is counted.
    pub fn try_take(&mut self, key: &K, now: u64) -> bool {
        self.forget_old(now);
        if self.evicted.contains_key(key)
            || self.retry_at.get(key).is_some_and(|t| now < *t)
            || self.attempts.len() >= EVICTIONS_PER_WINDOW
        {
            return false;
        }
        self.attempts.push_back(now);
        self.retry_at.remove(key);
        true
    }

    /// `key` was evicted (or is gone): not again within [`EVICTED_MEMORY`].
    pub fn evicted(&mut self, key: K, now: u64) {
        self.retry_at.remove(&key);
        self.evicted.insert(key, now);
    }

    /// `key` was refused: tried again at `at` at the earliest.
    pub fn refused(&mut self, key: K, at: u64) {
        self.retry_at.insert(key, at);
    }

    /// Forgets refusals of keys not in `wanted` (their device recovered or their pod left).
    pub fn keep_only(&mut self, wanted: impl Fn(&K) -> bool) {
        self.retry_at.retain(|k, _| wanted(k));
    }

    /// The earliest time a refused key may be tried again, or the window frees a slot.
    pub fn next_at(&self) -> Option<u64> {
        let window = EVICTION_WINDOW.as_millis() as u64;
        let slot = (self.attempts.len() >= EVICTIONS_PER_WINDOW)
            .then(|| self.attempts.front().map(|t| t + window))
            .flatten();
        self.retry_at.values().copied().chain(slot).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taints_parse_as_the_kubelet_writes_them() {
        let t = ManagedTaint::parse("directx.microsoft.com/gpu-not-ready:NoSchedule").unwrap();
        assert_eq!(t.key, "directx.microsoft.com/gpu-not-ready");
        assert_eq!(t.effect, TaintEffect::NoSchedule);
        assert_eq!(
            t.to_string(),
            "directx.microsoft.com/gpu-not-ready:NoSchedule"
        );
        let v = ManagedTaint::parse("directx.microsoft.com/gpu-not-ready=true:NoSchedule").unwrap();
        assert_eq!(v, t);
        assert!(t.matches("directx.microsoft.com/gpu-not-ready", "NoSchedule"));
        assert!(!t.matches("directx.microsoft.com/gpu-not-ready", "NoExecute"));
        assert!(!t.matches("sku", "NoSchedule"));
        assert_eq!(
            ManagedTaint::parse("gpu:NoExecute").unwrap().effect,
            TaintEffect::NoExecute
        );
        assert_eq!(
            ManagedTaint::parse("directx.microsoft.com/gpu-not-ready").unwrap_err(),
            "taint \"directx.microsoft.com/gpu-not-ready\" has no effect: write key:Effect, e.g. directx.microsoft.com/gpu-not-ready:NoSchedule"
        );
        assert!(ManagedTaint::parse("a:Never")
            .unwrap_err()
            .contains("effect"));
        assert!(ManagedTaint::parse("a b:NoSchedule")
            .unwrap_err()
            .contains("key"));
        assert!(ManagedTaint::parse(":NoSchedule")
            .unwrap_err()
            .contains("key"));
        assert!(ManagedTaint::parse("Upper/x:NoSchedule")
            .unwrap_err()
            .contains("key"));
    }

    #[test]
    fn the_startup_taint_comes_off_on_capacity_and_with_the_gate_on_a_pass() {
        let gaps = ["directx.microsoft.com/display: not shown".to_string()];
        let base = StartupFacts {
            healthy_served: 2,
            capacity_gaps: &[],
            gate: false,
            validation_enabled: false,
            validated: None,
        };
        assert_eq!(startup_taint(&base), StartupTaint::Remove);
        assert_eq!(
            startup_taint(&StartupFacts {
                capacity_gaps: &gaps,
                ..base.clone()
            }),
            StartupTaint::Keep("directx.microsoft.com/display: not shown".into())
        );
        assert_eq!(
            startup_taint(&StartupFacts {
                healthy_served: 0,
                ..base.clone()
            }),
            StartupTaint::Keep("no served GPU is Healthy".into())
        );
        let gated = StartupFacts {
            gate: true,
            validation_enabled: true,
            ..base.clone()
        };
        assert!(
            matches!(startup_taint(&gated), StartupTaint::Keep(w) if w.contains("waiting for a validation"))
        );
        assert!(matches!(
            startup_taint(&StartupFacts { validated: Some("false"), ..gated.clone() }),
            StartupTaint::Keep(w) if w.contains("failed")
        ));
        assert_eq!(
            startup_taint(&StartupFacts {
                validated: Some("true"),
                ..gated.clone()
            }),
            StartupTaint::Remove
        );
        assert!(matches!(
            startup_taint(&StartupFacts { validated: Some("true"), validation_enabled: false, ..gated }),
            StartupTaint::Keep(w) if w.contains("validation.enabled is off")
        ));
    }

    #[test]
    fn the_cordon_is_dxdps_own_once_per_episode() {
        let grace = Duration::from_secs(600);
        let f = |fatal_for: Option<u64>, unschedulable, marked, acted| CordonFacts {
            fatal_for: fatal_for.map(Duration::from_secs),
            grace,
            unschedulable,
            marked,
            acted_this_episode: acted,
        };
        use CordonWant::*;
        // Within the grace period: nothing.
        assert_eq!(cordon_want(f(Some(599), false, false, false)), Leave);
        assert_eq!(cordon_want(f(Some(600), false, false, false)), Cordon);
        // Cordoned by dxdp, still fatal: left; healthy again: lifted.
        assert_eq!(cordon_want(f(Some(900), true, true, true)), Leave);
        assert_eq!(cordon_want(f(None, true, true, true)), Uncordon);
        // An operator's cordon: never lifted, never marked, whatever the health.
        assert_eq!(cordon_want(f(None, true, false, false)), Leave);
        assert_eq!(cordon_want(f(Some(900), true, false, false)), Leave);
        // The operator uncordoned dxdp's cordon: the mark goes, no second cordon this episode.
        assert_eq!(cordon_want(f(Some(900), false, true, true)), ClearMark);
        assert_eq!(cordon_want(f(Some(900), false, false, true)), Leave);
        // A new episode cordons again.
        assert_eq!(cordon_want(f(Some(600), false, false, false)), Cordon);
        assert!(node_fatal(2, 2));
        assert!(!node_fatal(2, 1));
        assert!(!node_fatal(0, 0));
        assert!(evict_due(grace, grace));
        assert!(!evict_due(grace - Duration::from_secs(1), grace));
    }

    #[test]
    fn evictions_are_bounded() {
        let mut b: EvictionBound<String> = EvictionBound::new();
        let k = |i: usize| format!("ml/train-{i}");
        assert!(b.try_take(&k(0), 1_000));
        b.evicted(k(0), 1_000);
        // Never the same pod twice within the memory.
        assert!(!b.try_take(&k(0), 2_000));
        assert!(b.try_take(&k(0), 1_000 + 30 * 60 * 1000));
        // A refusal waits for its own time.
        let mut b: EvictionBound<String> = EvictionBound::new();
        assert!(b.try_take(&k(1), 0));
        b.refused(k(1), 5_000);
        assert_eq!(b.next_at(), Some(5_000));
        assert!(!b.try_take(&k(1), 4_999));
        assert!(b.try_take(&k(1), 5_000));
        // At most ten attempts a minute (two taken above).
        for i in 2..10 {
            assert!(b.try_take(&k(i), 6_000), "{i}");
        }
        assert!(!b.try_take(&k(10), 6_000));
        assert_eq!(b.next_at(), Some(60_000));
        assert!(b.try_take(&k(10), 60_000));
        b.keep_only(|_| false);
    }
}
