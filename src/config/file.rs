//! The configuration file formats: dxdp's own YAML, and the reference plugin's per-plugin files
//! (`WDDM_DEVICE_PLUGIN_CONFIG_FILE`, `MCDM_DEVICE_PLUGIN_CONFIG_FILE`). Strict: unknown keys,
//! wrong types and out-of-range values are errors with the file, line and column.

use std::collections::BTreeMap;

use schemars::JsonSchema;
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

impl JsonSchema for Replicas {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Replicas".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({"type": "integer", "minimum": 1, "maximum": MAX_REPLICAS})
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

/// The reference plugin's `multitenancy`: 0 to [`MAX_REPLICAS`], where 0 means 1 (the reference
/// plugin enforces a minimum of 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(try_from = "u64")]
pub struct Multitenancy(pub u32);

impl TryFrom<u64> for Multitenancy {
    type Error = String;

    fn try_from(n: u64) -> Result<Self, Self::Error> {
        if n == 0 {
            Ok(Multitenancy(0))
        } else {
            Replicas::check(n).map(|r| Multitenancy(r.0))
        }
    }
}

impl Multitenancy {
    /// The replicas it means: 0 is 1.
    pub fn replicas(self) -> u32 {
        self.0.max(1)
    }
}

/// An extended resource name (`domain/name`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
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
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, try_from = "RawEntry")]
pub struct FileEntry {
    /// Relative to the driver store.
    pub source: String,
    /// Bare file name in the target directory; the source's file name when absent.
    pub destination: Option<String>,
}

#[derive(Deserialize, JsonSchema)]
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
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
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
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
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
    #[serde(default)]
    #[schemars(schema_with = "schema::allocation_policy")]
    pub allocation_policy: Option<AllocationPolicy>,
    /// `warn` or `fail`: what Allocate does with a request for several IDs.
    #[serde(default)]
    #[schemars(schema_with = "schema::multi_device")]
    pub multi_device: Option<MultiDevice>,
    /// Set `CUDA_VISIBLE_DEVICES` for NVIDIA devices.
    pub cuda_visible_devices: Option<bool>,
}

/// `resources`. Every name it serves (each enabled resource's name and aliases) must be unique:
/// the kubelet would take one name registered twice as one resource, and the other resource's
/// devices would vanish.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(try_from = "RawResources")]
pub struct ResourcesFile {
    /// `directx.microsoft.com/display` settings.
    pub display: ResourceFile,
    /// `directx.microsoft.com/compute` settings.
    pub compute: ResourceFile,
}

#[derive(Deserialize, JsonSchema)]
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
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
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
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DevicesFile {
    /// Advertise integrated adapters.
    pub include_integrated: Option<bool>,
    /// Advertise detachable adapters.
    pub include_detachable: Option<bool>,
    /// Keep only devices matching one of these.
    #[serde(default)]
    #[schemars(schema_with = "schema::selectors")]
    pub include: Option<Vec<DeviceSelector>>,
    /// Leave out devices matching one of these.
    #[serde(default)]
    #[schemars(schema_with = "schema::selectors")]
    pub exclude: Option<Vec<DeviceSelector>>,
}

/// `health`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HealthFile {
    /// Check device health at all.
    pub enabled: Option<bool>,
    /// Problem codes that do not make a device Unhealthy.
    pub ignore_problem_codes: Option<Vec<u32>>,
    /// Per-signal actions (`health.signals.<name>`; see `config::health`).
    pub signals: Option<super::health::SignalsFile>,
    /// Signals ignored altogether.
    pub ignore: Option<Vec<super::health::SignalName>>,
}

/// `runtimeFiles`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize, JsonSchema)]
#[serde(try_from = "String")]
pub struct VendorKey(pub u32);

impl TryFrom<String> for VendorKey {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        VendorSpec::parse(&s).map(|v| VendorKey(v.0))
    }
}

/// A `HOST:PORT` for the metrics and probes endpoint; empty turns it off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
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
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MetricsFile {
    /// Where `/metrics`, `/healthz` and `/readyz` are served.
    #[serde(default)]
    #[schemars(schema_with = "schema::socket_address")]
    pub address: Option<MetricsAddress>,
    /// Where `/healthz` and `/readyz` alone are also served, on a listener of their own that
    /// metrics clients cannot starve (e.g. 127.0.0.1:9467 for the kubelet's probes).
    #[serde(default)]
    #[schemars(schema_with = "schema::socket_address")]
    pub probe_address: Option<MetricsAddress>,
    /// A web configuration file in the Prometheus exporters' format (TLS, client certificates,
    /// basic authentication, headers) for `address`; empty: plain HTTP, no authentication.
    pub web_config_file: Option<String>,
    /// Who may read `/metrics`: `none` (anyone who reaches it, or the web configuration's
    /// users) or `kubernetes` (a bearer token with `get` on the non-resource URL `/metrics`,
    /// checked with TokenReview and SubjectAccessReview).
    pub authorization: Option<MetricsAuthorization>,
}

/// `metrics.authorization`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum MetricsAuthorization {
    /// No bearer token checked.
    #[default]
    None,
    /// TokenReview and SubjectAccessReview of the request's bearer token.
    Kubernetes,
}

impl MetricsAuthorization {
    /// Parses `none` or `kubernetes`.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.trim() {
            "" | "none" => Ok(MetricsAuthorization::None),
            "kubernetes" => Ok(MetricsAuthorization::Kubernetes),
            other => Err(format!(
                "metrics authorization {} is not known: use none or kubernetes",
                quote(other)
            )),
        }
    }

    /// The name.
    pub fn as_str(self) -> &'static str {
        match self {
            MetricsAuthorization::None => "none",
            MetricsAuthorization::Kubernetes => "kubernetes",
        }
    }
}

/// Log format names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LogFormatName {
    /// Text.
    Text,
    /// JSON lines.
    Json,
}

/// dxdp's configuration file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConfigFile {
    /// Per-resource settings.
    #[serde(default)]
    pub resources: ResourcesFile,
    /// Device selection.
    #[serde(default)]
    pub devices: DevicesFile,
    /// Assignment mode.
    #[serde(default)]
    #[schemars(schema_with = "schema::assignment")]
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
    /// The GPU isolation audit.
    #[serde(default)]
    pub isolation: IsolationFile,
    /// The in-cluster validation Jobs.
    #[serde(default)]
    pub validation: super::validation::ValidationFile,
    /// Named configurations, one of which a node selects with its
    /// `<prefix>device-plugin.config` label.
    pub configurations: Option<BTreeMap<ConfigName, NamedConfigFile>>,
}

/// `nodeLabels`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeLabelsFile {
    /// Keep the node's labels up to date.
    pub enabled: Option<bool>,
    /// The label key prefix.
    pub prefix: Option<LabelPrefix>,
}

/// `telemetry`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TelemetryFile {
    /// Sample the GPUs (where a source exists).
    pub enabled: Option<bool>,
    /// Time between samples.
    pub interval: Option<Interval>,
    /// Where the kubelet serves PodResources (a socket file, or a `\\.\pipe\…` name).
    pub pod_resources_endpoint: Option<String>,
    /// Where the container runtime serves its CRI API (`unix:///…`, `npipe:////./pipe/…`, a
    /// `\\.\pipe\…` name or a socket file); empty: containerd's.
    pub cri_endpoint: Option<CriEndpoint>,
    /// Pod label keys copied into `dxdp_pod_info` as `label_<key>`: regular expressions
    /// matched against the whole key (e.g. `team`, `app\.kubernetes\.io/.*`); empty: none.
    pub pod_labels: Option<Vec<PodLabelPattern>>,
    /// Add the pod's UID to `dxdp_pod_info` as `uid`.
    pub pod_uid: Option<bool>,
}

/// One pattern of `telemetry.podLabels`, checked to be a valid regular expression.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(try_from = "String")]
pub struct PodLabelPattern(pub String);

impl TryFrom<String> for PodLabelPattern {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        PodLabelPattern::compile(&s).map(|_| PodLabelPattern(s))
    }
}

impl PodLabelPattern {
    /// `pattern` anchored at both ends (it must match the whole label key), compiled.
    pub fn compile(pattern: &str) -> Result<regex::Regex, String> {
        if pattern.is_empty() {
            return Err("telemetry.podLabels: an empty pattern matches no label key: remove it, or write .* for every label".into());
        }
        regex::Regex::new(&format!("^(?:{pattern})$")).map_err(|e| {
            let e = e.to_string();
            let why = e.lines().last().unwrap_or_default().trim();
            format!(
                "telemetry.podLabels: pattern {} is not a valid regular expression ({}): write a regular expression matching whole label keys, e.g. team or app\\.kubernetes\\.io/.*",
                quote(pattern),
                why.strip_prefix("error: ").unwrap_or(why)
            )
        })
    }
}

/// Where the container runtime serves its CRI API, as the user wrote it (validated: a local
/// socket or named pipe).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(try_from = "String")]
pub struct CriEndpoint(pub String);

impl TryFrom<String> for CriEndpoint {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        CriEndpoint::parse(&s).map(|_| CriEndpoint(s.trim().to_string()))
    }
}

impl CriEndpoint {
    /// The local address of a CRI endpoint as the kubelet's `--container-runtime-endpoint`
    /// writes it, in the form dxdp's clients take: `unix:///run/x.sock` → `/run/x.sock`,
    /// `npipe:////./pipe/NAME` (or `npipe://./pipe/NAME`) → `\\.\pipe\NAME`; a `\\.\pipe\NAME`
    /// or `//./pipe/NAME` name and a socket file path are taken as they are. Empty: `None` (the
    /// default). Another scheme, or a pipe on another machine, is an error saying what to use.
    pub fn parse(text: &str) -> Result<Option<String>, String> {
        let t = text.trim();
        if t.is_empty() {
            return Ok(None);
        }
        let usage = "use unix:///PATH, npipe:////./pipe/NAME, \\\\.\\pipe\\NAME or a socket file path, e.g. npipe:////./pipe/containerd-containerd (containerd on Windows) or unix:///run/containerd/containerd.sock";
        let lower = t.to_ascii_lowercase();
        if lower.starts_with("unix://") {
            // unix:///run/x.sock and, on Windows, unix:///C:/x.sock.
            let rest = &t["unix://".len()..];
            let path = match rest.as_bytes() {
                [b'/', drive, b':', ..] if drive.is_ascii_alphabetic() => &rest[1..],
                _ => rest,
            };
            if path.is_empty() || !(path.starts_with('/') || path.get(1..2) == Some(":")) {
                return Err(format!(
                    "CRI endpoint {} has no absolute socket path: {usage}",
                    quote(t)
                ));
            }
            return Ok(Some(path.to_string()));
        }
        if lower.starts_with("npipe:") {
            let rest = t["npipe:".len()..].trim_start_matches(['/', '\\']);
            let parts: Vec<&str> = rest.split(['/', '\\']).collect();
            return match parts.as_slice() {
                [".", pipe, name] if pipe.eq_ignore_ascii_case("pipe") && !name.is_empty() => {
                    Ok(Some(format!(r"\\.\pipe\{name}")))
                }
                _ => Err(format!(
                    "CRI endpoint {} is not a named pipe on this machine: {usage}",
                    quote(t)
                )),
            };
        }
        if let Some((scheme, _)) = t.split_once("://") {
            return Err(format!(
                "CRI endpoint {} uses {}://, which dxdp does not speak (the CRI API is local): {usage}",
                quote(t),
                scheme
            ));
        }
        Ok(Some(t.to_string()))
    }
}

/// `isolation`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IsolationFile {
    /// What dxdp does while a container uses a GPU it was not allocated: `audit` (report it) or
    /// `taint` (also put a NoSchedule taint on the node).
    pub policy: Option<IsolationPolicy>,
    /// Report violations as Kubernetes Events on the pod (needs create on events).
    pub events: Option<bool>,
}

/// What dxdp does while a GPU isolation violation lasts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum IsolationPolicy {
    /// Detect and report (metrics, log, Events).
    #[default]
    Audit,
    /// Also taint the node NoSchedule while any violation lasts.
    Taint,
}

impl IsolationPolicy {
    /// `audit` or `taint`.
    pub fn as_str(self) -> &'static str {
        match self {
            IsolationPolicy::Audit => "audit",
            IsolationPolicy::Taint => "taint",
        }
    }

    /// Parses `audit` or `taint`; says what is allowed otherwise.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "audit" => Ok(IsolationPolicy::Audit),
            "taint" => Ok(IsolationPolicy::Taint),
            _ => Err(format!(
                "isolation policy {} is not audit or taint",
                quote(text)
            )),
        }
    }
}

/// A sampling interval: `10s`, `1m`, `500ms` or a number of seconds, from 1 s to 1 h.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "IntervalText")]
pub struct Interval(pub std::time::Duration);

impl JsonSchema for Interval {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Interval".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "a sampling interval: 10s, 1m, 1500ms or a number of seconds, from 1 s to 1 h",
            "anyOf": [
                {"type": "integer", "minimum": 1, "maximum": 3600},
                {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)?$"}
            ]
        })
    }
}

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
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
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
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Deserialize, JsonSchema)]
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
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NamedConfigFile {
    /// Per-resource settings.
    #[serde(default)]
    pub resources: ResourcesFile,
    /// Device selection.
    #[serde(default)]
    pub devices: DevicesFile,
    /// Assignment mode.
    #[serde(default)]
    #[schemars(schema_with = "schema::assignment")]
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
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReferenceFile {
    /// Replicas of the plugin's resource (0 means 1, as in the reference plugin).
    pub multitenancy: Option<Multitenancy>,
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

/// What is at `line:column` of `text`, for "got …" in errors: a quoted scalar (bounded), or
/// "a list" / "a mapping".
fn found_at(text: &str, location: Option<(u64, u64)>) -> String {
    let Some((line, column)) = location else {
        return "something else".into();
    };
    let line_text = text
        .lines()
        .nth(line.saturating_sub(1) as usize)
        .unwrap_or_default();
    let rest: String = line_text
        .chars()
        .skip(column.saturating_sub(1) as usize)
        .collect();
    let rest = rest.trim_start();
    if rest.starts_with('-') && rest[1..].starts_with([' ', '\t']) || rest.starts_with('[') {
        return "a list".into();
    }
    if rest.starts_with('{') {
        return "a mapping".into();
    }
    let end = rest
        .find([',', '}', ']'])
        .into_iter()
        .chain(rest.find(" #"))
        .min()
        .unwrap_or(rest.len());
    let token = rest[..end].trim();
    if token.is_empty() {
        return "nothing".into();
    }
    if token.ends_with(':') || token.contains(": ") {
        return "a mapping".into();
    }
    quote(token.trim_matches(['\'', '"']))
}

/// A parser message in the words an operator uses: "expected a whole number, got \"two\"",
/// "the file must be a mapping of keys, not a list", "unknown key …: the keys allowed here are …".
fn operator_words(message: &str, text: &str, location: Option<(u64, u64)>) -> String {
    let got = || found_at(text, location);
    let m = message;
    if m == "invalid boolean" {
        return format!("expected true or false, got {}", got());
    }
    if m.starts_with("invalid u") || m.starts_with("invalid i") {
        let got = got();
        return if got.starts_with("\"-") {
            format!("expected a whole number of at least 0, got {got}")
        } else {
            format!("expected a whole number, got {got}")
        };
    }
    if m.starts_with("invalid f") {
        return format!("expected a number, got {}", got());
    }
    if m == "expected mapping start" {
        let got = got();
        return if location == Some((1, 1)) {
            format!(
                "the file must be a mapping of keys (key: value), not {}",
                if got == "a list" {
                    got
                } else {
                    format!("the single value {got}")
                }
            )
        } else {
            format!("expected a mapping of keys (key: value) here, got {got}")
        };
    }
    if m == "expected sequence start" {
        return format!(
            "expected a list here ([a, b], or one item per line starting with '- '), got {}",
            got()
        );
    }
    if let Some(rest) = m.strip_prefix("duplicate mapping key: ") {
        let key = rest
            .split(", set DuplicateKeyPolicy")
            .next()
            .unwrap_or(rest);
        return format!("key {key} appears twice in the same mapping: keep one");
    }
    if let Some(rest) = m.strip_prefix("unknown field ") {
        return match rest.split_once(", expected one of ") {
            Some((key, allowed)) => {
                format!("unknown key {key}: the keys allowed here are {allowed}")
            }
            None => match rest.split_once(", expected ") {
                Some((key, allowed)) => {
                    format!("unknown key {key}: the only key allowed here is {allowed}")
                }
                None => format!("unknown key {rest}"),
            },
        };
    }
    if let Some(rest) = m.strip_prefix("unknown variant ") {
        return match rest.split_once(", expected one of ") {
            Some((value, allowed)) => format!("unknown value {value}: use one of {allowed}"),
            None => format!("unknown value {rest}"),
        };
    }
    if let Some(rest) = m.strip_prefix("invalid type: ") {
        if let Some((found, expected)) = rest.split_once(", expected ") {
            return format!("expected {expected}, got {found}");
        }
    }
    m.to_string()
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
        let message = operator_words(&dxdp_core::snapshot::yaml_message(&e), text, location);
        FileError {
            origin: origin.to_string(),
            location,
            message,
        }
    })
}

/// The JSON Schema of dxdp's configuration file (`dxdp config schema`), generated from the
/// types above: the Helm chart's `config` value is checked against this same schema. Keys and
/// types are exact; some value rules (a resource name used twice, runtime-file paths, log
/// filters, vendor names) are only checked by dxdp itself (`dxdp config check`).
pub fn config_schema() -> serde_json::Value {
    let generator = schemars::generate::SchemaSettings::draft07()
        .with(|s| s.inline_subschemas = true)
        .into_generator();
    let mut value = generator.into_root_schema_for::<ConfigFile>().to_value();
    schema::tidy(&mut value);
    if let Some(map) = value.as_object_mut() {
        map.remove("$schema");
        map.insert("title".into(), "dxdp configuration file".into());
        map.insert(
            "description".into(),
            "dxdp's configuration file (docs/configuration.md); generated by `dxdp config schema`"
                .into(),
        );
    }
    value
}

/// Schemas of the core crate's types (which know nothing of JSON Schema), and tidying.
mod schema {
    use schemars::{json_schema, Schema, SchemaGenerator};
    use serde_json::Value;

    use super::{AllocationPolicy, Assignment, MultiDevice};

    fn one_of_or_null(names: Vec<&str>) -> Schema {
        let mut names: Vec<Value> = names.into_iter().map(Value::from).collect();
        names.push(Value::Null);
        json_schema!({"enum": names})
    }

    /// `assignment`.
    pub fn assignment(_: &mut SchemaGenerator) -> Schema {
        one_of_or_null(Assignment::ALL.iter().map(|a| a.as_str()).collect())
    }

    /// `allocationPolicy`.
    pub fn allocation_policy(_: &mut SchemaGenerator) -> Schema {
        one_of_or_null(AllocationPolicy::ALL.iter().map(|a| a.as_str()).collect())
    }

    /// `multiDevice`.
    pub fn multi_device(_: &mut SchemaGenerator) -> Schema {
        one_of_or_null(MultiDevice::ALL.iter().map(|a| a.as_str()).collect())
    }

    /// What [`super::MetricsAddress::parse`] accepts, so that the chart's schema refuses what the
    /// daemon would (`localhost:9466`, a missing port): `IPv4:PORT` exactly (no leading zeros in
    /// the address, a port up to 65535, leading zeros allowed), `[IPv6]:PORT` by its characters
    /// (dxdp checks the rest), or empty (off); blanks around it are trimmed.
    pub fn socket_address(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": ["string", "null"],
            "pattern": SOCKET_ADDRESS_PATTERN,
        })
    }

    /// The pattern of [`socket_address`].
    pub const SOCKET_ADDRESS_PATTERN: &str = concat!(
        r"^\s*$|^\s*(",
        r"((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])",
        r"|\[[0-9A-Fa-f:.]{2,45}(%[0-9]{1,10})?\]",
        r"):0*([0-9]{1,4}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])\s*$"
    );

    /// `devices.include` and `devices.exclude`: lists of device selectors.
    pub fn selectors(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": ["array", "null"],
            "items": {
                "type": "object",
                "description": "a device selector: a device matches when every given field matches",
                "additionalProperties": false,
                "minProperties": 1,
                "properties": {
                    "vendor": {
                        "type": ["string", "integer"],
                        "description": "a vendor name (nvidia, amd, intel, microsoft, qualcomm, or the manufacturer as Windows reports it), pci-XXXX or a PCI vendor ID such as 0x10DE"
                    },
                    "deviceId": {"type": "integer", "minimum": 0, "description": "PCI device ID"},
                    "locationPath": {"type": "string", "description": "location path (case-insensitive)"},
                    "description": {"type": "string", "description": "glob over the description (* and ?, case-insensitive)"}
                }
            }
        })
    }

    /// Drops what Helm's validators do not know (`format` names such as `uint32`).
    pub fn tidy(value: &mut Value) {
        match value {
            Value::Object(map) => {
                if map.get("format").is_some_and(Value::is_string) {
                    map.remove("format");
                }
                map.values_mut().for_each(tidy);
            }
            Value::Array(list) => list.iter_mut().for_each(tidy),
            _ => {}
        }
    }
}

/// How many errors `dxdp config check` reports of one file at most.
pub const MAX_ERRORS: usize = 20;

/// Parses like [`parse`], but on failure finds every error it can (up to `max`): the first error
/// of each top-level key and of each key under it, each parsed alone with the other lines blanked
/// (so lines and columns stay right), in file order. A file whose error needs two keys together
/// (a key given twice) reports that one error.
pub fn parse_all<T: serde::de::DeserializeOwned>(
    text: &str,
    origin: &str,
    max: usize,
) -> Result<T, Vec<FileError>> {
    let first = match parse::<T>(text, origin) {
        Ok(v) => return Ok(v),
        Err(e) => e,
    };
    let lines: Vec<&str> = text.lines().collect();
    let mut errors = Vec::new();
    for (start, end) in entries(&lines, 0, lines.len(), 0) {
        let children = entries(&lines, start + 1, end, child_indent(&lines, start + 1, end));
        let parts: Vec<(usize, usize)> = if children.is_empty() {
            vec![(start, end)]
        } else {
            children
        };
        for (s, e) in parts {
            let masked: Vec<&str> = lines
                .iter()
                .enumerate()
                .map(|(i, l)| {
                    if i == start || (s..e).contains(&i) {
                        *l
                    } else {
                        ""
                    }
                })
                .collect();
            if let Err(err) = parse::<T>(&masked.join("\n"), origin) {
                if !errors.contains(&err) {
                    errors.push(err);
                }
            }
        }
    }
    if !errors.contains(&first) {
        errors.insert(0, first);
    }
    errors.sort_by_key(|e| e.location);
    errors.truncate(max);
    Err(errors)
}

/// The indentation of the first content line in `start..end` (0 when there is none).
fn child_indent(lines: &[&str], start: usize, end: usize) -> usize {
    lines[start..end]
        .iter()
        .find(|l| is_content(l))
        .map(|l| l.len() - l.trim_start_matches(' ').len())
        .unwrap_or(0)
}

fn is_content(line: &str) -> bool {
    let t = line.trim_start();
    !t.is_empty() && !t.starts_with('#') && t != "---" && t != "..."
}

/// The mapping entries at exactly `indent` spaces in `start..end`: `(first line, end)` each, its
/// value's lines included. Empty when the lines there are not block-style mapping entries.
fn entries(lines: &[&str], start: usize, end: usize, indent: usize) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    if indent == 0 && start > 0 {
        return out;
    }
    for (i, line) in lines.iter().enumerate().take(end).skip(start) {
        if !is_content(line) {
            continue;
        }
        let own = line.len() - line.trim_start_matches(' ').len();
        if own == indent {
            let t = line.trim_start();
            if t.starts_with('-') || !t.contains(':') {
                return Vec::new();
            }
            if let Some(last) = out.last_mut() {
                last.1 = i;
            }
            out.push((i, end));
        } else if own < indent {
            return Vec::new();
        }
    }
    out
}
