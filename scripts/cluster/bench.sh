#!/usr/bin/env bash
# weir proxy against real kube-proxy (the version scripts/cluster/kube pins), both fed by a real
# kube-apiserver, in one run: a cluster per size and kube-proxy mode with kube-proxy on node-1
# and weir proxy on node-2, the same objects created through the API for both (api_bench.py).
# Release builds. Each cluster ends with a line
#   ratio weir/kube-proxy-nftables services=N full=F change=C rss=R   (below 1: weir ahead)
# Env: WEIR_BENCH_SIZES (default "1000 10000"), WEIR_BENCH_ENDPOINTS (10), WEIR_BENCH_MODE
# (weir's mode, default nftables), WEIR_BENCH_KUBE_PROXY_MODES (default "nftables iptables";
# 1.20: iptables), WEIR_BENCH_CHANGES (endpoint changes, 5), WEIR_BENCH_JSON (a path prefix:
# the JSON rows go to PREFIX.<size>.<kube-proxy mode>), KUBE_BUILD.
# Usage: bench.sh   (as root; dev.sh cluster-bench builds first)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
export WEIR_BIN=${WEIR_BIN:-$ROOT/target/release}
export WEIR_POLICY=0 # only the proxies: no NetworkPolicy agent beside them
E=${WEIR_BENCH_ENDPOINTS:-10}
json=${WEIR_BENCH_JSON:-} # rows go to $WEIR_BENCH_JSON.<size>.<kube-proxy mode>
for n in ${WEIR_BENCH_SIZES:-1000 10000}; do
for kp in ${WEIR_BENCH_KUBE_PROXY_MODES:-nftables iptables}; do
  export WEIR_PROXY_MODES="kube-proxy-$kp ${WEIR_BENCH_MODE:-nftables}"
  run=/tmp/weir-cluster-bench-$n-$kp
  bash "$HERE/down.sh" "$run" >/dev/null 2>&1 || true
  rm -rf "$run"
  trap 'bash "$HERE/down.sh" "$run" >/dev/null 2>&1' EXIT
  echo "==> $n Services x $E endpoints: cluster up (node-1 kube-proxy $kp, node-2 weir proxy ${WEIR_BENCH_MODE:-nftables})" >&2
  bash "$HERE/up.sh" "b$n" "$run" >/dev/null 2>"$run.up.log" || { cat "$run.up.log" >&2; exit 1; }
  for p in a b; do
    "$run/kubectl" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: bench-$p, namespace: default}
spec:
  nodeName: node-1
  terminationGracePeriodSeconds: 1
  containers:
  - name: httpd
    image: localhost/weir/busybox:1.35
    imagePullPolicy: Never
    command: ["/bin/sh", "-c", "mkdir -p /www && echo bench-$p > /www/index.html && exec busybox httpd -f -p 8080 -h /www"]
YAML
  done
  "$run/kubectl" wait --for=condition=Ready pod/bench-a pod/bench-b --timeout=60s >/dev/null
  a=$("$run/kubectl" get pod bench-a -o jsonpath='{.status.podIP}')
  b=$("$run/kubectl" get pod bench-b -o jsonpath='{.status.podIP}')
  cp_ns=$(sed -n 's/^CP_NS=//p' "$run/env")
  if [ -n "$json" ]; then
    nsenter --net="/run/netns/$cp_ns" python3 "$HERE/api_bench.py" "$run" "$n" "$E" "$a" bench-a "$b" bench-b --json >"$json.$n.$kp"
    cat "$json.$n.$kp"
  else
    nsenter --net="/run/netns/$cp_ns" python3 "$HERE/api_bench.py" "$run" "$n" "$E" "$a" bench-a "$b" bench-b
  fi
  for node in node-1 node-2; do
    grep -h "Sync\|synced" "$run/$node-kube-proxy-$kp.log" "$run/$node-proxy.log" 2>/dev/null | tail -2 >&2 || true
  done
  bash "$HERE/down.sh" "$run" >/dev/null 2>&1
  trap - EXIT
done
done
