//! An in-process stand-in for the Kubernetes API server's Node endpoints, over real HTTP on
//! loopback: `GET /api/v1/nodes/{name}`, server-side apply (`PATCH` with
//! `application/apply-patch+yaml`) with per-field-manager ownership of labels (listed as
//! `managedFields`), `GET /api/v1/nodes` (the one Node), a JSON merge patch
//! of `spec.taints` conditional on `metadata.resourceVersion` (409 when it is stale), a watch of
//! one Node, a JSON merge patch of `status.conditions` on `/status` and a strategic merge patch
//! of them (merged by `type`, `$patch: delete` removes one), `status.allocatable` as a test sets
//! it ([`ApiServerStandin::set_allocatable`]),
//! `spec.unschedulable` and `metadata.annotations` by a JSON merge patch (the cordon),
//! evictions (`POST .../pods/{name}/eviction`: recorded and answered 201, or with the codes a
//! test queues, 429 as a PodDisruptionBudget refuses),
//! `POST /api/v1/namespaces/{ns}/events` (kept, answered 201), TokenReview and
//! SubjectAccessReview (`POST` of `tokenreviews` and `subjectaccessreviews`: known tokens and
//! the non-resource URLs each user may use, set with [`ApiServerStandin::add_token`] and
//! [`ApiServerStandin::allow`]), and for the validation Job: Jobs (create, get, list by labels, delete) and the
//! pod list of a namespace (one pod the test sets), and DaemonSets (get, delete; a foreground
//! delete keeps the object, marked, until the test says its pods are gone, as the garbage
//! collector does: [`ApiServerStandin::daemonset_pods_gone`]). It records every request exactly as received
//! so that tests can check content type,
//! field manager and body, and it can fail requests on demand.
//!
//! NodeFeature objects (`nfd.k8s-sigs.io/v1alpha1`, get and server-side apply) are served once a
//! test installs their CRD ([`ApiServerStandin::install_crd`], e.g.
//! tests/fixtures/crds/nfd-nodefeature.yaml): every object written is validated against the CRD's
//! `openAPIV3Schema` ([`validate`]; stricter than an API server, which prunes unknown fields, it
//! refuses them) and answered 422 when it does not fit; without the CRD those paths are 404, as
//! on a cluster without Node Feature Discovery.
//!
//! Only what dxdp uses is implemented; anything else is answered 404.
#![allow(dead_code)] // each user takes a part

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::{broadcast, Notify};
use tokio::task::JoinHandle;

/// One request as the stand-in received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// `GET`, `PATCH`, ...
    pub method: String,
    /// The path, e.g. `/api/v1/nodes/n1`.
    pub path: String,
    /// The query parameters, percent-decoded.
    pub query: BTreeMap<String, String>,
    /// The `Content-Type` header.
    pub content_type: Option<String>,
    /// The body.
    pub body: String,
}

impl Recorded {
    /// The body as JSON (`Null` when it is not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or(serde_json::Value::Null)
    }

    /// The propagation policy of a delete: a query parameter or a field of the DeleteOptions
    /// body (the API server takes either; kube-rs sends the body).
    pub fn propagation_policy(&self) -> Option<String> {
        propagation_policy(&self.query, &self.body).ok().flatten()
    }
}

/// The propagation policy of a delete (query or DeleteOptions body), or why the API server
/// would refuse the request.
fn propagation_policy(
    query: &BTreeMap<String, String>,
    body: &str,
) -> Result<Option<String>, (StatusCode, String)> {
    let options: serde_json::Value = match body.trim() {
        "" => serde_json::Value::Null,
        b => serde_json::from_str(b).map_err(|_| {
            (
                StatusCode::BAD_REQUEST,
                "the DeleteOptions are not JSON".into(),
            )
        })?,
    };
    let policy = (query.get("propagationPolicy").cloned())
        .or_else(|| options["propagationPolicy"].as_str().map(str::to_string));
    match policy.as_deref() {
        None | Some("Orphan" | "Background" | "Foreground") => Ok(policy),
        Some(p) => Err((
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("DeleteOptions.meta.k8s.io is invalid: propagationPolicy: Unsupported value: \"{p}\""),
        )),
    }
}

#[derive(Debug, Default)]
struct State {
    labels: BTreeMap<String, String>,
    /// `spec.taints`.
    taints: Vec<serde_json::Value>,
    /// `status.conditions`.
    conditions: Vec<serde_json::Value>,
    /// `status.allocatable`.
    allocatable: BTreeMap<String, String>,
    /// The Events created, in order.
    events: Vec<serde_json::Value>,
    /// The field manager that owns each label.
    owners: BTreeMap<String, String>,
    version: u64,
    requests: Vec<Recorded>,
    /// Status codes for the next requests of a method (`PATCH`, `GET`).
    failures: BTreeMap<String, Vec<(u16, String)>>,
    /// Answer watches 403 (RBAC without `watch`).
    forbid_watch: bool,
    /// Bearer tokens TokenReview knows: token -> (user, groups).
    tokens: BTreeMap<String, (String, Vec<String>)>,
    /// (user, verb, non-resource path) SubjectAccessReview allows.
    allowed: std::collections::BTreeSet<(String, String, String)>,
    /// Jobs created (`POST /apis/batch/v1/namespaces/{ns}/jobs`), in order.
    jobs: Vec<serde_json::Value>,
    /// The `status` every Job is read with.
    job_status: serde_json::Value,
    /// The pod listed for any Job (`GET /api/v1/namespaces/{ns}/pods`), if any.
    job_pod: Option<serde_json::Value>,
    /// DaemonSets by `namespace/name`.
    daemonsets: BTreeMap<String, serde_json::Value>,
    /// `spec.unschedulable`.
    unschedulable: bool,
    /// `metadata.annotations`.
    annotations: BTreeMap<String, String>,
    /// The pods evicted (`namespace/name`), in order.
    evicted: Vec<String>,
    /// Status codes for the next evictions (429: a PodDisruptionBudget refuses).
    eviction_answers: Vec<u16>,
    /// The NodeFeature CRD's `openAPIV3Schema`, once installed.
    node_feature_schema: Option<serde_json::Value>,
    /// NodeFeature objects by `namespace/name`.
    node_features: BTreeMap<String, serde_json::Value>,
}

struct Shared {
    node: String,
    state: Mutex<State>,
    changed: Notify,
    events: broadcast::Sender<serde_json::Value>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn node_json(&self, s: &State) -> serde_json::Value {
        // Each field manager's labels as managedFields entries (operation Apply), as a real API
        // server lists them.
        let mut managers: BTreeMap<&str, serde_json::Map<String, serde_json::Value>> =
            BTreeMap::new();
        for (key, manager) in &s.owners {
            managers
                .entry(manager)
                .or_default()
                .insert(format!("f:{key}"), serde_json::json!({}));
        }
        let managed: Vec<serde_json::Value> = managers
            .into_iter()
            .map(|(manager, labels)| {
                serde_json::json!({
                    "manager": manager,
                    "operation": "Apply",
                    "apiVersion": "v1",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {"f:labels": labels}},
                })
            })
            .collect();
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.node,
                "resourceVersion": s.version.to_string(),
                "labels": s.labels,
                "annotations": s.annotations,
                "managedFields": managed,
            },
            "spec": {"taints": s.taints, "unschedulable": s.unschedulable.then_some(true)},
            "status": {"conditions": s.conditions, "allocatable": s.allocatable},
        })
    }

    /// Bumps the version and tells watchers and waiters.
    fn publish(&self, s: &mut State) {
        s.version += 1;
        let _ = self
            .events
            .send(serde_json::json!({"type": "MODIFIED", "object": self.node_json(s)}));
    }
}

/// A running stand-in with one Node.
pub struct ApiServerStandin {
    shared: Arc<Shared>,
    address: SocketAddr,
    task: JoinHandle<()>,
}

impl Drop for ApiServerStandin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ApiServerStandin {
    /// Serves one Node named `node` with `labels` (owned by the field manager `kubectl`) on a
    /// free loopback port.
    pub async fn start(node: &str, labels: &[(&str, &str)]) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let (events, _) = broadcast::channel(256);
        let shared = Arc::new(Shared {
            node: node.to_string(),
            state: Mutex::new(State {
                version: 1,
                ..State::default()
            }),
            changed: Notify::new(),
            events,
        });
        {
            let mut s = shared.lock();
            for (k, v) in labels {
                s.labels.insert(k.to_string(), v.to_string());
                s.owners.insert(k.to_string(), "kubectl".into());
            }
        }
        let task = tokio::spawn(serve(listener, shared.clone()));
        Ok(ApiServerStandin {
            shared,
            address,
            task,
        })
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// A kubeconfig file's text that points at the stand-in without credentials.
    pub fn kubeconfig(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: standin\n  cluster:\n    server: {}\nusers:\n- name: standin\n  user: {{}}\ncontexts:\n- name: standin\n  context:\n    cluster: standin\n    user: standin\ncurrent-context: standin\n",
            self.url()
        )
    }

    /// The Node's labels now.
    pub fn labels(&self) -> BTreeMap<String, String> {
        self.shared.lock().labels.clone()
    }

    /// The Node's taints now.
    pub fn taints(&self) -> Vec<serde_json::Value> {
        self.shared.lock().taints.clone()
    }

    /// The Node's `status.conditions` now.
    pub fn conditions(&self) -> Vec<serde_json::Value> {
        self.shared.lock().conditions.clone()
    }

    /// Replaces the node's `status.conditions` (as the kubelet or another controller would).
    pub fn set_conditions(&self, conditions: Vec<serde_json::Value>) {
        let mut s = self.shared.lock();
        s.conditions = conditions;
        self.shared.publish(&mut s);
    }

    /// Sets the Node's `status.allocatable` as the kubelet would.
    pub fn set_allocatable(&self, allocatable: &[(&str, &str)]) {
        let mut s = self.shared.lock();
        s.allocatable = allocatable
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self.shared.publish(&mut s);
        drop(s);
        self.shared.changed.notify_waiters();
    }

    /// Waits until `condition` holds for the Node's `status.conditions` (checked after every
    /// request and change); false when it does not within `timeout`.
    pub async fn wait_for_conditions(
        &self,
        timeout: std::time::Duration,
        mut condition: impl FnMut(&[serde_json::Value]) -> bool,
    ) -> bool {
        self.wait_state(timeout, |s| condition(&s.conditions)).await
    }

    /// The pods evicted so far (`namespace/name`), in order.
    pub fn evicted(&self) -> Vec<String> {
        self.shared.lock().evicted.clone()
    }

    /// Answers the next evictions with these status codes (429: a PodDisruptionBudget refuses).
    pub fn answer_evictions(&self, codes: &[u16]) {
        self.shared.lock().eviction_answers.extend_from_slice(codes);
    }

    /// The Node's `spec.unschedulable` and annotations now.
    pub fn cordon_state(&self) -> (bool, BTreeMap<String, String>) {
        let s = self.shared.lock();
        (s.unschedulable, s.annotations.clone())
    }

    /// Cordons or uncordons the Node as an operator would (`kubectl cordon`), without a mark.
    pub fn set_unschedulable(&self, on: bool) {
        let mut s = self.shared.lock();
        s.unschedulable = on;
        self.shared.publish(&mut s);
        drop(s);
        self.shared.changed.notify_waiters();
    }

    /// Waits until `condition` holds for the Node's `spec.unschedulable` and annotations
    /// (checked after every request and change), at most `timeout`.
    pub async fn wait_for_cordon(
        &self,
        timeout: std::time::Duration,
        condition: impl Fn(bool, &BTreeMap<String, String>) -> bool,
    ) -> bool {
        self.wait_state(timeout, |s| condition(s.unschedulable, &s.annotations))
            .await
    }

    /// Sets the Node's taints as another client would.
    pub fn set_taints(&self, taints: Vec<serde_json::Value>) {
        let mut s = self.shared.lock();
        s.taints = taints;
        self.shared.publish(&mut s);
        drop(s);
        self.shared.changed.notify_waiters();
    }

    /// The Events created so far.
    pub fn events(&self) -> Vec<serde_json::Value> {
        self.shared.lock().events.clone()
    }

    /// Waits until `condition` holds for the Events and the taints (checked after every
    /// request); false when it does not within `timeout`.
    pub async fn wait_for_state(
        &self,
        timeout: std::time::Duration,
        mut condition: impl FnMut(&[serde_json::Value], &[serde_json::Value]) -> bool,
    ) -> bool {
        self.wait_state(timeout, |s| condition(&s.events, &s.taints))
            .await
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.lock().requests.clone()
    }

    /// The `PATCH` requests so far.
    pub fn patches(&self) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(|r| r.method == "PATCH")
            .collect()
    }

    /// Installs a CRD (the manifest as YAML, e.g. tests/fixtures/crds/nfd-nodefeature.yaml):
    /// NodeFeature objects are served from now on, validated against its schema.
    pub fn install_crd(&self, manifest_yaml: &str) {
        let crd: serde_json::Value =
            serde_saphyr::from_str(manifest_yaml).expect("the CRD manifest is YAML");
        let schema = crd
            .pointer("/spec/versions/0/schema/openAPIV3Schema")
            .cloned()
            .expect("the CRD has spec.versions[0].schema.openAPIV3Schema");
        self.shared.lock().node_feature_schema = Some(schema);
    }

    /// The NodeFeature object `namespace/name`, if any.
    pub fn node_feature(&self, namespace: &str, name: &str) -> Option<serde_json::Value> {
        self.shared
            .lock()
            .node_features
            .get(&format!("{namespace}/{name}"))
            .cloned()
    }

    /// Waits until the NodeFeature object `namespace/name` exists (checked after every request
    /// and change), at most `timeout`.
    pub async fn wait_for_node_feature(
        &self,
        timeout: std::time::Duration,
        namespace: &str,
        name: &str,
    ) -> bool {
        let key = format!("{namespace}/{name}");
        self.wait_state(timeout, |s| s.node_features.contains_key(&key))
            .await
    }

    /// Sets (`Some`) or removes (`None`) a label as another client (`kubectl`) would.
    pub fn set_label(&self, key: &str, value: Option<&str>) {
        let mut s = self.shared.lock();
        match value {
            Some(v) => {
                s.labels.insert(key.to_string(), v.to_string());
                s.owners.insert(key.to_string(), "kubectl".into());
            }
            None => {
                s.labels.remove(key);
                s.owners.remove(key);
            }
        }
        self.shared.publish(&mut s);
        drop(s);
        self.shared.changed.notify_waiters();
    }

    /// TokenReview authenticates `token` as `user` in `groups`.
    pub fn add_token(&self, token: &str, user: &str, groups: &[&str]) {
        self.shared.lock().tokens.insert(
            token.to_string(),
            (
                user.to_string(),
                groups.iter().map(|g| g.to_string()).collect(),
            ),
        );
    }

    /// SubjectAccessReview allows `user` to `verb` the non-resource URL `path`.
    pub fn allow(&self, user: &str, verb: &str, path: &str) {
        self.shared
            .lock()
            .allowed
            .insert((user.to_string(), verb.to_string(), path.to_string()));
    }

    /// Answers the next requests of `method` with these status codes, in order.
    pub fn fail_next(&self, method: &str, codes: &[u16]) {
        self.shared
            .lock()
            .failures
            .entry(method.to_string())
            .or_default()
            .extend(codes.iter().map(|c| (*c, "injected failure".to_string())));
    }

    /// Answers the next request of `method` with this status code and Status message.
    pub fn fail_next_with(&self, method: &str, code: u16, message: &str) {
        self.shared
            .lock()
            .failures
            .entry(method.to_string())
            .or_default()
            .push((code, message.to_string()));
    }

    /// The Jobs created so far.
    pub fn jobs(&self) -> Vec<serde_json::Value> {
        self.shared.lock().jobs.clone()
    }

    /// The `status` every Job is read with from now on.
    pub fn set_job_status(&self, status: serde_json::Value) {
        self.shared.lock().job_status = status;
    }

    /// The pod listed for any Job from now on.
    pub fn set_job_pod(&self, pod: Option<serde_json::Value>) {
        self.shared.lock().job_pod = pod;
    }

    /// Adds a NodeFeature object in `namespace` as another client would (served after
    /// `install_crd`).
    pub fn add_node_feature(&self, namespace: &str, object: serde_json::Value) {
        let name = object["metadata"]["name"]
            .as_str()
            .expect("a NodeFeature object has metadata.name")
            .to_string();
        let mut s = self.shared.lock();
        s.node_features
            .insert(format!("{namespace}/{name}"), object);
        drop(s);
        self.shared.changed.notify_waiters();
    }

    /// Adds a Job as if a daemon had created it (listed and deleted like the ones created).
    pub fn add_job(&self, job: serde_json::Value) {
        self.shared.lock().jobs.push(job);
    }

    /// Adds the DaemonSet `namespace/name`.
    pub fn add_daemonset(&self, namespace: &str, name: &str) {
        let ds = serde_json::json!({
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": name, "namespace": namespace, "uid": format!("uid-{name}")},
        });
        self.shared
            .lock()
            .daemonsets
            .insert(format!("{namespace}/{name}"), ds);
    }

    /// The DaemonSet `namespace/name` now, if there is one.
    pub fn daemonset(&self, namespace: &str, name: &str) -> Option<serde_json::Value> {
        self.shared
            .lock()
            .daemonsets
            .get(&format!("{namespace}/{name}"))
            .cloned()
    }

    /// What the garbage collector does once every pod of a DaemonSet deleted in the foreground
    /// is gone: removes it. Panics when it is not being deleted.
    pub fn daemonset_pods_gone(&self, namespace: &str, name: &str) {
        let mut s = self.shared.lock();
        let key = format!("{namespace}/{name}");
        let deleting = s
            .daemonsets
            .get(&key)
            .is_some_and(|d| d["metadata"]["deletionTimestamp"].is_string());
        assert!(deleting, "{key} is not being deleted");
        s.daemonsets.remove(&key);
        drop(s);
        self.shared.changed.notify_waiters();
    }

    /// Answers every watch with 403 Forbidden, as RBAC without the `watch` verb does.
    pub fn forbid_watch(&self) {
        self.shared.lock().forbid_watch = true;
    }

    /// Waits until `condition` holds for the requests and labels (checked after every request
    /// and label change); false when it does not within `timeout`.
    pub async fn wait_for(
        &self,
        timeout: std::time::Duration,
        mut condition: impl FnMut(&[Recorded], &BTreeMap<String, String>) -> bool,
    ) -> bool {
        self.wait_state(timeout, |s| condition(&s.requests, &s.labels))
            .await
    }

    /// Waits until `condition` holds for the state (checked now and after every request and
    /// change); false when it does not within `timeout`.
    async fn wait_state(
        &self,
        timeout: std::time::Duration,
        mut condition: impl FnMut(&State) -> bool,
    ) -> bool {
        let wait = async {
            loop {
                let notified = self.shared.changed.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if condition(&self.shared.lock()) {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(timeout, wait).await.is_ok()
    }
}

async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| handle(req, shared.clone()));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

fn full(status: StatusCode, json: &serde_json::Value) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(json.to_string())).boxed());
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

fn status(code: StatusCode, message: &str) -> Response<Body> {
    full(
        code,
        &serde_json::json!({
            "apiVersion": "v1",
            "kind": "Status",
            "status": "Failure",
            "message": message,
            "code": code.as_u16(),
        }),
    )
}

/// Percent-decodes a query component (`+` is a space).
fn decode(s: &str) -> String {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h * 16 + l);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn query(q: Option<&str>) -> BTreeMap<String, String> {
    q.unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

async fn handle(req: Request<Incoming>, shared: Arc<Shared>) -> Result<Response<Body>, Infallible> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let q = query(req.uri().query());
    let content_type = req
        .headers()
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = match req.into_body().collect().await {
        Ok(b) => String::from_utf8_lossy(&b.to_bytes()).into_owned(),
        Err(_) => String::new(),
    };
    let recorded = Recorded {
        method: method.to_string(),
        path: path.clone(),
        query: q.clone(),
        content_type: content_type.clone(),
        body: body.clone(),
    };
    let response = {
        let mut s = shared.lock();
        s.requests.push(recorded);
        let injected = s
            .failures
            .get_mut(method.as_str())
            .filter(|codes| !codes.is_empty())
            .map(|codes| codes.remove(0));
        let node_path = format!("/api/v1/nodes/{}", shared.node);
        if let Some((code, message)) = injected {
            let code = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            Some(status(code, &message))
        } else if method == Method::GET && path == node_path {
            Some(full(StatusCode::OK, &shared.node_json(&s)))
        } else if method == Method::PATCH
            && path == format!("{node_path}/status")
            && content_type.as_deref() == Some("application/merge-patch+json")
        {
            Some(merge_conditions(&shared, &mut s, &body))
        } else if method == Method::PATCH
            && path == format!("{node_path}/status")
            && content_type.as_deref() == Some("application/strategic-merge-patch+json")
        {
            Some(strategic_conditions(&shared, &mut s, &body))
        } else if method == Method::PATCH
            && path == node_path
            && content_type.as_deref() == Some("application/merge-patch+json")
        {
            Some(merge_node(&shared, &mut s, &body))
        } else if method == Method::POST
            && path.starts_with("/api/v1/namespaces/")
            && path.ends_with("/eviction")
        {
            Some(evict(&mut s, &path, &body))
        } else if method == Method::PATCH && path == node_path {
            Some(apply(&shared, &mut s, &q, content_type.as_deref(), &body))
        } else if method == Method::POST && path == "/apis/authentication.k8s.io/v1/tokenreviews" {
            Some(token_review(&s, &body))
        } else if method == Method::POST
            && path == "/apis/authorization.k8s.io/v1/subjectaccessreviews"
        {
            Some(access_review(&s, &body))
        } else if method == Method::POST
            && path.starts_with("/api/v1/namespaces/")
            && path.ends_with("/events")
        {
            Some(create_event(&mut s, &path, &body))
        } else if path.starts_with("/apis/apps/v1/namespaces/") && path.contains("/daemonsets/") {
            Some(daemonsets(&mut s, &method, &path, &q, &body))
        } else if path.starts_with("/apis/nfd.k8s-sigs.io/v1alpha1/namespaces/") {
            Some(node_features(
                &mut s,
                &method,
                &path,
                &q,
                content_type.as_deref(),
                &body,
            ))
        } else if path.starts_with("/apis/batch/v1/namespaces/") {
            Some(jobs(&mut s, &method, &path, &q, &body))
        } else if method == Method::GET
            && path.starts_with("/api/v1/namespaces/")
            && path.ends_with("/pods")
        {
            let items: Vec<serde_json::Value> = s.job_pod.iter().cloned().collect();
            Some(full(
                StatusCode::OK,
                &serde_json::json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items}),
            ))
        } else if method == Method::GET
            && path == "/api/v1/nodes"
            && q.get("watch").map(String::as_str) != Some("true")
        {
            Some(full(
                StatusCode::OK,
                &serde_json::json!({
                    "apiVersion": "v1",
                    "kind": "NodeList",
                    "metadata": {"resourceVersion": s.version.to_string()},
                    "items": [shared.node_json(&s)],
                }),
            ))
        } else if method == Method::GET
            && path == "/api/v1/nodes"
            && q.get("watch").map(String::as_str) == Some("true")
        {
            s.forbid_watch.then(|| {
                status(
                    StatusCode::FORBIDDEN,
                    "nodes is forbidden: cannot watch resource nodes",
                )
            })
        } else {
            Some(status(StatusCode::NOT_FOUND, "not found"))
        }
    };
    shared.changed.notify_waiters();
    Ok(match response {
        Some(r) => r,
        None => watch(&shared, &q),
    })
}

/// A TokenReview: authenticated when the token is known, with its user and groups.
fn token_review(s: &State, body: &str) -> Response<Body> {
    let Ok(mut doc) = serde_json::from_str::<serde_json::Value>(body) else {
        return status(StatusCode::BAD_REQUEST, "the body is not JSON");
    };
    let token = doc
        .pointer("/spec/token")
        .and_then(|t| t.as_str())
        .unwrap_or_default();
    doc["status"] = match s.tokens.get(token) {
        Some((user, groups)) => serde_json::json!({
            "authenticated": true,
            "user": {"username": user, "uid": format!("uid-{user}"), "groups": groups},
        }),
        None => serde_json::json!({"authenticated": false, "error": "invalid bearer token"}),
    };
    full(StatusCode::CREATED, &doc)
}

/// A SubjectAccessReview of a non-resource URL: allowed when [`ApiServerStandin::allow`] said so.
fn access_review(s: &State, body: &str) -> Response<Body> {
    let Ok(mut doc) = serde_json::from_str::<serde_json::Value>(body) else {
        return status(StatusCode::BAD_REQUEST, "the body is not JSON");
    };
    let text = |p: &str| {
        doc.pointer(p)
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string()
    };
    let key = (
        text("/spec/user"),
        text("/spec/nonResourceAttributes/verb"),
        text("/spec/nonResourceAttributes/path"),
    );
    doc["status"] = if s.allowed.contains(&key) {
        serde_json::json!({"allowed": true, "reason": "allowed by the stand-in"})
    } else {
        serde_json::json!({"allowed": false, "reason": "no RBAC rule allows it"})
    };
    full(StatusCode::CREATED, &doc)
}

/// A JSON merge patch of the Node: only `spec.taints` is supported, and a
/// `metadata.resourceVersion` in the patch must be the current one (409 otherwise), as on a real
/// API server.
fn merge_taints(shared: &Shared, s: &mut State, body: &str) -> Response<Body> {
    merge_list(shared, s, body, "/spec/taints", |s| &mut s.taints)
}

/// A JSON merge patch of the Node: `spec.taints` (replaced whole), `spec.unschedulable` and
/// `metadata.annotations` (merged, `null` removes one), refused with 409 when its
/// `metadata.resourceVersion` is not the current one.
fn merge_node(shared: &Shared, s: &mut State, body: &str) -> Response<Body> {
    let Ok(doc) = serde_json::from_str::<serde_json::Value>(body) else {
        return status(StatusCode::BAD_REQUEST, "the body is not JSON");
    };
    if doc.pointer("/spec/taints").is_some() {
        return merge_taints(shared, s, body);
    }
    if let Some(version) = doc.pointer("/metadata/resourceVersion") {
        if version.as_str() != Some(s.version.to_string().as_str()) {
            return status(
                StatusCode::CONFLICT,
                "the object has been modified; please apply your changes to the latest version and try again",
            );
        }
    }
    if let Some(u) = doc.pointer("/spec/unschedulable") {
        s.unschedulable = u.as_bool().unwrap_or(false);
    }
    if let Some(a) = doc
        .pointer("/metadata/annotations")
        .and_then(|a| a.as_object())
    {
        for (k, v) in a {
            match v.as_str() {
                Some(v) => {
                    s.annotations.insert(k.clone(), v.to_string());
                }
                None => {
                    s.annotations.remove(k);
                }
            }
        }
    }
    shared.publish(s);
    full(StatusCode::OK, &shared.node_json(s))
}

/// An eviction (`POST .../pods/{name}/eviction`): answered with the next status the test set
/// (429 as a PodDisruptionBudget refuses), else 201 and recorded.
fn evict(s: &mut State, path: &str, body: &str) -> Response<Body> {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    // api/v1/namespaces/{ns}/pods/{name}/eviction
    let (Some(ns), Some(name)) = (parts.get(3), parts.get(5)) else {
        return status(StatusCode::NOT_FOUND, "not found");
    };
    let Ok(doc) = serde_json::from_str::<serde_json::Value>(body) else {
        return status(StatusCode::BAD_REQUEST, "the body is not JSON");
    };
    // kube-rs sends `metadata.name` and `delete_options` without apiVersion and kind, which
    // the API server takes as an Eviction.
    if doc["metadata"]["name"] != *name {
        return status(StatusCode::BAD_REQUEST, "not an Eviction of this pod");
    }
    if !s.eviction_answers.is_empty() {
        let code = s.eviction_answers.remove(0);
        if code == 429 {
            return status(
                StatusCode::TOO_MANY_REQUESTS,
                "Cannot evict pod as it would violate the pod's disruption budget.",
            );
        }
        let code = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return status(code, "refused by the test");
    }
    s.evicted.push(format!("{ns}/{name}"));
    full(
        StatusCode::CREATED,
        &serde_json::json!({"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Success", "code": 201}),
    )
}

/// A JSON merge patch of the Node's status subresource: only `status.conditions` (replaced
/// whole, as a merge patch replaces lists), with the same `resourceVersion` check as
/// [`merge_taints`].
fn merge_conditions(shared: &Shared, s: &mut State, body: &str) -> Response<Body> {
    merge_list(shared, s, body, "/status/conditions", |s| &mut s.conditions)
}

/// A strategic merge patch of the Node's status subresource: only `status.conditions`, merged
/// by `type` as the API server does (an entry with `"$patch": "delete"` removes that type; any
/// other entry replaces the fields it names and keeps the rest); other conditions untouched.
fn strategic_conditions(shared: &Shared, s: &mut State, body: &str) -> Response<Body> {
    let Ok(doc) = serde_json::from_str::<serde_json::Value>(body) else {
        return status(StatusCode::BAD_REQUEST, "the body is not JSON");
    };
    let Some(entries) = doc.pointer("/status/conditions").and_then(|c| c.as_array()) else {
        return status(
            StatusCode::BAD_REQUEST,
            "only status.conditions is supported",
        );
    };
    for entry in entries {
        let Some(kind) = entry.get("type").and_then(|t| t.as_str()) else {
            return status(
                StatusCode::BAD_REQUEST,
                "a condition without its merge key type",
            );
        };
        let at = s.conditions.iter().position(|c| c["type"] == kind);
        if entry.get("$patch").and_then(|p| p.as_str()) == Some("delete") {
            if let Some(i) = at {
                s.conditions.remove(i);
            }
            continue;
        }
        match at {
            Some(i) => {
                if let (Some(old), Some(new)) = (s.conditions[i].as_object_mut(), entry.as_object())
                {
                    for (k, v) in new {
                        old.insert(k.clone(), v.clone());
                    }
                }
            }
            None => s.conditions.push(entry.clone()),
        }
    }
    shared.publish(s);
    full(StatusCode::OK, &shared.node_json(s))
}

/// A JSON merge patch that replaces the list at `pointer` (kept in `field`) whole, refused with
/// 409 when its `metadata.resourceVersion` is not the current one.
fn merge_list(
    shared: &Shared,
    s: &mut State,
    body: &str,
    pointer: &str,
    field: fn(&mut State) -> &mut Vec<serde_json::Value>,
) -> Response<Body> {
    let Ok(doc) = serde_json::from_str::<serde_json::Value>(body) else {
        return status(StatusCode::BAD_REQUEST, "the body is not JSON");
    };
    if let Some(version) = doc.pointer("/metadata/resourceVersion") {
        if version.as_str() != Some(s.version.to_string().as_str()) {
            return status(
                StatusCode::CONFLICT,
                "the object has been modified; please apply your changes to the latest version and try again",
            );
        }
    }
    if let Some(list) = doc.pointer(pointer) {
        *field(s) = list.as_array().cloned().unwrap_or_default();
        shared.publish(s);
    }
    full(StatusCode::OK, &shared.node_json(s))
}

/// Jobs: create (kept, answered 201), get by name (with the status the test set), list (with
/// an equality `labelSelector`), delete (with DeleteOptions in the query or the body).
fn jobs(
    s: &mut State,
    method: &Method,
    path: &str,
    q: &BTreeMap<String, String>,
    body: &str,
) -> Response<Body> {
    let name = path.rsplit_once("/jobs/").map(|(_, n)| n.to_string());
    match (method.as_str(), name) {
        ("GET", None) => {
            let wanted: Vec<(String, String)> = q
                .get("labelSelector")
                .map(|sel| {
                    sel.split(',')
                        .filter_map(|p| p.split_once('='))
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect()
                })
                .unwrap_or_default();
            let items: Vec<serde_json::Value> = s
                .jobs
                .iter()
                .filter(|j| {
                    wanted
                        .iter()
                        .all(|(k, v)| j["metadata"]["labels"][k.as_str()] == v.as_str())
                })
                .map(|j| {
                    let mut j = j.clone();
                    j["status"] = s.job_status.clone();
                    j
                })
                .collect();
            full(
                StatusCode::OK,
                &serde_json::json!({"apiVersion": "batch/v1", "kind": "JobList", "metadata": {}, "items": items}),
            )
        }
        ("POST", None) => {
            let Ok(mut doc) = serde_json::from_str::<serde_json::Value>(body) else {
                return status(StatusCode::BAD_REQUEST, "the body is not JSON");
            };
            doc["metadata"]["creationTimestamp"] = "2026-11-25T00:00:00Z".into();
            s.jobs.push(doc.clone());
            full(StatusCode::CREATED, &doc)
        }
        ("GET", Some(name)) => match s
            .jobs
            .iter()
            .find(|j| j["metadata"]["name"] == name.as_str())
        {
            Some(j) => {
                let mut j = j.clone();
                j["status"] = s.job_status.clone();
                full(StatusCode::OK, &j)
            }
            None => status(StatusCode::NOT_FOUND, "jobs.batch not found"),
        },
        ("DELETE", Some(name)) => {
            if let Err((code, message)) = propagation_policy(q, body) {
                return status(code, &message);
            }
            let before = s.jobs.len();
            s.jobs.retain(|j| j["metadata"]["name"] != name.as_str());
            if s.jobs.len() == before {
                // As the API server answers a delete of what is not there.
                return status(
                    StatusCode::NOT_FOUND,
                    &format!("jobs.batch \"{name}\" not found"),
                );
            }
            full(
                StatusCode::OK,
                &serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
            )
        }
        _ => status(StatusCode::NOT_FOUND, "not found"),
    }
}

/// DaemonSets: get by name, delete (a foreground delete marks it with a `deletionTimestamp`
/// and the `foregroundDeletion` finalizer and keeps it; any other removes it at once), 404 when
/// there is none.
fn daemonsets(
    s: &mut State,
    method: &Method,
    path: &str,
    q: &BTreeMap<String, String>,
    body: &str,
) -> Response<Body> {
    let rest = path.trim_start_matches("/apis/apps/v1/namespaces/");
    let Some((namespace, name)) = rest.split_once("/daemonsets/") else {
        return status(StatusCode::NOT_FOUND, "not found");
    };
    let key = format!("{namespace}/{name}");
    let not_found = || {
        status(
            StatusCode::NOT_FOUND,
            &format!("daemonsets.apps \"{name}\" not found"),
        )
    };
    match method.as_str() {
        "GET" => match s.daemonsets.get(&key) {
            Some(d) => full(StatusCode::OK, d),
            None => not_found(),
        },
        "DELETE" => {
            let policy = match propagation_policy(q, body) {
                Ok(p) => p,
                Err((code, message)) => return status(code, &message),
            };
            if policy.as_deref() == Some("Foreground") {
                let Some(d) = s.daemonsets.get_mut(&key) else {
                    return not_found();
                };
                d["metadata"]["deletionTimestamp"] = "2026-11-25T00:00:00Z".into();
                d["metadata"]["finalizers"] = serde_json::json!(["foregroundDeletion"]);
                full(StatusCode::OK, d)
            } else {
                match s.daemonsets.remove(&key) {
                    Some(d) => full(StatusCode::OK, &d),
                    None => not_found(),
                }
            }
        }
        _ => status(
            StatusCode::METHOD_NOT_ALLOWED,
            "not supported by the stand-in",
        ),
    }
}

/// Creates an Event in the namespace of the path; the body must name that namespace.
fn create_event(s: &mut State, path: &str, body: &str) -> Response<Body> {
    let namespace = path
        .trim_start_matches("/api/v1/namespaces/")
        .trim_end_matches("/events");
    let Ok(doc) = serde_json::from_str::<serde_json::Value>(body) else {
        return status(StatusCode::BAD_REQUEST, "the body is not JSON");
    };
    if doc.pointer("/metadata/namespace").and_then(|n| n.as_str()) != Some(namespace) {
        return status(
            StatusCode::BAD_REQUEST,
            "the namespace of the provided object does not match the namespace sent on the request",
        );
    }
    s.events.push(doc.clone());
    full(StatusCode::CREATED, &doc)
}

/// Server-side apply of `metadata.labels` by the request's field manager.
fn apply(
    shared: &Shared,
    s: &mut State,
    q: &BTreeMap<String, String>,
    content_type: Option<&str>,
    body: &str,
) -> Response<Body> {
    if content_type != Some("application/apply-patch+yaml") {
        return status(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "only server-side apply is supported",
        );
    }
    let Some(manager) = q.get("fieldManager").filter(|m| !m.is_empty()) else {
        return status(
            StatusCode::BAD_REQUEST,
            "fieldManager is required for apply",
        );
    };
    let Ok(doc) = serde_json::from_str::<serde_json::Value>(body) else {
        return status(StatusCode::BAD_REQUEST, "the body is not JSON");
    };
    let labels: BTreeMap<String, String> = doc
        .pointer("/metadata/labels")
        .and_then(|l| serde_json::from_value(l.clone()).ok())
        .unwrap_or_default();
    let force = q.get("force").map(String::as_str) == Some("true");
    for k in labels.keys() {
        if let Some(owner) = s.owners.get(k) {
            if owner != manager && s.labels.get(k) != labels.get(k) && !force {
                return status(
                    StatusCode::CONFLICT,
                    &format!("conflict with {owner} on {k}"),
                );
            }
        }
    }
    let before = (s.labels.clone(), s.owners.clone());
    // Labels this manager owned and no longer applies are removed.
    let dropped: Vec<String> = s
        .owners
        .iter()
        .filter(|(k, owner)| *owner == manager && !labels.contains_key(*k))
        .map(|(k, _)| k.clone())
        .collect();
    for k in dropped {
        s.labels.remove(&k);
        s.owners.remove(&k);
    }
    for (k, v) in labels {
        s.owners.insert(k.clone(), manager.clone());
        s.labels.insert(k, v);
    }
    // A no-op apply changes neither the version nor tells watchers, as on a real API server.
    if (s.labels.clone(), s.owners.clone()) != before {
        shared.publish(s);
    }
    full(StatusCode::OK, &shared.node_json(s))
}

/// A watch of the Node: every change after the request, as JSON lines.
fn watch(shared: &Arc<Shared>, q: &BTreeMap<String, String>) -> Response<Body> {
    let selector = format!("metadata.name={}", shared.node);
    if q.get("fieldSelector") != Some(&selector) {
        return status(
            StatusCode::BAD_REQUEST,
            "only a watch of this node is supported",
        );
    }
    let mut rx = shared.events.subscribe();
    // Changes since the version the client has are sent first, as the current object.
    let missed = {
        let s = shared.lock();
        let since: u64 = q
            .get("resourceVersion")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        (since < s.version)
            .then(|| serde_json::json!({"type": "MODIFIED", "object": shared.node_json(&s)}))
    };
    let stream = async_stream::stream! {
        if let Some(event) = missed {
            yield Ok::<_, Infallible>(Frame::data(Bytes::from(format!("{event}\n"))));
        }
        loop {
            match rx.recv().await {
                Ok(event) => {
                    let line = format!("{event}\n");
                    yield Ok::<_, Infallible>(Frame::data(Bytes::from(line)));
                }
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => break,
            }
        }
    };
    let mut r = Response::new(BodyExt::boxed(StreamBody::new(stream)));
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

/// NodeFeature objects: `GET`, `DELETE` and server-side apply of
/// `/apis/nfd.k8s-sigs.io/v1alpha1/namespaces/{ns}/nodefeatures/{name}`, and the list of
/// `.../namespaces/{ns}/nodefeatures`; 404 before the CRD is installed.
fn node_features(
    s: &mut State,
    method: &Method,
    path: &str,
    q: &BTreeMap<String, String>,
    content_type: Option<&str>,
    body: &str,
) -> Response<Body> {
    let Some(schema) = s.node_feature_schema.clone() else {
        return status(
            StatusCode::NOT_FOUND,
            "the server could not find the requested resource",
        );
    };
    let rest = path.trim_start_matches("/apis/nfd.k8s-sigs.io/v1alpha1/namespaces/");
    if let Some(namespace) = rest.strip_suffix("/nodefeatures") {
        if *method != Method::GET || namespace.is_empty() || namespace.contains('/') {
            return status(
                StatusCode::METHOD_NOT_ALLOWED,
                "only list is supported here",
            );
        }
        // A list of the namespace's objects (no selectors: dxdp sends none).
        let items: Vec<serde_json::Value> = s
            .node_features
            .iter()
            .filter(|(k, _)| k.split_once('/').is_some_and(|(ns, _)| ns == namespace))
            .map(|(_, o)| o.clone())
            .collect();
        return full(
            StatusCode::OK,
            &serde_json::json!({
                "apiVersion": "nfd.k8s-sigs.io/v1alpha1",
                "kind": "NodeFeatureList",
                "metadata": {"resourceVersion": s.version.to_string()},
                "items": items,
            }),
        );
    }
    let Some((namespace, name)) = rest
        .split_once("/nodefeatures/")
        .filter(|(ns, n)| !ns.is_empty() && !n.is_empty() && !n.contains('/'))
    else {
        return status(StatusCode::NOT_FOUND, "not found");
    };
    let key = format!("{namespace}/{name}");
    if *method == Method::GET {
        return match s.node_features.get(&key) {
            Some(o) => full(StatusCode::OK, o),
            None => status(
                StatusCode::NOT_FOUND,
                &format!("nodefeatures.nfd.k8s-sigs.io \"{name}\" not found"),
            ),
        };
    }
    if *method == Method::DELETE {
        return match s.node_features.remove(&key) {
            // As the API server answers the delete of a custom resource: the object.
            Some(o) => {
                s.version += 1;
                full(StatusCode::OK, &o)
            }
            None => status(
                StatusCode::NOT_FOUND,
                &format!("nodefeatures.nfd.k8s-sigs.io \"{name}\" not found"),
            ),
        };
    }
    if *method != Method::PATCH || content_type != Some("application/apply-patch+yaml") {
        return status(
            StatusCode::METHOD_NOT_ALLOWED,
            "only get, list, delete and server-side apply are supported",
        );
    }
    if q.get("fieldManager").is_none_or(|m| m.is_empty()) {
        return status(
            StatusCode::BAD_REQUEST,
            "fieldManager is required for apply",
        );
    }
    let Ok(mut doc) = serde_json::from_str::<serde_json::Value>(body) else {
        return status(StatusCode::BAD_REQUEST, "the body is not JSON");
    };
    if doc["apiVersion"] != "nfd.k8s-sigs.io/v1alpha1" || doc["kind"] != "NodeFeature" {
        return status(StatusCode::BAD_REQUEST, "apiVersion or kind is wrong");
    }
    if doc.pointer("/metadata/name").and_then(|n| n.as_str()) != Some(name)
        || doc
            .pointer("/metadata/namespace")
            .and_then(|n| n.as_str())
            .is_some_and(|ns| ns != namespace)
    {
        return status(
            StatusCode::BAD_REQUEST,
            "metadata.name or metadata.namespace does not match the path",
        );
    }
    if let Err(e) = validate(&schema, &doc, "") {
        return status(
            StatusCode::UNPROCESSABLE_ENTITY,
            &format!("NodeFeature.nfd.k8s-sigs.io \"{name}\" is invalid: {e}"),
        );
    }
    let version = s.version + 1;
    s.version = version;
    doc["metadata"]["namespace"] = serde_json::json!(namespace);
    doc["metadata"]["resourceVersion"] = serde_json::json!(version.to_string());
    s.node_features.insert(key, doc.clone());
    full(StatusCode::OK, &doc)
}

/// Validates `value` against an OpenAPI v3 structural schema as CRDs write them (`type`,
/// `properties`, `additionalProperties`, `required`, `items`): an object with `properties` and
/// no `additionalProperties` takes no other fields. `Err` names the first field that does not
/// fit.
pub fn validate(
    schema: &serde_json::Value,
    value: &serde_json::Value,
    at: &str,
) -> Result<(), String> {
    let here = if at.is_empty() { "<root>" } else { at };
    let ty = schema.get("type").and_then(|t| t.as_str());
    let fits = match ty {
        Some("object") => value.is_object(),
        Some("string") => value.is_string(),
        Some("array") => value.is_array(),
        Some("boolean") => value.is_boolean(),
        Some("integer") => value.is_i64() || value.is_u64(),
        Some("number") => value.is_number(),
        _ => true,
    };
    if !fits {
        return Err(format!("{here}: must be of type {}", ty.unwrap_or("?")));
    }
    if let Some(object) = value.as_object() {
        for required in schema
            .get("required")
            .and_then(|r| r.as_array())
            .into_iter()
            .flatten()
            .filter_map(|r| r.as_str())
        {
            if !object.contains_key(required) {
                return Err(format!("{at}.{required}: Required value"));
            }
        }
        let properties = schema.get("properties").and_then(|p| p.as_object());
        let additional = schema.get("additionalProperties");
        for (k, v) in object {
            let field = format!("{at}.{k}");
            match (properties.and_then(|p| p.get(k)), additional) {
                (Some(s), _) => validate(s, v, &field)?,
                (None, Some(s)) if s.is_object() => validate(s, v, &field)?,
                (None, None) if properties.is_none() => {}
                _ => return Err(format!("{field}: field not declared in schema")),
            }
        }
    }
    if let (Some(items), Some(array)) = (schema.get("items"), value.as_array()) {
        for (i, v) in array.iter().enumerate() {
            validate(items, v, &format!("{at}[{i}]"))?;
        }
    }
    Ok(())
}
