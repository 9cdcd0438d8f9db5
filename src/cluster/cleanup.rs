//! `dxdp cleanup`: takes off a Node what dxdp put on it, for an uninstall or after a crash: the
//! labels dxdp applied (every label its field managers own, whatever the prefix was: `dxdp`
//! and the validation's `dxdp-validation`), the isolation taint, and dxdp's node conditions.
//! Labels anyone else set (the per-node configuration label included) are left alone.
//!
//! A running dxdp keeps what it owns on its Node: a label removed or edited is put back at
//! once, a condition within `health::conditions::RESYNC`, the taint with the next violation
//! (docs/observability.md, health.md, isolation.md promise it). So an uninstall stops the
//! daemons first ([`Cluster::stop_daemonset`]: the DaemonSet deleted in the foreground, which
//! the API server completes only once every one of its pods is gone) and cleans after; the
//! validation Jobs the daemons created go too ([`Cluster::validation_jobs_to_clean`]), and so do
//! the NodeFeature objects of `nodeLabels.mode: nodefeature` ([`Cluster::node_features_to_clean`]).
//! Every part can be asked for without changing anything (`--dry-run`: [`planned`]).

use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, NodeCondition};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};

use super::nodefeature::{object_name, NodeFeature, NODE_NAME_LABEL};
use super::taint::TAINT_KEY;
use super::{credentials, Cluster, Off, FIELD_MANAGER, VALIDATION_FIELD_MANAGER};
use crate::util::errors::chain;

/// The label selector of the validation Jobs the daemons create (`validation::job` labels
/// them, and their pods, so).
pub(crate) const VALIDATION_JOBS: &str = "app.kubernetes.io/component=dxdp-validation";

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
        self.describe_as(node, "removed", "nothing of dxdp's was left")
    }

    /// The same for a dry run: `node n1: would remove ...`.
    pub fn describe_planned(&self, node: &str) -> String {
        self.describe_as(node, "would remove", "nothing of dxdp's is there")
    }

    fn describe_as(&self, node: &str, verb: &str, nothing: &str) -> String {
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
            format!("node {node}: {nothing}")
        } else {
            format!("node {node}: {verb} {}", parts.join(", "))
        }
    }
}

/// The fields of `node` that dxdp's managers (the daemon's and validation's) wrote.
fn dxdp_fields(
    node: &Node,
) -> impl Iterator<Item = &k8s_openapi::apimachinery::pkg::apis::meta::v1::FieldsV1> {
    node.metadata
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
}

/// What [`Cluster::cleanup`] would take off `node` (pure, for `--dry-run`): the labels dxdp's
/// field managers own (as `managedFields` lists them), its taint, its conditions.
pub(crate) fn planned(node: &Node) -> Removed {
    let present = node.metadata.labels.clone().unwrap_or_default();
    let mut labels: Vec<String> = dxdp_fields(node)
        .filter_map(|f| f.0.pointer("/f:metadata/f:labels")?.as_object().cloned())
        .flat_map(|owned| owned.into_iter().map(|(k, _)| k))
        .filter_map(|k| k.strip_prefix("f:").map(str::to_string))
        .filter(|k| present.contains_key(k))
        .collect();
    labels.sort();
    labels.dedup();
    let taint = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == TAINT_KEY));
    let conditions = dxdp_conditions(node)
        .into_iter()
        .map(|c| c.type_)
        .filter(|t| CONDITION_TYPES.contains(&t.as_str()))
        .collect();
    Removed {
        labels,
        taint,
        conditions,
    }
}

/// What became of the DaemonSet a cleanup stops first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stopped {
    /// Deleted, and every one of its pods is gone.
    Gone,
    /// There was none by that name (already deleted).
    NotFound,
    /// Deleted, but pods of it were still stopping when the wait ended (a node that does not
    /// answer keeps its pod `Terminating`).
    StillStopping,
    /// A dry run: it is there and would be deleted.
    WouldDelete,
}

impl Stopped {
    /// One line for people about the DaemonSet `namespace/name` (`wait`: the bound waited).
    pub fn describe(&self, namespace: &str, name: &str, wait: Duration) -> String {
        let ds = format!("daemonset {namespace}/{name}");
        let secs = wait.as_secs();
        match self {
            Stopped::Gone => format!("{ds}: deleted, its pods are gone"),
            Stopped::NotFound => format!("{ds}: not found"),
            Stopped::WouldDelete => {
                format!("{ds}: would be deleted, and its pods waited for (at most {secs} s)")
            }
            Stopped::StillStopping => format!(
                "{ds}: deleted, but pods of it are still stopping after {secs} s (on a node that does not answer?); cleaning anyway: a dxdp that still runs puts its labels back, so run this again once `kubectl -n {namespace} get daemonset {name}` finds none"
            ),
        }
    }

    /// Whether the line is a warning (pods may still run).
    pub fn is_warning(&self) -> bool {
        *self == Stopped::StillStopping
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
    let labels = dxdp_fields(node).any(|f| f.0.pointer("/f:metadata/f:labels").is_some());
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

    /// Connects for `dxdp cleanup`: with `context`, that context of the kubeconfig
    /// (`KUBECONFIG` or `~/.kube/config`, as `kubectl --context`), also in a pod; without, the
    /// standard way (a pod's service account, else the kubeconfig's current context).
    pub async fn connect_for_cleanup(context: Option<&str>) -> Result<Cluster, Off> {
        // No node yet: `for_node` names each one.
        const NO_NODE: &str = "(all nodes)";
        let Some(context) = context else {
            return Cluster::with_config(credentials().await?, NO_NODE);
        };
        let options = kube::config::KubeConfigOptions {
            context: Some(context.to_string()),
            ..Default::default()
        };
        let config = kube::Config::from_kubeconfig(&options).await.map_err(|e| {
            Off::NoCredentials(format!(
                "kubeconfig context {context:?}: {} (`kubectl config get-contexts` lists them)",
                chain(&e)
            ))
        })?;
        Cluster::with_config(config, NO_NODE)
    }

    /// Deletes the DaemonSet `namespace/name` in the foreground and waits, at most `wait`
    /// (reading it every `poll`), until the API server has removed it: foreground deletion
    /// completes only once every pod of it is gone, so no dxdp of it runs any more. With
    /// `dry_run`, only reads it. Needs `get` and `delete` on that DaemonSet.
    pub async fn stop_daemonset(
        &self,
        namespace: &str,
        name: &str,
        wait: Duration,
        poll: Duration,
        dry_run: bool,
    ) -> Result<Stopped, String> {
        let api: Api<DaemonSet> = Api::namespaced(self.client(), namespace);
        let what = format!("the DaemonSet {namespace}/{name}");
        let grant = format!("grant get and delete on daemonsets named {name} in {namespace}");
        let refused = |e: kube::Error| match e {
            kube::Error::Api(s) if s.code == 403 => format!("{what}: {} ({grant})", s.message),
            e => format!("{what}: {}", chain(&e)),
        };
        // `None` once the API server answers 404 (by the code: not every answer names a reason).
        let read = || async {
            match tokio::time::timeout(self.timeout, api.get(name)).await {
                Err(_) => Err(self.no_answer(&what)),
                Ok(Ok(ds)) => Ok(Some(ds)),
                Ok(Err(kube::Error::Api(s))) if s.code == 404 => Ok(None),
                Ok(Err(e)) => Err(refused(e)),
            }
        };
        if dry_run {
            return Ok(match read().await? {
                Some(_) => Stopped::WouldDelete,
                None => Stopped::NotFound,
            });
        }
        let foreground = DeleteParams::foreground();
        match tokio::time::timeout(self.timeout, api.delete(name, &foreground)).await {
            Err(_) => return Err(self.no_answer(&what)),
            Ok(Err(kube::Error::Api(s))) if s.code == 404 => return Ok(Stopped::NotFound),
            Ok(Err(e)) => return Err(refused(e)),
            Ok(Ok(_)) => {}
        }
        let until = tokio::time::Instant::now() + wait;
        loop {
            if read().await?.is_none() {
                return Ok(Stopped::Gone);
            }
            if tokio::time::Instant::now() + poll > until {
                return Ok(Stopped::StillStopping);
            }
            tokio::time::sleep(poll).await;
        }
    }

    /// The names of the validation Jobs in `namespace` (`VALIDATION_JOBS`), of the nodes in
    /// `nodes` only when given (the node a Job's pod is bound to), sorted. Needs `list` on jobs
    /// there.
    pub async fn validation_jobs_to_clean(
        &self,
        namespace: &str,
        nodes: Option<&[String]>,
    ) -> Result<Vec<String>, String> {
        let api: Api<Job> = Api::namespaced(self.client(), namespace);
        let what = format!("the validation Jobs in {namespace}");
        let list = tokio::time::timeout(
            self.timeout,
            api.list(&ListParams::default().labels(VALIDATION_JOBS)),
        )
        .await
        .map_err(|_| self.no_answer(&what))?
        .map_err(|e| match e {
            kube::Error::Api(s) if s.code == 403 => {
                format!("{what}: {} (grant list on jobs in {namespace})", s.message)
            }
            e => format!("cannot list {what}: {}", chain(&e)),
        })?;
        let mut names: Vec<String> = list
            .items
            .iter()
            .filter(|j| {
                let node = j
                    .spec
                    .as_ref()
                    .and_then(|s| s.template.spec.as_ref())
                    .and_then(|p| p.node_name.as_deref());
                nodes.is_none_or(|wanted| node.is_some_and(|n| wanted.iter().any(|w| w == n)))
            })
            .filter_map(|j| j.metadata.name.clone())
            .collect();
        names.sort();
        Ok(names)
    }

    /// Deletes the Jobs `names` in `namespace` with their pods (background propagation: the
    /// garbage collector stops and removes the pods, freeing their GPUs). A Job already gone
    /// counts as deleted. Each is tried; the error names every one that failed.
    pub async fn delete_jobs(&self, namespace: &str, names: &[String]) -> Result<(), String> {
        let api: Api<Job> = Api::namespaced(self.client(), namespace);
        let mut errors = Vec::new();
        for name in names {
            let what = format!("the Job {namespace}/{name}");
            match tokio::time::timeout(self.timeout, api.delete(name, &DeleteParams::background()))
                .await
            {
                Err(_) => errors.push(self.no_answer(&what)),
                Ok(Ok(_)) => {}
                Ok(Err(kube::Error::Api(s))) if s.code == 404 => {}
                Ok(Err(kube::Error::Api(s))) if s.code == 403 => errors.push(format!(
                    "{what}: {} (grant delete on jobs in {namespace})",
                    s.message
                )),
                Ok(Err(e)) => errors.push(format!("{what}: {}", chain(&e))),
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("; "))
        }
    }

    /// The NodeFeature objects dxdp wrote in `namespace` (`nodeLabels.mode: nodefeature`: named
    /// `dxdp-<node>` and labelled for that node), of the nodes in `nodes` only when given,
    /// sorted; none when the API server does not serve NodeFeature. Needs `list` on
    /// nodefeatures.nfd.k8s-sigs.io there.
    pub async fn node_features_to_clean(
        &self,
        namespace: &str,
        nodes: Option<&[String]>,
    ) -> Result<Vec<String>, String> {
        let api: Api<NodeFeature> = Api::namespaced(self.client(), namespace);
        let what = format!("the NodeFeature objects in {namespace}");
        let list = match tokio::time::timeout(self.timeout, api.list(&ListParams::default()))
            .await
            .map_err(|_| self.no_answer(&what))?
        {
            Ok(list) => list,
            // Node Feature Discovery's CRDs are not installed: dxdp cannot have written any.
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(Vec::new()),
            Err(kube::Error::Api(s)) if s.code == 403 => {
                return Err(format!(
                    "{what}: {} (grant list on nodefeatures.nfd.k8s-sigs.io in {namespace})",
                    s.message
                ))
            }
            Err(e) => return Err(format!("cannot list {what}: {}", chain(&e))),
        };
        let mut names: Vec<String> = list
            .items
            .iter()
            .filter_map(|o| {
                let name = o.metadata.name.as_deref()?;
                let node = o.metadata.labels.as_ref()?.get(NODE_NAME_LABEL)?;
                let wanted = nodes.is_none_or(|w| w.iter().any(|w| w == node));
                (name == object_name(node) && wanted).then(|| name.to_string())
            })
            .collect();
        names.sort();
        Ok(names)
    }

    /// Deletes the NodeFeature objects `names` in `namespace` (Node Feature Discovery then
    /// removes the labels it applied from them). One already gone counts as deleted. Each is
    /// tried; the error names every one that failed.
    pub async fn delete_node_features(
        &self,
        namespace: &str,
        names: &[String],
    ) -> Result<(), String> {
        let api: Api<NodeFeature> = Api::namespaced(self.client(), namespace);
        let mut errors = Vec::new();
        for name in names {
            let what = format!("the NodeFeature {namespace}/{name}");
            match tokio::time::timeout(self.timeout, api.delete(name, &DeleteParams::default()))
                .await
            {
                Err(_) => errors.push(self.no_answer(&what)),
                Ok(Ok(_)) => {}
                Ok(Err(kube::Error::Api(s))) if s.code == 404 => {}
                Ok(Err(kube::Error::Api(s))) if s.code == 403 => errors.push(format!(
                    "{what}: {} (grant delete on nodefeatures.nfd.k8s-sigs.io in {namespace})",
                    s.message
                )),
                Ok(Err(e)) => errors.push(format!("{what}: {}", chain(&e))),
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("; "))
        }
    }

    fn no_answer(&self, what: &str) -> String {
        format!(
            "the API server did not answer about {what} within {} s",
            self.timeout.as_secs_f64()
        )
    }

    /// What [`Cluster::cleanup`] would take off the node now (`planned`), changing nothing.
    pub async fn cleanup_plan(&self) -> Result<Removed, String> {
        let node = self.get_node().await.map_err(|e| e.to_string())?;
        Ok(planned(&node))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_job_selector_is_the_one_validation_jobs_carry() {
        use crate::validation::job::{COMPONENT, COMPONENT_LABEL};
        assert_eq!(VALIDATION_JOBS, format!("{COMPONENT_LABEL}={COMPONENT}"));
    }

    #[test]
    fn the_plan_is_what_dxdp_owns_and_nothing_else() {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "n1",
                "labels": {
                    "team": "vision",
                    "directx.microsoft.com/device-plugin.config": "shared",
                    "directx.microsoft.com/vendor": "nvidia",
                    "gpu.example/memory": "15360",
                    "directx.microsoft.com/validated": "true",
                },
                "managedFields": [
                    {"manager": "kubectl", "operation": "Update", "fieldsType": "FieldsV1",
                     "fieldsV1": {"f:metadata": {"f:labels": {"f:team": {}, "f:directx.microsoft.com/device-plugin.config": {}}}}},
                    {"manager": "dxdp", "operation": "Apply", "fieldsType": "FieldsV1",
                     "fieldsV1": {"f:metadata": {"f:labels": {"f:directx.microsoft.com/vendor": {}, "f:gpu.example/memory": {}}}}},
                    // Owned once, removed by hand since: nothing to remove.
                    {"manager": "dxdp-validation", "operation": "Apply", "fieldsType": "FieldsV1",
                     "fieldsV1": {"f:metadata": {"f:labels": {"f:directx.microsoft.com/validated": {}, "f:directx.microsoft.com/api.cuda.validated": {}}}}},
                    {"manager": "dxdp", "operation": "Update", "subresource": "status", "fieldsType": "FieldsV1",
                     "fieldsV1": {"f:status": {"f:conditions": {}}}},
                ],
            },
            "spec": {"taints": [
                {"key": "os", "value": "windows", "effect": "NoSchedule"},
                {"key": "directx.microsoft.com/isolation-violation", "effect": "NoExecute"},
            ]},
            "status": {"conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "DirectXGPUIsolation", "status": "False"},
            ]},
        }))
        .unwrap();
        let plan = planned(&node);
        assert_eq!(
            plan,
            Removed {
                labels: vec![
                    "directx.microsoft.com/validated".into(),
                    "directx.microsoft.com/vendor".into(),
                    "gpu.example/memory".into(),
                ],
                taint: true,
                conditions: vec!["DirectXGPUIsolation".into()],
            }
        );
        assert_eq!(
            plan.describe_planned("n1"),
            "node n1: would remove 3 labels (directx.microsoft.com/validated, directx.microsoft.com/vendor, gpu.example/memory), the taint directx.microsoft.com/isolation-violation, the conditions DirectXGPUIsolation"
        );
        assert_eq!(
            Removed::default().describe_planned("n1"),
            "node n1: nothing of dxdp's is there"
        );
    }
}
