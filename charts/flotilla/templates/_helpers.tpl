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

{{- define "flotilla.operatorImage" -}}
{{- printf "%s:%s" .Values.operator.image.repository (default .Chart.AppVersion .Values.operator.image.tag) }}
{{- end }}

{{- define "flotilla.engineImage" -}}
{{- printf "%s:%s" .Values.engine.image.repository (default .Chart.AppVersion .Values.engine.image.tag) }}
{{- end }}

{{/* The DNS name the webhook certificate is made for (what the apiserver checks). */}}
{{- define "flotilla.webhookHost" -}}
{{- printf "%s.%s.svc" (include "flotilla.webhookServiceName" .) .Release.Namespace }}
{{- end }}
