#!/usr/bin/env bash
# One Kafka node (KRaft), configured from the environment the way apache/kafka is:
#   KAFKA_FOO_BAR=v -> foo.bar=v   ("___" -> "-", "__" -> "_", "_" -> "."), written to
#   $KAFKA_CONFIG_DIR/server.properties; without any such setting, one combined node on :9092.
#   CLUSTER_ID      the id the storage is formatted with on first start (every node the same).
#   KAFKA_HEAP_OPTS, KAFKA_JVM_PERFORMANCE_OPTS, KAFKA_OPTS, KAFKA_LOG4J_OPTS: JVM flags.
#   KAFKA_LOG_LEVEL the root log level (INFO).
set -euo pipefail

config_dir=${KAFKA_CONFIG_DIR:-/opt/kafka/config}
props="${config_dir}/server.properties"
# Not broker settings: the JVM's, the image's own.
not_settings=" HOME VERSION HEAP_OPTS OPTS JVM_PERFORMANCE_OPTS LOG4J_OPTS LOG_LEVEL CONFIG_DIR JMX_OPTS GC_LOG_OPTS TOOLS_HEAP_OPTS "

{
  found=0
  while IFS='=' read -r -d '' name value; do
    [[ ${name} == KAFKA_* ]] || continue
    key=${name#KAFKA_}
    [[ ${not_settings} == *" ${key} "* ]] && continue
    key=${key,,}
    key=${key//___/-}
    key=${key//__/@}
    key=${key//_/.}
    key=${key//@/_}
    printf '%s=%s\n' "${key}" "${value}"
    found=1
  done < <(env -0)
  if [[ ${found} == 0 ]]; then
    printf '%s\n' \
      process.roles=broker,controller \
      node.id=1 \
      listeners=PLAINTEXT://:9092,CONTROLLER://:9093 \
      advertised.listeners=PLAINTEXT://localhost:9092 \
      controller.listener.names=CONTROLLER \
      controller.quorum.voters=1@localhost:9093 \
      listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT \
      offsets.topic.replication.factor=1 \
      transaction.state.log.replication.factor=1 \
      transaction.state.log.min.isr=1 \
      share.coordinator.state.topic.replication.factor=1 \
      share.coordinator.state.topic.min.isr=1
  fi
} > "${props}.new"
grep -q '^log\.dirs=' "${props}.new" || echo "log.dirs=/var/lib/kafka/data" >> "${props}.new"
mv "${props}.new" "${props}"

# apache/kafka's default id, so a volume formatted by either image starts with the other.
cluster_id=${CLUSTER_ID:-5L6g3nShT-eMCtK--X86sw}
KAFKA_TOOLS_HEAP_OPTS=-Xmx128m "$(dirname "$0")/kafka-storage.sh" \
  format --ignore-formatted "--cluster-id=${cluster_id}" --config "${props}" >/dev/null

# shellcheck disable=SC2086 # the *_OPTS variables are lists of JVM flags
exec java ${KAFKA_HEAP_OPTS:--Xms128m -Xmx512m} \
  ${KAFKA_JVM_PERFORMANCE_OPTS:--XX:+UseSerialGC -Djava.awt.headless=true} \
  ${KAFKA_LOG4J_OPTS:--Dlog4j2.configurationFile=${config_dir}/log4j2.properties} \
  ${KAFKA_OPTS:-} -cp '/opt/kafka/libs/*' kafka.Kafka "${props}"
