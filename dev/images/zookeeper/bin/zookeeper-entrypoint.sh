#!/usr/bin/env bash
# ZooKeeper in the foreground. Unless $ZOO_CONF_DIR/zoo.cfg exists (a mounted file), it is
# written from the environment as the official zookeeper image does: ZOO_TICK_TIME,
# ZOO_INIT_LIMIT, ZOO_SYNC_LIMIT, ZOO_MAX_CLIENT_CNXNS, ZOO_STANDALONE_ENABLED,
# ZOO_ADMINSERVER_ENABLED, ZOO_AUTOPURGE_PURGEINTERVAL, ZOO_AUTOPURGE_SNAPRETAINCOUNT,
# ZOO_4LW_COMMANDS_WHITELIST, ZOO_MY_ID, ZOO_SERVERS, ZOO_CFG_EXTRA. JVMFLAGS: extra JVM flags;
# ZK_SERVER_HEAP: the heap in MB (256).
set -euo pipefail

config="${ZOO_CONF_DIR}/zoo.cfg"
if [[ ! -f ${config} ]]; then
  {
    echo "dataDir=${ZOO_DATA_DIR}"
    echo "dataLogDir=${ZOO_DATA_LOG_DIR}"
    echo "tickTime=${ZOO_TICK_TIME:-2000}"
    echo "initLimit=${ZOO_INIT_LIMIT:-5}"
    echo "syncLimit=${ZOO_SYNC_LIMIT:-2}"
    echo "autopurge.snapRetainCount=${ZOO_AUTOPURGE_SNAPRETAINCOUNT:-3}"
    echo "autopurge.purgeInterval=${ZOO_AUTOPURGE_PURGEINTERVAL:-0}"
    echo "maxClientCnxns=${ZOO_MAX_CLIENT_CNXNS:-60}"
    echo "standaloneEnabled=${ZOO_STANDALONE_ENABLED:-true}"
    # The pinned jars carry no Jetty: the AdminServer is off unless asked for.
    echo "admin.enableServer=${ZOO_ADMINSERVER_ENABLED:-false}"
    echo "4lw.commands.whitelist=${ZOO_4LW_COMMANDS_WHITELIST:-srvr,ruok,mntr}"
    if [[ -n ${ZOO_SERVERS:-} ]]; then
      for server in ${ZOO_SERVERS}; do echo "${server}"; done
    else
      echo "clientPort=2181"
    fi
    for extra in ${ZOO_CFG_EXTRA:-}; do echo "${extra}"; done
  } > "${config}"
fi
if [[ -n ${ZOO_MY_ID:-} && ! -f ${ZOO_DATA_DIR}/myid ]]; then
  echo "${ZOO_MY_ID}" > "${ZOO_DATA_DIR}/myid"
fi

# shellcheck disable=SC2086 # JVMFLAGS is a list of JVM flags
exec java "-Xmx${ZK_SERVER_HEAP:-256}m" -XX:+UseSerialGC -Dzookeeper.jmx.log4j.disable=true \
  ${JVMFLAGS:-} -cp '/opt/zookeeper/lib/*' \
  org.apache.zookeeper.server.quorum.QuorumPeerMain "${config}"
