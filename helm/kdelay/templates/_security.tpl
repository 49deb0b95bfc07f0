{{/*
Security towards Kafka and ZooKeeper, the proxy's Kafka listener and its HTTP API.

Every secret reaches a pod only by reference: a key of an existing Secret mounted as a file
(mode 0440, group fsGroup) whose path the component is given in the environment
(KDELAY_<COMPONENT>_KAFKA_SASL_PASSWORD_FILE, ..._ZK_AUTH_PASSWORD_FILE), so no password is
ever in a value, a ConfigMap, an environment variable or `kubectl describe`. Certificates, keys, CA
bundles and the JWKS are mounted the same way (ConfigMaps allowed for what is public). The
settings are the components' own (env = prefix + upper-case setting name); nothing is rendered
unless it is asked for, so the default render has no security environment and no volume more.

Pass (dict "ctx" $ "component" "proxy"|"delayService"|"verifier"). The verifier uses no
ZooKeeper: it gets the Kafka part only.
*/}}

{{- define "kdelay.security.prefix" -}}
{{- if eq .component "proxy" }}KDELAY_PROXY_{{ else if eq .component "verifier" }}KDELAY_VERIFIER_{{ else }}KDELAY_REPLICA_{{ end -}}
{{- end -}}

{{/* Mount points (fixed: the components are told them in the environment). */}}
{{- define "kdelay.security.paths" -}}
kafkaPassword: /etc/kdelay/secrets/kafka/password
kafkaCa: /etc/kdelay/tls/kafka-ca/ca.crt
zkPassword: /etc/kdelay/secrets/zookeeper/password
zkCa: /etc/kdelay/tls/zookeeper-ca/ca.crt
listenerCert: /etc/kdelay/tls/listener/tls.crt
listenerKey: /etc/kdelay/tls/listener/tls.key
httpCert: /etc/kdelay/tls/http/tls.crt
httpKey: /etc/kdelay/tls/http/tls.key
jwks: /etc/kdelay/jwks/jwks.json
{{- end -}}

{{/* A volume with one key of a Secret or a ConfigMap as `path`; pass (dict "name" "secret"
"configMap" "key" "path" "what"). */}}
{{- define "kdelay.security.keyVolume" -}}
{{- if and .secret .configMap -}}
{{- fail (printf "%s: set existingSecret or existingConfigMap, not both" .what) -}}
{{- end }}
- name: {{ .name }}
  {{- if .secret }}
  secret:
    secretName: {{ .secret }}
  {{- else }}
  configMap:
    name: {{ .configMap }}
  {{- end }}
    defaultMode: 288  # 0440: owner root, group fsGroup (the pods' user is in it)
    items:
      {{- range $key, $path := .items }}
      - key: {{ $key }}
        path: {{ $path }}
      {{- end }}
{{- end -}}

{{/* Kafka: the component's SASL credentials and CA; fails on an incomplete setting. */}}
{{- define "kdelay.security.kafka" -}}
{{- $k := .ctx.Values.kafka -}}
{{- $protocol := $k.securityProtocol | default "PLAINTEXT" -}}
{{- $sasl := hasPrefix "SASL_" $protocol -}}
{{- $tls := has $protocol (list "SSL" "SASL_SSL") -}}
{{- $user := index $k.sasl .component -}}
{{- $what := printf "kafka.sasl.%s" .component -}}
{{- if $sasl -}}
{{- if not $user.username -}}
{{- fail (printf "%s.username is required when kafka.securityProtocol is %s" $what $protocol) -}}
{{- end -}}
{{- if not $user.existingSecret -}}
{{- fail (printf "%s.existingSecret is required when kafka.securityProtocol is %s (the chart takes no password: create a Secret with the password of %s under key %s)" $what $protocol $user.username $user.passwordKey) -}}
{{- end -}}
{{- end -}}
{{- $ca := $k.tls.ca -}}
{{- $hasCa := and $tls (or $ca.existingSecret $ca.existingConfigMap) -}}
{{- toJson (dict "protocol" $protocol "sasl" $sasl "user" $user "ca" $ca "hasCa" $hasCa) -}}
{{- end -}}

{{/* ZooKeeper: digest user and TLS; fails on an incomplete setting. */}}
{{- define "kdelay.security.zk" -}}
{{- if eq .component "verifier" -}}
{{- toJson (dict "auth" dict "tls" false "ca" dict "hasCa" false) -}}
{{- else -}}
{{- $z := .ctx.Values.zookeeper -}}
{{- $auth := $z.auth | default dict -}}
{{- $tls := $z.tls | default dict -}}
{{- if and $auth.username (not $auth.existingSecret) -}}
{{- fail "zookeeper.auth.existingSecret is required with zookeeper.auth.username (the chart takes no password)" -}}
{{- end -}}
{{- if and $auth.existingSecret (not $auth.username) -}}
{{- fail "zookeeper.auth.existingSecret is set without zookeeper.auth.username" -}}
{{- end -}}
{{- $ca := $tls.ca | default dict -}}
{{- $hasCa := or $ca.existingSecret $ca.existingConfigMap -}}
{{- if and $hasCa (not $tls.enabled) -}}
{{- fail "zookeeper.tls.ca is set but zookeeper.tls.enabled is false" -}}
{{- end -}}
{{- toJson (dict "auth" $auth "tls" (default false $tls.enabled) "ca" $ca "hasCa" $hasCa) -}}
{{- end -}}
{{- end -}}

{{/* The proxy's listener and HTTP API; fails on a contradiction the proxy would refuse. */}}
{{- define "kdelay.security.proxy" -}}
{{- $v := .Values -}}
{{- $l := $v.proxy.kafkaListener | default dict -}}
{{- $h := $v.proxy.httpApi | default dict -}}
{{- $protocol := $l.securityProtocol | default "PLAINTEXT" -}}
{{- $listenerTls := has $protocol (list "SSL" "SASL_SSL") -}}
{{- $lt := $l.tls | default dict -}}
{{- if and $listenerTls (not $lt.existingSecret) -}}
{{- fail (printf "proxy.kafkaListener.tls.existingSecret is required when proxy.kafkaListener.securityProtocol is %s" $protocol) -}}
{{- end -}}
{{- if and $lt.existingSecret (not $listenerTls) -}}
{{- fail (printf "proxy.kafkaListener.tls.existingSecret is set but proxy.kafkaListener.securityProtocol is %s (SSL or SASL_SSL use it)" $protocol) -}}
{{- end -}}
{{- if and (hasPrefix "SASL_" $protocol) (not (hasPrefix "SASL_" ($v.kafka.securityProtocol | default "PLAINTEXT"))) -}}
{{- fail (printf "proxy.kafkaListener.securityProtocol %s relays each client's login to Kafka: kafka.securityProtocol must be SASL_SSL or SASL_PLAINTEXT" $protocol) -}}
{{- end -}}
{{- $ht := $h.tls | default dict -}}
{{- $jwks := $h.jwks | default dict -}}
{{- $auth := $h.auth | default "none" -}}
{{- if and (eq $auth "kafka") (not $ht.existingSecret) (not (index $v.proxy.extraConfig "http_allow_plaintext_auth")) -}}
{{- fail "proxy.httpApi.auth=kafka takes passwords and tokens: set proxy.httpApi.tls.existingSecret (HTTPS), or proxy.extraConfig.http_allow_plaintext_auth=true where TLS ends before the pod" -}}
{{- end -}}
{{- if and $jwks.existingConfigMap (ne $auth "kafka") -}}
{{- fail "proxy.httpApi.jwks.existingConfigMap needs proxy.httpApi.auth=kafka" -}}
{{- end -}}
{{- /* Secure by default (proxy/secure_defaults.py): no open door beside a locked one. */ -}}
{{- $httpOpen := or $h.allowUnauthenticated (index $v.proxy.extraConfig "http_allow_unauthenticated") -}}
{{- $listenerOpen := or $l.allowUnauthenticated (index $v.proxy.extraConfig "listener_allow_unauthenticated") -}}
{{- $upstreamSasl := hasPrefix "SASL_" ($v.kafka.securityProtocol | default "PLAINTEXT") -}}
{{- if and (hasPrefix "SASL_" $protocol) (eq $auth "none") (not $httpOpen) -}}
{{- fail (printf "proxy.kafkaListener.securityProtocol %s requires a SASL login but the HTTP API requires none (proxy.httpApi.auth=none): set proxy.httpApi.auth=kafka, or proxy.httpApi.allowUnauthenticated=true to let anyone who reaches it act as the proxy's Kafka user" $protocol) -}}
{{- end -}}
{{- if and $upstreamSasl (not (hasPrefix "SASL_" $protocol)) (not $listenerOpen) -}}
{{- fail (printf "kafka.securityProtocol %s requires a SASL login but the proxy's Kafka listener requires none (proxy.kafkaListener.securityProtocol %s): set proxy.kafkaListener.securityProtocol SASL_SSL or SASL_PLAINTEXT, or proxy.kafkaListener.allowUnauthenticated=true to let every producer write as the proxy's Kafka user" $v.kafka.securityProtocol $protocol) -}}
{{- end -}}
{{- toJson (dict "protocol" $protocol "listenerTls" $listenerTls "listener" $lt "mechanisms" ($l.saslMechanisms | default list) "auth" $auth "mechanism" ($h.saslMechanism | default "SCRAM-SHA-512") "httpTls" $ht "jwks" $jwks "httpOpen" $h.allowUnauthenticated "listenerOpen" $l.allowUnauthenticated) -}}
{{- end -}}

{{/* Whether the proxy's HTTP API is HTTPS ("true" or ""). */}}
{{- define "kdelay.proxy.https" -}}
{{- with .Values.proxy.httpApi }}{{ with .tls }}{{ if .existingSecret }}true{{ end }}{{ end }}{{ end -}}
{{- end -}}

{{/* Environment entries (a YAML list, possibly empty). */}}
{{- define "kdelay.security.env" -}}
{{- $prefix := include "kdelay.security.prefix" . -}}
{{- $paths := include "kdelay.security.paths" . | fromYaml -}}
{{- $kafka := include "kdelay.security.kafka" . | fromJson -}}
{{- $zk := include "kdelay.security.zk" . | fromJson -}}
{{- if ne $kafka.protocol "PLAINTEXT" }}
- name: {{ $prefix }}KAFKA_SECURITY_PROTOCOL
  value: {{ $kafka.protocol | quote }}
{{- end }}
{{- if $kafka.sasl }}
- name: {{ $prefix }}KAFKA_SASL_MECHANISM
  value: {{ .ctx.Values.kafka.sasl.mechanism | quote }}
- name: {{ $prefix }}KAFKA_SASL_USERNAME
  value: {{ $kafka.user.username | quote }}
- name: {{ $prefix }}KAFKA_SASL_PASSWORD_FILE
  value: {{ $paths.kafkaPassword }}
{{- if eq .component "delayService" }}
{{- /* Only the proxy's user (and the replicas' own) may WRITE the buffer topic: another
       writer stops the replicas (docs/security.md, "The buffer's writers"). */}}
- name: {{ $prefix }}BUFFER_WRITERS
  value: {{ printf "User:%s" (index .ctx.Values.kafka.sasl "proxy").username | quote }}
{{- end }}
{{- end }}
{{- if $kafka.hasCa }}
- name: {{ $prefix }}KAFKA_SSL_CA_FILE
  value: {{ $paths.kafkaCa }}
{{- end }}
{{- if $zk.auth.username }}
- name: {{ $prefix }}ZK_AUTH_USERNAME
  value: {{ $zk.auth.username | quote }}
- name: {{ $prefix }}ZK_AUTH_PASSWORD_FILE
  value: {{ $paths.zkPassword }}
{{- end }}
{{- if $zk.tls }}
- name: {{ $prefix }}ZK_TLS
  value: "true"
{{- end }}
{{- if $zk.hasCa }}
- name: {{ $prefix }}ZK_TLS_CA_FILE
  value: {{ $paths.zkCa }}
{{- end }}
{{- if eq .component "proxy" }}
{{- $p := include "kdelay.security.proxy" .ctx | fromJson }}
{{- if ne $p.protocol "PLAINTEXT" }}
- name: KDELAY_PROXY_LISTENER_SECURITY_PROTOCOL
  value: {{ $p.protocol | quote }}
{{- end }}
{{- if $p.listenerTls }}
- name: KDELAY_PROXY_TLS_CERT
  value: {{ $paths.listenerCert }}
- name: KDELAY_PROXY_TLS_KEY
  value: {{ $paths.listenerKey }}
{{- end }}
{{- if and (hasPrefix "SASL_" $p.protocol) $p.mechanisms }}
- name: KDELAY_PROXY_SASL_MECHANISMS
  value: {{ toJson $p.mechanisms | quote }}
{{- end }}
{{- if $p.httpTls.existingSecret }}
- name: KDELAY_PROXY_HTTP_TLS_CERT
  value: {{ $paths.httpCert }}
- name: KDELAY_PROXY_HTTP_TLS_KEY
  value: {{ $paths.httpKey }}
{{- end }}
{{- if ne $p.auth "none" }}
- name: KDELAY_PROXY_HTTP_AUTH
  value: {{ $p.auth | quote }}
- name: KDELAY_PROXY_HTTP_SASL_MECHANISM
  value: {{ $p.mechanism | quote }}
{{- end }}
{{- if $p.jwks.existingConfigMap }}
- name: KDELAY_PROXY_HTTP_JWKS_FILE
  value: {{ $paths.jwks }}
{{- end }}
{{- if $p.httpOpen }}
- name: KDELAY_PROXY_HTTP_ALLOW_UNAUTHENTICATED
  value: "true"
{{- end }}
{{- if $p.listenerOpen }}
- name: KDELAY_PROXY_LISTENER_ALLOW_UNAUTHENTICATED
  value: "true"
{{- end }}
{{- end }}
{{- end -}}

{{/* Volumes (a YAML list, possibly empty). */}}
{{- define "kdelay.security.volumes" -}}
{{- $paths := include "kdelay.security.paths" . | fromYaml -}}
{{- $kafka := include "kdelay.security.kafka" . | fromJson -}}
{{- $zk := include "kdelay.security.zk" . | fromJson -}}
{{- if $kafka.sasl }}
{{- include "kdelay.security.keyVolume" (dict "name" "kafka-sasl" "secret" $kafka.user.existingSecret "items" (dict $kafka.user.passwordKey "password") "what" (printf "kafka.sasl.%s" .component)) }}
{{- end }}
{{- if $kafka.hasCa }}
{{- include "kdelay.security.keyVolume" (dict "name" "kafka-ca" "secret" $kafka.ca.existingSecret "configMap" $kafka.ca.existingConfigMap "items" (dict $kafka.ca.key "ca.crt") "what" "kafka.tls.ca") }}
{{- end }}
{{- if $zk.auth.username }}
{{- include "kdelay.security.keyVolume" (dict "name" "zk-auth" "secret" $zk.auth.existingSecret "items" (dict $zk.auth.passwordKey "password") "what" "zookeeper.auth") }}
{{- end }}
{{- if $zk.hasCa }}
{{- include "kdelay.security.keyVolume" (dict "name" "zk-ca" "secret" $zk.ca.existingSecret "configMap" $zk.ca.existingConfigMap "items" (dict $zk.ca.key "ca.crt") "what" "zookeeper.tls.ca") }}
{{- end }}
{{- if eq .component "proxy" }}
{{- $p := include "kdelay.security.proxy" .ctx | fromJson }}
{{- if $p.listenerTls }}
{{- include "kdelay.security.keyVolume" (dict "name" "listener-tls" "secret" $p.listener.existingSecret "items" (dict $p.listener.certKey "tls.crt" $p.listener.keyKey "tls.key") "what" "proxy.kafkaListener.tls") }}
{{- end }}
{{- if $p.httpTls.existingSecret }}
{{- include "kdelay.security.keyVolume" (dict "name" "http-tls" "secret" $p.httpTls.existingSecret "items" (dict $p.httpTls.certKey "tls.crt" $p.httpTls.keyKey "tls.key") "what" "proxy.httpApi.tls") }}
{{- end }}
{{- if $p.jwks.existingConfigMap }}
{{- include "kdelay.security.keyVolume" (dict "name" "http-jwks" "configMap" $p.jwks.existingConfigMap "items" (dict $p.jwks.key "jwks.json") "what" "proxy.httpApi.jwks") }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Volume mounts matching kdelay.security.volumes (a YAML list, possibly empty). */}}
{{- define "kdelay.security.volumeMounts" -}}
{{- $kafka := include "kdelay.security.kafka" . | fromJson -}}
{{- $zk := include "kdelay.security.zk" . | fromJson -}}
{{- $mounts := dict -}}
{{- if $kafka.sasl }}{{ $_ := set $mounts "kafka-sasl" "/etc/kdelay/secrets/kafka" }}{{ end -}}
{{- if $kafka.hasCa }}{{ $_ := set $mounts "kafka-ca" "/etc/kdelay/tls/kafka-ca" }}{{ end -}}
{{- if $zk.auth.username }}{{ $_ := set $mounts "zk-auth" "/etc/kdelay/secrets/zookeeper" }}{{ end -}}
{{- if $zk.hasCa }}{{ $_ := set $mounts "zk-ca" "/etc/kdelay/tls/zookeeper-ca" }}{{ end -}}
{{- if eq .component "proxy" -}}
{{- $p := include "kdelay.security.proxy" .ctx | fromJson -}}
{{- if $p.listenerTls }}{{ $_ := set $mounts "listener-tls" "/etc/kdelay/tls/listener" }}{{ end -}}
{{- if $p.httpTls.existingSecret }}{{ $_ := set $mounts "http-tls" "/etc/kdelay/tls/http" }}{{ end -}}
{{- if $p.jwks.existingConfigMap }}{{ $_ := set $mounts "http-jwks" "/etc/kdelay/jwks" }}{{ end -}}
{{- end -}}
{{- range $name, $path := $mounts }}
- name: {{ $name }}
  mountPath: {{ $path }}
  readOnly: true
{{- end }}
{{- end -}}
