#!/usr/bin/env bash
# Kubernetes' own [sig-network] [Conformance] tests, from the e2e.test of the version the project
# builds (scripts/cluster/kube/), on the real two-node cluster up.sh starts with weir as its CNI
# (weir-cni), service proxy (weir proxy) and cluster DNS (weir dns, with deploy/dns's settings).
# Every image the tests start is made locally (e2e-images.sh: agnhost from its module, busybox,
# pause, glibc-dns-testing) and imported into the nodes' containerd under the name the suite asks
# for; nothing is pulled. Prints the suite's own summary, then one row per conformance test the
# focus selects (passed, failed, or not run and why). Exit status: the suite's.
#
# Usage: conformance.sh [--proxy-mode M] [--netpol] [--keep] [-- extra ginkgo arguments]
#   M: weir proxy's mode (nftables, the default; iptables; userspace)
#   --netpol: the NetworkPolicy suite ([sig-network] Netpol) instead of the conformance focus
# Env: KUBE_BUILD (default /opt/weir-tools/kube-<pinned version>), WEIR_BIN (target/debug),
#      WEIR_TOOLS (/opt/weir-tools: the images are cached there per version),
#      WEIR_E2E_NODES (ginkgo's parallel processes, default 4), WEIR_POLICY (who enforces
#      NetworkPolicy: weir, the default, or kube-network-policies; up.sh).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
VERSION=$(bash "$HERE/kube/version.sh")
WEIR_TOOLS=${WEIR_TOOLS:-/opt/weir-tools}
KB=${KUBE_BUILD:-${WEIR_KUBE_BUILD:-$WEIR_TOOLS/kube-$VERSION}}
MODE=nftables
FOCUS='\[sig-network\].*\[Conformance\]'
SKIP=''
keep=""
netpol=""
while (($#)); do
  case $1 in
    --proxy-mode) MODE=${2:?--proxy-mode needs a mode}; shift 2 ;;
    --netpol) netpol=1; FOCUS='\[sig-network\] Netpol'; shift ;;
    --keep) keep=1; shift ;;
    --) shift; break ;;
    *) echo "usage: conformance.sh [--proxy-mode M] [--netpol] [--keep] [-- ginkgo args]" >&2; exit 2 ;;
  esac
done
for b in e2e.test ginkgo agnhost kubectl; do
  [ -x "$KB/bin/$b" ] || { echo "conformance.sh: no $KB/bin/$b: run scripts/cluster/kube/build.sh $KB" >&2; exit 2; }
done
t0=$SECONDS
# The three SCTP connectivity tests need SCTP sockets, which some kernels (this VM's) lack.
skip_why=""
if [ -n "$netpol" ] && ! python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_SCTP)' 2>/dev/null; then
  SKIP='\[Feature:SCTPConnectivity\]'
  skip_why="this kernel has no SCTP (socket(AF_INET, SOCK_STREAM, IPPROTO_SCTP) is refused)"
fi
step() { printf '[%4ds] %s\n' $((SECONDS - t0)) "$*" >&2; }

images=$WEIR_TOOLS/e2e-images-$VERSION
step "the suite's images, made locally ($images)"
bash "$HERE/e2e-images.sh" "$KB" "$images" >&2

name=cf$(($$ % 100000))
run=${WEIR_CONFORMANCE_RUN:-/tmp/weir-conformance-$name}
bash "$HERE/down.sh" "$run" >/dev/null 2>&1 || true
rm -rf "$run"
mkdir -p "$run"
# Torn down on exit; a passing run's directory (about 1 GB: etcd, images, logs) goes too, a
# failing one stays for its logs.
# shellcheck disable=SC2317 # called by the EXIT trap
teardown() {
  local rc=$?
  step "tearing down"
  bash "$HERE/down.sh" "$run" >/dev/null 2>&1
  [ "$rc" != 0 ] || rm -rf "$run"
}
[ -n "$keep" ] || trap teardown EXIT
step "cluster up: Kubernetes $VERSION, CNI ${WEIR_CNI:-weir-cni}, weir proxy ($MODE), weir routes, weir dns, NetworkPolicy by ${WEIR_POLICY:-weir} ($run)"
KUBE_BUILD=$KB WEIR_PROXY_MODE=$MODE WEIR_E2E_IMAGES=$images \
  bash "$HERE/up.sh" "$name" "$run" 2>"$run/up.log" || { cat "$run/up.log" >&2; exit 1; }
# shellcheck disable=SC1091
. "$run/env"

nodes=${WEIR_E2E_NODES:-4}
step "e2e.test --ginkgo.focus='$FOCUS' ($nodes parallel processes; log: $run/e2e.log)"
mkdir -p "$run/report"
status=0
# From the control plane's namespace: the apiserver, the nodes and the pod CIDRs are reachable.
nsenter --net="/run/netns/$CP_NS" env PATH="$KB/bin:$PATH" "$KB/bin/ginkgo" --nodes="$nodes" \
  --focus="$FOCUS" ${SKIP:+--skip="$SKIP"} --no-color --timeout=2h "$@" "$KB/bin/e2e.test" -- \
  --kubeconfig="$KUBECONFIG" --provider=skeleton --report-dir="$run/report" \
  --e2e-output-dir="$run/report" --disable-log-dump --minStartupPods=0 \
  --dns-domain=cluster.local >"$run/e2e.log" 2>&1 || status=$?

step "the suite's summary"
grep -E "^(Ran [0-9]+ of [0-9]+ Specs|SUCCESS!|FAIL!|Test Suite (Passed|Failed))" "$run/e2e.log" >&2 ||
  tail -30 "$run/e2e.log" >&2
grep -A1 "^Summarizing [0-9]* Failure" "$run/e2e.log" >&2 || true
# every test the focus should select, from the suite's own list (conformance) or its dry run
if [ -z "$netpol" ]; then
  "$KB/bin/e2e.test" --list-conformance-tests 2>/dev/null | python3 -c '
import sys, yaml
for t in yaml.safe_load(sys.stdin):
    if t["codename"].startswith("[sig-network]"): print(t["codename"])' >"$run/expected.txt"
else
  "$KB/bin/e2e.test" --list-tests 2>/dev/null | sed -nE 's/^ *[^ ]+:[0-9]+: //; /^\[sig-network\] Netpol/p' >"$run/expected.txt"
fi
python3 "$HERE/junit_table.py" "$run/report" "$run/expected.txt" ${SKIP:+"--skipped=$SKIP=$skip_why"} >&2 || true
[ -z "$keep" ] || step "left up: $run/kubectl; stop: bash scripts/cluster/down.sh $run"
step "done (exit $status)"
exit $status
