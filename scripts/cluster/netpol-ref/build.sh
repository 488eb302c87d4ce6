#!/usr/bin/env bash
# The NetworkPolicy implementation the policy benchmark measures weir against, built from Go
# modules only (the module proxy; nothing else is fetched), at the version this directory's
# go.mod pins (go.sum committed): sigs.k8s.io/kube-network-policies, SIG Network's reference,
# which sends the first packet of each connection of a policy-selected pod to user space
# (nfqueue) and judges it there against the informers' current objects.
#
# Its rules use nftables' `queue` expression. A kernel built without nft_queue (CONFIG_NFT_QUEUE
# unset, as this machine's) rejects the whole table, so nothing would be judged; when a probe
# in a throwaway network namespace shows that, one dependency is patched
# (nftables-queue-xt.patch: github.com/google/nftables encodes the queue verdict as nft_compat's
# xtables NFQUEUE target, which such kernels have). The packet reaches the same queue with the
# same flags; kube-network-policies' own code is not touched. VERSION says which was built.
#
# Usage: build.sh OUT   -> OUT/bin/kube-network-policies, OUT/VERSION. Idempotent.
# Env: NETPOL_REF_QUEUE=auto (default: probe the kernel), xt (always patch), nft (never).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${1:?usage: build.sh OUT}
KNP=$(awk '{ for (i = 1; i < NF; i++) if ($i == "sigs.k8s.io/kube-network-policies") { print $(i + 1); exit } }' "$HERE/go.mod")
step() { printf '[%s] %s\n' "$(date +%T)" "$*" >&2; }

queue=${NETPOL_REF_QUEUE:-auto}
if [ "$queue" = auto ]; then
  queue=nft
  unshare -n nft -f - 2>/dev/null <<'EOF' || queue=xt
table inet probe {
  chain c {
    type filter hook postrouting priority 0
    queue to 1
  }
}
EOF
fi
want="$KNP queue=$queue"
if [ -x "$OUT/bin/kube-network-policies" ] && [ "$(cat "$OUT/VERSION" 2>/dev/null)" = "$want" ]; then
  echo "already built: $OUT/bin ($want)"; exit 0
fi
export PATH=$PATH:/usr/local/go/bin
export CGO_ENABLED=0 GOFLAGS=-mod=readonly GOTOOLCHAIN=local
export GOCACHE=${GOCACHE:-$OUT/.gocache}
t0=$(date +%s)
mkdir -p "$OUT/bin"
step "kube-network-policies $KNP: downloading modules"
(cd "$HERE" && go mod download)
# A copy of this module to build in: the patched dependency is a directory beside it.
src=$OUT/src
rm -rf "$src"
mkdir -p "$src"
cp "$HERE/go.mod" "$HERE/go.sum" "$HERE/tools.go" "$src/"
if [ "$queue" = xt ]; then
  step "this kernel has no nft_queue: the queue verdict through xt NFQUEUE (nftables-queue-xt.patch)"
  dir=$(cd "$HERE" && go list -m -f '{{.Dir}}' github.com/google/nftables)
  cp -r "$dir" "$src/nftables"
  chmod -R u+w "$src/nftables"
  patch -s -d "$src/nftables" -p1 <"$HERE/nftables-queue-xt.patch"
  (cd "$src" && go mod edit -replace github.com/google/nftables=./nftables)
fi
step "go build kube-network-policies"
(cd "$src" && go build -trimpath -ldflags "-s -w" -o "$OUT/bin/kube-network-policies" sigs.k8s.io/kube-network-policies/cmd)
echo "$want" >"$OUT/VERSION"
rm -rf "$OUT/.gocache" "$src"
step "built in $(($(date +%s) - t0)) s: $OUT/bin/kube-network-policies ($want)"
