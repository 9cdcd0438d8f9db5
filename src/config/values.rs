//! The checked values of the configuration file: each type accepts only what dxdp can use
//! (a replica count in range, a resource name, an address, an interval, a label prefix, ...), so
//! a value is parsed once, when the file is read, and an invalid one is an error naming the line.

use schemars::JsonSchema;
use serde::Deserialize;

use dxdp_core::pipeline::filter::VendorSpec;
use dxdp_core::quote::quote;
use dxdp_core::sharing::MAX_REPLICAS;

use super::schema::inline_schema;

/// A replica count, 1 to [`MAX_REPLICAS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "u64")]
pub(crate) struct Replicas(pub(crate) u32);

impl TryFrom<u64> for Replicas {
    type Error = String;

    fn try_from(n: u64) -> Result<Self, Self::Error> {
        Replicas::check(n)
    }
}

inline_schema!(Replicas, {"type": "integer", "minimum": 1, "maximum": MAX_REPLICAS});

impl Replicas {
    /// Checks the range and says what is allowed.
    pub(crate) fn check(n: u64) -> Result<Replicas, String> {
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
pub(crate) struct Multitenancy(pub(crate) u32);

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
    pub(crate) fn replicas(self) -> u32 {
        self.0.max(1)
    }
}

/// An extended resource name (`domain/name`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(try_from = "String")]
pub(crate) struct ResourceName(pub(crate) String);

impl TryFrom<String> for ResourceName {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        ResourceName::check(&s).map(|()| ResourceName(s))
    }
}

impl ResourceName {
    /// Checks the Kubernetes extended-resource-name rules that matter here.
    pub(crate) fn check(s: &str) -> Result<(), String> {
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

/// A vendor as a map key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize, JsonSchema)]
#[serde(try_from = "String")]
pub(crate) struct VendorKey(pub(crate) u32);

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

    /// [`MetricsAddress::parse`], also accepting an IPv6 address without brackets before the
    /// port, for a variable: what the chart's `DXDP_METRICS_ADDRESS=$(HOST_IP):9466` gives on a
    /// node whose first address is IPv6 (the file's schema keeps the brackets).
    pub fn parse_variable(s: &str) -> Result<Option<std::net::SocketAddr>, String> {
        MetricsAddress::parse(s).or_else(|e| {
            // The port is what follows the last colon (an address needs one); `::1` is not
            // `[::]:1`.
            let (ip, port) = s.trim().rsplit_once(':').ok_or_else(|| e.clone())?;
            match (ip.parse::<std::net::Ipv6Addr>(), port.parse::<u16>()) {
                (Ok(addr), Ok(port)) if !ip.ends_with(':') && !ip.starts_with("::") => {
                    Ok(Some(std::net::SocketAddr::from((addr, port))))
                }
                _ => Err(e),
            }
        })
    }
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
    pub(crate) fn compile(pattern: &str) -> Result<regex::Regex, String> {
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
pub(crate) struct CriEndpoint(pub(crate) String);

impl TryFrom<String> for CriEndpoint {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        CriEndpoint::parse(&s).map(|_| CriEndpoint(s.trim().to_string()))
    }
}

impl CriEndpoint {
    /// The endpoint it names, parsed once (`None`: empty, containerd's default).
    pub(crate) fn address(&self) -> Result<Option<CriAddress>, String> {
        CriAddress::parse(&self.0)
    }

    /// [`LocalApi::address`] of a CRI endpoint, as the kubelet's
    /// `--container-runtime-endpoint` writes it.
    pub(crate) fn parse(text: &str) -> Result<Option<String>, String> {
        LocalApi::Cri.address(text)
    }
}

/// Where the kubelet serves PodResources, as the user wrote it (validated: a local socket or
/// named pipe, in any spelling [`LocalApi::address`] takes).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(try_from = "String")]
pub(crate) struct PodResourcesEndpoint(pub(crate) String);

impl TryFrom<String> for PodResourcesEndpoint {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        LocalApi::PodResources
            .address(&s)
            .map(|_| PodResourcesEndpoint(s.trim().to_string()))
    }
}

/// The node-local APIs dxdp reaches at a configured endpoint, for their messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LocalApi {
    /// The container runtime's CRI API (`telemetry.criEndpoint`).
    Cri,
    /// The kubelet's PodResources API (`telemetry.podResourcesEndpoint`).
    PodResources,
}

impl LocalApi {
    fn name(self) -> &'static str {
        match self {
            LocalApi::Cri => "CRI",
            LocalApi::PodResources => "PodResources",
        }
    }

    fn example(self) -> &'static str {
        match self {
            LocalApi::Cri => "npipe:////./pipe/containerd-containerd (containerd on Windows) or unix:///run/containerd/containerd.sock",
            LocalApi::PodResources => "npipe://\\\\.\\pipe\\kubelet-pod-resources (as the kubelet writes it on Windows) or unix:///var/lib/kubelet/pod-resources/kubelet.sock",
        }
    }

    /// The local address of an endpoint as the kubelet writes it (its
    /// `--container-runtime-endpoint`, its PodResources endpoint), in the form dxdp's clients
    /// take: `unix:///run/x.sock` → `/run/x.sock`; `npipe:////./pipe/NAME`,
    /// `npipe://./pipe/NAME` and `npipe://\\.\pipe\NAME` → `\\.\pipe\NAME`; a `\\.\pipe\NAME` or
    /// `//./pipe/NAME` name and a socket file path are taken as they are. Empty: `None` (the
    /// default). Another scheme, or a pipe on another machine, is an error saying what to use.
    pub(crate) fn address(self, text: &str) -> Result<Option<String>, String> {
        let t = text.trim();
        if t.is_empty() {
            return Ok(None);
        }
        let api = self.name();
        let usage = format!(
            "use unix:///PATH, npipe:////./pipe/NAME, \\\\.\\pipe\\NAME or a socket file path, e.g. {}",
            self.example()
        );
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
                    "{api} endpoint {} has no absolute socket path: {usage}",
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
                    "{api} endpoint {} is not a named pipe on this machine: {usage}",
                    quote(t)
                )),
            };
        }
        if let Some((scheme, _)) = t.split_once("://") {
            return Err(format!(
                "{api} endpoint {} uses {}://, which dxdp does not speak (the {api} API is local): {usage}",
                quote(t),
                scheme
            ));
        }
        Ok(Some(t.to_string()))
    }
}

/// A CRI endpoint read from the configuration: as written (what `config show` prints) and the
/// local address dxdp's clients connect to, parsed once when the configuration is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CriAddress {
    /// As written, trimmed (`npipe:////./pipe/containerd-containerd`).
    pub(crate) written: String,
    /// The socket path or pipe name (`\\.\pipe\containerd-containerd`).
    pub(crate) address: String,
}

impl CriAddress {
    /// `text` checked by [`CriEndpoint::parse`]; `None` when empty (containerd's default).
    pub(crate) fn parse(text: &str) -> Result<Option<CriAddress>, String> {
        Ok(CriEndpoint::parse(text)?.map(|address| CriAddress {
            written: text.trim().to_string(),
            address,
        }))
    }
}

/// A sampling interval: `10s`, `1m`, `500ms` or a number of seconds, from 1 s to 1 h.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "DurationText")]
pub(crate) struct Interval(pub(crate) std::time::Duration);

inline_schema!(Interval, {
    "description": "a sampling interval: 10s, 1m, 1500ms or a number of seconds, from 1 s to 1 h",
    "anyOf": [
        {"type": "integer", "minimum": 1, "maximum": 3600},
        {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)?$"}
    ]
});

/// What a duration may be written as: a number of seconds or a text with its unit. Anything
/// else (`0.5`, `-5`, `true`, a list) is refused with what to write instead, not with serde's
/// name of this type.
#[derive(Deserialize)]
#[serde(
    untagged,
    expecting = "a duration: a whole number of seconds, or a number with its unit such as 500ms, 90s, 15m or 1h"
)]
pub(crate) enum DurationText {
    Seconds(u64),
    Text(String),
}

impl DurationText {
    /// As text: a number of seconds is written without a unit.
    pub(crate) fn text(self) -> String {
        match self {
            DurationText::Seconds(n) => n.to_string(),
            DurationText::Text(s) => s,
        }
    }
}

impl TryFrom<DurationText> for Interval {
    type Error = String;

    fn try_from(v: DurationText) -> Result<Self, Self::Error> {
        Interval::parse(&v.text()).map(Interval)
    }
}

impl Interval {
    /// The shortest interval.
    pub(crate) const MIN: std::time::Duration = std::time::Duration::from_secs(1);
    /// The longest interval.
    pub(crate) const MAX: std::time::Duration = std::time::Duration::from_secs(3600);

    /// Parses `10s`, `1m`, `1500ms` or `10` (seconds); says what is allowed otherwise.
    pub(crate) fn parse(text: &str) -> Result<std::time::Duration, String> {
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

/// A size in bytes, written as a Kubernetes quantity: `1Gi`, `512Mi`, `2G`, or a number of bytes.
/// Whole numbers only (`1536Mi`, not `1.5Gi`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "QuantityText")]
pub(crate) struct Bytes(pub(crate) u64);

inline_schema!(Bytes, {
    "description": "a size: a whole number of bytes, or a whole number with a unit such as 512Mi, 1Gi, 2G",
    "anyOf": [
        {"type": "integer", "minimum": 0},
        {"type": "string", "pattern": "^[0-9]+(Ki|Mi|Gi|Ti|k|M|G|T)?$"}
    ]
});

/// What a size may be written as: a number of bytes or a text with its unit.
#[derive(Deserialize)]
#[serde(
    untagged,
    expecting = "a size: a whole number of bytes, or a whole number with its unit such as 512Mi, 1Gi or 2G"
)]
pub(crate) enum QuantityText {
    Bytes(u64),
    Text(String),
}

impl TryFrom<QuantityText> for Bytes {
    type Error = String;

    fn try_from(v: QuantityText) -> Result<Self, Self::Error> {
        match v {
            QuantityText::Bytes(n) => Ok(Bytes(n)),
            QuantityText::Text(t) => Bytes::parse(&t).map(Bytes),
        }
    }
}

impl Bytes {
    /// Parses `1Gi`, `512Mi`, `2G`, `1000` (bytes); says what is allowed otherwise.
    pub(crate) fn parse(text: &str) -> Result<u64, String> {
        const UNITS: [(&str, u64); 8] = [
            ("Ki", 1 << 10),
            ("Mi", 1 << 20),
            ("Gi", 1 << 30),
            ("Ti", 1 << 40),
            ("k", 1_000),
            ("M", 1_000_000),
            ("G", 1_000_000_000),
            ("T", 1_000_000_000_000),
        ];
        let t = text.trim();
        let (number, factor) = UNITS
            .iter()
            .find_map(|(suffix, f)| t.strip_suffix(suffix).map(|n| (n, *f)))
            .unwrap_or((t, 1));
        let bad = || {
            format!(
                "size {} is not a whole number of bytes or of Ki, Mi, Gi, Ti (k, M, G, T): write e.g. 512Mi, 1Gi or 1536Mi",
                quote(text)
            )
        };
        if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let n: u64 = number.parse().map_err(|_| bad())?;
        n.checked_mul(factor).ok_or_else(bad)
    }

    /// The size as a quantity, in the largest binary unit that divides it (`1Gi`, `1536Mi`).
    pub(crate) fn text(bytes: u64) -> String {
        for (suffix, shift) in [("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)] {
            if bytes != 0 && bytes.is_multiple_of(1u64 << shift) {
                return format!("{}{suffix}", bytes >> shift);
            }
        }
        bytes.to_string()
    }
}

/// A label key prefix, checked as a DNS subdomain followed by `/`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(try_from = "String")]
pub(crate) struct LabelPrefix(pub(crate) String);

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
pub(crate) struct ConfigName(pub(crate) String);

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

/// The configuration file's format version (`version:` at the top level). `v1` is today's
/// format, and a file without `version` is read as `v1`; any other version is refused, saying
/// which versions this dxdp reads, so that a later incompatible format never is misread.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub(crate) enum ConfigVersion {
    /// `v1`.
    #[default]
    V1,
}

impl ConfigVersion {
    /// Every version this dxdp reads.
    pub(crate) const ALL: [ConfigVersion; 1] = [ConfigVersion::V1];

    /// How the file writes it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ConfigVersion::V1 => "v1",
        }
    }
}

impl TryFrom<String> for ConfigVersion {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        ConfigVersion::ALL
            .into_iter()
            .find(|v| v.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "unknown configuration version {}: this dxdp {} reads version v1 (or a file without version); write the file in the v1 format (docs/configuration.md), or run the dxdp release that documents this version",
                    quote(&s),
                    env!("CARGO_PKG_VERSION")
                )
            })
    }
}

inline_schema!(ConfigVersion, {
    "description": "the configuration file's format version: v1 (also what a file without version is)",
    "type": "string",
    "enum": ["v1"]
});
