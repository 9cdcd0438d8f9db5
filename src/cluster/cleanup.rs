//! `dxdp cleanup`: takes off a Node what dxdp put on it, for an uninstall or after a crash: the
//! labels dxdp applied (every label its field managers own, whatever the prefix was: `dxdp`
//! and the validation's `dxdp-validation`), the isolation taint, and dxdp's node conditions. Labels anyone else set (the per-node
//! configuration label included) are left alone.

use k8s_openapi::api::core::v1::{Node, NodeCondition};
use kube::api::{ListParams, Patch, PatchParams};

use super::taint::TAINT_KEY;
use super::{Cluster, FIELD_MANAGER, VALIDATION_FIELD_MANAGER};
use crate::util::errors::chain;

/// The node condition types dxdp sets.
pub(crate) const CONDITION_TYPES: [&str; 2] = ["DirectXGPUHealthy", "DirectXGPUIsolation"];

/// What a cleanup took off one node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Removed {
    /// Label keys removed.
    pub(crate) labels: Vec<String>,
    /// Whether the isolation taint was removed.
    pub(crate) taint: bool,
    /// Condition types removed.
    pub(crate) conditions: Vec<String>,
}

impl Removed {
    /// One line for people: `node n1: removed 3 labels (a, b, c), the isolation taint, ...`.
    pub fn describe(&self, node: &str) -> String {
        let mut parts = Vec::new();
        if !self.labels.is_empty() {
            parts.push(format!(
                "{} label{} ({})",
                self.labels.len(),
                if self.labels.len() == 1 { "" } else { "s" },
                self.labels.join(", ")
            ));
        }
        if self.taint {
            parts.push(format!("the taint {TAINT_KEY}"));
        }
        if !self.conditions.is_empty() {
            parts.push(format!("the conditions {}", self.conditions.join(", ")));
        }
        if parts.is_empty() {
            format!("node {node}: nothing of dxdp's was left")
        } else {
            format!("node {node}: removed {}", parts.join(", "))
        }
    }
}

fn dxdp_conditions(node: &Node) -> Vec<NodeCondition> {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default()
}

/// Whether dxdp left anything on `node`: labels its field manager applied, its taint, or one of
/// its conditions.
pub(crate) fn has_dxdp_state(node: &Node) -> bool {
    let labels = node
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| {
            matches!(
                m.manager.as_deref(),
                Some(FIELD_MANAGER | VALIDATION_FIELD_MANAGER)
            )
        })
        .filter_map(|m| m.fields_v1.as_ref())
        .any(|f| f.0.pointer("/f:metadata/f:labels").is_some());
    let taint = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == TAINT_KEY));
    let conditions = dxdp_conditions(node)
        .iter()
        .any(|c| CONDITION_TYPES.contains(&c.type_.as_str()));
    labels || taint || conditions
}

impl Cluster {
    /// The same connection for another node.
    pub fn for_node(&self, node: &str) -> Cluster {
        Cluster {
            node: node.to_string(),
            ..self.clone()
        }
    }

    /// The names of every node dxdp left something on (`has_dxdp_state`), sorted.
    pub async fn nodes_with_dxdp_state(&self) -> Result<Vec<String>, String> {
        let list = tokio::time::timeout(self.timeout, self.api.list(&ListParams::default()))
            .await
            .map_err(|_| {
                format!(
                    "the API server did not answer a list of nodes within {} s",
                    self.timeout.as_secs_f64()
                )
            })?
            .map_err(|e| format!("cannot list nodes: {} (grant list on nodes)", chain(&e)))?;
        let mut names: Vec<String> = list
            .items
            .iter()
            .filter(|n| has_dxdp_state(n))
            .filter_map(|n| n.metadata.name.clone())
            .collect();
        names.sort();
        Ok(names)
    }

    /// Removes dxdp's labels, taint and conditions from the node. Each part is tried even when
    /// another fails; the error names every part that failed and what to grant.
    pub async fn cleanup(&self) -> Result<Removed, String> {
        let mut removed = Removed::default();
        let mut errors = Vec::new();
        // Labels: an empty server-side apply by each of dxdp's field managers drops every label
        // it owns (the validation's first; the second apply's answer shows both gone).
        match self.get_node().await {
            Ok(before) => {
                let had = before.metadata.labels.clone().unwrap_or_default();
                if let Err(e) = self
                    .apply_labels_as(VALIDATION_FIELD_MANAGER, &Default::default())
                    .await
                {
                    errors.push(format!("validation labels: {e}"));
                }
                match self.apply_labels(&Default::default()).await {
                    Ok(after) => {
                        removed.labels = had
                            .keys()
                            .filter(|k| !after.labels.contains_key(*k))
                            .cloned()
                            .collect();
                    }
                    Err(e) => errors.push(format!("labels: {e}")),
                }
            }
            Err(e) => return Err(e.to_string()),
        }
        match self.set_isolation_taint(false).await {
            Ok(changed) => removed.taint = changed,
            Err(e) => errors.push(format!("taint: {e}")),
        }
        match self.remove_conditions().await {
            Ok(types) => removed.conditions = types,
            Err(e) => errors.push(format!("conditions: {e}")),
        }
        if errors.is_empty() {
            Ok(removed)
        } else {
            Err(format!(
                "{} (the rest was done: {})",
                errors.join("; "),
                removed.describe(self.node())
            ))
        }
    }

    /// Takes the conditions of [`CONDITION_TYPES`] out of the node's status (a JSON merge patch
    /// of `status.conditions` at the version read, read again on a conflict). Returns the types
    /// removed.
    async fn remove_conditions(&self) -> Result<Vec<String>, String> {
        const CONFLICTS: u32 = 3;
        for _ in 0..CONFLICTS {
            let node = self.get_node().await.map_err(|e| e.to_string())?;
            let all = dxdp_conditions(&node);
            let (ours, keep): (Vec<_>, Vec<_>) = all
                .into_iter()
                .partition(|c| CONDITION_TYPES.contains(&c.type_.as_str()));
            if ours.is_empty() {
                return Ok(Vec::new());
            }
            let body = serde_json::json!({
                "metadata": {"resourceVersion": node.metadata.resource_version},
                "status": {"conditions": keep},
            });
            let params = PatchParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..PatchParams::default()
            };
            let patch = Patch::Merge(&body);
            let call = self.api.patch_status(self.node(), &params, &patch);
            match tokio::time::timeout(self.timeout, call).await {
                Ok(Ok(_)) => return Ok(ours.into_iter().map(|c| c.type_).collect()),
                Ok(Err(kube::Error::Api(s))) if s.code == 409 => continue,
                Ok(Err(kube::Error::Api(s))) if s.code == 403 => {
                    return Err(format!(
                        "cannot patch the status of node {}: {} (grant patch on nodes/status)",
                        self.node(),
                        s.message
                    ))
                }
                Ok(Err(e)) => {
                    return Err(format!(
                        "cannot patch the status of node {}: {}",
                        self.node(),
                        chain(&e)
                    ))
                }
                Err(_) => {
                    return Err(format!(
                        "the API server did not answer a status patch of node {} within {} s",
                        self.node(),
                        self.timeout.as_secs_f64()
                    ))
                }
            }
        }
        Err(format!(
            "node {} changed under every one of {CONFLICTS} attempts to update its conditions",
            self.node()
        ))
    }
}
