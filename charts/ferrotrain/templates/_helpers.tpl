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

{{/*
An image reference: repository@digest when a digest is set (the tag is then ignored: the
digest alone names the bytes), else repository:tag (the tag defaults to the chart's appVersion).
Called with a dict: image (the values' image block), default (the default tag), what (the
values key, for the error message).
*/}}
{{- define "ferrotrain.imageRef" -}}
{{- with .image.digest -}}
{{- if not (regexMatch "^sha256:[0-9a-f]{64}$" .) -}}
{{- fail (printf "%s.digest must be sha256: and 64 lowercase hex digits, got %q" $.what .) -}}
{{- end -}}
{{- printf "%s@%s" $.image.repository . -}}
{{- else -}}
{{- printf "%s:%s" .image.repository (default .default .image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "ferrotrain.image" -}}
{{- include "ferrotrain.imageRef" (dict "image" .Values.image "default" .Chart.AppVersion "what" "image") -}}
{{- end -}}

{{- define "ferrotrain.trainerImage" -}}
{{- include "ferrotrain.imageRef" (dict "image" .Values.trainerImage "default" .Chart.AppVersion "what" "trainerImage") -}}
{{- end -}}

{{- define "ferrotrain.leaseName" -}}
{{- default (printf "%s-operator" (include "ferrotrain.fullname" .)) .Values.leaderElection.leaseName -}}
{{- end -}}
