//! dxdp's configuration file as a document: its sections and keys (top level and named
//! configurations), and the reference plugin's per-plugin files (`WDDM_DEVICE_PLUGIN_CONFIG_FILE`,
//! `MCDM_DEVICE_PLUGIN_CONFIG_FILE`). Strict: unknown keys, wrong types and out-of-range values
//! are errors with the file, line and column ([`super::parse`]); the checked scalar values are in
//! [`super::values`], the JSON Schema in `super::schema`.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::Deserialize;

use dxdp_core::assignment::Assignment;
use dxdp_core::pipeline::filter::DeviceSelector;
use dxdp_core::pipeline::winpath;
use dxdp_core::policy::{AllocationPolicy, MultiDevice};
use dxdp_core::quote::quote;

use super::values::{
    Bytes, ConfigName, ConfigVersion, CriEndpoint, Interval, LabelPrefix, LogLevelName,
    MetricsAddress, Multitenancy, PodLabelPattern, PodResourcesEndpoint, Replicas, ResourceName,
    VendorKey,
};
use dxdp_core::sharing::MIN_MEMORY_UNIT_BYTES;

/// `memorySharing.unit` when not given: 1 GiB.
pub(crate) const DEFAULT_MEMORY_UNIT: u64 = 1 << 30;
/// `memorySharing.reserve` when not given: 1 GiB.
pub(crate) const DEFAULT_MEMORY_RESERVE: u64 = 1 << 30;

/// One runtime file in `runtimeFiles.additional` or the reference's `additionalMounts`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, try_from = "RawEntry")]
pub(crate) struct FileEntry {
    /// Relative to the driver store.
    pub(crate) source: String,
    /// Bare file name in the target directory; the source's file name when absent.
    pub(crate) destination: Option<String>,
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
pub(crate) struct VendorFiles {
    /// Files for `C:\Windows\System32`.
    #[serde(default)]
    pub(crate) system32: Vec<FileEntry>,
    /// Files for `C:\Windows\SysWOW64`.
    #[serde(default)]
    pub(crate) syswow64: Vec<FileEntry>,
}

/// `resources.display` / `resources.compute`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct ResourceFile {
    /// Serve this resource.
    pub(crate) enabled: Option<bool>,
    /// The resource name.
    pub(crate) name: Option<ResourceName>,
    /// IDs per physical device.
    pub(crate) replicas: Option<Replicas>,
    /// Extra resource names advertising the same devices.
    pub(crate) aliases: Option<Vec<ResourceName>>,
    /// Advertise integrated adapters of this resource (overrides `devices.includeIntegrated`).
    pub(crate) include_integrated: Option<bool>,
    /// Advertise detachable adapters of this resource (overrides `devices.includeDetachable`).
    pub(crate) include_detachable: Option<bool>,
    /// `spread` or `pack`: how preferred allocations pick physical devices.
    #[serde(default)]
    #[schemars(schema_with = "super::schema::allocation_policy")]
    pub(crate) allocation_policy: Option<AllocationPolicy>,
    /// `warn` or `fail`: what Allocate does with a request for several IDs.
    #[serde(default)]
    #[schemars(schema_with = "super::schema::multi_device")]
    pub(crate) multi_device: Option<MultiDevice>,
    /// Set `CUDA_VISIBLE_DEVICES` for NVIDIA devices.
    pub(crate) cuda_visible_devices: Option<bool>,
    /// Share each GPU by memory: one device ID per unit, under a resource name of its own.
    pub(crate) memory_sharing: Option<MemorySharingFile>,
}

/// `resources.<resource>.memorySharing`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct MemorySharingFile {
    /// Advertise each GPU's dedicated memory in units (and not the GPU whole).
    pub(crate) enabled: Option<bool>,
    /// The resource name of the units (default `directx.microsoft.com/<resource>-memory`).
    pub(crate) name: Option<ResourceName>,
    /// The size of one unit (one device ID), at least 64Mi (default 1Gi).
    pub(crate) unit: Option<Bytes>,
    /// Dedicated memory kept back on every GPU for the driver and the host (default 1Gi).
    pub(crate) reserve: Option<Bytes>,
}

/// `resources`. Every name it serves (each enabled resource's name and aliases) must be unique:
/// the kubelet would take one name registered twice as one resource, and the other resource's
/// devices would vanish.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(try_from = "RawResources")]
pub(crate) struct ResourcesFile {
    /// `directx.microsoft.com/display` settings.
    pub(crate) display: ResourceFile,
    /// `directx.microsoft.com/compute` settings.
    pub(crate) compute: ResourceFile,
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
            if let Some(unit) = f.memory_sharing.as_ref().and_then(|m| m.unit) {
                if unit.0 < MIN_MEMORY_UNIT_BYTES {
                    return Err(format!(
                        "resources.{r}.memorySharing.unit is {}: a unit must be at least 64Mi (each unit is one device ID; use e.g. 256Mi, 512Mi or 1Gi)",
                        Bytes::text(unit.0)
                    ));
                }
            }
            if let Some(m) = f
                .memory_sharing
                .as_ref()
                .filter(|m| m.enabled == Some(true))
            {
                if f.replicas.is_some_and(|n| n.0 > 1) {
                    return Err(format!(
                        "resources.{r} has both replicas and memorySharing: a GPU is shared by time-slicing (replicas) or by memory units, not both; remove resources.{r}.replicas or turn memorySharing off"
                    ));
                }
                let default = format!("directx.microsoft.com/{r}-memory");
                let name = m.name.as_ref().map(|n| n.0.clone()).unwrap_or(default);
                names.push((name, format!("resources.{r}.memorySharing.name")));
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

/// `devices`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct DevicesFile {
    /// Advertise integrated adapters.
    pub(crate) include_integrated: Option<bool>,
    /// Advertise detachable adapters.
    pub(crate) include_detachable: Option<bool>,
    /// Keep only devices matching one of these.
    #[serde(default)]
    #[schemars(schema_with = "super::schema::selectors")]
    pub(crate) include: Option<Vec<DeviceSelector>>,
    /// Leave out devices matching one of these.
    #[serde(default)]
    #[schemars(schema_with = "super::schema::selectors")]
    pub(crate) exclude: Option<Vec<DeviceSelector>>,
}

/// `health`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct HealthFile {
    /// Check device health at all.
    pub(crate) enabled: Option<bool>,
    /// Problem codes that do not make a device Unhealthy.
    pub(crate) ignore_problem_codes: Option<Vec<u32>>,
    /// Per-signal actions (`health.signals.<name>`; see `config::health`).
    pub(crate) signals: Option<super::health::SignalsFile>,
    /// Signals ignored altogether.
    pub(crate) ignore: Option<Vec<super::health::SignalName>>,
    /// The devices this node should have (see `config::expected`).
    pub(crate) expected_devices: Option<super::health::ExpectedFile>,
    /// `GPUUnhealthy` Events on the pods holding an Unhealthy device (see `config::health`).
    pub(crate) events: Option<bool>,
    /// The `DirectXGPUHealthy` and `DirectXGPUIsolation` node conditions (see `config::health`).
    pub(crate) node_conditions: Option<bool>,
    /// What dxdp does about Unhealthy devices: evictions, the cordon (see `config::health`).
    pub(crate) remediation: Option<super::health::RemediationFile>,
    /// What "near the warning temperature" means for the `thermal` signal.
    pub(crate) thermal: Option<super::health::ThermalFile>,
}

/// `runtimeFiles`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct RuntimeFilesFile {
    /// Mount runtime files at all.
    pub(crate) enabled: Option<bool>,
    /// Destination names never mounted.
    pub(crate) exclude: Option<Vec<String>>,
    /// Extra files per vendor (name or PCI vendor ID).
    pub(crate) additional: Option<BTreeMap<VendorKey, VendorFiles>>,
}

/// `metrics`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct MetricsFile {
    /// Where `/metrics`, `/healthz` and `/readyz` are served.
    #[serde(default)]
    #[schemars(schema_with = "super::schema::socket_address")]
    pub(crate) address: Option<MetricsAddress>,
    /// Where `/healthz` and `/readyz` alone are also served, on a listener of their own that
    /// metrics clients cannot starve (e.g. 127.0.0.1:9467 for the kubelet's probes).
    #[serde(default)]
    #[schemars(schema_with = "super::schema::socket_address")]
    pub(crate) probe_address: Option<MetricsAddress>,
    /// A web configuration file in the Prometheus exporters' format (TLS, client certificates,
    /// basic authentication, headers) for `address`; empty: plain HTTP, no authentication.
    pub(crate) web_config_file: Option<String>,
    /// Who may read `/metrics`: `none` (anyone who reaches it, or the web configuration's
    /// users) or `kubernetes` (a bearer token with `get` on the non-resource URL `/metrics`,
    /// checked with TokenReview and SubjectAccessReview).
    pub(crate) authorization: Option<MetricsAuthorization>,
    /// With `authorization: kubernetes`: the audiences a bearer token must be meant for (the
    /// TokenReview asks for them, and the API server must answer with one); empty: the API
    /// server's own audience (any service account token of the cluster).
    pub(crate) token_audiences: Option<Vec<String>>,
    /// With `authorization: kubernetes`: accept bearer tokens over plain HTTP (a web
    /// configuration without `tls_server_config`, or none), where anyone on the path can read
    /// and replay them. Off: such an endpoint answers `503` until TLS is configured.
    pub(crate) allow_plain_http_tokens: Option<bool>,
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
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            MetricsAuthorization::None => "none",
            MetricsAuthorization::Kubernetes => "kubernetes",
        }
    }
}

/// Log format names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum LogFormatName {
    /// Text.
    Text,
    /// JSON lines.
    Json,
}

/// dxdp's configuration file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConfigFile {
    /// The format version: `v1` (absent: `v1`); an unknown version is refused.
    pub(crate) version: Option<ConfigVersion>,
    /// Per-resource settings.
    #[serde(default)]
    pub(crate) resources: ResourcesFile,
    /// Device selection.
    #[serde(default)]
    pub(crate) devices: DevicesFile,
    /// Assignment mode.
    #[serde(default)]
    #[schemars(schema_with = "super::schema::assignment")]
    pub(crate) assignment: Option<Assignment>,
    /// Runtime-file control.
    #[serde(default)]
    pub(crate) runtime_files: RuntimeFilesFile,
    /// Health checks.
    #[serde(default)]
    pub(crate) health: HealthFile,
    /// Log level.
    pub(crate) log_level: Option<LogLevelName>,
    /// Log format.
    pub(crate) log_format: Option<LogFormatName>,
    /// The metrics and probes endpoint.
    #[serde(default)]
    pub(crate) metrics: MetricsFile,
    /// Node labels.
    #[serde(default)]
    pub(crate) node_labels: NodeLabelsFile,
    /// GPU telemetry.
    #[serde(default)]
    pub(crate) telemetry: TelemetryFile,
    /// The GPU isolation audit.
    #[serde(default)]
    pub(crate) isolation: IsolationFile,
    /// The in-cluster validation Jobs.
    #[serde(default)]
    pub(crate) validation: super::validation::ValidationFile,
    /// The startup taint dxdp removes once the node's GPUs are schedulable (`key:Effect`, e.g.
    /// `directx.microsoft.com/gpu-not-ready:NoSchedule`); empty: dxdp touches no such taint.
    pub(crate) startup_taint: Option<StartupTaintText>,
    /// Named configurations, one of which a node selects with its
    /// `<prefix>device-plugin.config` label.
    pub(crate) configurations: Option<BTreeMap<ConfigName, NamedConfigFile>>,
}

/// `startupTaint`, checked: `None` when empty (off).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub(crate) struct StartupTaintText(pub(crate) Option<dxdp_core::lifecycle::ManagedTaint>);

super::schema::inline_schema!(StartupTaintText, {"description": "the startup taint dxdp removes once the node's GPUs are schedulable, as key:Effect (directx.microsoft.com/gpu-not-ready:NoSchedule); empty: off", "type": "string"});

impl TryFrom<String> for StartupTaintText {
    type Error = String;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        parse_startup_taint(&s).map(StartupTaintText)
    }
}

/// Parses `startupTaint` (and `DXDP_STARTUP_TAINT`): empty is off.
pub(crate) fn parse_startup_taint(
    text: &str,
) -> Result<Option<dxdp_core::lifecycle::ManagedTaint>, String> {
    if text.trim().is_empty() {
        return Ok(None);
    }
    dxdp_core::lifecycle::ManagedTaint::parse(text)
        .map(Some)
        .map_err(|e| format!("startupTaint: {e}"))
}

/// `nodeLabels`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct NodeLabelsFile {
    /// Keep the node's labels up to date.
    pub(crate) enabled: Option<bool>,
    /// The label key prefix.
    pub(crate) prefix: Option<LabelPrefix>,
}

/// `telemetry`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct TelemetryFile {
    /// Sample the GPUs (where a source exists).
    pub(crate) enabled: Option<bool>,
    /// Time between samples.
    pub(crate) interval: Option<Interval>,
    /// Where the kubelet serves PodResources (`npipe://\\.\pipe\…` as the kubelet writes it, a
    /// `\\.\pipe\…` name, `unix:///…` or a socket file); empty: the kubelet's.
    pub(crate) pod_resources_endpoint: Option<PodResourcesEndpoint>,
    /// Where the container runtime serves its CRI API (`unix:///…`, `npipe:////./pipe/…`, a
    /// `\\.\pipe\…` name or a socket file); empty: containerd's.
    pub(crate) cri_endpoint: Option<CriEndpoint>,
    /// Pod label keys copied into `dxdp_pod_info` as `label_<key>`: regular expressions
    /// matched against the whole key (e.g. `team`, `app\.kubernetes\.io/.*`); empty: none.
    pub(crate) pod_labels: Option<Vec<PodLabelPattern>>,
    /// Add the pod's UID to `dxdp_pod_info` as `uid`.
    pub(crate) pod_uid: Option<bool>,
}

/// `isolation`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct IsolationFile {
    /// What dxdp does while a container uses a GPU it was not allocated: `audit` (report it),
    /// `withdraw` (also advertise that GPU Unhealthy) or `taint` (also put a NoSchedule taint on
    /// the node).
    pub(crate) policy: Option<IsolationPolicy>,
    /// Report violations as Kubernetes Events on the pod (needs create on events).
    pub(crate) events: Option<bool>,
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
    /// Also advertise each GPU used without allocation Unhealthy while the violation lasts (no
    /// new pod is given it; the rest of the node stays open).
    Withdraw,
}

impl IsolationPolicy {
    /// `audit`, `taint` or `withdraw`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            IsolationPolicy::Audit => "audit",
            IsolationPolicy::Taint => "taint",
            IsolationPolicy::Withdraw => "withdraw",
        }
    }

    /// Parses `audit`, `taint` or `withdraw`; says what is allowed otherwise.
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "audit" => Ok(IsolationPolicy::Audit),
            "taint" => Ok(IsolationPolicy::Taint),
            "withdraw" => Ok(IsolationPolicy::Withdraw),
            _ => Err(format!(
                "isolation policy {} is not audit, withdraw or taint",
                quote(text)
            )),
        }
    }
}

/// One named configuration: the device settings a node can select. Process-wide settings
/// (`logLevel`, `logFormat`, `nodeLabels`, `metrics`) and nested `configurations` are only
/// allowed at the top level.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct NamedConfigFile {
    /// Per-resource settings.
    #[serde(default)]
    pub(crate) resources: ResourcesFile,
    /// Device selection.
    #[serde(default)]
    pub(crate) devices: DevicesFile,
    /// Assignment mode.
    #[serde(default)]
    #[schemars(schema_with = "super::schema::assignment")]
    pub(crate) assignment: Option<Assignment>,
    /// Runtime-file control.
    #[serde(default)]
    pub(crate) runtime_files: RuntimeFilesFile,
    /// Health checks.
    #[serde(default)]
    pub(crate) health: HealthFile,
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
    pub(crate) multitenancy: Option<Multitenancy>,
    /// Include integrated adapters.
    pub(crate) include_integrated: Option<bool>,
    /// Include detachable adapters.
    pub(crate) include_detachable: Option<bool>,
    /// Extra System32 files keyed by vendor.
    pub(crate) additional_mounts: Option<BTreeMap<VendorKey, Vec<FileEntry>>>,
    /// Extra SysWOW64 files keyed by vendor.
    pub(crate) additional_mounts_wow64: Option<BTreeMap<VendorKey, Vec<FileEntry>>>,
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
    super::schema::tidy(&mut value);
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
