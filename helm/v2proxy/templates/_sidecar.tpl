{{/*
The v2proxy container and what a pod needs around it. Public templates for other charts (add
this chart as a dependency with deployment.enabled=false; call them with a context built from
your chart's values, as README "Deploying" shows):

  {{- $v2 := dict "Values" .Values.v2proxy "Release" .Release "Capabilities" .Capabilities }}
  terminationGracePeriodSeconds: {{ include "v2proxy.terminationGracePeriodSeconds" $v2 }}
  {{- if eq (include "v2proxy.sidecarMode" $v2) "native" }}
  initContainers:
    {{- include "v2proxy.sidecar.initContainers" $v2 | nindent 4 }}
  {{- end }}
  containers:
    - name: model-server
      volumeMounts:
        {{- include "v2proxy.sidecar.volumeMounts" $v2 | nindent 8 }}
    {{- include "v2proxy.sidecar.containers" $v2 | nindent 4 }}
  volumes:
    {{- include "v2proxy.sidecar.volumes" $v2 | nindent 4 }}

v2proxy.sidecar.initContainers renders the sidecar in native mode and nothing in classic mode,
v2proxy.sidecar.containers the reverse. The ConfigMap of proxy.mindie is rendered by this chart
(as a dependency too) under the same name.
*/}}

{{/* The container; argument: dict "ctx" <context> "native" <bool> "shm" <bool>. */}}
{{- define "v2proxy.container" -}}
{{- $v := .ctx.Values }}
{{- $p := $v.proxy -}}
- name: v2proxy
  image: {{ include "v2proxy.image" .ctx | quote }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  {{- if .native }}
  restartPolicy: Always
  {{- end }}
  args:
    - serve
    - --backend={{ $p.backend }}
    - --backend-encoding={{ $p.backendEncoding }}
    - --http-port={{ int $p.httpPort }}
    - --grpc-port={{ int $p.grpcPort }}
    - --client-shm={{ $p.clientShm }}
    - --backend-shm={{ $p.backendShm }}
    - --log-format={{ $p.logFormat }}
    - --drain-timeout={{ int $p.drainTimeout }}
    {{- if $p.mindie }}
    - --config=/etc/v2proxy/config.yaml
    {{- end }}
    {{- include "v2proxy.moreArgs" .ctx | nindent 4 }}
  {{- with $p.extraEnv }}
  env:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  ports:
    - name: v2proxy-http
      containerPort: {{ int $p.httpPort }}
      protocol: TCP
    - name: v2proxy-grpc
      containerPort: {{ int $p.grpcPort }}
      protocol: TCP
  livenessProbe:
    httpGet: {path: /v2/health/live, port: v2proxy-http}
    {{- toYaml $p.probes.liveness | nindent 4 }}
  readinessProbe:
    # ready only while the backend is (v2proxy asks it) and not while draining
    httpGet: {path: /v2/health/ready, port: v2proxy-http}
    {{- toYaml $p.probes.readiness | nindent 4 }}
  startupProbe:
    httpGet: {path: /v2/health/live, port: v2proxy-http}
    {{- toYaml $p.probes.startup | nindent 4 }}
  lifecycle:
    preStop:
      exec:
        command: [sleep, {{ $p.preStopSleepSeconds | toString | quote }}]
  {{- with $p.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $p.securityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    - name: v2proxy-tmp
      mountPath: /tmp
    {{- if and .shm $v.sharedMemory.enabled }}
    - name: v2proxy-shm
      mountPath: /dev/shm
    {{- end }}
    {{- if $p.mindie }}
    - name: v2proxy-config
      mountPath: /etc/v2proxy
      readOnly: true
    {{- end }}
{{- end }}

{{- define "v2proxy.sidecar.initContainers" -}}
{{- if eq (include "v2proxy.sidecarMode" .) "native" }}
{{- include "v2proxy.container" (dict "ctx" . "native" true "shm" true) }}
{{- end }}
{{- end }}

{{- define "v2proxy.sidecar.containers" -}}
{{- if eq (include "v2proxy.sidecarMode" .) "classic" }}
{{- include "v2proxy.container" (dict "ctx" . "native" false "shm" true) }}
{{- end }}
{{- end }}

{{/* The model server's mount of the shared /dev/shm (nothing when sharedMemory is off). */}}
{{- define "v2proxy.sidecar.volumeMounts" -}}
{{- if .Values.sharedMemory.enabled }}
- name: v2proxy-shm
  mountPath: /dev/shm
{{- end }}
{{- end }}

{{/* Argument: the context; with "shm" false (standalone) no shared memory volume. */}}
{{- define "v2proxy.sidecar.volumes" -}}
- name: v2proxy-tmp
  emptyDir:
    sizeLimit: 64Mi
{{- if and .Values.sharedMemory.enabled (ne (toString .shm) "false") }}
- name: v2proxy-shm
  emptyDir:
    medium: Memory
    sizeLimit: {{ .Values.sharedMemory.sizeLimit }}
{{- end }}
{{- if .Values.proxy.mindie }}
- name: v2proxy-config
  configMap:
    name: {{ include "v2proxy.configName" . }}
{{- end }}
{{- end }}
