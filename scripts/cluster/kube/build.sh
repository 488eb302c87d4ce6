#!/usr/bin/env bash
# Build the current Kubernetes the project's real cluster and conformance run use, from Go modules
# only (the module proxy; nothing else is fetched): kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet, kube-proxy, kubectl, the e2e suite (e2e.test) and ginkgo, the e2e
# helper image's agnhost, and etcd, at the versions this directory's go.mod pins (go.sum committed).
# containerd comes from its own module (containerd/go.mod): a kubelet of 1.36+ needs containerd 2.
#
# Usage: build.sh OUT   -> OUT/bin/*, OUT/VERSION. Idempotent: a finished OUT is left alone.
# The one place that knows the version is go.mod (`version.sh` reads it); OUT is keyed by it.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${1:?usage: build.sh OUT}
VERSION=$(bash "$HERE/version.sh")
BINS="kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl e2e.test ginkgo agnhost etcd containerd containerd-shim-runc-v2 ctr"
done=1
for b in $BINS; do [ -x "$OUT/bin/$b" ] || done=""; done
[ -f "$OUT/pause.c" ] || done=""
if [ -n "$done" ] && [ "$(cat "$OUT/VERSION" 2>/dev/null)" = "$VERSION" ]; then
  echo "already built: $OUT/bin ($VERSION)"; exit 0
fi
mkdir -p "$OUT/bin"
export CGO_ENABLED=0 GOFLAGS=-mod=readonly GOTOOLCHAIN=local
export GOCACHE=${GOCACHE:-$OUT/.gocache}
major=${VERSION#v}; major=${major%%.*}
minor=${VERSION#v*.}; minor=${minor%%.*}
date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
# What `make` stamps into a release (kubelet's and the apiserver's reported version; the e2e
# suite reads it to skip tests of other versions).
ld="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ld="$ld -X $pkg.gitVersion=$VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
  ld="$ld -X $pkg.gitTreeState=clean -X $pkg.buildDate=$date"
done
t0=$(date +%s)
cd "$HERE"
step() { printf '[%s] %s\n' "$(date +%T)" "$*" >&2; }
step "Kubernetes $VERSION: downloading modules"
go mod download
for c in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl; do
  step "go build $c"
  go build -trimpath -ldflags "$ld" -o "$OUT/bin/$c" "k8s.io/kubernetes/cmd/$c"
done
step "go build agnhost, ginkgo, etcd"
go build -trimpath -ldflags "-s -w" -o "$OUT/bin/agnhost" k8s.io/kubernetes/test/images/agnhost
go build -trimpath -ldflags "-s -w" -o "$OUT/bin/ginkgo" github.com/onsi/ginkgo/v2/ginkgo
go build -trimpath -ldflags "-s -w" -o "$OUT/bin/etcd" ./etcd
step "go test -c e2e.test (the whole suite)"
go test -c -trimpath -ldflags "$ld" -o "$OUT/bin/e2e.test" k8s.io/kubernetes/test/e2e
step "containerd (containerd/go.mod)"
(cd containerd && for c in containerd containerd-shim-runc-v2 ctr; do
  go build -trimpath -tags "no_btrfs no_devmapper no_zfs no_aufs" -ldflags "-s -w" -o "$OUT/bin/$c" "github.com/containerd/containerd/v2/cmd/$c"
done)
# the pause container's source, for the nodes' local sandbox image (up.sh compiles it)
cp "$(go env GOMODCACHE)/k8s.io/kubernetes@$VERSION/build/pause/linux/pause.c" "$OUT/pause.c"
echo "$VERSION" >"$OUT/VERSION"
rm -rf "$OUT/.gocache"
step "built in $(($(date +%s) - t0)) s: $(du -sh "$OUT" | cut -f1) in $OUT"
