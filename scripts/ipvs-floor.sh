#!/usr/bin/env bash
# ipvs mode's full sync beside the kernel's own cost of the same state, in one boot of the test
# VM (docs/vm.md); part of `bash scripts/dev.sh vm-bench`, or alone:
#   bash scripts/dev.sh vm -- 'bash scripts/ipvs-floor.sh target/release/weir 10000'
# 1. `weir proxy` syncs N Services × E endpoints (every 10th also a NodePort) from manifests in
#    a fresh namespace, in ipvs mode and then in nftables mode; each logs its full sync's phases.
# 2. What ipvs mode programmed is dumped (ipvsadm-save, kube-ipvs0's addresses, ipset save,
#    iptables-save) and loaded into another fresh namespace by the kernel's own tools, each
#    timed: the floor of kube-proxy's ipvs layout, whoever programs it. nftables' ruleset is
#    reloaded with `nft -f` the same way.
# Usage (guest): ipvs-floor.sh <weir binary> [services (10000)] [endpoints (10)] [report file]
set -euo pipefail
WEIR=$(realpath "$1") N=${2:-10000} E=${3:-10} REPORT=${4:-}
T=ivf$$
D=/tmp/$T
say() { printf '[ipvs-floor] %s\n' "$*" >&2; }
inn() { ip netns exec "$@"; }
cleanup() {
  [ -f "$D/proxy.pid" ] && kill "$(cat "$D/proxy.pid")" 2>/dev/null
  for ns in "$T-ipvs" "$T-nftables" "$T-tools" "$T-nft"; do ip netns del "$ns" 2>/dev/null; done
  rm -rf "$D"
  true
}
trap cleanup EXIT
mkdir -p "$D/m"
for t in ipvsadm-save ipvsadm-restore ipset iptables-restore nft python3; do
  command -v "$t" >/dev/null || { say "$t missing"; exit 1; }
done

say "writing $N services × $E endpoints"
python3 - "$D/m" "$N" "$E" <<'EOF'
import sys
out, n, e = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for chunk in range(0, n, 500):
    with open(f"{out}/svc-{chunk // 500}.yaml", "w") as f:
        for i in range(chunk, min(chunk + 500, n)):
            np = f", nodePort: {30000 + i // 10}" if i % 10 == 0 else ""
            kind = "NodePort" if i % 10 == 0 else "ClusterIP"
            f.write(f"apiVersion: v1\nkind: Service\nmetadata: {{name: s{i}, namespace: b}}\n"
                    f"spec: {{type: {kind}, clusterIP: 10.{96 + i // 62500}.{i // 250 % 250}.{i % 250 + 1}, "
                    f"ports: [{{name: p, port: 80, targetPort: 8080, protocol: TCP{np}}}]}}\n---\n")
            eps = "".join(
                f"- {{addresses: [10.{200 + (i * e + k) // 62500}.{(i * e + k) // 250 % 250}.{(i * e + k) % 250 + 1}], conditions: {{ready: true}}, nodeName: other}}\n"
                for k in range(e))
            f.write(f"apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n"
                    f"metadata: {{name: s{i}-1, namespace: b, labels: {{kubernetes.io/service-name: s{i}}}}}\n"
                    f"addressType: IPv4\nports: [{{name: p, port: 8080, protocol: TCP}}]\nendpoints:\n{eps}---\n")
EOF

# ms since an epoch in ns
now() { date +%s%N; }
ms_since() { echo $((($(now) - $1) / 1000000)); }

# weir proxy in mode $1 until its first sync; prints the synced line's elapsed_ms and keeps
# the log (the phases line) in $D/$1.log
sync_mode() {
  local mode=$1 ns=$T-$1
  ip netns add "$ns"
  inn "$ns" ip link set lo up
  inn "$ns" ip link add eth0 type dummy
  inn "$ns" ip addr add 10.77.0.5/24 dev eth0
  inn "$ns" ip link set eth0 up
  RUST_LOG=info inn "$ns" sh -c 'echo $$ >'"$D/proxy.pid"'; exec "$@"' sh "$WEIR" proxy \
    --proxy-mode "$mode" --manifests "$D/m" --state-dir "$D/state-$mode" \
    --cluster-cidr 10.244.0.0/16 --hostname-override bench --sync-period 1h \
    >"$D/$mode.log" 2>&1 </dev/null &
  local end=$(($(date +%s) + 900))
  until grep -q ' synced' "$D/$mode.log" 2>/dev/null; do
    [ "$(date +%s)" -lt "$end" ] || { tail "$D/$mode.log" >&2; exit 1; }
    sleep 0.5
  done
  # The process's CPU so far, user and kernel (ticks → ms): the kernel's share of a sync is
  # work no user-space change can remove.
  local tick stat
  tick=$(getconf CLK_TCK)
  read -ra stat <"/proc/$(cat "$D/proxy.pid")/stat"
  echo "$((stat[13] * 1000 / tick)) $((stat[14] * 1000 / tick))" >"$D/$mode.cpu"
  kill "$(cat "$D/proxy.pid")"
  rm "$D/proxy.pid"
  sleep 0.5
}
# a log field's value, in whole units
field() { grep -o "$1=[0-9.]*" | head -1 | cut -d= -f2 | cut -d. -f1; }

say "weir proxy, ipvs mode"
sync_mode ipvs
say "weir proxy, nftables mode"
sync_mode nftables

say "dumping ipvs mode's state"
S=$T-ipvs
inn "$S" ipvsadm-save -n >"$D/ipvs.save"
inn "$S" ip -o -4 addr show dev kube-ipvs0 | awk '{print "address add", $4, "dev kube-ipvs0"}' >"$D/addr.batch"
inn "$S" ipset save >"$D/ipset.save"
inn "$S" iptables-save >"$D/iptables.save"
inn "$T-nftables" nft list ruleset >"$D/nft.save"

say "loading it with the kernel's tools"
X=$T-tools
ip netns add "$X"
inn "$X" ip link set lo up # IPVS refuses a real server whose address type it cannot tell
inn "$X" ip link add kube-ipvs0 type dummy
t=$(now); inn "$X" ipset restore <"$D/ipset.save"; ipset_ms=$(ms_since "$t")
t=$(now); inn "$X" iptables-restore <"$D/iptables.save"; ipt_ms=$(ms_since "$t")
t=$(now); inn "$X" ipvsadm-restore <"$D/ipvs.save"; ipvs_ms=$(ms_since "$t")
t=$(now); inn "$X" ip -batch "$D/addr.batch"; addr_ms=$(ms_since "$t")
ip netns add "$T-nft"
inn "$T-nft" ip link set lo up
t=$(now); inn "$T-nft" nft -f "$D/nft.save"; nft_ms=$(ms_since "$t")

ph=$(grep 'full sync phases' "$D/ipvs.log" | tail -1)
ipvs_total=$(grep ' synced' "$D/ipvs.log" | head -1 | field elapsed_ms)
nft_total=$(grep ' synced' "$D/nftables.log" | head -1 | field elapsed_ms)
vs=$(grep -c '^-A' "$D/ipvs.save" || true)
rs=$(grep -c '^-a' "$D/ipvs.save" || true)
addrs=$(wc -l <"$D/addr.batch")
entries=$(grep -c '^add' "$D/ipset.save" || true)
{
  echo "### ipvs mode's full sync beside the kernel's tools ($N services × $E endpoints, kernel $(uname -r), $(nproc) vCPU)"
  echo
  echo "State: $vs virtual servers, $rs real servers, $addrs kube-ipvs0 addresses, $entries ipset entries."
  echo
  echo "| phase | weir ipvs mode, ms | the kernel's tool, ms | tool |"
  echo "|---|---:|---:|---|"
  printf '| ipsets | %s | %s | ipset restore |\n' "$(echo "$ph" | field ipsets_ms)" "$ipset_ms"
  printf '| iptables rules | %s | %s | iptables-restore |\n' "$(echo "$ph" | field iptables_ms)" "$ipt_ms"
  printf '| IPVS virtual and real servers | %s | %s | ipvsadm-restore |\n' "$(echo "$ph" | field ipvs_ms)" "$ipvs_ms"
  printf '| kube-ipvs0 addresses | %s | %s | ip -batch |\n' "$(echo "$ph" | field addresses_ms)" "$addr_ms"
  printf '| **whole full sync** | %s | %s | sum of the four |\n' "$ipvs_total" "$((ipset_ms + ipt_ms + ipvs_ms + addr_ms))"
  echo
  echo "| | ms |"
  echo "|---|---:|"
  echo "| weir nftables mode, full sync | $nft_total |"
  echo "| nft -f of that ruleset | $nft_ms |"
  echo
  echo "| process CPU from start to the first sync | user ms | kernel ms |"
  echo "|---|---:|---:|"
  for mode in ipvs nftables; do
    read -r user sys <"$D/$mode.cpu"
    echo "| weir proxy, $mode mode | $user | $sys |"
  done
  echo
  echo "full sync phases line (ipvs): ${ph#*phases}"
} | tee "${REPORT:-/dev/null}"
