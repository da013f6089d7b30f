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

{{/*
The directory groups, resolved: a JSON list with one object per entry of
directory.groups, each the directory values with the group's keys laid over
them (a map one level deep: persistence.size alone keeps
persistence.storageClassName), plus
  fullname        the objects' name: kvdir-directory for the first group (the
                  names of a one-group install, so adding a group leaves the
                  running one, its volumes and certificates as they are),
                  kvdir-directory-<name> for the others
  models          the models the group serves (empty: every model)
  addrs           every member's API address by headless DNS name (what
                  agents and routers dial), comma-separated
  initialCluster  the Raft membership: id=raft address for each member
Checked: at least one group; names DNS labels of at most 20 characters, each
once; replicas odd; a model in at most one group; at most one group with no
models (the one serving every model no other group lists).
*/}}
{{- define "kvdir.groups" -}}
{{- $d := .Values.directory -}}
{{- $base := omit $d "groups" -}}
{{- if not $d.groups -}}
{{- fail "directory.groups must list at least one group" -}}
{{- end -}}
{{- $out := list -}}
{{- $names := dict -}}
{{- $owner := dict -}}
{{- $catchAll := "" -}}
{{- range $i, $g := $d.groups -}}
{{- if not (kindIs "map" $g) -}}
{{- fail (printf "directory.groups[%d] must be a mapping (name, models, ...), not %v" $i $g) -}}
{{- end -}}
{{- $name := toString (default "" $g.name) -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]{0,18}[a-z0-9])?$" $name) -}}
{{- fail (printf "directory.groups[%d].name %q must be a DNS label (lower-case letters, digits, '-') of at most 20 characters" $i $name) -}}
{{- end -}}
{{- if hasKey $names $name -}}
{{- fail (printf "directory.groups: group name %q is used twice" $name) -}}
{{- end -}}
{{- $_ := set $names $name true -}}
{{- $m := deepCopy $base -}}
{{- range $k, $v := omit $g "name" "models" -}}
{{- if and (kindIs "map" $v) (kindIs "map" (get $base $k)) -}}
{{- $sub := deepCopy (get $base $k) -}}
{{- range $k2, $v2 := $v -}}
{{- $_ := set $sub $k2 $v2 -}}
{{- end -}}
{{- $_ := set $m $k $sub -}}
{{- else -}}
{{- $_ := set $m $k $v -}}
{{- end -}}
{{- end -}}
{{- $models := list -}}
{{- range $g.models -}}
{{- $model := toString . -}}
{{- if hasKey $owner $model -}}
{{- fail (printf "directory.groups: model %q is in groups %s and %s: a model's blocks live in one group" $model (get $owner $model) $name) -}}
{{- end -}}
{{- $_ := set $owner $model $name -}}
{{- $models = append $models $model -}}
{{- end -}}
{{- if not $models -}}
{{- if $catchAll -}}
{{- fail (printf "directory.groups: groups %s and %s both list no models (each would serve every model): give one of them models" $catchAll $name) -}}
{{- end -}}
{{- $catchAll = $name -}}
{{- end -}}
{{- $n := int $m.replicas -}}
{{- if or (lt $n 1) (eq (mod $n 2) 0) -}}
{{- fail (printf "directory.replicas must be odd and at least 1 (a Raft quorum), not %d (group %s)" $n $name) -}}
{{- end -}}
{{- $full := "kvdir-directory" -}}
{{- if gt $i 0 -}}
{{- $full = printf "kvdir-directory-%s" $name -}}
{{- end -}}
{{- $addrs := list -}}
{{- $members := list -}}
{{- range $j := until $n -}}
{{- $addrs = append $addrs (printf "%s-%d.%s-headless:%s" $full $j $full (include "kvdir.apiPort" $)) -}}
{{- $members = append $members (printf "%s-%d=%s-%d.%s-headless:%s" $full $j $full $j $full (include "kvdir.raftPort" $)) -}}
{{- end -}}
{{- $_ := set $m "name" $name -}}
{{- $_ := set $m "replicas" $n -}}
{{- $_ := set $m "fullname" $full -}}
{{- $_ := set $m "models" $models -}}
{{- $_ := set $m "addrs" (join "," $addrs) -}}
{{- $_ := set $m "initialCluster" (join "," $members) -}}
{{- $out = append $out $m -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/*
The group the engines' agents register with: the one listing the model the
vLLM pods serve (vllm.servedModelName), else the one listing no models.
kvdir.agentGroup . returns it as JSON; it fails if no group serves the model.
*/}}
{{- define "kvdir.agentGroup" -}}
{{- $model := .Values.vllm.servedModelName -}}
{{- $found := dict -}}
{{- $all := dict -}}
{{- range (include "kvdir.groups" . | fromJsonArray) -}}
{{- if has $model .models -}}
{{- $found = . -}}
{{- else if and (not .models) (not $found) -}}
{{- $all = . -}}
{{- end -}}
{{- end -}}
{{- if not $found -}}
{{- $found = $all -}}
{{- end -}}
{{- if not $found -}}
{{- fail (printf "no directory group serves model %q (vllm.servedModelName): list it in a group's models, or leave one group's models empty" $model) -}}
{{- end -}}
{{- toJson $found -}}
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
