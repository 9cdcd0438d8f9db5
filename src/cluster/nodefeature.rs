//! `nodeLabels.mode: nodefeature`: dxdp's labels as one `nfd.k8s-sigs.io/v1alpha1` NodeFeature
//! object per node, in the daemon's namespace, which Node Feature Discovery's master applies to
//! the Node (as GPU Feature Discovery does since v0.19). The object is typed here (kube's
//! `Resource` for the fields dxdp uses: `spec.labels`; `spec.features` is optional in the CRD
//! and dxdp sends none) and written with server-side apply, so that it is created on first use.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::NamespaceResourceScope;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde::{Deserialize, Serialize};

use super::{ApiError, Cluster, FIELD_MANAGER};

/// The API group of NodeFeature.
pub(crate) const GROUP: &str = "nfd.k8s-sigs.io";
/// Its version.
pub(crate) const VERSION: &str = "v1alpha1";
/// The label that tells Node Feature Discovery which node an object is for.
pub(crate) const NODE_NAME_LABEL: &str = "nfd.node.kubernetes.io/node-name";

/// A NodeFeature object: the part dxdp writes and reads.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct NodeFeature {
    /// The object's metadata.
    #[serde(default)]
    pub(crate) metadata: ObjectMeta,
    /// What is asked of Node Feature Discovery.
    #[serde(default)]
    pub(crate) spec: NodeFeatureSpec,
}

/// `spec`: the labels to put on the node (dxdp sends no `features`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct NodeFeatureSpec {
    /// `spec.labels`.
    #[serde(default)]
    pub(crate) labels: BTreeMap<String, String>,
}

impl kube::Resource for NodeFeature {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "NodeFeature".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        GROUP.into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        VERSION.into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "nodefeatures".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The object's name for `node`: `dxdp-<node>`.
pub(crate) fn object_name(node: &str) -> String {
    format!("dxdp-{node}")
}

/// The server-side apply body: the complete object as dxdp wants it.
pub(crate) fn apply_body(
    node: &str,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": "NodeFeature",
        "metadata": {
            "name": object_name(node),
            "namespace": namespace,
            "labels": {NODE_NAME_LABEL: node},
        },
        "spec": {"labels": labels},
    })
}

/// What to do when the API server does not know NodeFeature (Node Feature Discovery's CRDs are
/// not installed).
pub(crate) const NO_CRD: &str = "the API server does not serve nodefeatures.nfd.k8s-sigs.io (Node Feature Discovery's CRDs are not installed): install Node Feature Discovery (v0.14 or later, with its CRDs), or set nodeLabels.mode: node; retrying with backoff";

/// A NodeFeature call that failed: the HTTP status the API server answered with (`None`: no
/// answer) and what to tell people.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failed {
    /// The status (404: the CRD is not installed, 403: refused).
    pub(crate) status: Option<u16>,
    /// The error, with what to do.
    pub(crate) message: String,
}

impl Cluster {
    fn node_features(&self, namespace: &str) -> Api<NodeFeature> {
        Api::namespaced(self.client.clone(), namespace)
    }

    /// Applies `labels` as the complete `spec.labels` of this node's NodeFeature object in
    /// `namespace` (created when missing; server-side apply, forced); returns the labels the
    /// object has afterwards.
    pub(crate) async fn apply_node_feature(
        &self,
        namespace: &str,
        labels: &BTreeMap<String, String>,
    ) -> Result<BTreeMap<String, String>, Failed> {
        let body = apply_body(&self.node, namespace, labels);
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let name = object_name(&self.node);
        let api = self.node_features(namespace);
        self.call(
            "write the NodeFeature object of",
            api.patch(&name, &params, &Patch::Apply(&body)),
        )
        .await
        .map(|o| o.spec.labels)
        .map_err(|e| explain(&e, namespace, &name))
    }

    /// The labels of this node's NodeFeature object now (`None`: there is none).
    pub(crate) async fn node_feature_labels(
        &self,
        namespace: &str,
    ) -> Result<Option<BTreeMap<String, String>>, Failed> {
        let name = object_name(&self.node);
        let api = self.node_features(namespace);
        self.call("read the NodeFeature object of", api.get_opt(&name))
            .await
            .map(|o| o.map(|o| o.spec.labels))
            .map_err(|e| explain(&e, namespace, &name))
    }

    /// Deletes this node's NodeFeature object in `namespace`; `Ok(false)` when there is none (or
    /// the API server does not serve NodeFeature: nothing can be left then either).
    pub(crate) async fn delete_node_feature(&self, namespace: &str) -> Result<bool, Failed> {
        let name = object_name(&self.node);
        let api = self.node_features(namespace);
        match self
            .call(
                "delete the NodeFeature object of",
                api.delete(&name, &DeleteParams::default()),
            )
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if e.status == Some(404) => Ok(false),
            Err(e) => Err(explain(&e, namespace, &name)),
        }
    }
}

/// An error of a NodeFeature call, with what to do for a missing CRD (404) or permission (403).
fn explain(e: &ApiError, namespace: &str, name: &str) -> Failed {
    let message = match e.status {
        Some(404) => format!("NodeFeature {namespace}/{name}: {NO_CRD}"),
        Some(403) => format!(
            "{e} (NodeFeature {namespace}/{name}: the service account needs get, create, patch and delete of nodefeatures.nfd.k8s-sigs.io in {namespace}, for its own node's object: the chart grants them with nodeLabels.mode: nodefeature, and its admission policy refuses other nodes' objects)"
        ),
        _ => format!("{e} (NodeFeature {namespace}/{name})"),
    };
    Failed {
        status: e.status,
        message,
    }
}
