#!/usr/bin/env bash
# Stops the cluster up.sh RUN_DIR started, by its PID files, and removes what it made: the
# pods first (so the kubelets' CNI DEL runs), then the processes, the pods' leftover network
# namespaces (only those this cluster's containerds created), mounts under RUN_DIR and the
# cluster's own namespaces. Safe after a failed or partial up, and twice.
set -uo pipefail
R=${1:?usage: down.sh RUN_DIR}
[ -f "$R/env" ] || { echo "down.sh: no $R/env: nothing to stop"; exit 0; }
# shellcheck disable=SC1091
. "$R/env"
export KUBECONFIG
alive() { [ -f "$R/$1.pid" ] && kill -0 "$(cat "$R/$1.pid")" 2>/dev/null; }
stop() { local f=$R/$1.pid; [ -f "$f" ] || return 0; local p; p=$(cat "$f")
  if kill -0 "$p" 2>/dev/null; then kill "$p"
    for _ in $(seq 1 30); do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
    kill -0 "$p" 2>/dev/null && kill -9 "$p"; fi
  rm -f "$f"; }
if alive kube-apiserver && { alive node-1-kubelet || alive node-2-kubelet; }; then
  "$KUBECTL" delete deploy,ds,rs,statefulset --all -A --wait=false >/dev/null 2>&1
  # No grace: the kubelets kill the containers at once, then tear the sandboxes down (CNI
  # DEL); wait for that on each node's containerd.
  "$KUBECTL" delete pods --all -A --grace-period=0 --force >/dev/null 2>&1
  for node in $NODES; do
    A=$R/$node/containerd/containerd.sock
    for _ in $(seq 1 60); do
      [ -z "$(ctr -a "$A" -n k8s.io tasks ls -q 2>/dev/null)" ] && break; sleep 0.25; done
  done
fi
# in parallel: each may take its grace period
for node in $NODES; do
  for p in proxy kube-proxy-iptables kube-proxy-nftables routes dns policy netpol kubelet; do stop "$node-$p" & done
done
stop kube-scheduler & stop kube-controller-manager &
wait
# Sandboxes the kubelets did not tear down: their network namespaces (containerd names them
# cni-<uuid> under /run/netns; only this cluster's, read from its own containerds), then the tasks.
for node in $NODES; do
  A=$R/$node/containerd/containerd.sock
  [ -S "$A" ] || continue
  for c in $(ctr -a "$A" -n k8s.io containers ls -q 2>/dev/null); do
    ctr -a "$A" -n k8s.io containers info "$c" 2>/dev/null |
      grep -o '"/var/run/netns/cni-[0-9a-f-]*"\|"/run/netns/cni-[0-9a-f-]*"' | tr -d '"' >>"$R/pod-netns"
  done
  for t in $(ctr -a "$A" -n k8s.io tasks ls -q 2>/dev/null); do
    ctr -a "$A" -n k8s.io tasks kill -a -s KILL "$t" >/dev/null 2>&1
  done
  sleep 0.5
  for t in $(ctr -a "$A" -n k8s.io tasks ls -q 2>/dev/null); do
    ctr -a "$A" -n k8s.io tasks delete -f "$t" >/dev/null 2>&1
  done
  stop "$node-containerd"
done
# their state goes with RUN_DIR: no graceful shutdown to wait for
for p in kube-apiserver etcd; do [ -f "$R/$p.pid" ] && kill -9 "$(cat "$R/$p.pid")" 2>/dev/null; rm -f "$R/$p.pid"; done
grep -oE " $R/[^ ]*" /proc/mounts | sort -r | while read -r m; do umount -l "$m" 2>/dev/null; done
if [ -f "$R/pod-netns" ]; then
  sort -u "$R/pod-netns" | while read -r n; do ip netns delete "$(basename "$n")" 2>/dev/null; done
fi
for ns in $NODE_NS $CP_NS; do ip netns delete "$ns" 2>/dev/null; done
echo "down: $NAME stopped"
