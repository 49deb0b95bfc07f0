#!/usr/bin/env bash
# The verifier image's entrypoint: `kdelay ARGS` (the driver: `kdelay verify ...`), or a Spark
# executor when Spark on Kubernetes starts this image with the single argument `executor`.
#
# Spark's Kubernetes scheduler backend creates each executor pod with args ["executor"] and its
# settings in the environment (SPARK_DRIVER_URL, SPARK_EXECUTOR_ID, ..., and the JVM options as
# SPARK_JAVA_OPT_0, _1, ...): what Spark's own image's entrypoint.sh reads. This is that part of
# it, on PySpark's jars (the `verifier` extra installs them; no separate Spark distribution).
set -euo pipefail

if [ "${1:-}" != "executor" ]; then
  exec kdelay "$@"
fi

spark_home="$(python -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')"
export SPARK_HOME="${spark_home}"
# SPARK_JAVA_OPT_<n>=<option>, in n's numeric order (an option may hold spaces).
java_opts=()
while IFS= read -r name; do
  java_opts+=("${!name}")
done < <(compgen -e | grep '^SPARK_JAVA_OPT_' | sort -t_ -k4 -n)
classpath="${spark_home}/jars/*"
if [ -n "${SPARK_EXTRA_CLASSPATH:-}" ]; then
  classpath="${classpath}:${SPARK_EXTRA_CLASSPATH}"
fi
exec "${JAVA_HOME}/bin/java" \
  "${java_opts[@]}" \
  "-Xms${SPARK_EXECUTOR_MEMORY}" "-Xmx${SPARK_EXECUTOR_MEMORY}" \
  -cp "${classpath}" \
  org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
  --driver-url "${SPARK_DRIVER_URL}" \
  --executor-id "${SPARK_EXECUTOR_ID}" \
  --cores "${SPARK_EXECUTOR_CORES}" \
  --app-id "${SPARK_APPLICATION_ID}" \
  --hostname "${SPARK_EXECUTOR_POD_IP}" \
  --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID:-0}" \
  --podName "${SPARK_EXECUTOR_POD_NAME}"
