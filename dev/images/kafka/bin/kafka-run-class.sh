#!/usr/bin/env bash
# kafka-run-class.sh CLASS ARGS: a Kafka class on the image's classpath, with the tools' logging
# (warnings to stderr) unless KAFKA_LOG4J_OPTS says otherwise.
set -euo pipefail
log4j=${KAFKA_LOG4J_OPTS:--Dlog4j2.configurationFile=/opt/kafka/config/tools-log4j2.properties}
# shellcheck disable=SC2086 # the *_OPTS variables are lists of JVM flags
exec java ${KAFKA_TOOLS_HEAP_OPTS:--Xmx256m} -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
  ${log4j} -cp '/opt/kafka/libs/*' "$@"
