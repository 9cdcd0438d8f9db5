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
    /// `memorySharing`.
    MemorySharing,
}

impl ResourceKey {
    /// Every resource key, in `config show` order.
    pub(crate) const ALL: [ResourceKey; 10] = [
        ResourceKey::Enabled,
        ResourceKey::Name,
        ResourceKey::Replicas,
        ResourceKey::Aliases,
        ResourceKey::IncludeIntegrated,
        ResourceKey::IncludeDetachable,
        ResourceKey::AllocationPolicy,
        ResourceKey::MultiDevice,
        ResourceKey::CudaVisibleDevices,
        ResourceKey::MemorySharing,
    ];

    /// The key as written in the file.
    pub(crate) fn as_str(self) -> &'static str {
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
            ResourceKey::MemorySharing => "memorySharing",
        }
    }
}

/// Declares the keys that are not per resource, each once: its variant, its name, its doc; the
/// order is `config show`'s.
macro_rules! node_wide_keys {
    ($($(#[doc = $doc:literal])* $variant:ident => $name:literal,)*) => {
        /// A configuration key.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum Key {
            /// `resources.<resource>.<key>`.
            Resource(Resource, ResourceKey),
            $($(#[doc = $doc])* $variant,)*
        }

        /// The keys that are not per resource, in `config show` order.
        const NODE_WIDE: &[Key] = &[$(Key::$variant,)*];

        impl Key {
            /// The name of a key that is not per resource (`""` for a resource's key).
            fn path(self) -> &'static str {
                match self {
                    Key::Resource(..) => "",
                    $(Key::$variant => $name,)*
                }
            }
        }
    };
}

node_wide_keys! {
    /// `devices.include`.
    DevicesInclude => "devices.include",
    /// `devices.exclude`.
    DevicesExclude => "devices.exclude",
    /// `assignment`.
    Assignment => "assignment",
    /// `runtimeFiles.enabled`.
    RuntimeFilesEnabled => "runtimeFiles.enabled",
    /// `runtimeFiles.exclude`.
    RuntimeFilesExclude => "runtimeFiles.exclude",
    /// `runtimeFiles.additional`.
    RuntimeFilesAdditional => "runtimeFiles.additional",
    /// `health.enabled`.
    HealthEnabled => "health.enabled",
    /// `health.ignoreProblemCodes`.
    HealthIgnoreProblemCodes => "health.ignoreProblemCodes",
    /// `health.signals`.
    HealthSignals => "health.signals",
    /// `health.ignore`.
    HealthIgnore => "health.ignore",
    /// `health.expectedDevices`.
    HealthExpectedDevices => "health.expectedDevices",
    /// `logLevel`.
    LogLevel => "logLevel",
    /// `logFormat`.
    LogFormat => "logFormat",
    /// `nodeLabels.enabled`.
    NodeLabelsEnabled => "nodeLabels.enabled",
    /// `nodeLabels.prefix`.
    NodeLabelsPrefix => "nodeLabels.prefix",
    /// `configuration`: the named configuration applied (not a key of the file: its selection).
    Configuration => "configuration",
    /// `metrics.address`.
    MetricsAddress => "metrics.address",
    /// `metrics.probeAddress`.
    ProbeAddress => "metrics.probeAddress",
    /// `metrics.webConfigFile`.
    WebConfigFile => "metrics.webConfigFile",
    /// `metrics.authorization`.
    MetricsAuthorization => "metrics.authorization",
    /// `metrics.tokenAudiences`.
    MetricsTokenAudiences => "metrics.tokenAudiences",
    /// `metrics.allowPlainHttpTokens`.
    MetricsAllowPlainHttpTokens => "metrics.allowPlainHttpTokens",
    /// `telemetry.enabled`.
    TelemetryEnabled => "telemetry.enabled",
    /// `telemetry.interval`.
    TelemetryInterval => "telemetry.interval",
    /// `telemetry.podResourcesEndpoint`.
    TelemetryPodResourcesEndpoint => "telemetry.podResourcesEndpoint",
    /// `telemetry.criEndpoint`.
    TelemetryCriEndpoint => "telemetry.criEndpoint",
    /// `telemetry.podLabels`.
    TelemetryPodLabels => "telemetry.podLabels",
    /// `telemetry.podUid`.
    TelemetryPodUid => "telemetry.podUid",
    /// `isolation.policy`.
    IsolationPolicy => "isolation.policy",
    /// `isolation.events`.
    IsolationEvents => "isolation.events",
    /// `health.events`.
    HealthEvents => "health.events",
    /// `health.nodeConditions`.
    HealthNodeConditions => "health.nodeConditions",
    /// `health.thermal.marginCelsius`.
    HealthThermalMarginCelsius => "health.thermal.marginCelsius",
    /// `validation.enabled`.
    ValidationEnabled => "validation.enabled",
    /// `validation.interval`.
    ValidationInterval => "validation.interval",
    /// `validation.timeout`.
    ValidationTimeout => "validation.timeout",
    /// `validation.image`.
    ValidationImage => "validation.image",
    /// `validation.hostDir`.
    ValidationHostDir => "validation.hostDir",
    /// `validation.gate`.
    ValidationGate => "validation.gate",
    /// `startupTaint`.
    StartupTaint => "startupTaint",
    /// `health.remediation.evictPods`.
    HealthRemediationEvictPods => "health.remediation.evictPods",
    /// `health.remediation.cordon`.
    HealthRemediationCordon => "health.remediation.cordon",
    /// `health.remediation.gracePeriod`.
    HealthRemediationGracePeriod => "health.remediation.gracePeriod",
}

impl Key {
    /// Every key, in `config show` order: each resource's keys, then the others.
    pub fn all() -> Vec<Key> {
        let mut keys: Vec<Key> = Resource::ALL
            .iter()
            .flat_map(|&r| ResourceKey::ALL.iter().map(move |&k| Key::Resource(r, k)))
            .collect();
        keys.extend_from_slice(NODE_WIDE);
        keys
    }

    /// The key named `name` (`resources.display.replicas`, `logLevel`).
    pub fn parse(name: &str) -> Option<Key> {
        Key::all().into_iter().find(|k| k.to_string() == name)
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
        assert_eq!(all.len(), 2 * 10 + 43);
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
