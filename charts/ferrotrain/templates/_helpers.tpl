{{- define "ferrotrain.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "ferrotrain.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "ferrotrain.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "ferrotrain.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "ferrotrain.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ferrotrain.name" . }}-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "ferrotrain.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "ferrotrain.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "ferrotrain.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "ferrotrain.trainerImage" -}}
{{- printf "%s:%s" .Values.trainerImage.repository (default .Chart.AppVersion .Values.trainerImage.tag) -}}
{{- end -}}
