//! Running one validation Job and publishing its result: create the Job
//! (`job::job`), follow it and its pod until
//! `job::judge` gives a result (always, at the latest at its
//! limit), and apply the result's node labels under their own field manager. Every API call has
//! the cluster's call timeout; an API error is a result too (`unknown`, with the error).
//!
//! The daemon runs it from `super::task` (`validation.enabled`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};

use super::job::{job, judge, labels, JobResult, JobSpec, LABELLED_APIS};
use crate::cluster::{ApiError, Cluster, VALIDATION_FIELD_MANAGER};
use dxdp_core::validation::Verdict;

/// Creates the Job of `spec` and waits for its result, at most `limit` (polling every `poll`).
pub(crate) async fn run_once(
    cluster: &Cluster,
    spec: &JobSpec,
    limit: Duration,
    poll: Duration,
) -> JobResult {
    let manifest = job(spec);
    let name = manifest.metadata.name.clone().unwrap_or_default();
    let ns = &spec.namespace;
    let jobs: Api<Job> = Api::namespaced(cluster.client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), ns);
    let params = PostParams::default();
    let create = jobs.create(&params, &manifest);
    if let Err(e) = cluster.call("create the validation Job for", create).await {
        return JobResult {
            verdict: Verdict::Unknown,
            summary: None,
            reason: format!(
                "cannot create the validation Job {ns}/{name}: {} ({})",
                e.reason,
                create_refused_hint(e.status, ns)
            ),
        };
    }
    let started = Instant::now();
    let its_pods = ListParams::default().labels(&format!("job-name={name}"));
    let mut last_error = None;
    loop {
        let job_now = cluster
            .call("read the validation Job of", jobs.get(&name))
            .await;
        let pods_now = cluster.call("list the validation pods of", pods.list(&its_pods));
        let pods_now = pods_now.await;
        let elapsed = started.elapsed();
        match (job_now, pods_now) {
            (Ok(j), Ok(p)) => {
                if let Some(r) = judge(&j, p.items.last(), elapsed, limit) {
                    return r;
                }
            }
            (Err(e), _) | (_, Err(e)) => last_error = Some(e.reason),
        }
        if elapsed >= limit {
            return JobResult {
                verdict: Verdict::Unknown,
                summary: None,
                reason: format!(
                    "no result within {} s: {}",
                    limit.as_secs(),
                    last_error.unwrap_or_else(|| "the API server did not answer".into())
                ),
            };
        }
        tokio::time::sleep(poll).await;
    }
}

/// Applies the labels of `result` to the node (server-side apply, field manager
/// `VALIDATION_FIELD_MANAGER`, forced): labels it no longer sets are removed.
pub async fn publish_labels(cluster: &Cluster, result: &JobResult) -> Result<(), ApiError> {
    let set: BTreeMap<String, String> = labels(result, &LABELLED_APIS)
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k, v)))
        .collect();
    cluster
        .apply_labels_as(VALIDATION_FIELD_MANAGER, &set)
        .await
        .map(|_| ())
}

/// What to look at when the API server refused the Job: RBAC (403), or the chart's admission
/// policy (422: a ValidatingAdmissionPolicy's denial is Invalid unless it says otherwise).
fn create_refused_hint(status: Option<u16>, ns: &str) -> String {
    match status {
        Some(422) => "an admission policy refused the Job's shape: the chart's <release>-validation-job allows only validation.allowedImages, validation.hostDir and the node of the token's node-name claim; docs/validation.md#what-a-node-may-create".to_string(),
        _ => format!("RBAC: create jobs in {ns}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validation::job::VALIDATED_LABEL;

    #[test]
    fn a_refused_job_names_rbac_or_the_admission_policy() {
        assert_eq!(
            create_refused_hint(Some(403), "dxdp-system"),
            "RBAC: create jobs in dxdp-system"
        );
        assert_eq!(
            create_refused_hint(None, "dxdp-system"),
            "RBAC: create jobs in dxdp-system"
        );
        assert!(create_refused_hint(Some(422), "dxdp-system")
            .starts_with("an admission policy refused the Job's shape"));
    }

    // The API server stand-in, as the cluster tests load it.
    use crate::cluster::tests::standin;

    fn spec() -> JobSpec {
        JobSpec {
            node: "n1".into(),
            namespace: "dxdp-system".into(),
            image: "mcr.microsoft.com/windows/servercore:ltsc2022".into(),
            host_dir: r"C:\var\lib\dxdp\validation".into(),
            resources: vec!["directx.microsoft.com/display".into()],
            check_timeout: Duration::from_secs(60),
            deadline: Duration::from_secs(900),
            run: 1,
        }
    }

    #[tokio::test]
    async fn a_job_that_passes_labels_the_node_and_a_failure_replaces_them() {
        let api = standin::ApiServerStandin::start("n1", &[("team", "gpu")])
            .await
            .unwrap();
        let cluster = Cluster::at_url(&api.url(), "n1").unwrap();
        api.set_job_pod(Some(serde_json::json!({"metadata": {"name": "p"}, "status": {"phase": "Succeeded",
            "containerStatuses": [{"state": {"terminated": {"exitCode": 0,
                "message": "dxdp-validation v1 pass adapters=pass d3d12=pass runtime-files=pass cuda=pass vulkan=absent\n"}}}]}})));
        let r = run_once(
            &cluster,
            &spec(),
            Duration::from_secs(10),
            Duration::from_millis(20),
        )
        .await;
        assert_eq!(r.verdict, Verdict::Pass, "{}", r.reason);
        let jobs = api.jobs();
        assert_eq!(jobs.len(), 1);
        assert_eq!(jobs[0]["metadata"]["name"], "dxdp-validate-n1-1");
        assert_eq!(jobs[0]["spec"]["template"]["spec"]["nodeName"], "n1");
        publish_labels(&cluster, &r).await.unwrap();
        let l = api.labels();
        assert_eq!(l.get(VALIDATED_LABEL).map(String::as_str), Some("true"));
        assert_eq!(
            l.get("directx.microsoft.com/api.d3d12.validated")
                .map(String::as_str),
            Some("true")
        );
        assert_eq!(
            l.get("directx.microsoft.com/api.cuda.validated")
                .map(String::as_str),
            Some("true")
        );
        assert_eq!(l.get("directx.microsoft.com/api.vulkan.validated"), None);
        assert_eq!(
            l.get("team").map(String::as_str),
            Some("gpu"),
            "other managers' labels stay"
        );
        // The next run fails CUDA: its label goes, validated turns false.
        api.set_job_pod(Some(
            serde_json::json!({"metadata": {"name": "p"}, "status": {"phase": "Failed",
            "containerStatuses": [{"state": {"terminated": {"exitCode": 1,
                "message": "dxdp-validation v1 fail adapters=pass d3d12=pass cuda=fail\n"}}}]}}),
        ));
        let r = run_once(
            &cluster,
            &spec(),
            Duration::from_secs(10),
            Duration::from_millis(20),
        )
        .await;
        assert_eq!(r.reason, "failed: cuda");
        publish_labels(&cluster, &r).await.unwrap();
        let l = api.labels();
        assert_eq!(l.get(VALIDATED_LABEL).map(String::as_str), Some("false"));
        assert_eq!(l.get("directx.microsoft.com/api.cuda.validated"), None);
        assert_eq!(
            l.get("directx.microsoft.com/api.d3d12.validated")
                .map(String::as_str),
            Some("true")
        );
    }

    #[tokio::test]
    async fn a_pod_that_never_runs_and_a_refused_create_are_unknown_in_bounded_time() {
        let api = standin::ApiServerStandin::start("n1", &[]).await.unwrap();
        let cluster = Cluster::at_url(&api.url(), "n1").unwrap();
        api.set_job_pod(Some(serde_json::json!({"metadata": {"name": "p"}, "status": {"phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "node(s) had untolerated taint"}]}})));
        let started = Instant::now();
        let r = run_once(
            &cluster,
            &spec(),
            Duration::from_secs(1),
            Duration::from_millis(20),
        )
        .await;
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(r.verdict, Verdict::Unknown);
        assert_eq!(r.reason, "no result within 1 s: the pod cannot be scheduled: Unschedulable: node(s) had untolerated taint");
        api.fail_next_with("POST", 403, "jobs.batch is forbidden");
        let r = run_once(
            &cluster,
            &spec(),
            Duration::from_secs(1),
            Duration::from_millis(20),
        )
        .await;
        assert_eq!(r.verdict, Verdict::Unknown);
        assert!(
            r.reason
                .starts_with("cannot create the validation Job dxdp-system/dxdp-validate-n1-1: "),
            "{}",
            r.reason
        );
        assert!(r.reason.contains("forbidden"), "{}", r.reason);
        publish_labels(&cluster, &r).await.unwrap();
        assert_eq!(
            api.labels().get(VALIDATED_LABEL),
            None,
            "unknown: neither true nor false"
        );
    }
}
