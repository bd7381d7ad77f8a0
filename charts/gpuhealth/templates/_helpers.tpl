{{/* Labels every object carries; the selectors use app.kubernetes.io/name only (one release per cluster). */}}
{{- define "gpuhealth.labels" -}}
app.kubernetes.io/part-of: gpuhealth
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{- define "gpuhealth.operatorLabels" -}}
app.kubernetes.io/name: gpuhealth-operator
app.kubernetes.io/component: operator
{{ include "gpuhealth.labels" . }}
{{- end }}

{{- define "gpuhealth.agentLabels" -}}
app.kubernetes.io/name: gpuhealth-agent
app.kubernetes.io/component: agent
{{ include "gpuhealth.labels" . }}
{{- end }}

{{- define "gpuhealth.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The service-account usernames the admission policies match. */}}
{{- define "gpuhealth.agentUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:gpuhealth-agent
{{- end }}
{{- define "gpuhealth.operatorUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:gpuhealth-operator
{{- end }}

{{/* Restricted container security context, shared by the operator, the agent and the sidecar. */}}
{{- define "gpuhealth.containerSecurityContext" -}}
runAsNonRoot: true
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* The agent container: in the agent DaemonSet, or as a sidecar of the DCGM exporter's pods. */}}
{{- define "gpuhealth.agentContainer" -}}
name: {{ .name | default "agent" }}
image: {{ include "gpuhealth.image" .root }}
imagePullPolicy: {{ .root.Values.image.pullPolicy }}
command:
  - gpuhealth-agent
env:
  - name: NODE_NAME
    valueFrom:
      fieldRef:
        fieldPath: spec.nodeName
  # The heartbeat: a Lease named after the node, in the agent's own namespace.
  - name: GPUHEALTH_LEASE_NAMESPACE
    valueFrom:
      fieldRef:
        fieldPath: metadata.namespace
  - name: NVIDIA_VISIBLE_DEVICES
    value: all
  - name: NVIDIA_DRIVER_CAPABILITIES
    value: utility
  - name: GPUHEALTH_METRICS_PORT
    value: {{ .root.Values.agent.metricsPort | quote }}
  # The local XID journal: an XID NVML delivered survives an agent crash or container restart
  # (an emptyDir lives as long as the pod; no hostPath, no privileges).
  - name: GPUHEALTH_STATE_DIR
    value: /var/lib/gpuhealth-agent
  - name: GPUHEALTH_SYSFS_ROOT
    value: {{ .root.Values.agent.nics.sysfsRoot | default "" | quote }}
  {{- with .root.Values.agent.nics.exclude }}
  - name: GPUHEALTH_NIC_EXCLUDE
    value: {{ join "," . | quote }}
  {{- end }}
  {{- with .dcgmUrl }}
  - name: GPUHEALTH_DCGM_URL
    value: {{ . | quote }}
  {{- end }}
  {{- if .root.Values.agent.podResources.enabled }}
  # The kubelet's pod-resources socket: which pods hold each GPU (agent.podResources).
  - name: GPUHEALTH_POD_RESOURCES_SOCKET
    value: /var/lib/kubelet/pod-resources/kubelet.sock
  - name: GPUHEALTH_POD_RESOURCES_TIMEOUT
    value: {{ .root.Values.agent.podResources.timeoutSeconds | quote }}
  {{- end }}
ports:
  - name: {{ .portName | default "metrics" }}
    containerPort: {{ .root.Values.agent.metricsPort }}
    protocol: TCP
livenessProbe:
  httpGet:
    path: /healthz
    port: {{ .portName | default "metrics" }}
  initialDelaySeconds: 30
  periodSeconds: 30
  timeoutSeconds: 5
  failureThreshold: 3
resources:
  {{- toYaml .root.Values.agent.resources | nindent 2 }}
securityContext:
  {{- if .root.Values.agent.podResources.enabled }}
  # uid 0, every capability dropped: the kubelet's socket (0755) and its directory (0750) are root's,
  # and only their owner may connect (agent.podResources in values.yaml says why nothing less works).
  runAsUser: 0
  runAsNonRoot: false
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities:
    drop: [ALL]
  seccompProfile:
    type: RuntimeDefault
  {{- else }}
  {{- include "gpuhealth.containerSecurityContext" .root | nindent 2 }}
  {{- end }}
volumeMounts:
  - name: {{ .volume | default "tmp" }}
    mountPath: /tmp
  - name: state
    mountPath: /var/lib/gpuhealth-agent
  {{- if .root.Values.agent.podResources.enabled }}
  - name: pod-resources
    mountPath: /var/lib/kubelet/pod-resources
    readOnly: true
  {{- end }}
{{- end }}

{{/* The host directory of the kubelet's pod-resources socket, when the agent reads it. */}}
{{- define "gpuhealth.podResourcesVolume" -}}
{{- if .Values.agent.podResources.enabled }}
- name: pod-resources
  hostPath:
    path: {{ required "agent.podResources.hostPath" .Values.agent.podResources.hostPath }}
    type: Directory
{{- end }}
{{- end }}
