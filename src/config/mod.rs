//! Configuration: built-in defaults < configuration file < environment < command-line flags,
//! with where every value came from (`dxdp config show`), the reference plugin's environment
//! variables and files for drop-in compatibility, and reloading when the file changes.

pub mod file;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::logging::LogFormat;
use dxdp_core::devices::{Resource, TargetDir};
use dxdp_core::pipeline::filter::DeviceSelector;
use dxdp_core::pipeline::runtime_files::AdditionalFile;
use dxdp_core::pipeline::PipelineConfig;
use dxdp_core::policy::ResourcePolicy;
use file::{
    Assignment, ConfigFile, FileEntry, LogFormatName, ReferenceFile, Replicas, ResourceName,
    VendorKey,
};

/// Settings of one resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceSettings {
    /// Serve it.
    pub enabled: bool,
    /// The resource name registered with the kubelet.
    pub name: String,
    /// IDs per physical device.
    pub replicas: u32,
    /// Extra resource names advertising the same devices.
    pub aliases: Vec<String>,
    /// `allocationPolicy`, `multiDevice` and `cudaVisibleDevices`.
    pub policy: ResourcePolicy,
}

/// The effective configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `resources.display` and `resources.compute`.
    pub resources: BTreeMap<Resource, ResourceSettings>,
    /// Pipeline settings (device selection, runtime files).
    pub pipeline: PipelineConfig,
    /// Assignment mode.
    pub assignment: Assignment,
    /// Log level or filter.
    pub log_level: String,
    /// Log format.
    pub log_format: LogFormat,
    /// Where each key's value came from (`default`, `file <path>`, `env NAME`, `flag --x`).
    pub origins: BTreeMap<String, String>,
}

impl Default for Config {
    fn default() -> Self {
        let mut c = Config {
            resources: Resource::ALL
                .iter()
                .map(|&r| {
                    (
                        r,
                        ResourceSettings {
                            enabled: true,
                            name: r.default_resource_name().to_string(),
                            replicas: 1,
                            aliases: Vec::new(),
                            policy: ResourcePolicy::default(),
                        },
                    )
                })
                .collect(),
            pipeline: PipelineConfig::default(),
            assignment: Assignment::Auto,
            log_level: "info".into(),
            log_format: LogFormat::Text,
            origins: BTreeMap::new(),
        };
        for key in c.keys() {
            c.origins.insert(key, "default".into());
        }
        c
    }
}

impl Config {
    /// Every key `config show` prints.
    fn keys(&self) -> Vec<String> {
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
            "logLevel",
            "logFormat",
        ] {
            keys.push(k.to_string());
        }
        keys
    }

    fn resource(&mut self, r: Resource) -> &mut ResourceSettings {
        self.resources.entry(r).or_insert_with(|| ResourceSettings {
            enabled: true,
            name: r.default_resource_name().to_string(),
            replicas: 1,
            aliases: Vec::new(),
            policy: ResourcePolicy::default(),
        })
    }

    /// The enabled resources with every name they are advertised under (name first).
    pub fn endpoints(&self) -> Vec<(Resource, String)> {
        let mut out = Vec::new();
        for (r, s) in &self.resources {
            if !s.enabled {
                continue;
            }
            out.push((*r, s.name.clone()));
            out.extend(s.aliases.iter().map(|a| (*r, a.clone())));
        }
        out
    }

    /// This configuration with `n` replicas for every resource.
    pub fn with_replicas(mut self, n: u32) -> Self {
        for r in Resource::ALL {
            self.resource(r).replicas = n;
        }
        self
    }

    /// The allocation policy of a resource (the defaults when unknown).
    pub fn policy(&self, r: Resource) -> ResourcePolicy {
        self.resources.get(&r).map(|s| s.policy).unwrap_or_default()
    }

    /// Replicas of a resource (1 when unknown).
    pub fn replicas(&self, r: Resource) -> u32 {
        self.resources.get(&r).map(|s| s.replicas).unwrap_or(1)
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
            _ => Value::Null,
        }
    }

    fn set_origin(&mut self, key: &str, origin: &str) {
        self.origins.insert(key.to_string(), origin.to_string());
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
        Value::Null => String::new(),
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

/// Command-line flags that override the configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Flags {
    /// `--resources`.
    pub resources: Option<Vec<Resource>>,
    /// `--replicas` (both resources).
    pub replicas: Option<u32>,
    /// `--include-integrated`.
    pub include_integrated: bool,
    /// `--include-detachable`.
    pub include_detachable: bool,
    /// `--assignment`.
    pub assignment: Option<Assignment>,
    /// `--log-level`.
    pub log_level: Option<String>,
    /// `--log-format`.
    pub log_format: Option<LogFormat>,
}

/// Why the configuration cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A file is invalid.
    #[error(transparent)]
    File(#[from] file::FileError),
    /// A file cannot be read.
    #[error("cannot read configuration file {path}: {reason}")]
    Read {
        /// The file.
        path: String,
        /// The OS error.
        reason: String,
    },
    /// An environment variable is invalid.
    #[error("environment variable {name}={}: {reason}", dxdp_core::quote::quote(.value))]
    Env {
        /// The variable.
        name: String,
        /// Its value.
        value: String,
        /// What is wrong and what is allowed.
        reason: String,
    },
}

/// The environment variables dxdp reads, as a plain map (so tests need not touch the process).
pub type Env = BTreeMap<String, String>;

/// The relevant variables of the process environment.
pub fn process_env() -> Env {
    std::env::vars()
        .filter(|(k, _)| {
            k.starts_with("DXDP_")
                || k.starts_with("WDDM_DEVICE_PLUGIN_")
                || k.starts_with("MCDM_DEVICE_PLUGIN_")
        })
        .collect()
}

/// The default configuration file path on this OS.
pub fn default_path() -> PathBuf {
    if cfg!(windows) {
        PathBuf::from(r"C:\etc\directx-device-plugins\config.yaml")
    } else {
        PathBuf::from("/etc/directx-device-plugins/config.yaml")
    }
}

/// Which configuration file to read: `--config`, else `DXDP_CONFIG` (both must exist), else the
/// default path, read when it exists and watched so that it is loaded when it appears later.
/// The flag says whether the file must exist.
pub fn choose_path(flag: Option<&Path>, env: &Env) -> Option<(PathBuf, bool)> {
    if let Some(p) = flag {
        return Some((p.to_path_buf(), true));
    }
    if let Some(p) = env.get("DXDP_CONFIG").filter(|p| !p.is_empty()) {
        return Some((PathBuf::from(p), true));
    }
    Some((default_path(), false))
}

fn read(path: &Path) -> Result<String, ConfigError> {
    crate::backend::stable_read::read_settled(path, Default::default()).map_err(|e| {
        ConfigError::Read {
            path: path.display().to_string(),
            reason: e.to_string(),
        }
    })
}

fn parse_bool(name: &str, value: &str) -> Result<bool, ConfigError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" | "" => Ok(false),
        _ => Err(ConfigError::Env {
            name: name.into(),
            value: value.into(),
            reason: "use true or false".into(),
        }),
    }
}

fn parse_replicas(name: &str, value: &str) -> Result<u32, ConfigError> {
    let err = |reason: String| ConfigError::Env {
        name: name.into(),
        value: value.into(),
        reason,
    };
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
            "multitenancy: {} -> resources.{r}.replicas: {}",
            n.0, n.0
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

fn apply_reference(c: &mut Config, r: Resource, f: &ReferenceFile, origin: &str) {
    if let Some(n) = f.multitenancy {
        c.resource(r).replicas = n.0;
        c.set_origin(&format!("resources.{r}.replicas"), origin);
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
            c.set_origin("runtimeFiles.additional", origin);
        }
    }
}

fn apply_file(c: &mut Config, f: &ConfigFile, origin: &str) {
    for (r, rf) in [
        (Resource::Display, &f.resources.display),
        (Resource::Compute, &f.resources.compute),
    ] {
        if let Some(v) = rf.enabled {
            c.resource(r).enabled = v;
            c.set_origin(&format!("resources.{r}.enabled"), origin);
        }
        if let Some(ResourceName(v)) = &rf.name {
            c.resource(r).name = v.clone();
            c.set_origin(&format!("resources.{r}.name"), origin);
        }
        if let Some(v) = rf.replicas {
            c.resource(r).replicas = v.0;
            c.set_origin(&format!("resources.{r}.replicas"), origin);
        }
        if let Some(v) = &rf.aliases {
            c.resource(r).aliases = v.iter().map(|a| a.0.clone()).collect();
            c.set_origin(&format!("resources.{r}.aliases"), origin);
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
        c.set_origin("devices.include", origin);
    }
    if let Some(v) = &d.exclude {
        c.pipeline.exclude = v.clone();
        c.set_origin("devices.exclude", origin);
    }
    if let Some(v) = f.assignment {
        c.assignment = v;
        c.set_origin("assignment", origin);
    }
    let rt = &f.runtime_files;
    if let Some(v) = rt.enabled {
        c.pipeline.runtime_files = v;
        c.set_origin("runtimeFiles.enabled", origin);
    }
    if let Some(v) = &rt.exclude {
        c.pipeline.runtime_exclude = v.clone();
        c.set_origin("runtimeFiles.exclude", origin);
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
        c.set_origin("runtimeFiles.additional", origin);
    }
    if let Some(v) = &f.log_level {
        c.log_level = v.0.clone();
        c.set_origin("logLevel", origin);
    }
    if let Some(v) = f.log_format {
        c.log_format = match v {
            LogFormatName::Text => LogFormat::Text,
            LogFormatName::Json => LogFormat::Json,
        };
        c.set_origin("logFormat", origin);
    }
}

/// `allocationPolicy`, `multiDevice` and `cudaVisibleDevices` of one resource (file only).
fn apply_policy(c: &mut Config, r: Resource, rf: &file::ResourceFile, origin: &str) {
    if let Some(v) = rf.allocation_policy {
        c.resource(r).policy.allocation = v;
        c.set_origin(&format!("resources.{r}.allocationPolicy"), origin);
    }
    if let Some(v) = rf.multi_device {
        c.resource(r).policy.multi_device = v;
        c.set_origin(&format!("resources.{r}.multiDevice"), origin);
    }
    if let Some(v) = rf.cuda_visible_devices {
        c.resource(r).policy.cuda_visible_devices = v;
        c.set_origin(&format!("resources.{r}.cudaVisibleDevices"), origin);
    }
}

/// The two adapter-kind switches.
#[derive(Debug, Clone, Copy)]
enum Switch {
    Integrated,
    Detachable,
}

/// Sets an include switch for one resource (`Some`) or both (`None`), recording the origin.
fn set_include(c: &mut Config, r: Option<Resource>, switch: Switch, value: bool, origin: &str) {
    let (flags, key) = match switch {
        Switch::Integrated => (&mut c.pipeline.include_integrated, "includeIntegrated"),
        Switch::Detachable => (&mut c.pipeline.include_detachable, "includeDetachable"),
    };
    let targets: &[Resource] = match &r {
        Some(r) => std::slice::from_ref(r),
        None => &Resource::ALL,
    };
    for &r in targets {
        *flags.get_mut(r) = value;
    }
    for &r in targets {
        c.set_origin(&format!("resources.{r}.{key}"), origin);
    }
}

fn apply_env(c: &mut Config, env: &Env) -> Result<(), ConfigError> {
    // The reference plugin's variables: WDDM = display, MCDM = compute.
    for (prefix, r) in [("WDDM", Resource::Display), ("MCDM", Resource::Compute)] {
        let name = format!("{prefix}_DEVICE_PLUGIN_MULTITENANCY");
        if let Some(v) = env.get(&name) {
            c.resource(r).replicas = parse_replicas(&name, v)?;
            c.set_origin(&format!("resources.{r}.replicas"), &format!("env {name}"));
        }
        // Each plugin's switch acts on its own resource, in both directions.
        for (suffix, switch) in [
            ("INCLUDE_INTEGRATED", Switch::Integrated),
            ("INCLUDE_DETACHABLE", Switch::Detachable),
        ] {
            let name = format!("{prefix}_DEVICE_PLUGIN_{suffix}");
            if let Some(v) = env.get(&name) {
                let value = parse_bool(&name, v)?;
                set_include(c, Some(r), switch, value, &format!("env {name}"));
            }
        }
    }
    if let Some(v) = env.get("DXDP_REPLICAS") {
        let n = parse_replicas("DXDP_REPLICAS", v)?;
        for r in Resource::ALL {
            c.resource(r).replicas = n;
            c.set_origin(&format!("resources.{r}.replicas"), "env DXDP_REPLICAS");
        }
    }
    if let Some(v) = env.get("DXDP_RESOURCES") {
        let wanted = parse_resources(v).map_err(|reason| ConfigError::Env {
            name: "DXDP_RESOURCES".into(),
            value: v.clone(),
            reason,
        })?;
        for r in Resource::ALL {
            c.resource(r).enabled = wanted.contains(&r);
            c.set_origin(&format!("resources.{r}.enabled"), "env DXDP_RESOURCES");
        }
    }
    for (name, switch) in [
        ("DXDP_INCLUDE_INTEGRATED", Switch::Integrated),
        ("DXDP_INCLUDE_DETACHABLE", Switch::Detachable),
    ] {
        if let Some(v) = env.get(name) {
            let value = parse_bool(name, v)?;
            set_include(c, None, switch, value, &format!("env {name}"));
        }
    }
    if let Some(v) = env.get("DXDP_ASSIGNMENT") {
        c.assignment = Assignment::parse(v).ok_or_else(|| ConfigError::Env {
            name: "DXDP_ASSIGNMENT".into(),
            value: v.clone(),
            reason: "use location-path, class-guid or auto".into(),
        })?;
        c.set_origin("assignment", "env DXDP_ASSIGNMENT");
    }
    if let Some(v) = env.get("DXDP_LOG_LEVEL") {
        crate::logging::filter(v).map_err(|e| ConfigError::Env {
            name: "DXDP_LOG_LEVEL".into(),
            value: v.clone(),
            reason: e.to_string(),
        })?;
        c.log_level = v.trim().to_string();
        c.set_origin("logLevel", "env DXDP_LOG_LEVEL");
    }
    if let Some(v) = env.get("DXDP_LOG_FORMAT") {
        c.log_format = v.parse().map_err(|reason| ConfigError::Env {
            name: "DXDP_LOG_FORMAT".into(),
            value: v.clone(),
            reason,
        })?;
        c.set_origin("logFormat", "env DXDP_LOG_FORMAT");
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

fn apply_flags(c: &mut Config, f: &Flags) {
    if let Some(list) = &f.resources {
        for r in Resource::ALL {
            c.resource(r).enabled = list.contains(&r);
            c.set_origin(&format!("resources.{r}.enabled"), "flag --resources");
        }
    }
    if let Some(n) = f.replicas {
        for r in Resource::ALL {
            c.resource(r).replicas = n;
            c.set_origin(&format!("resources.{r}.replicas"), "flag --replicas");
        }
    }
    if f.include_integrated {
        set_include(
            c,
            None,
            Switch::Integrated,
            true,
            "flag --include-integrated",
        );
    }
    if f.include_detachable {
        set_include(
            c,
            None,
            Switch::Detachable,
            true,
            "flag --include-detachable",
        );
    }
    if let Some(a) = f.assignment {
        c.assignment = a;
        c.set_origin("assignment", "flag --assignment");
    }
    if let Some(v) = &f.log_level {
        c.log_level = v.clone();
        c.set_origin("logLevel", "flag --log-level");
    }
    if let Some(v) = f.log_format {
        c.log_format = v;
        c.set_origin("logFormat", "flag --log-format");
    }
}

/// Everything the configuration is built from.
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    /// dxdp's configuration file and whether it must exist.
    pub file: Option<(PathBuf, bool)>,
    /// The environment.
    pub env: Env,
    /// The flags.
    pub flags: Flags,
}

impl Inputs {
    /// The files whose changes trigger a reload.
    pub fn watched_files(&self) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = self.file.iter().map(|(p, _)| p.clone()).collect();
        for prefix in ["WDDM", "MCDM"] {
            if let Some(p) = self
                .env
                .get(&format!("{prefix}_DEVICE_PLUGIN_CONFIG_FILE"))
                .filter(|p| !p.is_empty())
            {
                files.push(PathBuf::from(p));
            }
        }
        files
    }

    /// Builds the effective configuration: defaults < reference files < file < env < flags.
    pub fn resolve(&self) -> Result<Config, ConfigError> {
        let mut c = Config::default();
        for (prefix, r) in [("WDDM", Resource::Display), ("MCDM", Resource::Compute)] {
            let name = format!("{prefix}_DEVICE_PLUGIN_CONFIG_FILE");
            if let Some(p) = self.env.get(&name).filter(|p| !p.is_empty()) {
                let path = PathBuf::from(p);
                let text = read(&path)?;
                let f: ReferenceFile = file::parse(&text, &path.display().to_string())?;
                apply_reference(&mut c, r, &f, &format!("file {} ({name})", path.display()));
            }
        }
        if let Some((path, required)) = &self.file {
            match read(path) {
                Ok(text) => {
                    let f: ConfigFile = file::parse(&text, &path.display().to_string())?;
                    apply_file(&mut c, &f, &format!("file {}", path.display()));
                }
                Err(e) if *required => return Err(e),
                Err(_) => {}
            }
        }
        apply_env(&mut c, &self.env)?;
        apply_flags(&mut c, &self.flags);
        Ok(c)
    }
}

#[cfg(test)]
mod tests;
