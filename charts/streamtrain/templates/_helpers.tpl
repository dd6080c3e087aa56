{{/* Names and labels shared by every template. */}}

{{- define "streamtrain.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "streamtrain.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "streamtrain.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "streamtrain.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: streamtrain
{{- end -}}

{{- define "streamtrain.selectorLabels" -}}
app.kubernetes.io/name: {{ include "streamtrain.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "streamtrain.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "streamtrain.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "streamtrain.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The namespaces whose jobs this release runs (namespace scope only). */}}
{{- define "streamtrain.watchNamespaces" -}}
{{- if .Values.watchNamespaces -}}
{{- join "," .Values.watchNamespaces -}}
{{- else -}}
{{- .Release.Namespace -}}
{{- end -}}
{{- end -}}

{{/*
The operator's permissions, shared by the ClusterRole and the per-namespace Roles. Least
privilege: it reads and patches its own resource (and its status), owns the children it
creates, watches pods to notice restarts, writes events, and holds one Lease per job (the
driver's fence, kube/lease.py). No secrets: pods read the
storage credentials themselves through envFrom.
*/}}
{{- define "streamtrain.rules" -}}
- apiGroups: [streamtrain.io]
  resources: [streamingtrainingjobs]
  verbs: [get, list, watch, patch, update]
- apiGroups: [streamtrain.io]
  resources: [streamingtrainingjobs/status]
  verbs: [get, patch, update]
- apiGroups: [apps]
  resources: [statefulsets]
  verbs: [get, list, watch, create, patch, update, delete]
- apiGroups: [""]
  resources: [services, configmaps]
  verbs: [get, list, watch, create, patch, update, delete]
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [events]
  verbs: [create]
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [get, create, patch]
{{- if .Values.networkPolicy.enabled }}
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, list, watch, create, patch, update, delete]
{{- end }}
{{- if eq .Values.tls.mode "cert-manager" }}
- apiGroups: [cert-manager.io]
  resources: [certificates]
  verbs: [get, list, watch, create, patch, update, delete]
{{- end }}
{{- end -}}

{{/* The Secret holding the operator's own certificate (empty: TLS off). */}}
{{- define "streamtrain.operatorTLSSecret" -}}
{{- if eq .Values.tls.mode "cert-manager" -}}
{{- include "streamtrain.fullname" . }}-operator-tls
{{- else if eq .Values.tls.mode "secret" -}}
{{- required "tls.operatorSecret is required with tls.mode=secret" .Values.tls.operatorSecret -}}
{{- end -}}
{{- end -}}
