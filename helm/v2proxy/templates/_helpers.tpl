{{/*
Names and labels. These helpers read only .Values and .Release (never .Chart), so that a parent
chart calling the v2proxy.sidecar.* templates with its .Values.v2proxy gets the same names as
this chart's own objects (the ConfigMap, for one).
*/}}
{{- define "v2proxy.name" -}}
{{- default "v2proxy" .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "v2proxy.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := include "v2proxy.name" . }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "v2proxy.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "v2proxy.selectorLabels" -}}
app.kubernetes.io/name: {{ include "v2proxy.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The proxy's pods and Service (the injector's carry component: injector instead). */}}
{{- define "v2proxy.proxySelectorLabels" -}}
{{ include "v2proxy.selectorLabels" . }}
app.kubernetes.io/component: proxy
{{- end }}

{{- define "v2proxy.labels" -}}
helm.sh/chart: {{ include "v2proxy.chart" . }}
{{ include "v2proxy.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: v2proxy
{{- end }}

{{/* repository:tag, or repository@digest where image.digest pins the build. */}}
{{- define "v2proxy.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (toString .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
The ports of proxy.backend (each host:port of its comma list), one per line, without repeats;
nothing for builtin. The proxy's NetworkPolicy lets egress reach them.
*/}}
{{- define "v2proxy.backendPorts" -}}
{{- $backend := .Values.proxy.backend | trimSuffix "/" }}
{{- if ne $backend "builtin" }}
{{- $ports := list }}
{{- range splitList "," (regexReplaceAll "^[a-z]+://" $backend "") }}
{{- $ports = append $ports (regexFind "[0-9]+$" .) }}
{{- end }}
{{- join "\n" (uniq $ports) }}
{{- end }}
{{- end }}

{{/* "native" or "classic": sidecar.mode, auto from the cluster version (native from 1.29). */}}
{{- define "v2proxy.sidecarMode" -}}
{{- $mode := .Values.sidecar.mode }}
{{- if eq $mode "auto" }}
{{- if semverCompare ">=1.29-0" .Capabilities.KubeVersion.Version }}native{{ else }}classic{{ end }}
{{- else }}
{{- $mode }}
{{- end }}
{{- end }}

{{/* Seconds a pod needs to stop: the pre-stop pause, the drain, and a margin. */}}
{{- define "v2proxy.terminationGracePeriodSeconds" -}}
{{- add (int .Values.proxy.preStopSleepSeconds) (int .Values.proxy.drainTimeout) 5 }}
{{- end }}

{{- define "v2proxy.configName" -}}
{{- printf "%s-config" (include "v2proxy.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
"true" when the chart renders a config file (proxy.mindie or proxy.openai is set): its ConfigMap,
the volume, the mount and --config; "" otherwise.
*/}}
{{- define "v2proxy.hasConfig" -}}
{{- if or .Values.proxy.mindie .Values.proxy.openai }}true{{ end }}
{{- end }}

{{/*
The config file: the mindie: and openai: sections, each where set (every other setting is an
argument). Callers trim it: so trimmed, a mindie: section alone is the text it always was.
*/}}
{{- define "v2proxy.configFile" -}}
{{- with .Values.proxy.mindie }}
mindie:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.proxy.openai }}
openai:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
The hash of what the ConfigMap holds, an annotation of the pods (a change rolls them): the
config file, then proxy.chatTemplates where there are some (without them the hash is the config
file's alone, as before they existed).
*/}}
{{- define "v2proxy.configChecksum" -}}
{{- $text := include "v2proxy.configFile" . | trim }}
{{- with .Values.proxy.chatTemplates }}
{{- $text = printf "%s\n%s" $text (toYaml .) }}
{{- end }}
{{- $text | sha256sum }}
{{- end }}

{{/*
Refuses what would render a pod v2proxy cannot start: proxy.chatTemplates without proxy.openai
(nothing would read them), and an openai model whose relative chat_template is none of
proxy.chatTemplates (the container's working directory, /tmp, is an empty emptyDir, and
/etc/v2proxy holds only the ConfigMap's keys; an absolute path may be a file of the image).
*/}}
{{- define "v2proxy.checkConfig" -}}
{{- $p := .Values.proxy }}
{{- $templates := $p.chatTemplates | default dict }}
{{- if and $templates (not $p.openai) }}
{{- fail (printf "proxy.chatTemplates (%s) needs proxy.openai: they are the chat templates its models name (chat_template: <file name>), and nothing else reads them" (keys $templates | sortAlpha | join ", ")) }}
{{- end }}
{{- if $p.openai }}
{{- range $id, $model := $p.openai.models }}
{{- $file := (($model | default dict).chat_template | default "") | toString }}
{{- if and $file (not (hasPrefix "/" $file)) (not (hasKey $templates (trimPrefix "./" $file))) }}
{{- fail (printf "proxy.openai.models.%s.chat_template: '%s' is not a key of proxy.chatTemplates (%s): give the template's text there under that file name, or an absolute path to a file of the image" $id $file (keys $templates | sortAlpha | join ", " | default "none")) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The arguments after the first nine (which the webhook also sets from annotations): settings
the chart exposes beyond those, then proxy.extraArgs. The webhook passes these as its sidecar's
extra arguments, so a chart sidecar and an injected one run with the same command line.
*/}}
{{- define "v2proxy.moreArgs" -}}
- --backend-timeout={{ .Values.proxy.backendTimeout }}
{{- $threshold := .Values.proxy.backendShmThreshold }}
- --backend-shm-threshold={{ kindIs "string" $threshold | ternary $threshold (int64 $threshold) }}
- --log-level={{ .Values.proxy.logLevel }}
- --workers={{ int .Values.proxy.workers }}
- --metrics={{ ternary "on" "off" .Values.proxy.metrics }}
- --access-log={{ ternary "on" "off" .Values.proxy.accessLog }}
{{- range .Values.proxy.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}
