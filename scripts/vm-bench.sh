#!/usr/bin/env bash
# The proxy modes side by side in ONE boot of the test VM (docs/vm.md: Debian's kernel, which has
# IPVS and dummy), run by `bash scripts/dev.sh vm-bench`; this script runs inside the guest.
#   1. the scale bench (crates/proxy/benches/scale.rs) for every mode: full sync and one-endpoint
#      syncs of N services × 10 endpoints, new connections per second from the node to a
#      ClusterIP against going straight to the pod, and the real agent end to end;
#   2. throughput through a ClusterIP: iperf3 from a client namespace routed through the node
#      (forwarded, as a pod's traffic is) to a pod, against the same path to the pod's own address;
#   3. ipvs mode's full sync phase by phase beside the kernel's own tools loading the same state
#      (scripts/ipvs-floor.sh).
# Usage (guest): vm-bench.sh <scale bench binary, or - to skip part 1> <weir binary> <output dir>
# Environment: WEIR_BENCH_MODES (default nftables,ipvs; iptables too if you have the time), WEIR_BENCH_SIZES (1000,5000),
# WEIR_BENCH_TPUT_ROUNDS (3), WEIR_BENCH_TPUT_SECONDS (5), WEIR_BENCH_FLOOR_SERVICES (10000; 0: skip
# part 3, scripts/ipvs-floor.sh); the scale bench's own variables.
set -euo pipefail
SCALE=$1 WEIR=$2 OUT=$3
# iptables is left out by default: under TCG its side-by-side kube-proxy layout runs take ages
MODES=${WEIR_BENCH_MODES:-nftables,ipvs}
ROUNDS=${WEIR_BENCH_TPUT_ROUNDS:-3}
SECONDS_PER_RUN=${WEIR_BENCH_TPUT_SECONDS:-5}
mkdir -p "$OUT"
say() { printf '[vm-bench] %s\n' "$*" >&2; }
say "kernel $(uname -r), $(nproc) vCPU, $(awk '/MemTotal/ {print int($2/1024)}' /proc/meminfo) MiB"

# ---- 1. sync times and connection rate (the scale bench, every mode in this boot)
if [ "$SCALE" = - ]; then
  echo '{"rows": []}' >"$OUT/scale.json"; echo "(scale bench skipped)" >"$OUT/scale.md"
else
  say "scale bench: modes $MODES, sizes ${WEIR_BENCH_SIZES:-1000,5000} × 10 endpoints"
  WEIR_BENCH_MODES=$MODES WEIR_BENCH_SIZES=${WEIR_BENCH_SIZES:-1000,5000} WEIR_BENCH_BIG=0 \
    WEIR_BIN=$WEIR WEIR_BENCH_JSON=$OUT/scale.json "$SCALE" --bench >"$OUT/scale.md"
fi

# ---- 2. throughput through a ClusterIP
# client ns 10.0.0.2 ── 10.0.0.1 node ns (weir proxy) 10.244.1.1 ── pod ns 10.244.1.11 (iperf3 -s)
T=vb$$
N=$T-n C=$T-c P=$T-p D=/tmp/$T
inn() { ip netns exec "$@"; }
cleanup() {
  [ -f "$D/proxy.pid" ] && kill "$(cat "$D/proxy.pid")" 2>/dev/null
  [ -f "$D/iperf.pid" ] && kill "$(cat "$D/iperf.pid")" 2>/dev/null
  for ns in $N $C $P; do ip netns del "$ns" 2>/dev/null; done
  rm -rf "$D"
  true
}
trap cleanup EXIT
mkdir -p "$D/m"
for ns in $N $C $P; do ip netns add "$ns"; inn "$ns" ip link set lo up; done
ip link add "$T-c" netns "$N" type veth peer name eth0 netns "$C"
ip link add "$T-p" netns "$N" type veth peer name eth0 netns "$P"
inn "$N" ip addr add 10.0.0.1/24 dev "$T-c"; inn "$N" ip link set "$T-c" up
inn "$N" ip addr add 10.244.1.1/24 dev "$T-p"; inn "$N" ip link set "$T-p" up
inn "$N" sysctl -qw net.ipv4.ip_forward=1
inn "$C" ip addr add 10.0.0.2/24 dev eth0; inn "$C" ip link set eth0 up
inn "$C" ip route add default via 10.0.0.1
inn "$P" ip addr add 10.244.1.11/24 dev eth0; inn "$P" ip link set eth0 up
inn "$P" ip route add default via 10.244.1.1
inn "$P" iperf3 -s -D -I "$D/iperf.pid" -p 5201
cat >"$D/m/svc.yaml" <<'EOF'
apiVersion: v1
kind: Service
metadata: {name: tput, namespace: default}
spec:
  clusterIP: 10.96.0.10
  ports: [{port: 80, targetPort: 5201}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: tput-1, namespace: default, labels: {kubernetes.io/service-name: tput}}
addressType: IPv4
ports: [{port: 5201}]
endpoints:
  - {addresses: [10.244.1.11], nodeName: bench}
EOF
sleep 0.5

# Gbit/s of one iperf3 run from the client to $1:$2 (0 when it fails: shown, never hidden).
gbits() {
  inn "$C" iperf3 -c "$1" -p "$2" -t "$SECONDS_PER_RUN" -J 2>/dev/null |
    jq -r '(.end.sum_received.bits_per_second // 0) / 1e9' || echo 0
}
median() { sort -g | awk '{v[NR]=$1} END {print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }

echo "mode rounds vip_gbit direct_gbit" >"$OUT/tput.txt"
for mode in ${MODES//,/ }; do
  say "throughput: $mode"
  inn "$N" sh -c 'echo $$ >'"$D/proxy.pid"'; exec "$@"' sh "$WEIR" proxy --proxy-mode "$mode" \
    --manifests "$D/m" --state-dir "$D/state-$mode" --cluster-cidr 10.244.0.0/16 \
    --hostname-override bench --manifest-poll-interval 100ms --sync-period 1h \
    >"$D/proxy-$mode.log" 2>&1 </dev/null &
  end=$(($(date +%s) + 120))
  until grep -q ' synced' "$D/proxy-$mode.log" 2>/dev/null; do
    [ "$(date +%s)" -lt "$end" ] || { tail "$D/proxy-$mode.log" >&2; exit 1; }
    sleep 0.2
  done
  vips="" directs=""
  for r in $(seq "$ROUNDS"); do
    # alternate the order each round so that drift hits both paths alike
    if [ $((r % 2)) = 1 ]; then
      vips="$vips $(gbits 10.96.0.10 80)"; directs="$directs $(gbits 10.244.1.11 5201)"
    else
      directs="$directs $(gbits 10.244.1.11 5201)"; vips="$vips $(gbits 10.96.0.10 80)"
    fi
  done
  kill "$(cat "$D/proxy.pid")"; rm "$D/proxy.pid"
  sleep 1
  inn "$N" "$WEIR" proxy cleanup --proxy-mode "$mode" >/dev/null 2>&1 || true
  # shellcheck disable=SC2086 # the lists split into one value a line
  vip=$(printf '%s\n' $vips | median) direct=$(printf '%s\n' $directs | median)
  say "  $mode: VIP$vips | direct$directs Gbit/s"
  echo "$mode $ROUNDS $vip $direct" >>"$OUT/tput.txt"
done

# ---- 3. ipvs mode's full sync beside the kernel's own tools loading the same state
FLOOR=${WEIR_BENCH_FLOOR_SERVICES:-10000}
if [ "$FLOOR" -gt 0 ] && [[ ",$MODES," == *,ipvs,* ]]; then
  say "ipvs floor: $FLOOR services, weir's phases beside ipvsadm-restore, ip -batch, ipset, iptables-restore"
  bash "$(dirname "$0")/ipvs-floor.sh" "$WEIR" "$FLOOR" 10 "$OUT/floor.md" >/dev/null
fi

# ---- the report: each mode beside nftables
{
  echo "## kernel $(uname -r), $(nproc) vCPU"
  cat "$OUT/scale.md"
  echo
  echo "### throughput through a ClusterIP (iperf3, ${SECONDS_PER_RUN} s, median of $ROUNDS)"
  echo
  echo "| mode | VIP Gbit/s | direct Gbit/s | VIP / direct | VIP / nftables VIP |"
  echo "|---|---:|---:|---:|---:|"
  base=$(awk '$1 == "nftables" {print $3}' "$OUT/tput.txt")
  awk -v base="${base:-0}" 'NR > 1 {
    printf "| %s | %.2f | %.2f | %s | %s |\n", $1, $3, $4,
      ($4 > 0 ? sprintf("%.2f", $3 / $4) : "—"), (base > 0 ? sprintf("%.2f", $3 / base) : "—") }' \
    "$OUT/tput.txt"
  echo
  echo "### ratios to nftables (same boot)"
  echo
  echo "| mode | services | full sync | one-endpoint sync | agent first sync | agent 1-ep change | conn/s VIP |"
  echo "|---|---:|---:|---:|---:|---:|---:|"
  jq -r '
    def r(a; b): if (a|type) == "number" and (b|type) == "number" and b > 0
      then (a / b * 100 | round / 100 | tostring) else "—" end;
    .rows as $rows
    | $rows[] as $x
    | ($rows | map(select(.mode == "nftables" and .services == $x.services)) | first) as $n
    | select($n != null)
    | "| \($x.mode) | \($x.services) | \(r($x.full_sync_ms; $n.full_sync_ms)) | \(r($x.one_endpoint.median_ms; $n.one_endpoint.median_ms)) | \(r($x.agent.full_sync_e2e_ms; $n.agent.full_sync_e2e_ms)) | \(r($x.agent.one_endpoint_change_e2e_ms; $n.agent.one_endpoint_change_e2e_ms)) | \(r($x.connections_per_s.vip; $n.connections_per_s.vip)) |"
  ' "$OUT/scale.json"
  if [ -f "$OUT/floor.md" ]; then echo; cat "$OUT/floor.md"; fi
} >"$OUT/report.md"
cat "$OUT/report.md"
