//! Configuration: built-in defaults < configuration file < environment < command-line flags,
//! with where every value came from, and the reference plugin's environment variables and files
//! for drop-in compatibility.
//!
//! - this module: the effective [`Config`], the [`Inputs`] it is built from, and errors;
//! - [`file`](mod@file): the file formats (dxdp's and the reference plugin's), strict, with positions;
//! - `layers`: how each layer changes the configuration and records origins;
//! - `show`: `dxdp config show` (typed values, text and JSON).
//!
//! Reloading on file changes is the daemon's job (`plugin::reload`).

pub(crate) mod expected;
pub mod file;
pub(crate) mod health;
pub mod kept;
pub mod keys;
mod layers;
pub(crate) mod origin;
pub mod parse;
pub(crate) mod schema;
mod show;
pub(crate) mod validation;
pub mod values;

use keys::{Key, ResourceKey};
use layers::{apply_env, apply_file, apply_flags, apply_reference};
pub use layers::{parse_resources, process_env, reference_mapping};
use origin::{FilePart, Origin};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::logging::LogFormat;
use crate::transport::Endpoint;
use crate::util::host_process;
use dxdp_core::assignment::Assignment;
use dxdp_core::devices::Resource;
use dxdp_core::pipeline::PipelineConfig;
use dxdp_core::policy::ResourcePolicy;
use dxdp_core::sharing::{MemorySharing, Sharing};
use file::{ConfigFile, ReferenceFile};

/// Settings of one resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceSettings {
    /// Serve it.
    pub enabled: bool,
    /// The resource name registered with the kubelet.
    pub name: String,
    /// IDs per physical device.
    pub(crate) replicas: u32,
    /// Extra resource names advertising the same devices.
    pub aliases: Vec<String>,
    /// `allocationPolicy`, `multiDevice` and `cudaVisibleDevices`.
    pub(crate) policy: ResourcePolicy,
    /// `memorySharing`.
    pub(crate) memory_sharing: MemorySharingSettings,
}

/// `resources.<resource>.memorySharing`: the GPUs of the resource advertised in memory units
/// under a resource name of their own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MemorySharingSettings {
    /// Share by memory.
    pub(crate) enabled: bool,
    /// The units' resource name.
    pub(crate) name: String,
    /// One unit, in bytes.
    pub(crate) unit_bytes: u64,
    /// Kept back on every GPU, in bytes.
    pub(crate) reserve_bytes: u64,
}

impl MemorySharingSettings {
    fn default_for(r: Resource) -> Self {
        MemorySharingSettings {
            enabled: false,
            name: format!("{}-memory", r.default_resource_name()),
            unit_bytes: file::DEFAULT_MEMORY_UNIT,
            reserve_bytes: file::DEFAULT_MEMORY_RESERVE,
        }
    }
}

impl ResourceSettings {
    /// The defaults of `r`: served under its default name, one ID per device.
    fn default_for(r: Resource) -> Self {
        ResourceSettings {
            enabled: true,
            name: r.default_resource_name().to_string(),
            replicas: 1,
            aliases: Vec::new(),
            policy: ResourcePolicy::default(),
            memory_sharing: MemorySharingSettings::default_for(r),
        }
    }
}

/// The effective configuration's values: what the daemon serves, and all it compares (where a
/// value came from is in [`Resolved`], never compared: the same values reached another way
/// change nothing that is served).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `resources.display` and `resources.compute`.
    pub resources: BTreeMap<Resource, ResourceSettings>,
    /// Pipeline settings (device selection, runtime files).
    pub pipeline: PipelineConfig,
    /// Assignment mode.
    pub assignment: Assignment,
    /// Log level or filter, checked when the configuration was read.
    pub log_level: values::LogLevelName,
    /// Log format.
    pub log_format: LogFormat,
    /// Node labels.
    pub node_labels: NodeLabels,
    /// `metrics.address`: where `/metrics`, `/healthz` and `/readyz` are served (off when
    /// `None`). Read at start; a reload that changes it takes effect at the next start.
    pub metrics_address: Option<std::net::SocketAddr>,
    /// `metrics.probeAddress`: where `/healthz` and `/readyz` alone are also served, with
    /// connections of their own (off when `None`). Read at start, like `metrics.address`.
    pub probe_address: Option<std::net::SocketAddr>,
    /// `metrics.webConfigFile`: the web configuration of `metrics.address` (TLS, basic
    /// authentication, headers; off when `None`). Read at start; its files are re-read when
    /// they change.
    pub web_config_file: Option<std::path::PathBuf>,
    /// `metrics.authorization`: Kubernetes authorization of `/metrics` requests. Read at start.
    pub metrics_authorization: file::MetricsAuthorization,
    /// `metrics.tokenAudiences`: the audiences a bearer token must be meant for (empty: the
    /// API server's own). Read at start.
    pub metrics_token_audiences: Vec<String>,
    /// `metrics.allowPlainHttpTokens`: bearer tokens accepted over plain HTTP. Read at start.
    pub metrics_allow_plain_http_tokens: bool,
    /// `telemetry`: GPU telemetry sampling.
    pub telemetry: Telemetry,
    /// `isolation`: the GPU isolation audit.
    pub isolation: Isolation,
    /// `health.events` and `health.nodeConditions`: what the cluster is told about device
    /// health.
    pub health_reports: health::HealthReports,
    /// `health.expectedDevices`: the devices this node should have (given, or derived from a
    /// node label when resolved with the node).
    pub expected_devices: expected::ExpectedDevices,
    /// `health.remediation`: evictions and the cordon.
    pub remediation: health::Remediation,
    /// `health.thermal`: what "near the warning temperature" means for the `thermal` signal.
    pub health_thermal: health::Thermal,
    /// `health.memoryOverUse`: when memory above a container's share is reported.
    pub health_memory_over_use: health::MemoryOverUse,
    /// `validation`: the in-cluster validation Jobs.
    pub validation: validation::Validation,
    /// `startupTaint`: the taint dxdp removes once the node's GPUs are schedulable (`None`:
    /// off, dxdp touches none).
    pub startup_taint: Option<dxdp_core::lifecycle::ManagedTaint>,
}

/// A configuration as [`Inputs::resolve`] built it: its values ([`Config`], which it
/// dereferences to) and how they were reached.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The values.
    pub config: Config,
    /// Which named configuration is in force, and why.
    pub selection: Selection,
    /// Where each key's value came from (`default`, `file <path>`, `env NAME`, `flag --x`).
    pub(crate) origins: BTreeMap<Key, Origin>,
    /// What an operator must be told about how the configuration was built (a reference-plugin
    /// default file read, `*_MULTITENANCY=0` taken as 1, a dxdp variable overriding a reference
    /// variable): logged at start and shown by `config show`.
    pub notices: Vec<String>,
    /// The text of dxdp's configuration file as it was read (`None`: no file was read): what
    /// the daemon keeps on the host once it serves it ([`kept`]).
    pub(crate) source_text: Option<String>,
}

impl std::ops::Deref for Resolved {
    type Target = Config;

    fn deref(&self) -> &Config {
        &self.config
    }
}

impl std::ops::DerefMut for Resolved {
    fn deref_mut(&mut self) -> &mut Config {
        &mut self.config
    }
}

impl From<Config> for Resolved {
    /// `config` with every value's origin the default and nothing selected.
    fn from(config: Config) -> Self {
        Resolved {
            config,
            ..Resolved::default()
        }
    }
}

impl Default for Resolved {
    fn default() -> Self {
        let mut origins: BTreeMap<Key, Origin> = Key::all()
            .into_iter()
            .map(|k| (k, Origin::Default))
            .collect();
        origins.insert(Key::Configuration, Origin::Selection(NO_SELECTION.into()));
        Resolved {
            config: Config::default(),
            selection: Selection {
                reason: NO_SELECTION.into(),
                ..Selection::default()
            },
            origins,
            notices: Vec::new(),
            source_text: None,
        }
    }
}

impl Resolved {
    fn set_origin(&mut self, key: Key, origin: &Origin) {
        self.origins.insert(key, origin.clone());
    }
}

/// Why the default configuration applies when nothing selects another.
const NO_SELECTION: &str = "default: no configuration selected";

/// `telemetry`: GPU utilisation, memory and processes per device and per pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Telemetry {
    /// Sample (when a telemetry source exists on the host).
    pub enabled: bool,
    /// Time between samples.
    pub(crate) interval: std::time::Duration,
    /// Where the kubelet serves PodResources, parsed when the configuration was read; `None`:
    /// the kubelet's default for this OS.
    pub pod_resources_endpoint: Option<Endpoint>,
    /// Where the container runtime serves its CRI API, parsed when the configuration was read;
    /// `None`: containerd's default for this OS.
    pub cri_endpoint: Option<values::CriAddress>,
    /// `telemetry.podLabels`: the pod label keys copied into `dxdp_pod_info`.
    pub pod_labels: PodLabels,
    /// `telemetry.podUid`: the pod's UID in `dxdp_pod_info`.
    pub pod_uid: bool,
}

impl Telemetry {
    /// Whether `dxdp_pod_info` is exported (`telemetry.podLabels` or `telemetry.podUid` set).
    pub(crate) fn pod_info(&self) -> bool {
        self.pod_uid || !self.pod_labels.patterns().is_empty()
    }
}

/// `telemetry.podLabels`, compiled once when the configuration is read: keys matching any
/// pattern (whole key) are allowed.
#[derive(Debug, Clone, Default)]
pub struct PodLabels {
    patterns: Vec<String>,
    compiled: Vec<regex::Regex>,
}

impl PodLabels {
    /// The allowlist of `patterns` (each checked by [`values::PodLabelPattern`]).
    pub fn new(patterns: &[values::PodLabelPattern]) -> Result<Self, String> {
        let compiled = patterns
            .iter()
            .map(|p| values::PodLabelPattern::compile(&p.0))
            .collect::<Result<_, _>>()?;
        Ok(PodLabels {
            patterns: patterns.iter().map(|p| p.0.clone()).collect(),
            compiled,
        })
    }

    /// The patterns as written.
    pub(crate) fn patterns(&self) -> &[String] {
        &self.patterns
    }

    /// Whether `key` matches a pattern.
    pub(crate) fn allows(&self, key: &str) -> bool {
        self.compiled.iter().any(|r| r.is_match(key))
    }
}

impl PartialEq for PodLabels {
    fn eq(&self, other: &Self) -> bool {
        self.patterns == other.patterns
    }
}

impl Eq for PodLabels {}

impl Default for Telemetry {
    fn default() -> Self {
        Telemetry {
            enabled: true,
            interval: std::time::Duration::from_secs(10),
            pod_resources_endpoint: None,
            cri_endpoint: None,
            pod_labels: PodLabels::default(),
            pod_uid: false,
        }
    }
}

/// `isolation`: what dxdp does when a container uses a GPU it was not allocated
/// (docs/isolation.md). Applies at the next sample after a reload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Isolation {
    /// `audit` (report) or `taint` (also taint the node NoSchedule while a violation lasts).
    pub policy: file::IsolationPolicy,
    /// Report violations as Kubernetes Events on the pod.
    pub events: bool,
}

impl Default for Isolation {
    fn default() -> Self {
        Isolation {
            policy: file::IsolationPolicy::Audit,
            events: true,
        }
    }
}

/// `nodeLabels`: the labels dxdp keeps on its Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeLabels {
    /// Keep them up to date (needs `NODE_NAME` and Kubernetes credentials too).
    pub(crate) enabled: bool,
    /// The key prefix, e.g. `directx.microsoft.com/`.
    pub(crate) prefix: String,
    /// Where the labels go (`nodeLabels.mode`).
    pub(crate) mode: file::LabelMode,
    /// The user's GPU families by PCI model ID (`nodeLabels.families`).
    pub(crate) families: BTreeMap<dxdp_core::families::ModelId, String>,
}

impl NodeLabels {
    /// The label that selects a named configuration: `<prefix>device-plugin.config`.
    pub(crate) fn selector_key(&self) -> String {
        format!("{}{}", self.prefix, dxdp_core::labels::CONFIG_SELECTOR)
    }
}

/// Which named configuration (`configurations.<name>` in the file) is in force.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    /// The configuration applied over the file's top level; `None`: the top level alone (the
    /// default).
    pub name: Option<String>,
    /// Why this one, e.g. `node label directx.microsoft.com/device-plugin.config on node n1`.
    pub reason: String,
    /// What asked for it (the daemon acts on this, never on `reason`'s words).
    pub(crate) by: SelectedBy,
    /// Set when a name was asked for that the file does not have (the default is used).
    pub warning: Option<String>,
}

/// What selected the named configuration in force.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum SelectedBy {
    /// Nothing asked for one (or the one asked for is unknown): the top level alone.
    #[default]
    Default,
    /// `--configuration`.
    Flag,
    /// `DXDP_CONFIGURATION`.
    Env,
    /// The node's `<prefix>device-plugin.config` label: when the configuration it names
    /// cannot be served on the host, the daemon serves the top level instead.
    NodeLabel,
}

impl SelectedBy {
    /// Whether the node's label selected it.
    pub(crate) fn is_node_label(self) -> bool {
        self == SelectedBy::NodeLabel
    }
}

/// The Node this process runs on, as the API server reported it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeInfo {
    /// `metadata.name`.
    pub(crate) name: String,
    /// `metadata.labels`.
    pub(crate) labels: BTreeMap<String, String>,
    /// `status.allocatable` (resource name to quantity): what the kubelet reports the node can
    /// allocate, read by `/readyz`.
    pub(crate) allocatable: BTreeMap<String, String>,
    /// `spec.taints` as (key, effect), read by the startup taint.
    pub(crate) taints: Vec<(String, String)>,
    /// `spec.unschedulable` (cordoned), read by `health.remediation.cordon`.
    pub(crate) unschedulable: bool,
    /// The annotations under dxdp's prefix `directx.microsoft.com/` (its cordon mark); others
    /// are not kept, so that their changes wake no one.
    pub(crate) annotations: BTreeMap<String, String>,
}

#[cfg(any(test, feature = "test-support"))]
impl NodeInfo {
    /// `status.allocatable`'s quantity of `resource`.
    pub fn allocatable_of(&self, resource: &str) -> Option<&str> {
        self.allocatable.get(resource).map(String::as_str)
    }

    /// The label `key`'s value.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key).map(String::as_str)
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            resources: Resource::ALL
                .iter()
                .map(|&r| (r, ResourceSettings::default_for(r)))
                .collect(),
            pipeline: PipelineConfig::default(),
            assignment: Assignment::Auto,
            log_level: values::LogLevelName("info".into()),
            log_format: LogFormat::Text,
            node_labels: NodeLabels {
                enabled: true,
                prefix: dxdp_core::labels::DEFAULT_PREFIX.into(),
                mode: file::LabelMode::Node,
                families: BTreeMap::new(),
            },
            metrics_address: None,
            probe_address: None,
            web_config_file: None,
            metrics_authorization: file::MetricsAuthorization::None,
            metrics_token_audiences: Vec::new(),
            metrics_allow_plain_http_tokens: false,
            telemetry: Telemetry::default(),
            isolation: Isolation::default(),
            health_reports: health::HealthReports::default(),
            expected_devices: expected::ExpectedDevices::default(),
            remediation: health::Remediation::default(),
            health_thermal: health::Thermal::default(),
            health_memory_over_use: health::MemoryOverUse::default(),
            validation: validation::Validation::default(),
            startup_taint: None,
        }
    }
}

impl Config {
    fn resource(&mut self, r: Resource) -> &mut ResourceSettings {
        self.resources
            .entry(r)
            .or_insert_with(|| ResourceSettings::default_for(r))
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
    #[cfg(any(test, feature = "test-support"))]
    pub fn with_replicas(mut self, n: u32) -> Self {
        for r in Resource::ALL {
            self.resource(r).replicas = n;
        }
        self
    }

    /// This configuration with `validation.enabled` and `validation.gate` as given.
    #[cfg(any(test, feature = "test-support"))]
    pub fn with_validation_gate(mut self, enabled: bool, gate: bool) -> Self {
        self.validation.enabled = enabled;
        self.validation.gate = gate;
        self
    }

    /// The allocation policy of a resource (the defaults when unknown).
    pub fn policy(&self, r: Resource) -> ResourcePolicy {
        self.resources.get(&r).map(|s| s.policy).unwrap_or_default()
    }

    /// `health.expectedDevices` for the enabled resources (an expectation on a resource dxdp
    /// does not serve is not judged).
    pub fn expected_counts(&self) -> BTreeMap<Resource, u32> {
        let mut counts = self.expected_devices.counts();
        counts.retain(|r, _| self.resources.get(r).is_some_and(|s| s.enabled));
        counts
    }

    /// Replicas of a resource (1 when unknown).
    pub(crate) fn replicas(&self, r: Resource) -> u32 {
        self.resources.get(&r).map(|s| s.replicas).unwrap_or(1)
    }

    /// How the GPUs of a resource are shared: memory units when `memorySharing` is on (replicas
    /// are then not used), else its replicas.
    pub fn sharing(&self, r: Resource) -> Sharing {
        match self.resources.get(&r) {
            Some(s) if s.memory_sharing.enabled => Sharing::Memory(MemorySharing {
                unit_bytes: s.memory_sharing.unit_bytes,
                reserve_bytes: s.memory_sharing.reserve_bytes,
            }),
            Some(s) => Sharing::Replicas(s.replicas),
            None => Sharing::Replicas(1),
        }
    }

    /// The resource name of a resource's memory units, when it is served and shared by memory.
    pub fn memory_resource_name(&self, r: Resource) -> Option<&str> {
        self.resources
            .get(&r)
            .filter(|s| s.enabled && s.memory_sharing.enabled)
            .map(|s| s.memory_sharing.name.as_str())
    }

    /// This configuration with memory sharing on for `r` (`unit_bytes`, `reserve_bytes`); `dxdp
    /// demo` shows a memory-shared GPU with it.
    pub fn with_memory_sharing(mut self, r: Resource, unit_bytes: u64, reserve_bytes: u64) -> Self {
        let m = &mut self.resource(r).memory_sharing;
        m.enabled = true;
        m.unit_bytes = unit_bytes;
        m.reserve_bytes = reserve_bytes;
        self
    }
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
    pub log_level: Option<values::LogLevelName>,
    /// `--log-format`.
    pub log_format: Option<LogFormat>,
    /// `--configuration`: the named configuration to apply, whatever the node's label says.
    pub configuration: Option<String>,
    /// `--metrics-address` (`Some(None)`: an empty value, turning the endpoint off).
    pub metrics_address: Option<Option<std::net::SocketAddr>>,
    /// `--probe-address` (`Some(None)`: an empty value, turning the endpoint off).
    pub probe_address: Option<Option<std::net::SocketAddr>>,
    /// `--web-config-file` (`Some(None)`: an empty value, turning it off).
    pub web_config_file: Option<Option<std::path::PathBuf>>,
    /// `--metrics-authorization`.
    pub metrics_authorization: Option<file::MetricsAuthorization>,
}

/// Why the configuration cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A file is invalid.
    #[error(transparent)]
    File(#[from] parse::FileError),
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

/// The variable naming the directory where the reference plugin's default files (`wddm.yaml`,
/// `mcdm.yaml`) are read when `WDDM_/MCDM_DEVICE_PLUGIN_CONFIG_FILE` is not set.
pub const REFERENCE_DIR_VAR: &str = "DXDP_REFERENCE_CONFIG_DIR";

/// The reference plugin's default directory on this OS (`\etc\directx-device-plugins`).
pub fn default_reference_dir() -> PathBuf {
    default_path()
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// The reference-plugin files to read: `(variable, resource, path, explicit)`: the file a
/// `<P>_DEVICE_PLUGIN_CONFIG_FILE` names (explicit: must exist), else `wddm.yaml` / `mcdm.yaml`
/// in [`REFERENCE_DIR_VAR`]'s directory (read when present, as the reference plugin does).
fn reference_files(env: &Env) -> Vec<(String, Resource, PathBuf, bool)> {
    let mut out = Vec::new();
    for (prefix, r) in [("WDDM", Resource::Display), ("MCDM", Resource::Compute)] {
        let name = format!("{prefix}_DEVICE_PLUGIN_CONFIG_FILE");
        if let Some(p) = env.get(&name).filter(|p| !p.is_empty()) {
            out.push((name, r, PathBuf::from(p), true));
        } else if let Some(dir) = env.get(REFERENCE_DIR_VAR).filter(|d| !d.is_empty()) {
            let file = format!("{}.yaml", prefix.to_ascii_lowercase());
            out.push((name, r, Path::new(dir).join(file), false));
        }
    }
    out
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

/// The environment variables that name configuration files.
const FILE_VARS: [&str; 3] = [
    "DXDP_CONFIG",
    "WDDM_DEVICE_PLUGIN_CONFIG_FILE",
    "MCDM_DEVICE_PLUGIN_CONFIG_FILE",
];

/// Resolves the configuration file choice and the file-naming variables in `env` against a
/// HostProcess container's sandbox mount point (`crate::util::host_process`: containerd 1.6
/// mounts the chart's ConfigMap there). `default` is the default configuration path, used (not
/// required) when no file was chosen and it exists under the sandbox.
pub fn resolve_in_sandbox(
    file: Option<(PathBuf, bool)>,
    env: &mut Env,
    default: &Path,
    sandbox: Option<&str>,
    exists: impl Fn(&Path) -> bool,
) -> Option<(PathBuf, bool)> {
    for var in FILE_VARS {
        if let Some(value) = env.get_mut(var).filter(|v| !v.is_empty()) {
            *value = host_process::resolve(Path::new(value.as_str()), sandbox, &exists)
                .to_string_lossy()
                .into_owned();
        }
    }
    match file {
        Some((path, required)) => Some((host_process::resolve(&path, sandbox, &exists), required)),
        None => {
            let found = host_process::resolve(default, sandbox, &exists);
            (found != default && exists(&found)).then_some((found, false))
        }
    }
}

/// The largest configuration file read (docs/configuration.md): 4 MiB, hundreds of times any
/// real configuration; reading stops past it.
pub(crate) const MAX_FILE_BYTES: u64 = 4 << 20;

/// Reads a configuration file once it has settled: a regular file only (a FIFO, socket or
/// device is an error naming what it is, never a read that blocks), at most
/// `MAX_FILE_BYTES`. Blocks while a writer is at work (never on an async worker).
/// On Windows the file must be owned by SYSTEM, Administrators or dxdp's own account
/// (`crate::util::host_acl`): one another account placed is refused.
pub fn read_file(path: &Path) -> Result<String, ConfigError> {
    let refused = |reason: String| ConfigError::Read {
        path: path.display().to_string(),
        reason,
    };
    let text = read_settled(path).map_err(|e| refused(e.to_string()))?;
    crate::util::host_acl::check_owner(path).map_err(|e| refused(e.to_string()))?;
    Ok(text)
}

fn read_settled(path: &Path) -> Result<String, crate::util::stable_read::StableReadError> {
    crate::util::stable_read::read_settled(path, Default::default(), MAX_FILE_BYTES)
}

/// A configuration file read, or the error saying it does not exist.
enum FileRead {
    Text(String),
    Missing(ConfigError),
}

/// [`read_file`], with a file that does not exist told apart. Every other failure (a file that
/// kept changing, a FIFO, too large, unreadable) is an error, never taken for a missing file:
/// a reload then keeps the running configuration rather than falling back to the defaults.
fn read_optional(path: &Path) -> Result<FileRead, ConfigError> {
    use crate::util::stable_read::StableReadError;
    let error = |e: StableReadError| ConfigError::Read {
        path: path.display().to_string(),
        reason: e.to_string(),
    };
    match read_settled(path) {
        Ok(text) => {
            crate::util::host_acl::check_owner(path).map_err(|e| ConfigError::Read {
                path: path.display().to_string(),
                reason: e.to_string(),
            })?;
            Ok(FileRead::Text(text))
        }
        Err(StableReadError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {
            Ok(FileRead::Missing(error(StableReadError::Io(e))))
        }
        Err(e) => Err(error(e)),
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
    /// The Node this process runs on, when the API server told (for the node's selection of a
    /// named configuration).
    pub node: Option<NodeInfo>,
}

impl Inputs {
    /// The files whose changes trigger a reload.
    pub(crate) fn watched_files(&self) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = self.file.iter().map(|(p, _)| p.clone()).collect();
        files.extend(reference_files(&self.env).into_iter().map(|(_, _, p, _)| p));
        files
    }

    /// What a read of the configuration is called where it may time out:
    /// `reading the configuration (FILES)`.
    pub fn reading(&self) -> String {
        let files: Vec<String> = self
            .watched_files()
            .iter()
            .map(|f| f.display().to_string())
            .collect();
        format!("reading the configuration ({})", files.join(", "))
    }

    /// Builds the effective configuration: defaults < reference files < file < env < flags.
    /// The one resolution: at start, with the node's labels, on every reload and for
    /// `config show`.
    pub fn resolve(&self) -> Result<Resolved, ConfigError> {
        let mut c = Resolved::default();
        for (name, r, path, explicit) in reference_files(&self.env) {
            let origin = if explicit {
                Origin::File {
                    path: path.clone(),
                    part: FilePart::Reference {
                        variable: name.clone(),
                    },
                }
            } else {
                if !path.exists() {
                    continue;
                }
                let origin = Origin::File {
                    path: path.clone(),
                    part: FilePart::ReferenceDefault {
                        variable: name.clone(),
                    },
                };
                c.notices.push(format!(
                    "read the reference plugin's {} as the {} plugin's file: it sets {}; set {name} to read another file, or delete it",
                    path.display(),
                    if r == Resource::Display { "WDDM (display)" } else { "MCDM (compute)" },
                    r.default_resource_name()
                ));
                origin
            };
            let text = read_file(&path)?;
            let f: ReferenceFile = parse::parse(&text, &path.display().to_string())?;
            apply_reference(&mut c, r, &f, &origin);
        }
        let mut named = None;
        let mut missing = None;
        if let Some((path, required)) = &self.file {
            match read_optional(path) {
                Ok(FileRead::Text(text)) => {
                    let origin = path.display().to_string();
                    let f: ConfigFile = parse::parse(&text, &origin).map_err(|mut e| {
                        // Say when there is more to fix than the first error.
                        let all = parse::parse_all::<ConfigFile>(&text, &origin, parse::MAX_ERRORS)
                            .err()
                            .map_or(1, |all| all.len());
                        if all > 1 {
                            e.message.push_str(&format!(
                                " (and {} more: `dxdp config check {origin}` lists them all)",
                                all - 1
                            ));
                        }
                        e
                    })?;
                    apply_file(&mut c, &f, &Origin::file(path));
                    named = Some((path, f.configurations.unwrap_or_default()));
                    c.source_text = Some(text);
                }
                Ok(FileRead::Missing(e)) if *required => return Err(e),
                Ok(FileRead::Missing(_)) => missing = Some(path),
                Err(e) => return Err(e),
            }
        }
        // The node labels' prefix (which names the selecting label) as env and flags make it.
        let mut probe = c.clone();
        apply_env(&mut probe, &self.env)?;
        c.selection = self.select(
            &probe.node_labels,
            named.as_ref().map(|(p, n)| (*p, n)),
            missing,
        );
        if let (Some(name), Some((path, configurations))) = (&c.selection.name, &named) {
            if let Some(f) = configurations.get(&values::ConfigName(name.clone())) {
                let origin = Origin::File {
                    path: path.to_path_buf(),
                    part: FilePart::Configuration(name.clone()),
                };
                apply_file(&mut c, &ConfigFile::from(f), &origin);
            }
        }
        c.set_origin(
            Key::Configuration,
            &Origin::Selection(c.selection.reason.clone()),
        );
        apply_env(&mut c, &self.env)?;
        apply_flags(&mut c, &self.flags);
        let both: Vec<String> = c
            .resources
            .iter()
            .filter(|(_, s)| s.memory_sharing.enabled && s.replicas > 1)
            .map(|(r, s)| {
                let from = c.origin_of(Key::Resource(*r, ResourceKey::Replicas));
                format!(
                    "resources.{r}.replicas {} ({from}) is not used: resources.{r}.memorySharing is on, and a GPU is shared by memory units or by replicas, not both",
                    s.replicas
                )
            })
            .collect();
        c.notices.extend(both);
        if let Some(notice) = c.expected_devices.derive(self.node.as_ref()) {
            c.notices.push(notice);
        }
        // The web configuration is a volume of the pod too (containerd 1.6: under the sandbox).
        if let Some(path) = c.web_config_file.take() {
            let sandbox = self.env.get(host_process::SANDBOX_VAR).map(String::as_str);
            c.web_config_file = Some(host_process::resolve(&path, sandbox, |p| p.exists()));
        }
        Ok(c)
    }

    /// Which named configuration applies: `--configuration`, else `DXDP_CONFIGURATION`, else
    /// the node's `<prefix>device-plugin.config` label, else none. A name the file does not
    /// have falls back to none, with a warning.
    fn select(
        &self,
        labels: &NodeLabels,
        named: Option<(
            &PathBuf,
            &BTreeMap<values::ConfigName, file::NamedConfigFile>,
        )>,
        missing: Option<&PathBuf>,
    ) -> Selection {
        let key = labels.selector_key();
        let asked = if let Some(n) = &self.flags.configuration {
            Some((
                n.clone(),
                "flag --configuration".to_string(),
                SelectedBy::Flag,
            ))
        } else if let Some(n) = self.env.get("DXDP_CONFIGURATION").filter(|n| !n.is_empty()) {
            Some((
                n.clone(),
                "env DXDP_CONFIGURATION".to_string(),
                SelectedBy::Env,
            ))
        } else {
            self.node.as_ref().and_then(|node| {
                node.labels.get(&key).filter(|v| !v.is_empty()).map(|v| {
                    (
                        v.clone(),
                        format!("node label {key} on node {}", node.name),
                        SelectedBy::NodeLabel,
                    )
                })
            })
        };
        let Some((name, why, by)) = asked else {
            let reason = match &self.node {
                Some(node) => format!("default: node {} has no label {key}", node.name),
                None => NO_SELECTION.to_string(),
            };
            return Selection {
                name: None,
                reason,
                by: SelectedBy::Default,
                warning: None,
            };
        };
        let known: Vec<&str> = named
            .map(|(_, m)| m.keys().map(|k| k.0.as_str()).collect())
            .unwrap_or_default();
        if known.contains(&name.as_str()) {
            return Selection {
                name: Some(name),
                reason: why,
                by,
                warning: None,
            };
        }
        let (file, known) = match (named, missing) {
            (Some((p, _)), _) => (
                p.display().to_string(),
                if known.is_empty() {
                    "it has none".to_string()
                } else {
                    format!("it has {}", known.join(", "))
                },
            ),
            (None, Some(p)) => (
                "the configuration file".to_string(),
                format!(
                    "there is no configuration file: {} does not exist",
                    p.display()
                ),
            ),
            (None, None) => (
                "the configuration file".to_string(),
                "no configuration file is read".to_string(),
            ),
        };
        Selection {
            name: None,
            by: SelectedBy::Default,
            reason: format!("default: {} ({why}) is unknown", dxdp_core::quote::quote(&name)),
            warning: Some(format!(
                "configuration {} ({why}) is not in {file}'s configurations ({known}): using the default configuration; add it under configurations: or fix the selection",
                dxdp_core::quote::quote(&name)
            )),
        }
    }
}

#[cfg(test)]
mod tests;
