//! `health.signals` and `health.ignore`: the operator's policy over the fault signals of
//! [`dxdp_core::health::CATALOGUE`] (per signal: an action, how long, how many within a window);
//! and [`HealthReports`] (`health.events`, `health.nodeConditions`): what the cluster is told.
//!
//! Every check happens while the file is read, so a wrong name or value is refused with the
//! file, line and key (`health.signals.xid: unknown signal ...`).

use std::collections::BTreeMap;
use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Value};

use dxdp_core::devices::Resource;
use dxdp_core::health::reason::Reason;
use dxdp_core::health::{Action, Ambiguous, HealthPolicy, SignalPolicy};
use dxdp_core::quote::quote;

use super::schema::inline_schema;
use super::values::DurationText;

/// `health.events` and `health.nodeConditions`: what dxdp tells the cluster about device health
/// (docs/health.md#where-it-shows). Both need the API server (`NODE_NAME` and credentials);
/// both apply at once on a reload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthReports {
    /// `GPUUnhealthy` Warning Events on each pod holding an Unhealthy device (needs `create` on
    /// events).
    pub events: bool,
    /// The node conditions `DirectXGPUHealthy` and `DirectXGPUIsolation` (needs `patch` on
    /// `nodes/status`); turned off, dxdp removes the conditions it set.
    pub node_conditions: bool,
}

impl Default for HealthReports {
    fn default() -> Self {
        HealthReports {
            events: true,
            node_conditions: false,
        }
    }
}

/// The default of `health.remediation.gracePeriod`: how long a device stays Unhealthy before
/// its pods are evicted, and every served device before the node is cordoned.
pub(crate) const DEFAULT_GRACE_PERIOD: Duration = Duration::from_secs(10 * 60);

/// `health.remediation` as written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct RemediationFile {
    /// Evict (Eviction API, PodDisruptionBudgets respected) the pods holding a device Unhealthy
    /// for longer than `gracePeriod` (needs `create` on `pods/eviction`).
    pub(crate) evict_pods: Option<bool>,
    /// Cordon the node while every served device has been Unhealthy for `gracePeriod`, and lift
    /// only that cordon (marked with an annotation) once one is Healthy (needs `patch` on nodes).
    pub(crate) cordon: Option<bool>,
    /// How long an Unhealthy device (or node) is left before dxdp acts (default 10m).
    pub(crate) grace_period: Option<HealthDuration>,
}

/// `health.remediation`: what dxdp does about Unhealthy devices beyond telling (both off by
/// default; docs/health.md#remediation). Applies at once on a reload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Remediation {
    /// `evictPods`.
    pub evict_pods: bool,
    /// `cordon`.
    pub cordon: bool,
    /// `gracePeriod`.
    pub grace_period: Duration,
}

impl Default for Remediation {
    fn default() -> Self {
        Remediation {
            evict_pods: false,
            cordon: false,
            grace_period: DEFAULT_GRACE_PERIOD,
        }
    }
}

/// `health.thermal`: what "near the warning temperature" means for the `thermal` signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thermal {
    /// `health.thermal.marginCelsius`: a GPU within this many degrees Celsius of its warning
    /// temperature (or over it) is hot.
    pub margin_celsius: u32,
}

impl Default for Thermal {
    fn default() -> Self {
        Thermal {
            margin_celsius: dxdp_core::health::DEFAULT_THERMAL_MARGIN_CELSIUS,
        }
    }
}

/// `health.memoryOverUse`: when a container's GPU memory above its memory share is reported
/// (docs/health.md#memory-over-use). Applies at once on a reload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryOverUse {
    /// `health.memoryOverUse.gracePeriod`: how long a container may use more dedicated memory
    /// than its share before the `GPUMemoryOverUse` Event and the excess gauge.
    pub grace_period: Duration,
}

impl Default for MemoryOverUse {
    fn default() -> Self {
        MemoryOverUse {
            grace_period: dxdp_core::telemetry::overuse::DEFAULT_GRACE_PERIOD,
        }
    }
}

/// `health.memoryOverUse` as written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct MemoryOverUseFile {
    /// How long a container may use more dedicated GPU memory than its memory share before it
    /// is reported (default 2m).
    pub(crate) grace_period: Option<HealthDuration>,
}

/// How `config show` writes a grace period (`10m`).
pub(crate) fn show_duration(d: Duration) -> String {
    duration_text(d)
}

/// The largest `health.thermal.marginCelsius`: beyond it every warm GPU would be "near".
pub(crate) const MAX_THERMAL_MARGIN_CELSIUS: u32 = 30;

/// `health.thermal.marginCelsius` as written, checked while the file is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "u32")]
pub(crate) struct MarginCelsius(pub(crate) u32);

impl TryFrom<u32> for MarginCelsius {
    type Error = String;

    fn try_from(v: u32) -> Result<Self, Self::Error> {
        if v > MAX_THERMAL_MARGIN_CELSIUS {
            return Err(format!(
                "health.thermal.marginCelsius {v} is more than {MAX_THERMAL_MARGIN_CELSIUS}: give the degrees Celsius below the GPU's warning temperature that count as hot (default {})",
                dxdp_core::health::DEFAULT_THERMAL_MARGIN_CELSIUS
            ));
        }
        Ok(MarginCelsius(v))
    }
}

inline_schema!(MarginCelsius, {
    "description": "degrees Celsius below the warning temperature that count as hot (0: only at or over it)",
    "type": "integer",
    "minimum": 0,
    "maximum": 30
});

/// `health.thermal` as written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct ThermalFile {
    /// Degrees Celsius below the warning temperature that count as hot (default 5).
    pub(crate) margin_celsius: Option<MarginCelsius>,
}

/// The names of every signal, comma-separated (for messages).
fn known() -> String {
    Reason::ALL
        .iter()
        .skip(1)
        .map(|r| r.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// A signal's name (`tdr`, `problem_code`, ...), checked against the catalogue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(try_from = "String")]
pub(crate) struct SignalName(pub(crate) Reason);

impl TryFrom<String> for SignalName {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        Reason::signal_named(&s).map(SignalName).ok_or_else(|| {
            format!(
                "unknown health signal {}: the signals are {} (docs/health.md)",
                quote(&s),
                known()
            )
        })
    }
}

impl JsonSchema for SignalName {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "HealthSignal".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let names: Vec<&str> = Reason::ALL.iter().skip(1).map(|r| r.as_str()).collect();
        schemars::json_schema!({
            "description": "a health signal (docs/health.md)",
            "type": "string",
            "enum": names,
        })
    }
}

/// A duration of a health policy: `90s`, `15m`, `2h` or a number of seconds, from 1 s to 7 days.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "DurationText")]
pub(crate) struct HealthDuration(pub(crate) Duration);

impl TryFrom<DurationText> for HealthDuration {
    type Error = String;

    fn try_from(v: DurationText) -> Result<Self, Self::Error> {
        parse_duration(&v.text()).map(HealthDuration)
    }
}

inline_schema!(HealthDuration, {
    "description": "a duration: 90s, 15m, 2h or a number of seconds, from 1 s to 7 days",
    "anyOf": [
        {"type": "integer", "minimum": 1, "maximum": 604800},
        {"type": "string", "pattern": "^[0-9]+(s|m|h)?$"}
    ]
});

/// Parses `90s`, `15m`, `2h` or `90` (seconds), from 1 s to 7 days.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let (number, unit) = if let Some(n) = t.strip_suffix('s') {
        (n, 1)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60)
    } else if let Some(n) = t.strip_suffix('h') {
        (n, 3600)
    } else {
        (t, 1)
    };
    let bad = || {
        format!(
            "duration {} is not from 1s to 7 days: use e.g. 90s, 15m, 2h or a number of seconds",
            quote(text)
        )
    };
    let n: u64 = number.trim().parse().map_err(|_| bad())?;
    let secs = n.checked_mul(unit).ok_or_else(bad)?;
    if !(1..=7 * 24 * 3600).contains(&secs) {
        return Err(bad());
    }
    Ok(Duration::from_secs(secs))
}

/// An action's name in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ActionName {
    /// Unhealthy for `for` after the signal triggers (event signals).
    UnhealthyFor,
    /// Unhealthy until the condition clears, or until dxdp restarts (event signals).
    UnhealthyUntilCleared,
    /// Logged, counted, reported; health unchanged.
    EventOnly,
    /// Not even counted.
    Ignore,
}

/// `health.signals.<name>.ambiguous` as written: what an event does that cannot be told apart
/// among several devices of its driver's vendor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum AmbiguousName {
    /// Counted, logged and shown; no device is charged (the default).
    EventOnly,
    /// Charged to every device of the vendor (one tenant's resets can take them all).
    AllOfVendor,
}

/// `health.signals.<name>` as written.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct SignalFile {
    /// What the signal does.
    pub(crate) action: ActionName,
    /// How long the device stays Unhealthy (`unhealthy_for` only).
    #[serde(rename = "for")]
    pub(crate) for_: Option<HealthDuration>,
    /// Occurrences within `window` that trigger the action (event signals; default 1).
    pub(crate) count: Option<u32>,
    /// The window `count` is counted in (needed when `count` is above 1).
    pub(crate) window: Option<HealthDuration>,
    /// What an event does that cannot be told apart among two or more devices of its driver's
    /// vendor (event signals; default event_only).
    pub(crate) ambiguous: Option<AmbiguousName>,
}

impl SignalFile {
    /// The policy this entry gives `signal`, or why it cannot be one.
    pub(crate) fn policy(&self, signal: Reason) -> Result<SignalPolicy, String> {
        let name = signal.as_str();
        let action = match (self.action, self.for_) {
            (ActionName::UnhealthyFor, Some(d)) => Action::UnhealthyFor(d.0),
            (ActionName::UnhealthyFor, None) => {
                return Err(format!(
                    "health.signals.{name}: action unhealthy_for needs `for` (e.g. for: 15m)"
                ))
            }
            (_, Some(_)) => {
                return Err(format!(
                    "health.signals.{name}: `for` is only for action unhealthy_for"
                ))
            }
            (ActionName::UnhealthyUntilCleared, None) => Action::UnhealthyUntilCleared,
            (ActionName::EventOnly, None) => Action::EventOnly,
            (ActionName::Ignore, None) => Action::Ignore,
        };
        if signal.is_condition() {
            if matches!(action, Action::UnhealthyFor(_)) {
                return Err(format!(
                    "health.signals.{name}: {name} is a condition that lasts until it clears; use unhealthy_until_cleared, event_only or ignore"
                ));
            }
            if self.count.is_some() || self.window.is_some() {
                return Err(format!(
                    "health.signals.{name}: count and window are for event signals (tdr, live_kernel_event)"
                ));
            }
            if self.ambiguous.is_some() {
                return Err(format!(
                    "health.signals.{name}: ambiguous is for event signals (tdr, live_kernel_event); a condition is read per device"
                ));
            }
        }
        let count = self.count.unwrap_or(1);
        if count == 0 {
            return Err(format!("health.signals.{name}: count must be 1 or more"));
        }
        if count > 1 && self.window.is_none() {
            return Err(format!(
                "health.signals.{name}: count {count} needs a window (e.g. window: 10m)"
            ));
        }
        Ok(SignalPolicy {
            action,
            count,
            window: self.window.map(|w| w.0).unwrap_or_default(),
            ambiguous: match self.ambiguous {
                None | Some(AmbiguousName::EventOnly) => Ambiguous::EventOnly,
                Some(AmbiguousName::AllOfVendor) => Ambiguous::AllOfVendor,
            },
        })
    }
}

/// `health.signals`: every entry checked while the file is read (the message names the entry).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "BTreeMap<SignalName, SignalFile>")]
pub(crate) struct SignalsFile(pub(crate) BTreeMap<Reason, SignalPolicy>);

impl TryFrom<BTreeMap<SignalName, SignalFile>> for SignalsFile {
    type Error = String;

    fn try_from(m: BTreeMap<SignalName, SignalFile>) -> Result<Self, Self::Error> {
        let mut out = BTreeMap::new();
        for (name, entry) in m {
            out.insert(name.0, entry.policy(name.0)?);
        }
        Ok(SignalsFile(out))
    }
}

impl JsonSchema for SignalsFile {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "HealthSignals".into()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let entry = generator.subschema_for::<SignalFile>().to_value();
        let names: Vec<&str> = Reason::ALL.iter().skip(1).map(|r| r.as_str()).collect();
        schemars::json_schema!({
            "description": "per-signal actions (docs/health.md)",
            "type": "object",
            "propertyNames": {"enum": names},
            "additionalProperties": entry,
        })
    }
}

fn duration_text(d: Duration) -> String {
    let s = d.as_secs();
    if s.is_multiple_of(3600) {
        format!("{}h", s / 3600)
    } else if s.is_multiple_of(60) {
        format!("{}m", s / 60)
    } else {
        format!("{s}s")
    }
}

/// `health.signals` as `config show` prints it: every signal's policy in force.
pub(crate) fn show_signals(p: &HealthPolicy) -> Value {
    let mut out = serde_json::Map::new();
    for r in Reason::ALL.into_iter().skip(1) {
        let s = p.of(r);
        let mut v = json!({ "action": s.action.as_str() });
        if let Action::UnhealthyFor(d) = s.action {
            v["for"] = json!(duration_text(d));
        }
        if s.count > 1 {
            v["count"] = json!(s.count);
            v["window"] = json!(duration_text(s.window));
        }
        if !r.is_condition() && s.action != Action::Ignore {
            v["ambiguous"] = json!(s.ambiguous.as_str());
        }
        out.insert(r.as_str().to_string(), v);
    }
    Value::Object(out)
}

/// `health.ignore` as `config show` prints it.
pub(crate) fn show_ignore(p: &HealthPolicy) -> Value {
    json!(p.ignore.iter().map(|r| r.as_str()).collect::<Vec<_>>())
}

/// The label read when `fromNodeLabel` is `true`.
pub(crate) const DEFAULT_LABEL: &str = "node.kubernetes.io/instance-type";

/// One row of the table: devices per resource (a resource left out has no expectation).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Row {
    /// Display (WDDM) devices.
    pub(crate) display: Option<u32>,
    /// Compute (MCDM) devices.
    pub(crate) compute: Option<u32>,
}

impl Row {
    /// The counts of the resources the row names.
    pub(crate) fn counts(&self) -> BTreeMap<Resource, u32> {
        [
            (Resource::Display, self.display),
            (Resource::Compute, self.compute),
        ]
        .into_iter()
        .filter_map(|(r, n)| n.map(|n| (r, n)))
        .collect()
    }
}

/// `fromNodeLabel` as written: `true` (the instance-type label), `false`, or a label key.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "BoolOrText")]
pub(crate) enum FromNodeLabel {
    /// `true`: [`DEFAULT_LABEL`]; `false`: off.
    Switch(bool),
    /// The label key whose value is looked up (`[prefix/]name`).
    Key(String),
}

/// A boolean or a string, as YAML gives it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub(crate) enum BoolOrText {
    Bool(bool),
    Text(String),
}

impl TryFrom<BoolOrText> for FromNodeLabel {
    type Error = String;

    fn try_from(v: BoolOrText) -> Result<Self, Self::Error> {
        let s = match v {
            BoolOrText::Bool(b) => return Ok(FromNodeLabel::Switch(b)),
            BoolOrText::Text(s) => s,
        };
        let ok_part = |p: &str, max: usize| {
            !p.is_empty()
                && p.len() <= max
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        };
        let ok = match s.split_once('/') {
            Some((prefix, name)) => ok_part(prefix, 253) && ok_part(name, 63),
            None => ok_part(&s, 63),
        };
        if ok {
            Ok(FromNodeLabel::Key(s))
        } else {
            Err(format!(
                "health.expectedDevices.fromNodeLabel: {} is not a label key: write true (for {DEFAULT_LABEL}) or a key such as example.com/gpu-count",
                quote(&s)
            ))
        }
    }
}

impl JsonSchema for FromNodeLabel {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "FromNodeLabel".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "derive the counts not given from this node label's value through the instance-type table (true: node.kubernetes.io/instance-type)",
            "anyOf": [
                {"type": "boolean"},
                {"type": "string", "pattern": "^([A-Za-z0-9._-]+/)?[A-Za-z0-9._-]+$"}
            ]
        })
    }
}

/// `health.expectedDevices` as written (its meaning: `config::expected`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct ExpectedFile {
    /// Display (WDDM) devices this node should have.
    pub(crate) display: Option<u32>,
    /// Compute (MCDM) devices this node should have.
    pub(crate) compute: Option<u32>,
    /// Derive the counts not given from a node label through the instance-type table.
    pub(crate) from_node_label: Option<FromNodeLabel>,
    /// Rows added to the built-in instance-type table (a row here wins over a built-in one).
    pub(crate) instance_types: Option<BTreeMap<String, Row>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thermal_margin_is_whole_degrees_up_to_30() {
        #[derive(Debug, Deserialize)]
        struct Doc {
            #[allow(dead_code)]
            thermal: ThermalFile,
        }
        let read = |yaml: &str| {
            serde_saphyr::from_str::<Doc>(yaml)
                .map(|d| d.thermal.margin_celsius.map(|m| m.0))
                .map_err(|e| e.to_string())
        };
        assert_eq!(read("thermal: {marginCelsius: 0}"), Ok(Some(0)));
        assert_eq!(read("thermal: {marginCelsius: 30}"), Ok(Some(30)));
        assert_eq!(read("thermal: {}"), Ok(None));
        let err = read("thermal: {marginCelsius: 31}").unwrap_err();
        assert!(
            err.contains("health.thermal.marginCelsius 31 is more than 30"),
            "{err}"
        );
        assert!(read("thermal: {marginCelsius: -1}").is_err());
        assert!(read("thermal: {marginCelsius: 2.5}").is_err());
        assert_eq!(Thermal::default().margin_celsius, 5);
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("8d").is_err());
        assert!(parse_duration("169h").is_err());
    }

    #[test]
    fn entries_that_cannot_be_a_policy_say_why() {
        let e = |action, for_: Option<u64>, count, window: Option<u64>| SignalFile {
            action,
            for_: for_.map(|s| HealthDuration(Duration::from_secs(s))),
            count,
            window: window.map(|s| HealthDuration(Duration::from_secs(s))),
            ambiguous: None,
        };
        use ActionName::*;
        assert_eq!(
            e(UnhealthyFor, Some(900), Some(3), Some(600)).policy(Reason::Tdr),
            Ok(SignalPolicy {
                action: Action::UnhealthyFor(Duration::from_secs(900)),
                count: 3,
                window: Duration::from_secs(600),
                ambiguous: Ambiguous::EventOnly,
            })
        );
        let mut all = e(UnhealthyFor, Some(600), Some(3), Some(600));
        all.ambiguous = Some(AmbiguousName::AllOfVendor);
        assert_eq!(
            all.policy(Reason::Tdr).map(|p| p.ambiguous),
            Ok(Ambiguous::AllOfVendor)
        );
        let mut condition = e(UnhealthyUntilCleared, None, None, None);
        condition.ambiguous = Some(AmbiguousName::AllOfVendor);
        assert_eq!(
            condition.policy(Reason::ProblemCode),
            Err("health.signals.problem_code: ambiguous is for event signals (tdr, live_kernel_event); a condition is read per device".into())
        );
        let table: [(SignalFile, Reason, &str); 6] = [
            (
                e(UnhealthyFor, None, None, None),
                Reason::Tdr,
                "needs `for`",
            ),
            (
                e(EventOnly, Some(60), None, None),
                Reason::Tdr,
                "only for action unhealthy_for",
            ),
            (
                e(UnhealthyFor, Some(60), None, None),
                Reason::ProblemCode,
                "is a condition",
            ),
            (
                e(EventOnly, None, Some(2), Some(60)),
                Reason::DriverUpdate,
                "for event signals",
            ),
            (e(EventOnly, None, Some(0), None), Reason::Tdr, "1 or more"),
            (
                e(EventOnly, None, Some(2), None),
                Reason::Tdr,
                "needs a window",
            ),
        ];
        for (entry, signal, want) in table {
            let got = entry.policy(signal).unwrap_err();
            assert!(got.contains(want), "{got}");
            assert!(
                got.starts_with(&format!("health.signals.{signal}")),
                "{got}"
            );
        }
    }
}
