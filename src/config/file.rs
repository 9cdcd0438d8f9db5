//! The configuration file formats: dxdp's own YAML, and the reference plugin's per-plugin files
//! (`WDDM_DEVICE_PLUGIN_CONFIG_FILE`, `MCDM_DEVICE_PLUGIN_CONFIG_FILE`). Strict: unknown keys,
//! wrong types and out-of-range values are errors with the file, line and column.

use std::collections::BTreeMap;

use serde::Deserialize;

use dxdp_core::allocation::MAX_REPLICAS;
pub use dxdp_core::assignment::Assignment;
use dxdp_core::pipeline::filter::{DeviceSelector, VendorSpec};
use dxdp_core::pipeline::winpath;
pub use dxdp_core::policy::{AllocationPolicy, MultiDevice};
use dxdp_core::quote::quote;

/// A replica count, 1 to [`MAX_REPLICAS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "u64")]
pub struct Replicas(pub u32);

impl TryFrom<u64> for Replicas {
    type Error = String;

    fn try_from(n: u64) -> Result<Self, Self::Error> {
        Replicas::check(n)
    }
}

impl Replicas {
    /// Checks the range and says what is allowed.
    pub fn check(n: u64) -> Result<Replicas, String> {
        if (1..=u64::from(MAX_REPLICAS)).contains(&n) {
            Ok(Replicas(n as u32))
        } else {
            Err(format!(
                "replicas must be from 1 to {MAX_REPLICAS}, got {n}"
            ))
        }
    }
}

/// An extended resource name (`domain/name`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct ResourceName(pub String);

impl TryFrom<String> for ResourceName {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        ResourceName::check(&s).map(|()| ResourceName(s))
    }
}

impl ResourceName {
    /// Checks the Kubernetes extended-resource-name rules that matter here.
    pub fn check(s: &str) -> Result<(), String> {
        let ok_part = |p: &str| {
            !p.is_empty()
                && p.len() <= 63
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
                && p.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
                && p.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
        };
        match s.split_once('/') {
            Some((domain, name)) if ok_part(domain) && ok_part(name) && domain.contains('.') && !domain.ends_with("kubernetes.io") => Ok(()),
            _ => Err(format!(
                "resource name {} must look like domain.example/name (letters, digits, '.', '-', '_'; not in kubernetes.io)",
                quote(s)
            )),
        }
    }
}

/// One runtime file in `runtimeFiles.additional` or the reference's `additionalMounts`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, try_from = "RawEntry")]
pub struct FileEntry {
    /// Relative to the driver store.
    pub source: String,
    /// Bare file name in the target directory; the source's file name when absent.
    pub destination: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEntry {
    source: String,
    #[serde(default)]
    destination: Option<String>,
}

impl TryFrom<RawEntry> for FileEntry {
    type Error = String;

    fn try_from(raw: RawEntry) -> Result<Self, Self::Error> {
        let source = winpath::normalize_source(&raw.source)
            .map_err(|why| format!("source {} {why}", quote(&raw.source)))?;
        let dest = raw.destination.clone().filter(|d| !d.is_empty());
        let check = dest
            .clone()
            .unwrap_or_else(|| winpath::file_name(&source).to_string());
        winpath::check_destination(&check)
            .map_err(|why| format!("destination {} {why}", quote(&check)))?;
        Ok(FileEntry {
            source,
            destination: dest,
        })
    }
}

/// Additional runtime files of one vendor.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VendorFiles {
    /// Files for `C:\Windows\System32`.
    #[serde(default)]
    pub system32: Vec<FileEntry>,
    /// Files for `C:\Windows\SysWOW64`.
    #[serde(default)]
    pub syswow64: Vec<FileEntry>,
}

/// `resources.display` / `resources.compute`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResourceFile {
    /// Serve this resource.
    pub enabled: Option<bool>,
    /// The resource name.
    pub name: Option<ResourceName>,
    /// IDs per physical device.
    pub replicas: Option<Replicas>,
    /// Extra resource names advertising the same devices.
    pub aliases: Option<Vec<ResourceName>>,
    /// Advertise integrated adapters of this resource (overrides `devices.includeIntegrated`).
    pub include_integrated: Option<bool>,
    /// Advertise detachable adapters of this resource (overrides `devices.includeDetachable`).
    pub include_detachable: Option<bool>,
    /// `spread` or `pack`: how preferred allocations pick physical devices.
    pub allocation_policy: Option<AllocationPolicy>,
    /// `warn` or `fail`: what Allocate does with a request for several IDs.
    pub multi_device: Option<MultiDevice>,
    /// Set `CUDA_VISIBLE_DEVICES` for NVIDIA devices.
    pub cuda_visible_devices: Option<bool>,
}

/// `resources`. Every name it serves (each enabled resource's name and aliases) must be unique:
/// the kubelet would take one name registered twice as one resource, and the other resource's
/// devices would vanish.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(try_from = "RawResources")]
pub struct ResourcesFile {
    /// `directx.microsoft.com/display` settings.
    pub display: ResourceFile,
    /// `directx.microsoft.com/compute` settings.
    pub compute: ResourceFile,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawResources {
    #[serde(default)]
    display: ResourceFile,
    #[serde(default)]
    compute: ResourceFile,
}

impl TryFrom<RawResources> for ResourcesFile {
    type Error = String;

    fn try_from(raw: RawResources) -> Result<Self, Self::Error> {
        let mut seen: Vec<(String, String)> = Vec::new();
        for (r, f) in [("display", &raw.display), ("compute", &raw.compute)] {
            if f.enabled == Some(false) {
                continue;
            }
            let default = format!("directx.microsoft.com/{r}");
            let name = f.name.as_ref().map(|n| n.0.clone()).unwrap_or(default);
            let mut names = vec![(name, format!("resources.{r}.name"))];
            for (i, a) in f.aliases.iter().flatten().enumerate() {
                names.push((a.0.clone(), format!("resources.{r}.aliases[{i}]")));
            }
            for (name, key) in names {
                if let Some((_, first)) = seen.iter().find(|(n, _)| *n == name) {
                    return Err(format!(
                        "resource name {name} is used twice ({first} and {key}); every served name must be unique"
                    ));
                }
                seen.push((name, key));
            }
        }
        Ok(ResourcesFile {
            display: raw.display,
            compute: raw.compute,
        })
    }
}

/// A log level or tracing filter, checked as logging would use it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct LogLevelName(pub String);

impl TryFrom<String> for LogLevelName {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        crate::logging::filter(&s)
            .map(|_| LogLevelName(s.trim().to_string()))
            .map_err(|e| e.to_string())
    }
}

/// `devices`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DevicesFile {
    /// Advertise integrated adapters.
    pub include_integrated: Option<bool>,
    /// Advertise detachable adapters.
    pub include_detachable: Option<bool>,
    /// Keep only devices matching one of these.
    pub include: Option<Vec<DeviceSelector>>,
    /// Leave out devices matching one of these.
    pub exclude: Option<Vec<DeviceSelector>>,
}

/// `health`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HealthFile {
    /// Check device health at all.
    pub enabled: Option<bool>,
    /// Problem codes that do not make a device Unhealthy.
    pub ignore_problem_codes: Option<Vec<u32>>,
}

/// `runtimeFiles`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RuntimeFilesFile {
    /// Mount runtime files at all.
    pub enabled: Option<bool>,
    /// Destination names never mounted.
    pub exclude: Option<Vec<String>>,
    /// Extra files per vendor (name or PCI vendor ID).
    pub additional: Option<BTreeMap<VendorKey, VendorFiles>>,
}

/// A vendor as a map key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(try_from = "String")]
pub struct VendorKey(pub u32);

impl TryFrom<String> for VendorKey {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        VendorSpec::parse(&s).map(|v| VendorKey(v.0))
    }
}

/// A `HOST:PORT` for the metrics and probes endpoint; empty turns it off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct MetricsAddress(pub Option<std::net::SocketAddr>);

impl TryFrom<String> for MetricsAddress {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        MetricsAddress::parse(&s).map(MetricsAddress)
    }
}

impl MetricsAddress {
    /// Parses `IP:PORT` (`[IPv6]:PORT`); empty means off. Says what is allowed otherwise.
    pub fn parse(s: &str) -> Result<Option<std::net::SocketAddr>, String> {
        let s = s.trim();
        if s.is_empty() {
            return Ok(None);
        }
        s.parse().map(Some).map_err(|_| {
            format!(
                "metrics address {} is not IP:PORT: use e.g. 0.0.0.0:9466 (every interface), 127.0.0.1:9466 (this host only) or [::]:9466; a host name is not allowed; empty turns the endpoint off",
                quote(s)
            )
        })
    }
}

/// `metrics`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MetricsFile {
    /// Where `/metrics`, `/healthz` and `/readyz` are served.
    pub address: Option<MetricsAddress>,
}

/// Log format names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormatName {
    /// Text.
    Text,
    /// JSON lines.
    Json,
}

/// dxdp's configuration file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConfigFile {
    /// Per-resource settings.
    #[serde(default)]
    pub resources: ResourcesFile,
    /// Device selection.
    #[serde(default)]
    pub devices: DevicesFile,
    /// Assignment mode.
    pub assignment: Option<Assignment>,
    /// Runtime-file control.
    #[serde(default)]
    pub runtime_files: RuntimeFilesFile,
    /// Health checks.
    #[serde(default)]
    pub health: HealthFile,
    /// Log level.
    pub log_level: Option<LogLevelName>,
    /// Log format.
    pub log_format: Option<LogFormatName>,
    /// The metrics and probes endpoint.
    #[serde(default)]
    pub metrics: MetricsFile,
    /// Node labels.
    #[serde(default)]
    pub node_labels: NodeLabelsFile,
    /// GPU telemetry.
    #[serde(default)]
    pub telemetry: TelemetryFile,
    /// Named configurations, one of which a node selects with its
    /// `<prefix>device-plugin.config` label.
    pub configurations: Option<BTreeMap<ConfigName, NamedConfigFile>>,
}

/// `nodeLabels`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeLabelsFile {
    /// Keep the node's labels up to date.
    pub enabled: Option<bool>,
    /// The label key prefix.
    pub prefix: Option<LabelPrefix>,
}

/// `telemetry`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TelemetryFile {
    /// Sample the GPUs (where a source exists).
    pub enabled: Option<bool>,
    /// Time between samples.
    pub interval: Option<Interval>,
    /// Where the kubelet serves PodResources (a socket file, or a `\\.\pipe\…` name).
    pub pod_resources_endpoint: Option<String>,
}

/// A sampling interval: `10s`, `1m`, `500ms` or a number of seconds, from 1 s to 1 h.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "IntervalText")]
pub struct Interval(pub std::time::Duration);

/// What an interval may be written as.
#[derive(Deserialize)]
#[serde(untagged)]
enum IntervalText {
    Seconds(u64),
    Text(String),
}

impl TryFrom<IntervalText> for Interval {
    type Error = String;

    fn try_from(v: IntervalText) -> Result<Self, Self::Error> {
        match v {
            IntervalText::Seconds(n) => Interval::parse(&n.to_string()),
            IntervalText::Text(s) => Interval::parse(&s),
        }
        .map(Interval)
    }
}

impl Interval {
    /// The shortest interval.
    pub const MIN: std::time::Duration = std::time::Duration::from_secs(1);
    /// The longest interval.
    pub const MAX: std::time::Duration = std::time::Duration::from_secs(3600);

    /// Parses `10s`, `1m`, `1500ms` or `10` (seconds); says what is allowed otherwise.
    pub fn parse(text: &str) -> Result<std::time::Duration, String> {
        let t = text.trim();
        let (number, unit_ms) = if let Some(n) = t.strip_suffix("ms") {
            (n, 1)
        } else if let Some(n) = t.strip_suffix('s') {
            (n, 1000)
        } else if let Some(n) = t.strip_suffix('m') {
            (n, 60_000)
        } else {
            (t, 1000)
        };
        let bad = || {
            format!(
                "interval {} is not a duration from 1s to 1h: use e.g. 10s, 30s, 1m or a number of seconds",
                quote(text)
            )
        };
        let n: u64 = number.trim().parse().map_err(|_| bad())?;
        let d = std::time::Duration::from_millis(n.checked_mul(unit_ms).ok_or_else(bad)?);
        if d < Self::MIN || d > Self::MAX {
            return Err(bad());
        }
        Ok(d)
    }
}

/// A label key prefix, checked as a DNS subdomain followed by `/`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct LabelPrefix(pub String);

impl TryFrom<String> for LabelPrefix {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        dxdp_core::labels::check_prefix(&s).map(|()| LabelPrefix(s))
    }
}

/// The name of a configuration in `configurations` (a valid label value, as nodes select it by
/// label).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(try_from = "String")]
pub struct ConfigName(pub String);

impl TryFrom<String> for ConfigName {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        if !s.is_empty() && dxdp_core::labels::is_label_value(&s) {
            Ok(ConfigName(s))
        } else {
            Err(format!(
                "configuration name {} is not a valid label value: use 1 to 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit",
                quote(&s)
            ))
        }
    }
}

/// One named configuration: the device settings a node can select. Process-wide settings
/// (`logLevel`, `logFormat`, `nodeLabels`, `metrics`) and nested `configurations` are only
/// allowed at the top level.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NamedConfigFile {
    /// Per-resource settings.
    #[serde(default)]
    pub resources: ResourcesFile,
    /// Device selection.
    #[serde(default)]
    pub devices: DevicesFile,
    /// Assignment mode.
    pub assignment: Option<Assignment>,
    /// Runtime-file control.
    #[serde(default)]
    pub runtime_files: RuntimeFilesFile,
    /// Health checks.
    #[serde(default)]
    pub health: HealthFile,
}

impl From<&NamedConfigFile> for ConfigFile {
    fn from(n: &NamedConfigFile) -> Self {
        ConfigFile {
            resources: n.resources.clone(),
            devices: n.devices.clone(),
            assignment: n.assignment,
            runtime_files: n.runtime_files.clone(),
            health: n.health.clone(),
            ..ConfigFile::default()
        }
    }
}

/// A reference-plugin configuration file (one per plugin: WDDM = display, MCDM = compute).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReferenceFile {
    /// Replicas of the plugin's resource.
    pub multitenancy: Option<Replicas>,
    /// Include integrated adapters.
    pub include_integrated: Option<bool>,
    /// Include detachable adapters.
    pub include_detachable: Option<bool>,
    /// Extra System32 files keyed by vendor.
    pub additional_mounts: Option<BTreeMap<VendorKey, Vec<FileEntry>>>,
    /// Extra SysWOW64 files keyed by vendor.
    pub additional_mounts_wow64: Option<BTreeMap<VendorKey, Vec<FileEntry>>>,
}

/// Why a configuration file is not valid: `file:line:column: what is wrong`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{origin}{}: {message}", location.map(|(l, c)| format!(":{l}:{c}")).unwrap_or_default())]
pub struct FileError {
    /// The file.
    pub origin: String,
    /// Line and column.
    pub location: Option<(u64, u64)>,
    /// What is wrong and what is allowed.
    pub message: String,
}

/// Parses a YAML document of type `T`, with `origin` naming it in errors.
pub fn parse<T: serde::de::DeserializeOwned>(text: &str, origin: &str) -> Result<T, FileError> {
    if text.trim().is_empty() {
        // An empty file (e.g. an empty ConfigMap key) is an empty configuration.
        return serde_saphyr::from_str("{}").map_err(|e| FileError {
            origin: origin.to_string(),
            location: None,
            message: e.to_string(),
        });
    }
    let options = serde_saphyr::options! { with_snippet: false };
    serde_saphyr::from_str_with_options(text, options).map_err(|e| {
        let location = e.location().map(|l| (l.line(), l.column()));
        let message = dxdp_core::snapshot::yaml_message(&e);
        let message = match message.as_str() {
            "invalid boolean" => "invalid boolean: use true or false".to_string(),
            m if m.starts_with("invalid u") || m.starts_with("invalid i") => {
                format!("{m}: use a whole number")
            }
            m => m.to_string(),
        };
        FileError {
            origin: origin.to_string(),
            location,
            message,
        }
    })
}
