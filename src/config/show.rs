//! `dxdp config show`: every effective key with its typed value and where it came from, for
//! people (one `key: value  # origin` line each) and machines (JSON).

use dxdp_core::devices::{Resource, TargetDir};
use dxdp_core::pipeline::filter::DeviceSelector;

use super::Config;

impl Config {
    /// Every key `config show` prints.
    pub(super) fn keys(&self) -> Vec<String> {
        let mut keys = Vec::new();
        for r in Resource::ALL {
            for k in [
                "enabled",
                "name",
                "replicas",
                "aliases",
                "includeIntegrated",
                "includeDetachable",
                "allocationPolicy",
                "multiDevice",
                "cudaVisibleDevices",
            ] {
                keys.push(format!("resources.{r}.{k}"));
            }
        }
        for k in [
            "devices.include",
            "devices.exclude",
            "assignment",
            "runtimeFiles.enabled",
            "runtimeFiles.exclude",
            "runtimeFiles.additional",
            "health.enabled",
            "health.ignoreProblemCodes",
            "logLevel",
            "logFormat",
            "nodeLabels.enabled",
            "nodeLabels.prefix",
            "configuration",
            "metrics.address",
            "telemetry.enabled",
            "telemetry.interval",
            "telemetry.podResourcesEndpoint",
        ] {
            keys.push(k.to_string());
        }
        keys
    }

    /// The effective values with their origins, one `key: value  # origin` line each.
    pub fn show(&self) -> String {
        let mut out = String::new();
        for key in self.keys() {
            out.push_str(&format!(
                "{key}: {}  # {}\n",
                human(&self.value(&key)),
                self.origin(&key)
            ));
        }
        out
    }

    /// The effective values with their origins as JSON: `{key: {"value", "origin"}}`, values
    /// typed (booleans, numbers, lists, objects).
    pub fn show_json(&self) -> serde_json::Map<String, serde_json::Value> {
        self.keys()
            .into_iter()
            .map(|key| {
                let entry =
                    serde_json::json!({"value": self.value(&key), "origin": self.origin(&key)});
                (key, entry)
            })
            .collect()
    }

    /// Where a key's value came from.
    pub fn origin(&self, key: &str) -> &str {
        self.origins
            .get(key)
            .map(String::as_str)
            .unwrap_or("default")
    }

    /// A key's value, typed.
    fn value(&self, key: &str) -> serde_json::Value {
        use serde_json::{json, Value};
        if let Some(rest) = key.strip_prefix("resources.") {
            let (r, k) = rest.split_once('.').unwrap_or((rest, ""));
            let Some(r) = Resource::ALL.into_iter().find(|x| x.as_str() == r) else {
                return Value::Null;
            };
            let Some(s) = self.resources.get(&r) else {
                return Value::Null;
            };
            return match k {
                "enabled" => json!(s.enabled),
                "name" => json!(s.name),
                "replicas" => json!(s.replicas),
                "aliases" => json!(s.aliases),
                "includeIntegrated" => json!(self.pipeline.include_integrated.get(r)),
                "includeDetachable" => json!(self.pipeline.include_detachable.get(r)),
                "allocationPolicy" => json!(s.policy.allocation.as_str()),
                "multiDevice" => json!(s.policy.multi_device.as_str()),
                "cudaVisibleDevices" => json!(s.policy.cuda_visible_devices),
                _ => Value::Null,
            };
        }
        match key {
            "devices.include" => selectors_json(&self.pipeline.include),
            "devices.exclude" => selectors_json(&self.pipeline.exclude),
            "assignment" => json!(self.assignment.as_str()),
            "runtimeFiles.enabled" => json!(self.pipeline.runtime_files),
            "health.enabled" => json!(self.pipeline.health.enabled),
            "health.ignoreProblemCodes" => json!(self.pipeline.health.ignore_problem_codes),
            "runtimeFiles.exclude" => json!(self.pipeline.runtime_exclude),
            "runtimeFiles.additional" => Value::Array(
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
            "logLevel" => json!(self.log_level),
            "logFormat" => json!(self.log_format.to_string()),
            "nodeLabels.enabled" => json!(self.node_labels.enabled),
            "nodeLabels.prefix" => json!(self.node_labels.prefix),
            "configuration" => json!(self.selection.name.as_deref().unwrap_or("default")),
            "metrics.address" => match self.metrics_address {
                Some(a) => json!(a.to_string()),
                None => Value::Null,
            },
            "telemetry.enabled" => json!(self.telemetry.enabled),
            "telemetry.interval" => json!(format_interval(self.telemetry.interval)),
            "telemetry.podResourcesEndpoint" => match &self.telemetry.pod_resources_endpoint {
                Some(e) => json!(e),
                None => Value::Null,
            },
            _ => Value::Null,
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
