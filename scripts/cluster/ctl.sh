#!/usr/bin/env bash
# One process of a cluster up.sh started: stop it (by its PID file) or start it again (the
# namespace and command line up.sh saved in RUN_DIR/NAME.cmd; the log is appended to).
# Usage: ctl.sh RUN_DIR stop|start|restart NAME   (NAME: kube-apiserver, node-1-kubelet, ...)
set -euo pipefail
R=${1:?usage: ctl.sh RUN_DIR stop|start|restart NAME}
OP=${2:?usage: ctl.sh RUN_DIR stop|start|restart NAME}
NAME=${3:?usage: ctl.sh RUN_DIR stop|start|restart NAME}
stop() {
  local f=$R/$NAME.pid p
  [ -f "$f" ] || return 0
  p=$(cat "$f")
  if kill -0 "$p" 2>/dev/null; then
    kill "$p"
    for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
    kill -0 "$p" 2>/dev/null && kill -9 "$p"
  fi
  rm -f "$f"
}
start() {
  [ -f "$R/$NAME.cmd" ] || { echo "ctl.sh: no $R/$NAME.cmd" >&2; exit 2; }
  mapfile -t cmd <"$R/$NAME.cmd"
  nohup nsenter --net="/run/netns/${cmd[0]}" "${cmd[@]:1}" >>"$R/$NAME.log" 2>&1 &
  echo $! >"$R/$NAME.pid"
}
case $OP in
  stop) stop ;;
  start) start ;;
  restart) stop; start ;;
  *) echo "ctl.sh: unknown operation $OP" >&2; exit 2 ;;
esac
