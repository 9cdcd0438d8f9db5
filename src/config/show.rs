//! `dxdp config show`: every effective key with its typed value and where it came from, for
//! people (one `key: value  # origin` line each) and machines (JSON).

use dxdp_core::devices::TargetDir;
use dxdp_core::pipeline::filter::DeviceSelector;

use super::origin::Origin;
use super::{Key, Resolved, ResourceKey};

impl Resolved {
    /// The effective values with their origins, one `key: value  # origin` line each, for every
    /// key in [`Key::all`] order.
    pub fn show(&self) -> String {
        let mut out = String::new();
        for key in Key::all() {
            out.push_str(&format!(
                "{key}: {}  # {}\n",
                human(&self.value(key)),
                self.origin_of(key)
            ));
        }
        out
    }

    /// Every key in [`Key::all`] order with its typed value and its origin.
    pub fn entries(&self) -> Vec<(Key, serde_json::Value, &Origin)> {
        Key::all()
            .into_iter()
            .map(|key| (key, self.value(key), self.origin_of(key)))
            .collect()
    }

    /// Where a key's value came from.
    pub fn origin_of(&self, key: Key) -> &Origin {
        self.origins.get(&key).unwrap_or(&Origin::Default)
    }

    /// A key's value as `config show` prints it for people.
    pub(super) fn shown(&self, key: Key) -> String {
        human(&self.value(key))
    }

    /// A key's value, typed.
    fn value(&self, key: Key) -> serde_json::Value {
        use serde_json::{json, Value};
        match key {
            Key::Resource(r, k) => {
                let Some(s) = self.resources.get(&r) else {
                    return Value::Null;
                };
                match k {
                    ResourceKey::Enabled => json!(s.enabled),
                    ResourceKey::Name => json!(s.name),
                    ResourceKey::Replicas => json!(s.replicas),
                    ResourceKey::Aliases => json!(s.aliases),
                    ResourceKey::IncludeIntegrated => {
                        json!(self.pipeline.include_integrated.get(r))
                    }
                    ResourceKey::IncludeDetachable => {
                        json!(self.pipeline.include_detachable.get(r))
                    }
                    ResourceKey::AllocationPolicy => json!(s.policy.allocation.as_str()),
                    ResourceKey::MultiDevice => json!(s.policy.multi_device.as_str()),
                    ResourceKey::CudaVisibleDevices => json!(s.policy.cuda_visible_devices),
                    ResourceKey::MemorySharing => json!({
                        "enabled": s.memory_sharing.enabled,
                        "name": s.memory_sharing.name,
                        "unit": super::values::Bytes::text(s.memory_sharing.unit_bytes),
                        "reserve": super::values::Bytes::text(s.memory_sharing.reserve_bytes),
                    }),
                }
            }
            Key::DevicesInclude => selectors_json(&self.pipeline.include),
            Key::DevicesExclude => selectors_json(&self.pipeline.exclude),
            Key::Assignment => json!(self.assignment.as_str()),
            Key::RuntimeFilesEnabled => json!(self.pipeline.runtime_files),
            Key::HealthEnabled => json!(self.pipeline.health.enabled),
            Key::HealthIgnoreProblemCodes => json!(self.pipeline.health.ignore_problem_codes),
            Key::HealthSignals => super::health::show_signals(&self.pipeline.health.policy),
            Key::HealthIgnore => super::health::show_ignore(&self.pipeline.health.policy),
            Key::HealthExpectedDevices => self.expected_devices.show(),
            Key::RuntimeFilesExclude => json!(self.pipeline.runtime_exclude),
            Key::RuntimeFilesAdditional => Value::Array(
                self.pipeline
                    .additional_files
                    .iter()
                    .map(|f| {
                        json!({
                            "vendor": format!("0x{:04X}", f.vendor_id),
                            "target": match f.target {
                                TargetDir::System32 => "system32",
                                TargetDir::SysWow64 => "syswow64",
                            },
                            "source": f.source,
                            "destination": f.destination,
                        })
                    })
                    .collect(),
            ),
            Key::LogLevel => json!(self.log_level.0),
            Key::LogFormat => json!(self.log_format.to_string()),
            Key::NodeLabelsEnabled => json!(self.node_labels.enabled),
            Key::NodeLabelsPrefix => json!(self.node_labels.prefix),
            Key::Configuration => json!(self.selection.name.as_deref().unwrap_or("default")),
            Key::MetricsAddress => match self.metrics_address {
                Some(a) => json!(a.to_string()),
                None => Value::Null,
            },
            Key::ProbeAddress => match self.probe_address {
                Some(a) => json!(a.to_string()),
                None => Value::Null,
            },
            Key::WebConfigFile => match &self.web_config_file {
                Some(p) => json!(p.display().to_string()),
                None => Value::Null,
            },
            Key::MetricsAuthorization => json!(self.metrics_authorization.as_str()),
            Key::MetricsTokenAudiences => json!(self.metrics_token_audiences),
            Key::MetricsAllowPlainHttpTokens => json!(self.metrics_allow_plain_http_tokens),
            Key::TelemetryEnabled => json!(self.telemetry.enabled),
            Key::TelemetryInterval => json!(format_interval(self.telemetry.interval)),
            Key::TelemetryPodResourcesEndpoint => match &self.telemetry.pod_resources_endpoint {
                Some(e) => json!(e.to_string()),
                None => Value::Null,
            },
            Key::TelemetryCriEndpoint => match &self.telemetry.cri_endpoint {
                Some(e) => json!(e.written),
                None => Value::Null,
            },
            Key::TelemetryPodLabels => json!(self.telemetry.pod_labels.patterns()),
            Key::TelemetryPodUid => json!(self.telemetry.pod_uid),
            Key::IsolationPolicy => json!(self.isolation.policy.as_str()),
            Key::IsolationEvents => json!(self.isolation.events),
            Key::HealthEvents => json!(self.health_reports.events),
            Key::HealthNodeConditions => json!(self.health_reports.node_conditions),
            Key::HealthRemediationEvictPods => json!(self.remediation.evict_pods),
            Key::HealthRemediationCordon => json!(self.remediation.cordon),
            Key::HealthRemediationGracePeriod => {
                json!(super::health::show_duration(self.remediation.grace_period))
            }
            Key::StartupTaint => match &self.startup_taint {
                Some(t) => json!(t.to_string()),
                None => Value::Null,
            },
            Key::HealthThermalMarginCelsius => json!(self.health_thermal.margin_celsius),
            Key::ValidationEnabled
            | Key::ValidationGate
            | Key::ValidationInterval
            | Key::ValidationTimeout
            | Key::ValidationImage
            | Key::ValidationHostDir => validation_shown(&self.validation, key),
        }
    }
}

/// `10s`, `1m`, `1500ms`: how the configuration writes an interval.
fn format_interval(d: std::time::Duration) -> String {
    let ms = d.as_millis();
    if ms.is_multiple_of(60_000) {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

/// A typed value as `config show` prints it for people: lists in brackets, selectors and
/// files as compact JSON.
fn human(value: &serde_json::Value) -> String {
    use serde_json::Value;
    match value {
        Value::String(s) => s.clone(),
        Value::Array(items) => format!(
            "[{}]",
            items.iter().map(human).collect::<Vec<_>>().join(", ")
        ),
        Value::Null => "none".to_string(),
        other => other.to_string(),
    }
}

fn selectors_json(selectors: &[DeviceSelector]) -> serde_json::Value {
    serde_json::Value::Array(
        selectors
            .iter()
            .map(|s| {
                let mut m = serde_json::Map::new();
                if let Some(v) = s.vendor {
                    m.insert("vendor".into(), format!("0x{v:04X}").into());
                }
                if let Some(v) = s.device_id {
                    m.insert("deviceId".into(), format!("0x{v:04X}").into());
                }
                if let Some(v) = &s.location_path {
                    m.insert("locationPath".into(), v.clone().into());
                }
                if let Some(v) = &s.description {
                    m.insert("description".into(), v.clone().into());
                }
                serde_json::Value::Object(m)
            })
            .collect(),
    )
}

/// The value `config show` prints for a `validation.*` key (`Null` for any other key).
fn validation_shown(v: &super::validation::Validation, key: Key) -> serde_json::Value {
    match key {
        Key::ValidationEnabled => serde_json::json!(v.enabled),
        Key::ValidationInterval => {
            serde_json::json!(super::validation::format_duration(v.interval))
        }
        Key::ValidationTimeout => serde_json::json!(super::validation::format_duration(v.timeout)),
        Key::ValidationImage => match &v.image {
            Some(i) => serde_json::json!(i),
            None => serde_json::Value::Null,
        },
        Key::ValidationHostDir => serde_json::json!(v.host_dir),
        Key::ValidationGate => serde_json::json!(v.gate),
        _ => serde_json::Value::Null,
    }
}
