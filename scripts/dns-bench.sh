#!/usr/bin/env bash
# weir dns vs NSD on the same records, measured by dnsperf, side by side in one run.
#   bash scripts/dns-bench.sh [services]     (default 10000; run as root, after a release build)
# Both servers run in one throwaway network namespace on its loopback, one worker each
# (`weir dns --threads 1`, NSD `server-count: 1`), queried for random service names (A).
# Phase 1: throughput (dnsperf unthrottled, 10 s). Phase 2: latency percentiles at a fixed
# 10k QPS (dnsperf -v, every query's latency). Memory: each server's VmRSS after the runs.
# Environment: WEIR (binary, default target/release/weir), SECONDS_PER_RUN (10), RATE (10000).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-10000}
WEIR=${WEIR:-target/release/weir}
SECS=${SECONDS_PER_RUN:-10}
RATE=${RATE:-10000}
[ -x "$WEIR" ] || { echo "build first: cargo build --release -p weir" >&2; exit 1; }
for t in nsd dnsperf; do command -v $t >/dev/null || { echo "$t missing (apt-get install $t)" >&2; exit 1; }; done

NS=wdnb-$$
DIR=$(mktemp -d /tmp/weir-dns-bench.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  ip netns del "$NS" 2>/dev/null || true
  rm -rf "$DIR"
}
trap cleanup EXIT INT TERM
ip netns add "$NS"
ip -n "$NS" link set lo up
in_ns() { ip netns exec "$NS" "$@"; }

# The same N ClusterIP services as manifests (weir) and as a zone file (NSD).
mkdir -p "$DIR/manifests"
{
  echo '$ORIGIN cluster.local.'
  echo '$TTL 5'
  echo '@ IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 1 7200 1800 86400 5'
  echo '@ IN NS ns.dns'
} >"$DIR/cluster.local.zone"
: >"$DIR/queries"
for ((i = 0; i < N; i++)); do
  ip="10.$((96 + i / 62500)).$((i / 250 % 250)).$((i % 250 + 1))"
  printf 'apiVersion: v1\nkind: Service\nmetadata: {name: svc-%d, namespace: bench}\nspec: {clusterIP: %s}\n---\n' "$i" "$ip"
  printf 'svc-%d.bench.svc IN A %s\n' "$i" "$ip" >>"$DIR/cluster.local.zone"
  printf 'svc-%d.bench.svc.cluster.local A\n' "$i" >>"$DIR/queries"
done >"$DIR/manifests/services.yaml"
shuf "$DIR/queries" -o "$DIR/queries"

cat >"$DIR/nsd.conf" <<EOF
server:
  ip-address: 127.0.0.1
  port: 5302
  username: ""
  chroot: ""
  zonesdir: "$DIR"
  pidfile: "$DIR/nsd.pid"
  database: ""
  zonelistfile: "$DIR/zone.list"
  xfrdfile: "$DIR/xfrd.state"
  xfrdir: "$DIR"
  logfile: "$DIR/nsd.log"
  server-count: 1
remote-control:
  control-enable: no
zone:
  name: cluster.local
  zonefile: "$DIR/cluster.local.zone"
EOF

# Started with `ip netns exec` directly (not through a function) so that $! is the server.
ip netns exec "$NS" "$WEIR" dns --listen 127.0.0.1:5301 --manifests "$DIR/manifests" --threads 1 2>"$DIR/weir.log" &
PIDS+=($!)
ip netns exec "$NS" nsd -d -c "$DIR/nsd.conf" &
PIDS+=($!)
ready() { in_ns dig @127.0.0.1 -p "$1" +short +time=1 +tries=1 svc-0.bench.svc.cluster.local | grep -q 10.96.0.1; }
for port in 5301 5302; do
  for _ in $(seq 100); do ready $port && break; sleep 0.2; done
  ready $port || { echo "server on $port did not come up" >&2; cat "$DIR/weir.log" >&2; exit 1; }
done

WEIR_PID=${PIDS[0]} NSD_PID=${PIDS[1]}
# Resident memory in MB of a process and all its descendants (NSD forks xfrd and servers).
tree() { echo "$1"; for c in $(pgrep -P "$1"); do tree "$c"; done; }
rss_mb() { ps -o rss= -p "$(tree "$1" | paste -sd,)" | awk '{s += $1} END {printf "%.1f", s / 1024}'; }

printf '%-6s %9s %9s %9s %9s %9s %9s %8s\n' server qps avg_ms p50_ms p90_ms p99_ms p999_ms rss_mb
for pair in weir:5301 nsd:5302; do
  name=${pair%%:*} port=${pair##*:}
  out=$(in_ns dnsperf -s 127.0.0.1 -p "$port" -d "$DIR/queries" -l "$SECS" -c 4 -q 200 2>&1)
  qps=$(awk '/Queries per second/ {print $4}' <<<"$out")
  avg=$(awk '/Average Latency/ {print $4 * 1000}' <<<"$out")
  lost=$(awk '/Queries lost/ {print $3}' <<<"$out")
  # Every query's latency at a fixed rate, sorted, for percentiles.
  in_ns dnsperf -s 127.0.0.1 -p "$port" -d "$DIR/queries" -l "$SECS" -Q "$RATE" -c 4 -v 2>/dev/null |
    awk '$1 == ">" {print $NF}' | sort -g >"$DIR/lat.$name"
  pct() { awk -v p="$1" '{a[NR] = $1} END {i = int(NR * p); if (i < 1) i = 1; printf "%.3f", a[i] * 1000}' "$DIR/lat.$name"; }
  if [ "$name" = weir ]; then rss=$(rss_mb "$WEIR_PID"); else rss=$(rss_mb "$NSD_PID"); fi
  printf '%-6s %9s %9.3f %9s %9s %9s %9s %8s  (lost %s)\n' "$name" "$qps" "$avg" "$(pct 0.5)" "$(pct 0.9)" "$(pct 0.99)" "$(pct 0.999)" "$rss" "$lost"
done
echo "services: $N; $(nproc) cores shared with whatever else runs; dnsperf: 4 clients, ${SECS}s per run, percentiles at ${RATE} QPS"
