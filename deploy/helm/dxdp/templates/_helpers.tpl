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
{{- fail "refusing to install into the default namespace: install into its own namespace (helm install dxdp deploy/helm/dxdp --namespace dxdp-system --create-namespace, labelled pod-security.kubernetes.io/enforce=privileged; docs/install.md), or set allowDefaultNamespace=true" }}
{{- end }}
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
