//! Every configuration key, once, checked by the compiler: where a value came from (its
//! origin), what `config show` prints and in which order, and the key table of
//! docs/configuration.md (a test checks that every key is documented) all come from this list.

use std::fmt;

use dxdp_core::devices::Resource;

/// A key of one resource (`resources.<resource>.<key>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ResourceKey {
    /// `enabled`.
    Enabled,
    /// `name`.
    Name,
    /// `replicas`.
    Replicas,
    /// `aliases`.
    Aliases,
    /// `includeIntegrated`.
    IncludeIntegrated,
    /// `includeDetachable`.
    IncludeDetachable,
    /// `allocationPolicy`.
    AllocationPolicy,
    /// `multiDevice`.
    MultiDevice,
    /// `cudaVisibleDevices`.
    CudaVisibleDevices,
}

impl ResourceKey {
    /// Every resource key, in `config show` order.
    pub const ALL: [ResourceKey; 9] = [
        ResourceKey::Enabled,
        ResourceKey::Name,
        ResourceKey::Replicas,
        ResourceKey::Aliases,
        ResourceKey::IncludeIntegrated,
        ResourceKey::IncludeDetachable,
        ResourceKey::AllocationPolicy,
        ResourceKey::MultiDevice,
        ResourceKey::CudaVisibleDevices,
    ];

    /// The key as written in the file.
    pub fn as_str(self) -> &'static str {
        match self {
            ResourceKey::Enabled => "enabled",
            ResourceKey::Name => "name",
            ResourceKey::Replicas => "replicas",
            ResourceKey::Aliases => "aliases",
            ResourceKey::IncludeIntegrated => "includeIntegrated",
            ResourceKey::IncludeDetachable => "includeDetachable",
            ResourceKey::AllocationPolicy => "allocationPolicy",
            ResourceKey::MultiDevice => "multiDevice",
            ResourceKey::CudaVisibleDevices => "cudaVisibleDevices",
        }
    }
}

/// A configuration key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Key {
    /// `resources.<resource>.<key>`.
    Resource(Resource, ResourceKey),
    /// `devices.include`.
    DevicesInclude,
    /// `devices.exclude`.
    DevicesExclude,
    /// `assignment`.
    Assignment,
    /// `runtimeFiles.enabled`.
    RuntimeFilesEnabled,
    /// `runtimeFiles.exclude`.
    RuntimeFilesExclude,
    /// `runtimeFiles.additional`.
    RuntimeFilesAdditional,
    /// `health.enabled`.
    HealthEnabled,
    /// `health.ignoreProblemCodes`.
    HealthIgnoreProblemCodes,
    /// `health.signals`.
    HealthSignals,
    /// `health.ignore`.
    HealthIgnore,
    /// `logLevel`.
    LogLevel,
    /// `logFormat`.
    LogFormat,
    /// `nodeLabels.enabled`.
    NodeLabelsEnabled,
    /// `nodeLabels.prefix`.
    NodeLabelsPrefix,
    /// `configuration`: the named configuration applied (not a key of the file: its selection).
    Configuration,
    /// `metrics.address`.
    MetricsAddress,
    /// `metrics.probeAddress`.
    ProbeAddress,
    /// `metrics.webConfigFile`.
    WebConfigFile,
    /// `metrics.authorization`.
    MetricsAuthorization,
    /// `telemetry.enabled`.
    TelemetryEnabled,
    /// `telemetry.interval`.
    TelemetryInterval,
    /// `telemetry.podResourcesEndpoint`.
    TelemetryPodResourcesEndpoint,
    /// `telemetry.criEndpoint`.
    TelemetryCriEndpoint,
    /// `telemetry.podLabels`.
    TelemetryPodLabels,
    /// `telemetry.podUid`.
    TelemetryPodUid,
    /// `isolation.policy`.
    IsolationPolicy,
    /// `isolation.events`.
    IsolationEvents,
    /// `health.events`.
    HealthEvents,
    /// `health.nodeConditions`.
    HealthNodeConditions,
    /// `validation.enabled`.
    ValidationEnabled,
    /// `validation.interval`.
    ValidationInterval,
    /// `validation.timeout`.
    ValidationTimeout,
    /// `validation.image`.
    ValidationImage,
    /// `validation.hostDir`.
    ValidationHostDir,
}

/// The keys that are not per resource, in `config show` order.
const NODE_WIDE: [Key; 34] = [
    Key::DevicesInclude,
    Key::DevicesExclude,
    Key::Assignment,
    Key::RuntimeFilesEnabled,
    Key::RuntimeFilesExclude,
    Key::RuntimeFilesAdditional,
    Key::HealthEnabled,
    Key::HealthIgnoreProblemCodes,
    Key::HealthSignals,
    Key::HealthIgnore,
    Key::LogLevel,
    Key::LogFormat,
    Key::NodeLabelsEnabled,
    Key::NodeLabelsPrefix,
    Key::Configuration,
    Key::MetricsAddress,
    Key::ProbeAddress,
    Key::WebConfigFile,
    Key::MetricsAuthorization,
    Key::TelemetryEnabled,
    Key::TelemetryInterval,
    Key::TelemetryPodResourcesEndpoint,
    Key::TelemetryCriEndpoint,
    Key::TelemetryPodLabels,
    Key::TelemetryPodUid,
    Key::IsolationPolicy,
    Key::IsolationEvents,
    Key::HealthEvents,
    Key::HealthNodeConditions,
    Key::ValidationEnabled,
    Key::ValidationInterval,
    Key::ValidationTimeout,
    Key::ValidationImage,
    Key::ValidationHostDir,
];

impl Key {
    /// Every key, in `config show` order: each resource's keys, then the others.
    pub fn all() -> Vec<Key> {
        let mut keys: Vec<Key> = Resource::ALL
            .iter()
            .flat_map(|&r| ResourceKey::ALL.iter().map(move |&k| Key::Resource(r, k)))
            .collect();
        keys.extend(NODE_WIDE);
        keys
    }

    /// The key named `name` (`resources.display.replicas`, `logLevel`).
    pub fn parse(name: &str) -> Option<Key> {
        Key::all().into_iter().find(|k| k.to_string() == name)
    }

    fn path(self) -> &'static str {
        match self {
            Key::Resource(..) => "",
            Key::DevicesInclude => "devices.include",
            Key::DevicesExclude => "devices.exclude",
            Key::Assignment => "assignment",
            Key::RuntimeFilesEnabled => "runtimeFiles.enabled",
            Key::RuntimeFilesExclude => "runtimeFiles.exclude",
            Key::RuntimeFilesAdditional => "runtimeFiles.additional",
            Key::HealthEnabled => "health.enabled",
            Key::HealthIgnoreProblemCodes => "health.ignoreProblemCodes",
            Key::HealthSignals => "health.signals",
            Key::HealthIgnore => "health.ignore",
            Key::LogLevel => "logLevel",
            Key::LogFormat => "logFormat",
            Key::NodeLabelsEnabled => "nodeLabels.enabled",
            Key::NodeLabelsPrefix => "nodeLabels.prefix",
            Key::Configuration => "configuration",
            Key::MetricsAddress => "metrics.address",
            Key::ProbeAddress => "metrics.probeAddress",
            Key::WebConfigFile => "metrics.webConfigFile",
            Key::MetricsAuthorization => "metrics.authorization",
            Key::TelemetryEnabled => "telemetry.enabled",
            Key::TelemetryInterval => "telemetry.interval",
            Key::TelemetryPodResourcesEndpoint => "telemetry.podResourcesEndpoint",
            Key::TelemetryCriEndpoint => "telemetry.criEndpoint",
            Key::TelemetryPodLabels => "telemetry.podLabels",
            Key::TelemetryPodUid => "telemetry.podUid",
            Key::IsolationPolicy => "isolation.policy",
            Key::IsolationEvents => "isolation.events",
            Key::HealthEvents => "health.events",
            Key::HealthNodeConditions => "health.nodeConditions",
            Key::ValidationEnabled => "validation.enabled",
            Key::ValidationInterval => "validation.interval",
            Key::ValidationTimeout => "validation.timeout",
            Key::ValidationImage => "validation.image",
            Key::ValidationHostDir => "validation.hostDir",
        }
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Key::Resource(r, k) => write!(f, "resources.{r}.{}", k.as_str()),
            other => f.write_str(other.path()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_parse_back() {
        let all = Key::all();
        assert_eq!(all.len(), 2 * 9 + 34);
        let names: std::collections::BTreeSet<String> =
            all.iter().map(ToString::to_string).collect();
        assert_eq!(names.len(), all.len());
        for k in all {
            assert_eq!(Key::parse(&k.to_string()), Some(k));
        }
        assert_eq!(
            Key::Resource(Resource::Compute, ResourceKey::CudaVisibleDevices).to_string(),
            "resources.compute.cudaVisibleDevices"
        );
        assert_eq!(Key::parse("resources.display.replica"), None);
    }
}
