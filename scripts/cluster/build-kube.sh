#!/usr/bin/env bash
# Build a real Kubernetes control plane, kubelet, kube-proxy and kubectl (v1.20.2) from Debian 12's `kubernetes`
# SOURCE package with Debian's Go 1.19. Debian ships no kube-apiserver/kubelet binary and no registry reachable
# here has one; this is the only real Kubernetes to be had offline. Cold: ~5 min on 2 cores, ~1.4 GB
# RSS, ~2.6 GB disk. Idempotent: skips the build when OUT/bin already holds the binaries.
# It also installs the Debian packages up.sh needs (up.sh runs inside a namespace with no route to the mirror).
# Usage: build-kube.sh OUT   ->  OUT/bin/{kube-apiserver,kubelet,kube-controller-manager,kube-scheduler,kube-proxy,kubectl}, OUT/pause.c
set -euo pipefail
OUT=${1:?usage: build.sh OUT}
CMDS="kube-apiserver kubelet kube-controller-manager kube-scheduler kube-proxy kubectl"
export DEBIAN_FRONTEND=noninteractive
apt_install() { apt-get install -y -qq --no-install-recommends "$@" >/dev/null 2>&1 ||
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends "$@" >/dev/null; }; }
apt_install etcd-server openssl containerd runc containernetworking-plugins busybox-static iptables gcc libc6-dev
built=1; for c in $CMDS; do [ -x "$OUT/bin/$c" ] || built=""; done
if [ -n "$built" ] && [ -f "$OUT/pause.c" ]; then echo "already built: $OUT/bin"; exit 0; fi
mkdir -p "$OUT" && cd "$OUT"
apt_install golang-go rsync dpkg-dev golang-github-modern-go-reflect2-dev
# deb-src entries in a private apt directory made from the machine's own Debian sources (system config untouched)
A="$OUT/apt"; mkdir -p "$A/parts" "$A/lists/partial" "$A/cache"
sed 's/^Types: deb$/Types: deb deb-src/' /etc/apt/sources.list.d/debian.sources >"$A/parts/debian.sources"
APTO=(-o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts="$A/parts" -o Dir::State::Lists="$A/lists" -o Dir::Cache="$A/cache")
apt-get "${APTO[@]}" update >/dev/null
mkdir -p src && (cd src && apt-get "${APTO[@]}" source --download-only kubernetes=1.20.5+really1.20.2-1.1+deb12u1 >/dev/null)
rm -rf k8s && dpkg-source -x src/kubernetes_1.20.5+really1.20.2-1.1+deb12u1.dsc k8s >/dev/null
# the vendored modern-go/reflect2 1.0.1 predates Go 1.18: use Debian's 1.0.2
rm -rf k8s/vendor/github.com/modern-go/reflect2
cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 k8s/vendor/github.com/modern-go/reflect2
cd k8s
export GOPROXY=off CGO_ENABLED=0 GOLDFLAGS="-s -w" HOME="$OUT/home" GOCACHE="$OUT/gocache"
mkdir -p "$HOME"
WHAT=""; for c in $CMDS; do WHAT="$WHAT cmd/$c"; done
make WHAT="${WHAT# }" >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; } # `make`, not `go build`: it runs the code generators
mkdir -p "$OUT/bin"; for c in $CMDS; do cp "_output/bin/$c" "$OUT/bin/"; done
cp build/pause/linux/pause.c "$OUT/pause.c"   # the pause container's source, for a local image
cd "$OUT" && rm -rf k8s gocache src apt home ./*.orig.tar.gz
ls -la "$OUT/bin"
