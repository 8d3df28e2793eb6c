#!/usr/bin/env bash
# A Spark standalone cluster on this machine for the tests and the benchmark: one master and
# CDCFLOW_SPARK_WORKERS workers (default 2), each a JVM of its own started with `spark-class`
# from the installed PySpark (no download), all on 127.0.0.1. An application (cdcflow with
# spark.master: spark://127.0.0.1:<port>) then gets executors in JVMs of their own, with their
# own Python workers: the driver/executor boundaries that local[N] hides.
#
#   CDCFLOW_SPARK_CLUSTER_HOME    logs, pid files and the workers' work dirs (default ./.spark-cluster)
#   CDCFLOW_SPARK_MASTER_PORT     the master's port on 127.0.0.1 (default 27077)
#   CDCFLOW_SPARK_WORKERS         number of workers (default 2)
#   CDCFLOW_SPARK_WORKER_CORES    cores each worker offers (default 1)
#   CDCFLOW_SPARK_WORKER_MEMORY   memory each worker offers to executors (default 1g)
#   CDCFLOW_SPARK_DAEMON_MEMORY   heap of the master and worker JVMs themselves (default 256m)
#   CDCFLOW_SPARK_START_TIMEOUT   seconds to wait for each JVM (default 90)
#   CDCFLOW_PYTHON                the Python with pyspark (default ./.venv/bin/python)
#   JAVA_HOME                     the Java (17+); else `java` from PATH
#
# Usage: scripts/spark/cluster.sh start|stop|status
#   start   start what is not running (idempotent); prints the master URL on the last line
#   stop    stop the workers, then the master (SIGTERM, SIGKILL after 20 s)
#   status  the master URL and the running JVMs; exit 1 when the master is not running
# The web UIs take free ports (--webui-port 0). Logs: <home>/master.log, <home>/worker-N.log.
set -euo pipefail

HOME_DIR="${CDCFLOW_SPARK_CLUSTER_HOME:-./.spark-cluster}"
case "$HOME_DIR" in
  /*) ;;
  *) HOME_DIR="$PWD/${HOME_DIR#./}" ;;
esac
HOME_DIR="${HOME_DIR%/}"
PORT="${CDCFLOW_SPARK_MASTER_PORT:-27077}"
WORKERS="${CDCFLOW_SPARK_WORKERS:-2}"
CORES="${CDCFLOW_SPARK_WORKER_CORES:-1}"
MEMORY="${CDCFLOW_SPARK_WORKER_MEMORY:-1g}"
TIMEOUT="${CDCFLOW_SPARK_START_TIMEOUT:-90}"
PY="${CDCFLOW_PYTHON:-$PWD/.venv/bin/python}"
URL="spark://127.0.0.1:$PORT"

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
[ $# -eq 1 ] || { usage >&2; exit 2; }

role_pid() {  # pid of the running JVM of a role (master, worker-N) of this home, else fails
  local pid args
  pid="$(cat "$HOME_DIR/$1.pid" 2>/dev/null)" || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  args="$(ps -ww -o args= -p "$pid" 2>/dev/null)" || return 1
  case "$args" in
    *"-Dcdcflow.spark.role=$1 -Dcdcflow.spark.home=$HOME_DIR "*) echo "$pid" ;;
    *) return 1 ;;
  esac
}

spark_home() {
  [ -x "$PY" ] || { echo "spark-cluster: no Python at $PY (run scripts/bootstrap.sh)" >&2; exit 1; }
  "$PY" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))' 2>/dev/null || {
    echo "spark-cluster: pyspark is not installed in $PY (uv sync --extra spark)" >&2
    exit 1
  }
}

launch() {  # launch <role> <main class> [args...]: a detached spark-class JVM
  local role=$1
  shift
  local log="$HOME_DIR/$role.log"
  [ -f "$log" ] && mv -f "$log" "$log.1"
  # spark-class runs the launcher, then execs java (the pid stays the JVM's); the two
  # -Dcdcflow.spark.* options come first, so role_pid recognises the JVM; the JVM does not
  # inherit the start lock (fd 9), or a later start would wait for it until the JVM ends
  SPARK_HOME="$SPARK_HOME" SPARK_LOCAL_IP=127.0.0.1 SPARK_NO_DAEMONIZE=1 \
    SPARK_DAEMON_MEMORY="${CDCFLOW_SPARK_DAEMON_MEMORY:-256m}" \
    SPARK_DAEMON_JAVA_OPTS="-Dcdcflow.spark.role=$role -Dcdcflow.spark.home=$HOME_DIR -Dspark.ui.showConsoleProgress=false" \
    setsid nohup "$SPARK_HOME/bin/spark-class" "$@" >"$log" 2>&1 </dev/null 9>&- &
  echo $! >"$HOME_DIR/$role.pid"
}

wait_log() {  # wait_log <role> <regex>: until the role's log matches, its JVM dies or TIMEOUT
  local role=$1 pattern=$2 pid deadline
  pid="$(cat "$HOME_DIR/$role.pid")"
  deadline=$((SECONDS + TIMEOUT))
  until grep -qE "$pattern" "$HOME_DIR/$role.log" 2>/dev/null; do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "spark-cluster: the $role JVM (pid $pid) exited; the end of its log:" >&2
      tail -n 30 "$HOME_DIR/$role.log" >&2
      rm -f "$HOME_DIR/$role.pid"
      exit 1
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "spark-cluster: the $role (pid $pid) is not ready after ${TIMEOUT}s (left running;" \
        "stop it with $0 stop); the end of its log:" >&2
      tail -n 20 "$HOME_DIR/$role.log" >&2
      exit 1
    fi
    sleep 0.5
  done
}

stop_role() {
  local role=$1 pid deadline
  if ! pid="$(role_pid "$role")"; then
    rm -f "$HOME_DIR/$role.pid"
    return
  fi
  kill -TERM "$pid" 2>/dev/null || true
  deadline=$((SECONDS + 20))
  while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.2; done
  if kill -0 "$pid" 2>/dev/null; then
    kill -KILL "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  fi
  rm -f "$HOME_DIR/$role.pid"
  echo "spark-cluster: $role stopped (pid $pid)"
}

case "$1" in
  start)
    mkdir -p "$HOME_DIR"
    exec 9>"$HOME_DIR/.start.lock"
    flock 9
    SPARK_HOME="$(spark_home)"
    started=0
    if pid="$(role_pid master)"; then
      echo "spark-cluster: master already running at $URL (pid $pid)"
    else
      if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
        echo "spark-cluster: 127.0.0.1:$PORT is used by another process; set" \
          "CDCFLOW_SPARK_MASTER_PORT" >&2
        exit 1
      fi
      launch master org.apache.spark.deploy.master.Master \
        --host 127.0.0.1 --port "$PORT" --webui-port 0
      wait_log master "I have been elected leader"
      echo "spark-cluster: master started at $URL (pid $(cat "$HOME_DIR/master.pid"))"
      started=1
    fi
    launched=()
    for n in $(seq 1 "$WORKERS"); do
      role="worker-$n"
      if pid="$(role_pid "$role")" && [ "$started" = 0 ]; then
        echo "spark-cluster: $role already running (pid $pid)"
        continue
      fi
      stop_role "$role" >/dev/null  # a worker of a master that was restarted: start it anew
      mkdir -p "$HOME_DIR/work-$n"
      launch "$role" org.apache.spark.deploy.worker.Worker --host 127.0.0.1 \
        --cores "$CORES" --memory "$MEMORY" --work-dir "$HOME_DIR/work-$n" --webui-port 0 "$URL"
      launched+=("$role")
    done
    for role in "${launched[@]}"; do  # (the pid is spark-class's until it execs the JVM)
      wait_log "$role" "Successfully registered with master"
      echo "spark-cluster: $role started (pid $(cat "$HOME_DIR/$role.pid"))"
    done
    echo "spark-cluster: $WORKERS workers × $CORES core(s), $MEMORY each"
    echo "$URL"
    ;;
  stop)
    for pidfile in "$HOME_DIR"/worker-*.pid; do
      [ -e "$pidfile" ] || continue
      stop_role "$(basename "$pidfile" .pid)"
    done
    stop_role master
    rm -rf "$HOME_DIR"/work-*/app-*  # the executors' work dirs (their logs, fetched jars)
    ;;
  status)
    pid="$(role_pid master)" || { echo "spark-cluster: not running (home $HOME_DIR)"; exit 1; }
    echo "spark-cluster: master at $URL (pid $pid)"
    for pidfile in "$HOME_DIR"/worker-*.pid; do
      [ -e "$pidfile" ] || continue
      role="$(basename "$pidfile" .pid)"
      if wpid="$(role_pid "$role")"; then echo "spark-cluster: $role (pid $wpid)"; fi
    done
    ;;
  -h|--help) usage ;;
  *) usage >&2; exit 2 ;;
esac
