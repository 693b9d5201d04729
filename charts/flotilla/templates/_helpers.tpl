{{/* Names, labels and images shared by the templates. */}}

{{- define "flotilla.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's base name: the release name, or "<release>-flotilla" unless it contains the chart name. */}}
{{- define "flotilla.fullname" -}}
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

{{- define "flotilla.operatorName" -}}
{{- printf "%s-operator" (include "flotilla.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "flotilla.webhookServiceName" -}}
{{- printf "%s-operator-webhook" (include "flotilla.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "flotilla.webhookSecretName" -}}
{{- if eq .Values.webhook.tls.mode "secret" }}
{{- required "webhook.tls.secretName is required when webhook.tls.mode is secret" .Values.webhook.tls.secretName }}
{{- else }}
{{- printf "%s-operator-webhook-tls" (include "flotilla.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "flotilla.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "flotilla.operatorName" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "flotilla.selectorLabels" -}}
app.kubernetes.io/name: {{ include "flotilla.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "flotilla.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "flotilla.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: flotilla
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- /*
The labels of an observability object from (list <root> <user labels>): the chart's labels (component
"observability") with the user's merged over them, a user's value winning for a key both set (written once:
a key written twice would leave the winner to the YAML reader). Sorted by key.
*/ -}}
{{- define "flotilla.observabilityLabels" -}}
{{- $chart := include "flotilla.labels" (index . 0) | fromYaml }}
{{- $_ := set $chart "app.kubernetes.io/component" "observability" }}
{{- merge (deepCopy (index . 1 | default dict)) $chart | toYaml }}
{{- end }}

{{- /*
An image reference from (list <image values> <value path> <root>): "repository@digest" when a digest
is set (the tag is then not used: a digest pins the exact image), else "repository:tag", the tag
defaulting to the chart's appVersion.
*/ -}}
{{- define "flotilla.image" -}}
{{- $image := index . 0 }}
{{- with $image.digest }}
{{- if not (regexMatch "^sha256:[0-9a-f]{64}$" .) }}
{{- fail (printf "%s.digest must be sha256:<64 hex digits>, not %q" (index $ 1) .) }}
{{- end }}
{{- printf "%s@%s" $image.repository . }}
{{- else }}
{{- printf "%s:%s" $image.repository (default (index $ 2).Chart.AppVersion $image.tag) }}
{{- end }}
{{- end }}

{{- define "flotilla.operatorImage" -}}
{{- include "flotilla.image" (list .Values.operator.image "operator.image" .) }}
{{- end }}

{{- define "flotilla.engineImage" -}}
{{- include "flotilla.image" (list .Values.engine.image "engine.image" .) }}
{{- end }}

{{/* The DNS name the webhook certificate is made for (what the apiserver checks). */}}
{{- define "flotilla.webhookHost" -}}
{{- printf "%s.%s.svc" (include "flotilla.webhookServiceName" .) .Release.Namespace }}
{{- end }}

{{/* The operator's rules on namespaced objects: a ClusterRole's, or each watched namespace's Role's. */}}
{{- /*
"true" when operator.watchNamespaces lists plain names only (no glob): those namespaces can be named
in Roles and in the webhooks' namespaceSelector; a glob matches namespaces made later. Else "".
*/ -}}
{{- define "flotilla.plainWatchNamespaces" -}}
{{- $glob := false }}
{{- range .Values.operator.watchNamespaces }}
{{- if or (contains "*" .) (contains "?" .) (contains "[" .) }}{{ $glob = true }}{{ end }}
{{- end }}
{{- if and .Values.operator.watchNamespaces (not $glob) }}true{{ end }}
{{- end }}

{{- define "flotilla.namespacedRules" -}}
# InferenceServices: watched by kopf (list, watch), read and annotated per reconcile (get, patch).
- apiGroups: [serving.flotilla.dev]
  resources: [inferenceservices]
  verbs: [get, list, watch, patch]
# Status is written with a merge patch of the status subresource.
- apiGroups: [serving.flotilla.dev]
  resources: [inferenceservices/status]
  verbs: [patch]
# While an autoscaler owns the Deployment's count, it is copied into spec.replicas through the scale subresource.
- apiGroups: [serving.flotilla.dev]
  resources: [inferenceservices/scale]
  verbs: [patch]
# Children carry an owner reference with blockOwnerDeletion, which the OwnerReferencesPermission-
# Enforcement admission plugin allows only to those who may update the owner's finalizers.
- apiGroups: [serving.flotilla.dev]
  resources: [inferenceservices/finalizers]
  verbs: [update]
# Children applied with server-side apply (patch; an apply that makes the object is also checked
# as create), read before (get), watched for drift (list, watch). Deployments and Services are
# never removed by the operator (the garbage collector does it through the owner references).
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch]
- apiGroups: [""]
  resources: [services]
  verbs: [get, list, watch, create, patch]
# Children the spec may stop asking for are also deleted.
- apiGroups: [autoscaling]
  resources: [horizontalpodautoscalers]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [monitoring.coreos.com]
  resources: [servicemonitors]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [keda.sh]
  resources: [scaledobjects]
  verbs: [get, list, watch, create, patch, delete]
# One Event per decision, posted on the InferenceService.
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- if .Values.operator.serving.periodSeconds }}
# The serving reader lists the engine pods (by label) to read their /metrics for status.serving; off
# (periodSeconds 0), nothing may read every pod's spec.
- apiGroups: [""]
  resources: [pods]
  verbs: [list]
# ...and their ReplicaSets (by label), to read only the pods the InferenceService's own Deployment made (owner
# uids: a pod's ReplicaSet, that ReplicaSet's Deployment); read-only, and the same pod template pods/list shows.
- apiGroups: [apps]
  resources: [replicasets]
  verbs: [list]
{{- end }}
{{- end }}

{{/*
The chart-made webhook certificate's expiry date (YYYY-MM-DD), prefixed "keep:" while the existing
Secret's certificate is kept or "new:" when one is made: on install, when the Secret is missing, or
when its recorded expiry falls within webhook.tls.renewBeforeDays. Included by webhook.yaml (which
makes the certificate) and deployment.yaml (whose pod annotation then changes, so the operator
restarts on the new certificate); both compute it from the same lookup, so they agree.
*/}}
{{- define "flotilla.webhookCertificate" -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "flotilla.webhookSecretName" .) }}
{{- $renewBy := now | dateModify (printf "%dh" (mul 24 (int .Values.webhook.tls.renewBeforeDays))) | date "2006-01-02" }}
{{- $recorded := "" }}
{{- $complete := false }}
{{- if $existing }}
{{- $complete = index ($existing.data | default dict) "ca.crt" }}
{{- $recorded = index (($existing.metadata).annotations | default dict) "serving.flotilla.dev/not-after" | default "" }}
{{- end }}
{{- /* A Secret from a chart version that recorded no expiry is kept (it was made for 10 years). */}}
{{- if and $complete (or (not $recorded) (ge $recorded $renewBy)) }}
{{- printf "keep:%s" $recorded }}
{{- else }}
{{- printf "new:%s" (now | dateModify (printf "%dh" (mul 24 (int .Values.webhook.tls.validityDays))) | date "2006-01-02") }}
{{- end }}
{{- end }}
