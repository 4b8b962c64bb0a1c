{{/*
Names, labels and the pieces every workload template shares.

The templates whose names start with "tokenstamp.container" and
"tokenstamp.volumes" are the sidecar interface: another chart that depends on
this one renders tokenstamp inside its own pod with

  containers:
    {{- include "tokenstamp.container" .Subcharts.tokenstamp | nindent 8 }}
  volumes:
    {{- include "tokenstamp.volumes" .Subcharts.tokenstamp | nindent 8 }}

Each takes this chart's own scope (.Values, .Release, .Chart), which a parent
chart reaches as .Subcharts.<name>.
*/}}

{{/* Chart name, overridable, truncated to the 63 characters of a label. */}}
{{- define "tokenstamp.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full object name: the release name, with the chart name unless the release
name contains it already. Truncated to 63 characters (a DNS label).
*/}}
{{- define "tokenstamp.fullname" -}}
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

{{/* Namespace of namespaced objects. */}}
{{- define "tokenstamp.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Chart name and version, for the helm.sh/chart label (never a selector). */}}
{{- define "tokenstamp.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels that select this release's pods: stable across upgrades. */}}
{{- define "tokenstamp.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tokenstamp.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "tokenstamp.labels" -}}
helm.sh/chart: {{ include "tokenstamp.chart" . }}
{{ include "tokenstamp.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: tokenstamp
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Name of the ServiceAccount the pods run as. */}}
{{- define "tokenstamp.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "tokenstamp.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Image reference: registry/repository, then @digest or :tag. */}}
{{- define "tokenstamp.image" -}}
{{- $repository := .Values.image.repository }}
{{- if .Values.image.registry }}
{{- $repository = printf "%s/%s" .Values.image.registry .Values.image.repository }}
{{- end }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" $repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/*
"true" when this chart renders a workload: always in standalone mode; in
sidecar mode only when sidecar.modelServer describes the model server.
*/}}
{{- define "tokenstamp.rendersWorkload" -}}
{{- if or (eq .Values.mode "standalone") (not (empty .Values.sidecar.modelServer)) }}true{{ end }}
{{- end }}

{{/* "true" when this chart renders its Service. */}}
{{- define "tokenstamp.rendersService" -}}
{{- if and .Values.service.enabled (include "tokenstamp.rendersWorkload" .) }}true{{ end }}
{{- end }}

{{/* Upstream URL: configured, or the model server beside us in sidecar mode. */}}
{{- define "tokenstamp.upstream" -}}
{{- if .Values.config.upstream }}
{{- .Values.config.upstream }}
{{- else if eq .Values.mode "sidecar" }}
{{- printf "http://127.0.0.1:%d" (int .Values.sidecar.modelServerPort) }}
{{- else }}
{{- fail "config.upstream is required in standalone mode: the URL of the model server's Service, e.g. http://vllm.inference.svc:8000" }}
{{- end }}
{{- end }}

{{/* Drain timeout in seconds: configured, or the proxy's default of 30. */}}
{{- define "tokenstamp.drainTimeout" -}}
{{- if kindIs "invalid" .Values.config.drainTimeout }}30{{ else }}{{ .Values.config.drainTimeout | toJson }}{{ end }}
{{- end }}

{{/* Pod terminationGracePeriodSeconds: always above the drain timeout. */}}
{{- define "tokenstamp.terminationGracePeriodSeconds" -}}
{{- $drain := include "tokenstamp.drainTimeout" . | float64 }}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds }}
{{- add (ceil $drain | int) 15 }}
{{- else if le (float64 .Values.terminationGracePeriodSeconds) $drain }}
{{- fail (printf "terminationGracePeriodSeconds (%v) must be above config.drainTimeout (%v), or Kubernetes kills the proxy while it drains" .Values.terminationGracePeriodSeconds $drain) }}
{{- else }}
{{- .Values.terminationGracePeriodSeconds | int }}
{{- end }}
{{- end }}

{{/*
Command-line flags of `tokenstamp serve` (the image's entrypoint), one list
item each. Every key of .Values.config maps to the flag of the same name in
kebab-case; null and empty values are left out so the proxy's default holds.
*/}}
{{- define "tokenstamp.args" -}}
- {{ printf "--upstream=%s" (include "tokenstamp.upstream" .) | quote }}
- {{ printf "--listen=0.0.0.0:%d" (int .Values.ports.proxy) | quote }}
- {{ printf "--admin=0.0.0.0:%d" (int .Values.ports.admin) | quote }}
- {{ printf "--backend-name=%s" (.Values.config.backendName | default (include "tokenstamp.fullname" .)) | quote }}
{{- range $key, $value := omit .Values.config "upstream" "backendName" }}
{{- $flag := kebabcase $key }}
{{- if kindIs "bool" $value }}
- {{ printf "--%s=%t" $flag $value | quote }}
{{- else if kindIs "slice" $value }}
{{- if $value }}
- {{ printf "--%s=%s" $flag (join "," $value) | quote }}
{{- end }}
{{- else if kindIs "string" $value }}
{{- if $value }}
- {{ printf "--%s=%s" $flag $value | quote }}
{{- end }}
{{- else if not (kindIs "invalid" $value) }}
- {{ printf "--%s=%s" $flag (toJson $value) | quote }}
{{- end }}
{{- end }}
{{- range .Values.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}

{{/* Environment of the tokenstamp container: downward API and OTEL_*. */}}
{{- define "tokenstamp.env" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
- name: OTEL_SERVICE_NAME
  value: {{ .Values.otel.serviceName | default (include "tokenstamp.fullname" .) | quote }}
{{- $attributes := list "k8s.pod.name=$(POD_NAME)" "k8s.namespace.name=$(POD_NAMESPACE)" "k8s.node.name=$(NODE_NAME)" }}
{{- range $key, $value := .Values.otel.resourceAttributes }}
{{- $attributes = append $attributes (printf "%s=%v" $key $value) }}
{{- end }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: {{ join "," $attributes | quote }}
{{- with .Values.otel.endpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ . | quote }}
{{- end }}
{{- with .Values.otel.protocol }}
- name: OTEL_EXPORTER_OTLP_PROTOCOL
  value: {{ . | quote }}
{{- end }}
{{- with .Values.otel.tracesSampler }}
- name: OTEL_TRACES_SAMPLER
  value: {{ . | quote }}
{{- end }}
{{- with .Values.otel.tracesSamplerArg }}
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ . | quote }}
{{- end }}
{{- if .Values.otel.headersSecret.name }}
- name: OTEL_EXPORTER_OTLP_HEADERS
  valueFrom:
    secretKeyRef:
      name: {{ .Values.otel.headersSecret.name | quote }}
      key: {{ required "otel.headersSecret.key is required with otel.headersSecret.name" .Values.otel.headersSecret.key | quote }}
{{- end }}
{{- range $name, $value := .Values.otel.env }}
- name: {{ $name | quote }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
The tokenstamp container, as one item of a pod's `containers` list. The pod
must also carry the volumes of "tokenstamp.volumes".
*/}}
{{- define "tokenstamp.container" -}}
- name: tokenstamp
  image: {{ include "tokenstamp.image" . | quote }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  args:
    {{- include "tokenstamp.args" . | nindent 4 }}
  env:
    {{- include "tokenstamp.env" . | nindent 4 }}
  {{- with .Values.envFrom }}
  envFrom:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  ports:
    - name: proxy
      containerPort: {{ .Values.ports.proxy }}
      protocol: TCP
    - name: admin
      containerPort: {{ .Values.ports.admin }}
      protocol: TCP
  livenessProbe:
    httpGet:
      path: /healthz
      port: admin
    {{- toYaml .Values.livenessProbe | nindent 4 }}
  readinessProbe:
    httpGet:
      path: /readyz
      port: admin
    {{- toYaml .Values.readinessProbe | nindent 4 }}
  {{- with .Values.lifecycle }}
  lifecycle:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
  resources:
    {{- toYaml .Values.resources | nindent 4 }}
  volumeMounts:
    - name: tokenstamp-tmp
      mountPath: /tmp
    {{- with .Values.extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end }}

{{/* Pod volumes the tokenstamp container needs, plus extraVolumes. */}}
{{- define "tokenstamp.volumes" -}}
- name: tokenstamp-tmp
  emptyDir:
    sizeLimit: 64Mi
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Rule groups of every file under files/rules/, in file-name order. */}}
{{- define "tokenstamp.ruleGroups" -}}
{{- $groups := list }}
{{- range $path, $_ := .Files.Glob "files/rules/*.yaml" }}
{{- $doc := $.Files.Get $path | fromYaml }}
{{- if hasKey $doc "Error" }}
{{- fail (printf "%s is not valid YAML: %s" $path $doc.Error) }}
{{- end }}
{{- $groups = concat $groups ($doc.groups | default list) }}
{{- end }}
{{- if $groups }}
{{- toYaml $groups }}
{{- end }}
{{- end }}

{{/* Fail early, naming the value, on combinations that cannot work. */}}
{{- define "tokenstamp.validate" -}}
{{- if and .Values.podMonitor.enabled .Values.serviceMonitor.enabled }}
{{- fail "podMonitor.enabled and serviceMonitor.enabled: choose one, or every pod is scraped twice" }}
{{- end }}
{{- if and .Values.serviceMonitor.enabled (not (include "tokenstamp.rendersService" .)) }}
{{- fail "serviceMonitor.enabled needs the chart's Service (service.enabled, and in sidecar mode sidecar.modelServer); use podMonitor instead" }}
{{- end }}
{{- if eq (int .Values.ports.proxy) (int .Values.ports.admin) }}
{{- fail "ports.proxy and ports.admin must differ" }}
{{- end }}
{{- if and (not (empty .Values.sidecar.modelServer)) (ne .Values.mode "sidecar") }}
{{- fail "sidecar.modelServer is set but mode is not \"sidecar\"" }}
{{- end }}
{{- with .Values.sidecar.modelServer }}
{{- if not .name }}
{{- fail "sidecar.modelServer.name is required" }}
{{- end }}
{{- if eq .name "tokenstamp" }}
{{- fail "sidecar.modelServer.name must not be \"tokenstamp\": that is the proxy's container" }}
{{- end }}
{{- if not .image }}
{{- fail "sidecar.modelServer.image is required" }}
{{- end }}
{{- range .ports }}
{{- if has (int .containerPort) (list (int $.Values.ports.proxy) (int $.Values.ports.admin)) }}
{{- fail (printf "sidecar.modelServer port %v collides with ports.proxy or ports.admin" .containerPort) }}
{{- end }}
{{- end }}
{{- end }}
{{- $_ := include "tokenstamp.terminationGracePeriodSeconds" . }}
{{- $_ = include "tokenstamp.upstream" . }}
{{- end }}

{{/* A map as `k=v, k=v`, for NOTES.txt. */}}
{{- define "tokenstamp.inlineMap" -}}
{{- $pairs := list }}
{{- range $key, $value := . }}
{{- $pairs = append $pairs (printf "%s=%v" $key $value) }}
{{- end }}
{{- join ", " $pairs }}
{{- end }}
