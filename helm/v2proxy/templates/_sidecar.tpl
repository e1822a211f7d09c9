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
v2proxy.sidecar.containers the reverse. The ConfigMap of proxy.mindie, proxy.openai and
proxy.chatTemplates is rendered by this chart (as a dependency too) under the same name; its
hash, include "v2proxy.configChecksum" $v2, is an annotation that rolls your pods when it
changes. The Secrets of tls.* are yours to make.
*/}}

{{- define "v2proxy.tlsDir" -}}/etc/v2proxy-tls{{- end }}
{{- define "v2proxy.backendTlsDir" -}}/etc/v2proxy-backend-tls{{- end }}

{{/* v2proxy's TLS arguments from tls.* (the Secrets mounted by v2proxy.tlsMounts). */}}
{{- define "v2proxy.tlsArgs" -}}
{{- $t := .Values.tls }}
{{- if $t.secretName }}
- --tls-cert={{ include "v2proxy.tlsDir" . }}/tls.crt
- --tls-key={{ include "v2proxy.tlsDir" . }}/tls.key
{{- if $t.clientAuth }}
- --tls-client-ca={{ include "v2proxy.tlsDir" . }}/{{ $t.clientCAKey }}
{{- end }}
{{- end }}
{{- if $t.backend.secretName }}
- --backend-ca={{ include "v2proxy.backendTlsDir" . }}/{{ $t.backend.caKey }}
{{- if $t.backend.clientCertificate }}
- --backend-cert={{ include "v2proxy.backendTlsDir" . }}/tls.crt
- --backend-key={{ include "v2proxy.backendTlsDir" . }}/tls.key
{{- end }}
{{- end }}
{{- end }}

{{/* A probe of ``path``; argument: dict "ctx" <context> "path" <path>. HTTPS with tls.secretName;
a TCP check of the port with mutual TLS (kubelet presents no client certificate). */}}
{{- define "v2proxy.probe" -}}
{{- $t := .ctx.Values.tls }}
{{- if and $t.secretName $t.clientAuth -}}
tcpSocket: {port: v2proxy-http}
{{- else if $t.secretName -}}
httpGet: {path: {{ .path }}, port: v2proxy-http, scheme: HTTPS}
{{- else -}}
httpGet: {path: {{ .path }}, port: v2proxy-http}
{{- end }}
{{- end }}

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
    {{- if include "v2proxy.hasConfig" .ctx }}
    - --config=/etc/v2proxy/config.yaml
    {{- end }}
    {{- with include "v2proxy.tlsArgs" .ctx | trim }}
    {{- . | nindent 4 }}
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
    {{- include "v2proxy.probe" (dict "ctx" .ctx "path" "/v2/health/live") | nindent 4 }}
    {{- toYaml $p.probes.liveness | nindent 4 }}
  readinessProbe:
    # ready only while the backend is (v2proxy asks it) and not while draining
    {{- include "v2proxy.probe" (dict "ctx" .ctx "path" "/v2/health/ready") | nindent 4 }}
    {{- toYaml $p.probes.readiness | nindent 4 }}
  startupProbe:
    {{- include "v2proxy.probe" (dict "ctx" .ctx "path" "/v2/health/live") | nindent 4 }}
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
    {{- if include "v2proxy.hasConfig" .ctx }}
    - name: v2proxy-config
      mountPath: /etc/v2proxy
      readOnly: true
    {{- end }}
    {{- if $v.tls.secretName }}
    - name: v2proxy-tls
      mountPath: {{ include "v2proxy.tlsDir" .ctx }}
      readOnly: true
    {{- end }}
    {{- if $v.tls.backend.secretName }}
    - name: v2proxy-backend-tls
      mountPath: {{ include "v2proxy.backendTlsDir" .ctx }}
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
{{- if include "v2proxy.hasConfig" . }}
- name: v2proxy-config
  configMap:
    name: {{ include "v2proxy.configName" . }}
{{- end }}
{{- if .Values.tls.secretName }}
- name: v2proxy-tls
  secret:
    secretName: {{ .Values.tls.secretName }}
{{- end }}
{{- if .Values.tls.backend.secretName }}
- name: v2proxy-backend-tls
  secret:
    secretName: {{ .Values.tls.backend.secretName }}
{{- end }}
{{- end }}
