//! The node labels' writes (`dxdp_node_labels_writes_total{target, result}`): every write of
//! dxdp's label set to its Node (`target="node"`) or to its NodeFeature object
//! (`target="nodefeature"`: applied, or deleted when the configuration moves back to
//! `nodeLabels.mode: node`), by result (`cluster::labels`). Both labels have fixed values.
//!
//! Names and labels are a public interface; `docs/observability.md` lists them.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// Where a label write went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WriteTarget {
    /// The Node (`nodeLabels.mode: node`).
    Node,
    /// The NodeFeature object (`nodeLabels.mode: nodefeature`).
    NodeFeature,
}

impl WriteTarget {
    /// Every target.
    pub(crate) const ALL: [WriteTarget; 2] = [WriteTarget::Node, WriteTarget::NodeFeature];

    /// The label value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            WriteTarget::Node => "node",
            WriteTarget::NodeFeature => "nodefeature",
        }
    }
}

/// What one label write gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WriteResult {
    /// Written (and the target shows it).
    Ok,
    /// Failed otherwise (no answer, a conflict, a rewritten answer): retried with backoff.
    Error,
    /// The API server does not serve NodeFeature (404: Node Feature Discovery's CRDs are not
    /// installed): retried with backoff.
    CrdMissing,
    /// Refused (403: RBAC or an admission policy): retried with backoff.
    Forbidden,
}

impl WriteResult {
    /// Every result.
    pub(crate) const ALL: [WriteResult; 4] = [
        WriteResult::Ok,
        WriteResult::Error,
        WriteResult::CrdMissing,
        WriteResult::Forbidden,
    ];

    /// The label value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            WriteResult::Ok => "ok",
            WriteResult::Error => "error",
            WriteResult::CrdMissing => "crd_missing",
            WriteResult::Forbidden => "forbidden",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WriteLabels {
    target: String,
    result: String,
}

/// The label writes' counter (a default value counts without being registered).
#[derive(Debug, Clone, Default)]
pub(crate) struct LabelMetrics {
    writes: Family<WriteLabels, Counter>,
}

fn labels(target: WriteTarget, result: WriteResult) -> WriteLabels {
    WriteLabels {
        target: target.as_str().into(),
        result: result.as_str().into(),
    }
}

impl LabelMetrics {
    /// Registers it in `registry`, every series at 0.
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let writes = Family::<WriteLabels, Counter>::default();
        registry.register(
            "dxdp_node_labels_writes",
            "Writes of dxdp's node labels, by target (node: the Node; nodefeature: the NodeFeature object of nodeLabels.mode: nodefeature) and result (ok, error, crd_missing: NodeFeature not served, forbidden: RBAC or an admission policy refused); failed writes are retried with backoff",
            writes.clone(),
        );
        for t in WriteTarget::ALL {
            for r in WriteResult::ALL {
                drop(writes.get_or_create(&labels(t, r)));
            }
        }
        LabelMetrics { writes }
    }

    /// Counts one write.
    pub(crate) fn count(&self, target: WriteTarget, result: WriteResult) {
        self.writes.get_or_create(&labels(target, result)).inc();
    }

    /// How many writes to `target` gave `result`.
    #[cfg(test)]
    pub(crate) fn get(&self, target: WriteTarget, result: WriteResult) -> u64 {
        self.writes.get_or_create(&labels(target, result)).get()
    }
}
