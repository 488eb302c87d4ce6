#!/usr/bin/env bash
# weir dns vs NSD and Knot DNS on the same records, and weir dns vs Unbound and Knot Resolver on
# cached external names,
# measured by dnsperf, side by side in one run; then weir dns's memory at several zone sizes
# against CoreDNS's published formula.
#   bash scripts/dns-bench.sh [services]     (default 10000; run as root, after a release build)
# The servers run in one throwaway network namespace on its loopback, one worker each
# (`weir dns --threads 1`, NSD `server-count: 1`, Knot `udp-workers: 1`, one Unbound thread, one
# kresd process), queried for random service names (A).
# Each round runs, for weir then NSD: throughput (dnsperf unthrottled) and latency percentiles
# at a fixed rate (dnsperf -v, every query's latency). The summary gives each figure's median
# over the rounds and weir/NSD, then the percentiles of every query of all rounds pooled. Cached external names: NSD also serves EXTERNAL names under
# example.test; weir dns forwards to it and Unbound (one thread) has it as a stub zone; after one
# pass over the names warms both caches, the same rounds measure weir and Unbound. Memory: each server's VmRSS after the runs; then weir dns alone
# at each of MEMORY_SIZES services, RSS once the zone is served, fed from manifests and from
# weir's fake API server (FAKEAPI, the source a cluster uses).
# Environment: WEIR (binary, default target/release/weir), SECONDS_PER_RUN (10), RATE (10000),
# ROUNDS (3), EXTERNAL (1000; 0: skip Unbound and Knot Resolver), KNOT (1; 0: skip Knot DNS and
# Knot Resolver), MEMORY_SIZES ("1000 10000 100000"; empty: skip),
# PIN (1: servers on CPU 1, dnsperf on CPU 0; Knot, which pins its own workers, is put back on
# CPU 1 once started; each server's threads and their CPUs are printed).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-10000}
WEIR=${WEIR:-target/release/weir}
FAKEAPI=${FAKEAPI:-target/release/weir-fakeapi}
SECS=${SECONDS_PER_RUN:-10}
RATE=${RATE:-10000}
ROUNDS=${ROUNDS:-3}
MEMORY_SIZES=${MEMORY_SIZES-1000 10000 100000}
EXTERNAL=${EXTERNAL:-1000}
KNOT=${KNOT:-1}
# With two cores or more, the servers run on one core and dnsperf on another (PIN=0: not):
# sharing a core, the client's own scheduling shows up in the servers' tail latency.
SERVER_CPU=() CLIENT_CPU=()
if [ "${PIN:-1}" != 0 ] && [ "$(nproc)" -ge 2 ]; then
  SERVER_CPU=(taskset -c 1) CLIENT_CPU=(taskset -c 0)
fi
[ -x "$WEIR" ] && [ -x "$FAKEAPI" ] || { echo "build first: cargo build --release -p weir -p weir-fakeapi" >&2; exit 1; }
tools="nsd dnsperf"
[ "$EXTERNAL" -gt 0 ] && tools="$tools unbound"
[ "$KNOT" != 0 ] && tools="$tools knotd"
[ "$KNOT" != 0 ] && [ "$EXTERNAL" -gt 0 ] && tools="$tools kresd"
for t in $tools; do command -v $t >/dev/null || { echo "$t missing (apt-get install $t)" >&2; exit 1; }; done

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

# N ClusterIP services as manifests in $2 (weir); with $3, the same A records as a zone file
# and the query list (NSD, dnsperf).
services() {
  local n=$1 dir=$2 zone=${3:-}
  mkdir -p "$dir"
  if [ -n "$zone" ]; then
    {
      echo '$ORIGIN cluster.local.'
      echo '$TTL 5'
      echo '@ IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 1 7200 1800 86400 5'
      echo '@ IN NS ns.dns'
    } >"$zone"
    : >"$DIR/queries"
  fi
  for ((i = 0; i < n; i++)); do
    ip="10.$((96 + i / 62500)).$((i / 250 % 250)).$((i % 250 + 1))"
    # 1,000 services per file: the manifest source skips files over 4 MiB.
    printf 'apiVersion: v1\nkind: Service\nmetadata: {name: svc-%d, namespace: bench}\nspec: {clusterIP: %s}\n---\n' "$i" "$ip" >>"$dir/services-$((i / 1000)).yaml"
    if [ -n "$zone" ]; then
      printf 'svc-%d.bench.svc IN A %s\n' "$i" "$ip" >>"$zone"
      printf 'svc-%d.bench.svc.cluster.local A\n' "$i" >>"$DIR/queries"
    fi
  done
}

services "$N" "$DIR/manifests" "$DIR/cluster.local.zone"
shuf "$DIR/queries" -o "$DIR/queries"

# External names: an example.test zone on NSD, and their queries.
{
  echo '$ORIGIN example.test.'
  echo '$TTL 3600'
  echo '@ IN SOA ns.example.test. hostmaster.example.test. 1 7200 1800 86400 60'
  echo '@ IN NS ns'
  echo 'ns IN A 127.0.0.1'
  for ((i = 0; i < EXTERNAL; i++)); do printf 'host-%d IN A 198.18.%d.%d\n' "$i" $((i / 250 % 250)) $((i % 250 + 1)); done
} >"$DIR/example.test.zone"
for ((i = 0; i < EXTERNAL; i++)); do printf 'host-%d.example.test A\n' "$i"; done | shuf >"$DIR/external"
printf 'nameserver 127.0.0.1:5302\n' >"$DIR/upstreams"

cat >"$DIR/unbound.conf" <<EOF
server:
  interface: 127.0.0.1@5304
  num-threads: 1
  username: ""
  chroot: ""
  directory: "$DIR"
  pidfile: "$DIR/unbound.pid"
  use-syslog: no
  logfile: "$DIR/unbound.log"
  do-daemonize: no
  do-not-query-localhost: no
  module-config: "iterator"
  access-control: 127.0.0.0/8 allow
stub-zone:
  name: "example.test"
  stub-addr: 127.0.0.1@5302
remote-control:
  control-enable: no
EOF

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
zone:
  name: example.test
  zonefile: "$DIR/example.test.zone"
EOF

mkdir -p "$DIR/knot" "$DIR/kresd"
cat >"$DIR/knot.conf" <<EOF
server:
    rundir: "$DIR/knot"
    listen: 127.0.0.1@5305
    udp-workers: 1
    tcp-workers: 1
    background-workers: 1
log:
  - target: stderr
    any: warning
database:
    storage: "$DIR/knot"
zone:
  - domain: cluster.local
    storage: "$DIR"
    file: cluster.local.zone
    journal-content: none
    zonefile-sync: -1
EOF
# Knot Resolver: one process, the external zone as a stub (no DNSSEC: nothing here is signed and
# the root is out of reach), cache as large as Unbound's working set needs.
cat >"$DIR/kresd.conf" <<EOF
net.listen('127.0.0.1', 5306, { kind = 'dns' })
trust_anchors.remove('.')
cache.size = 100 * MB
policy.add(policy.suffix(policy.STUB({'127.0.0.1@5302'}), {todname('example.test.')}))
EOF

ready() { in_ns dig @127.0.0.1 -p "$1" +short +time=1 +tries=1 svc-0.bench.svc.cluster.local | grep -q 10.96.0.1; }
wait_ready() {
  for _ in $(seq 300); do ready "$1" && return 0; sleep 0.2; done
  echo "server on $1 did not come up" >&2; cat "$DIR/weir.log" >&2; exit 1
}
# Resident memory in MB of a process and all its descendants (NSD forks xfrd and servers).
tree() { echo "$1"; for c in $(pgrep -P "$1"); do tree "$c"; done; }
rss_mb() { ps -o rss= -p "$(tree "$1" | paste -sd,)" | awk '{s += $1} END {printf "%.1f", s / 1024}'; }

# Started with `ip netns exec` directly (not through a function) so that $! is the server.
ip netns exec "$NS" "${SERVER_CPU[@]}" "$WEIR" dns --listen 127.0.0.1:5301 --manifests "$DIR/manifests" --threads 1 \
  --upstream-resolv-conf "$DIR/upstreams" 2>"$DIR/weir.log" &
PIDS+=($!)
ip netns exec "$NS" "${SERVER_CPU[@]}" nsd -d -c "$DIR/nsd.conf" &
PIDS+=($!)
wait_ready 5301
wait_ready 5302
WEIR_PID=${PIDS[0]} NSD_PID=${PIDS[1]}
if [ "$KNOT" != 0 ]; then
  ip netns exec "$NS" "${SERVER_CPU[@]}" knotd -c "$DIR/knot.conf" 2>"$DIR/knot.log" &
  PIDS+=($!)
  KNOT_PID=$!
  wait_ready 5305
  # Knot pins each of its worker threads to a CPU of its own choosing (UDP worker i on CPU i:
  # its one UDP worker lands on CPU 0, dnsperf's, whatever taskset said), which puts the
  # client and that server on one core, and only that server. Put its threads back on the
  # servers' CPU, where weir's and NSD's run.
  if [ ${#SERVER_CPU[@]} -gt 0 ]; then taskset -a -p -c "${SERVER_CPU[2]}" "$KNOT_PID" >/dev/null; fi
fi
if [ "$EXTERNAL" -gt 0 ]; then
  ip netns exec "$NS" "${SERVER_CPU[@]}" unbound -d -c "$DIR/unbound.conf" &
  PIDS+=($!)
  UNBOUND_PID=$!
  for _ in $(seq 100); do in_ns dig @127.0.0.1 -p 5304 +short +time=1 +tries=1 host-0.example.test | grep -q . && break; sleep 0.2; done
  # Warm both caches: one pass over every external name.
  if [ "$KNOT" != 0 ]; then
    ip netns exec "$NS" "${SERVER_CPU[@]}" kresd -n -c "$DIR/kresd.conf" "$DIR/kresd" >"$DIR/kresd.log" 2>&1 &
    PIDS+=($!)
    KRESD_PID=$!
    for _ in $(seq 100); do in_ns dig @127.0.0.1 -p 5306 +short +time=1 +tries=1 host-0.example.test | grep -q . && break; sleep 0.2; done
    in_ns dig @127.0.0.1 -p 5306 +short +time=1 +tries=1 host-0.example.test | grep -q . ||
      { echo "kresd does not answer:" >&2; tail "$DIR/kresd.log" >&2; exit 1; }
  fi
  # Warm the caches: one pass over every external name.
  for port in 5301 5304 ${KRESD_PID:+5306}; do in_ns dnsperf -s 127.0.0.1 -p "$port" -d "$DIR/external" -n 1 -c 1 -q 50 >/dev/null 2>&1; done
fi

# Where each server's threads may run (name:allowed CPUs), for the record. A thread that ends
# meanwhile (a runtime's idle helper) is left out.
placement() {
  local pid t out="" line
  for pid in "$@"; do
    for t in $(tree "$pid"); do
      for t in /proc/"$t"/task/*; do
        line=$({ tr ' ' _ <"$t/comm" && awk '/Cpus_allowed_list/ {print ":" $2}' "$t/status"; } 2>/dev/null | paste -sd '') || continue
        out+=" $line"
      done
    done
    echo "  $(tr ' ' _ </proc/"$pid"/comm) ($pid):$(tr ' ' '\n' <<<"$out" | sort | uniq -c | awk 'NF == 2 {printf " %s x%s", $2, $1}')"
    out=""
  done
}
echo "threads (name:CPUs the scheduler may use):"
placement "$WEIR_PID" "$NSD_PID" ${KNOT_PID:+"$KNOT_PID"}

# One run of one server on one query file: "qps avg_ms p50 p90 p99 p999 lost".
measure() {
  local name=$1 port=$2 queries=$3 out qps avg lost
  out=$(in_ns "${CLIENT_CPU[@]}" dnsperf -s 127.0.0.1 -p "$port" -d "$queries" -l "$SECS" -c 4 -q 200 2>&1)
  qps=$(awk '/Queries per second/ {print $4}' <<<"$out")
  avg=$(awk '/Average Latency/ {print $4 * 1000}' <<<"$out")
  lost=$(awk '/Queries lost/ {print $3}' <<<"$out")
  # Every query's latency at a fixed rate, sorted, for percentiles.
  in_ns "${CLIENT_CPU[@]}" dnsperf -s 127.0.0.1 -p "$port" -d "$queries" -l "$SECS" -Q "$RATE" -c 4 -v 2>/dev/null |
    awk '$1 == ">" {print $NF}' | sort -g >"$DIR/lat.$name"
  cat "$DIR/lat.$name" >>"$DIR/pool.$name"
  echo "$qps $avg $(pct "$DIR/lat.$name" 0.5) $(pct "$DIR/lat.$name" 0.9) $(pct "$DIR/lat.$name" 0.99) $(pct "$DIR/lat.$name" 0.999) $lost"
}
# The p-quantile, in ms, of a sorted file of latencies in seconds.
pct() { awk -v p="$2" '{a[NR] = $1} END {i = int(NR * p); if (i < 1) i = 1; printf "%.3f", a[i] * 1000}' "$1"; }

# Rounds of two "label port queries" specs, then medians and ratios (first / second).
compare() {
  local title=$1 a=$2 b=$3 r spec name port queries qps avg p50 p90 p99 p999 lost
  : >"$DIR/results"
  rm -f "$DIR"/pool.*
  echo
  echo "$title"
  printf '%-5s %-8s %9s %9s %9s %9s %9s %9s %6s  %s\n' round server qps avg_ms p50_ms p90_ms p99_ms p999_ms lost load
  for ((r = 1; r <= ROUNDS; r++)); do
    for spec in "$a" "$b"; do
      read -r name port queries <<<"$spec"
      read -r qps avg p50 p90 p99 p999 lost < <(measure "$name" "$port" "$queries")
      echo "$name $qps $avg $p50 $p90 $p99 $p999" >>"$DIR/results"
      printf '%-5s %-8s %9s %9.3f %9s %9s %9s %9s %6s  %s\n' "$r" "$name" "$qps" "$avg" "$p50" "$p90" "$p99" "$p999" "$lost" "$(cut -d' ' -f1-3 /proc/loadavg)"
    done
  done
  local na=${a%% *} nb=${b%% *} col=2 fig x y
  echo "medians over $ROUNDS rounds (ratio = $na / $nb; for latency lower is better):"
  printf '%-8s %12s %12s %8s\n' figure "$na" "$nb" ratio
  for fig in qps avg_ms p50_ms p90_ms p99_ms p999_ms; do
    x=$(awk -v c=$col -v n="$na" '$1 == n {print $c}' "$DIR/results" | median)
    y=$(awk -v c=$col -v n="$nb" '$1 == n {print $c}' "$DIR/results" | median)
    printf '%-8s %12s %12s %8.2f\n' "$fig" "$x" "$y" "$(awk -v x="$x" -v y="$y" 'BEGIN {print (y > 0 ? x / y : 0)}')"
    col=$((col + 1))
  done
  # A tail percentile of one round rests on a few dozen queries; pooled, on every query of
  # every round (each server's rounds interleaved with the other's, so load hits both).
  echo "pooled: percentiles over every query of the $ROUNDS rounds together:"
  sort -g -o "$DIR/pool.$na" "$DIR/pool.$na"
  sort -g -o "$DIR/pool.$nb" "$DIR/pool.$nb"
  for fig in 0.5 0.9 0.99 0.999; do
    x=$(pct "$DIR/pool.$na" "$fig")
    y=$(pct "$DIR/pool.$nb" "$fig")
    printf '%-8s %12s %12s %8.2f\n' "p$fig" "$x" "$y" "$(awk -v x="$x" -v y="$y" 'BEGIN {print (y > 0 ? x / y : 0)}')"
  done
}
median() { sort -g | awk '{a[NR] = $1} END {if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

compare "internal names ($N services):" "weir 5301 $DIR/queries" "nsd 5302 $DIR/queries"
if [ "$KNOT" != 0 ]; then
  compare "internal names ($N services):" "weir 5301 $DIR/queries" "knot 5305 $DIR/queries"
fi
if [ "$EXTERNAL" -gt 0 ]; then
  compare "cached external names ($EXTERNAL):" "weir 5301 $DIR/external" "unbound 5304 $DIR/external"
  if [ "$KNOT" != 0 ]; then
    compare "cached external names ($EXTERNAL):" "weir 5301 $DIR/external" "kresd 5306 $DIR/external"
  fi
fi
echo
echo "RSS after the runs: weir $(rss_mb "$WEIR_PID") MB, NSD $(rss_mb "$NSD_PID") MB${UNBOUND_PID:+, Unbound $(rss_mb "$UNBOUND_PID") MB}${KNOT_PID:+, Knot $(rss_mb "$KNOT_PID") MB}${KRESD_PID:+, Knot Resolver $(rss_mb "$KRESD_PID") MB}"
echo "services: $N; $(nproc) cores shared with whatever else runs; dnsperf: 4 clients, ${SECS}s per run, percentiles at ${RATE} QPS; pinned: ${SERVER_CPU[*]:-no} (servers), ${CLIENT_CPU[*]:-no} (dnsperf)"

for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
wait 2>/dev/null || true
PIDS=()
[ -n "$MEMORY_SIZES" ] || exit 0

echo
echo "memory: weir dns alone, RSS and high-water mark once every service is served, from a manifest"
echo "directory and from the (fake) Kubernetes API server, as in a cluster (CoreDNS: (pods + services) x"
echo "0.000858 + 49.1 MB, no pods)"
printf '%9s %-10s %9s %9s %11s %11s\n' services source rss_mb hwm_mb coredns_mb hwm/coredns
# weir dns at $1 services from source $2 (its flags in the rest): RSS and VmHWM once served.
serve_and_measure() {
  local m=$1 source=$2 pid last served="" rss hwm formula
  shift 2
  ip netns exec "$NS" "$WEIR" dns --listen 127.0.0.1:5303 --threads 1 "$@" 2>"$DIR/weir.log" &
  pid=$!
  PIDS+=("$pid")
  last=$((m - 1))
  for _ in $(seq 600); do
    in_ns dig @127.0.0.1 -p 5303 +short +time=1 +tries=1 "svc-$last.bench.svc.cluster.local" | grep -q . && served=1 && break
    sleep 0.5
  done
  # A zone that never loads would otherwise be reported as a small RSS.
  [ -n "$served" ] || { echo "weir dns never served svc-$last at $m services ($source):" >&2; tail -5 "$DIR/weir.log" >&2; exit 1; }
  sleep 2
  rss=$(rss_mb "$pid")
  hwm=$(awk '/VmHWM/ {printf "%.1f", $2 / 1024}' "/proc/$pid/status")
  formula=$(awk -v n="$m" 'BEGIN {printf "%.1f", n * 0.000858 + 49.1}')
  printf '%9s %-10s %9s %9s %11s %11.2f\n' "$m" "$source" "$rss" "$hwm" "$formula" "$(awk -v r="$hwm" -v f="$formula" 'BEGIN {print r / f}')"
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}
for m in $MEMORY_SIZES; do
  rm -rf "$DIR/mem"
  services "$m" "$DIR/mem"
  PIDS=()
  serve_and_measure "$m" manifests --manifests "$DIR/mem"
  ip netns exec "$NS" "$FAKEAPI" --listen 127.0.0.1:6443 "$DIR"/mem/*.yaml 2>"$DIR/fakeapi.log" &
  PIDS=("$!")
  for _ in $(seq 600); do grep -q serving "$DIR/fakeapi.log" && break; sleep 0.5; done
  serve_and_measure "$m" api --master http://127.0.0.1:6443
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  PIDS=()
done
