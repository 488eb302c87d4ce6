#!/usr/bin/env bash
# One `weir agent` against the separate `weir proxy` + `weir routes` + `weir policy` on the real
# cluster (issue 31.2; the fake API server's version is crates/weir/benches/agent_compare.rs):
# watches opened, bytes received from the apiserver and RSS, on the same node (node-1), one
# side after the other, each through the same churn.
#
# The cluster is up.sh's, with its apiserver writing an audit log of the measured processes'
# list and watch requests (WEIR_AUDIT_POLICY). Each measured process runs as a ServiceAccount
# of its own (bound to deploy/base/rbac.yaml's ClusterRole) and reaches the apiserver on a port of
# its own (16444-16447, redirected to 16443 in the control plane's namespace): the audit log
# tells its requests apart by user, and node-1's nftables counters its bytes by source port
# (IP packets: headers, TLS and HTTP included). Before the first side starts, the API holds
# SERVICES selector-less Services with 10 endpoints each, NAMESPACES namespaces with one
# NetworkPolicy each, and a Deployment (agent_compare.py objects). Per side:
#   (A) `weir proxy` (nftables), `weir routes` (host-gw), `weir policy`, as up.sh starts them;
#   (B) one `weir agent` with the same flags;
# each started on node-1 in place of up.sh's own three (stopped), the rules they left taken
# over. Measured from the start to the first sync (every part healthy, routes' status
# written) and over ROUNDS one-second rounds of churn (agent_compare.py churn: an endpoint
# change and a pod relabel every second, the Deployment scaled 2 <-> 6 every 15 s): list and
# watch requests per resource (audit log), the apiserver's open WATCH requests
# (apiserver_longrunning_requests) before and after the start, bytes, VmRSS and RssAnon, CPU
# time during the churn. Ends with one line
#   cluster-agent watches_agent=W watches_separate=W rss_ratio=R anon_ratio=R bytes_ratio=B
# (ratios: agent / separate; bytes over the first sync and the churn together).
# Env: WEIR_BENCH_SERVICES (1000), WEIR_BENCH_NAMESPACES (100), WEIR_BENCH_CHURN_SECONDS (180:
# rounds per side; a multiple of 30 ends each side at the replicas it started with), WEIR_BIN
# (the directory of weir and weir-cni, default target/release), KUBE_BUILD.
# Usage: agent-compare.sh   (as root; dev.sh cluster-agent-compare builds first)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
export WEIR_BIN=${WEIR_BIN:-$ROOT/target/release}
SERVICES=${WEIR_BENCH_SERVICES:-1000}
NAMESPACES=${WEIR_BENCH_NAMESPACES:-100}
ROUNDS=${WEIR_BENCH_CHURN_SECONDS:-180}
run=${WEIR_CLUSTER_RUN:-/tmp/weir-cluster-cmp}
t0=$SECONDS
step() { printf '[%4ds] %s\n' $((SECONDS - t0)) "$*" >&2; }
declare -A PORT=([proxy]=16444 [routes]=16445 [policy]=16446 [agent]=16447)
PARTS=(proxy routes policy agent)

stop_measured() {
  for p in "${PARTS[@]}"; do bash "$HERE/ctl.sh" "$run" stop "node-1-cmp-$p" 2>/dev/null || true; done
}
bash "$HERE/down.sh" "$run" >/dev/null 2>&1 || true
rm -rf "$run"
mkdir -p "$run"
trap 'step "tearing down"; stop_measured; bash "$HERE/down.sh" "$run" >/dev/null' EXIT
users=$(printf 'system:serviceaccount:kube-system:cmp-%s, ' "${PARTS[@]}")
cat >"$run/audit-policy.yaml" <<EOF
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  users: [${users%, }]
  verbs: [list, watch]
- level: None
EOF
step "cluster up (weir from $WEIR_BIN; the apiserver's audit log: $run/audit.log)"
WEIR_AUDIT_POLICY=$run/audit-policy.yaml bash "$HERE/up.sh" cmp "$run" >/dev/null 2>"$run.up.log" ||
  { cat "$run.up.log" >&2; exit 1; }
# shellcheck disable=SC1091
. "$run/env"
k() { "$KUBECTL" "$@"; }
in_cp() { nsenter --net="/run/netns/$CP_NS" "$@"; }
in_n1() { nsenter --net="/run/netns/$NAME-n1" "$@"; }

step "a ServiceAccount, token, kubeconfig and apiserver port per measured process"
k apply -f "$ROOT/deploy/base/rbac.yaml" >/dev/null
for p in "${PARTS[@]}"; do
  k -n kube-system create serviceaccount "cmp-$p" >/dev/null
  k create clusterrolebinding "cmp-$p" --clusterrole=weir --serviceaccount="kube-system:cmp-$p" >/dev/null
  token=$(k -n kube-system create token "cmp-$p" --duration=6h)
  cat >"$run/cmp-$p.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: weir, cluster: {server: "https://$CP_IP:${PORT[$p]}", certificate-authority: "$run/pki/ca.crt"}}]
users: [{name: cmp-$p, user: {token: $token}}]
contexts: [{name: weir, context: {cluster: weir, user: cmp-$p}}]
current-context: weir
EOF
done
in_cp nft -f - <<EOF
table ip weir-cmp {
  chain pre { type nat hook prerouting priority dstnat; policy accept; tcp dport 16444-16447 redirect to :16443; }
}
EOF
in_n1 nft -f - <<EOF
table inet weir-cmp {
  counter rx_proxy {}
  counter rx_routes {}
  counter rx_policy {}
  counter rx_agent {}
  chain input {
    type filter hook input priority -400; policy accept;
    ip saddr $CP_IP tcp sport 16444 counter name rx_proxy
    ip saddr $CP_IP tcp sport 16445 counter name rx_routes
    ip saddr $CP_IP tcp sport 16446 counter name rx_policy
    ip saddr $CP_IP tcp sport 16447 counter name rx_agent
  }
}
EOF

step "objects: $SERVICES Services x 10 endpoints, $NAMESPACES namespaces with a NetworkPolicy each, Deployment churn"
in_cp python3 "$HERE/agent_compare.py" "$run" objects "$SERVICES" "$NAMESPACES"
k -n cmp rollout status deploy/churn --timeout=300s >/dev/null
for p in proxy routes policy; do bash "$HERE/ctl.sh" "$run" stop "node-1-$p"; done

N=$run/node-1
proxy_flags=$(grep -v -e '^proxy$' -e '^--kubeconfig=' "$N/proxy.args" | tr '\n' ' ')
routes_flags="--backend=host-gw --mtu-file=$N/routes-mtu --status=$N/cmp-routes-status.json"
command_of() { # PART -> the command line, one word a line (ctl.sh's .cmd file)
  local kc=--kubeconfig=$run/cmp-$1.kubeconfig
  printf '%s\n' "$NAME-n1" env RUST_LOG=info "$WEIR_BIN/weir"
  # shellcheck disable=SC2086
  case $1 in
    proxy) printf '%s\n' proxy "$kc" $proxy_flags ;;
    routes) printf '%s\n' routes "$kc" --node-name=node-1 $routes_flags --metrics-bind-address=127.0.0.1:10263 ;;
    policy) printf '%s\n' policy "$kc" --node-name=node-1 --healthz-bind-address=127.0.0.1:10258 ;;
    agent) printf '%s\n' agent "$kc" $proxy_flags $routes_flags ;;
  esac
}
counter() { in_n1 nft -j list counter inet weir-cmp "rx_$1" | jq '.nftables[] | select(.counter) | .counter.bytes'; }
open_watches() {
  k get --raw /metrics | awk '/^apiserver_longrunning_requests\{/ && /verb="WATCH"/ { s += $2 } END { print s + 0 }'
}
proc_kb() { awk -v k="$2:" '$1 == k { print $2 }' "/proc/$1/status"; } # PID FIELD -> kB
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
ready() { # SIDE: every part healthy and routes' status written
  [ -s "$N/cmp-routes-status.json" ] || return 1
  if [ "$1" = agent ]; then
    in_n1 curl -sf -m 2 http://127.0.0.1:10256/healthz |
      jq -e '.parts | .proxy == "ok" and .routes == "ok" and .policy == "ok"' >/dev/null
  else
    in_n1 curl -sf -m 2 -o /dev/null http://127.0.0.1:10256/healthz &&
      in_n1 curl -sf -m 2 -o /dev/null http://127.0.0.1:10258/healthz
  fi
}

# One side: PHASE SIDE PART... -> key=value lines in $run/cmp-SIDE.txt
measure() {
  local phase=$1 side=$2 out=$run/cmp-$2.txt
  shift 2
  local parts=("$@") started t_start
  rm -f "$N/cmp-routes-status.json"
  sleep 5 # the watches of the processes just stopped are closed
  local before
  before=$(open_watches)
  t_start=$(date +%s%N)
  for p in "${parts[@]}"; do
    command_of "$p" >"$run/node-1-cmp-$p.cmd"
    bash "$HERE/ctl.sh" "$run" start "node-1-cmp-$p"
  done
  for _ in $(seq 1 600); do ready "$side" && break; sleep 0.2; done
  ready "$side" || { echo "$side never became ready; logs:" >&2; tail -5 "$run"/node-1-cmp-*.log >&2; exit 1; }
  echo "sync_ms=$((($(date +%s%N) - t_start) / 1000000))" >"$out"
  sleep 10 # the lists are done and every watch is open
  echo "open_watches_delta=$(($(open_watches) - before))" >>"$out"
  local sync_bytes=0 sync_rss=0 p pid
  for p in "${parts[@]}"; do
    sync_bytes=$((sync_bytes + $(counter "$p")))
    pid=$(cat "$run/node-1-cmp-$p.pid")
    echo "rss_sync_$p=$(proc_kb "$pid" VmRSS)" >>"$out"
    sync_rss=$((sync_rss + $(proc_kb "$pid" VmRSS)))
    echo "cpu0_$p=$(cpu_ticks "$pid")" >>"$out"
  done
  in_cp python3 "$HERE/agent_compare.py" "$run" audit "${parts[@]/#/cmp-}" >"$run/cmp-$side.audit-sync.json"
  printf 'bytes_sync=%s\nrss_sync=%s\n' "$sync_bytes" "$sync_rss" >>"$out"
  step "$side: ready $(sed -n 's/^sync_ms=//p' "$out") ms after the start, $sync_bytes bytes; churn: $ROUNDS rounds"
  started=$SECONDS
  in_cp python3 "$HERE/agent_compare.py" "$run" churn "$ROUNDS" "$SERVICES" "$phase"
  sleep 5 # the last events delivered
  echo "churn_seconds=$((SECONDS - started))" >>"$out"
  local total=0
  for p in "${parts[@]}"; do
    total=$((total + $(counter "$p")))
    pid=$(cat "$run/node-1-cmp-$p.pid")
    printf 'rss_%s=%s\nanon_%s=%s\ncpu_%s=%s\n' "$p" "$(proc_kb "$pid" VmRSS)" "$p" "$(proc_kb "$pid" RssAnon)" \
      "$p" "$(($(cpu_ticks "$pid") - $(sed -n "s/^cpu0_$p=//p" "$out")))" >>"$out"
  done
  echo "bytes_total=$total" >>"$out"
  in_cp python3 "$HERE/agent_compare.py" "$run" audit "${parts[@]/#/cmp-}" >"$run/cmp-$side.audit.json"
  for p in "${parts[@]}"; do bash "$HERE/ctl.sh" "$run" stop "node-1-cmp-$p"; done
}

step "(A) separate: weir proxy + weir routes + weir policy on node-1"
measure 0 separate proxy routes policy
step "(B) one weir agent on node-1"
measure 1 agent agent
# the Node watch's share: up.sh's kubelets write their Node's status every 4 s
node_bytes=$(k get --raw /api/v1/nodes/node-1 | wc -c)
python3 - "$run" "$(getconf CLK_TCK)" "$node_bytes" <<'EOF'
import json, sys
run, hz, node_bytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def side(name, parts):
    kv = dict(l.strip().split("=", 1) for l in open(f"{run}/cmp-{name}.txt"))
    kv = {k: int(v) for k, v in kv.items()}
    def reqs(f):
        a = json.load(open(f"{run}/cmp-{name}.{f}.json"))
        by = {}
        for u in a.values():
            for res, c in u.items():
                for verb, n in c.items():
                    by.setdefault(verb, {}).setdefault(res, 0)
                    by[verb][res] += n
        return by
    return kv, parts, reqs("audit-sync"), reqs("audit")
S = side("separate", ["proxy", "routes", "policy"])
A = side("agent", ["agent"])
mib = lambda kb: kb / 1024
def total(s, key): return sum(s[0][f"{key}_{p}"] for p in s[1])
def detail(s, key, f=mib, unit=" MiB"):
    vals = [f(s[0][f"{key}_{p}"]) for p in s[1]]
    return (" + ".join(f"{v:.1f}" for v in vals) + (f" = {sum(vals):.1f}" if len(vals) > 1 else "") + unit)
def count(s, i, verb): return sum(s[i].get(verb, {}).values())
def per(s, i, verb): return ", ".join(f"{r} {n}" for r, n in sorted(s[i].get(verb, {}).items()))
rows = [
    ("watches opened to the first sync", count(S, 2, "watch"), count(A, 2, "watch"),
     f"{per(S, 2, 'watch')} | {per(A, 2, 'watch')}"),
    ("watches opened, whole side", count(S, 3, "watch"), count(A, 3, "watch"), ""),
    ("open WATCH requests added (apiserver gauge)", S[0]["open_watches_delta"], A[0]["open_watches_delta"], ""),
    ("lists, whole side", count(S, 3, "list"), count(A, 3, "list"), ""),
    ("bytes received, first sync", S[0]["bytes_sync"], A[0]["bytes_sync"], ""),
    ("bytes received, churn", S[0]["bytes_total"] - S[0]["bytes_sync"], A[0]["bytes_total"] - A[0]["bytes_sync"],
     f"{S[0]['churn_seconds']} s | {A[0]['churn_seconds']} s"),
    ("bytes received, both", S[0]["bytes_total"], A[0]["bytes_total"], ""),
]
print("| per node (node-1) | separate (proxy + routes + policy) | one agent | ratio |")
print("| --- | ---: | ---: | ---: |")
for name, s, a, note in rows:
    print(f"| {name} | {s:,} | {a:,} | {a / s if s else float('nan'):.2f} |" + (f" {note}" if note else ""))
for key, label in [("rss_sync", "RSS after the first sync"), ("rss", "RSS after the churn"),
                   ("anon", "RssAnon after the churn")]:
    print(f"| {label} | {detail(S, key)} | {detail(A, key)} | {total(A, key) / total(S, key):.2f} |")
print(f"| CPU during the churn | {detail(S, 'cpu', lambda t: t / hz, ' s')} | {detail(A, 'cpu', lambda t: t / hz, ' s')} |"
      f" {total(A, 'cpu') / max(1, total(S, 'cpu')):.2f} |")
print(f"| start to every part ready (polled every 0.2 s) | {S[0]['sync_ms'] / 1000:.1f} s | {A[0]['sync_ms'] / 1000:.1f} s | |")
print(f"(a Node object is {node_bytes:,} bytes of JSON; each kubelet writes its Node's status every 4 s here)")
print(f"cluster-agent watches_agent={count(A, 2, 'watch')} watches_separate={count(S, 2, 'watch')}"
      f" rss_ratio={total(A, 'rss') / total(S, 'rss'):.2f} anon_ratio={total(A, 'anon') / total(S, 'anon'):.2f}"
      f" bytes_ratio={A[0]['bytes_total'] / S[0]['bytes_total']:.2f}")
EOF
