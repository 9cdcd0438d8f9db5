//! The configuration layers: how the reference plugin's files, dxdp's file, the environment and
//! the flags each change a [`Resolved`] configuration, recording the origin of every key they set.

use dxdp_core::devices::{Resource, TargetDir};
use dxdp_core::pipeline::runtime_files::AdditionalFile;

use super::file::{self, ConfigFile, FileEntry, LogFormatName, ReferenceFile};
use super::origin::{Origin, Overridden};
use super::validation;
use super::values::{
    CriAddress, Interval, LocalApi, LogLevelName, MetricsAddress, Replicas, VendorKey,
};
use super::{ConfigError, Env, Flags, Key, Resolved, ResourceKey};
use crate::logging::LogFormat;
use crate::transport::Endpoint;
use dxdp_core::assignment::Assignment;

/// The PodResources endpoint `text` names (`None`: empty, the kubelet's default). Here, not in
/// `values` (which the fuzz crate compiles alone, without the transport).
fn pod_resources_endpoint(text: &str) -> Result<Option<Endpoint>, String> {
    Ok(LocalApi::PodResources
        .address(text)?
        .map(|a| Endpoint::parse(&a)))
}

/// The variables outside dxdp's own prefixes that are inputs too: the node (whose label selects
/// a named configuration), the validation Jobs' namespace, and where a HostProcess container's
/// volumes (the configuration files) are.
const INPUT_VARS: [&str; 3] = [
    "NODE_NAME",
    "POD_NAMESPACE",
    crate::util::host_process::SANDBOX_VAR,
];

/// The relevant variables of the process environment, captured once: every variable that is an
/// input of the configuration or of the daemon is read from this snapshot (so that tests give
/// them without touching the process).
pub fn process_env() -> Env {
    std::env::vars()
        .filter(|(k, _)| {
            k.starts_with("DXDP_")
                || k.starts_with("WDDM_DEVICE_PLUGIN_")
                || k.starts_with("MCDM_DEVICE_PLUGIN_")
                || INPUT_VARS.contains(&k.as_str())
        })
        .collect()
}

/// The error of variable `name` set to `value`: `reason` says what is wrong and allowed.
fn invalid<'a>(name: &'a str, value: &'a str) -> impl Fn(String) -> ConfigError + Copy + 'a {
    move |reason| ConfigError::Env {
        name: name.into(),
        value: value.into(),
        reason,
    }
}

/// A variable's boolean: true, 1, yes, on; false, 0, no, off or empty.
fn bool_value(value: &str) -> Result<bool, String> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" | "" => Ok(false),
        _ => Err("use true or false".into()),
    }
}

/// `metrics.webConfigFile` as written: a path, `None` when empty.
fn web_config_path(text: &str) -> Option<std::path::PathBuf> {
    (!text.trim().is_empty()).then(|| std::path::PathBuf::from(text.trim()))
}

/// `metrics.tokenAudiences` as written: each audience trimmed, empty ones and repeats left out.
fn audiences(list: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for a in list.iter().map(|a| a.trim()).filter(|a| !a.is_empty()) {
        if !out.iter().any(|o| o == a) {
            out.push(a.to_string());
        }
    }
    out
}

/// Sets the keys a layer gives: each row `value => place, key, origin;` whose `value` is `Some`
/// sets the configuration's `place` to it and records `origin` as the origin of `key`. With the
/// origin written once (`c, origin; value => place, key;`) it is every row's.
macro_rules! set_given {
    ($c:ident, $origin:expr; $($value:expr => $place:expr, $key:expr;)*) => {
        set_given! { $c; $($value => $place, $key, $origin;)* }
    };
    ($c:ident; $($value:expr => $place:expr, $key:expr, $origin:expr;)*) => {
        $(if let Some(v) = $value {
            $place = v;
            $c.set_origin($key, $origin);
        })*
    };
}

/// Sets the keys dxdp's variables give: each row `name, parse => place, key;` whose variable
/// `name` is set sets the configuration's `place` to its value as `parse` reads it (an error
/// names the variable and the value) and records the variable as the origin of `key`.
macro_rules! set_from_env {
    ($c:ident, $env:ident; $($name:literal, $parse:expr => $place:expr, $key:expr;)*) => {
        $(if let Some(v) = $env.get($name) {
            $place = ($parse)(v.as_str()).map_err(invalid($name, v))?;
            $c.set_origin($key, &Origin::env($name));
        })*
    };
}

fn parse_replicas(name: &str, value: &str) -> Result<u32, ConfigError> {
    let err = invalid(name, value);
    let n: u64 = value
        .trim()
        .parse()
        .map_err(|_| err("not a whole number".into()))?;
    Replicas::check(n).map(|r| r.0).map_err(err)
}

fn additional(vendor: VendorKey, target: TargetDir, entries: &[FileEntry]) -> Vec<AdditionalFile> {
    entries
        .iter()
        .map(|e| AdditionalFile {
            vendor_id: vendor.0,
            target,
            source: e.source.clone(),
            destination: e.destination.clone(),
        })
        .collect()
}

/// How each key of a reference-plugin file maps onto dxdp's keys when the file is `r`'s plugin's
/// (`multitenancy: 2 -> resources.display.replicas: 2`).
pub fn reference_mapping(f: &ReferenceFile, r: Resource) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(n) = f.multitenancy {
        out.push(format!(
            "multitenancy: {} -> resources.{r}.replicas: {}{}",
            n.0,
            n.replicas(),
            if n.0 == 0 {
                " (0 means 1, as in the reference plugin)"
            } else {
                ""
            }
        ));
    }
    if let Some(b) = f.include_integrated {
        out.push(format!(
            "includeIntegrated: {b} -> resources.{r}.includeIntegrated: {b}"
        ));
    }
    if let Some(b) = f.include_detachable {
        out.push(format!(
            "includeDetachable: {b} -> resources.{r}.includeDetachable: {b}"
        ));
    }
    for (key, map, dir) in [
        ("additionalMounts", &f.additional_mounts, "system32"),
        (
            "additionalMountsWow64",
            &f.additional_mounts_wow64,
            "syswow64",
        ),
    ] {
        for (vendor, entries) in map.iter().flatten() {
            for e in entries {
                out.push(format!(
                    "{key}[0x{:04X}]: {} -> runtimeFiles.additional[0x{:04X}].{dir}: {}{}",
                    vendor.0,
                    e.source,
                    vendor.0,
                    e.source,
                    e.destination
                        .as_deref()
                        .map(|d| format!(" as {d}"))
                        .unwrap_or_default()
                ));
            }
        }
    }
    if out.is_empty() {
        out.push("(no keys: nothing changes)".into());
    }
    out
}

pub(super) fn apply_reference(c: &mut Resolved, r: Resource, f: &ReferenceFile, origin: &Origin) {
    if let Some(n) = f.multitenancy {
        c.resource(r).replicas = n.replicas();
        c.set_origin(Key::Resource(r, ResourceKey::Replicas), origin);
        if n.0 == 0 {
            c.notices.push(format!(
                "{origin}: multitenancy: 0 means 1 (exclusive devices), as in the reference plugin; resources.{r}.replicas is 1"
            ));
        }
    }
    if let Some(b) = f.include_integrated {
        set_include(c, Some(r), Switch::Integrated, b, origin);
    }
    if let Some(b) = f.include_detachable {
        set_include(c, Some(r), Switch::Detachable, b, origin);
    }
    for (map, target) in [
        (&f.additional_mounts, TargetDir::System32),
        (&f.additional_mounts_wow64, TargetDir::SysWow64),
    ] {
        if let Some(map) = map {
            for (vendor, entries) in map {
                c.pipeline
                    .additional_files
                    .extend(additional(*vendor, target, entries));
            }
            c.set_origin(Key::RuntimeFilesAdditional, origin);
        }
    }
}

pub(super) fn apply_file(c: &mut Resolved, f: &ConfigFile, origin: &Origin) {
    for (r, rf) in [
        (Resource::Display, &f.resources.display),
        (Resource::Compute, &f.resources.compute),
    ] {
        let key = |k| Key::Resource(r, k);
        set_given! { c, origin;
            rf.enabled => c.resource(r).enabled, key(ResourceKey::Enabled);
            rf.name.as_ref().map(|n| n.0.clone()) => c.resource(r).name, key(ResourceKey::Name);
            rf.replicas.map(|n| n.0) => c.resource(r).replicas, key(ResourceKey::Replicas);
            rf.aliases.as_ref().map(|a| a.iter().map(|a| a.0.clone()).collect())
                => c.resource(r).aliases, key(ResourceKey::Aliases);
            // `allocationPolicy`, `multiDevice` and `cudaVisibleDevices` are set by the file only.
            rf.allocation_policy
                => c.resource(r).policy.allocation, key(ResourceKey::AllocationPolicy);
            rf.multi_device => c.resource(r).policy.multi_device, key(ResourceKey::MultiDevice);
            rf.cuda_visible_devices
                => c.resource(r).policy.cuda_visible_devices, key(ResourceKey::CudaVisibleDevices);
        }
        if let Some(m) = &rf.memory_sharing {
            let s = &mut c.resource(r).memory_sharing;
            if let Some(v) = m.enabled {
                s.enabled = v;
            }
            if let Some(n) = &m.name {
                s.name = n.0.clone();
            }
            if let Some(b) = m.unit {
                s.unit_bytes = b.0;
            }
            if let Some(b) = m.reserve {
                s.reserve_bytes = b.0;
            }
            c.set_origin(key(ResourceKey::MemorySharing), origin);
        }
    }
    let d = &f.devices;
    if let Some(v) = d.include_integrated {
        set_include(c, None, Switch::Integrated, v, origin);
    }
    if let Some(v) = d.include_detachable {
        set_include(c, None, Switch::Detachable, v, origin);
    }
    // Per-resource switches override the node-wide ones.
    for (r, rf) in [
        (Resource::Display, &f.resources.display),
        (Resource::Compute, &f.resources.compute),
    ] {
        if let Some(v) = rf.include_integrated {
            set_include(c, Some(r), Switch::Integrated, v, origin);
        }
        if let Some(v) = rf.include_detachable {
            set_include(c, Some(r), Switch::Detachable, v, origin);
        }
    }
    let (health, rt, metrics, telemetry) = (&f.health, &f.runtime_files, &f.metrics, &f.telemetry);
    set_given! { c, origin;
        d.include.clone() => c.pipeline.include, Key::DevicesInclude;
        d.exclude.clone() => c.pipeline.exclude, Key::DevicesExclude;
        f.assignment => c.assignment, Key::Assignment;
        health.enabled => c.pipeline.health.enabled, Key::HealthEnabled;
        health.ignore_problem_codes.clone()
            => c.pipeline.health.ignore_problem_codes, Key::HealthIgnoreProblemCodes;
        health.signals.as_ref().map(|s| s.0.clone())
            => c.pipeline.health.policy.signals, Key::HealthSignals;
        health.ignore.as_ref().map(|i| i.iter().map(|n| n.0).collect())
            => c.pipeline.health.policy.ignore, Key::HealthIgnore;
        health.expected_devices.as_ref().map(super::expected::ExpectedDevices::from)
            => c.expected_devices, Key::HealthExpectedDevices;
        rt.enabled => c.pipeline.runtime_files, Key::RuntimeFilesEnabled;
        rt.exclude.clone() => c.pipeline.runtime_exclude, Key::RuntimeFilesExclude;
    }
    if let Some(map) = &rt.additional {
        for (vendor, files) in map {
            c.pipeline.additional_files.extend(additional(
                *vendor,
                TargetDir::System32,
                &files.system32,
            ));
            c.pipeline.additional_files.extend(additional(
                *vendor,
                TargetDir::SysWow64,
                &files.syswow64,
            ));
        }
        c.set_origin(Key::RuntimeFilesAdditional, origin);
    }
    let log_format = f.log_format.map(|v| match v {
        LogFormatName::Text => LogFormat::Text,
        LogFormatName::Json => LogFormat::Json,
    });
    let validation = &f.validation;
    let remediation = health.remediation.as_ref();
    set_given! { c, origin;
        f.log_level.clone() => c.log_level, Key::LogLevel;
        f.node_labels.enabled => c.node_labels.enabled, Key::NodeLabelsEnabled;
        f.node_labels.prefix.as_ref().map(|p| p.0.clone())
            => c.node_labels.prefix, Key::NodeLabelsPrefix;
        log_format => c.log_format, Key::LogFormat;
        metrics.address.map(|a| a.0) => c.metrics_address, Key::MetricsAddress;
        metrics.probe_address.map(|a| a.0) => c.probe_address, Key::ProbeAddress;
        metrics.web_config_file.as_deref().map(web_config_path)
            => c.web_config_file, Key::WebConfigFile;
        metrics.authorization => c.metrics_authorization, Key::MetricsAuthorization;
        metrics.token_audiences.as_deref().map(audiences)
            => c.metrics_token_audiences, Key::MetricsTokenAudiences;
        metrics.allow_plain_http_tokens
            => c.metrics_allow_plain_http_tokens, Key::MetricsAllowPlainHttpTokens;
        telemetry.enabled => c.telemetry.enabled, Key::TelemetryEnabled;
        telemetry.interval.map(|i| i.0) => c.telemetry.interval, Key::TelemetryInterval;
        // Checked when the file was read: an error here cannot happen, and would mean the default.
        telemetry.pod_resources_endpoint.as_ref()
            .map(|e| pod_resources_endpoint(&e.0).ok().flatten())
            => c.telemetry.pod_resources_endpoint, Key::TelemetryPodResourcesEndpoint;
        // Checked when the file was read: an error here cannot happen, and would mean the default.
        telemetry.cri_endpoint.as_ref().map(|e| e.address().ok().flatten())
            => c.telemetry.cri_endpoint, Key::TelemetryCriEndpoint;
        // Each pattern was compiled when the file was read; this cannot fail.
        telemetry.pod_labels.as_ref().and_then(|p| super::PodLabels::new(p).ok())
            => c.telemetry.pod_labels, Key::TelemetryPodLabels;
        telemetry.pod_uid => c.telemetry.pod_uid, Key::TelemetryPodUid;
        f.isolation.policy => c.isolation.policy, Key::IsolationPolicy;
        f.isolation.events => c.isolation.events, Key::IsolationEvents;
        health.events => c.health_reports.events, Key::HealthEvents;
        health.node_conditions => c.health_reports.node_conditions, Key::HealthNodeConditions;
        health.thermal.as_ref().and_then(|t| t.margin_celsius).map(|m| m.0)
            => c.health_thermal.margin_celsius, Key::HealthThermalMarginCelsius;
        validation.enabled => c.validation.enabled, Key::ValidationEnabled;
        validation.interval.map(|i| i.0) => c.validation.interval, Key::ValidationInterval;
        validation.timeout.map(|t| t.0) => c.validation.timeout, Key::ValidationTimeout;
        validation.image.as_ref().map(|i| i.0.clone()) => c.validation.image, Key::ValidationImage;
        validation.host_dir.as_ref().map(|h| h.0.clone())
            => c.validation.host_dir, Key::ValidationHostDir;
        validation.gate => c.validation.gate, Key::ValidationGate;
        f.startup_taint.as_ref().map(|t| t.0.clone()) => c.startup_taint, Key::StartupTaint;
        remediation.and_then(|r| r.evict_pods)
            => c.remediation.evict_pods, Key::HealthRemediationEvictPods;
        remediation.and_then(|r| r.cordon) => c.remediation.cordon, Key::HealthRemediationCordon;
        remediation.and_then(|r| r.grace_period).map(|g| g.0)
            => c.remediation.grace_period, Key::HealthRemediationGracePeriod;
    }
}

/// The two adapter-kind switches.
#[derive(Debug, Clone, Copy)]
enum Switch {
    Integrated,
    Detachable,
}

impl Switch {
    /// Its key of a resource.
    fn key(self) -> ResourceKey {
        match self {
            Switch::Integrated => ResourceKey::IncludeIntegrated,
            Switch::Detachable => ResourceKey::IncludeDetachable,
        }
    }
}

/// Sets an include switch for one resource (`Some`) or both (`None`), recording the origin.
fn set_include(
    c: &mut Resolved,
    r: Option<Resource>,
    switch: Switch,
    value: bool,
    origin: &Origin,
) {
    let flags = match switch {
        Switch::Integrated => &mut c.pipeline.include_integrated,
        Switch::Detachable => &mut c.pipeline.include_detachable,
    };
    let targets: &[Resource] = match &r {
        Some(r) => std::slice::from_ref(r),
        None => &Resource::ALL,
    };
    for &r in targets {
        *flags.get_mut(r) = value;
    }
    for &r in targets {
        c.set_origin(Key::Resource(r, switch.key()), origin);
    }
}

/// The origin of `key` set by dxdp's variable `name`: when a reference-plugin variable set it
/// before, both are named (`env DXDP_REPLICAS (overrides env WDDM_DEVICE_PLUGIN_MULTITENANCY=4)`)
/// and a notice says which won.
fn over_reference(
    c: &mut Resolved,
    key: Key,
    name: &str,
    value: &str,
    before: &str,
    env: &Env,
) -> Origin {
    let Some(loser) = c.origin_of(key).reference_variable().map(str::to_string) else {
        return Origin::env(name);
    };
    let loser_value = env.get(&loser).map(String::as_str).unwrap_or(before);
    c.notices.push(format!(
        "{key}: env {name}={value} overrides the reference plugin's env {loser}={loser_value}; unset one of them (dxdp's variables win)"
    ));
    Origin::Env {
        name: name.to_string(),
        overrides: vec![Overridden::ReferenceEnv {
            name: loser,
            value: loser_value.to_string(),
        }],
    }
}

/// Applies the environment, then names every configuration-file value a variable overrides (in
/// the key's origin, and in a notice the daemon logs): a file edit that a variable hides would
/// otherwise do nothing, silently.
pub(super) fn apply_env(c: &mut Resolved, env: &Env) -> Result<(), ConfigError> {
    let before = c.clone();
    apply_variables(c, env)?;
    note_file_overrides(c, &before, env);
    Ok(())
}

/// For each key a variable took from a file with a different value: the origin becomes
/// `env DXDP_REPLICAS (overrides file C:\etc\dxdp\config.yaml: 2)` and a notice says what to do.
fn note_file_overrides(c: &mut Resolved, before: &Resolved, env: &Env) {
    for key in Key::all() {
        let was = before.origin_of(key);
        if !was.is_file() || before.shown(key) == c.shown(key) {
            continue;
        }
        let mut now = c.origin_of(key).clone();
        let Origin::Env { name, overrides } = &mut now else {
            continue;
        };
        let value = env
            .get(name.as_str())
            .map(String::as_str)
            .unwrap_or_default();
        let old = before.shown(key);
        c.notices.push(format!(
            "{key}: env {name}={value} overrides {was} ({key}: {old}): editing the file changes nothing while {name} is set; unset the variable to use the file's value"
        ));
        overrides.push(Overridden::File {
            origin: Box::new(was.clone()),
            value: old,
        });
        c.set_origin(key, &now);
    }
}

fn apply_variables(c: &mut Resolved, env: &Env) -> Result<(), ConfigError> {
    // The reference plugin's variables: WDDM = display, MCDM = compute.
    for (prefix, r) in [("WDDM", Resource::Display), ("MCDM", Resource::Compute)] {
        let name = format!("{prefix}_DEVICE_PLUGIN_MULTITENANCY");
        if let Some(v) = env.get(&name) {
            // The reference plugin enforces a minimum of 1: 0 is 1, with a notice.
            let replicas = if v.trim() == "0" {
                c.notices.push(format!(
                    "env {name}=0 means 1 (exclusive devices), as in the reference plugin; resources.{r}.replicas is 1"
                ));
                1
            } else {
                parse_replicas(&name, v)?
            };
            c.resource(r).replicas = replicas;
            c.set_origin(Key::Resource(r, ResourceKey::Replicas), &Origin::env(&name));
        }
        // Each plugin's switch acts on its own resource, in both directions.
        for (suffix, switch) in [
            ("INCLUDE_INTEGRATED", Switch::Integrated),
            ("INCLUDE_DETACHABLE", Switch::Detachable),
        ] {
            let name = format!("{prefix}_DEVICE_PLUGIN_{suffix}");
            if let Some(v) = env.get(&name) {
                let value = bool_value(v).map_err(invalid(&name, v))?;
                set_include(c, Some(r), switch, value, &Origin::env(&name));
            }
        }
    }
    if let Some(v) = env.get("DXDP_REPLICAS") {
        let n = parse_replicas("DXDP_REPLICAS", v)?;
        for r in Resource::ALL {
            let before = c.replicas(r);
            c.resource(r).replicas = n;
            let key = Key::Resource(r, ResourceKey::Replicas);
            let origin = over_reference(c, key, "DXDP_REPLICAS", v, &before.to_string(), env);
            c.set_origin(key, &origin);
        }
    }
    if let Some(v) = env.get("DXDP_RESOURCES") {
        let wanted = parse_resources(v).map_err(invalid("DXDP_RESOURCES", v))?;
        let origin = Origin::env("DXDP_RESOURCES");
        for r in Resource::ALL {
            c.resource(r).enabled = wanted.contains(&r);
            c.set_origin(Key::Resource(r, ResourceKey::Enabled), &origin);
        }
    }
    for (name, switch) in [
        ("DXDP_INCLUDE_INTEGRATED", Switch::Integrated),
        ("DXDP_INCLUDE_DETACHABLE", Switch::Detachable),
    ] {
        if let Some(v) = env.get(name) {
            let value = bool_value(v).map_err(invalid(name, v))?;
            for r in Resource::ALL {
                let flags = match switch {
                    Switch::Integrated => &c.pipeline.include_integrated,
                    Switch::Detachable => &c.pipeline.include_detachable,
                };
                let before = flags.get(r).to_string();
                let key = Key::Resource(r, switch.key());
                let origin = over_reference(c, key, name, v, &before, env);
                set_include(c, Some(r), switch, value, &origin);
            }
        }
    }
    set_from_env! { c, env;
        "DXDP_ASSIGNMENT",
            |v| Assignment::parse(v).ok_or("use location-path, class-guid or auto".into())
            => c.assignment, Key::Assignment;
        "DXDP_NODE_LABELS", bool_value => c.node_labels.enabled, Key::NodeLabelsEnabled;
        "DXDP_NODE_LABEL_PREFIX", |v| dxdp_core::labels::check_prefix(v).map(|()| v.to_string())
            => c.node_labels.prefix, Key::NodeLabelsPrefix;
        "DXDP_LOG_LEVEL", |v: &str| LogLevelName::try_from(v.to_string())
            => c.log_level, Key::LogLevel;
        "DXDP_LOG_FORMAT", str::parse => c.log_format, Key::LogFormat;
        "DXDP_METRICS_ADDRESS", MetricsAddress::parse_variable => c.metrics_address, Key::MetricsAddress;
        "DXDP_PROBE_ADDRESS", MetricsAddress::parse => c.probe_address, Key::ProbeAddress;
        "DXDP_WEB_CONFIG_FILE", |v| Ok(web_config_path(v)) => c.web_config_file, Key::WebConfigFile;
        "DXDP_METRICS_AUTHORIZATION", file::MetricsAuthorization::parse
            => c.metrics_authorization, Key::MetricsAuthorization;
        "DXDP_METRICS_TOKEN_AUDIENCES", |v: &str| Ok::<_, String>(audiences(&v.split(',').map(str::to_string).collect::<Vec<_>>()))
            => c.metrics_token_audiences, Key::MetricsTokenAudiences;
        "DXDP_METRICS_ALLOW_PLAIN_HTTP_TOKENS", bool_value
            => c.metrics_allow_plain_http_tokens, Key::MetricsAllowPlainHttpTokens;
        "DXDP_TELEMETRY", bool_value => c.telemetry.enabled, Key::TelemetryEnabled;
        "DXDP_TELEMETRY_INTERVAL", Interval::parse => c.telemetry.interval, Key::TelemetryInterval;
        "DXDP_POD_RESOURCES_ENDPOINT", pod_resources_endpoint
            => c.telemetry.pod_resources_endpoint, Key::TelemetryPodResourcesEndpoint;
        "DXDP_CRI_ENDPOINT", CriAddress::parse
            => c.telemetry.cri_endpoint, Key::TelemetryCriEndpoint;
        "DXDP_ISOLATION_POLICY", file::IsolationPolicy::parse
            => c.isolation.policy, Key::IsolationPolicy;
        "DXDP_ISOLATION_EVENTS", bool_value => c.isolation.events, Key::IsolationEvents;
        "DXDP_HEALTH_EVENTS", bool_value => c.health_reports.events, Key::HealthEvents;
        "DXDP_NODE_CONDITIONS", bool_value
            => c.health_reports.node_conditions, Key::HealthNodeConditions;
        "DXDP_VALIDATION", bool_value => c.validation.enabled, Key::ValidationEnabled;
        "DXDP_VALIDATION_INTERVAL", |v| validation::IntervalText::parse(v).map(|i| i.0)
            => c.validation.interval, Key::ValidationInterval;
        "DXDP_VALIDATION_TIMEOUT", |v| validation::TimeoutText::parse(v).map(|t| t.0)
            => c.validation.timeout, Key::ValidationTimeout;
        "DXDP_VALIDATION_IMAGE", validation::check_image
            => c.validation.image, Key::ValidationImage;
        "DXDP_VALIDATION_HOST_DIR", validation::check_host_dir
            => c.validation.host_dir, Key::ValidationHostDir;
        "DXDP_VALIDATION_GATE", bool_value => c.validation.gate, Key::ValidationGate;
        "DXDP_STARTUP_TAINT", file::parse_startup_taint => c.startup_taint, Key::StartupTaint;
        "DXDP_EVICT_PODS", bool_value => c.remediation.evict_pods, Key::HealthRemediationEvictPods;
        "DXDP_CORDON", bool_value => c.remediation.cordon, Key::HealthRemediationCordon;
        "DXDP_REMEDIATION_GRACE_PERIOD", super::health::parse_duration
            => c.remediation.grace_period, Key::HealthRemediationGracePeriod;
    }
    Ok(())
}

/// Parses `display,compute`.
pub fn parse_resources(text: &str) -> Result<Vec<Resource>, String> {
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        out.push(match part {
            "display" => Resource::Display,
            "compute" => Resource::Compute,
            other => {
                return Err(format!(
                    "unknown resource {other:?}; use display, compute or both"
                ))
            }
        });
    }
    Ok(out)
}

pub(super) fn apply_flags(c: &mut Resolved, f: &Flags) {
    if let Some(list) = &f.resources {
        let flag = Origin::Flag("--resources");
        for r in Resource::ALL {
            c.resource(r).enabled = list.contains(&r);
            c.set_origin(Key::Resource(r, ResourceKey::Enabled), &flag);
        }
    }
    if let Some(n) = f.replicas {
        let flag = Origin::Flag("--replicas");
        for r in Resource::ALL {
            c.resource(r).replicas = n;
            c.set_origin(Key::Resource(r, ResourceKey::Replicas), &flag);
        }
    }
    if f.include_integrated {
        let flag = Origin::Flag("--include-integrated");
        set_include(c, None, Switch::Integrated, true, &flag);
    }
    if f.include_detachable {
        let flag = Origin::Flag("--include-detachable");
        set_include(c, None, Switch::Detachable, true, &flag);
    }
    set_given! { c;
        f.assignment => c.assignment, Key::Assignment, &Origin::Flag("--assignment");
        f.log_level.clone() => c.log_level, Key::LogLevel, &Origin::Flag("--log-level");
        f.log_format => c.log_format, Key::LogFormat, &Origin::Flag("--log-format");
        f.metrics_address
            => c.metrics_address, Key::MetricsAddress, &Origin::Flag("--metrics-address");
        f.probe_address => c.probe_address, Key::ProbeAddress, &Origin::Flag("--probe-address");
        f.web_config_file.clone()
            => c.web_config_file, Key::WebConfigFile, &Origin::Flag("--web-config-file");
        f.metrics_authorization => c.metrics_authorization, Key::MetricsAuthorization,
            &Origin::Flag("--metrics-authorization");
    }
}
