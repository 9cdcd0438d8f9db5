{{/* Helpers of the admission policies (own-node-policy.yaml, validation-policy.yaml). */}}

{{/* Whether the chart renders the ValidatingAdmissionPolicies that hold dxdp's token to its own
Node (and, with validation, to its own validation Job shape): nodeApi.enabled and
nodeApi.enforceOwnNode. Fails where they cannot be enforced: Kubernetes below 1.30 (no
admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy, no node-name claim in service-account
tokens), or, on a cluster, an API server that does not serve the API. */}}
{{- define "dxdp.enforceOwnNode" -}}
{{- if and .Values.nodeApi.enabled .Values.nodeApi.enforceOwnNode -}}
{{- $kube := .Capabilities.KubeVersion.Version -}}
{{- if not (semverCompare ">=1.30.0-0" $kube) -}}
{{- fail (printf "nodeApi.enforceOwnNode: Kubernetes %s cannot hold each node's dxdp to its own Node: that needs ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1) and the node-name claim in service-account tokens, both from Kubernetes 1.30. Upgrade the cluster, or install without the limit by setting nodeApi.enforceOwnNode=false (then every node's token may patch every Node%s; docs/install.md#rbac-and-admission-policies)" $kube (ternary ", and with validation.enabled create Jobs in this privileged namespace" "" (eq (include "dxdp.validationEnabled" .) "true"))) -}}
{{- end -}}
{{- /* On a cluster Helm lists every served kind ("v1/Namespace" among them); offline
(helm template) only group versions, and the version above decides. */ -}}
{{- if and (.Capabilities.APIVersions.Has "v1/Namespace") (not (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy")) -}}
{{- fail "nodeApi.enforceOwnNode: the API server does not serve admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy (turned off with --runtime-config?), so the chart cannot hold each node's dxdp to its own Node. Serve it, or set nodeApi.enforceOwnNode=false to install without the limit (docs/install.md#rbac-and-admission-policies)" -}}
{{- end -}}
true
{{- end -}}
{{- end }}

{{/* The node label key prefix dxdp writes under: nodeLabels.prefix, else config.nodeLabels.prefix,
else directx.microsoft.com/ (with existingConfigMap the chart cannot read the file: set
nodeLabels.prefix when the file changes it). */}}
{{- define "dxdp.labelPrefix" -}}
{{- $config := .Values.config | default dict -}}
{{- $labels := (get $config "nodeLabels") | default dict -}}
{{- default (default "directx.microsoft.com/" (get $labels "prefix")) .Values.nodeLabels.prefix -}}
{{- end }}

{{/* The validation's host directory as dxdp uses it (trimmed; default C:\var\lib\dxdp\validation). */}}
{{- define "dxdp.validationHostDir" -}}
{{- $config := .Values.config | default dict -}}
{{- $val := (get $config "validation") | default dict -}}
{{- $dir := default (default "" (get $val "hostDir")) (.Values.validation | default dict).hostDir | trim -}}
{{- default "C:\\var\\lib\\dxdp\\validation" $dir -}}
{{- end }}

{{/* The images a validation Job may use, as a JSON list; fails when validation.image (or
config.validation.image) is not one of them. */}}
{{- define "dxdp.validationImages" -}}
{{- $config := .Values.config | default dict -}}
{{- $val := (get $config "validation") | default dict -}}
{{- $images := (.Values.validation | default dict).allowedImages | default list -}}
{{- $image := default (default "" (get $val "image")) (.Values.validation | default dict).image | trim -}}
{{- if not $images -}}
{{- fail "validation.allowedImages is empty: list the images validation Jobs may use (the default: mcr.microsoft.com/windows/servercore:ltsc2019, :ltsc2022 and :ltsc2025; or these pinned by digest)" -}}
{{- end -}}
{{- if and $image (not (has $image $images)) -}}
{{- fail (printf "validation.image %s is not in validation.allowedImages %v: the admission policy would refuse every validation Job. Add it to validation.allowedImages (the default list is Server Core ltsc2019/2022/2025)" $image $images) -}}
{{- end -}}
{{- toJson $images -}}
{{- end }}

{{/* The matchCondition of both policies: requests made with dxdp's service account. */}}
{{- define "dxdp.policyUser" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "dxdp.serviceAccountName" .) -}}
{{- end }}
