#!/usr/bin/env bash
# deploy/ on a real cluster: the node image `bash scripts/dev.sh image` builds is imported into
# both nodes' containerd, deploy/ is applied with kubectl (render_deploy.py: per-node hostPaths,
# the local image), the install-cni init container writes weir-cni and the conflist the
# kubelets then use, and the one agent container (weir agent: proxy, routes and NetworkPolicy)
# runs from the image against the in-cluster API. Then its /healthz parts, the demo workload and
# the probe matrix, and a default-deny NetworkPolicy applied and deleted (netpol.sh); then
# everything is torn down.
#
# --proxy-only: deploy/proxy-only/ instead, beside the reference bridge + host-local plugins as
# the nodes' CNI (up.sh's WEIR_CNI=reference; static routes between the nodes' pod CIDRs): no
# install step, the agent runs the service proxy alone. Checked: the nodes' CNI configuration
# is the bridge plugin's alone, the agent's /healthz is the proxy's (no other part), the node
# holds the proxy's nft table and neither weir's policy table nor weir's routes, and the probe
# matrix passes. The cluster is its own (name dsp, /tmp/weir-cluster-dsp).
#
# Usage: daemonset.sh [--keep] [--proxy-only]   (as root; minutes: the image build is a
# release build). WEIR_IMAGE: the image to run (default localhost/weir:<HEAD's commit>, built
# by scripts/image.sh when podman does not hold it); name one built before to reuse it.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
cd "$ROOT"
keep="" mode=full
for a in "$@"; do
  case $a in
    --keep) keep=1 ;;
    --proxy-only) mode=proxy-only ;;
    *) echo "usage: daemonset.sh [--keep] [--proxy-only]" >&2; exit 2 ;;
  esac
done
t0=$SECONDS
step() { printf '[%4ds] %s\n' $((SECONDS - t0)) "$*" >&2; }
# podman as scripts/image.sh configures it (runc, cgroupfs, file logs), when it has
[ -n "${CONTAINERS_CONF:-}" ] || [ ! -f /var/tmp/weir-image/containers.conf ] ||
  export CONTAINERS_CONF=/var/tmp/weir-image/containers.conf
image=${WEIR_IMAGE:-localhost/weir:$(git rev-parse --short=12 HEAD)}
if ! podman image exists "$image"; then
  step "building $image (bash scripts/image.sh: podman build, then its own checks)"
  WEIR_IMAGE=$image bash scripts/image.sh
fi
# The nodes' weir dns still runs from this tree's debug build (up.sh: WEIR_BIN), not the image.
step "building weir (debug) for the nodes' weir dns"
cargo build -q -p weir -p weir-cni --bins
if [ $mode = full ]; then
  name=ds run=${WEIR_CLUSTER_RUN:-/tmp/weir-cluster-ds} cni=weir
else
  name=dsp run=${WEIR_CLUSTER_RUN:-/tmp/weir-cluster-dsp} cni=reference
fi
bash "$HERE/down.sh" "$run" >/dev/null 2>&1 || true
rm -rf "$run"
mkdir -p "$run"
[ -n "$keep" ] || trap 'step "tearing down"; bash "$HERE/down.sh" "$run" >/dev/null' EXIT
step "saving $image for the nodes' containerd ($(podman image inspect -f '{{.Size}}' "$image" | numfmt --to=iec) uncompressed)"
podman save -q --format docker-archive -o "$run.image.tar" "$image"
step "cluster up: no weir on the nodes yet (WEIR_AGENTS=daemonset, WEIR_CNI=$cni)"
WEIR_AGENTS=daemonset WEIR_CNI=$cni WEIR_IMAGE_TAR=$run.image.tar bash "$HERE/up.sh" $name "$run" 2>"$run.up.log" ||
  { rm -f "$run.image.tar"; cat "$run.up.log" >&2; exit 1; }
rm -f "$run.image.tar" # in both nodes' containerd now; the disk may be short
k() { "$run/kubectl" "$@"; }
step "kubectl apply $([ $mode = full ] && echo deploy/ || echo deploy/proxy-only/) (rendered: $run/deploy.yaml)"
python3 "$HERE/render_deploy.py" "$run" "$image" $mode >"$run/deploy.yaml"
k apply -f "$run/deploy.yaml" >/dev/null
for node in node-1 node-2; do
  k -n kube-system rollout status "ds/weir-$node" --timeout=180s >/dev/null ||
    { k -n kube-system get pods -o wide; k -n kube-system describe pods | tail -40; exit 1; }
done
for node in node-1 node-2; do
  for _ in $(seq 1 120); do k get node "$node" | grep -q ' Ready' && break; sleep 0.5; done
  k get node "$node" | grep -q ' Ready' || { echo "$node never became Ready" >&2; exit 1; }
done
status=0
# shellcheck disable=SC1091
. "$run/env"
in_node() { local i=$1; shift; nsenter --net="/run/netns/$name-n$i" "$@"; }

# The full stack: install-cni wrote weir-cni (a file, not up.sh's symlink) and its conflist.
check_cni_installed() {
  for node in node-1 node-2; do
    f=$run/$node/cni-bin/weir-cni
    if [ ! -f "$f" ] || [ -L "$f" ]; then echo "install-cni wrote no $f" >&2; exit 1; fi
    [ -f "$run/$node/cni/net.d/10-weir.conflist" ] || { echo "no conflist on $node" >&2; exit 1; }
  done
  step "the DaemonSet's pods run on both nodes; install-cni wrote weir-cni ($(du -h "$run/node-1/cni-bin/weir-cni" | cut -f1)) and the conflist; both nodes Ready"
}
# Proxy-only: the nodes' CNI is the bridge plugin's alone, nothing of weir-cni on them.
check_cni_untouched() {
  for node in node-1 node-2; do
    confs=$(cd "$run/$node/cni/net.d" && echo *)
    if [ "$confs" = 10-bridge.conflist ] && [ ! -e "$run/$node/cni-bin/weir-cni" ]; then
      echo "PASS  $node CNI: $confs only (the bridge plugin's), no weir-cni installed"
    else
      echo "FAIL  $node CNI: conf dir holds '$confs'; weir-cni $(ls "$run/$node/cni-bin/weir-cni" 2>&1)"
      status=1
    fi
  done
}
if [ $mode = full ]; then check_cni_installed; else check_cni_untouched; fi
k -n kube-system get pods -o wide
step "the demo workload"
k apply -f "$HERE/demo.yaml" >/dev/null
k rollout status deploy/web --timeout=120s >/dev/null
k wait --for=condition=Ready pod/client --timeout=60s >/dev/null

# The full stack's agent answers for its three parts.
check_health_parts() {
  step "the agent container's /healthz on each node: parts proxy, routes and policy all ok"
  for i in 1 2; do
    h=$(in_node $i curl -s -m 3 http://127.0.0.1:10256/healthz)
    if jq -e '.parts | .proxy == "ok" and .routes == "ok" and .policy == "ok"' <<<"$h" >/dev/null 2>&1; then
      echo "PASS  node-$i agent /healthz parts: $(jq -c .parts <<<"$h")"
    else
      echo "FAIL  node-$i agent /healthz: $h"
      status=1
    fi
  done
}
# Proxy-only: /healthz is the proxy's alone (200, kube-proxy's body: no other part named), and
# the node holds the proxy's table but neither weir's policy table nor a route of weir's.
check_proxy_alone() {
  step "the agent container's /healthz on each node: the proxy alone; its rules and nothing else of weir's"
  for i in 1 2; do
    h=$(in_node $i curl -s -m 3 -w '\n%{http_code}' http://127.0.0.1:10256/healthz)
    code=$(tail -1 <<<"$h") body=$(head -n -1 <<<"$h")
    if [ "$code" = 200 ] && jq -e '.parts == null and .lastUpdated != null' <<<"$body" >/dev/null 2>&1; then
      echo "PASS  node-$i agent /healthz 200, the proxy alone: $body"
    else
      echo "FAIL  node-$i agent /healthz $code: $body"
      status=1
    fi
    chains=$(in_node $i nft -j list table inet weir 2>/dev/null | jq '[.nftables[] | select(.chain)] | length')
    policy=$(in_node $i nft list table inet weir-policy >/dev/null 2>&1 && echo present || echo absent)
    routes=$(in_node $i ip route show proto 87 | grep -c . || true)
    if [ "${chains:-0}" -gt 0 ] && [ "$policy" = absent ] && [ "$routes" = 0 ]; then
      echo "PASS  node-$i nft table inet weir: $chains chains; table inet weir-policy absent; routes proto 87: 0"
    else
      echo "FAIL  node-$i nft table inet weir: ${chains:-none} chains; weir-policy $policy; routes proto 87: $routes"
      status=1
    fi
  done
}
if [ $mode = full ]; then check_health_parts; else check_proxy_alone; fi
step "the probe matrix"
if bash "$HERE/matrix.sh" "$run"; then echo "PASS  probe matrix: every probe answered as expected"
else echo "FAIL  probe matrix: the rows with OK 'no' above"; status=1; fi
if [ $mode = full ]; then
  step "NetworkPolicy from the agent container: default-deny applied and deleted with kubectl"
  bash "$HERE/netpol.sh" "$run" || status=1
fi
for node in node-1 node-2; do
  pod=$(k -n kube-system get pods -l app.kubernetes.io/name=weir --field-selector "spec.nodeName=$node" -o name | head -1)
  echo "--- $node $pod agent (last lines)"
  k -n kube-system logs "$pod" -c agent --tail=3
done
step "done (exit $status)"
verdict=PASS; [ "$status" = 0 ] || verdict=FAIL
label=cluster-daemonset; [ $mode = full ] || label="cluster-daemonset --proxy-only"
echo "$label $verdict image=$image image_bytes=$(podman image inspect -f '{{.Size}}' "$image") seconds=$((SECONDS - t0))"
[ -z "$keep" ] || step "left up: $run/kubectl; stop: bash scripts/cluster/down.sh $run"
exit $status
