//! The validation Job, its pure parts: the Job a node's daemon would create to run
//! `dxdp validate` on its own node (one device of each served resource, a public Windows base
//! image, the node's own `dxdp.exe` mounted read-only from a host directory), what its Job and
//! pod status mean (a result, still running, or `unknown` with the reason: unschedulable,
//! refused by the kubelet, image not pulled, past its deadline), the node labels of a result,
//! and which old Jobs to delete.
//!
//! The daemon's task that creates, waits for and cleans up the Jobs is
//! `super::task` (docs/validation.md, "In the cluster").

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::batch::v1::{self as batch, Job};
use k8s_openapi::api::core::v1::{
    Container, HostPathVolumeSource, Pod, PodSecurityContext, PodSpec, PodTemplateSpec,
    ResourceRequirements, Toleration, Volume, VolumeMount, WindowsSecurityContextOptions,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use dxdp_core::validation::{parse_summary_line, Outcome, Summary, Verdict};

/// The node label with the last validation's verdict (`true`, `false`; absent when unknown).
pub(crate) const VALIDATED_LABEL: &str = "directx.microsoft.com/validated";

/// The label on validation Jobs and their pods naming the component.
pub(crate) const COMPONENT_LABEL: &str = "app.kubernetes.io/component";
/// Its value.
pub(crate) const COMPONENT: &str = "dxdp-validation";
/// The label on validation Jobs naming their node (label-safe).
pub(crate) const NODE_LABEL: &str = "directx.microsoft.com/validation-node";

/// Where `dxdp.exe` is mounted in the validation container.
pub(crate) const CONTAINER_DIR: &str = r"C:\dxdp";
/// Where the container writes its summary: the pod's termination message (`/dev/termination-log`
/// is `C:\dev\termination-log` in a Windows container).
pub(crate) const SUMMARY_FILE: &str = r"C:\dev\termination-log";

/// The node label `directx.microsoft.com/api.<name>.validated` of a check that passed.
pub(crate) fn api_label(name: &str) -> String {
    format!("directx.microsoft.com/api.{name}.validated")
}

/// What a validation Job is made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct JobSpec {
    /// The node (`NODE_NAME`).
    pub(crate) node: String,
    /// The daemon's namespace: the Job lives there.
    pub(crate) namespace: String,
    /// The image (a Windows base image that has DirectX, matching the host's build).
    pub(crate) image: String,
    /// The host directory where the daemon places its `dxdp.exe`.
    pub(crate) host_dir: String,
    /// The served resource names; the pod requests one device of each.
    pub(crate) resources: Vec<String>,
    /// `dxdp validate --timeout` (each check's limit).
    pub(crate) check_timeout: Duration,
    /// The Job's deadline (`activeDeadlineSeconds`).
    pub(crate) deadline: Duration,
    /// A number that makes the name unique (the run's Unix time).
    pub(crate) run: u64,
}

/// A label value from any text: at most 63 characters of `[A-Za-z0-9._-]`, starting and ending
/// alphanumeric.
pub(crate) fn label_value(text: &str) -> String {
    let mut s: String = text
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .take(63)
        .collect();
    while s.ends_with(|c: char| !c.is_ascii_alphanumeric()) {
        s.pop();
    }
    while s.starts_with(|c: char| !c.is_ascii_alphanumeric()) {
        s.remove(0);
    }
    s
}

/// The Job's name: `dxdp-validate-<node>-<run>`, a DNS label (at most 63 characters, lower case).
pub(crate) fn job_name(node: &str, run: u64) -> String {
    let suffix = format!("-{run}");
    let prefix = "dxdp-validate-";
    let room = 63 - prefix.len() - suffix.len();
    let node: String = label_value(&node.to_ascii_lowercase())
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .take(room)
        .collect();
    let node = node.trim_end_matches('-');
    format!("{prefix}{node}{suffix}")
}

/// The Job (batch/v1) for `spec`.
pub(crate) fn job(spec: &JobSpec) -> Job {
    let labels = BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), "dxdp".to_string()),
        (COMPONENT_LABEL.to_string(), COMPONENT.to_string()),
        (NODE_LABEL.to_string(), label_value(&spec.node)),
    ]);
    let limits: BTreeMap<String, Quantity> = spec
        .resources
        .iter()
        .map(|r| (r.clone(), Quantity("1".into())))
        .collect();
    let deadline = i64::try_from(spec.deadline.as_secs().max(1)).unwrap_or(i64::MAX);
    let container = Container {
        name: "validate".into(),
        image: Some(spec.image.clone()),
        command: Some(vec![
            format!(r"{CONTAINER_DIR}\dxdp.exe"),
            "validate".into(),
            "--timeout".into(),
            spec.check_timeout.as_secs().max(1).to_string(),
            "--summary-file".into(),
            SUMMARY_FILE.into(),
        ]),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        resources: Some(ResourceRequirements {
            limits: Some(limits.clone()),
            requests: Some(limits),
            ..Default::default()
        }),
        volume_mounts: Some(vec![VolumeMount {
            name: "dxdp".into(),
            mount_path: CONTAINER_DIR.into(),
            read_only: Some(true),
            ..Default::default()
        }]),
        ..Default::default()
    };
    let pod = PodSpec {
        node_name: Some(spec.node.clone()),
        restart_policy: Some("Never".into()),
        // An ordinary (process-isolated) container, said explicitly, without an API token: the
        // chart's admission policy refuses any other Job from dxdp's service account
        // (deploy/helm/dxdp/templates/validation-policy.yaml).
        automount_service_account_token: Some(false),
        security_context: Some(PodSecurityContext {
            windows_options: Some(WindowsSecurityContextOptions {
                host_process: Some(false),
                ..Default::default()
            }),
            ..Default::default()
        }),
        node_selector: Some([("kubernetes.io/os".into(), "windows".into())].into()),
        // The GPU node may carry taints (dxdp's own isolation taint among them): the Job must
        // run on this node whatever they are.
        tolerations: Some(vec![Toleration {
            operator: Some("Exists".into()),
            ..Default::default()
        }]),
        containers: vec![container],
        volumes: Some(vec![Volume {
            name: "dxdp".into(),
            host_path: Some(HostPathVolumeSource {
                path: spec.host_dir.clone(),
                type_: Some("Directory".into()),
            }),
            ..Default::default()
        }]),
        ..Default::default()
    };
    Job {
        metadata: ObjectMeta {
            name: Some(job_name(&spec.node, spec.run)),
            namespace: Some(spec.namespace.clone()),
            labels: Some(labels.clone()),
            ..Default::default()
        },
        spec: Some(batch::JobSpec {
            backoff_limit: Some(0),
            active_deadline_seconds: Some(deadline),
            ttl_seconds_after_finished: Some(86400),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..Default::default()
                }),
                spec: Some(pod),
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// What a finished (or given up) validation says.
#[derive(Debug, Clone, PartialEq)]
pub struct JobResult {
    /// The verdict.
    pub verdict: Verdict,
    /// The container's summary, when it left one.
    pub summary: Option<Summary>,
    /// Why, for people (the failed checks, or why nothing is known).
    pub reason: String,
}

fn unknown(reason: impl Into<String>) -> Option<JobResult> {
    Some(JobResult {
        verdict: Verdict::Unknown,
        summary: None,
        reason: reason.into(),
    })
}

/// What the Job's status and its pod's status (if any) mean after `elapsed` of `limit`: a
/// result, or `None` while it is still running within its limit. Past the limit it is always
/// a result (`unknown`, with the pod's state as the reason): a Job never keeps the daemon
/// waiting.
pub(crate) fn judge(
    job: &Job,
    pod: Option<&Pod>,
    elapsed: Duration,
    limit: Duration,
) -> Option<JobResult> {
    let status = pod.and_then(|p| p.status.as_ref());
    let state = status
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|s| s.first())
        .and_then(|c| c.state.as_ref());
    if let Some(done) = state.and_then(|s| s.terminated.as_ref()) {
        let code = done.exit_code;
        if let Some(s) = parse_summary_line(done.message.as_deref().unwrap_or_default()) {
            let reason = match s.verdict {
                Verdict::Pass => "every check passed".to_string(),
                Verdict::Fail => format!("failed: {}", s.failed.join(", ")),
                Verdict::Unknown => format!("could not tell: {}", s.failed.join(", ")),
            };
            return Some(JobResult {
                verdict: s.verdict,
                summary: Some(s),
                reason,
            });
        }
        return match Verdict::from_exit_code(code) {
            Some(v) => Some(JobResult {
                verdict: v,
                summary: None,
                reason: format!("exit code {code}, no summary in the termination message"),
            }),
            None => unknown(format!(
                "the validation container ended with exit code {code} ({}): dxdp.exe did not run or crashed",
                done.reason.as_deref().unwrap_or("no reason")
            )),
        };
    }
    if let Some(waiting) = state.and_then(|s| s.waiting.as_ref()) {
        let reason = waiting.reason.as_deref().unwrap_or_default();
        if matches!(
            reason,
            "ErrImagePull"
                | "ImagePullBackOff"
                | "InvalidImageName"
                | "CreateContainerError"
                | "CreateContainerConfigError"
        ) {
            return unknown(format!(
                "the validation container cannot start: {reason}: {} (the image must match the host's Windows build; see validation.image)",
                waiting.message.as_deref().unwrap_or_default()
            ));
        }
    }
    if let Some(s) = status.filter(|s| s.phase.as_deref() == Some("Failed")) {
        return unknown(format!(
            "the kubelet refused the validation pod: {}: {} (is a device of each resource free?)",
            s.reason.as_deref().unwrap_or("Failed"),
            s.message.as_deref().unwrap_or_default()
        ));
    }
    let conditions = job.status.as_ref().and_then(|s| s.conditions.as_ref());
    if let Some(c) = conditions
        .into_iter()
        .flatten()
        .find(|c| c.type_ == "Failed" && c.status == "True")
    {
        return unknown(format!(
            "the validation Job failed without a result: {}: {}",
            c.reason.as_deref().unwrap_or_default(),
            c.message.as_deref().unwrap_or_default()
        ));
    }
    if elapsed < limit {
        return None;
    }
    let unschedulable = status
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False");
    let state = match (pod, unschedulable) {
        (None, _) => "no pod was created".to_string(),
        (Some(_), Some(c)) => format!(
            "the pod cannot be scheduled: {}: {}",
            c.reason.as_deref().unwrap_or_default(),
            c.message.as_deref().unwrap_or_default()
        ),
        (Some(_), None) => format!(
            "the pod is still {}",
            status.and_then(|s| s.phase.as_deref()).unwrap_or("Pending")
        ),
    };
    unknown(format!("no result within {} s: {state}", limit.as_secs()))
}

/// The node labels of a result: `Some(value)` to set, `None` to remove. `validated` is `true`
/// or `false`, and removed when unknown (the node is neither); `api.<name>.validated=true` for
/// each API check that passed (`d3d12` among them), removed for every other known API.
pub(crate) fn labels(result: &JobResult, apis: &[&str]) -> BTreeMap<String, Option<String>> {
    let mut out = BTreeMap::new();
    out.insert(
        VALIDATED_LABEL.to_string(),
        match result.verdict {
            Verdict::Pass => Some("true".to_string()),
            Verdict::Fail => Some("false".to_string()),
            Verdict::Unknown => None,
        },
    );
    for name in apis {
        let passed = result.summary.as_ref().is_some_and(|s| {
            s.checks
                .iter()
                .any(|(n, o)| n == name && *o == Outcome::Pass)
        });
        out.insert(api_label(name), passed.then(|| "true".to_string()));
    }
    out
}

/// The API checks that give `api.<name>.validated` labels.
pub(crate) const LABELLED_APIS: [&str; 8] = [
    "d3d12", "cuda", "nvml", "opencl", "vulkan", "nvenc", "amf", "vpl",
];

/// Which finished validation Jobs to delete: all but the newest `keep` (by creation time), and
/// never one still running. `jobs` are `(name, creation time in RFC 3339, finished)`.
pub(crate) fn old_jobs(jobs: &[(String, String, bool)], keep: usize) -> Vec<String> {
    let mut done: Vec<&(String, String, bool)> = jobs.iter().filter(|j| j.2).collect();
    // RFC 3339 times of one server sort as text.
    done.sort_by(|a, b| b.1.cmp(&a.1).then(b.0.cmp(&a.0)));
    done.into_iter().skip(keep).map(|j| j.0.clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    /// A Job or pod as the API server would send it.
    fn typed<T: serde::de::DeserializeOwned>(v: Value) -> T {
        serde_json::from_value(v).unwrap()
    }

    fn spec() -> JobSpec {
        JobSpec {
            node: "AKSWIN000001".into(),
            namespace: "dxdp-system".into(),
            image: "mcr.microsoft.com/windows/servercore:ltsc2022".into(),
            host_dir: r"C:\var\lib\dxdp\validation".into(),
            resources: vec!["directx.microsoft.com/display".into()],
            check_timeout: Duration::from_secs(60),
            deadline: Duration::from_secs(900),
            run: 1764110000,
        }
    }

    #[test]
    fn the_job_runs_on_its_node_with_one_device_and_the_node_s_dxdp() {
        let j = serde_json::to_value(job(&spec())).unwrap();
        assert_eq!(
            j["metadata"]["name"],
            "dxdp-validate-akswin000001-1764110000"
        );
        assert_eq!(j["metadata"]["namespace"], "dxdp-system");
        assert_eq!(j["spec"]["backoffLimit"], 0);
        assert_eq!(j["spec"]["activeDeadlineSeconds"], 900);
        let pod = &j["spec"]["template"]["spec"];
        assert_eq!(pod["nodeName"], "AKSWIN000001");
        assert_eq!(pod["restartPolicy"], "Never");
        let c = &pod["containers"][0];
        assert_eq!(c["image"], "mcr.microsoft.com/windows/servercore:ltsc2022");
        assert_eq!(
            c["command"],
            json!([
                r"C:\dxdp\dxdp.exe",
                "validate",
                "--timeout",
                "60",
                "--summary-file",
                r"C:\dev\termination-log"
            ])
        );
        assert_eq!(
            c["resources"]["limits"],
            json!({"directx.microsoft.com/display": "1"})
        );
        assert_eq!(c["volumeMounts"][0]["readOnly"], true);
        assert_eq!(
            pod["volumes"][0]["hostPath"]["path"],
            r"C:\var\lib\dxdp\validation"
        );
        assert_eq!(j["metadata"]["labels"][NODE_LABEL], "AKSWIN000001");
    }

    /// The whole Job, as tests/fixtures/validation-job.json writes it out: deploy/check.py
    /// evaluates the chart's admission policy (validation-policy.yaml) on the same file, so the
    /// Job dxdp creates and the shape the policy admits cannot drift apart.
    #[test]
    fn the_job_is_the_shape_the_chart_s_admission_policy_admits() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/validation-job.json");
        let text = std::fs::read_to_string(&path).unwrap();
        let want: Value = serde_json::from_str(&text).unwrap();
        let got = serde_json::to_value(job(&spec())).unwrap();
        assert_eq!(got, want, "{}", serde_json::to_string_pretty(&got).unwrap());
        let pod = &got["spec"]["template"]["spec"];
        assert_eq!(pod["automountServiceAccountToken"], false);
        assert_eq!(
            pod["securityContext"]["windowsOptions"]["hostProcess"],
            false
        );
    }

    #[test]
    fn names_and_label_values_stay_within_kubernetes_limits() {
        let long = "n".repeat(80) + ".example.com";
        let name = job_name(&long, 1764110000);
        assert_eq!(name.len(), 63);
        assert!(name.starts_with("dxdp-validate-nnn"));
        assert!(name.ends_with("-1764110000"));
        assert_eq!(label_value("-a/b_c."), "a-b_c");
        assert_eq!(label_value(&long).len(), 63);
    }

    fn terminated(code: i64, message: &str) -> Pod {
        typed(
            json!({"status": {"phase": if code == 0 { "Succeeded" } else { "Failed" },
            "containerStatuses": [{"state": {"terminated": {"exitCode": code, "message": message, "reason": "Error"}}}]}}),
        )
    }

    #[test]
    fn a_finished_pod_gives_its_summary_or_its_exit_code() {
        let job: Job = typed(json!({"status": {}}));
        let r = judge(
            &job,
            Some(&terminated(
                1,
                "dxdp-validation v1 fail adapters=pass d3d12=pass cuda=fail vulkan=absent\n",
            )),
            Duration::from_secs(5),
            Duration::from_secs(900),
        )
        .unwrap();
        assert_eq!(r.verdict, Verdict::Fail);
        assert_eq!(r.reason, "failed: cuda");
        let l = labels(&r, &LABELLED_APIS);
        assert_eq!(l[VALIDATED_LABEL].as_deref(), Some("false"));
        assert_eq!(
            l["directx.microsoft.com/api.d3d12.validated"].as_deref(),
            Some("true")
        );
        assert_eq!(l["directx.microsoft.com/api.cuda.validated"], None);
        assert_eq!(l["directx.microsoft.com/api.vulkan.validated"], None);
        let r = judge(
            &job,
            Some(&terminated(0, "")),
            Duration::ZERO,
            Duration::from_secs(1),
        )
        .unwrap();
        assert_eq!(r.verdict, Verdict::Pass);
        assert_eq!(
            r.reason,
            "exit code 0, no summary in the termination message"
        );
        let r = judge(
            &job,
            Some(&terminated(-1073741515, "")),
            Duration::ZERO,
            Duration::from_secs(1),
        )
        .unwrap();
        assert_eq!(r.verdict, Verdict::Unknown);
        assert!(
            r.reason
                .starts_with("the validation container ended with exit code -1073741515"),
            "{}",
            r.reason
        );
        assert_eq!(labels(&r, &LABELLED_APIS)[VALIDATED_LABEL], None);
    }

    #[test]
    fn unschedulable_refused_unpullable_and_hung_jobs_are_unknown_never_a_wait() {
        let job: Job = typed(json!({"status": {}}));
        let pending: Pod = typed(json!({"status": {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes are available"}]}}));
        assert_eq!(
            judge(
                &job,
                Some(&pending),
                Duration::from_secs(10),
                Duration::from_secs(900)
            ),
            None
        );
        let r = judge(
            &job,
            Some(&pending),
            Duration::from_secs(900),
            Duration::from_secs(900),
        )
        .unwrap();
        assert_eq!(r.verdict, Verdict::Unknown);
        assert_eq!(r.reason, "no result within 900 s: the pod cannot be scheduled: Unschedulable: 0/3 nodes are available");
        let refused: Pod = typed(
            json!({"status": {"phase": "Failed", "reason": "UnexpectedAdmissionError",
            "message": "Allocate failed due to requested number of devices unavailable for directx.microsoft.com/display"}}),
        );
        let r = judge(
            &job,
            Some(&refused),
            Duration::from_secs(1),
            Duration::from_secs(900),
        )
        .unwrap();
        assert_eq!(r.reason, "the kubelet refused the validation pod: UnexpectedAdmissionError: Allocate failed due to requested number of devices unavailable for directx.microsoft.com/display (is a device of each resource free?)");
        let pull: Pod = typed(
            json!({"status": {"phase": "Pending", "containerStatuses": [{"state": {"waiting": {"reason": "ImagePullBackOff", "message": "no matching manifest"}}}]}}),
        );
        let r = judge(
            &job,
            Some(&pull),
            Duration::from_secs(1),
            Duration::from_secs(900),
        )
        .unwrap();
        assert!(
            r.reason.starts_with(
                "the validation container cannot start: ImagePullBackOff: no matching manifest"
            ),
            "{}",
            r.reason
        );
        let deadline: Job = typed(
            json!({"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded", "message": "Job was active longer than specified deadline"}]}}),
        );
        let r = judge(
            &deadline,
            None,
            Duration::from_secs(1),
            Duration::from_secs(900),
        )
        .unwrap();
        assert_eq!(r.reason, "the validation Job failed without a result: DeadlineExceeded: Job was active longer than specified deadline");
        let r = judge(
            &job,
            None,
            Duration::from_secs(901),
            Duration::from_secs(900),
        )
        .unwrap();
        assert_eq!(r.reason, "no result within 900 s: no pod was created");
    }

    #[test]
    fn old_finished_jobs_are_deleted_and_running_ones_kept() {
        let jobs = vec![
            ("a".to_string(), "2026-11-20T00:00:00Z".to_string(), true),
            ("b".to_string(), "2026-11-22T00:00:00Z".to_string(), true),
            ("c".to_string(), "2026-11-21T00:00:00Z".to_string(), true),
            ("d".to_string(), "2026-11-19T00:00:00Z".to_string(), false),
        ];
        assert_eq!(old_jobs(&jobs, 1), vec!["c".to_string(), "a".to_string()]);
        assert!(old_jobs(&jobs, 5).is_empty());
    }
}
