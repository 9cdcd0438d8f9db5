#!/usr/bin/env python3
"""Checks dxdp's deployment: the Helm chart, the plain manifests and the example Jobs.

    deploy/check.py            run every check; ends with "N passed, M failed", exit 1 on failure
    deploy/check.py --update   re-render deploy/manifests/*.yaml from the chart, then check

Checks:
  * `helm lint --strict` and `helm template` of deploy/helm/dxdp with the default values and
    every deploy/helm/dxdp/ci/*-values.yaml, and values the schema or the templates must refuse;
  * deploy/manifests/<variant>.yaml equals `helm template` with
    deploy/manifests/variants/{common,<variant>}.values.yaml (drift);
  * every rendered object, plain manifest and example validates against the Kubernetes OpenAPI
    schemas of the oldest and newest supported Kubernetes in strict mode (kubernetes-validate);
  * the DaemonSet's HostProcess settings, node selection (no build pin), probes, config mount,
    and that every rendered config.yaml passes `dxdp config check` (when a dxdp binary exists);
  * the example Jobs: unique names, Windows nodes without build pin, one DirectX device, the
    os=windows, sku=gpu and nvidia.com/gpu NoSchedule taints tolerated;
  * config.yaml holds the chart's configuration values (no variable overrides it), conflicting
    values are refused, the metrics address pattern agrees with `dxdp config check`;
  * the cleanup pre-delete hook, NOTES.txt (smoke test first), the packaged chart's README links
    (deploy/package_chart.py), deploy/drivers/*.yaml, deploy/preflight.yaml (`dxdp doctor` on a
    named node) and scripts/build-image.sh (stand-in docker: a build per Windows build and one
    manifest list by os.version; the release runs the same script).
  * the admission policies (nodeApi.enforceOwnNode): rendered with the right match and binding
    where Kubernetes 1.30+ can enforce them, refused below unless turned off (NOTES.txt warns),
    and their CEL, evaluated by cel-python (not an API server) on written-out requests: dxdp's own
    Node writes and its own validation Job (tests/fixtures/validation-job.json, the Rust unit
    test's fixture) admitted, every other write denied;
  * the alerting rules: `promtool test rules deploy/prometheus/alerts-test.yaml`, every alert
    tested there, the chart's PrometheusRule equal to files/alerts.rules.yaml and accepted by
    `promtool check rules`, every runbook_url a section of docs/alerts.md;
  * the recording rules (GPU cost): `promtool test rules deploy/prometheus/recording-test.yaml`,
    every rule tested there, rendered after the alerts unless prometheusRule.recordingRules=false.

Needs: helm 3 ($HELM or on PATH), python3 with PyYAML, kubernetes-validate and cel-python (the
admission policies' CEL; skipped visibly without it, except in CI), promtool
(Debian's prometheus package; without it the alert checks are skipped, visibly, except in CI).
"""

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

import yaml
import kubernetes_validate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHART = os.path.join(ROOT, "deploy", "helm", "dxdp")
MANIFESTS = os.path.join(ROOT, "deploy", "manifests")
VARIANTS = os.path.join(MANIFESTS, "variants")
EXAMPLES = os.path.join(ROOT, "examples")
RELEASE = "dxdp"
NAMESPACE = "dxdp-system"
# The oldest Kubernetes the chart's defaults install on (1.30: ValidatingAdmissionPolicy v1 and
# the node-name claim of service-account tokens, which nodeApi.enforceOwnNode needs) and the newest
# kubernetes-validate has schemas for.
KUBE_VERSIONS = ["1.30.0", "1.37.0"]
# The oldest Kubernetes dxdp supports at all (HostProcess GA; older kubelets send the socket path
# as the HTTP/2 :authority, which dxdp rejects): there only with nodeApi.enforceOwnNode=false.
OLDEST_KUBE = "1.26.0"
CONFIG_DIR = "C:\\etc\\dxdp"
RESOURCES = ("directx.microsoft.com/display", "directx.microsoft.com/compute")

passed = 0
failed = 0


def ok(name):
    global passed
    passed += 1
    print(f"PASS  {name}")


def fail(name, why):
    global failed
    failed += 1
    print(f"FAIL  {name}: {why}")


def check(name, condition, why=""):
    if condition:
        ok(name)
    else:
        fail(name, why or "assertion failed")
    return condition


def helm_binary():
    helm = os.environ.get("HELM") or shutil.which("helm")
    if not helm:
        sys.exit("error: helm 3 not found: set HELM or put helm on PATH (.ci/run installs one)")
    return helm


def helm(*args):
    """Runs helm; returns (exit code, stdout, stderr)."""
    p = subprocess.run([HELM, *args], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


# The chart has no default image (none is published): the chart checks set this one.
IMAGE = ["--set", "image.repository=registry.example.com/dxdp"]


def template(*values, release=RELEASE, namespace=NAMESPACE, extra=()):
    args = ["template", release, CHART, "--namespace", namespace, "--kube-version", KUBE_VERSIONS[0]]
    for v in values:
        args += ["--values", v]
    return helm(*args, *extra)


def docs(text):
    return [d for d in yaml.safe_load_all(text) if d]


def header(variant):
    return (
        f"# dxdp plain manifest: {variant}. Generated from deploy/helm/dxdp with\n"
        f"# deploy/manifests/variants/{variant}.values.yaml by `deploy/check.py --update`;\n"
        f"# do not edit (CI fails when it differs from the chart).\n"
        f"#   kubectl apply -f deploy/manifests/{variant}.yaml\n"
    )


def variants():
    names = []
    for path in sorted(glob.glob(os.path.join(VARIANTS, "*.values.yaml"))):
        name = os.path.basename(path)[: -len(".values.yaml")]
        if name != "common":
            names.append(name)
    return names


def render_variant(name):
    code, out, err = template(
        os.path.join(VARIANTS, "common.values.yaml"), os.path.join(VARIANTS, f"{name}.values.yaml")
    )
    if code != 0:
        return None, err
    # Labelled as what they are: applied with kubectl, not managed by Helm.
    out = out.replace("app.kubernetes.io/managed-by: Helm", "app.kubernetes.io/managed-by: kubectl")
    return header(name) + out, None


def is_hook(o):
    return "helm.sh/hook" in (o.get("metadata", {}).get("annotations") or {})


def find(objs, kind, hooks=False):
    """The objects of `kind`; Helm hooks (the cleanup Job and its RBAC) only with hooks=True."""
    return [o for o in objs if o.get("kind") == kind and (hooks or not is_hook(o))]


def env_of(container):
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def dxdp_binary():
    explicit = os.environ.get("DXDP")
    if explicit:
        return explicit
    # The newest build: a release binary left from a benchmark may be older than the sources.
    found = [os.path.join(ROOT, p) for p in ("target/release/dxdp", "target/debug/dxdp")]
    found = [p for p in found if os.access(p, os.X_OK)]
    return max(found, key=os.path.getmtime) if found else None


def socket_address(address, port):
    """The chart's IP:PORT ([IPv6]:PORT for an IPv6 address)."""
    address = str(address)
    if ":" in address and not address.startswith("["):
        return f"[{address}]:{port}"
    return f"{address}:{port}"


# The chart values that are configuration keys: (chart value, config key, value written or None).
def chart_keys(values, defaults):
    merged = {k: ({**defaults[k], **values.get(k, {})} if isinstance(defaults.get(k), dict) else values.get(k, defaults.get(k)))
              for k in ("replicas", "logLevel", "logFormat", "metrics", "probes", "nodeLabels", "isolation", "health",
                        "validation")}
    m, p, n, i = merged["metrics"], merged["probes"], merged["nodeLabels"], merged["isolation"]
    h = merged["health"]
    v = merged["validation"]
    # metrics.bindAddress: hostIP: each node's own IP, passed by DXDP_METRICS_ADDRESS, not written.
    on_host_ip = m["enabled"] and str(m["bindAddress"]) == "hostIP"
    authz = m["enabled"] and m.get("authorization") == "kubernetes"
    return [
        ("replicas", "resources.display.replicas", merged["replicas"]),
        ("replicas", "resources.compute.replicas", merged["replicas"]),
        ("logLevel", "logLevel", merged["logLevel"] or None),
        ("logFormat", "logFormat", merged["logFormat"] or None),
        ("metrics", "metrics.address",
         None if on_host_ip else socket_address(m["bindAddress"], m["port"]) if m["enabled"] else ""),
        ("probes", "metrics.probeAddress", socket_address(p["bindAddress"], p["port"]) if p["enabled"] else ""),
        ("nodeLabels.enabled", "nodeLabels.enabled", None if n["enabled"] else False),
        ("nodeLabels.prefix", "nodeLabels.prefix", n["prefix"] or None),
        ("nodeLabels.mode", "nodeLabels.mode", n.get("mode") or None),
        ("isolation.policy", "isolation.policy", i["policy"] or None),
        ("isolation.events", "isolation.events", None if i["events"] else False),
        ("health.events", "health.events", None if h["events"] else False),
        ("health.nodeConditions", "health.nodeConditions", True if h["nodeConditions"] else None),
        ("metrics.webConfig", "metrics.webConfigFile",
         "C:\\etc\\dxdp-web\\web-config.yml"
         if m["enabled"] and (m.get("existingWebConfigSecret") or m.get("webConfig")) else None),
        ("metrics.authorization", "metrics.authorization",
         "kubernetes" if authz else None),
        ("metrics.tokenAudiences", "metrics.tokenAudiences",
         list(m.get("tokenAudiences") or []) if authz and m.get("tokenAudiences") else None),
        ("metrics.allowPlainHttpTokens", "metrics.allowPlainHttpTokens",
         True if m["enabled"] and m.get("allowPlainHttpTokens") else None),
        ("validation.enabled", "validation.enabled", True if v["enabled"] else None),
        ("validation.gate", "validation.gate", True if v.get("gate") else None),
        ("startupTaint", "startupTaint", values.get("startupTaint", defaults.get("startupTaint")) or None),
    ] + [(f"validation.{k}", f"validation.{k}", v[k] or None) for k in ("interval", "timeout", "image", "hostDir")] + [
        (f"health.remediation.{k}", f"health.remediation.{k}", (h.get("remediation") or {}).get(k) or None)
        for k in ("evictPods", "cordon", "gracePeriod")]


def expected_config(values, defaults):
    """config.yaml as the chart must write it: the config value with the chart's configuration
    keys written in (one source of truth; no variable overrides the file)."""
    import copy
    config = copy.deepcopy(values.get("config") or {})
    for _, key, value in chart_keys(values, defaults):
        if value is None:
            continue
        node = config
        *parents, leaf = key.split(".")
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[leaf] = value
    return config


def validate(label, objs):
    """Strict OpenAPI validation of every object for every supported Kubernetes version."""
    # Custom resources (the Prometheus Operator's ServiceMonitor) have no schema there; their
    # shape is checked by assert_service_monitor.
    objs = [o for o in objs if not o.get("apiVersion", "").startswith("monitoring.coreos.com/")]
    for version in KUBE_VERSIONS:
        errors = []
        for o in objs:
            try:
                kubernetes_validate.validate(o, version, strict=True)
            except Exception as e:  # ValidationError, SchemaNotFoundError, ...
                name = f"{o.get('kind')}/{o.get('metadata', {}).get('name')}"
                msg = getattr(e, "message", None) or str(e)
                path = "/".join(str(p) for p in getattr(e, "path", []) or [])
                errors.append(f"{name} {path}: {msg}".strip())
        check(f"{label}: valid Kubernetes {version} (strict)", not errors, "; ".join(errors[:3]))


def metrics_on_host_ip(values):
    """Whether the chart listens on each node's own IP (metrics.bindAddress: hostIP)."""
    defaults = load_values(os.path.join(CHART, "values.yaml"))
    m = {**defaults["metrics"], **values.get("metrics", {})}
    return bool(m["enabled"]) and str(m["bindAddress"]) == "hostIP"


def assert_daemonset(label, objs, values):
    """The invariants of every rendering of the chart."""
    sets = find(objs, "DaemonSet")
    if not check(f"{label}: one DaemonSet", len(sets) == 1, f"found {len(sets)}"):
        return
    ds = sets[0]
    pod = ds["spec"]["template"]["spec"]
    win = pod.get("securityContext", {}).get("windowsOptions", {})
    check(f"{label}: HostProcess", win.get("hostProcess") is True, str(win))
    check(
        f"{label}: runs as NT AUTHORITY\\SYSTEM",
        win.get("runAsUserName") == "NT AUTHORITY\\SYSTEM",
        repr(win.get("runAsUserName")),
    )
    check(f"{label}: hostNetwork", pod.get("hostNetwork") is True)
    selector = pod.get("nodeSelector", {})
    check(f"{label}: no Windows build pin", "node.kubernetes.io/windows-build" not in selector, str(selector))
    affinity_text = yaml.safe_dump(pod.get("affinity", {}))
    check(f"{label}: no build pin in affinity", "windows-build" not in affinity_text)
    check(
        f"{label}: DaemonSet update strategy",
        ds["spec"].get("updateStrategy", {}).get("type") in ("RollingUpdate", "OnDelete"),
    )
    containers = pod["containers"]
    check(f"{label}: one container", len(containers) == 1)
    c = containers[0]
    check(f"{label}: runs `dxdp plugin`", c.get("args", [])[:1] == ["plugin"], str(c.get("args")))
    env = env_of(c)
    mounts = {m["name"]: m for m in c.get("volumeMounts", [])}
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    mount = mounts.get("config", {})
    check(f"{label}: config volume mounted read-only at {CONFIG_DIR}",
          mount.get("mountPath") == CONFIG_DIR and mount.get("readOnly") is True, str(mount))
    check(f"{label}: DXDP_CONFIG is in the config mount",
          env.get("DXDP_CONFIG") == CONFIG_DIR + "\\config.yaml", repr(env.get("DXDP_CONFIG")))
    check(f"{label}: no subPath (it would stop ConfigMap updates)", "subPath" not in mount)
    cm_name = vols.get("config", {}).get("configMap", {}).get("name")
    maps = {m["metadata"]["name"]: m for m in find(objs, "ConfigMap")}
    if values.get("existingConfigMap"):
        check(f"{label}: uses the existing ConfigMap", cm_name == values["existingConfigMap"] and not maps)
    elif check(f"{label}: the mounted ConfigMap is rendered", cm_name in maps, f"{cm_name} not in {list(maps)}"):
        text = maps[cm_name]["data"].get("config.yaml")
        check(f"{label}: ConfigMap has config.yaml", text is not None)
        want = expected_config(values, load_values(os.path.join(CHART, "values.yaml")))
        check(f"{label}: config.yaml is the config value with the chart's configuration keys written in",
              yaml.safe_load(text or "") == want, f"{text!r} != {want!r}")
        on_host_ip = metrics_on_host_ip(values)
        variables = sorted(k for k in env if k in CHART_VARIABLES
                           and not (on_host_ip and k == "DXDP_METRICS_ADDRESS"))
        check(f"{label}: no variable overrides config.yaml", not variables, str(variables))
        dxdp = dxdp_binary()
        if dxdp:
            with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
                f.write(text or "")
            p = subprocess.run([dxdp, "config", "check", f.name], capture_output=True, text=True)
            os.unlink(f.name)
            check(f"{label}: `dxdp config check` accepts config.yaml", p.returncode == 0, p.stderr.strip())
    defaults = load_values(os.path.join(CHART, "values.yaml"))
    # An existing ConfigMap cannot be written by the chart: there its values stay variables.
    by_env = bool(values.get("existingConfigMap"))
    if by_env:
        if "replicas" in values and values["replicas"] is not None:
            check(f"{label}: DXDP_REPLICAS", env.get("DXDP_REPLICAS") == str(values["replicas"]), str(env))
        else:
            check(f"{label}: DXDP_REPLICAS unset", "DXDP_REPLICAS" not in env)
    probes = {**defaults["probes"], **values.get("probes", {})}["enabled"]
    metrics = {**defaults["metrics"], **values.get("metrics", {})}
    if metrics["enabled"]:
        port = metrics["port"]
        ports = {p["name"]: p for p in c.get("ports", [])}
        check(f"{label}: metrics port {port}", ports.get("metrics", {}).get("containerPort") == port, str(ports))
        if metrics_on_host_ip(values):
            items = c.get("env", [])
            names = [e["name"] for e in items]
            host = next((e for e in items if e["name"] == "HOST_IP"), {})
            check(f"{label}: HOST_IP is the node's own IP (status.hostIP)",
                  host.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.hostIP", str(host))
            check(f"{label}: /metrics on the node's own IP: DXDP_METRICS_ADDRESS=$(HOST_IP):{port}, after HOST_IP",
                  env.get("DXDP_METRICS_ADDRESS") == f"$(HOST_IP):{port}" and "HOST_IP" in names
                  and names.index("HOST_IP") < names.index("DXDP_METRICS_ADDRESS"), str(names))
        else:
            check(f"{label}: no HOST_IP unless metrics.bindAddress is hostIP", "HOST_IP" not in env, str(env))
            if by_env:
                check(f"{label}: DXDP_METRICS_ADDRESS on port {port}",
                      (env.get("DXDP_METRICS_ADDRESS") or "").endswith(f":{port}"), str(env))
        if by_env:
            authz = metrics.get("authorization") == "kubernetes"
            audiences = ",".join(metrics.get("tokenAudiences") or []) if authz else ""
            check(f"{label}: DXDP_METRICS_TOKEN_AUDIENCES is metrics.tokenAudiences",
                  env.get("DXDP_METRICS_TOKEN_AUDIENCES") == (audiences or None), str(env))
            check(f"{label}: DXDP_METRICS_ALLOW_PLAIN_HTTP_TOKENS with metrics.allowPlainHttpTokens",
                  env.get("DXDP_METRICS_ALLOW_PLAIN_HTTP_TOKENS")
                  == ("true" if metrics.get("allowPlainHttpTokens") else None), str(env))
    if probes:
        probe = {**defaults["probes"], **values.get("probes", {})}
        address, port = str(probe["bindAddress"]), probe["port"]
        if by_env:
            check(f"{label}: DXDP_PROBE_ADDRESS {address}:{port}",
                  env.get("DXDP_PROBE_ADDRESS") == socket_address(address, port), str(env))
        # The probes' own listener: on the loopback the kubelet (on the node) calls 127.0.0.1.
        host = None if address in ("0.0.0.0", "::", "[::]") else address.strip("[]")
        for kind, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
            get = c.get(kind, {}).get("httpGet", {})
            check(f"{label}: {kind} GET {path} on the probe listener",
                  get.get("path") == path and get.get("port") == port and get.get("host") == host, str(get))
            # A clash on the metrics port must never fail liveness (and restart device serving).
            check(f"{label}: {kind} does not use the metrics port",
                  get.get("port") != metrics["port"] and get.get("port") != "metrics", str(get))
    else:
        check(f"{label}: no probes when probes.enabled is false",
              "livenessProbe" not in c and "readinessProbe" not in c)
    if not metrics["enabled"] and by_env:
        check(f"{label}: no metrics endpoint when metrics.enabled is false", "DXDP_METRICS_ADDRESS" not in env)
    assert_service_monitor(label, objs, metrics, pod_labels=ds["spec"]["template"]["metadata"].get("labels", {}))
    assert_node_api(label, objs, values, defaults, pod, c)
    assert_validation(label, objs, values, defaults, pod, c)
    assert_node_feature(label, objs, values, defaults, pod, c)
    assert_cleanup_hook(label, objs, values, defaults, ds)
    assert_policies(label, objs, values, defaults, pod)
    for o in objs:
        if o["kind"] not in CLUSTER_SCOPED and o["metadata"].get("namespace") != NAMESPACE:
            fail(f"{label}: {o['kind']} in the release namespace", str(o["metadata"].get("namespace")))
            break
    else:
        ok(f"{label}: every object in the release namespace")


CLUSTER_SCOPED = ("Namespace", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
                  "ValidatingAdmissionPolicyBinding")

# The variables the chart sets only with existingConfigMap (else it writes config.yaml).
CHART_VARIABLES = ("DXDP_REPLICAS", "DXDP_LOG_LEVEL", "DXDP_LOG_FORMAT", "DXDP_METRICS_ADDRESS",
                   "DXDP_PROBE_ADDRESS", "DXDP_NODE_LABELS", "DXDP_NODE_LABEL_PREFIX",
                   "DXDP_NODE_LABEL_MODE",
                   "DXDP_ISOLATION_POLICY", "DXDP_ISOLATION_EVENTS", "DXDP_WEB_CONFIG_FILE",
                   "DXDP_METRICS_AUTHORIZATION", "DXDP_METRICS_TOKEN_AUDIENCES",
                   "DXDP_METRICS_ALLOW_PLAIN_HTTP_TOKENS", "DXDP_HEALTH_EVENTS", "DXDP_NODE_CONDITIONS",
                   "DXDP_VALIDATION", "DXDP_VALIDATION_INTERVAL",
                   "DXDP_VALIDATION_TIMEOUT", "DXDP_VALIDATION_IMAGE", "DXDP_VALIDATION_HOST_DIR")

# The only permissions dxdp needs: its own Node, read, watched, labelled and tainted; with
# isolation.events or health.events, creating Events (about GPU isolation violations and
# Unhealthy GPUs on pods); with health.nodeConditions, patching its Node's status.
NODE_RULES = [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "watch", "patch"]}]
EVENT_RULES = [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
STATUS_RULES = [{"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]}]
EVICTION_RULES = [{"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]}]
REVIEW_RULES = [
    {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
    {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
]
READER_RULES = [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
ISOLATION_TAINT = "directx.microsoft.com/isolation-violation"


def assert_node_api(label, objs, values, defaults, pod, c):
    """With nodeApi.enabled: NODE_NAME, the token, and exactly get/watch/patch on nodes bound to
    the plugin's service account. Without: no token, no RBAC, no NODE_NAME."""
    node_api = {**defaults["nodeApi"], **values.get("nodeApi", {})}["enabled"]
    labels = {**defaults["nodeLabels"], **values.get("nodeLabels", {})}
    isolation = {**defaults["isolation"], **values.get("isolation", {})}
    health = {**defaults["health"], **values.get("health", {})}
    evict = bool((health.get("remediation") or {}).get("evictPods")
                 or (((values.get("config") or {}).get("health") or {}).get("remediation") or {}).get("evictPods"))
    events = isolation["events"] or health["events"] or evict
    conditions = health["nodeConditions"] or bool(((values.get("config") or {}).get("health") or {}).get("nodeConditions"))
    env = env_of(c)
    by_env = bool(values.get("existingConfigMap"))
    check(f"{label}: dxdp tolerates the startup taint directx.microsoft.com/gpu-not-ready",
          any(t.get("key") == "directx.microsoft.com/gpu-not-ready" and t.get("operator") == "Exists" for t in pod.get("tolerations", [])),
          str(pod.get("tolerations")))
    check(f"{label}: dxdp tolerates its own isolation taint",
          any(t.get("key") == ISOLATION_TAINT and t.get("effect") == "NoSchedule" for t in pod.get("tolerations", [])),
          str(pod.get("tolerations")))
    if by_env:
        check(f"{label}: DXDP_ISOLATION_POLICY is isolation.policy",
              env.get("DXDP_ISOLATION_POLICY") == (isolation["policy"] or None), str(env))
        check(f"{label}: DXDP_ISOLATION_EVENTS=false exactly when isolation.events is off",
              env.get("DXDP_ISOLATION_EVENTS") == (None if isolation["events"] else "false"), str(env))
        check(f"{label}: DXDP_HEALTH_EVENTS=false exactly when health.events is off",
              env.get("DXDP_HEALTH_EVENTS") == (None if health["events"] else "false"), str(env))
        check(f"{label}: DXDP_NODE_CONDITIONS=true exactly when health.nodeConditions is on",
              env.get("DXDP_NODE_CONDITIONS") == ("true" if health["nodeConditions"] else None), str(env))
    node_name = [e for e in c.get("env", []) if e["name"] == "NODE_NAME"]
    metrics = {**defaults["metrics"], **values.get("metrics", {})}
    authz = metrics.get("authorization") == "kubernetes"
    rbac = [o for o in objs if o.get("kind") in ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")
            and not is_hook(o) and not is_validation_rbac(o) and not is_node_feature_rbac(o)
            and not is_scraper(o)]
    if by_env:
        check(f"{label}: DXDP_METRICS_AUTHORIZATION=kubernetes exactly with metrics.authorization=kubernetes",
              env.get("DXDP_METRICS_AUTHORIZATION") == ("kubernetes" if authz and metrics["enabled"] else None),
              str(env))
    readers = [o for o in find(objs, "ClusterRole") if o["metadata"]["name"].endswith("-metrics-reader")]
    check(f"{label}: a metrics-reader ClusterRole (get /metrics) exactly with metrics.authorization=kubernetes",
          [r.get("rules") for r in readers] == ([READER_RULES] if authz else []), str(readers))
    rbac = [o for o in rbac if o not in readers]
    if not node_api and authz:
        check(f"{label}: without nodeApi, metrics.authorization=kubernetes mounts the token",
              pod.get("automountServiceAccountToken") is True)
        roles = find(objs, "ClusterRole")
        roles = [r for r in roles if r not in readers]
        check(f"{label}: without nodeApi, the role grants only the reviews",
              len(roles) == 1 and roles[0].get("rules") == REVIEW_RULES, str(roles))
        check(f"{label}: no NODE_NAME without nodeApi", not node_name)
        return
    if not node_api:
        check(f"{label}: no RBAC objects without nodeApi", not rbac, str([o["kind"] for o in rbac]))
        check(f"{label}: no service account token without nodeApi", pod.get("automountServiceAccountToken") is False)
        check(f"{label}: no NODE_NAME without nodeApi", not node_name)
        return
    check(f"{label}: NODE_NAME from spec.nodeName",
          len(node_name) == 1 and node_name[0].get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "spec.nodeName",
          str(node_name))
    check(f"{label}: service account token mounted", pod.get("automountServiceAccountToken") is True)
    for sa in find(objs, "ServiceAccount"):
        if not is_scraper(sa):
            check(f"{label}: the ServiceAccount allows its token", sa.get("automountServiceAccountToken") is not False)
    roles = [r for r in find(objs, "ClusterRole") if r not in readers]
    bindings = [b for b in find(objs, "ClusterRoleBinding") if not is_scraper(b)]
    check(f"{label}: only a ClusterRole and its binding", len(roles) == 1 and len(bindings) == 1 and len(rbac) == 2,
          str([o["kind"] for o in rbac]))
    if roles:
        want = (NODE_RULES + (REVIEW_RULES if authz else []) + (EVENT_RULES if events else [])
                + (EVICTION_RULES if evict else []) + (STATUS_RULES if conditions else []))
        check(f"{label}: the role grants exactly get, watch and patch on nodes"
              + (" and create on events" if events else "")
              + (" and create on pods/eviction" if evict else "")
              + (" and patch on nodes/status" if conditions else ""),
              roles[0].get("rules") == want, str(roles[0].get("rules")))
    if roles and bindings:
        b = bindings[0]
        ref = b.get("roleRef", {})
        check(f"{label}: the binding refers to the role",
              ref.get("kind") == "ClusterRole" and ref.get("name") == roles[0]["metadata"]["name"], str(ref))
        sa_name = pod.get("serviceAccountName")
        check(f"{label}: the binding's subject is the pod's service account",
              b.get("subjects") == [{"kind": "ServiceAccount", "name": sa_name, "namespace": NAMESPACE}],
              str(b.get("subjects")))
    if not by_env:
        return
    if labels["enabled"]:
        check(f"{label}: node labels on (DXDP_NODE_LABELS unset)", "DXDP_NODE_LABELS" not in env)
    else:
        check(f"{label}: DXDP_NODE_LABELS=false", env.get("DXDP_NODE_LABELS") == "false", str(env))
    check(f"{label}: DXDP_NODE_LABEL_PREFIX is nodeLabels.prefix",
          env.get("DXDP_NODE_LABEL_PREFIX") == (labels["prefix"] or None), str(env))
    check(f"{label}: DXDP_NODE_LABEL_MODE is nodeLabels.mode",
          env.get("DXDP_NODE_LABEL_MODE") == (labels.get("mode") or None), str(env))


# In-cluster validation (validation.enabled): Jobs, their pods read-only, and Events, in the
# release namespace only.
VALIDATION_RULES = [
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create", "get", "list", "watch", "delete"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
]
VALIDATION_VARIABLES = {"interval": "DXDP_VALIDATION_INTERVAL", "timeout": "DXDP_VALIDATION_TIMEOUT",
                        "image": "DXDP_VALIDATION_IMAGE", "hostDir": "DXDP_VALIDATION_HOST_DIR"}


def is_scraper(o):
    """The identity the ServiceMonitor scrapes with (metrics.authorization=kubernetes)."""
    return o.get("kind") in ("ServiceAccount", "Secret", "ClusterRoleBinding") and \
        o["metadata"]["name"].endswith(("-metrics-scraper", "-metrics-scraper-token"))


def is_node_feature_rbac(o):
    return o.get("kind") in ("Role", "RoleBinding") and o["metadata"]["name"].endswith("-nodefeature")


# nodeLabels.mode: nodefeature: the NodeFeature objects, in the release namespace only.
NODE_FEATURE_RULES = [
    {"apiGroups": ["nfd.k8s-sigs.io"], "resources": ["nodefeatures"], "verbs": ["get", "create", "patch", "delete"]},
]


def node_feature_mode(values, defaults):
    """nodeLabels.mode (the chart value, else config's) is nodefeature (labels on or off: off
    empties the object)."""
    labels = {**defaults["nodeLabels"], **values.get("nodeLabels", {})}
    config = (values.get("config") or {}).get("nodeLabels") or {}
    return (labels.get("mode") or config.get("mode") or "node") == "nodefeature"


def assert_node_feature(label, objs, values, defaults, pod, c):
    """With nodeLabels.mode: nodefeature (and nodeApi): a Role with exactly NODE_FEATURE_RULES in
    the release namespace bound to the pod's service account, and POD_NAMESPACE. Without: no such
    Role."""
    node_api = {**defaults["nodeApi"], **values.get("nodeApi", {})}["enabled"]
    on = node_api and node_feature_mode(values, defaults)
    roles = [o for o in find(objs, "Role") if is_node_feature_rbac(o)]
    bindings = [o for o in find(objs, "RoleBinding") if is_node_feature_rbac(o)]
    if not on:
        check(f"{label}: no NodeFeature Role without nodeLabels.mode: nodefeature",
              not roles and not bindings, str([o["kind"] for o in roles + bindings]))
        return
    check(f"{label}: the NodeFeature Role grants exactly get, create, patch and delete of nodefeatures in the release namespace",
          len(roles) == 1 and roles[0].get("rules") == NODE_FEATURE_RULES
          and roles[0]["metadata"].get("namespace") == NAMESPACE, str([r.get("rules") for r in roles]))
    check(f"{label}: the NodeFeature RoleBinding binds it to the pod's service account",
          len(bindings) == 1 and roles and bindings[0]["roleRef"] == {
              "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": roles[0]["metadata"]["name"]}
          and bindings[0].get("subjects") == [{"kind": "ServiceAccount", "name": pod.get("serviceAccountName"),
                                               "namespace": NAMESPACE}], str(bindings))
    pod_ns = [e for e in c.get("env", []) if e["name"] == "POD_NAMESPACE"]
    check(f"{label}: POD_NAMESPACE from metadata.namespace (the NodeFeature object's namespace)",
          len(pod_ns) == 1 and pod_ns[0].get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
          == "metadata.namespace", str(pod_ns))


def is_validation_rbac(o):
    return o.get("kind") in ("Role", "RoleBinding") and o["metadata"]["name"].endswith("-validation")


def assert_validation(label, objs, values, defaults, pod, c):
    """With validation.enabled (the chart value or config.validation.enabled): a Role with exactly
    VALIDATION_RULES in the release namespace bound to the pod's service account, and
    POD_NAMESPACE; with existingConfigMap the values as DXDP_VALIDATION* variables. Without: none
    of it."""
    validation = {**defaults["validation"], **values.get("validation", {})}
    config = (values.get("config") or {}).get("validation") or {}
    enabled = bool(validation["enabled"] or config.get("enabled"))
    env = env_of(c)
    roles = [o for o in find(objs, "Role") if is_validation_rbac(o)]
    bindings = [o for o in find(objs, "RoleBinding") if is_validation_rbac(o)]
    pod_ns = [e for e in c.get("env", []) if e["name"] == "POD_NAMESPACE"]
    if not enabled:
        node_api = {**defaults["nodeApi"], **values.get("nodeApi", {})}["enabled"]
        # nodeLabels.mode: nodefeature sets POD_NAMESPACE too (assert_node_feature).
        ns_wanted = node_api and node_feature_mode(values, defaults)
        check(f"{label}: no validation Role, nor POD_NAMESPACE but for nodeLabels.mode: nodefeature, without validation.enabled",
              not roles and not bindings and bool(pod_ns) == ns_wanted, str([o["kind"] for o in roles + bindings]))
        return
    check(f"{label}: the validation Role grants exactly Jobs, pods (read-only) and events in the release namespace",
          len(roles) == 1 and roles[0].get("rules") == VALIDATION_RULES
          and roles[0]["metadata"].get("namespace") == NAMESPACE, str([r.get("rules") for r in roles]))
    check(f"{label}: the validation RoleBinding binds it to the pod's service account",
          len(bindings) == 1 and roles and bindings[0]["roleRef"] == {
              "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": roles[0]["metadata"]["name"]}
          and bindings[0].get("subjects") == [{"kind": "ServiceAccount", "name": pod.get("serviceAccountName"),
                                               "namespace": NAMESPACE}], str(bindings))
    check(f"{label}: POD_NAMESPACE from metadata.namespace (the Jobs' namespace)",
          len(pod_ns) == 1 and pod_ns[0].get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
          == "metadata.namespace", str(pod_ns))
    if values.get("existingConfigMap"):
        want = {n: validation[k] or None for k, n in VALIDATION_VARIABLES.items()}
        want["DXDP_VALIDATION"] = "true" if validation["enabled"] else None
        got = {n: env.get(n) for n in want}
        check(f"{label}: the validation values as DXDP_VALIDATION* variables", got == want, f"{got} != {want}")


CLEANUP_RULES = [
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]},
    {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
]


def cleanup_namespaced_rules(daemonset):
    """The hook's Role in the release namespace: this DaemonSet only, the validation Jobs and the
    NodeFeature objects."""
    return [
        {"apiGroups": ["apps"], "resources": ["daemonsets"], "resourceNames": [daemonset],
         "verbs": ["get", "delete"]},
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["list", "delete"]},
        {"apiGroups": ["nfd.k8s-sigs.io"], "resources": ["nodefeatures"], "verbs": ["list", "delete"]},
    ]


def assert_cleanup_hook(label, objs, values, defaults, ds):
    """With cleanup.enabled: a pre-delete hook Job running `dxdp cleanup --all --namespace NS
    --daemonset NAME` as HostProcess on the DaemonSet's nodes with the DaemonSet's image, bound to
    roles with exactly what cleanup
    needs, created before the Job. Without: no hook at all."""
    cleanup = {**defaults["cleanup"], **values.get("cleanup", {})}
    hooks = [o for o in objs if is_hook(o)]
    if not cleanup["enabled"]:
        check(f"{label}: no Helm hooks when cleanup.enabled is false", not hooks,
              str([o["kind"] for o in hooks]))
        return
    jobs = find(objs, "Job", hooks=True)
    if not check(f"{label}: one cleanup hook Job", len(jobs) == 1, f"found {len(jobs)}"):
        return
    job = jobs[0]
    notes = job["metadata"].get("annotations", {})
    check(f"{label}: the cleanup Job is a pre-delete hook after its RBAC",
          notes.get("helm.sh/hook") == "pre-delete"
          and all(int(o["metadata"]["annotations"].get("helm.sh/hook-weight", "0"))
                  < int(notes.get("helm.sh/hook-weight", "0")) for o in hooks if o is not job)
          and all(o["metadata"]["annotations"].get("helm.sh/hook") == "pre-delete" for o in hooks),
          str(notes))
    spec = job["spec"]
    pod = spec["template"]["spec"]
    dpod = ds["spec"]["template"]["spec"]
    c = pod["containers"][0]
    ds_name = ds["metadata"]["name"]
    want_args = ["cleanup", "--all", "--namespace", NAMESPACE, "--daemonset", ds_name,
                 "--wait", str(cleanup["waitSeconds"])]
    check(f"{label}: the cleanup Job stops the DaemonSet {ds_name} first, then runs `dxdp cleanup --all`, with the DaemonSet's image",
          c.get("args") == want_args and c.get("image") == dpod["containers"][0]["image"],
          f"{c.get('args')} {c.get('image')}")
    check(f"{label}: the cleanup Job waits for the DaemonSet's pods less long than its own deadline",
          cleanup["waitSeconds"] < cleanup["activeDeadlineSeconds"], str(cleanup))
    check(f"{label}: the cleanup Job is HostProcess on the DaemonSet's nodes",
          pod.get("securityContext", {}).get("windowsOptions", {}).get("hostProcess") is True
          and pod.get("hostNetwork") is True
          and pod.get("nodeSelector") == dpod.get("nodeSelector")
          and pod.get("tolerations") == dpod.get("tolerations"), str(pod.get("nodeSelector")))
    user = pod.get("securityContext", {}).get("windowsOptions", {}).get("runAsUserName")
    check(f"{label}: the cleanup Job runs as cleanup.runAsUserName ({cleanup['runAsUserName']}); "
          "Local service, not SYSTEM, by default",
          user == cleanup["runAsUserName"] and defaults["cleanup"]["runAsUserName"] == "NT AUTHORITY\\Local service",
          repr(user))
    check(f"{label}: the cleanup Job is bounded (activeDeadlineSeconds {cleanup['activeDeadlineSeconds']})",
          spec.get("activeDeadlineSeconds") == cleanup["activeDeadlineSeconds"] and pod.get("restartPolicy") == "Never")
    ds_selector = ds["spec"]["selector"]["matchLabels"]
    pod_labels = spec["template"]["metadata"].get("labels", {})
    check(f"{label}: the DaemonSet's selector does not select the cleanup pod",
          not all(pod_labels.get(k) == v for k, v in ds_selector.items()), str(pod_labels))
    roles = find(objs, "ClusterRole", hooks=True)
    roles = [r for r in roles if is_hook(r)]
    bindings = [b for b in find(objs, "ClusterRoleBinding", hooks=True) if is_hook(b)]
    check(f"{label}: the cleanup role grants exactly get/list/patch nodes and patch nodes/status",
          len(roles) == 1 and roles[0].get("rules") == CLEANUP_RULES, str([r.get("rules") for r in roles]))
    check(f"{label}: the cleanup binding binds that role to the Job's service account",
          len(bindings) == 1 and roles and bindings[0]["roleRef"]["name"] == roles[0]["metadata"]["name"]
          and bindings[0].get("subjects") == [{"kind": "ServiceAccount", "name": pod.get("serviceAccountName"),
                                               "namespace": NAMESPACE}],
          str(bindings))
    nroles = [r for r in find(objs, "Role", hooks=True) if is_hook(r)]
    nbindings = [b for b in find(objs, "RoleBinding", hooks=True) if is_hook(b)]
    check(f"{label}: the cleanup Role grants get/delete on the DaemonSet {ds_name} only and list/delete on jobs and nodefeatures, in {NAMESPACE}",
          len(nroles) == 1 and nroles[0].get("rules") == cleanup_namespaced_rules(ds_name)
          and nroles[0]["metadata"].get("namespace") == NAMESPACE, str([r.get("rules") for r in nroles]))
    check(f"{label}: the cleanup RoleBinding binds that Role to the Job's service account",
          len(nbindings) == 1 and nroles and nbindings[0]["roleRef"] == {
              "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": nroles[0]["metadata"]["name"]}
          and nbindings[0].get("subjects") == [{"kind": "ServiceAccount", "name": pod.get("serviceAccountName"),
                                                "namespace": NAMESPACE}],
          str(nbindings))


# ---------------------------------------------------------------------------------------------
# The admission policies (nodeApi.enforceOwnNode): own-node-policy.yaml holds dxdp's token to its
# own Node, validation-policy.yaml to its own validation Job shape. Their CEL is evaluated here
# by cel-python (celpy), a CEL implementation outside the API server, on written-out requests:
# what the API server itself would decide is not tested (no kube-apiserver is reachable from CI).

POLICY_NODE = "-own-node"
POLICY_JOB = "-validation-job"
POLICY_NODE_FEATURE = "-own-nodefeature"
NODE_NAME_CLAIM = "authentication.kubernetes.io/node-name"
SERVICE_ACCOUNT = f"system:serviceaccount:{NAMESPACE}:{RELEASE}"


def policies_of(objs):
    """{suffix: (policy, binding)} of the rendered admission policies."""
    out = {}
    for suffix in (POLICY_NODE, POLICY_JOB, POLICY_NODE_FEATURE):
        pol = [o for o in find(objs, "ValidatingAdmissionPolicy") if o["metadata"]["name"].endswith(suffix)]
        bnd = [o for o in find(objs, "ValidatingAdmissionPolicyBinding") if o["metadata"]["name"].endswith(suffix)]
        if pol or bnd:
            out[suffix] = (pol, bnd)
    return out


def assert_policies(label, objs, values, defaults, pod):
    """With nodeApi.enabled and nodeApi.enforceOwnNode (both on by default): the own-node policy
    on nodes and nodes/status (CREATE, UPDATE, DELETE) for dxdp's service account, failing closed,
    and its Deny binding; with validation on, the Job policy on jobs likewise. Otherwise none."""
    node_api = {**defaults["nodeApi"], **values.get("nodeApi", {})}
    validation = {**defaults["validation"], **values.get("validation", {})}
    config = (values.get("config") or {}).get("validation") or {}
    enforce = node_api["enabled"] and node_api["enforceOwnNode"]
    want = {POLICY_NODE: enforce, POLICY_JOB: enforce and bool(validation["enabled"] or config.get("enabled")),
            POLICY_NODE_FEATURE: enforce and node_feature_mode(values, defaults)}
    got = policies_of(objs)
    check(f"{label}: admission policies exactly {[k for k, v in want.items() if v]}",
          sorted(got) == sorted(k for k, v in want.items() if v), str(sorted(got)))
    user = f"system:serviceaccount:{NAMESPACE}:{pod.get('serviceAccountName')}"
    rules = {POLICY_NODE: [{"apiGroups": [""], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE", "DELETE"],
                            "resources": ["nodes", "nodes/status"]}],
             POLICY_JOB: [{"apiGroups": ["batch"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE", "DELETE"],
                           "resources": ["jobs"]}],
             POLICY_NODE_FEATURE: [{"apiGroups": ["nfd.k8s-sigs.io"], "apiVersions": ["*"],
                                    "operations": ["CREATE", "UPDATE", "DELETE"], "resources": ["nodefeatures"]}]}
    for suffix, (pol, bnd) in got.items():
        if not check(f"{label}: one policy{suffix} and one binding", len(pol) == 1 and len(bnd) == 1,
                     f"{len(pol)} policies, {len(bnd)} bindings"):
            continue
        spec, bspec = pol[0]["spec"], bnd[0]["spec"]
        conds = spec.get("matchConditions", [])
        check(f"{label}: policy{suffix} fails closed and matches {rules[suffix][0]['resources']} of dxdp's service account only",
              spec.get("failurePolicy") == "Fail"
              and spec.get("matchConstraints", {}).get("resourceRules") == rules[suffix]
              and len(conds) == 1 and conds[0]["expression"] == f'request.userInfo.username == "{user}"'
              and "paramKind" not in spec,
              f"{spec.get('matchConstraints')} {conds}")
        check(f"{label}: binding{suffix} denies with policy{suffix}, for every object it matches",
              bspec == {"policyName": pol[0]["metadata"]["name"], "validationActions": ["Deny"]}, str(bspec))


def cel_program(env, expr, cache={}):
    """A fresh program for `expr` (celpy's programs keep state between evaluations; the parsed
    expression is kept)."""
    if expr not in cache:
        cache[expr] = env.compile(expr)
    return env.program(cache[expr])


def admit(policy, request, obj=None, old=None):
    """What `policy` decides for a request, as the API server evaluates a ValidatingAdmissionPolicy
    (matchConditions, then the variables in order, then every validation; an error denies with
    failurePolicy Fail). Returns (admitted, [messages of the validations that denied])."""
    import celpy
    env = celpy.Environment()
    cel = celpy.json_to_cel
    act = {"request": cel(request), "object": cel(obj), "oldObject": cel(old)}
    for c in policy["spec"].get("matchConditions", []):
        try:
            matched = bool(cel_program(env, c["expression"]).evaluate(act))
        except celpy.CELEvalError as e:
            return False, [f"matchCondition {c['name']}: error: {e}"]
        if not matched:
            return True, ["not matched"]
    variables = celpy.celtypes.MapType({})
    act["variables"] = variables
    for v in policy["spec"].get("variables", []):
        try:
            value = cel_program(env, v["expression"]).evaluate(act)
        except celpy.CELEvalError as e:  # an error is a value; a validation that uses it errs
            value = e
        variables[celpy.celtypes.StringType(v["name"])] = value
    denied = []
    for v in policy["spec"]["validations"]:
        try:
            result = cel_program(env, v["expression"]).evaluate(act)
        except Exception as e:  # CELEvalError, or celpy's own TypeError on an error operand
            denied.append(f"error: {str(e)[:200]}")
            continue
        if not (isinstance(result, celpy.celtypes.BoolType) and bool(result)):
            denied.append(v.get("message", v["expression"]))
    return not denied, denied


def node_request(operation, claim=("gpu-node-1",), user=SERVICE_ACCOUNT, subresource=""):
    extra = {NODE_NAME_CLAIM: list(claim), "authentication.kubernetes.io/pod-name": ["dxdp-abcde"]} if claim else {}
    user_info = {"username": user, "uid": "u-1", "groups": ["system:serviceaccounts", "system:authenticated"]}
    if extra:
        user_info["extra"] = extra
    return {"operation": operation, "name": "gpu-node-1", "subResource": subresource,
            "resource": {"group": "", "version": "v1", "resource": "nodes"}, "userInfo": user_info}


# A Windows GPU node as the API server holds it (trimmed), before dxdp writes.
NODE = {
    "apiVersion": "v1", "kind": "Node",
    "metadata": {
        "name": "gpu-node-1", "uid": "0b7e7c1e-1", "resourceVersion": "1001", "creationTimestamp": "2026-11-28T10:00:00Z",
        "labels": {"kubernetes.io/os": "windows", "kubernetes.io/hostname": "gpu-node-1",
                   "node.kubernetes.io/windows-build": "10.0.20348", "agentpool": "gpuwin",
                   "directx.microsoft.com/display.count": "1",
                   "directx.microsoft.com/device-plugin.config": "t4"},
        "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        "managedFields": [{"manager": "kubelet", "operation": "Update", "apiVersion": "v1"}],
    },
    "spec": {"podCIDR": "10.244.3.0/24", "providerID": "azure:///x",
             "taints": [{"key": "sku", "value": "gpu", "effect": "NoSchedule"}]},
    "status": {
        "capacity": {"cpu": "8", "directx.microsoft.com/display": "1"},
        "allocatable": {"cpu": "8", "directx.microsoft.com/display": "1"},
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"},
                       {"type": "DirectXGPUHealthy", "status": "True", "reason": "AllHealthy"}],
        "nodeInfo": {"kubeletVersion": "v1.31.2", "operatingSystem": "windows"},
    },
}


def edited(base, edit):
    """A deep copy of `base` changed by `edit(copy)`, with what every write changes besides
    (resourceVersion, managedFields)."""
    import copy
    o = copy.deepcopy(base)
    edit(o)
    if o is not None and base is not None:
        o["metadata"]["resourceVersion"] = str(int(base["metadata"]["resourceVersion"]) + 1)
        o["metadata"]["managedFields"] = base["metadata"]["managedFields"] + [{"manager": "dxdp", "operation": "Apply"}]
    return o


def set_label(k, v):
    return lambda n: n["metadata"]["labels"].__setitem__(k, v)


def drop_label(k):
    return lambda n: n["metadata"]["labels"].pop(k)


def add_taint(t):
    return lambda n: n["spec"]["taints"].append(t)


def set_condition(c):
    def edit(n):
        rest = [x for x in n["status"]["conditions"] if x["type"] != c["type"]]
        n["status"]["conditions"] = rest + [c]
    return edit


ISOLATION_TAINT_ON = {"key": ISOLATION_TAINT, "effect": "NoSchedule"}

# (case, request, edit of NODE or None (CREATE/DELETE), admitted)
NODE_CASES = [
    ("own node: dxdp changes its label", node_request("UPDATE"), set_label("directx.microsoft.com/display.count", "2"), True),
    ("own node: dxdp adds its labels", node_request("UPDATE"),
     lambda n: n["metadata"]["labels"].update({"directx.microsoft.com/memory": "16384", "directx.microsoft.com/api.cuda": "true"}), True),
    ("own node: dxdp removes its label", node_request("UPDATE"), drop_label("directx.microsoft.com/display.count"), True),
    ("own node: the validation labels", node_request("UPDATE"),
     lambda n: n["metadata"]["labels"].update({"directx.microsoft.com/validated": "true",
                                               "directx.microsoft.com/api.d3d12.validated": "true"}), True),
    ("own node: dxdp's taint on", node_request("UPDATE"), add_taint(ISOLATION_TAINT_ON), True),
    ("own node: dxdp's conditions", node_request("UPDATE", subresource="status"),
     set_condition({"type": "DirectXGPUIsolation", "status": "False", "reason": "Violation"}), True),
    ("own node: a no-op write", node_request("UPDATE"), lambda n: None, True),
    ("another node", node_request("UPDATE", claim=("gpu-node-2",)), set_label("directx.microsoft.com/display.count", "2"), False),
    ("a token without the node-name claim", node_request("UPDATE", claim=()),
     set_label("directx.microsoft.com/display.count", "2"), False),
    ("a claim with two values", node_request("UPDATE", claim=("gpu-node-1", "gpu-node-2")),
     set_label("directx.microsoft.com/display.count", "2"), False),
    ("another label added", node_request("UPDATE"), set_label("node-role.kubernetes.io/control-plane", ""), False),
    ("another label changed", node_request("UPDATE"), set_label("agentpool", "other"), False),
    ("another label removed", node_request("UPDATE"), drop_label("kubernetes.io/hostname"), False),
    ("the configuration selector label (the operator's) changed", node_request("UPDATE"),
     set_label("directx.microsoft.com/device-plugin.config", "other"), False),
    ("an annotation added", node_request("UPDATE"),
     lambda n: n["metadata"]["annotations"].__setitem__("x", "y"), False),
    ("another taint added", node_request("UPDATE"), add_taint({"key": "evil", "effect": "NoExecute"}), False),
    ("another taint removed", node_request("UPDATE"), lambda n: n["spec"].__setitem__("taints", []), False),
    ("dxdp's taint key with NoExecute", node_request("UPDATE"),
     add_taint({"key": ISOLATION_TAINT, "effect": "NoExecute"}), False),
    ("spec.unschedulable", node_request("UPDATE"), lambda n: n["spec"].__setitem__("unschedulable", True), False),
    ("spec.providerID changed", node_request("UPDATE"), lambda n: n["spec"].__setitem__("providerID", "x"), False),
    ("another condition (Ready) changed", node_request("UPDATE", subresource="status"),
     set_condition({"type": "Ready", "status": "False", "reason": "Evil"}), False),
    ("status.allocatable changed", node_request("UPDATE", subresource="status"),
     lambda n: n["status"]["allocatable"].__setitem__("nvidia.com/gpu", "8"), False),
    ("creating a Node", node_request("CREATE"), None, False),
    ("deleting a Node", node_request("DELETE"), None, False),
]


def job_request(operation, claim=("AKSWIN000001",), namespace=NAMESPACE):
    user_info = {"username": SERVICE_ACCOUNT, "uid": "u-1"}
    if claim:
        user_info["extra"] = {NODE_NAME_CLAIM: list(claim)}
    return {"operation": operation, "namespace": namespace,
            "resource": {"group": "batch", "version": "v1", "resource": "jobs"}, "userInfo": user_info}


# What the API server adds to a Job before validating admission (SetDefaults_PodSpec,
# SetDefaults_Container, the Job's defaults and its generated selector labels).
def job_as_admitted(job):
    import copy
    j = copy.deepcopy(job)
    spec = j["spec"]
    spec.update({"completions": 1, "parallelism": 1, "completionMode": "NonIndexed", "suspend": False,
                 "podReplacementPolicy": "TerminatingOrFailed", "manualSelector": False,
                 "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": "c-1"}}})
    spec["template"]["metadata"]["labels"].update({"batch.kubernetes.io/controller-uid": "c-1",
                                                   "batch.kubernetes.io/job-name": j["metadata"]["name"],
                                                   "controller-uid": "c-1", "job-name": j["metadata"]["name"]})
    pod = spec["template"]["spec"]
    pod.update({"dnsPolicy": "ClusterFirst", "schedulerName": "default-scheduler", "terminationGracePeriodSeconds": 30})
    pod.setdefault("securityContext", {})
    for c in pod["containers"]:
        c.setdefault("terminationMessagePath", "/dev/termination-log")
        c.setdefault("imagePullPolicy", "IfNotPresent")
    return j


JOB_FIXTURE = os.path.join(ROOT, "tests", "fixtures", "validation-job.json")


def job_cases(job):
    """(case, request, object, oldObject, admitted) for the validation policy; `job` is dxdp's
    own Job (the unit test's fixture) as admitted."""
    import copy

    def variant(edit):
        j = copy.deepcopy(job)
        edit(j)
        return j

    def pod(j):
        return j["spec"]["template"]["spec"]

    def container(j):
        return pod(j)["containers"][0]

    create = job_request("CREATE")
    return [
        ("dxdp's own Job (tests/fixtures/validation-job.json)", create, job, None, True),
        ("another node's Job", job_request("CREATE", claim=("AKSWIN000002",)), job, None, False),
        ("a token without the node-name claim", job_request("CREATE", claim=()), job, None, False),
        ("another namespace", job_request("CREATE", namespace="kube-system"), job, None, False),
        ("HostProcess (pod)", create, variant(lambda j: pod(j)["securityContext"]["windowsOptions"].update(
            {"hostProcess": True})), None, False),
        ("HostProcess (container)", create, variant(lambda j: container(j).__setitem__(
            "securityContext", {"windowsOptions": {"hostProcess": True}})), None, False),
        ("privileged", create, variant(lambda j: container(j).__setitem__("securityContext", {"privileged": True})),
         None, False),
        ("run as another user", create, variant(lambda j: pod(j)["securityContext"]["windowsOptions"].update(
            {"runAsUserName": "NT AUTHORITY\\SYSTEM"})), None, False),
        ("host network", create, variant(lambda j: pod(j).__setitem__("hostNetwork", True)), None, False),
        ("another image", create, variant(lambda j: container(j).__setitem__("image", "evil.example.com/x:1")),
         None, False),
        ("another command", create, variant(lambda j: container(j).__setitem__("command", ["cmd.exe", "/c", "x"])),
         None, False),
        ("an extra volume (a Secret)", create, variant(lambda j: pod(j)["volumes"].append(
            {"name": "s", "secret": {"secretName": "dxdp-web-config"}})), None, False),
        ("another hostPath", create, variant(lambda j: pod(j)["volumes"][0]["hostPath"].__setitem__("path", "C:\\")),
         None, False),
        ("a writable mount", create, variant(lambda j: container(j)["volumeMounts"][0].__setitem__("readOnly", False)),
         None, False),
        ("a service-account token", create, variant(lambda j: pod(j).__setitem__("automountServiceAccountToken", True)),
         None, False),
        ("automountServiceAccountToken unset", create,
         variant(lambda j: pod(j).pop("automountServiceAccountToken")), None, False),
        ("a service account", create, variant(lambda j: pod(j).__setitem__("serviceAccountName", "dxdp")), None, False),
        ("env from a Secret", create, variant(lambda j: container(j).__setitem__(
            "envFrom", [{"secretRef": {"name": "dxdp-web-config"}}])), None, False),
        ("an init container", create, variant(lambda j: pod(j).__setitem__(
            "initContainers", [dict(container(j), name="init")])), None, False),
        ("two containers", create, variant(lambda j: pod(j)["containers"].append(dict(container(j), name="b"))),
         None, False),
        ("an update", job_request("UPDATE"), job, job, False),
        ("deleting its own node's Job", job_request("DELETE"), None, job, True),
        ("deleting another node's Job", job_request("DELETE", claim=("AKSWIN000002",)), None, job, False),
    ]


def render_policies(*args):
    code, out, err = helm("template", RELEASE, CHART, "--namespace", NAMESPACE, *IMAGE, *args)
    if code != 0:
        return None, err
    return {s: p[0][0] for s, p in policies_of(docs(out)).items() if p[0]}, None


def policy_cel_checks():
    """The rendered policies' CEL decides the written-out requests as intended (celpy)."""
    try:
        import celpy  # noqa: F401
    except ImportError:
        if os.environ.get("CI") == "true":
            fail("cel-python", "not installed (.ci/run installs it)")
        else:
            print("skipped the admission policies' CEL checks: cel-python is not installed (pip install cel-python==0.5.0)")
        return
    pols, err = render_policies("--set", "validation.enabled=true")
    if not check("the chart renders both admission policies", pols and set(pols) == {POLICY_NODE, POLICY_JOB}, err or ""):
        return
    for case, request, edit, want in NODE_CASES:
        old = NODE if request["operation"] != "CREATE" else None
        obj = edited(NODE, edit) if request["operation"] == "UPDATE" else (NODE if request["operation"] == "CREATE" else None)
        got, why = admit(pols[POLICY_NODE], request, obj, old)
        check(f"own-node policy (celpy): {case}: {'admitted' if want else 'denied'}, by a validation, not an error",
              got == want and not any(w.startswith("error:") for w in why), "; ".join(why))
    other = dict(node_request("UPDATE"), userInfo={"username": "system:serviceaccount:kube-system:other"})
    got, why = admit(pols[POLICY_NODE], other, edited(NODE, set_label("agentpool", "x")), NODE)
    check("own-node policy (celpy): another identity is not matched (left to RBAC)", got and why == ["not matched"], str(why))
    import json
    with open(JOB_FIXTURE) as f:
        job = job_as_admitted(json.load(f))
    for case, request, obj, old, want in job_cases(job):
        got, why = admit(pols[POLICY_JOB], request, obj, old)
        check(f"validation Job policy (celpy): {case}: {'admitted' if want else 'denied'}, by a validation, not an error",
              got == want and not any(w.startswith("error:") for w in why), "; ".join(why))
    # Chart values the policies follow: the label prefix, the host directory, pinned images.
    digest = "mcr.microsoft.com/windows/servercore@sha256:" + "a" * 64
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump({"nodeLabels": {"prefix": "example.com/gpu-"},
                        "validation": {"enabled": True, "hostDir": "D:\\dxdp", "image": digest,
                                       "allowedImages": [digest]}}, f)
    try:
        pols, err = render_policies("--values", f.name)
    finally:
        os.unlink(f.name)
    if not check("the chart renders the policies with a label prefix, a host directory and a pinned image", pols, err or ""):
        return
    for case, edit, want in [("a label under nodeLabels.prefix", set_label("example.com/gpu-display.count", "1"), True),
                             ("a directx.microsoft.com/ label other than the validation's",
                              set_label("directx.microsoft.com/memory", "1"), False),
                             ("the validation label", set_label("directx.microsoft.com/validated", "false"), True)]:
        got, why = admit(pols[POLICY_NODE], node_request("UPDATE"), edited(NODE, edit), NODE)
        check(f"own-node policy (celpy), prefix example.com/gpu-: {case}: {'admitted' if want else 'denied'}",
              got == want, "; ".join(why))

    lifecycle_node_checks()
    node_feature_cel_checks()

    def pinned(j):
        j = json.loads(json.dumps(j))
        j["spec"]["template"]["spec"]["containers"][0]["image"] = digest
        j["spec"]["template"]["spec"]["volumes"][0]["hostPath"]["path"] = "D:\\dxdp"
        return j
    for case, obj, want in [("the pinned image from D:\\dxdp", pinned(job), True),
                            ("the default tag, no longer allowed", dict(pinned(job), spec=job["spec"]), False)]:
        got, why = admit(pols[POLICY_JOB], job_request("CREATE"), obj, None)
        check(f"validation Job policy (celpy), pinned image and hostDir: {case}: {'admitted' if want else 'denied'}",
              got == want, "; ".join(why))


def nf_request(operation, claim=("gpu-node-1",), name="dxdp-gpu-node-1"):
    user_info = {"username": SERVICE_ACCOUNT, "uid": "u-1"}
    if claim:
        user_info["extra"] = {NODE_NAME_CLAIM: list(claim)}
    return {"operation": operation, "namespace": NAMESPACE, "name": name,
            "resource": {"group": "nfd.k8s-sigs.io", "version": "v1alpha1", "resource": "nodefeatures"},
            "userInfo": user_info}


def node_feature(node="gpu-node-1", name=None, labels=None):
    """A NodeFeature object as dxdp writes it (cluster::nodefeature::apply_body) for `node`."""
    meta = {"name": name or f"dxdp-{node}", "namespace": NAMESPACE, "resourceVersion": "7"}
    if node is not None:
        meta["labels"] = {"nfd.node.kubernetes.io/node-name": node}
    return {"apiVersion": "nfd.k8s-sigs.io/v1alpha1", "kind": "NodeFeature", "metadata": meta,
            "spec": {"labels": labels if labels is not None else
                     {"directx.microsoft.com/display.count": "1", "directx.microsoft.com/timestamp": "1764374400"}}}


# (case, request, object, oldObject, admitted) for the NodeFeature policy.
NODE_FEATURE_CASES = [
    ("its own object created", nf_request("CREATE"), node_feature(), None, True),
    ("its own object changed", nf_request("UPDATE"),
     node_feature(labels={"directx.microsoft.com/display.count": "2"}), node_feature(), True),
    ("its own object emptied (labels off)", nf_request("UPDATE"), node_feature(labels={}), node_feature(), True),
    ("its own object deleted", nf_request("DELETE"), None, node_feature(), True),
    ("another node's object name", nf_request("CREATE", name="dxdp-gpu-node-2"),
     node_feature(node="gpu-node-2"), None, False),
    ("its own name but another node-name label", nf_request("CREATE"),
     node_feature(name="dxdp-gpu-node-1", node="gpu-node-2"), None, False),
    ("its own object with the node-name label removed", nf_request("UPDATE"),
     node_feature(name="dxdp-gpu-node-1", node=None), node_feature(), False),
    ("its own object changed to another node-name label", nf_request("UPDATE"),
     node_feature(name="dxdp-gpu-node-1", node="gpu-node-2"), node_feature(), False),
    ("a token from another node writing this node's object", nf_request("UPDATE", claim=("gpu-node-2",)),
     node_feature(), node_feature(), False),
    ("a token from another node deleting this node's object", nf_request("DELETE", claim=("gpu-node-2",)),
     None, node_feature(), False),
    ("a token without the node-name claim", nf_request("CREATE", claim=()), node_feature(), None, False),
    ("another object in the namespace (not dxdp-<node>)", nf_request("CREATE", name="gpu-node-1"),
     node_feature(name="gpu-node-1"), None, False),
    ("a label outside dxdp's prefix", nf_request("UPDATE"),
     node_feature(labels={"node-role.kubernetes.io/control-plane": ""}), node_feature(), False),
    ("the configuration selector label", nf_request("UPDATE"),
     node_feature(labels={"directx.microsoft.com/device-plugin.config": "other"}), node_feature(), False),
]


def node_feature_cel_checks():
    """nodeLabels.mode: nodefeature: the NodeFeature policy admits dxdp's writes of its own node's
    object only (celpy)."""
    pols, err = render_policies("--set", "nodeLabels.mode=nodefeature")
    if not check("nodeLabels.mode=nodefeature renders the own-node and own-NodeFeature policies",
                 pols and set(pols) == {POLICY_NODE, POLICY_NODE_FEATURE}, err or str(pols and sorted(pols))):
        return
    pol = pols[POLICY_NODE_FEATURE]
    for case, request, obj, old, want in NODE_FEATURE_CASES:
        got, why = admit(pol, request, obj, old)
        check(f"own-NodeFeature policy (celpy): {case}: {'admitted' if want else 'denied'}, by a validation, not an error",
              got == want and not any(w.startswith("error:") for w in why), "; ".join(why))
    other = dict(nf_request("CREATE"), userInfo={"username": "system:serviceaccount:node-feature-discovery:nfd-worker"})
    got, why = admit(pol, other, node_feature(node="gpu-node-2", name="dxdp-gpu-node-1"), None)
    check("own-NodeFeature policy (celpy): another identity is not matched (left to RBAC)",
          got and why == ["not matched"], str(why))
    pols, err = render_policies("--set", "nodeLabels.mode=nodefeature", "--set", "nodeLabels.prefix=example.com/gpu-")
    if check("the NodeFeature policy renders with nodeLabels.prefix", pols and POLICY_NODE_FEATURE in pols, err or ""):
        for case, labels, want in [("a label under nodeLabels.prefix", {"example.com/gpu-display.count": "1"}, True),
                                   ("a directx.microsoft.com/ label", {"directx.microsoft.com/display.count": "1"}, False)]:
            got, why = admit(pols[POLICY_NODE_FEATURE], nf_request("CREATE"), node_feature(labels=labels), None)
            check(f"own-NodeFeature policy (celpy), prefix example.com/gpu-: {case}: {'admitted' if want else 'denied'}",
                  got == want, "; ".join(why))


STARTUP_TAINT = {"key": "directx.microsoft.com/gpu-not-ready", "value": "true", "effect": "NoSchedule"}
CORDON_MARK = "directx.microsoft.com/cordoned-by-dxdp"


def with_startup_taint(n):
    n["spec"]["taints"].append(dict(STARTUP_TAINT))


def cordoned(mark=True):
    def edit(n):
        n["spec"]["unschedulable"] = True
        if mark:
            n["metadata"]["annotations"][CORDON_MARK] = "every served GPU (1) Unhealthy since 2026-11-28T10:00:00Z"
    return edit


def lifecycle_node_checks():
    """The own-node policy allows exactly the startup taint's removal (and addition) when
    startupTaint is set, and the cordon (spec.unschedulable and dxdp's mark) when
    health.remediation.cordon is on; nothing of either when they are off."""
    tainted = edited(NODE, with_startup_taint)
    cordon_on = edited(NODE, cordoned())
    # (case, old, new, admitted with the options on, admitted with them off)
    cases = [
        ("the startup taint removed", tainted, NODE, True, False),
        ("the startup taint added", NODE, tainted, True, False),
        ("the startup taint's key with another effect removed",
         edited(NODE, add_taint({"key": STARTUP_TAINT["key"], "effect": "NoExecute"})), NODE, False, False),
        ("the startup taint removed with another taint", tainted,
         edited(NODE, lambda n: n["spec"].__setitem__("taints", [])), False, False),
        ("cordoned with dxdp's mark", NODE, cordon_on, True, False),
        ("dxdp's cordon lifted with its mark", cordon_on, NODE, True, False),
        ("the mark removed from a node an operator uncordoned", edited(NODE, lambda n: n["metadata"]["annotations"].__setitem__(CORDON_MARK, "x")), NODE, True, False),
        ("an operator's cordon lifted", edited(NODE, cordoned(mark=False)), NODE, False, False),
        ("cordoned, another annotation changed", NODE,
         edited(NODE, lambda n: (cordoned()(n), n["metadata"]["annotations"].__setitem__("x", "y"))), False, False),
        ("spec.providerID changed while cordoning", NODE,
         edited(NODE, lambda n: (cordoned()(n), n["spec"].__setitem__("providerID", "x"))), False, False),
    ]
    on, err = render_policies("--set", "startupTaint=directx.microsoft.com/gpu-not-ready=true:NoSchedule",
                              "--set", "health.remediation.cordon=true")
    off, err_off = render_policies()
    if not check("the chart renders the own-node policy with startupTaint and health.remediation.cordon",
                 on and off, (err or "") + (err_off or "")):
        return
    for case, old, new, want_on, want_off in cases:
        for pols, want, how in [(on, want_on, "on"), (off, want_off, "off")]:
            got, why = admit(pols[POLICY_NODE], node_request("UPDATE"), new, old)
            check(f"own-node policy (celpy), startupTaint and cordon {how}: {case}: {'admitted' if want else 'denied'}, by a validation, not an error",
                  got == want and not any(w.startswith("error:") for w in why), "; ".join(why))


def policy_version_checks():
    """Where the policies cannot be enforced the chart refuses, unless nodeApi.enforceOwnNode=false
    says so (then NOTES.txt warns); a validation image outside the allowlist is refused."""
    code, _, err = helm("template", RELEASE, CHART, "--namespace", NAMESPACE, *IMAGE, "--kube-version", "1.29.0")
    check("chart refuses Kubernetes 1.29 with nodeApi.enforceOwnNode on, saying how to go on",
          code != 0 and "needs ValidatingAdmissionPolicy" in err and "nodeApi.enforceOwnNode=false" in err,
          f"exit {code}: {err.strip()[:300]}")
    code, out, err = helm("template", RELEASE, CHART, "--namespace", NAMESPACE, *IMAGE, "--kube-version", OLDEST_KUBE,
                          "--set", "nodeApi.enforceOwnNode=false", "--set", "validation.enabled=true")
    objs = docs(out) if code == 0 else []
    check(f"chart installs on Kubernetes {OLDEST_KUBE} with nodeApi.enforceOwnNode=false, without policies",
          code == 0 and not policies_of(objs), f"exit {code}: {err.strip()[:300]}")
    if objs:
        values = {"nodeApi": {"enforceOwnNode": False}, "validation": {"enabled": True}}
        label = f"chart on Kubernetes {OLDEST_KUBE}, nodeApi.enforceOwnNode=false"
        assert_daemonset(label, objs, values)
        for version in (OLDEST_KUBE,):
            errors = []
            for o in objs:
                try:
                    kubernetes_validate.validate(o, version, strict=True)
                except Exception as e:
                    errors.append(f"{o.get('kind')}: {getattr(e, 'message', None) or e}")
            check(f"{label}: valid Kubernetes {version} (strict)", not errors, "; ".join(errors[:3]))
    # On a cluster Helm lists every served kind (v1/Namespace among them); `helm template
    # --dry-run=server` does not read them, so --api-versions stands in for a cluster's discovery.
    served = ["--api-versions", "v1/Namespace"]
    code, _, err = helm("template", RELEASE, CHART, "--namespace", NAMESPACE, *IMAGE, *served)
    check("chart refuses a cluster that does not serve ValidatingAdmissionPolicy, saying how to go on",
          code != 0 and "does not serve admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy" in err
          and "nodeApi.enforceOwnNode=false" in err, f"exit {code}: {err.strip()[:300]}")
    code, out, err = helm("template", RELEASE, CHART, "--namespace", NAMESPACE, *IMAGE, *served,
                          "--api-versions", "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy")
    check("chart renders the policies on a cluster that serves ValidatingAdmissionPolicy",
          code == 0 and POLICY_NODE in policies_of(docs(out)), f"exit {code}: {err.strip()[:300]}")
    code, _, err = helm("template", RELEASE, CHART, "--namespace", NAMESPACE, *IMAGE, "--set", "validation.enabled=true",
                        "--set", "validation.image=registry.example.com/servercore:ltsc2022")
    check("chart refuses a validation.image outside validation.allowedImages",
          code != 0 and "is not in validation.allowedImages" in err, f"exit {code}: {err.strip()[:300]}")
    code, _, err = helm("template", RELEASE, CHART, "--namespace", NAMESPACE, *IMAGE, "--set", "validation.enabled=true",
                        "--set", "validation.allowedImages=null")
    check("chart refuses an empty validation.allowedImages", code != 0, f"exit {code}: {err.strip()[:300]}")


def assert_service_monitor(label, objs, metrics, pod_labels):
    """A ServiceMonitor and its Service only when asked for, selecting the plugin's pods."""
    monitors, services = find(objs, "ServiceMonitor"), find(objs, "Service")
    if not metrics.get("serviceMonitor", {}).get("enabled"):
        check(f"{label}: no ServiceMonitor or Service unless metrics.serviceMonitor.enabled",
              not monitors and not services)
        return
    if not check(f"{label}: one ServiceMonitor and one Service", len(monitors) == 1 and len(services) == 1):
        return
    sm, svc = monitors[0], services[0]
    sel = svc["spec"].get("selector", {})
    check(f"{label}: the Service selects the plugin's pods",
          bool(sel) and all(pod_labels.get(k) == v for k, v in sel.items()), f"{sel} vs {pod_labels}")
    ports = svc["spec"].get("ports", [])
    check(f"{label}: the Service's port `metrics` targets the container port",
          any(p.get("name") == "metrics" and p.get("targetPort") == "metrics" and p.get("port") == metrics["port"]
              for p in ports), str(ports))
    match = sm["spec"].get("selector", {}).get("matchLabels", {})
    svc_labels = svc["metadata"].get("labels", {})
    check(f"{label}: the ServiceMonitor selects the Service",
          bool(match) and all(svc_labels.get(k) == v for k, v in match.items()), f"{match} vs {svc_labels}")
    eps = sm["spec"].get("endpoints", [])
    check(f"{label}: the ServiceMonitor scrapes /metrics on port `metrics`",
          len(eps) == 1 and eps[0].get("port") == "metrics" and eps[0].get("path") == "/metrics", str(eps))
    check(f"{label}: ServiceMonitor apiVersion", sm.get("apiVersion") == "monitoring.coreos.com/v1")
    ep = eps[0] if eps else {}
    # dxdp's namespace/pod/container labels must survive the scrape (else exported_*), and the
    # node's name is a `node` label: the dashboard and the alerts use both.
    check(f"{label}: the ServiceMonitor honours dxdp's labels", ep.get("honorLabels") is True, str(ep))
    check(f"{label}: the ServiceMonitor labels each target with its node",
          {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node", "action": "replace"}
          in ep.get("relabelings", []), str(ep.get("relabelings")))
    check(f"{label}: the ServiceMonitor does not use the deprecated bearerTokenFile",
          "bearerTokenFile" not in ep or "bearerTokenFile" in metrics["serviceMonitor"].get("endpoint", {}), str(ep))
    own = metrics["serviceMonitor"].get("endpoint", {})
    own_auth = any(own.get(k) for k in ("authorization", "bearerTokenFile", "bearerTokenSecret", "basicAuth", "oauth2"))
    token_secret = {"name": "", "key": "token", **(metrics["serviceMonitor"].get("tokenSecret") or {})}
    scraper = [o for o in objs if is_scraper(o)]
    if metrics.get("authorization") == "kubernetes" and not own_auth:
        want_secret = token_secret["name"] or f"{sm['metadata']['name']}-metrics-scraper-token"
        want_key = (token_secret["key"] or "token") if token_secret["name"] else "token"
        check(f"{label}: with metrics.authorization=kubernetes Prometheus sends a bearer token from a Secret",
              ep.get("authorization") == {"type": "Bearer", "credentials": {"name": want_secret, "key": want_key}},
              str(ep.get("authorization")))
        if token_secret["name"]:
            check(f"{label}: with tokenSecret.name the chart creates no scraper identity", not scraper,
                  str([o["kind"] for o in scraper]))
        else:
            sas = [o for o in scraper if o["kind"] == "ServiceAccount"]
            secrets = [o for o in scraper if o["kind"] == "Secret"]
            bindings = [o for o in scraper if o["kind"] == "ClusterRoleBinding"]
            readers = [o["metadata"]["name"] for o in find(objs, "ClusterRole")
                       if o["metadata"]["name"].endswith("-metrics-reader")]
            ok_ = (len(sas) == 1 and len(secrets) == 1 and len(bindings) == 1 and len(scraper) == 3
                   and secrets[0]["metadata"]["name"] == want_secret
                   and secrets[0].get("type") == "kubernetes.io/service-account-token"
                   and secrets[0]["metadata"].get("annotations", {}).get("kubernetes.io/service-account.name")
                   == sas[0]["metadata"]["name"]
                   and bindings[0]["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                                  "name": readers[0] if readers else None}
                   and bindings[0].get("subjects") == [{"kind": "ServiceAccount", "name": sas[0]["metadata"]["name"],
                                                        "namespace": NAMESPACE}])
            check(f"{label}: the scraper service account, its token Secret and its metrics-reader binding", ok_,
                  str([(o["kind"], o["metadata"]["name"]) for o in scraper]))
    else:
        check(f"{label}: no scraper identity unless the chart sends the token", not scraper,
              str([o["kind"] for o in scraper]))
    for k, v in metrics["serviceMonitor"].get("endpoint", {}).items():
        check(f"{label}: ServiceMonitor endpoint field {k}", ep.get(k) == v, str(ep.get(k)))
    tls = bool(metrics.get("existingWebConfigSecret") or (metrics.get("webConfig") or {}).get("tls_server_config"))
    if tls and "scheme" not in own:
        check(f"{label}: with TLS the ServiceMonitor scrapes https", ep.get("scheme") == "https", str(ep))
    if tls and "scheme" not in own and metrics.get("tlsSecretName") and "tlsConfig" not in own:
        want = {"serverName": f"{sm['metadata']['name']}-metrics.{NAMESPACE}.svc",
                "ca": {"secret": {"name": metrics["tlsSecretName"], "key": "ca.crt"}}}
        check(f"{label}: the ServiceMonitor checks the certificate against the Secret's CA and the Service's name",
              ep.get("tlsConfig") == want, str(ep.get("tlsConfig")))
    if not tls:
        check(f"{label}: without TLS the ServiceMonitor scrapes plain HTTP only when allowed",
              metrics["serviceMonitor"].get("allowInsecure") is True, str(metrics["serviceMonitor"]))
    for k, v in metrics["serviceMonitor"].get("labels", {}).items():
        check(f"{label}: ServiceMonitor label {k}", sm["metadata"].get("labels", {}).get(k) == v)


def load_values(*paths):
    merged = {}
    for p in paths:
        with open(p) as f:
            v = yaml.safe_load(f) or {}
        merged.update(v)
    return merged


def chart_checks():
    value_files = [None] + sorted(glob.glob(os.path.join(CHART, "ci", "*-values.yaml")))
    for vf in value_files:
        label = "chart " + (os.path.basename(vf) if vf else "defaults")
        extra = ["--values", vf] if vf else []
        code, out, err = helm("lint", "--strict", CHART, "--namespace", NAMESPACE, *IMAGE, *extra)
        check(f"{label}: helm lint --strict", code == 0, (out + err).strip()[-400:])
        code, out, err = template(*([vf] if vf else []), extra=IMAGE)
        if not check(f"{label}: helm template", code == 0, err.strip()):
            continue
        objs = docs(out)
        values = load_values(vf) if vf else {}
        if not vf:
            d = find(objs, "DaemonSet")
            pod = d[0]["spec"]["template"]["spec"] if d else {}
            check(f"{label}: priorityClassName system-node-critical",
                  pod.get("priorityClassName") == "system-node-critical")
            check(f"{label}: Windows nodes", pod.get("nodeSelector", {}).get("kubernetes.io/os") == "windows")
            check(f"{label}: GPU taints tolerated",
                  {"nvidia.com/gpu", "amd.com/gpu", "sku"} <= {t.get("key") for t in pod.get("tolerations", [])})
            res = pod.get("containers", [{}])[0].get("resources", {})
            check(f"{label}: requests and limits", bool(res.get("requests")) and bool(res.get("limits")))
            check(f"{label}: RollingUpdate", d and d[0]["spec"]["updateStrategy"]["type"] == "RollingUpdate")
            check(f"{label}: no Namespace unless namespace.create", not find(objs, "Namespace"))
        assert_daemonset(label, objs, values)
        validate(label, objs)

    # Values that must be refused, with the reason helm gives.
    refused = [
        ("an unknown value", ["--set", "replicaz=4"], "replicaz"),
        ("replicas above 64", ["--set", "replicas=65"], "replicas"),
        ("an unknown config key", ["--set", "config.resources.display.replica=2"], "replica"),
        ("a ServiceMonitor without the endpoint",
         ["--set", "metrics.enabled=false", "--set", "probes.enabled=false",
          "--set", "metrics.serviceMonitor.enabled=true"], "metrics.enabled"),
        ("a bad assignment mode", ["--set", "config.assignment=guid"], "assignment"),
        ("a bad isolation policy", ["--set", "isolation.policy=cordon"], "isolation.policy"),
        ("validation without nodeApi", ["--set", "validation.enabled=true", "--set", "nodeApi.enabled=false"],
         "nodeApi.enabled"),
        ("config.validation.enabled without nodeApi",
         ["--set", "config.validation.enabled=true", "--set", "nodeApi.enabled=false"], "nodeApi.enabled"),
        ("a bad validation interval", ["--set", "validation.interval=daily"], "validation.interval"),
        ("the taint policy without the API server",
         ["--set", "isolation.policy=taint", "--set", "nodeApi.enabled=false"], "nodeApi.enabled"),
        ("the taint policy in config without the API server",
         ["--set", "config.isolation.policy=taint", "--set", "nodeApi.enabled=false"], "nodeApi.enabled"),
        ("node conditions without the API server",
         ["--set", "health.nodeConditions=true", "--set", "nodeApi.enabled=false"], "nodeApi.enabled"),
        ("node conditions in config without the API server",
         ["--set", "config.health.nodeConditions=true", "--set", "nodeApi.enabled=false"], "nodeApi.enabled"),
        # dxdp refuses a host name (the pod would crash-loop): the schema refuses it first.
        ("a metrics address dxdp refuses (localhost:9466)",
         ["--set", "config.metrics.address=localhost:9466"], "config.metrics.address"),
        ("a probe address without a port", ["--set", "config.metrics.probeAddress=127.0.0.1"],
         "config.metrics.probeAddress"),
        ("a host name as metrics.bindAddress", ["--set", "metrics.bindAddress=localhost"],
         "metrics.bindAddress"),
        ("a host name as probes.bindAddress", ["--set", "probes.bindAddress=localhost"],
         "probes.bindAddress"),
        # One source of truth: a chart value and a different config value for the same key.
        ("replicas and a different config.resources.display.replicas",
         ["--set", "replicas=4", "--set", "config.resources.display.replicas=2"],
         "config.resources.display.replicas is 2 but replicas makes it 4"),
        ("isolation.policy and a different config.isolation.policy",
         ["--set", "isolation.policy=taint", "--set", "config.isolation.policy=audit"],
         "config.isolation.policy is audit but isolation.policy makes it taint"),
        ("config.metrics.address other than metrics.bindAddress:port",
         ["--set", "metrics.bindAddress=0.0.0.0", "--set", "config.metrics.address=127.0.0.1:9000"],
         "metrics.enabled/bindAddress/port"),
        ("config.metrics.address with metrics.bindAddress: hostIP (each node's own IP)",
         ["--set", "config.metrics.address=127.0.0.1:9000"], "metrics.bindAddress: hostIP listens on each node's own IP"),
        # Issue 44: the ServiceMonitor scrapes across the network: TLS and an identity, or an explicit opt-out.
        ("a ServiceMonitor over plain HTTP", ["--set", "metrics.serviceMonitor.enabled=true"],
         "Prometheus would scrape /metrics over plain HTTP"),
        ("a ServiceMonitor with TLS but no identity",
         ["--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.existingWebConfigSecret=",
          "--set", "metrics.webConfig.tls_server_config.cert_file=C:\\etc\\dxdp-tls\\tls.crt",
          "--set", "metrics.webConfig.tls_server_config.key_file=C:\\etc\\dxdp-tls\\tls.key"],
         "would answer anyone who reaches the node"),
        ("kubernetes authorization without TLS and without metrics.allowPlainHttpTokens",
         ["--set", "metrics.authorization=kubernetes"], "metrics.allowPlainHttpTokens"),
        ("token audiences with the chart's scraper token (it has only the API server's audience)",
         ["--set", "metrics.authorization=kubernetes", "--set", "metrics.existingWebConfigSecret=web",
          "--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.tokenAudiences={dxdp-metrics}"],
         "metrics.serviceMonitor.tokenSecret"),
        ("a comma in a token audience", ["--set", "metrics.tokenAudiences={a\\,b}"], "metrics.tokenAudiences"),
    ]
    for name, args, needle in refused:
        code, out, err = helm("template", RELEASE, CHART, "--namespace", NAMESPACE, *IMAGE, *args)
        check(f"chart refuses {name}", code != 0 and needle in err, f"exit {code}: {err.strip()[:200]}")
    # No default image: the error says what to set and where the image comes from.
    code, out, err = helm("template", RELEASE, CHART, "--namespace", NAMESPACE)
    check("chart refuses a missing image.repository, saying what to set",
          code != 0 and "image.repository is not set" in err and "deploy/image" in err,
          f"exit {code}: {err.strip()[:300]}")
    # The default namespace only when allowed.
    code, out, err = helm("template", RELEASE, CHART, "--namespace", "default", *IMAGE)
    check("chart refuses the default namespace, saying how to label its own",
          code != 0 and "allowDefaultNamespace" in err
          and "kubectl label namespace dxdp-system pod-security.kubernetes.io/enforce=privileged" in err
          and "--create-namespace creates the namespace but sets no label" in err,
          f"exit {code}: {err.strip()[:300]}")
    code, out, err = helm("template", RELEASE, CHART, "--namespace", "default", *IMAGE,
                          "--set", "allowDefaultNamespace=true")
    check("chart installs into default with allowDefaultNamespace", code == 0, err.strip()[:300])
    # An operator may pin a Windows build.
    code, out, err = helm("template", RELEASE, CHART, "--namespace", NAMESPACE, *IMAGE,
                          "--set", "nodeSelector.node\\.kubernetes\\.io/windows-build=10.0.20348")
    pinned = (find(docs(out), "DaemonSet") or [{}])[0] if code == 0 else {}
    selector = pinned.get("spec", {}).get("template", {}).get("spec", {}).get("nodeSelector", {})
    check("chart accepts a Windows build pin in nodeSelector",
          selector.get("node.kubernetes.io/windows-build") == "10.0.20348", f"exit {code}: {err.strip()[:300]}")
    service_monitor_token_checks()
    metrics_security_checks()
    address_checks()
    docs_examples_checks()


# The TLS of a secured endpoint (a cert-manager Certificate's Secret named in the web configuration).
SECURED = {
    "tlsSecretName": "dxdp-metrics-tls",
    "webConfig": {"tls_server_config": {"cert_file": "C:\\etc\\dxdp-tls\\tls.crt",
                                        "key_file": "C:\\etc\\dxdp-tls\\tls.key"}},
}


def render_values(values):
    """`helm template` with `values` (a dict): exit code, objects, stderr."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(values, f)
        path = f.name
    try:
        code, out, err = template(path, extra=IMAGE)
    finally:
        os.unlink(path)
    return code, (docs(out) if code == 0 else []), err


def metrics_security_checks():
    """Issue 44: /metrics on each node's own IP by default, TLS and an identity with the
    ServiceMonitor unless explicitly refused, token audiences passed to dxdp."""
    monitor = {"enabled": True, "interval": "30s", "labels": {}, "endpoint": {}}
    cases = [
        ("the defaults (the node's own IP)", {}),
        ("every interface (metrics.bindAddress 0.0.0.0)", {"metrics": {"bindAddress": "0.0.0.0"}}),
        ("an IPv6 bind address", {"metrics": {"bindAddress": "fd00::5"}}),
        ("the node's own IP with an existing ConfigMap", {"existingConfigMap": "mine"}),
        ("a ServiceMonitor explicitly without TLS or identity",
         {"metrics": {"serviceMonitor": {**monitor, "allowInsecure": True}}}),
        ("a ServiceMonitor with TLS and basic authentication",
         {"metrics": {"tlsSecretName": "dxdp-metrics-tls",
                      "webConfig": {**SECURED["webConfig"], "basic_auth_users": {"prometheus": "$2y$10$x"}},
                      "serviceMonitor": {**monitor, "endpoint": {
                          "basicAuth": {"username": {"name": "p", "key": "u"},
                                        "password": {"name": "p", "key": "p"}}}}}}),
        ("token audiences with a token Secret of the user's",
         {"metrics": {"authorization": "kubernetes", "tokenAudiences": ["dxdp-metrics"], **SECURED,
                      "serviceMonitor": {**monitor, "tokenSecret": {"name": "prometheus-dxdp", "key": "token"}}}}),
        ("token audiences with an existing ConfigMap",
         {"existingConfigMap": "mine",
          "metrics": {"authorization": "kubernetes", "tokenAudiences": ["dxdp-metrics", "other"], **SECURED}}),
        ("kubernetes authorization over plain HTTP, explicitly allowed",
         {"metrics": {"authorization": "kubernetes", "allowPlainHttpTokens": True}}),
    ]
    for name, values in cases:
        label = f"chart metrics with {name}"
        code, objs, err = render_values(values)
        if not check(f"{label}: helm template", code == 0, err.strip()[:300]):
            continue
        assert_daemonset(label, objs, values)
        validate(label, objs)
    # What dxdp reads: the audiences in config.yaml, the address from the node's IP.
    code, objs, err = render_values(cases[6][1])
    maps = find(objs, "ConfigMap")
    text = maps[0]["data"]["config.yaml"] if maps else ""
    config = yaml.safe_load(text or "") or {}
    check("chart passes metrics.tokenAudiences to dxdp (config.yaml)",
          config.get("metrics", {}).get("tokenAudiences") == ["dxdp-metrics"]
          and "address" not in config.get("metrics", {}), text)


def service_monitor_token_checks():
    """metrics.authorization=kubernetes with the ServiceMonitor: the token Prometheus sends comes
    from a Secret through the endpoint's `authorization` (the chart's own scraper identity by
    default, or metrics.serviceMonitor.tokenSecret, or the endpoint's own authorization)."""
    monitor = {"enabled": True, "interval": "30s", "labels": {}, "endpoint": {}}
    cases = [
        ("the chart's scraper identity", {}),
        ("an existing token Secret", {"tokenSecret": {"name": "prometheus-token", "key": "jwt"}}),
        ("the endpoint's own authorization",
         {"endpoint": {"authorization": {"type": "Bearer", "credentials": {"name": "mine", "key": "t"}}}}),
    ]
    for name, extra in cases:
        values = {"metrics": {"authorization": "kubernetes", "serviceMonitor": {**monitor, **extra}, **SECURED}}
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            yaml.safe_dump(values, f)
            path = f.name
        try:
            code, out, err = template(path, extra=IMAGE)
        finally:
            os.unlink(path)
        label = f"chart metrics.authorization=kubernetes with {name}"
        if not check(f"{label}: helm template", code == 0, err.strip()[:300]):
            continue
        objs = docs(out)
        assert_daemonset(label, objs, values)
        validate(label, objs)


# (address, whether dxdp accepts it): the chart's config schema must agree with the daemon.
ADDRESSES = [
    ("0.0.0.0:9466", True), ("127.0.0.1:9467", True), ("[::]:9466", True), ("[::1]:9466", True),
    ("[fe80::1%2]:80", True), ("10.0.0.1:09466", True), ("1.2.3.4:65535", True), (" 1.2.3.4:80 ", True),
    ("", True), ("localhost:9466", False), ("127.0.0.1", False), (":9466", False),
    ("127.0.0.01:80", False), ("256.0.0.1:80", False), ("1.2.3.4:65536", False), ("::1:9466", False),
    ("[::1%eth0]:80", False), ("example.com:9466", False), ("0.0.0.0:", False),
]


def address_checks():
    """config.metrics.address: the schema's pattern says what `dxdp config check` says."""
    import json
    schema = json.load(open(os.path.join(CHART, "values.schema.json")))
    pattern = schema["properties"]["config"]["properties"]["metrics"]["properties"]["address"]["pattern"]
    dxdp = dxdp_binary()
    if not dxdp:
        print("skipped address_checks against dxdp: no dxdp binary (the pattern is still checked)")
    wrong = []
    for address, accepted in ADDRESSES:
        if bool(re.search(pattern, address)) != accepted:
            wrong.append(f"schema {'refuses' if accepted else 'accepts'} {address!r}")
        if dxdp:
            with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
                yaml.safe_dump({"metrics": {"address": address}}, f)
            p = subprocess.run([dxdp, "config", "check", f.name], capture_output=True, text=True)
            os.unlink(f.name)
            if (p.returncode == 0) != accepted:
                wrong.append(f"dxdp {'refuses' if accepted else 'accepts'} {address!r}")
    check(f"the chart's metrics address pattern agrees with dxdp on {len(ADDRESSES)} addresses", not wrong,
          "; ".join(wrong))


def configuration_examples():
    """The ```yaml blocks of docs/configuration.md (each a dxdp configuration file)."""
    blocks, current = [], None
    with open(os.path.join(ROOT, "docs", "configuration.md")) as f:
        for line in f:
            stripped = line.strip()
            if current is None and stripped == "```yaml":
                current = []
            elif current is not None and stripped == "```":
                blocks.append("".join(current))
                current = None
            elif current is not None:
                current.append(line)
    return blocks


def docs_examples_checks():
    """Every example of docs/configuration.md renders under the chart's config: and the rendered
    config.yaml passes `dxdp config check` (the chart's config schema is dxdp's)."""
    examples = configuration_examples()
    check("docs/configuration.md has examples", len(examples) >= 2, f"found {len(examples)}")
    dxdp = dxdp_binary()
    for i, text in enumerate(examples, 1):
        label = f"docs/configuration.md example {i}"
        config = yaml.safe_load(text)
        chart = {"config": config}
        # An example that sets metrics.address: the chart's metrics.bindAddress/port must say the
        # same (one source of truth; the chart's default, hostIP, writes no address).
        address = ((config or {}).get("metrics") or {}).get("address")
        if address:
            host, port = str(address).rsplit(":", 1)
            chart["metrics"] = {"bindAddress": host.strip("[]"), "port": int(port)}
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            yaml.safe_dump(chart, f)
            path = f.name
        try:
            code, out, err = template(path, extra=IMAGE)
        finally:
            os.unlink(path)
        if not check(f"{label}: the chart renders it under config:", code == 0, err.strip()[:400]):
            continue
        maps = find(docs(out), "ConfigMap")
        rendered = maps[0]["data"]["config.yaml"] if maps else ""
        if dxdp:
            with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
                f.write(rendered)
                path = f.name
            try:
                p = subprocess.run([dxdp, "config", "check", path], capture_output=True, text=True)
            finally:
                os.unlink(path)
            check(f"{label}: `dxdp config check` accepts the rendered config.yaml", p.returncode == 0,
                  p.stderr.strip())


def readme_checks():
    """The chart README documents every value (top-level, and the keys of small groups)."""
    values = load_values(os.path.join(CHART, "values.yaml"))
    readme = open(os.path.join(CHART, "README.md")).read()
    grouped = ("image", "namespace", "serviceAccount", "metrics", "probes", "nodeApi", "nodeLabels",
               "isolation", "cleanup", "telemetry", "health", "validation")
    keys = []
    for k, v in values.items():
        if k in grouped and isinstance(v, dict):
            keys += [f"{k}.{sub}" for sub in v]
        else:
            keys.append(k)
    missing = [k for k in keys if f"| `{k}` |" not in readme]
    check(f"chart README documents all {len(keys)} values", not missing, f"missing: {missing}")


def render_notes(*args):
    """NOTES.txt rendered with `args` (as an ordinary template in a copy of the chart: `helm
    install --dry-run` needs a cluster): exit code, text, stderr."""
    with tempfile.TemporaryDirectory() as tmp:
        chart = os.path.join(tmp, "dxdp")
        shutil.copytree(CHART, chart)
        shutil.copy(os.path.join(chart, "templates", "NOTES.txt"), os.path.join(chart, "notes-copy.txt"))
        with open(os.path.join(chart, "templates", "notes-rendered.yaml"), "w") as f:
            f.write('notes: {{ tpl (.Files.Get "notes-copy.txt") . | toJson }}\n')
        code, out, err = helm("template", RELEASE, chart, "--namespace", NAMESPACE, *IMAGE, *args,
                              "--show-only", "templates/notes-rendered.yaml")
    return code, ((docs(out) or [{}])[0].get("notes", "") if code == 0 else ""), err


def notes_metrics_checks():
    """Issue 44: NOTES warns whenever /metrics is plain HTTP, open to anyone, or on every interface."""
    secured = ["--set", "metrics.authorization=kubernetes", "--set", "metrics.existingWebConfigSecret=web"]
    cases = [
        ("the defaults", [], "WARNING: /metrics on port 9466 of every node is open to anyone who reaches it and plain HTTP."),
        ("every interface, secured", [*secured, "--set", "metrics.bindAddress=0.0.0.0"],
         "WARNING: /metrics on port 9466 of every node is listening on every interface of the node (0.0.0.0)."),
        ("TLS without an identity", ["--set", "metrics.existingWebConfigSecret=", "--set",
                                     "metrics.webConfig.tls_server_config.cert_file=c"],
         "WARNING: /metrics on port 9466 of every node is open to anyone who reaches it."),
        ("TLS and Kubernetes authorization", secured, None),
        ("metrics off", ["--set", "metrics.enabled=false"], None),
    ]
    for name, args, want in cases:
        code, out, err = render_notes(*args)
        if not check(f"NOTES.txt renders with {name}", code == 0, err.strip()[:300]):
            continue
        if want:
            check(f"NOTES.txt warns about /metrics with {name}", want in out, out[:600])
        else:
            check(f"NOTES.txt has no /metrics warning with {name}", "/metrics on port" not in out, out[:600])


def notes_checks():
    """NOTES.txt (rendered as an ordinary template in a copy of the chart: `helm install
    --dry-run` needs a cluster) offers the public-image smoke test first and the uninstall."""
    notes_metrics_checks()
    with tempfile.TemporaryDirectory() as tmp:
        chart = os.path.join(tmp, "dxdp")
        shutil.copytree(CHART, chart)
        shutil.copy(os.path.join(chart, "templates", "NOTES.txt"), os.path.join(chart, "notes-copy.txt"))
        with open(os.path.join(chart, "templates", "notes-rendered.yaml"), "w") as f:
            f.write('notes: {{ tpl (.Files.Get "notes-copy.txt") . | toJson }}\n')
        code, out, err = helm("template", RELEASE, chart, "--namespace", NAMESPACE, *IMAGE,
                              "--show-only", "templates/notes-rendered.yaml")
    if not check("NOTES.txt renders", code == 0, err.strip()[:300]):
        return
    out = (docs(out) or [{}])[0].get("notes", "")
    smoke = out.find("kubectl apply -f examples/nvidia-smi/display.yaml")
    build = out.find("device-discovery")
    check("NOTES.txt offers the public-image smoke test (nvidia-smi) first",
          smoke != -1 and (build == -1 or smoke < build), out[:400])
    check("NOTES.txt says how uninstall cleans the nodes", "pre-delete hook" in out, out[-300:])
    check("NOTES.txt is quiet about nodeApi.enforceOwnNode when it is on", "enforceOwnNode" not in out, out[:300])
    with tempfile.TemporaryDirectory() as tmp:
        chart = os.path.join(tmp, "dxdp")
        shutil.copytree(CHART, chart)
        shutil.copy(os.path.join(chart, "templates", "NOTES.txt"), os.path.join(chart, "notes-copy.txt"))
        with open(os.path.join(chart, "templates", "notes-rendered.yaml"), "w") as f:
            f.write('notes: {{ tpl (.Files.Get "notes-copy.txt") . | toJson }}\n')
        code, out, err = helm("template", RELEASE, chart, "--namespace", NAMESPACE, *IMAGE,
                              "--set", "nodeApi.enforceOwnNode=false", "--set", "validation.enabled=true",
                              "--show-only", "templates/notes-rendered.yaml")
    out = (docs(out) or [{}])[0].get("notes", "") if code == 0 else ""
    check("NOTES.txt warns when nodeApi.enforceOwnNode is false (every Node; Jobs with validation)",
          "WARNING: nodeApi.enforceOwnNode is false" in out and "every Node" in out and "create any" in out,
          f"exit {code}: {err.strip()[:200]} {out[:300]}")


class FakeNamespaceApi:
    """Just enough of an API server for `helm template --dry-run=server` to run the chart's
    `lookup` of its namespace: discovery of v1 namespaces, and GET of one namespace (or 404)."""

    def __init__(self):
        import http.server
        import json
        import threading
        api = self
        self.namespace = None

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def send(self, code, obj):
                body = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                path = self.path.split("?")[0]
                if path == "/version":
                    return self.send(200, {"major": "1", "minor": "30", "gitVersion": "v1.30.0"})
                if path == "/api":
                    return self.send(200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []})
                group = {"name": "admissionregistration.k8s.io",
                         "versions": [{"groupVersion": "admissionregistration.k8s.io/v1", "version": "v1"}],
                         "preferredVersion": {"groupVersion": "admissionregistration.k8s.io/v1", "version": "v1"}}
                if path == "/apis":
                    return self.send(200, {"kind": "APIGroupList", "apiVersion": "v1",
                                           "groups": [group]})
                if path == "/apis/admissionregistration.k8s.io/v1":
                    return self.send(200, {"kind": "APIResourceList", "groupVersion": "admissionregistration.k8s.io/v1",
                                           "resources": [
                        {"name": "validatingadmissionpolicies", "singularName": "validatingadmissionpolicy",
                         "namespaced": False, "kind": "ValidatingAdmissionPolicy", "verbs": ["get"]},
                        {"name": "validatingadmissionpolicybindings", "singularName": "validatingadmissionpolicybinding",
                         "namespaced": False, "kind": "ValidatingAdmissionPolicyBinding", "verbs": ["get"]}]})
                if path == "/api/v1":
                    return self.send(200, {"kind": "APIResourceList", "groupVersion": "v1", "resources": [
                        {"name": "namespaces", "singularName": "namespace", "namespaced": False,
                         "kind": "Namespace", "verbs": ["get"]}]})
                ns = api.namespace
                if ns and path == f"/api/v1/namespaces/{ns['metadata']['name']}":
                    return self.send(200, ns)
                self.send(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
                                "code": 404, "message": "not found"})

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.dir = tempfile.mkdtemp()
        self.kubeconfig = os.path.join(self.dir, "kubeconfig")
        with open(self.kubeconfig, "w") as f:
            yaml.safe_dump({"apiVersion": "v1", "kind": "Config",
                            "clusters": [{"name": "f", "cluster": {"server": f"http://127.0.0.1:{self.server.server_port}"}}],
                            "users": [{"name": "f", "user": {}}],
                            "contexts": [{"name": "f", "context": {"cluster": "f", "user": "f"}}],
                            "current-context": "f"}, f)

    def close(self):
        self.server.shutdown()
        shutil.rmtree(self.dir, ignore_errors=True)


def cluster_lookup_checks():
    """What the chart does on a cluster (helm install/upgrade run its `lookup`s), through
    `helm template --dry-run=server` against a stand-in that serves the release namespace."""
    api = FakeNamespaceApi()
    env = {**os.environ, "KUBECONFIG": api.kubeconfig}

    def render(namespace_labels, *args, chart=CHART, show=None):
        api.namespace = None if namespace_labels is None else {
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE, "labels": namespace_labels}}
        cmd = [HELM, "template", RELEASE, chart, "--namespace", NAMESPACE, *IMAGE, "--dry-run=server", *args]
        if show:
            cmd += ["--show-only", show]
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
        return p.returncode, p.stdout, p.stderr

    privileged = {"pod-security.kubernetes.io/enforce": "privileged"}
    try:
        code, out, err = render({"pod-security.kubernetes.io/enforce": "baseline"})
        check("on a cluster: a namespace enforcing baseline is refused with the label command",
              code != 0 and "enforces the baseline Pod Security level" in err
              and "kubectl label --overwrite namespace dxdp-system pod-security.kubernetes.io/enforce=privileged" in err,
              f"exit {code}: {err.strip()[:300]}")
        code, out, err = render({}, "--set", "namespace.create=true")
        check("on a cluster: namespace.create=true for an existing namespace is refused, saying what to do",
              code != 0 and "exists already" in err and "namespace.create=false" in err,
              f"exit {code}: {err.strip()[:300]}")
        code, out, err = render(privileged)
        check("on a cluster: a namespace labelled privileged installs", code == 0, err.strip()[:300])
        check("on a cluster: the own-node policy is rendered", code == 0 and POLICY_NODE in policies_of(docs(out)),
              err.strip()[:300])
        code, out, err = render(None, "--set", "namespace.create=true")
        check("on a cluster: namespace.create=true renders the Namespace when none exists (helm template)",
              code == 0 and find(docs(out), "Namespace"), err.strip()[:300])
        # NOTES.txt warns about an unlabelled namespace, and only then.
        with tempfile.TemporaryDirectory() as tmp:
            chart = os.path.join(tmp, "dxdp")
            shutil.copytree(CHART, chart)
            shutil.copy(os.path.join(chart, "templates", "NOTES.txt"), os.path.join(chart, "notes-copy.txt"))
            with open(os.path.join(chart, "templates", "notes-rendered.yaml"), "w") as f:
                f.write('notes: {{ tpl (.Files.Get "notes-copy.txt") . | toJson }}\n')
            for labels, warned in (({}, True), (privileged, False)):
                code, out, err = render(labels, chart=chart, show="templates/notes-rendered.yaml")
                notes = (docs(out) or [{}])[0].get("notes", "") if code == 0 else ""
                check(f"on a cluster: NOTES.txt {'warns about' if warned else 'is quiet about'} a namespace "
                      f"{'without' if warned else 'with'} the privileged label",
                      code == 0 and ("WARNING: namespace dxdp-system" in notes) == warned, f"exit {code}: {err.strip()[:200]}")
    finally:
        api.close()


def packaged_readme_checks():
    """The packaged chart's README (deploy/package_chart.py): no link leaves the chart, every
    absolute link names a file of the repository; and `helm package` of the rewritten chart works."""
    sys.path.insert(0, os.path.join(ROOT, "deploy"))
    import package_chart
    base = "https://github.com/OWNER/dxdp/blob/v0.0.0"
    text, links = package_chart.rewrite(open(os.path.join(CHART, "README.md")).read(), base)
    left = re.findall(r"\]\((\.\./[^)]*)\)", text)
    check("packaged chart README: no relative link leaves the chart", not left, str(left))
    missing = [rel for _, rel in links if not os.path.exists(os.path.join(ROOT, rel))]
    check(f"packaged chart README: its {len(links)} absolute links name files of the repository",
          links and not missing, f"missing: {missing}")
    with tempfile.TemporaryDirectory() as out:
        p = subprocess.run([sys.executable, os.path.join(ROOT, "deploy", "package_chart.py"),
                            "--repository", "OWNER/dxdp", "--ref", "v0.0.0", "--version", "0.0.0",
                            "-d", out, "--helm", HELM], capture_output=True, text=True)
        packaged = glob.glob(os.path.join(out, "dxdp-0.0.0.tgz"))
        check("deploy/package_chart.py packages the chart", p.returncode == 0 and packaged,
              (p.stdout + p.stderr).strip()[-300:])
    # The release writes the image it pushed into the packaged values (image.repository, .digest).
    digest = "sha256:" + "0123456789abcdef" * 4
    values = open(os.path.join(CHART, "values.yaml")).read()
    pinned = package_chart.pin_image(values, "ghcr.io/owner/dxdp", digest)
    check("deploy/package_chart.py --image-digest pins the image in values.yaml (and changes nothing else)",
          pinned == values.replace('\n  repository: ""\n', '\n  repository: "ghcr.io/owner/dxdp"\n', 1)
          .replace('\n  digest: ""\n', f'\n  digest: "{digest}"\n', 1) and pinned != values)
    try:
        package_chart.pin_image(values, "ghcr.io/owner/dxdp", "sha256:abc")
        refused = False
    except ValueError as e:
        refused = "not sha256:<64 hex digits>" in str(e)
    check("deploy/package_chart.py refuses a digest that is not sha256:<64 hex>", refused)


def manifest_checks(update):
    names = variants()
    required = {"default", "replicas-inline", "replicas-configmap", "legacy-name"}
    check("manifest variants: default, replicas-inline, replicas-configmap, legacy-name",
          required <= set(names), str(names))
    for name in names:
        path = os.path.join(MANIFESTS, f"{name}.yaml")
        text, err = render_variant(name)
        if not check(f"manifest {name}: renders", text is not None, err or ""):
            continue
        if update:
            with open(path, "w") as f:
                f.write(text)
        current = open(path).read() if os.path.exists(path) else None
        if not check(f"manifest {name}: matches the chart", current == text,
                     "deploy/manifests differs from the chart: run deploy/check.py --update and commit"):
            continue
        objs = docs(current)
        values = load_values(os.path.join(VARIANTS, "common.values.yaml"), os.path.join(VARIANTS, f"{name}.values.yaml"))
        check(f"manifest {name}: has its Namespace", [n["metadata"]["name"] for n in find(objs, "Namespace")] == [NAMESPACE])
        check(f"manifest {name}: no Helm hook (kubectl would run it at apply time)",
              not [o for o in objs if is_hook(o)])
        assert_daemonset(f"manifest {name}", objs, values)
        validate(f"manifest {name}", objs)
    stale = [p for p in glob.glob(os.path.join(MANIFESTS, "*.yaml"))
             if os.path.basename(p)[: -len(".yaml")] not in names]
    check("no manifest without a variant", not stale, str(stale))
    legacy = docs(open(os.path.join(MANIFESTS, "legacy-name.yaml")).read()) if "legacy-name" in names else []
    cm = find(legacy, "ConfigMap")
    aliases = (yaml.safe_load(cm[0]["data"]["config.yaml"]) if cm else {}).get("resources", {}).get("display", {}).get("aliases")
    check("manifest legacy-name: advertises microsoft.com/directx", aliases == ["microsoft.com/directx"], str(aliases))


EXAMPLE_TAINTS = [
    {"key": "os", "value": "windows", "effect": "NoSchedule"},
    {"key": "sku", "value": "gpu", "effect": "NoSchedule"},
    {"key": "nvidia.com/gpu", "effect": "NoSchedule"},
]


AUTOSCALING = os.path.join(EXAMPLES, "autoscaling")


def example_checks():
    # examples/autoscaling holds a Deployment and what scales it, no Job: autoscaling_checks.
    files = sorted(f for f in glob.glob(os.path.join(EXAMPLES, "**", "*.yaml"), recursive=True)
                   if not f.startswith(AUTOSCALING + os.sep))
    check("examples exist", len(files) > 0)
    names = {}
    for path in files:
        rel = os.path.relpath(path, ROOT)
        with open(path) as f:
            objs = docs(f.read())
        validate(rel, objs)
        jobs = find(objs, "Job")
        if not check(f"{rel}: one Job", len(jobs) == 1, f"found {len(jobs)}"):
            continue
        job = jobs[0]
        names.setdefault(job["metadata"]["name"], []).append(rel)
        spec = job["spec"]
        pod = spec["template"]["spec"]
        sel = pod.get("nodeSelector", {})
        problems = []
        if sel.get("kubernetes.io/os") != "windows":
            problems.append("nodeSelector kubernetes.io/os is not windows")
        if "node.kubernetes.io/windows-build" in sel:
            problems.append("pins a Windows build")
        # The taints Windows and GPU node pools carry (EKS Windows nodes: os=windows:NoSchedule;
        # AKS: sku=gpu:NoSchedule): a Job that does not tolerate them stays Pending there.
        for taint in EXAMPLE_TAINTS:
            if not any(t.get("key") == taint["key"] and t.get("effect") == taint["effect"]
                       and (t.get("operator") == "Exists"
                            or (t.get("operator") == "Equal" and t.get("value") == taint.get("value")))
                       for t in pod.get("tolerations", [])):
                problems.append(f"does not tolerate the taint {taint}")
        if pod.get("restartPolicy") != "Never":
            problems.append("restartPolicy is not Never")
        if "backoffLimit" not in spec:
            problems.append("no backoffLimit")
        if pod.get("securityContext", {}).get("windowsOptions", {}).get("hostProcess"):
            problems.append("is HostProcess (devices are not assigned to HostProcess containers)")
        limits = [c.get("resources", {}).get("limits", {}) for c in pod["containers"]]
        wanted = [{k: v for k, v in l.items() if k in RESOURCES} for l in limits]
        if [w for w in wanted if w] != [w for w in wanted if w and list(w.values()) in ([1], ["1"])] or not any(wanted):
            problems.append(f"limits {wanted}: want one directx.microsoft.com/display or /compute: 1")
        kind = "display" if "display" in os.path.basename(path) else "compute"
        if not any(f"directx.microsoft.com/{kind}" in w for w in wanted):
            problems.append(f"file name says {kind} but the Job does not request it")
        check(f"{rel}: Job conventions", not problems, "; ".join(problems))
    dupes = {n: f for n, f in names.items() if len(f) > 1}
    check("example Job names are unique", not dupes, str(dupes))


def autoscaling_checks():
    """examples/autoscaling: the Deployment and HPA valid Kubernetes objects, KEDA's ScaledObject and
    prometheus-adapter's values of the shape those tools read, all aimed at the one Deployment,
    and every PromQL query in them accepted by `promtool check rules`."""
    def load(name):
        with open(os.path.join(AUTOSCALING, name)) as f:
            return docs(f.read())
    deployment = load("deployment.yaml")
    validate("examples/autoscaling/deployment.yaml", deployment)
    hpa = load("hpa.yaml")
    validate("examples/autoscaling/hpa.yaml", hpa)
    d = find(deployment, "Deployment")
    if not check("examples/autoscaling/deployment.yaml: one Deployment", len(d) == 1, str(len(d))):
        return
    name, ns = d[0]["metadata"]["name"], d[0]["metadata"]["namespace"]
    pod = d[0]["spec"]["template"]["spec"]
    check("examples/autoscaling/deployment.yaml: Windows pods asking for one display GPU",
          pod.get("nodeSelector", {}).get("kubernetes.io/os") == "windows"
          and pod["containers"][0]["resources"]["limits"].get("directx.microsoft.com/display") == 1)
    h = find(hpa, "HorizontalPodAutoscaler")
    check("examples/autoscaling/hpa.yaml: scales the Deployment on dxdp_pod_gpu_utilization",
          len(h) == 1 and h[0]["metadata"]["namespace"] == ns
          and h[0]["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}
          and h[0]["spec"]["metrics"][0]["pods"]["metric"]["name"] == "dxdp_pod_gpu_utilization")
    so = find(load("keda-scaledobject.yaml"), "ScaledObject")
    ok = len(so) == 1 and so[0]["apiVersion"] == "keda.sh/v1alpha1" and so[0]["metadata"]["namespace"] == ns \
        and so[0]["spec"]["scaleTargetRef"]["name"] == name
    trigger = so[0]["spec"]["triggers"][0] if ok else {}
    check("examples/autoscaling/keda-scaledobject.yaml: a KEDA Prometheus trigger on the Deployment",
          ok and trigger.get("type") == "prometheus"
          and {"serverAddress", "query", "threshold"} <= set(trigger.get("metadata", {}))
          and "dxdp_container_gpu_engine_utilization_ratio" in trigger["metadata"]["query"]
          and f'namespace="{ns}"' in trigger["metadata"]["query"])
    with open(os.path.join(AUTOSCALING, "prometheus-adapter-values.yaml")) as f:
        adapter = yaml.safe_load(f)
    rule = (adapter.get("rules", {}).get("custom") or [{}])[0]
    check("examples/autoscaling/prometheus-adapter-values.yaml: a custom rule naming dxdp_pod_gpu_utilization "
          "per namespace and pod",
          rule.get("name", {}).get("as") == "dxdp_pod_gpu_utilization"
          and rule.get("resources", {}).get("overrides") == {"namespace": {"resource": "namespace"},
                                                              "pod": {"resource": "pod"}})
    promtool = shutil.which("promtool")
    if not promtool:
        print("skipped the autoscaling examples' PromQL check: promtool is not installed")
        return
    # prometheus-adapter's template, filled in as the adapter does for one pod.
    adapter_query = rule.get("metricsQuery", "").replace("<<.GroupBy>>", "namespace, pod") \
        .replace("<<.Series>>", "dxdp_container_gpu_engine_utilization_ratio") \
        .replace("<<.LabelMatchers>>", f'namespace="{ns}",pod=~"{name}-.+"')
    queries = {"keda": trigger.get("metadata", {}).get("query", ""), "adapter": adapter_query}
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump({"groups": [{"name": "examples", "rules": [
            {"record": f"example:{k}", "expr": q} for k, q in queries.items()]}]}, f)
        path = f.name
    try:
        p = subprocess.run([promtool, "check", "rules", path], capture_output=True, text=True)
        check("examples/autoscaling: the KEDA and prometheus-adapter queries are valid PromQL",
              p.returncode == 0, (p.stdout + p.stderr).strip()[-600:])
    finally:
        os.unlink(path)


def build_image_checks():
    """scripts/build-image.sh, with a stand-in `docker` on PATH: one buildx build per Windows build
    (windows/amd64, deploy/image/Dockerfile, no attestation manifests, pushed) from a context
    holding every file the Dockerfile copies (dxdp.exe and its verified SHA-256), then one manifest
    list of those images by os.version; the release runs the same script."""
    dockerfile = os.path.join(ROOT, "deploy", "image", "Dockerfile")
    with tempfile.TemporaryDirectory() as tmp:
        bin_dir = os.path.join(tmp, "bin")
        os.mkdir(bin_dir)
        record = os.path.join(tmp, "record")
        docker = os.path.join(bin_dir, "docker")
        # Each call: a line "CALL", its arguments one a line; for a build, the context's files and
        # the SHA-256 check, and a metadata file with a digest made of the call's number.
        with open(docker, "w") as f:
            f.write("#!/bin/sh\n"
                    f"echo CALL >> {record}\n"
                    f"printf '%s\\n' \"$@\" >> {record}\n"
                    f"n=$(grep -c '^CALL$' {record})\n"
                    "if [ \"$1 $2 $3\" = 'buildx imagetools inspect' ]; then\n"
                    "  printf 'Name: %s\\nMediaType: application/vnd.oci.image.index.v1+json\\nDigest: sha256:%064d\\n' \"$4\" \"$n\"\n"
                    "fi\n"
                    "if [ \"$1 $2\" = 'buildx build' ]; then\n"
                    "  context=$(eval echo \\${$#})\n"
                    f"  ls \"$context\" >> {record}\n"
                    f"  (cd \"$context\" && sha256sum -c dxdp.exe.sha256) >> {record} 2>&1\n"
                    "  while [ $# -gt 0 ]; do\n"
                    "    if [ \"$1\" = --metadata-file ]; then\n"
                    "      printf '{\\n  \"containerimage.digest\": \"sha256:%064d\"\\n}\\n' \"$n\" > \"$2\"\n"
                    "    fi\n"
                    "    shift\n"
                    "  done\n"
                    "fi\n")
        os.chmod(docker, 0o755)
        exe = os.path.join(tmp, "dxdp.exe")
        with open(exe, "wb") as f:
            f.write(b"MZ not really an exe")
        image_record = os.path.join(tmp, "image-record")
        env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
               "DXDP_IMAGE_RECORD": image_record}
        p = subprocess.run([os.path.join(ROOT, "scripts", "build-image.sh"), "registry.example.com/dxdp:0.0.0", exe],
                           capture_output=True, text=True, env=env)
        calls = open(record).read().split("CALL\n")[1:] if os.path.exists(record) else []
        pushed = open(image_record).read() if os.path.exists(image_record) else ""
        refused = subprocess.run([os.path.join(ROOT, "scripts", "build-image.sh"), "registry.example.com/dxdp", exe],
                                 capture_output=True, text=True, env=env)
    calls = [c.rstrip("\n").split("\n") for c in calls]
    builds = [c for c in calls if c[:2] == ["buildx", "build"]]
    creates = [c for c in calls if c[:3] == ["buildx", "imagetools", "create"]]
    inspects = [c for c in calls if c[:3] == ["buildx", "imagetools", "inspect"]]
    copied = set()
    default_base = None
    for line in open(dockerfile):
        if line.startswith("COPY "):
            copied.update(w for w in line.split()[1:-1] if not w.startswith("--"))
        if line.startswith("ARG BASE_IMAGE="):
            default_base = line.strip().split("=", 1)[1]
    check("scripts/build-image.sh exits 0 and builds the builds, then the manifest list, then reads its digest",
          p.returncode == 0 and len(builds) == 3 and len(creates) == 1 and len(calls) >= 2
          and calls[-2] is creates[0] and calls[-1] == ["buildx", "imagetools", "inspect", "registry.example.com/dxdp:0.0.0"],
          f"exit {p.returncode}: {p.stderr.strip()[:200]} {[c[:3] for c in calls]}")
    want_flags = ["--platform", "windows/amd64", "--provenance=false", "--sbom=false", "-f", dockerfile, "--push"]
    names, build_args, digests = [], [], []
    for i, b in enumerate(builds, 1):
        missing = [w for w in want_flags if w not in b]
        check(f"build-image.sh build {i}: windows/amd64, no attestations, the Dockerfile, pushed",
              not missing, f"missing {missing}: {b[:16]}")
        check(f"build-image.sh build {i}: the context holds what the Dockerfile copies ({', '.join(sorted(copied))})",
              copied and copied <= set(b) and "dxdp.exe: OK" in b, str(b))
        tag = b[b.index("-t") + 1] if "-t" in b else ""
        names.append(tag)
        build_args.append({a.split("=", 1)[0]: a.split("=", 1)[1] for j, a in enumerate(b)
                           if j and b[j - 1] == "--build-arg" and "=" in a})
        digests.append(f"sha256:{calls.index(b) + 1:064d}")
    check("build-image.sh pushes <image>-ltsc2025, -ltsc2022 and -any",
          names == ["registry.example.com/dxdp:0.0.0-ltsc2025", "registry.example.com/dxdp:0.0.0-ltsc2022",
                    "registry.example.com/dxdp:0.0.0-any"], str(names))
    check("build-image.sh: the 2025 and other-build images use the Dockerfile's base, 2022 keeps v1.0.0",
          [a.get("BASE_IMAGE", "").split("@")[0] for a in build_args] == [
              default_base, "mcr.microsoft.com/oss/kubernetes/windows-host-process-containers-base-image:v1.0.0",
              default_base]
          and default_base == "mcr.microsoft.com/oss/v2/kubernetes/windows-host-process-containers-base-image:2.0.0"
          and [a.get("WINDOWS_BUILD") for a in build_args] == ["10.0.26100", "10.0.20348", "any"],
          f"{build_args} (Dockerfile: {default_base})")
    create = creates[0] if creates else []
    descriptors = []
    for a in create[3:]:
        if a.startswith("{"):
            import json
            descriptors.append(json.loads(a))
    windows = {"architecture": "amd64", "os": "windows"}
    check("build-image.sh's manifest list: the pushed images by os.version (26100, 20348, then none)",
          "-t" in create and create[create.index("-t") + 1] == "registry.example.com/dxdp:0.0.0"
          and descriptors == [
              {"digest": digests[0], "platform": {**windows, "os.version": "10.0.26100"}},
              {"digest": digests[1], "platform": {**windows, "os.version": "10.0.20348"}},
              {"digest": digests[2], "platform": windows}] if len(digests) == 3 else False, str(create))
    # Each base resolved by `imagetools inspect` just before its build: the stand-in's digest is
    # the number of that call.
    # Each base resolved once by `imagetools inspect`, before the builds: the stand-in's digest is
    # the number of that call (1: the 2.0.0 base, 2: v1.0.0).
    base_2 = "mcr.microsoft.com/oss/v2/kubernetes/windows-host-process-containers-base-image:2.0.0"
    base_1 = "mcr.microsoft.com/oss/kubernetes/windows-host-process-containers-base-image:v1.0.0"
    resolved = [f"{base_2}@sha256:{1:064d}", f"{base_1}@sha256:{2:064d}", f"{base_2}@sha256:{1:064d}"]
    check("build-image.sh resolves each base once, before building",
          [c[3] for c in inspects[:2]] == [base_2, base_1] and calls[:2] == inspects[:2],
          str([c[:4] for c in calls[:3]]))
    check("build-image.sh builds FROM each base by the digest imagetools reports",
          [a.get("BASE_IMAGE") for a in build_args] == resolved,
          f"{[a.get('BASE_IMAGE') for a in build_args]} vs {resolved}")
    index_digest = f"sha256:{len(calls):064d}"
    want_record = "".join(
        f"entry\t{n}\t{v}\tregistry.example.com/dxdp:0.0.0-{n}@{d}\t{b}\n"
        for n, v, d, b in zip(["ltsc2025", "ltsc2022", "any"], ["10.0.26100", "10.0.20348", "any"],
                              digests, resolved)) + f"index\tregistry.example.com/dxdp:0.0.0@{index_digest}\n"
    check("build-image.sh records every pushed image and base by digest (DXDP_IMAGE_RECORD)",
          pushed == want_record, f"{pushed!r} vs {want_record!r}")
    check("build-image.sh refuses an image without a tag", refused.returncode == 2 and "no tag" in refused.stderr,
          f"exit {refused.returncode}: {refused.stderr.strip()[:200]}")
    release = open(os.path.join(ROOT, ".github", "workflows", "release.yml")).read()
    check("the release builds the image with scripts/build-image.sh (the same builds and flags)",
          "scripts/build-image.sh" in release and "docker buildx build" not in release)


PREFLIGHT = os.path.join(ROOT, "deploy", "preflight.yaml")


def preflight_checks():
    """deploy/preflight.yaml: a valid Pod running `dxdp doctor` once from the dxdp image, as
    HostProcess (SYSTEM, host network) on a named Windows node, without an API token, with the
    placeholders the manifests use."""
    rel = os.path.relpath(PREFLIGHT, ROOT)
    objs = docs(open(PREFLIGHT).read())
    validate(rel, objs)
    pods = find(objs, "Pod")
    if not check(f"{rel}: one Pod and nothing else", len(pods) == 1 and len(objs) == 1, str([o.get("kind") for o in objs])):
        return
    pod = pods[0]
    spec = pod["spec"]
    win = spec.get("securityContext", {}).get("windowsOptions", {})
    c = spec.get("containers", [{}])
    problems = []
    if pod["metadata"].get("namespace") != NAMESPACE:
        problems.append(f"namespace {pod['metadata'].get('namespace')} (HostProcess needs the labelled {NAMESPACE})")
    if win.get("hostProcess") is not True or win.get("runAsUserName") != "NT AUTHORITY\\SYSTEM" \
            or spec.get("hostNetwork") is not True:
        problems.append(f"not HostProcess as SYSTEM with hostNetwork: {win}")
    if spec.get("nodeName") != "REPLACE_WITH_NODE_NAME":
        problems.append(f"nodeName {spec.get('nodeName')!r} is not the placeholder")
    sel = spec.get("nodeSelector", {})
    if sel.get("kubernetes.io/os") != "windows" or "node.kubernetes.io/windows-build" in sel:
        problems.append(f"nodeSelector {sel}")
    if spec.get("restartPolicy") != "Never":
        problems.append("restartPolicy is not Never")
    if spec.get("automountServiceAccountToken") is not False:
        problems.append("mounts an API token it does not need")
    if len(c) != 1 or c[0].get("args") != ["doctor"] or c[0].get("command"):
        problems.append(f"does not run the image's dxdp.exe with `doctor`: {c}")
    if len(c) == 1 and c[0].get("image") != "REPLACE_WITH_YOUR_REGISTRY/dxdp:0.1.0":
        problems.append(f"image {c[0].get('image')!r} is not the manifests' placeholder")
    if {"operator": "Exists"} not in spec.get("tolerations", []):
        problems.append("does not tolerate every taint")
    check(f"{rel}: `dxdp doctor` once, HostProcess on the named Windows node, placeholders", not problems,
          "; ".join(problems))
    manifest = open(os.path.join(MANIFESTS, "default.yaml")).read()
    check(f"{rel}: the image placeholder is the plain manifests'",
          'image: "REPLACE_WITH_YOUR_REGISTRY/dxdp:0.1.0"' in manifest)


DRIVERS = os.path.join(ROOT, "deploy", "drivers")


def driver_checks():
    """deploy/drivers/*.yaml (driver-install examples): valid objects; a HostProcess DaemonSet on
    Windows nodes without build pin, no API token, placeholders the script refuses to run with."""
    files = sorted(glob.glob(os.path.join(DRIVERS, "*.yaml")))
    check("driver-install examples exist", len(files) > 0)
    for path in files:
        rel = os.path.relpath(path, ROOT)
        objs = docs(open(path).read())
        validate(rel, objs)
        sets = find(objs, "DaemonSet")
        if not check(f"{rel}: one DaemonSet", len(sets) == 1, f"found {len(sets)}"):
            continue
        pod = sets[0]["spec"]["template"]["spec"]
        win = pod.get("securityContext", {}).get("windowsOptions", {})
        sel = pod.get("nodeSelector", {})
        c = pod["containers"][0]
        env = env_of(c)
        script = "\n".join(c.get("command", []))
        problems = []
        if win.get("hostProcess") is not True or pod.get("hostNetwork") is not True:
            problems.append("not HostProcess with hostNetwork")
        if sel.get("kubernetes.io/os") != "windows" or "node.kubernetes.io/windows-build" in sel:
            problems.append(f"nodeSelector {sel}")
        if pod.get("automountServiceAccountToken") is not False:
            problems.append("mounts an API token it does not need")
        if not all(v.startswith("REPLACE_") for k, v in env.items() if k in ("DRIVER_URL", "DRIVER_SHA256")) \
                or "REPLACE_*" not in script or "Get-FileHash" not in script:
            problems.append("placeholders not refused, or no SHA-256 check")
        check(f"{rel}: driver-install conventions", not problems, "; ".join(problems))
RULES = os.path.join(CHART, "files", "alerts.rules.yaml")
RULE_TESTS = os.path.join(ROOT, "deploy", "prometheus", "alerts-test.yaml")
RECORDING = os.path.join(CHART, "files", "recording.rules.yaml")
RECORDING_TESTS = os.path.join(ROOT, "deploy", "prometheus", "recording-test.yaml")
ALERTS_DOC = os.path.join(ROOT, "docs", "alerts.md")


def github_anchor(heading):
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def alert_checks():
    """dxdp's alerting rules: tested with promtool, rendered unchanged, each with a runbook."""
    with open(RULES) as f:
        rules = yaml.safe_load(f)
    alerts = [r for g in rules["groups"] for r in g["rules"] if "alert" in r]
    with open(RULE_TESTS) as f:
        tests = yaml.safe_load(f)
    tested = {a["alertname"] for t in tests["tests"] for a in t.get("alert_rule_test", []) if a.get("exp_alerts")}
    check("every alert fires in deploy/prometheus/alerts-test.yaml",
          {a["alert"] for a in alerts} <= tested, str(sorted({a["alert"] for a in alerts} - tested)))
    with open(ALERTS_DOC) as f:
        anchors = {github_anchor(line.lstrip("#")) for line in f if line.startswith("#")}
    for a in alerts:
        url = a.get("annotations", {}).get("runbook_url", "")
        check(f"alert {a['alert']}: runbook_url is a section of docs/alerts.md",
              url.startswith("docs/alerts.md#") and url.split("#", 1)[1] in anchors, url)
    code, out, err = helm("template", RELEASE, CHART, "--namespace", NAMESPACE, *IMAGE,
                          "--set", "prometheusRule.enabled=true", "--set", "prometheusRule.labels.release=prometheus",
                          "--set", "prometheusRule.runbookUrl=https://docs.example.com/dxdp/alerts.md")
    if not check("chart renders the PrometheusRule", code == 0, err.strip()[:300]):
        return
    pr = find(docs(out), "PrometheusRule")
    if not check("one PrometheusRule with prometheusRule.enabled", len(pr) == 1, str(len(pr))):
        return
    rendered = pr[0]["spec"]["groups"]
    want = yaml.safe_load(open(RULES).read().replace(
        "runbook_url: docs/alerts.md", "runbook_url: https://docs.example.com/dxdp/alerts.md"))["groups"]
    recording = yaml.safe_load(open(RECORDING))["groups"]
    check("the PrometheusRule holds files/alerts.rules.yaml, runbooks at prometheusRule.runbookUrl, "
          "then files/recording.rules.yaml", rendered == want + recording, "rendered groups differ from the rule files")
    recorded = {r["record"] for g in recording for r in g["rules"]}
    with open(RECORDING_TESTS) as f:
        tested_records = {re.match(r"[a-zA-Z_:0-9]+", t["expr"]).group(0)
                          for case in yaml.safe_load(f)["tests"] for t in case.get("promql_expr_test", [])}
    check("every recording rule is tested in deploy/prometheus/recording-test.yaml",
          recorded <= tested_records, str(sorted(recorded - tested_records)))
    code, out, err = helm("template", RELEASE, CHART, "--namespace", NAMESPACE, *IMAGE,
                          "--set", "prometheusRule.enabled=true", "--set", "prometheusRule.recordingRules=false")
    pr_off = find(docs(out), "PrometheusRule") if code == 0 else []
    check("prometheusRule.recordingRules=false leaves the recording rules out",
          len(pr_off) == 1 and all("record" not in r for g in pr_off[0]["spec"]["groups"] for r in g["rules"]),
          err.strip()[:300])
    check("the PrometheusRule carries prometheusRule.labels",
          pr[0]["metadata"].get("labels", {}).get("release") == "prometheus")
    code, out, _ = template(extra=IMAGE)
    check("no PrometheusRule by default", code == 0 and not find(docs(out), "PrometheusRule"))
    promtool = shutil.which("promtool")
    if not promtool:
        if os.environ.get("CI") == "true":
            fail("promtool", "not installed (.ci/run installs Debian's prometheus package)")
        else:
            print("skipped promtool checks: promtool is not installed (apt-get install prometheus)")
        return
    p = subprocess.run([promtool, "test", "rules", RULE_TESTS], capture_output=True, text=True)
    check("promtool test rules deploy/prometheus/alerts-test.yaml", p.returncode == 0,
          (p.stdout + p.stderr).strip()[-800:])
    p = subprocess.run([promtool, "test", "rules", RECORDING_TESTS], capture_output=True, text=True)
    check("promtool test rules deploy/prometheus/recording-test.yaml", p.returncode == 0,
          (p.stdout + p.stderr).strip()[-800:])
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump({"groups": rendered}, f)
        name = f.name
    try:
        p = subprocess.run([promtool, "check", "rules", name], capture_output=True, text=True)
        check("promtool check rules accepts the rendered PrometheusRule", p.returncode == 0,
              (p.stdout + p.stderr).strip()[-800:])
    finally:
        os.unlink(name)


def pod_info_checks():
    """telemetry.podLabels and telemetry.podUid are written into the rendered config file."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump({"config": {"telemetry": {"interval": "5s"}},
                        "telemetry": {"podLabels": ["team", r"app\.kubernetes\.io/.*"], "podUid": True}}, f)
        path = f.name
    try:
        code, out, err = template(path, extra=IMAGE)
        maps = find(docs(out), "ConfigMap") if code == 0 else []
        rendered = yaml.safe_load(maps[0]["data"]["config.yaml"]) if maps else None
        check("telemetry.podLabels/podUid are written into config.telemetry beside config:'s keys",
              rendered == {"metrics": {"probeAddress": "127.0.0.1:9467"},
                           "telemetry": {"interval": "5s", "podLabels": ["team", r"app\.kubernetes\.io/.*"],
                                         "podUid": True}}, str(rendered) + err.strip()[:400])
        code, _, err = template(path, extra=IMAGE + ["--set", "existingConfigMap=mine"])
        check("telemetry.podLabels/podUid with existingConfigMap are refused",
              code != 0 and "existingConfigMap" in err, err.strip()[:400])
    finally:
        os.unlink(path)
    code, out, _ = template(extra=IMAGE)
    maps = find(docs(out), "ConfigMap") if code == 0 else []
    check("no pod info keys by default",
          bool(maps) and "pod" not in maps[0]["data"]["config.yaml"])


def main():
    global HELM
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update", action="store_true", help="re-render deploy/manifests/*.yaml")
    args = parser.parse_args()
    HELM = helm_binary()
    code, out, _ = helm("version", "--short")
    print(f"helm {out.strip()}, kubernetes-validate {kubernetes_validate.version.__version__ if hasattr(kubernetes_validate.version, '__version__') else ''}".rstrip())
    print(f"dxdp for config checks: {dxdp_binary() or 'none found (skipped)'}")
    # The validator itself must reject unknown fields, or every strict check above is void.
    bogus = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "dta": {}}
    for version in KUBE_VERSIONS:
        try:
            kubernetes_validate.validate(bogus, version, strict=True)
            fail(f"strict validation rejects unknown fields ({version})", "accepted ConfigMap.dta")
        except kubernetes_validate.ValidationError:
            ok(f"strict validation rejects unknown fields ({version})")
    chart_checks()
    readme_checks()
    notes_checks()
    cluster_lookup_checks()
    packaged_readme_checks()
    manifest_checks(args.update)
    example_checks()
    autoscaling_checks()
    driver_checks()
    preflight_checks()
    build_image_checks()
    alert_checks()
    pod_info_checks()
    policy_version_checks()
    policy_cel_checks()
    print(f"\n{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
