//! The configuration layers: how the reference plugin's files, dxdp's file, the environment and
//! the flags each change a [`Resolved`] configuration, recording the origin of every key they set.

use dxdp_core::devices::{Resource, TargetDir};
use dxdp_core::pipeline::runtime_files::AdditionalFile;

use super::file::{self, ConfigFile, FileEntry, LogFormatName, ReferenceFile};
use super::origin::{Origin, Overridden};
use super::values::{LogLevelName, Replicas, ResourceName, VendorKey};
use super::{ConfigError, Env, Flags, Key, Resolved, ResourceKey};
use crate::logging::LogFormat;
use dxdp_core::assignment::Assignment;

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

/// `telemetry.podResourcesEndpoint` as written: a named pipe or a socket path (`None`: empty,
/// the kubelet's default).
fn local_endpoint(text: &str) -> Option<crate::transport::Endpoint> {
    (!text.trim().is_empty()).then(|| crate::transport::Endpoint::parse(text))
}

/// The error of variable `name` set to `value`: `reason` says what is wrong and allowed.
fn invalid<'a>(name: &'a str, value: &'a str) -> impl Fn(String) -> ConfigError + Copy + 'a {
    move |reason| ConfigError::Env {
        name: name.into(),
        value: value.into(),
        reason,
    }
}

fn parse_bool(name: &str, value: &str) -> Result<bool, ConfigError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" | "" => Ok(false),
        _ => Err(invalid(name, value)("use true or false".into())),
    }
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
        if let Some(v) = rf.enabled {
            c.resource(r).enabled = v;
            c.set_origin(Key::Resource(r, ResourceKey::Enabled), origin);
        }
        if let Some(ResourceName(v)) = &rf.name {
            c.resource(r).name = v.clone();
            c.set_origin(Key::Resource(r, ResourceKey::Name), origin);
        }
        if let Some(v) = rf.replicas {
            c.resource(r).replicas = v.0;
            c.set_origin(Key::Resource(r, ResourceKey::Replicas), origin);
        }
        if let Some(v) = &rf.aliases {
            c.resource(r).aliases = v.iter().map(|a| a.0.clone()).collect();
            c.set_origin(Key::Resource(r, ResourceKey::Aliases), origin);
        }
        apply_policy(c, r, rf, origin);
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
    if let Some(v) = &d.include {
        c.pipeline.include = v.clone();
        c.set_origin(Key::DevicesInclude, origin);
    }
    if let Some(v) = &d.exclude {
        c.pipeline.exclude = v.clone();
        c.set_origin(Key::DevicesExclude, origin);
    }
    if let Some(v) = f.assignment {
        c.assignment = v;
        c.set_origin(Key::Assignment, origin);
    }
    if let Some(v) = f.health.enabled {
        c.pipeline.health.enabled = v;
        c.set_origin(Key::HealthEnabled, origin);
    }
    if let Some(v) = &f.health.ignore_problem_codes {
        c.pipeline.health.ignore_problem_codes = v.clone();
        c.set_origin(Key::HealthIgnoreProblemCodes, origin);
    }
    if let Some(v) = &f.health.signals {
        c.pipeline.health.policy.signals = v.0.clone();
        c.set_origin(Key::HealthSignals, origin);
    }
    if let Some(v) = &f.health.ignore {
        c.pipeline.health.policy.ignore = v.iter().map(|n| n.0).collect();
        c.set_origin(Key::HealthIgnore, origin);
    }
    let rt = &f.runtime_files;
    if let Some(v) = rt.enabled {
        c.pipeline.runtime_files = v;
        c.set_origin(Key::RuntimeFilesEnabled, origin);
    }
    if let Some(v) = &rt.exclude {
        c.pipeline.runtime_exclude = v.clone();
        c.set_origin(Key::RuntimeFilesExclude, origin);
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
    if let Some(v) = &f.log_level {
        c.log_level = v.clone();
        c.set_origin(Key::LogLevel, origin);
    }
    if let Some(v) = f.node_labels.enabled {
        c.node_labels.enabled = v;
        c.set_origin(Key::NodeLabelsEnabled, origin);
    }
    if let Some(v) = &f.node_labels.prefix {
        c.node_labels.prefix = v.0.clone();
        c.set_origin(Key::NodeLabelsPrefix, origin);
    }
    if let Some(v) = f.log_format {
        c.log_format = match v {
            LogFormatName::Text => LogFormat::Text,
            LogFormatName::Json => LogFormat::Json,
        };
        c.set_origin(Key::LogFormat, origin);
    }
    if let Some(v) = f.metrics.address {
        c.metrics_address = v.0;
        c.set_origin(Key::MetricsAddress, origin);
    }
    if let Some(v) = f.metrics.probe_address {
        c.probe_address = v.0;
        c.set_origin(Key::ProbeAddress, origin);
    }
    if let Some(v) = &f.metrics.web_config_file {
        c.web_config_file = (!v.trim().is_empty()).then(|| std::path::PathBuf::from(v.trim()));
        c.set_origin(Key::WebConfigFile, origin);
    }
    if let Some(v) = f.metrics.authorization {
        c.metrics_authorization = v;
        c.set_origin(Key::MetricsAuthorization, origin);
    }
    if let Some(v) = f.telemetry.enabled {
        c.telemetry.enabled = v;
        c.set_origin(Key::TelemetryEnabled, origin);
    }
    if let Some(v) = f.telemetry.interval {
        c.telemetry.interval = v.0;
        c.set_origin(Key::TelemetryInterval, origin);
    }
    if let Some(v) = &f.telemetry.pod_resources_endpoint {
        c.telemetry.pod_resources_endpoint = local_endpoint(v);
        c.set_origin(Key::TelemetryPodResourcesEndpoint, origin);
    }
    if let Some(v) = &f.telemetry.cri_endpoint {
        // Checked when the file was read: an error here cannot happen, and would mean the default.
        c.telemetry.cri_endpoint = v.address().ok().flatten();
        c.set_origin(Key::TelemetryCriEndpoint, origin);
    }
    if let Some(v) = &f.telemetry.pod_labels {
        // Each pattern was compiled when the file was read; this cannot fail.
        if let Ok(labels) = super::PodLabels::new(v) {
            c.telemetry.pod_labels = labels;
            c.set_origin(Key::TelemetryPodLabels, origin);
        }
    }
    if let Some(v) = f.telemetry.pod_uid {
        c.telemetry.pod_uid = v;
        c.set_origin(Key::TelemetryPodUid, origin);
    }
    if let Some(v) = f.isolation.policy {
        c.isolation.policy = v;
        c.set_origin(Key::IsolationPolicy, origin);
    }
    if let Some(v) = f.isolation.events {
        c.isolation.events = v;
        c.set_origin(Key::IsolationEvents, origin);
    }
    if let Some(v) = f.health.events {
        c.health_reports.events = v;
        c.set_origin(Key::HealthEvents, origin);
    }
    if let Some(v) = f.health.node_conditions {
        c.health_reports.node_conditions = v;
        c.set_origin(Key::HealthNodeConditions, origin);
    }
    apply_validation_file(c, &f.validation, origin);
}

/// `allocationPolicy`, `multiDevice` and `cudaVisibleDevices` of one resource (file only).
fn apply_policy(c: &mut Resolved, r: Resource, rf: &file::ResourceFile, origin: &Origin) {
    if let Some(v) = rf.allocation_policy {
        c.resource(r).policy.allocation = v;
        c.set_origin(Key::Resource(r, ResourceKey::AllocationPolicy), origin);
    }
    if let Some(v) = rf.multi_device {
        c.resource(r).policy.multi_device = v;
        c.set_origin(Key::Resource(r, ResourceKey::MultiDevice), origin);
    }
    if let Some(v) = rf.cuda_visible_devices {
        c.resource(r).policy.cuda_visible_devices = v;
        c.set_origin(Key::Resource(r, ResourceKey::CudaVisibleDevices), origin);
    }
}

/// The two adapter-kind switches.
#[derive(Debug, Clone, Copy)]
enum Switch {
    Integrated,
    Detachable,
}

/// Sets an include switch for one resource (`Some`) or both (`None`), recording the origin.
fn set_include(
    c: &mut Resolved,
    r: Option<Resource>,
    switch: Switch,
    value: bool,
    origin: &Origin,
) {
    let (flags, key) = match switch {
        Switch::Integrated => (
            &mut c.pipeline.include_integrated,
            ResourceKey::IncludeIntegrated,
        ),
        Switch::Detachable => (
            &mut c.pipeline.include_detachable,
            ResourceKey::IncludeDetachable,
        ),
    };
    let targets: &[Resource] = match &r {
        Some(r) => std::slice::from_ref(r),
        None => &Resource::ALL,
    };
    for &r in targets {
        *flags.get_mut(r) = value;
    }
    for &r in targets {
        c.set_origin(Key::Resource(r, key), origin);
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
                let value = parse_bool(&name, v)?;
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
        for r in Resource::ALL {
            c.resource(r).enabled = wanted.contains(&r);
            c.set_origin(
                Key::Resource(r, ResourceKey::Enabled),
                &Origin::env("DXDP_RESOURCES"),
            );
        }
    }
    for (name, switch) in [
        ("DXDP_INCLUDE_INTEGRATED", Switch::Integrated),
        ("DXDP_INCLUDE_DETACHABLE", Switch::Detachable),
    ] {
        if let Some(v) = env.get(name) {
            let value = parse_bool(name, v)?;
            for r in Resource::ALL {
                let flags = match switch {
                    Switch::Integrated => &c.pipeline.include_integrated,
                    Switch::Detachable => &c.pipeline.include_detachable,
                };
                let before = flags.get(r).to_string();
                let key = match switch {
                    Switch::Integrated => Key::Resource(r, ResourceKey::IncludeIntegrated),
                    Switch::Detachable => Key::Resource(r, ResourceKey::IncludeDetachable),
                };
                let origin = over_reference(c, key, name, v, &before, env);
                set_include(c, Some(r), switch, value, &origin);
            }
        }
    }
    if let Some(v) = env.get("DXDP_ASSIGNMENT") {
        c.assignment = Assignment::parse(v).ok_or_else(|| {
            invalid("DXDP_ASSIGNMENT", v)("use location-path, class-guid or auto".into())
        })?;
        c.set_origin(Key::Assignment, &Origin::env("DXDP_ASSIGNMENT"));
    }
    if let Some(v) = env.get("DXDP_NODE_LABELS") {
        c.node_labels.enabled = parse_bool("DXDP_NODE_LABELS", v)?;
        c.set_origin(Key::NodeLabelsEnabled, &Origin::env("DXDP_NODE_LABELS"));
    }
    if let Some(v) = env.get("DXDP_NODE_LABEL_PREFIX") {
        dxdp_core::labels::check_prefix(v).map_err(invalid("DXDP_NODE_LABEL_PREFIX", v))?;
        c.node_labels.prefix = v.clone();
        c.set_origin(
            Key::NodeLabelsPrefix,
            &Origin::env("DXDP_NODE_LABEL_PREFIX"),
        );
    }
    if let Some(v) = env.get("DXDP_LOG_LEVEL") {
        c.log_level = LogLevelName::try_from(v.clone()).map_err(invalid("DXDP_LOG_LEVEL", v))?;
        c.set_origin(Key::LogLevel, &Origin::env("DXDP_LOG_LEVEL"));
    }
    if let Some(v) = env.get("DXDP_LOG_FORMAT") {
        c.log_format = v.parse().map_err(invalid("DXDP_LOG_FORMAT", v))?;
        c.set_origin(Key::LogFormat, &Origin::env("DXDP_LOG_FORMAT"));
    }
    if let Some(v) = env.get("DXDP_METRICS_ADDRESS") {
        c.metrics_address =
            super::values::MetricsAddress::parse(v).map_err(invalid("DXDP_METRICS_ADDRESS", v))?;
        c.set_origin(Key::MetricsAddress, &Origin::env("DXDP_METRICS_ADDRESS"));
    }
    if let Some(v) = env.get("DXDP_PROBE_ADDRESS") {
        c.probe_address =
            super::values::MetricsAddress::parse(v).map_err(invalid("DXDP_PROBE_ADDRESS", v))?;
        c.set_origin(Key::ProbeAddress, &Origin::env("DXDP_PROBE_ADDRESS"));
    }
    if let Some(v) = env.get("DXDP_WEB_CONFIG_FILE") {
        c.web_config_file = (!v.trim().is_empty()).then(|| std::path::PathBuf::from(v.trim()));
        c.set_origin(Key::WebConfigFile, &Origin::env("DXDP_WEB_CONFIG_FILE"));
    }
    if let Some(v) = env.get("DXDP_METRICS_AUTHORIZATION") {
        c.metrics_authorization = file::MetricsAuthorization::parse(v)
            .map_err(invalid("DXDP_METRICS_AUTHORIZATION", v))?;
        c.set_origin(
            Key::MetricsAuthorization,
            &Origin::env("DXDP_METRICS_AUTHORIZATION"),
        );
    }
    if let Some(v) = env.get("DXDP_TELEMETRY") {
        c.telemetry.enabled = parse_bool("DXDP_TELEMETRY", v)?;
        c.set_origin(Key::TelemetryEnabled, &Origin::env("DXDP_TELEMETRY"));
    }
    if let Some(v) = env.get("DXDP_TELEMETRY_INTERVAL") {
        c.telemetry.interval =
            super::values::Interval::parse(v).map_err(invalid("DXDP_TELEMETRY_INTERVAL", v))?;
        c.set_origin(
            Key::TelemetryInterval,
            &Origin::env("DXDP_TELEMETRY_INTERVAL"),
        );
    }
    if let Some(v) = env.get("DXDP_POD_RESOURCES_ENDPOINT") {
        c.telemetry.pod_resources_endpoint = local_endpoint(v);
        c.set_origin(
            Key::TelemetryPodResourcesEndpoint,
            &Origin::env("DXDP_POD_RESOURCES_ENDPOINT"),
        );
    }
    if let Some(v) = env.get("DXDP_CRI_ENDPOINT") {
        c.telemetry.cri_endpoint =
            super::values::CriAddress::parse(v).map_err(invalid("DXDP_CRI_ENDPOINT", v))?;
        c.set_origin(Key::TelemetryCriEndpoint, &Origin::env("DXDP_CRI_ENDPOINT"));
    }
    if let Some(v) = env.get("DXDP_ISOLATION_POLICY") {
        c.isolation.policy =
            file::IsolationPolicy::parse(v).map_err(invalid("DXDP_ISOLATION_POLICY", v))?;
        c.set_origin(Key::IsolationPolicy, &Origin::env("DXDP_ISOLATION_POLICY"));
    }
    if let Some(v) = env.get("DXDP_ISOLATION_EVENTS") {
        c.isolation.events = parse_bool("DXDP_ISOLATION_EVENTS", v)?;
        c.set_origin(Key::IsolationEvents, &Origin::env("DXDP_ISOLATION_EVENTS"));
    }
    if let Some(v) = env.get("DXDP_HEALTH_EVENTS") {
        c.health_reports.events = parse_bool("DXDP_HEALTH_EVENTS", v)?;
        c.set_origin(Key::HealthEvents, &Origin::env("DXDP_HEALTH_EVENTS"));
    }
    if let Some(v) = env.get("DXDP_NODE_CONDITIONS") {
        c.health_reports.node_conditions = parse_bool("DXDP_NODE_CONDITIONS", v)?;
        c.set_origin(
            Key::HealthNodeConditions,
            &Origin::env("DXDP_NODE_CONDITIONS"),
        );
    }
    apply_validation_env(c, env, parse_bool)?;
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
        for r in Resource::ALL {
            c.resource(r).enabled = list.contains(&r);
            c.set_origin(
                Key::Resource(r, ResourceKey::Enabled),
                &Origin::Flag("--resources"),
            );
        }
    }
    if let Some(n) = f.replicas {
        for r in Resource::ALL {
            c.resource(r).replicas = n;
            c.set_origin(
                Key::Resource(r, ResourceKey::Replicas),
                &Origin::Flag("--replicas"),
            );
        }
    }
    if f.include_integrated {
        set_include(
            c,
            None,
            Switch::Integrated,
            true,
            &Origin::Flag("--include-integrated"),
        );
    }
    if f.include_detachable {
        set_include(
            c,
            None,
            Switch::Detachable,
            true,
            &Origin::Flag("--include-detachable"),
        );
    }
    if let Some(a) = f.assignment {
        c.assignment = a;
        c.set_origin(Key::Assignment, &Origin::Flag("--assignment"));
    }
    if let Some(v) = &f.log_level {
        c.log_level = v.clone();
        c.set_origin(Key::LogLevel, &Origin::Flag("--log-level"));
    }
    if let Some(v) = f.log_format {
        c.log_format = v;
        c.set_origin(Key::LogFormat, &Origin::Flag("--log-format"));
    }
    if let Some(v) = f.metrics_address {
        c.metrics_address = v;
        c.set_origin(Key::MetricsAddress, &Origin::Flag("--metrics-address"));
    }
    if let Some(v) = f.probe_address {
        c.probe_address = v;
        c.set_origin(Key::ProbeAddress, &Origin::Flag("--probe-address"));
    }
    if let Some(v) = &f.web_config_file {
        c.web_config_file = v.clone();
        c.set_origin(Key::WebConfigFile, &Origin::Flag("--web-config-file"));
    }
    if let Some(v) = f.metrics_authorization {
        c.metrics_authorization = v;
        c.set_origin(
            Key::MetricsAuthorization,
            &Origin::Flag("--metrics-authorization"),
        );
    }
}

/// Applies `validation` of a file.
fn apply_validation_file(c: &mut Resolved, f: &super::validation::ValidationFile, origin: &Origin) {
    if let Some(v) = f.enabled {
        c.validation.enabled = v;
        c.set_origin(Key::ValidationEnabled, origin);
    }
    if let Some(v) = f.interval {
        c.validation.interval = v.0;
        c.set_origin(Key::ValidationInterval, origin);
    }
    if let Some(v) = f.timeout {
        c.validation.timeout = v.0;
        c.set_origin(Key::ValidationTimeout, origin);
    }
    if let Some(v) = &f.image {
        c.validation.image = v.0.clone();
        c.set_origin(Key::ValidationImage, origin);
    }
    if let Some(v) = &f.host_dir {
        c.validation.host_dir = v.0.clone();
        c.set_origin(Key::ValidationHostDir, origin);
    }
}

/// Applies the variables `DXDP_VALIDATION`, `DXDP_VALIDATION_INTERVAL`,
/// `DXDP_VALIDATION_TIMEOUT`, `DXDP_VALIDATION_IMAGE` and `DXDP_VALIDATION_HOST_DIR`.
fn apply_validation_env(
    c: &mut Resolved,
    env: &Env,
    parse_bool: fn(&str, &str) -> Result<bool, ConfigError>,
) -> Result<(), ConfigError> {
    if let Some(v) = env.get("DXDP_VALIDATION") {
        c.validation.enabled = parse_bool("DXDP_VALIDATION", v)?;
        c.set_origin(Key::ValidationEnabled, &Origin::env("DXDP_VALIDATION"));
    }
    if let Some(v) = env.get("DXDP_VALIDATION_INTERVAL") {
        c.validation.interval = super::validation::IntervalText::parse(v)
            .map_err(invalid("DXDP_VALIDATION_INTERVAL", v))?
            .0;
        c.set_origin(
            Key::ValidationInterval,
            &Origin::env("DXDP_VALIDATION_INTERVAL"),
        );
    }
    if let Some(v) = env.get("DXDP_VALIDATION_TIMEOUT") {
        c.validation.timeout = super::validation::TimeoutText::parse(v)
            .map_err(invalid("DXDP_VALIDATION_TIMEOUT", v))?
            .0;
        c.set_origin(
            Key::ValidationTimeout,
            &Origin::env("DXDP_VALIDATION_TIMEOUT"),
        );
    }
    if let Some(v) = env.get("DXDP_VALIDATION_IMAGE") {
        c.validation.image =
            super::validation::check_image(v).map_err(invalid("DXDP_VALIDATION_IMAGE", v))?;
        c.set_origin(Key::ValidationImage, &Origin::env("DXDP_VALIDATION_IMAGE"));
    }
    if let Some(v) = env.get("DXDP_VALIDATION_HOST_DIR") {
        c.validation.host_dir =
            super::validation::check_host_dir(v).map_err(invalid("DXDP_VALIDATION_HOST_DIR", v))?;
        c.set_origin(
            Key::ValidationHostDir,
            &Origin::env("DXDP_VALIDATION_HOST_DIR"),
        );
    }
    Ok(())
}
