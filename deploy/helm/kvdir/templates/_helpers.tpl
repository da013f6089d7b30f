{{/*
Labels every object carries; selectors use app.kubernetes.io/name only, as
deploy/k8s does, so that a chart upgrade never changes a selector.
*/}}
{{- define "kvdir.labels" -}}
app.kubernetes.io/part-of: kvdir
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* A kvdir image: kvdir.image (list $ "router"). */}}
{{- define "kvdir.image" -}}
{{- $root := index . 0 -}}
{{- printf "%s%s:%s" $root.Values.image.prefix (index . 1) $root.Values.image.tag -}}
{{- end -}}

{{/* Directory ports (fixed: the compose cluster and deploy/k8s use them). */}}
{{- define "kvdir.raftPort" -}}7000{{- end -}}
{{- define "kvdir.apiPort" -}}7001{{- end -}}
{{- define "kvdir.httpPort" -}}7002{{- end -}}
{{- define "kvdir.routerPort" -}}8080{{- end -}}

{{/* The directory replica count, checked: Raft wants an odd membership. */}}
{{- define "kvdir.directoryReplicas" -}}
{{- $n := int .Values.directory.replicas -}}
{{- if or (lt $n 1) (eq (mod $n 2) 0) -}}
{{- fail (printf "directory.replicas must be odd and at least 1 (a Raft quorum), not %d" $n) -}}
{{- end -}}
{{- $n -}}
{{- end -}}

{{/* Every member's API address, by headless DNS name: what agents and routers dial. */}}
{{- define "kvdir.directoryAddrs" -}}
{{- $addrs := list -}}
{{- range $i := until (int (include "kvdir.directoryReplicas" .)) -}}
{{- $addrs = append $addrs (printf "kvdir-directory-%d.kvdir-directory-headless:%s" $i (include "kvdir.apiPort" $)) -}}
{{- end -}}
{{- join "," $addrs -}}
{{- end -}}

{{/* The Raft membership: id=raft address for each member. */}}
{{- define "kvdir.initialCluster" -}}
{{- $m := list -}}
{{- range $i := until (int (include "kvdir.directoryReplicas" .)) -}}
{{- $m = append $m (printf "kvdir-directory-%d=kvdir-directory-%d.kvdir-directory-headless:%s" $i $i (include "kvdir.raftPort" $)) -}}
{{- end -}}
{{- join "," $m -}}
{{- end -}}

{{/* The router mode, checked. */}}
{{- define "kvdir.routerMode" -}}
{{- $m := .Values.router.mode -}}
{{- if not (has $m (list "proxy" "epp")) -}}
{{- fail (printf "router.mode must be proxy or epp, not %q" $m) -}}
{{- end -}}
{{- $m -}}
{{- end -}}

{{/* The InferencePool's name. */}}
{{- define "kvdir.poolName" -}}
{{- default .Values.vllm.name .Values.router.epp.inferencePool.name -}}
{{- end -}}

{{/* The pod security context kvdir's images run with (user 65532). */}}
{{- define "kvdir.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* The container security context of every kvdir container. */}}
{{- define "kvdir.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end -}}

{{/* Scheduling keys a component's values may set (callers trim and indent). */}}
{{- define "kvdir.scheduling" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Pull secrets for every pod, from image pull Secret names. */}}
{{- define "kvdir.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- end -}}
