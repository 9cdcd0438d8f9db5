{{/* The chart name, or nameOverride. */}}
{{- define "dxdp.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's full name, or fullnameOverride. */}}
{{- define "dxdp.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "dxdp.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "dxdp.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* Labels that select the pods. */}}
{{- define "dxdp.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dxdp.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "dxdp.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "dxdp.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: device-plugin
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The service account's name. */}}
{{- define "dxdp.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "dxdp.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The ConfigMap holding config.yaml. */}}
{{- define "dxdp.configMapName" -}}
{{- default (printf "%s-config" (include "dxdp.fullname" .)) .Values.existingConfigMap }}
{{- end }}

{{/* The image reference. There is no default repository: no public image is published yet. */}}
{{- define "dxdp.image" -}}
{{- $repo := required "image.repository is not set: dxdp publishes no image yet. Build the HostProcess image (deploy/image/Dockerfile; docs/install.md#the-image), push it to a registry your nodes can pull from, and set it, e.g. --set image.repository=myregistry.example.com/dxdp (with image.tag or image.digest)" .Values.image.repository }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" $repo .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repo (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* Refuses the default namespace unless allowDefaultNamespace. */}}
{{- define "dxdp.checkNamespace" -}}
{{- if and (eq .Release.Namespace "default") (not .Values.allowDefaultNamespace) }}
{{- fail "refusing to install into the default namespace: dxdp's HostProcess pods need a namespace of their own whose Pod Security level is privileged. Create and label it, then install there: kubectl create namespace dxdp-system; kubectl label namespace dxdp-system pod-security.kubernetes.io/enforce=privileged; helm install dxdp <chart> --namespace dxdp-system (helm's --create-namespace creates the namespace but sets no label; docs/install.md#the-namespace). Or set allowDefaultNamespace=true" }}
{{- end }}
{{- /* On a cluster (helm install/upgrade; helm template sees none): a namespace that exists
cannot also be rendered, and one whose Pod Security level refuses HostProcess pods fails now
rather than as pods the DaemonSet can never create. */}}
{{- $ns := lookup "v1" "Namespace" "" .Release.Namespace }}
{{- if $ns }}
{{- $enforce := (($ns.metadata).labels | default dict) | dig "pod-security.kubernetes.io/enforce" "" }}
{{- if and $enforce (ne $enforce "privileged") }}
{{- fail (printf "namespace %s enforces the %s Pod Security level, which refuses dxdp's HostProcess pods: kubectl label --overwrite namespace %s pod-security.kubernetes.io/enforce=privileged (docs/install.md#the-namespace)" .Release.Namespace $enforce .Release.Namespace) }}
{{- end }}
{{- if and .Values.namespace.create (not (eq ((($ns.metadata).annotations | default dict) | dig "meta.helm.sh/release-name" "") .Release.Name)) }}
{{- fail (printf "namespace.create=true renders the Namespace, but namespace %s exists already (helm install stores its release there before it creates any object, so Helm cannot create it from the chart). Set namespace.create=false and label the namespace: kubectl label namespace %s pod-security.kubernetes.io/enforce=privileged (namespace.create is for `helm template | kubectl apply` and the plain manifests; docs/install.md#the-namespace)" .Release.Namespace .Release.Namespace) }}
{{- end }}
{{- end }}
{{- end }}

{{/* An address as dxdp's IP:PORT ([IPv6]:PORT for an IPv6 address). Args: list address port. */}}
{{- define "dxdp.socketAddress" -}}
{{- $a := toString (index . 0) -}}
{{- if and (contains ":" $a) (not (hasPrefix "[" $a)) -}}
{{- printf "[%s]:%d" $a (int (index . 1)) -}}
{{- else -}}
{{- printf "%s:%d" $a (int (index . 1)) -}}
{{- end -}}
{{- end }}

{{/* Sets key (dotted) of the config dict to value; refuses a config value that differs (one
source of truth: a chart value lands in config.yaml, it never silently beats it).
Args: dict "config" $c "key" "a.b" "value" v "from" "the chart value". */}}
{{- define "dxdp.setConfig" -}}
{{- $node := .config -}}
{{- $parts := splitList "." .key -}}
{{- range initial $parts }}
{{- if or (not (hasKey $node .)) (kindIs "invalid" (index $node .)) }}
{{- $_ := set $node . dict }}
{{- end }}
{{- $node = index $node . }}
{{- end }}
{{- $leaf := last $parts }}
{{- if and (hasKey $node $leaf) (not (kindIs "invalid" (index $node $leaf))) (ne (toString (index $node $leaf)) (toString .value)) }}
{{- fail (printf "config.%s is %v but %s makes it %v: set one of them (the chart writes %s into config.yaml as config.%s; docs/configuration.md#the-helm-chart)" .key (index $node $leaf) .from .value .from .key) }}
{{- end }}
{{- $_ := set $node $leaf .value }}
{{- end }}

{{/* dxdp's configuration file: the config value, plus the chart values that are configuration
keys (replicas, logLevel, logFormat, metrics (address, web configuration, authorization), probes,
nodeLabels, isolation, health, telemetry.podLabels/podUid), as YAML. */}}
{{- define "dxdp.configFile" -}}
{{- $c := deepCopy (.Values.config | default dict) -}}
{{- $v := .Values -}}
{{- if not (kindIs "invalid" $v.replicas) }}
{{- include "dxdp.setConfig" (dict "config" $c "key" "resources.display.replicas" "value" $v.replicas "from" "replicas") }}
{{- include "dxdp.setConfig" (dict "config" $c "key" "resources.compute.replicas" "value" $v.replicas "from" "replicas") }}
{{- end }}
{{- with $v.logLevel }}
{{- include "dxdp.setConfig" (dict "config" $c "key" "logLevel" "value" . "from" "logLevel") }}
{{- end }}
{{- with $v.logFormat }}
{{- include "dxdp.setConfig" (dict "config" $c "key" "logFormat" "value" . "from" "logFormat") }}
{{- end }}
{{- $metrics := "" }}
{{- if $v.metrics.enabled }}
{{- $metrics = include "dxdp.socketAddress" (list $v.metrics.bindAddress $v.metrics.port) }}
{{- end }}
{{- if include "dxdp.metricsOnHostIP" . }}
{{- /* Each node's own IP: not known here, so the DaemonSet passes it (DXDP_METRICS_ADDRESS). */}}
{{- with (($c.metrics | default dict).address) }}
{{- fail (printf "config.metrics.address is %v but metrics.bindAddress: hostIP listens on each node's own IP (DXDP_METRICS_ADDRESS=$(HOST_IP):%v): set metrics.bindAddress to an IP to write it into config.yaml, or remove config.metrics.address" . $v.metrics.port) }}
{{- end }}
{{- else }}
{{- include "dxdp.setConfig" (dict "config" $c "key" "metrics.address" "value" $metrics "from" "metrics.enabled/bindAddress/port") }}
{{- end }}
{{- $probes := "" }}
{{- if $v.probes.enabled }}
{{- $probes = include "dxdp.socketAddress" (list $v.probes.bindAddress $v.probes.port) }}
{{- end }}
{{- include "dxdp.setConfig" (dict "config" $c "key" "metrics.probeAddress" "value" $probes "from" "probes.enabled/bindAddress/port") }}
{{- if and $v.metrics.enabled (include "dxdp.webConfigSecret" .) }}
{{- include "dxdp.setConfig" (dict "config" $c "key" "metrics.webConfigFile" "value" "C:\\etc\\dxdp-web\\web-config.yml" "from" "metrics.webConfig/existingWebConfigSecret") }}
{{- end }}
{{- if and $v.metrics.enabled (eq (toString $v.metrics.authorization) "kubernetes") }}
{{- include "dxdp.setConfig" (dict "config" $c "key" "metrics.authorization" "value" "kubernetes" "from" "metrics.authorization") }}
{{- with $v.metrics.tokenAudiences }}
{{- include "dxdp.setConfig" (dict "config" $c "key" "metrics.tokenAudiences" "value" . "from" "metrics.tokenAudiences") }}
{{- end }}
{{- end }}
{{- if and $v.metrics.enabled $v.metrics.allowPlainHttpTokens }}
{{- include "dxdp.setConfig" (dict "config" $c "key" "metrics.allowPlainHttpTokens" "value" true "from" "metrics.allowPlainHttpTokens") }}
{{- end }}
{{- if not $v.nodeLabels.enabled }}
{{- include "dxdp.setConfig" (dict "config" $c "key" "nodeLabels.enabled" "value" false "from" "nodeLabels.enabled") }}
{{- end }}
{{- with $v.nodeLabels.prefix }}
{{- include "dxdp.setConfig" (dict "config" $c "key" "nodeLabels.prefix" "value" . "from" "nodeLabels.prefix") }}
{{- end }}
{{- with $v.nodeLabels.mode }}
{{- include "dxdp.setConfig" (dict "config" $c "key" "nodeLabels.mode" "value" . "from" "nodeLabels.mode") }}
{{- end }}
{{- with $v.isolation.policy }}
{{- include "dxdp.setConfig" (dict "config" $c "key" "isolation.policy" "value" . "from" "isolation.policy") }}
{{- end }}
{{- if not $v.isolation.events }}
{{- include "dxdp.setConfig" (dict "config" $c "key" "isolation.events" "value" false "from" "isolation.events") }}
{{- end }}
{{- $health := $v.health | default dict }}
{{- if eq (toString $health.events) "false" }}
{{- include "dxdp.setConfig" (dict "config" $c "key" "health.events" "value" false "from" "health.events") }}
{{- end }}
{{- if $health.nodeConditions }}
{{- include "dxdp.setConfig" (dict "config" $c "key" "health.nodeConditions" "value" true "from" "health.nodeConditions") }}
{{- end }}
{{- $remediation := $health.remediation | default dict }}
{{- range $key := list "evictPods" "cordon" }}
{{- if get $remediation $key }}
{{- include "dxdp.setConfig" (dict "config" $c "key" (printf "health.remediation.%s" $key) "value" true "from" (printf "health.remediation.%s" $key)) }}
{{- end }}
{{- end }}
{{- with $remediation.gracePeriod }}
{{- include "dxdp.setConfig" (dict "config" $c "key" "health.remediation.gracePeriod" "value" . "from" "health.remediation.gracePeriod") }}
{{- end }}
{{- with $v.startupTaint }}
{{- include "dxdp.setConfig" (dict "config" $c "key" "startupTaint" "value" . "from" "startupTaint") }}
{{- end }}
{{- $podInfo := $v.telemetry | default dict }}
{{- with $podInfo.podLabels }}
{{- include "dxdp.setConfig" (dict "config" $c "key" "telemetry.podLabels" "value" . "from" "telemetry.podLabels") }}
{{- end }}
{{- if $podInfo.podUid }}
{{- include "dxdp.setConfig" (dict "config" $c "key" "telemetry.podUid" "value" true "from" "telemetry.podUid") }}
{{- end }}
{{- $validation := $v.validation | default dict }}
{{- if $validation.enabled }}
{{- include "dxdp.setConfig" (dict "config" $c "key" "validation.enabled" "value" true "from" "validation.enabled") }}
{{- end }}
{{- range $key := list "interval" "timeout" "image" "hostDir" }}
{{- with get $validation $key }}
{{- include "dxdp.setConfig" (dict "config" $c "key" (printf "validation.%s" $key) "value" . "from" (printf "validation.%s" $key)) }}
{{- end }}
{{- end }}
{{- if $validation.gate }}
{{- include "dxdp.setConfig" (dict "config" $c "key" "validation.gate" "value" true "from" "validation.gate") }}
{{- end }}
{{- toYaml $c }}
{{- end }}

{{/* Whether validation Jobs are on: the chart value, or config.validation.enabled. */}}
{{/* "true" when the labels go into a NodeFeature object: nodeLabels.mode (the chart value, else
config's) is nodefeature (with the labels off too: dxdp then empties the object). */}}
{{- define "dxdp.nodeFeatureMode" -}}
{{- $config := .Values.config | default dict -}}
{{- $labels := (get $config "nodeLabels") | default dict -}}
{{- if eq (default (default "node" (get $labels "mode")) .Values.nodeLabels.mode) "nodefeature" }}true{{ end -}}
{{- end }}

{{- define "dxdp.validationEnabled" -}}
{{- $config := .Values.config | default dict -}}
{{- $val := (get $config "validation") | default dict -}}
{{- if or (.Values.validation | default dict).enabled (get $val "enabled") }}true{{ end -}}
{{- end }}

{{/* The effective isolation policy: the chart value, else config's, else audit. */}}
{{- define "dxdp.isolationPolicy" -}}
{{- $config := .Values.config | default dict -}}
{{- $iso := (get $config "isolation") | default dict -}}
{{- default (default "audit" (get $iso "policy")) .Values.isolation.policy -}}
{{- end }}

{{/* Whether dxdp keeps node conditions (needs patch on nodes/status): the chart value, or
config.health.nodeConditions. */}}
{{- define "dxdp.nodeConditions" -}}
{{- $config := .Values.config | default dict -}}
{{- $health := (get $config "health") | default dict -}}
{{- if or (.Values.health | default dict).nodeConditions (get $health "nodeConditions") }}true{{ end -}}
{{- end }}

{{/* Whether dxdp creates Events (GPU isolation violations, Unhealthy GPUs, evictions): create on
events. */}}
{{- define "dxdp.events" -}}
{{- $health := .Values.health | default dict -}}
{{- if or .Values.isolation.events (ne (toString $health.events) "false") (include "dxdp.remediation" (list . "evictPods")) }}true{{ end -}}
{{- end }}

{{/* Whether a health.remediation switch is on: the chart value, or config's.
Args: list $ "evictPods"|"cordon". */}}
{{- define "dxdp.remediation" -}}
{{- $root := index . 0 -}}
{{- $key := index . 1 -}}
{{- $config := $root.Values.config | default dict -}}
{{- $health := (get $config "health") | default dict -}}
{{- $fromConfig := (get $health "remediation") | default dict -}}
{{- $fromValues := (($root.Values.health | default dict).remediation) | default dict -}}
{{- if or (get $fromValues $key) (get $fromConfig $key) }}true{{ end -}}
{{- end }}

{{/* The startup taint dxdp manages, key:Effect with any =value dropped (empty: none): the chart
value, or config.startupTaint. */}}
{{- define "dxdp.startupTaint" -}}
{{- $config := .Values.config | default dict -}}
{{- $t := default (default "" (get $config "startupTaint")) .Values.startupTaint | trim -}}
{{- if $t -}}
{{- $effect := regexFind "[^:]+$" $t -}}
{{- $key := regexReplaceAll "(=[^:]*)?:[^:]+$" $t "" -}}
{{- printf "%s:%s" $key $effect -}}
{{- end -}}
{{- end }}

{{/* The Secret holding the metrics endpoint's web configuration (empty: none). */}}
{{- define "dxdp.webConfigSecret" -}}
{{- if .Values.metrics.existingWebConfigSecret -}}
{{- .Values.metrics.existingWebConfigSecret -}}
{{- else if .Values.metrics.webConfig -}}
{{- printf "%s-web-config" (include "dxdp.fullname" .) -}}
{{- end -}}
{{- end }}

{{/* Whether dxdp needs the API server's credentials. */}}
{{- define "dxdp.needsToken" -}}
{{- if or .Values.nodeApi.enabled (eq (toString .Values.metrics.authorization) "kubernetes") }}true{{ end -}}
{{- end }}

{{/* Whether /metrics listens on each node's own IP (metrics.bindAddress: hostIP, the default). */}}
{{- define "dxdp.metricsOnHostIP" -}}
{{- if and .Values.metrics.enabled (eq (toString .Values.metrics.bindAddress) "hostIP") }}true{{ end -}}
{{- end }}

{{/* Whether /metrics is served over TLS: the web configuration has tls_server_config, or is
the user's own Secret (dxdp refuses bearer tokens without TLS at run time). */}}
{{- define "dxdp.metricsTLS" -}}
{{- if or .Values.metrics.existingWebConfigSecret (.Values.metrics.webConfig | default dict).tls_server_config }}true{{ end -}}
{{- end }}

{{/* Whether /metrics asks clients who they are: Kubernetes authorization, basic
authentication users, verified client certificates, or the user's own web configuration. */}}
{{- define "dxdp.metricsAuthenticated" -}}
{{- $web := .Values.metrics.webConfig | default dict }}
{{- $clientAuth := toString (($web.tls_server_config | default dict).client_auth_type) }}
{{- if or (eq (toString .Values.metrics.authorization) "kubernetes") $web.basic_auth_users (eq $clientAuth "RequireAndVerifyClientCert") .Values.metrics.existingWebConfigSecret }}true{{ end -}}
{{- end }}

{{/* The taints dxdp's pods tolerate whatever the tolerations value says: dxdp's own isolation
taint (isolation.policy: taint), so that dxdp can be rolled out on a tainted node and remove the
taint there (docs/isolation.md); and the startup taint the GPU nodes register with
(docs/install.md#startup-taint), the default key and startupTaint's: dxdp must run there to serve
the GPUs and then remove it. */}}
{{- define "dxdp.ownTolerations" -}}
- {key: directx.microsoft.com/isolation-violation, operator: Exists, effect: NoSchedule}
- {key: directx.microsoft.com/gpu-not-ready, operator: Exists}
{{- with include "dxdp.startupTaint" . }}
{{- $parts := regexSplit ":" . -1 }}
{{- if ne (index $parts 0) "directx.microsoft.com/gpu-not-ready" }}
- {key: {{ index $parts 0 | quote }}, operator: Exists, effect: {{ last $parts }}}
{{- end }}
{{- end }}
{{- end }}
