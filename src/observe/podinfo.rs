//! `dxdp_pod_info` (opt-in: `telemetry.podLabels`, `telemetry.podUid`): one series of value 1
//! per pod with per-pod series, carrying its UID and the allowlisted pod labels as
//! `label_<key>`, in the style of kube-state-metrics' `kube_pod_labels`. It is joined in PromQL
//! (`* on(namespace, pod) group_left(label_team) dxdp_pod_info`), so the other series carry no
//! pod labels.
//!
//! This module is the pure part: the Prometheus label name of a pod label key
//! ([`label_name`]) and the labels a pod's series gets ([`select_labels`]).

use std::collections::BTreeMap;

/// The `dxdp_pod_info` series of one pod.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodInfo {
    /// The pod's namespace.
    pub(crate) namespace: String,
    /// The pod's name.
    pub(crate) pod: String,
    /// The pod's UID (`telemetry.podUid`); `None`: no `uid` label.
    pub(crate) uid: Option<String>,
    /// The `label_…` labels: Prometheus label names and the pod's values, in sorted order.
    pub(crate) labels: Vec<(String, String)>,
}

/// The Prometheus label name of a pod label key, as kube-state-metrics writes it: `label_`
/// followed by the key with every character other than `[a-zA-Z0-9_]` replaced by `_`
/// (`app.kubernetes.io/name` → `label_app_kubernetes_io_name`). The prefix makes it a valid
/// name (`[a-zA-Z_][a-zA-Z0-9_]*`) even for a key starting with a digit.
pub(crate) fn label_name(key: &str) -> String {
    let mut out = String::with_capacity(6 + key.len());
    out.push_str("label_");
    out.extend(key.chars().map(|c| {
        if c.is_ascii_alphanumeric() || c == '_' {
            c
        } else {
            '_'
        }
    }));
    out
}

/// The `label_…` labels of a pod with `labels`: the keys `allows` accepts, by [`label_name`],
/// in sorted order. When two keys give the same name, the first key in sorted order keeps it and
/// the other is left out; the second value is how many were left out so.
pub(crate) fn select_labels(
    labels: &BTreeMap<String, String>,
    allows: impl Fn(&str) -> bool,
) -> (Vec<(String, String)>, usize) {
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    let mut collisions = 0;
    for (key, value) in labels.iter().filter(|(k, _)| allows(k)) {
        match out.entry(label_name(key)) {
            std::collections::btree_map::Entry::Occupied(_) => collisions += 1,
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert(value.clone());
            }
        }
    }
    (out.into_iter().collect(), collisions)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_names_are_prefixed_and_invalid_characters_become_underscores() {
        let table = [
            ("team", "label_team"),
            ("app.kubernetes.io/name", "label_app_kubernetes_io_name"),
            ("example.com/cost-center", "label_example_com_cost_center"),
            ("9lives", "label_9lives"),
            ("UPPER_case", "label_UPPER_case"),
            ("équipe", "label__quipe"),
            ("", "label_"),
        ];
        for (key, want) in table {
            assert_eq!(label_name(key), want, "{key}");
        }
    }

    #[test]
    fn only_allowed_keys_are_kept_and_a_collision_keeps_the_first_in_sorted_order() {
        let labels: BTreeMap<String, String> = [
            ("team", "vision"),
            ("cost-center", "cc-1"),
            ("cost.center", "cc-2"),
            ("cost_center", "cc-3"),
            ("secret-token", "no"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let allows = |k: &str| k == "team" || k.starts_with("cost");
        let (got, collisions) = select_labels(&labels, allows);
        // Sorted keys: cost-center < cost.center < cost_center ('-' 0x2d, '.' 0x2e, '_' 0x5f).
        assert_eq!(
            got,
            [
                ("label_cost_center".to_string(), "cc-1".to_string()),
                ("label_team".to_string(), "vision".to_string()),
            ]
        );
        assert_eq!(collisions, 2);
        let (none, collisions) = select_labels(&labels, |_| false);
        assert!(none.is_empty());
        assert_eq!(collisions, 0);
    }
}
