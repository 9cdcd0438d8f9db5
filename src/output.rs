//! The machine-readable documents dxdp prints (`discover --json`, `doctor --json`, `hcs --json`,
//! `config show --json`, `mounts --format json`, `audit -o json`, `validate -o json`): typed, each headed by `apiVersion` and `kind`,
//! and their JSON Schemas, generated from these same types (checked into `docs/schemas/`).
//!
//! Compatibility: within `dxdp/v1` fields are only added, never removed, renamed or retyped.

use std::borrow::Cow;
use std::collections::BTreeMap;

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::{Serialize, Serializer};

use dxdp_core::devices::{Device, Excluded, Warning};

/// The `apiVersion` of every document.
pub(crate) const API_VERSION: &str = "dxdp/v1";

/// A field that always serialises to one string, with a `const` schema.
macro_rules! const_string {
    ($(#[doc = $doc:literal])* $name:ident = $value:expr) => {
        $(#[doc = $doc])*
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct $name;

        impl $name {
            /// The string.
            pub(crate) const VALUE: &'static str = $value;
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(Self::VALUE)
            }
        }

        impl JsonSchema for $name {
            fn schema_name() -> Cow<'static, str> {
                stringify!($name).into()
            }

            fn inline_schema() -> bool {
                true
            }

            fn json_schema(_: &mut SchemaGenerator) -> Schema {
                json_schema!({"type": "string", "const": Self::VALUE})
            }
        }
    };
}

const_string!(
    /// `dxdp/v1`.
    ApiVersion = API_VERSION
);
const_string!(
    /// `Discovery`.
    DiscoveryKind = "Discovery"
);
const_string!(
    /// `DoctorReport`.
    DoctorReportKind = "DoctorReport"
);
const_string!(
    /// `HcsReport`.
    HcsReportKind = "HcsReport"
);
const_string!(
    /// `Configuration`.
    ConfigurationKind = "Configuration"
);
const_string!(
    /// `Mounts`.
    MountsKind = "Mounts"
);
const_string!(
    /// `Audit`.
    AuditKind = "Audit"
);
const_string!(
    /// `Validation`.
    ValidationKind = "Validation"
);

/// `dxdp discover --json`: the devices of the host, what was left out and why, and warnings.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "Discovery")]
pub struct DiscoveryDoc<'a> {
    /// Always `dxdp/v1`.
    pub(crate) api_version: ApiVersion,
    /// Always `Discovery`.
    pub(crate) kind: DiscoveryKind,
    /// Devices, ordered by location path. Only those whose `resource` is not null are
    /// advertised to the kubelet.
    pub(crate) devices: &'a [Device],
    /// Adapters that were left out, and why.
    pub(crate) excluded: &'a [Excluded],
    /// Things an operator should know; each `code` is listed in docs/troubleshooting.md.
    pub(crate) warnings: &'a [Warning],
    /// True when dxdp itself runs inside a container (driver store under `HostDriverStore`).
    pub(crate) in_container: bool,
}

/// Counts of the checks by status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
pub struct DoctorSummary {
    /// Checks that failed: dxdp cannot work until they are fixed.
    pub fail: usize,
    /// Checks that passed.
    pub pass: usize,
    /// Checks worth attention.
    pub warn: usize,
    /// Checks that only inform (skipped on a simulated host, a resource with no device here).
    pub info: usize,
}

/// `dxdp doctor --json`: the preflight checks of the node.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "DoctorReport")]
pub struct DoctorReportDoc<'a> {
    /// Always `dxdp/v1`.
    pub api_version: ApiVersion,
    /// Always `DoctorReport`.
    pub kind: DoctorReportKind,
    /// The checks, in the order `doctor` prints them.
    pub checks: &'a [Check],
    /// False when any check failed (the exit code is then 1).
    pub ok: bool,
    /// How many checks have each status.
    pub summary: DoctorSummary,
}

/// `dxdp hcs --json`: the OS, its HCS schema versions, and what the configured assignment does.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "HcsReport")]
pub struct HcsReportDoc<'a> {
    /// Always `dxdp/v1`.
    pub api_version: ApiVersion,
    /// Always `HcsReport`.
    pub kind: HcsReportKind,
    /// The report.
    #[serde(flatten)]
    pub report: &'a HcsReport,
    /// The configured assignment mode and whether it works here.
    pub assignment: &'a AssignmentVerdict,
}

/// One effective configuration value.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct ConfigValue {
    /// Where it came from, for people: `default`, `file PATH`, `env NAME` or `flag --NAME`, some
    /// with a note (the reference plugin's variable that named the file, the named configuration).
    pub origin: String,
    /// The value, typed (boolean, number, string, list or object; see docs/configuration.md).
    pub value: serde_json::Value,
}

/// `dxdp config show --json`: the effective configuration and where each value came from.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "Configuration")]
pub struct ConfigurationDoc {
    /// Always `dxdp/v1`.
    pub api_version: ApiVersion,
    /// Always `Configuration`.
    pub kind: ConfigurationKind,
    /// The configuration file that was read, or null when there is none.
    pub file: Option<String>,
    /// Every key (`resources.display.replicas`, `assignment`, ...) with its value and origin.
    pub values: BTreeMap<String, ConfigValue>,
    /// How the configuration was built, when an operator must know: a configuration file that
    /// does not exist, a reference-plugin default file read, `*_MULTITENANCY=0` taken as 1, a
    /// dxdp variable overriding a reference variable, an unknown named configuration.
    pub notes: Vec<String>,
}

/// A device selected by `dxdp mounts`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct MountsDevice {
    /// Human description.
    pub(crate) description: String,
    /// The containerd device string `vpci-location-path://<location path>`.
    pub(crate) host_path: String,
    /// The kubelet device ID.
    pub(crate) id: String,
    /// The device node's location path.
    pub(crate) location_path: String,
}

/// A read-only bind mount of one runtime file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Mount {
    /// The path in the container (`C:\Windows\System32\...`).
    pub(crate) destination: String,
    /// Always true: runtime files are mounted read-only.
    pub(crate) read_only: bool,
    /// The file on the host (in the driver store).
    pub(crate) source: String,
}

/// `dxdp mounts --format json`: the selected devices and the mounts that give a container them.
/// (Members of the nested objects are in alphabetical order, as before `apiVersion` existed.)
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "Mounts")]
pub(crate) struct MountsDoc {
    /// Always `dxdp/v1`.
    pub(crate) api_version: ApiVersion,
    /// Always `Mounts`.
    pub(crate) kind: MountsKind,
    /// The selected devices.
    pub(crate) devices: Vec<MountsDevice>,
    /// The runtime files to bind-mount, exactly as the plugin's Allocate returns them.
    pub(crate) mounts: Vec<Mount>,
    /// The device strings the container runtime gets: one `vpci-location-path://...` per
    /// device, or the display-adapter class (`class/5B45201D-...`) with assignment class-guid.
    pub(crate) container_devices: Vec<String>,
}

/// What `dxdp audit` looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum AuditScope {
    /// The node: every pod container's GPU use against its allocation.
    Node,
    /// This container: the adapters it can enumerate against `DXDP_ADAPTER_LUIDS`.
    Container,
}

/// The verdict of `dxdp audit` (and its exit code).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum AuditVerdict {
    /// No violation (node), or the container sees only what it was given (exit code 0).
    Clean,
    /// Containers use GPUs they were not allocated (node), or the container sees GPUs it was
    /// not given: the node leaks (exit code 1).
    Violations,
    /// The audit could not tell; `reason` says why (exit code 3; 2 is a usage error).
    Unknown,
}

impl AuditVerdict {
    /// 0, 1 or 3 (docs/tools.md#exit-codes).
    pub fn exit_code(self) -> u8 {
        match self {
            AuditVerdict::Clean => 0,
            AuditVerdict::Violations => 1,
            AuditVerdict::Unknown => 3,
        }
    }
}

/// `dxdp audit -o json`: whether containers stay on the GPUs they were allocated.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "Audit")]
pub struct AuditDoc {
    /// Always `dxdp/v1`.
    pub api_version: ApiVersion,
    /// Always `Audit`.
    pub kind: AuditKind,
    /// What was audited: the node, or the container `dxdp audit` runs in.
    pub scope: AuditScope,
    /// The verdict; the exit code is 0 (clean), 1 (violations) or 3 (unknown).
    pub verdict: AuditVerdict,
    /// Why the audit could not tell (verdict `unknown`), else null.
    pub reason: Option<String>,
    /// Where the figures came from (a daemon's `/metrics`, the GPU counters here, a host
    /// snapshot, or DXCore in this container).
    pub source: String,
    /// The node audit (scope `node`, when figures were read).
    pub node: Option<dxdp_core::telemetry::isolation::IsolationReport>,
    /// The container check (scope `container`, when the adapters could be enumerated).
    pub container: Option<dxdp_core::telemetry::isolation::ContainerCheck>,
    /// What an operator should know to read the verdict.
    pub notes: Vec<String>,
}

/// A device `dxdp validate` checked: one given to the container (from the `DXDP_*` hints), or,
/// without hints, one it can see.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ValidatedDevice {
    /// The LUID as `DXDP_ADAPTER_LUIDS` writes it (signed 64-bit decimal).
    pub(crate) luid: i64,
    /// The adapter's description where it is visible, else empty.
    pub(crate) model: String,
    /// The device ID (`DXDP_DEVICE_IDS`), when given.
    pub(crate) device_id: Option<String>,
    /// The location path (`DXDP_LOCATION_PATHS`), when given.
    pub(crate) location_path: Option<String>,
    /// The vendor (`DXDP_VENDOR`), when given.
    pub(crate) vendor: Option<String>,
}

/// `dxdp validate -o json`: whether the GPUs a container was given, and their APIs, work in it.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "Validation")]
pub struct ValidationDoc {
    /// Always `dxdp/v1`.
    pub(crate) api_version: ApiVersion,
    /// Always `Validation`.
    pub(crate) kind: ValidationKind,
    /// `pass` (exit code 0), `fail` (a check failed or timed out, exit code 1) or `unknown`
    /// (nothing failed but a check could not tell, exit code 3).
    pub verdict: dxdp_core::validation::Verdict,
    /// The checks that decided a `fail` or `unknown` verdict, in order.
    pub(crate) failed: Vec<String>,
    /// How the adapters were enumerated (DXCore, or DXGI where DXCore cannot be loaded).
    pub(crate) source: String,
    /// The devices checked.
    pub(crate) devices: Vec<ValidatedDevice>,
    /// Every check, in the order run: `adapters`, `d3d12` (one per device), `runtime-files`,
    /// then the vendor APIs.
    pub checks: Vec<dxdp_core::validation::CheckResult>,
    /// What an operator should know to read the result.
    pub(crate) notes: Vec<String>,
}

/// Pretty JSON with a final newline.
pub fn to_json<T: Serialize>(doc: &T) -> String {
    // The documents are plain structs of strings, numbers and JSON values: serialising them
    // cannot fail, and an empty document would show that it did.
    serde_json::to_string_pretty(doc).unwrap_or_default() + "\n"
}

/// Every document's kind with its JSON Schema, in a fixed order.
pub fn schemas() -> Vec<(&'static str, Schema)> {
    vec![
        (DiscoveryKind::VALUE, schemars::schema_for!(DiscoveryDoc)),
        (
            DoctorReportKind::VALUE,
            schemars::schema_for!(DoctorReportDoc),
        ),
        (HcsReportKind::VALUE, schemars::schema_for!(HcsReportDoc)),
        (
            ConfigurationKind::VALUE,
            schemars::schema_for!(ConfigurationDoc),
        ),
        (MountsKind::VALUE, schemars::schema_for!(MountsDoc)),
        (AuditKind::VALUE, schemars::schema_for!(AuditDoc)),
        (ValidationKind::VALUE, schemars::schema_for!(ValidationDoc)),
    ]
}

/// A document as YAML, fields in the same order as [`to_json`] writes them.
pub fn to_yaml<T: Serialize>(doc: &T) -> anyhow::Result<String> {
    Ok(serde_saphyr::to_string(doc)?)
}

/// The text of `docs/schemas/<kind>.schema.json`.
pub fn schema_text(schema: &Schema) -> String {
    to_json(schema)
}

// The reports of the node tools (`doctor`, `hcs`), as they are printed.

/// A check's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "UPPERCASE")]
pub enum Status {
    /// Fine.
    Pass,
    /// Nothing to judge: the check was skipped, or there is nothing of its kind on this node.
    Info,
    /// Works, but worth attention.
    Warn,
    /// dxdp cannot work until this is fixed.
    Fail,
}

impl Status {
    /// `PASS`, `WARN` or `FAIL`.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pass => "PASS",
            Status::Info => "INFO",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        }
    }
}

/// One check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct Check {
    /// What was checked.
    pub name: String,
    /// The outcome.
    pub status: Status,
    /// What was found.
    pub detail: String,
    /// What to do, for WARN and FAIL.
    pub remedy: Option<String>,
}

/// The verdict of `dxdp hcs`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HcsReport {
    /// OS product name.
    pub(crate) product_name: Option<String>,
    /// OS display version.
    pub(crate) display_version: Option<String>,
    /// OS build (`10.0.20348.1547`).
    pub(crate) build: Option<String>,
    /// Supported schema versions, highest minor per major.
    pub(crate) hcs_schema_versions: Vec<String>,
    /// The highest schema version.
    pub(crate) highest_schema: Option<String>,
    /// Whether `vpci-location-path` assignment works.
    pub(crate) location_path_assignment: bool,
    /// `location-path`, `class-guid`, or null when HCS is unavailable.
    pub(crate) recommended_assignment: Option<String>,
    /// One line for people.
    pub(crate) verdict: String,
}

/// What the configured assignment mode does on a host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AssignmentVerdict {
    /// The configured mode (`location-path`, `class-guid`, `auto`).
    pub configured: String,
    /// The mode in force on this host (`auto` resolved).
    pub in_force: String,
    /// Whether containers can get devices in that mode here.
    pub works: bool,
    /// One line for people.
    pub verdict: String,
}

/// Text for people: left-aligned columns separated by two spaces, each as wide as its widest
/// cell (in characters); the last column is not padded.
pub(crate) fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .map(|r| r.get(c).map_or(0, |s| s.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<w$}  ", w = widths[c]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_fields_come_first_and_are_constant() {
        let doc = ConfigurationDoc {
            api_version: ApiVersion,
            kind: ConfigurationKind,
            file: None,
            values: BTreeMap::new(),
            notes: Vec::new(),
        };
        let text = to_json(&doc);
        assert!(
            text.starts_with("{\n  \"apiVersion\": \"dxdp/v1\",\n  \"kind\": \"Configuration\",\n"),
            "{text}"
        );
    }

    #[test]
    fn schemas_pin_api_version_and_kind() {
        for (kind, schema) in schemas() {
            let v = schema.as_value();
            assert_eq!(v["title"], kind);
            assert_eq!(v["properties"]["apiVersion"]["const"], "dxdp/v1");
            assert_eq!(v["properties"]["kind"]["const"], kind);
            let required = v["required"].as_array().cloned().unwrap_or_default();
            assert!(required.contains(&"apiVersion".into()), "{kind}");
            assert!(required.contains(&"kind".into()), "{kind}");
        }
    }
}
