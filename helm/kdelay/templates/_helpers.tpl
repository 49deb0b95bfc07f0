{{/*
Names and labels, after the conventions of the Bitnami and Strimzi charts.
*/}}

{{/* Chart name, overridable. */}}
{{- define "kdelay.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Fully qualified app name, at most 63 characters (DNS label limit). */}}
{{- define "kdelay.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "kdelay.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Component resource names. */}}
{{- define "kdelay.proxy.fullname" -}}
{{- printf "%s-proxy" (include "kdelay.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- define "kdelay.verifier.fullname" -}}
{{- printf "%s-verifier" (include "kdelay.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kdelay.verifier.image" -}}
{{- include "kdelay.imageRef" (dict "image" .Values.verifier.image "ctx" .) -}}
{{- end -}}

{{- define "kdelay.delayService.fullname" -}}
{{- printf "%s-delay-service" (include "kdelay.fullname" .) | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- define "kdelay.delayService.headless" -}}
{{- printf "%s-headless" (include "kdelay.delayService.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels; pass (dict "ctx" $ "component" "proxy"). */}}
{{- define "kdelay.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kdelay.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Standard labels; pass (dict "ctx" $ "component" "proxy"), component may be empty. */}}
{{- define "kdelay.labels" -}}
helm.sh/chart: {{ include "kdelay.chart" .ctx }}
app.kubernetes.io/name: {{ include "kdelay.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: kdelay
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
{{- with .ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "kdelay.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kdelay.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "kdelay.image" -}}
{{- include "kdelay.imageRef" (dict "image" .Values.image "ctx" .) -}}
{{- end -}}

{{/* An image reference from image values ({repository, tag, digest}): the digest when set,
else the tag, else the chart's appVersion. Pass (dict "image" <values> "ctx" $). */}}
{{- define "kdelay.imageRef" -}}
{{- $i := .image -}}
{{- if $i.digest -}}
{{- printf "%s@%s" $i.repository $i.digest -}}
{{- else -}}
{{- printf "%s:%s" $i.repository (default .ctx.Chart.AppVersion $i.tag) -}}
{{- end -}}
{{- end -}}

{{/* The proxy's advertised host (empty in podIP mode: it comes from the downward API). */}}
{{- define "kdelay.proxy.advertisedHost" -}}
{{- $adv := .Values.proxy.advertised -}}
{{- if eq $adv.mode "fixed" -}}
{{- required "proxy.advertised.host is required when proxy.advertised.mode is fixed" $adv.host -}}
{{- else if eq $adv.mode "service" -}}
{{- printf "%s.%s.svc.%s" (include "kdelay.proxy.fullname" .) .Release.Namespace .Values.clusterDomain -}}
{{- end -}}
{{- end -}}

{{- define "kdelay.proxy.advertisedPort" -}}
{{- $adv := .Values.proxy.advertised -}}
{{- if gt (int $adv.port) 0 -}}
{{- $adv.port -}}
{{- else if eq $adv.mode "podIP" -}}
{{- .Values.proxy.kafkaPort -}}
{{- else -}}
{{- .Values.proxy.service.kafkaPort -}}
{{- end -}}
{{- end -}}

{{/*
Pod anti-affinity from a preset; pass (dict "ctx" $ "component" "proxy" "preset" "soft").
*/}}
{{- define "kdelay.podAntiAffinity" -}}
{{- if eq .preset "soft" -}}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "kdelay.selectorLabels" (dict "ctx" .ctx "component" .component) | nindent 12 }}
{{- else if eq .preset "hard" -}}
podAntiAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    - topologyKey: kubernetes.io/hostname
      labelSelector:
        matchLabels:
          {{- include "kdelay.selectorLabels" (dict "ctx" .ctx "component" .component) | nindent 10 }}
{{- end }}
{{- end -}}

{{/*
A probe from values: custom override, else the default action plus the timing values.
Pass (dict "probe" .Values.x.livenessProbe "custom" .Values.x.customLivenessProbe "action" (dict ...)).
*/}}
{{- define "kdelay.probe" -}}
{{- if .custom -}}
{{- toYaml .custom -}}
{{- else -}}
{{- toYaml (merge (dict) .action (omit .probe "enabled")) -}}
{{- end -}}
{{- end -}}

{{/* Checksums of the rendered config, so pods roll when it changes. */}}
{{- define "kdelay.configChecksums" -}}
checksum/config: {{ include (print .Template.BasePath "/configmap.yaml") . | sha256sum }}
{{- end -}}

{{/* Volumes and mounts shared by both components (security ones: _security.tpl). */}}
{{- define "kdelay.commonVolumes" -}}
- name: config
  configMap:
    name: {{ include "kdelay.fullname" . }}-config
- name: tmp
  emptyDir: {}
{{- end -}}

{{- define "kdelay.commonVolumeMounts" -}}
- name: config
  mountPath: /etc/kdelay/config
  readOnly: true
- name: tmp
  mountPath: /tmp
{{- end -}}
