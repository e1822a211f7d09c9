{{- define "v2proxy.injector.name" -}}
{{- printf "%s-injector" (include "v2proxy.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "v2proxy.injector.selectorLabels" -}}
{{ include "v2proxy.selectorLabels" . }}
app.kubernetes.io/component: injector
{{- end }}

{{/* native or classic for pods without v2proxy.io/sidecar-mode */}}
{{- define "v2proxy.injector.mode" -}}
{{- $mode := .Values.injector.defaultMode }}
{{- if eq $mode "auto" }}
{{- if semverCompare ">=1.29-0" .Capabilities.KubeVersion.Version }}native{{ else }}classic{{ end }}
{{- else }}
{{- $mode }}
{{- end }}
{{- end }}

{{/* The webhook's --sidecar-config: the injected container as the chart's own sidecar. */}}
{{- define "v2proxy.injector.sidecarConfig" -}}
{{- $p := .Values.proxy -}}
image: {{ include "v2proxy.image" . | quote }}
imagePullPolicy: {{ .Values.image.pullPolicy }}
mode: {{ include "v2proxy.injector.mode" . }}
backend: {{ .Values.injector.backend | quote }}
backendEncoding: {{ $p.backendEncoding }}
httpPort: {{ int $p.httpPort }}
grpcPort: {{ int $p.grpcPort }}
clientShm: {{ $p.clientShm | quote }}
backendShm: {{ $p.backendShm | quote }}
logFormat: {{ $p.logFormat }}
drainTimeout: {{ int $p.drainTimeout }}
preStopSleepSeconds: {{ int $p.preStopSleepSeconds }}
shmSizeLimit: {{ .Values.sharedMemory.sizeLimit | quote }}
resources:
  {{- toYaml ($p.resources | default dict) | nindent 2 }}
{{- with $p.securityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
extraArgs:
  {{- include "v2proxy.moreArgs" . | nindent 2 }}
{{- end }}
