{{/* Chart name, truncated to a DNS label. */}}
{{- define "agentserve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: release-chart, unless the release name already contains the chart name. */}}
{{- define "agentserve.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "agentserve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "agentserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "agentserve.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "agentserve.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: agentserve
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "agentserve.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "agentserve.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "agentserve.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
Rules on the objects the operator manages, in the namespaces it watches. It must hold every
permission it grants in the router's Role (endpointslices), or the apiserver refuses to create it.
*/}}
{{- define "agentserve.namespacedRules" -}}
- apiGroups: ["agentserve.dev"]
  resources: ["agentservingdeployments"]
  verbs: ["get", "list", "watch", "patch", "update"]
- apiGroups: ["agentserve.dev"]
  resources: ["agentservingdeployments/status"]
  verbs: ["get", "patch", "update"]
# Granted on to the planner's Role (spec.autoscaling): RBAC lets the operator grant only what it holds.
- apiGroups: ["agentserve.dev"]
  resources: ["agentservingdeployments/scale"]
  verbs: ["get", "patch"]
- apiGroups: [""]
  resources: ["configmaps", "services", "serviceaccounts"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
# The frontends' signing-key Secret: created when missing, never read or changed (no other verb).
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create"]
- apiGroups: ["apps"]
  resources: ["deployments", "statefulsets"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
- apiGroups: ["monitoring.coreos.com"]
  resources: ["servicemonitors"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["get", "list", "watch"]
# patch: granted on to the planner (pod-deletion-cost on the worker it would remove first).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "patch"]
# The frontend's HorizontalPodAutoscaler (spec.frontend.autoscaling).
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
- apiGroups: ["", "events.k8s.io"]
  resources: ["events"]
  verbs: ["create"]
{{- if .Values.peering.enabled }}
# kopf peering in a watched namespace (when watchNamespaces is set).
- apiGroups: ["kopf.dev"]
  resources: ["kopfpeerings"]
  verbs: ["get", "list", "watch", "patch"]
{{- end }}
{{- end }}
