//! `health.expectedDevices`: how many devices each resource should have on this node, given
//! (`display: 2`) or derived from a node label (the instance type by default) through a table
//! of VM sizes (built in, extended by `instanceTypes`). The rule comparing it with the host is
//! `dxdp_core::health::expected`; the node condition, metrics and `discover`/`doctor` apply it.
//!
//! The label is read from the Node the configuration is resolved with ([`super::Inputs::node`]):
//! without the API server (the CLI, or a daemon without credentials) only given counts apply.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use dxdp_core::devices::Resource;
use dxdp_core::quote::quote;

use super::health::{ExpectedFile, FromNodeLabel, Row, DEFAULT_LABEL};
use super::NodeInfo;

/// Built-in rows: VM size (as the cloud writes `node.kubernetes.io/instance-type`) to the GPUs
/// Windows sees. Every row counts `display` devices: the drivers these sizes get on Windows
/// (NVIDIA GRID/vGPU, AMD Radeon Pro for NVv4) make WDDM adapters with graphics. A partial GPU
/// (NVadsA10 v5 below NV36ads, NVv4 below NV32as) is still one adapter in the VM.
///
/// Where each count comes from:
/// - Azure NVadsA10 v5: learn.microsoft.com/azure/virtual-machines/nva10v5-series
///   (MicrosoftDocs/azure-docs, articles/virtual-machines/nva10v5-series.md: 1/6 to 1 A10 per
///   VM, NV72ads two) and .NET Aspire's `AksNodeVmSizes.cs` (microsoft/aspire, "1 GPU(s)" for
///   NV6ads..NV36adms, "2 GPU(s)" for NV72ads);
/// - Azure NCasT4_v3: `AksNodeVmSizes.cs` (NC4as/NC8as/NC16as "1 GPU(s)", NC64as "4 GPU(s)");
/// - Azure NVv4: `AksNodeVmSizes.cs` (NV4as..NV32as_v4 "1 GPU(s)");
/// - AWS g4dn, g5, g6: the AWS Batch user guide's GPU instance table
///   (docs.aws.amazon.com/batch/latest/userguide/gpu-jobs.html: g4dn/g5/g6 xlarge to 16xlarge 1,
///   12xlarge 4, g5.24xlarge 4, g5.48xlarge 8) and RAPIDS' AWS page (rapidsai/deployment,
///   source/cloud/aws/index.md: g4dn.metal 8, g6.24xlarge 4, g6.48xlarge 8).
pub(crate) const BUILT_IN: &[(&str, u32)] = &[
    ("Standard_NV6ads_A10_v5", 1),
    ("Standard_NV12ads_A10_v5", 1),
    ("Standard_NV18ads_A10_v5", 1),
    ("Standard_NV36ads_A10_v5", 1),
    ("Standard_NV36adms_A10_v5", 1),
    ("Standard_NV72ads_A10_v5", 2),
    ("Standard_NC4as_T4_v3", 1),
    ("Standard_NC8as_T4_v3", 1),
    ("Standard_NC16as_T4_v3", 1),
    ("Standard_NC64as_T4_v3", 4),
    ("Standard_NV4as_v4", 1),
    ("Standard_NV8as_v4", 1),
    ("Standard_NV16as_v4", 1),
    ("Standard_NV32as_v4", 1),
    ("g4dn.xlarge", 1),
    ("g4dn.2xlarge", 1),
    ("g4dn.4xlarge", 1),
    ("g4dn.8xlarge", 1),
    ("g4dn.16xlarge", 1),
    ("g4dn.12xlarge", 4),
    ("g4dn.metal", 8),
    ("g5.xlarge", 1),
    ("g5.2xlarge", 1),
    ("g5.4xlarge", 1),
    ("g5.8xlarge", 1),
    ("g5.16xlarge", 1),
    ("g5.12xlarge", 4),
    ("g5.24xlarge", 4),
    ("g5.48xlarge", 8),
    ("g6.xlarge", 1),
    ("g6.2xlarge", 1),
    ("g6.4xlarge", 1),
    ("g6.8xlarge", 1),
    ("g6.16xlarge", 1),
    ("g6.12xlarge", 4),
    ("g6.24xlarge", 4),
    ("g6.48xlarge", 8),
];

/// Where a derived expectation came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Derived {
    /// The label read.
    pub(crate) label: String,
    /// Its value on the node.
    pub(crate) value: String,
    /// The row's counts.
    pub(crate) counts: BTreeMap<Resource, u32>,
    /// Whether the row is built in (else `instanceTypes`).
    pub(crate) built_in: bool,
}

/// `health.expectedDevices` in force.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExpectedDevices {
    /// Counts given.
    pub(crate) given: BTreeMap<Resource, u32>,
    /// The label to derive the other counts from (`None`: no derivation).
    pub(crate) label: Option<String>,
    /// `instanceTypes`.
    pub(crate) rows: BTreeMap<String, Row>,
    /// The row the node's label selected, once resolved with the node.
    pub(crate) derived: Option<Derived>,
}

impl From<&ExpectedFile> for ExpectedDevices {
    fn from(f: &ExpectedFile) -> Self {
        ExpectedDevices {
            given: Row {
                display: f.display,
                compute: f.compute,
            }
            .counts(),
            label: match &f.from_node_label {
                None | Some(FromNodeLabel::Switch(false)) => None,
                Some(FromNodeLabel::Switch(true)) => Some(DEFAULT_LABEL.to_string()),
                Some(FromNodeLabel::Key(k)) => Some(k.clone()),
            },
            rows: f.instance_types.clone().unwrap_or_default(),
            derived: None,
        }
    }
}

/// The row of `value`: `instanceTypes` first, then the built-in table; names compare without
/// regard to ASCII case. `(row, built in)`.
pub(crate) fn lookup(rows: &BTreeMap<String, Row>, value: &str) -> Option<(Row, bool)> {
    if let Some((_, row)) = rows.iter().find(|(k, _)| k.eq_ignore_ascii_case(value)) {
        return Some((*row, false));
    }
    BUILT_IN
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(value))
        .map(|(_, n)| {
            (
                Row {
                    display: Some(*n),
                    compute: None,
                },
                true,
            )
        })
}

impl ExpectedDevices {
    /// Every count in force: the given ones, then the derived ones for the resources not given.
    pub(crate) fn counts(&self) -> BTreeMap<Resource, u32> {
        let mut out = self
            .derived
            .as_ref()
            .map(|d| d.counts.clone())
            .unwrap_or_default();
        out.extend(self.given.iter().map(|(r, n)| (*r, *n)));
        out
    }

    /// Derives the counts from `node`'s label, when a label is configured. Returns what the
    /// operator must be told when nothing could be derived (no node, no label, a type the
    /// table does not have); said at start and on a reload, like the other notices.
    pub(crate) fn derive(&mut self, node: Option<&NodeInfo>) -> Option<String> {
        self.derived = None;
        let label = self.label.clone()?;
        let Some(node) = node else {
            return Some(format!(
                "health.expectedDevices.fromNodeLabel: the node's labels are unknown (no API server client, or it did not answer): only the counts given in health.expectedDevices apply, not {label}'s"
            ));
        };
        let Some(value) = node.labels.get(&label).filter(|v| !v.is_empty()) else {
            return Some(format!(
                "health.expectedDevices.fromNodeLabel: node {} has no label {label}: no GPU count is expected from it",
                node.name
            ));
        };
        match lookup(&self.rows, value) {
            Some((row, built_in)) => {
                self.derived = Some(Derived {
                    label,
                    value: value.clone(),
                    counts: row.counts(),
                    built_in,
                });
                None
            }
            None => Some(format!(
                "health.expectedDevices.fromNodeLabel: {label}={} (node {}) is not in the instance-type table: no GPU count is expected from it; add a row under health.expectedDevices.instanceTypes, or give the counts",
                quote(value),
                node.name
            )),
        }
    }

    /// As `config show` prints it.
    pub(crate) fn show(&self) -> Value {
        let counts = |m: &BTreeMap<Resource, u32>| {
            let mut o = serde_json::Map::new();
            for r in Resource::ALL {
                o.insert(r.to_string(), json!(m.get(&r)));
            }
            o
        };
        let mut v = counts(&self.counts());
        if let Some(label) = &self.label {
            v.insert("fromNodeLabel".into(), json!(label));
        }
        if let Some(d) = &self.derived {
            v.insert(
                "derived".into(),
                json!({
                    "from": format!("{}={}", d.label, d.value),
                    "row": if d.built_in { "built-in" } else { "instanceTypes" },
                    "counts": counts(&d.counts),
                }),
            );
        }
        if !self.rows.is_empty() {
            v.insert(
                "instanceTypes".into(),
                json!(self
                    .rows
                    .iter()
                    .map(|(k, r)| (k.clone(), Value::Object(counts(&r.counts()))))
                    .collect::<serde_json::Map<_, _>>()),
            );
        }
        Value::Object(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(labels: &[(&str, &str)]) -> NodeInfo {
        NodeInfo {
            name: "n1".into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..NodeInfo::default()
        }
    }

    #[test]
    fn given_counts_win_over_the_row_of_the_instance_type() {
        let f: ExpectedFile = super::super::parse::parse(
            "compute: 0\nfromNodeLabel: true\ninstanceTypes:\n  my-box: {display: 3, compute: 1}\n",
            "t",
        )
        .unwrap();
        let mut e = ExpectedDevices::from(&f);
        assert_eq!(e.label.as_deref(), Some(DEFAULT_LABEL));
        let n = node(&[(DEFAULT_LABEL, "Standard_NV72ads_A10_v5")]);
        assert_eq!(e.derive(Some(&n)), None);
        assert_eq!(
            e.counts(),
            BTreeMap::from([(Resource::Display, 2), (Resource::Compute, 0)])
        );
        // A row of instanceTypes wins over nothing built in; names compare without case.
        let n = node(&[(DEFAULT_LABEL, "MY-BOX")]);
        assert_eq!(e.derive(Some(&n)), None);
        assert_eq!(
            e.counts(),
            BTreeMap::from([(Resource::Display, 3), (Resource::Compute, 0)])
        );
        assert_eq!(e.show()["derived"]["row"], "instanceTypes");
    }

    #[test]
    fn an_unknown_type_a_missing_label_or_no_node_expects_nothing_and_says_so() {
        let mut e = ExpectedDevices {
            label: Some(DEFAULT_LABEL.into()),
            ..ExpectedDevices::default()
        };
        let said = e
            .derive(Some(&node(&[(DEFAULT_LABEL, "m5.large")])))
            .unwrap();
        assert!(
            said.contains("\"m5.large\" (node n1) is not in the instance-type table"),
            "{said}"
        );
        assert!(e.counts().is_empty());
        let said = e.derive(Some(&node(&[]))).unwrap();
        assert!(
            said.contains("node n1 has no label node.kubernetes.io/instance-type"),
            "{said}"
        );
        let said = e.derive(None).unwrap();
        assert!(said.contains("only the counts given"), "{said}");
        // No label configured: nothing to say.
        assert_eq!(ExpectedDevices::default().derive(None), None);
    }

    #[test]
    fn label_keys_are_checked() {
        let bad = super::super::parse::parse::<ExpectedFile>("fromNodeLabel: 'a b'\n", "t")
            .unwrap_err()
            .to_string();
        assert!(
            bad.contains("health.expectedDevices.fromNodeLabel: \"a b\" is not a label key"),
            "{bad}"
        );
        let ok: ExpectedFile =
            super::super::parse::parse("fromNodeLabel: example.com/gpus\n", "t").unwrap();
        assert_eq!(
            ExpectedDevices::from(&ok).label.as_deref(),
            Some("example.com/gpus")
        );
        let off: ExpectedFile = super::super::parse::parse("fromNodeLabel: false\n", "t").unwrap();
        assert_eq!(ExpectedDevices::from(&off).label, None);
    }

    #[test]
    fn built_in_rows_are_unique() {
        let names: std::collections::BTreeSet<String> = BUILT_IN
            .iter()
            .map(|(k, _)| k.to_ascii_lowercase())
            .collect();
        assert_eq!(names.len(), BUILT_IN.len());
        assert_eq!(
            lookup(&BTreeMap::new(), "g5.48xlarge"),
            Some((
                Row {
                    display: Some(8),
                    compute: None
                },
                true
            ))
        );
    }
}
