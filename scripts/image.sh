#!/usr/bin/env bash
# Build the node agent's image from the repository with podman, then run it as the DaemonSet
# would, against the fake API server, in a network namespace of its own:
#
#   bash scripts/dev.sh image            build localhost/weir:<commit> and check it
#   WEIR_IMAGE_SKIP_BUILD=1 bash scripts/dev.sh image    check an image built before
#
# The Containerfile's base images come from Docker Hub. Where that registry cannot be reached
# (this workplace reaches only package registries), equivalents are made locally once, cached in
# $WEIR_IMAGE_CACHE: Debian bookworm by debootstrap from the Debian mirror (the runtime base), and
# the same plus gcc and this machine's rustup toolchain (the build stage). The build itself is the
# Containerfile's, unchanged: `cargo build --release --locked` inside the container.
#
# The check runs the image's own binaries with the DaemonSet's arguments (read from
# deploy/base/daemonset.yaml) and capabilities, the ConfigMaps' data as their files, and one
# difference: the fake API server speaks plain HTTP, so the containers get a kubeconfig naming it
# instead of the in-cluster service account.
set -euo pipefail
cd "$(dirname "$0")/.."

cache=${WEIR_IMAGE_CACHE:-/var/tmp/weir-image}
commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
image=${WEIR_IMAGE:-localhost/weir:$commit}
py=${WEIR_TOOLS:-/opt/weir-tools}/venv/bin/python
mkdir -p "$cache"

# runc and cgroupfs: crun 1.8 refuses this machine's cgroup v1/v2 hybrid layout, and there is no
# systemd (nor journald: container logs go to files). Explicit ulimits: podman's defaults exceed
# the sandbox's hard limits.
export CONTAINERS_CONF=$cache/containers.conf
cat >"$CONTAINERS_CONF" <<'EOF'
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]
log_driver = "k8s-file"
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
runtime = "runc"
EOF

step() { printf '\n==> %s\n' "$*" >&2; }
fail() { echo "FAIL: $*" >&2; exit 1; }
pass() { echo "ok    $*"; }

# ---- base images ------------------------------------------------------------------------------

rust_image=docker.io/library/rust:1.95-bookworm
base_image=docker.io/library/debian:bookworm-slim
build_volumes=()
if ! timeout 30 podman pull -q "$base_image" >/dev/null 2>&1; then
  rust_image=localhost/weir-rust:bookworm
  base_image=localhost/weir-debian:bookworm
  path='PATH=/usr/local/rust/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
  if ! podman image exists "$base_image"; then
    step "Docker Hub unreachable: making $base_image with debootstrap"
    rm -rf "$cache/rootfs"
    debootstrap --variant=minbase bookworm "$cache/rootfs" http://deb.debian.org/debian >"$cache/debootstrap.log" 2>&1 ||
      fail "debootstrap (log: $cache/debootstrap.log)"
    tar -C "$cache/rootfs" -c . | podman import -q --change "ENV $path" - "$base_image" >/dev/null
  fi
  if ! podman image exists "$rust_image"; then
    toolchain=$(rustc --print sysroot)
    step "making $rust_image: $base_image + gcc + $(rustc --version)"
    rm -rf "$cache/rustfs"
    cp -a "$cache/rootfs" "$cache/rustfs"
    chroot "$cache/rustfs" sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gcc libc6-dev ca-certificates' \
      >"$cache/rustfs.log" 2>&1 || fail "gcc in $cache/rustfs (log: $cache/rustfs.log)"
    mkdir -p "$cache/rustfs/usr/local/rust"
    cp -a "$toolchain/bin" "$toolchain/lib" "$cache/rustfs/usr/local/rust/"
    tar -C "$cache/rustfs" -c . | podman import -q --change "ENV $path" - "$rust_image" >/dev/null
    rm -rf "$cache/rustfs"
  fi
  # This machine's crate downloads, so the build fetches only what it lacks from crates.io.
  [ -d "$HOME/.cargo/registry" ] && build_volumes=(-v "$HOME/.cargo/registry:/root/.cargo/registry")
fi

# ---- build ------------------------------------------------------------------------------------

if [ -z "${WEIR_IMAGE_SKIP_BUILD:-}" ]; then
  step "podman build $image (FROM $rust_image, $base_image)"
  started=$(date +%s)
  podman build -f Containerfile \
    --build-arg RUST_IMAGE="$rust_image" --build-arg BASE_IMAGE="$base_image" \
    --build-arg WEIR_GIT_COMMIT="$commit" --label org.opencontainers.image.revision="$commit" \
    "${build_volumes[@]}" -t "$image" .
  echo "built $image in $(($(date +%s) - started)) s, $(podman image inspect -f '{{.Size}}' "$image" | numfmt --to=iec)B"
fi
podman image exists "$image" || fail "no image $image"
# The image holds only what weir runs: at most 100 MB uncompressed.
size=$(podman image inspect -f '{{.Size}}' "$image")
((size <= 100 * 1000 * 1000)) || fail "$image is $(numfmt --to=si "$size")B, over 100 MB"
pass "image size $(numfmt --to=si "$size")B (at most 100 MB)"
# The commit `weir --version` must name: the one the image was built from.
built=$(podman image inspect -f '{{index .Labels "org.opencontainers.image.revision"}}' "$image")
[ -n "$built" ] && [ "$built" != "<no value>" ] && commit=$built

# ---- check ------------------------------------------------------------------------------------

step "checking $image as the DaemonSet runs it"
cargo build -q -p weir-fakeapi
fakeapi=target/debug/weir-fakeapi

tag="wimg$$"
ns="weir-image-$$"
work=$(mktemp -d)
fake_pid=""
cleanup() {
  podman rm -f -t 0 "$tag-agent" >/dev/null 2>&1 || true
  if [ -n "$fake_pid" ]; then kill "$fake_pid" 2>/dev/null || true; fi
  ip netns del "$ns" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# The node: one interface with the node's address, and the API server on its loopback.
ip netns add "$ns"
ip -n "$ns" link set lo up
ip -n "$ns" link add eth0 type veth peer name eth0p
ip -n "$ns" addr add 192.0.2.10/24 dev eth0
ip -n "$ns" link set eth0 up
ip -n "$ns" link set eth0p up

cat >"$work/objects.yaml" <<'EOF'
apiVersion: v1
kind: Node
metadata: {name: node-img}
spec: {podCIDR: 10.244.5.0/24, podCIDRs: [10.244.5.0/24]}
status:
  addresses: [{type: InternalIP, address: 192.0.2.10}]
---
apiVersion: v1
kind: Node
metadata: {name: node-other}
spec: {podCIDR: 10.244.6.0/24, podCIDRs: [10.244.6.0/24]}
status:
  addresses: [{type: InternalIP, address: 192.0.2.11}]
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  type: NodePort
  clusterIP: 10.96.7.7
  clusterIPs: [10.96.7.7]
  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30080, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: default
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
  - addresses: [10.244.6.9]
    conditions: {ready: true}
    nodeName: node-other
EOF
port=16443
ip netns exec "$ns" "$fakeapi" --listen "127.0.0.1:$port" "$work/objects.yaml" 2>"$work/fakeapi.log" &
fake_pid=$!
for _ in $(seq 50); do
  ip netns exec "$ns" curl -sf "http://127.0.0.1:$port/version" >/dev/null && break
  sleep 0.2
done
ip netns exec "$ns" curl -sf "http://127.0.0.1:$port/version" >/dev/null || fail "fake API server did not start: $(cat "$work/fakeapi.log")"

cat >"$work/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: fake, cluster: {server: "http://127.0.0.1:$port"}}]
users: [{name: weir, user: {token: "not-checked"}}]
contexts: [{name: fake, context: {cluster: fake, user: weir}}]
current-context: fake
EOF

# The manifests' pieces: ConfigMap data as files, each container's command, args and
# capabilities, with $(NODE_NAME) expanded as the kubelet does.
"$py" - "$work" <<'EOF'
import json, sys, yaml
work = sys.argv[1]
def docs(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]
for path, key, out in [("deploy/base/cni-config.yaml", "10-weir.conflist", "cni/10-weir.conflist"),
                       ("deploy/base/proxy-config.yaml", "config.yaml", "proxy/config.yaml")]:
    import os
    os.makedirs(os.path.join(work, os.path.dirname(out)), exist_ok=True)
    with open(os.path.join(work, out), "w") as f:
        f.write(docs(path)[0]["data"][key])
ds = docs("deploy/base/daemonset.yaml")[0]["spec"]["template"]["spec"]
for c in ds["initContainers"] + ds["containers"]:
    argv = c.get("command", []) + [a.replace("$(NODE_NAME)", "node-img") for a in c.get("args", [])]
    caps = c.get("securityContext", {}).get("capabilities", {}).get("add", [])
    with open(os.path.join(work, c["name"] + ".json"), "w") as f:
        json.dump({"argv": argv, "caps": caps}, f)
EOF
container_flags() { # NAME: --cap-drop=all plus the container's added capabilities
  echo "--cap-drop=all"
  jq -r '.caps[] | "--cap-add=" + .' "$work/$1.json"
}
argv() { jq -r '.argv[]' "$work/$1.json"; }

out=$(podman run --rm "$image" --version)
[[ $out == *"$commit"* ]] || fail "weir --version said '$out', not commit $commit"
pass "weir --version: $out"

out=$(podman run --rm -e CNI_COMMAND=VERSION --entrypoint weir-cni "$image" </dev/null)
echo "$out" | jq -e '.supportedVersions | index("1.1.0")' >/dev/null || fail "weir-cni VERSION: $out"
pass "weir-cni VERSION lists 1.1.0"

# install-cni: the init container, reading this Node's pod CIDR from the API.
mkdir -p "$work/host-bin" "$work/host-net" "$work/sa"
echo not-checked >"$work/sa/token"
: >"$work/sa/ca.crt"
mapfile -t install < <(argv install-cni)
mapfile -t flags < <(container_flags install-cni)
podman run --rm --network "ns:/run/netns/$ns" "${flags[@]}" \
  -e NODE_NAME=node-img -e WEIR_SA_DIR=/sa \
  -e "WEIR_NODE_URL=http://127.0.0.1:$port/api/v1/nodes?fieldSelector=metadata.name%3Dnode-img" \
  -v "$work/sa:/sa:ro" -v "$work/host-bin:/host/opt/cni/bin" -v "$work/host-net:/host/etc/cni/net.d" \
  -v "$work/cni:/etc/weir/cni:ro" --entrypoint "${install[0]}" "$image" "${install[@]:1}"
[ -x "$work/host-bin/weir-cni" ] || fail "install-cni did not install weir-cni"
jq -e '.plugins[0].ipam.ranges[0][0].subnet == "10.244.5.0/24"' "$work/host-net/10-weir.conflist" >/dev/null ||
  fail "install-cni wrote $(cat "$work/host-net/10-weir.conflist")"
CNI_COMMAND=VERSION "$work/host-bin/weir-cni" </dev/null | jq -e .cniVersion >/dev/null || fail "the installed weir-cni does not run here"
pass "install-cni: weir-cni installed, conflist with the Node's podCIDR 10.244.5.0/24"

# The node agent container (proxy, routes and NetworkPolicy), detached, with the DaemonSet's
# arguments.
mapfile -t agent < <(argv agent)
mapfile -t flags < <(container_flags agent)
podman run -d --name "$tag-agent" --network "ns:/run/netns/$ns" "${flags[@]}" -e NODE_NAME=node-img \
  -v "$work/proxy:/etc/weir/proxy:ro" -v "$work/kubeconfig:/etc/weir/kubeconfig:ro" --tmpfs /run/weir \
  --entrypoint "${agent[0]}" "$image" "${agent[@]:1}" --kubeconfig=/etc/weir/kubeconfig >/dev/null

ready=""
for _ in $(seq 100); do
  if ip netns exec "$ns" curl -sf http://127.0.0.1:10256/healthz >/dev/null; then ready=1; break; fi
  sleep 0.3
done
[ -n "$ready" ] || fail "agent /healthz never answered 200: $(ip netns exec "$ns" curl -s http://127.0.0.1:10256/healthz); its log: $(podman logs "$tag-agent" 2>&1 | tail -20)"
health=$(ip netns exec "$ns" curl -s http://127.0.0.1:10256/healthz)
jq -e '.parts | .proxy == "ok" and .routes == "ok" and .policy == "ok"' <<<"$health" >/dev/null ||
  fail "agent /healthz parts are not proxy, routes and policy all ok: $health"
pass "agent /healthz 200, parts $(jq -c .parts <<<"$health") (the readiness probe)"
ip netns exec "$ns" curl -sf http://127.0.0.1:10256/livez >/dev/null || fail "agent /livez"
pass "agent /livez 200 (liveness probe)"
rules=$(ip netns exec "$ns" nft list ruleset)
grep -q 10.96.7.7 <<<"$rules" || fail "no rule for ClusterIP 10.96.7.7"
grep -q 30080 <<<"$rules" || fail "no rule for NodePort 30080"
grep -q 10.244.6.9 <<<"$rules" || fail "no DNAT to endpoint 10.244.6.9"
pass "nftables: ClusterIP 10.96.7.7, NodePort 30080, endpoint 10.244.6.9"
metrics=$(ip netns exec "$ns" curl -sf http://127.0.0.1:10249/metrics)
grep -q '^weir_source_objects{kind="Service"} 1' <<<"$metrics" || fail "metrics: $(grep weir_source_objects <<<"$metrics")"
pass "metrics: weir_source_objects per kind"
grep -q '^weir_policy_syncs' <<<"$metrics" || fail "metrics: no weir_policy_* beside the proxy's"
pass "metrics: the policy part's beside the proxy's, one endpoint"
ip netns exec "$ns" nft list table inet weir-policy >/dev/null || fail "no table inet weir-policy"
pass "policy: table inet weir-policy"
podman logs "$tag-agent" >"$work/agent.log" 2>&1
first=$(head -1 "$work/agent.log")
jq -e .level <<<"$first" >/dev/null 2>&1 || fail "agent logs are not JSON lines: '$first'"
pass "agent logs: JSON lines (--log-format=json)"

route=""
for _ in $(seq 50); do
  route=$(ip -n "$ns" route show 10.244.6.0/24)
  [ -n "$route" ] && break
  sleep 0.2
done
[[ $route == *"via 192.0.2.11"* ]] || fail "routes: '10.244.6.0/24 via 192.0.2.11' missing ($route); log: $(podman logs "$tag-agent" 2>&1 | tail -5)"
pass "routes (host-gw): $route"
echo "image $image: all checks passed"
