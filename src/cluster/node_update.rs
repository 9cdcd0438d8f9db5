//! A read-modify-write of this node's object: read the Node, decide the change from it, and
//! apply it as a JSON merge patch conditional on the `resourceVersion` that was read (a list
//! such as `spec.taints` is replaced whole by a merge patch, so a patch without the condition
//! could drop what someone else added meanwhile). The startup taint and the cordon of
//! `health.remediation` use it.

use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};

use super::{Cluster, FIELD_MANAGER};
use crate::util::errors::chain;

/// How often a patch refused for a stale `resourceVersion` (409) is tried again at once.
const CONFLICTS: u32 = 3;

impl Cluster {
    /// Reads the Node and asks `change` what to patch (`None`: nothing to do); applies the patch
    /// (without `metadata.resourceVersion`: it is added) conditionally on what was read, reading
    /// again after a conflict. Returns `Ok(None)` when nothing was to be done, else what
    /// `change` gave with the patch. `grant` names the permission a 403 asks for.
    pub(crate) async fn update_node<T>(
        &self,
        grant: &str,
        change: impl Fn(&Node) -> Option<(serde_json::Value, T)>,
    ) -> Result<Option<T>, String> {
        for _ in 0..CONFLICTS {
            let node = self.get_node().await.map_err(|e| e.to_string())?;
            let Some((mut body, out)) = change(&node) else {
                return Ok(None);
            };
            body["metadata"]["resourceVersion"] = serde_json::json!(node.metadata.resource_version);
            let params = PatchParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..PatchParams::default()
            };
            let patch = Patch::Merge(&body);
            match tokio::time::timeout(self.timeout, self.api.patch(&self.node, &params, &patch))
                .await
            {
                Ok(Ok(_)) => return Ok(Some(out)),
                // The node changed since it was read: read it again.
                Ok(Err(kube::Error::Api(s))) if s.code == 409 => continue,
                Ok(Err(kube::Error::Api(s))) if s.code == 403 || s.code == 422 => {
                    return Err(format!(
                        "cannot patch node {}: {} ({grant})",
                        self.node, s.message
                    ))
                }
                Ok(Err(e)) => {
                    return Err(format!("cannot patch node {}: {}", self.node, chain(&e)))
                }
                Err(_) => {
                    return Err(format!(
                        "the API server did not answer a patch of node {} within {} s",
                        self.node,
                        self.timeout.as_secs_f64()
                    ))
                }
            }
        }
        Err(format!(
            "node {} changed under every one of {CONFLICTS} attempts to update it",
            self.node
        ))
    }
}
