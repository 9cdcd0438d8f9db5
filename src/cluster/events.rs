//! The Kubernetes Events dxdp creates (isolation violations, unhealthy GPUs, failed validation):
//! one builder, so that every Event is named, sourced and bounded the same way.
//!
//! dxdp only creates Events (it never reads or updates one): each is a new object named as
//! client-go names them (`<object>.<time in hex>`, within the 253 characters of a name), a
//! `Warning` from the component `dxdp` on this node, its message cut at [`MESSAGE_MAX`] bytes.

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

/// The longest message dxdp writes into an Event or a node condition, in bytes (cut at a
/// character boundary).
pub const MESSAGE_MAX: usize = 1024;

/// `message` cut to at most [`MESSAGE_MAX`] bytes, at a character boundary.
pub fn bounded(mut message: String) -> String {
    if message.len() > MESSAGE_MAX {
        let mut end = MESSAGE_MAX;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
    }
    message
}

/// What one Warning Event says, and about what.
#[derive(Debug, Clone)]
pub struct Warning {
    /// The namespace the Event is created in.
    pub namespace: String,
    /// The object it is about.
    pub involved: ObjectReference,
    /// Another object it concerns (the node, a Job), if any.
    pub related: Option<ObjectReference>,
    /// The reason (`GPUIsolationViolation`, `GPUUnhealthy`, `GPUValidationFailed`).
    pub reason: &'static str,
    /// The action (`UseUnallocatedGPU`, `ReportDeviceHealth`, `Validate`).
    pub action: &'static str,
    /// The message (cut to [`MESSAGE_MAX`]).
    pub message: String,
}

/// The Warning Event `w` reported by dxdp on `node` at `now` (a new object each time).
pub fn warning(w: Warning, node: &str, now: Time) -> Event {
    let nanos = now.0.as_nanosecond();
    let suffix = format!(".{:x}", nanos.max(0));
    let mut prefix = w.involved.name.clone().unwrap_or_default();
    prefix.truncate(253 - suffix.len());
    Event {
        metadata: ObjectMeta {
            name: Some(format!("{prefix}{suffix}")),
            namespace: Some(w.namespace),
            ..ObjectMeta::default()
        },
        involved_object: w.involved,
        related: w.related,
        reason: Some(w.reason.into()),
        message: Some(bounded(w.message)),
        type_: Some("Warning".into()),
        action: Some(w.action.into()),
        source: Some(EventSource {
            component: Some("dxdp".into()),
            host: Some(node.to_string()),
        }),
        reporting_component: Some("dxdp".into()),
        reporting_instance: Some(node.to_string()),
        first_timestamp: Some(now.clone()),
        last_timestamp: Some(now),
        count: Some(1),
        ..Event::default()
    }
}

/// A reference to the pod container `container` of `namespace/pod`.
pub fn container_ref(namespace: &str, pod: &str, container: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(pod.to_string()),
        namespace: Some(namespace.to_string()),
        field_path: Some(format!("spec.containers{{{container}}}")),
        ..ObjectReference::default()
    }
}

/// A reference to the Node `node`.
pub fn node_ref(node: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node.to_string()),
        ..ObjectReference::default()
    }
}
