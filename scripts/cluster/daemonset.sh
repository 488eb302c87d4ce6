#!/usr/bin/env bash
# deploy/ on a real cluster: the node image `bash scripts/dev.sh image` builds is imported into
# both nodes' containerd, deploy/ is applied with kubectl (render_deploy.py: per-node hostPaths,
# the local image), the install-cni init container writes weir-cni and the conflist the
# kubelets then use, and the one agent container (weir agent: proxy, routes and NetworkPolicy)
# runs from the image against the in-cluster API. Then its /healthz parts, the demo workload and
# the probe matrix, and a default-deny NetworkPolicy applied and deleted (netpol.sh); then
# everything is torn down.
# Usage: daemonset.sh [--keep]   (as root; minutes: the image build is a release build)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
cd "$ROOT"
keep=${1:-}
t0=$SECONDS
step() { printf '[%4ds] %s\n' $((SECONDS - t0)) "$*" >&2; }
image=${WEIR_IMAGE:-localhost/weir:$(git rev-parse --short=12 HEAD)}
if ! podman image exists "$image"; then
  step "building $image (bash scripts/image.sh: podman build, then its own checks)"
  WEIR_IMAGE=$image bash scripts/image.sh
fi
# The nodes' weir dns still runs from this tree's debug build (up.sh: WEIR_BIN), not the image.
step "building weir (debug) for the nodes' weir dns"
cargo build -q -p weir -p weir-cni --bins
run=${WEIR_CLUSTER_RUN:-/tmp/weir-cluster-ds}
bash "$HERE/down.sh" "$run" >/dev/null 2>&1 || true
rm -rf "$run"
mkdir -p "$run"
[ "$keep" = --keep ] || trap 'step "tearing down"; bash "$HERE/down.sh" "$run" >/dev/null' EXIT
step "saving $image for the nodes' containerd ($(podman image inspect -f '{{.Size}}' "$image" | numfmt --to=iec) uncompressed)"
podman save -q --format docker-archive -o "$run.image.tar" "$image"
step "cluster up: no weir on the nodes yet (WEIR_AGENTS=daemonset)"
WEIR_AGENTS=daemonset WEIR_IMAGE_TAR=$run.image.tar bash "$HERE/up.sh" ds "$run" 2>"$run.up.log" ||
  { rm -f "$run.image.tar"; cat "$run.up.log" >&2; exit 1; }
rm -f "$run.image.tar" # in both nodes' containerd now; the disk may be short
k() { "$run/kubectl" "$@"; }
step "kubectl apply deploy/ (rendered: $run/deploy.yaml)"
python3 "$HERE/render_deploy.py" "$run" "$image" >"$run/deploy.yaml"
k apply -f "$run/deploy.yaml" >/dev/null
for node in node-1 node-2; do
  k -n kube-system rollout status "ds/weir-$node" --timeout=180s >/dev/null ||
    { k -n kube-system get pods -o wide; k -n kube-system describe pods | tail -40; exit 1; }
done
for node in node-1 node-2; do
  for _ in $(seq 1 120); do k get node "$node" | grep -q ' Ready' && break; sleep 0.5; done
  k get node "$node" | grep -q ' Ready' || { echo "$node never became Ready" >&2; exit 1; }
  f=$run/$node/cni-bin/weir-cni
  if [ ! -f "$f" ] || [ -L "$f" ]; then echo "install-cni wrote no $f" >&2; exit 1; fi
  [ -f "$run/$node/cni/net.d/10-weir.conflist" ] || { echo "no conflist on $node" >&2; exit 1; }
done
step "the DaemonSet's pods run on both nodes; install-cni wrote weir-cni ($(du -h "$run/node-1/cni-bin/weir-cni" | cut -f1)) and the conflist; both nodes Ready"
k -n kube-system get pods -o wide
step "the demo workload"
k apply -f "$HERE/demo.yaml" >/dev/null
k rollout status deploy/web --timeout=120s >/dev/null
k wait --for=condition=Ready pod/client --timeout=60s >/dev/null
status=0
# shellcheck disable=SC1091
. "$run/env"
step "the agent container's /healthz on each node: parts proxy, routes and policy all ok"
for i in 1 2; do
  h=$(nsenter --net="/run/netns/$NAME-n$i" curl -s -m 3 http://127.0.0.1:10256/healthz)
  if jq -e '.parts | .proxy == "ok" and .routes == "ok" and .policy == "ok"' <<<"$h" >/dev/null 2>&1; then
    echo "PASS  node-$i agent /healthz parts: $(jq -c .parts <<<"$h")"
  else
    echo "FAIL  node-$i agent /healthz: $h"
    status=1
  fi
done
step "the probe matrix"
if bash "$HERE/matrix.sh" "$run"; then echo "PASS  probe matrix: every probe answered as expected"
else echo "FAIL  probe matrix: the rows with OK 'no' above"; status=1; fi
step "NetworkPolicy from the agent container: default-deny applied and deleted with kubectl"
bash "$HERE/netpol.sh" "$run" || status=1
for node in node-1 node-2; do
  pod=$(k -n kube-system get pods -l app.kubernetes.io/name=weir --field-selector "spec.nodeName=$node" -o name | head -1)
  echo "--- $node $pod agent (last lines)"
  k -n kube-system logs "$pod" -c agent --tail=3
done
step "done (exit $status)"
verdict=PASS; [ "$status" = 0 ] || verdict=FAIL
echo "cluster-daemonset $verdict image=$image image_bytes=$(podman image inspect -f '{{.Size}}' "$image") seconds=$((SECONDS - t0))"
[ "$keep" != --keep ] || step "left up: $run/kubectl; stop: bash scripts/cluster/down.sh $run"
exit $status
