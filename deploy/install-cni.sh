#!/bin/sh
# weir's CNI install step, the DaemonSet's init container (the image has it as
# /usr/local/bin/weir-install-cni): copies weir-cni into the host's CNI bin directory and writes
# the network configuration with this node's pod CIDR, each through a temporary file in the
# target directory and a rename, so that the container runtime never executes half a binary
# or reads half a configuration. A template that does not become valid JSON, or a node without
# a pod CIDR, changes nothing on the host.
#
# Environment (defaults are the DaemonSet's mounts):
#   NODE_NAME          this node (downward API spec.nodeName), required
#   POD_CIDR           the pod CIDR to use; unset: this Node's spec.podCIDR from the API
#   KUBERNETES_SERVICE_HOST, KUBERNETES_SERVICE_PORT   the API server (deploy/base/apiserver.yaml)
#   WEIR_NODE_URL      the API URL listing this Node (derived from the two above)
#   WEIR_SA_DIR        the service account's token and CA
#   WEIR_CNI_BINARY, CNI_BIN_DIR, CNI_CONF_TEMPLATE, CNI_NET_DIR, CNI_CONF_NAME
#   WEIR_POD_CIDR_WAIT seconds to wait for the controller manager to assign the pod CIDR
set -eu

: "${NODE_NAME:?NODE_NAME (from the downward API: spec.nodeName) is required}"
: "${WEIR_CNI_BINARY:=/usr/local/bin/weir-cni}"
: "${CNI_BIN_DIR:=/host/opt/cni/bin}"
: "${CNI_CONF_TEMPLATE:=/etc/weir/cni/10-weir.conflist}"
: "${CNI_NET_DIR:=/host/etc/cni/net.d}"
: "${CNI_CONF_NAME:=10-weir.conflist}"
: "${WEIR_SA_DIR:=/var/run/secrets/kubernetes.io/serviceaccount}"
: "${WEIR_POD_CIDR_WAIT:=300}"

say() { echo "weir-install-cni: $*" >&2; }
fail() { say "$*"; exit 1; }

# This Node's spec.podCIDR, by a list filtered on its name (the ClusterRole grants list, not get).
node_pod_cidr() {
  if [ -z "${WEIR_NODE_URL:-}" ]; then
    case "${KUBERNETES_SERVICE_HOST:-}" in
      "" | REPLACE-WITH-*)
        fail "KUBERNETES_SERVICE_HOST is not set: put the API server's address in the weir-apiserver ConfigMap (deploy/base/apiserver.yaml)" ;;
    esac
    WEIR_NODE_URL="https://${KUBERNETES_SERVICE_HOST}:${KUBERNETES_SERVICE_PORT:-443}/api/v1/nodes?fieldSelector=metadata.name%3D${NODE_NAME}"
  fi
  curl -sS --fail --max-time 10 --cacert "$WEIR_SA_DIR/ca.crt" \
    -H "Authorization: Bearer $(cat "$WEIR_SA_DIR/token")" "$WEIR_NODE_URL" |
    jq -r '.items[0].spec.podCIDR // empty'
}

if [ -z "${POD_CIDR:-}" ]; then
  waited=0
  while :; do
    POD_CIDR=$(node_pod_cidr) || POD_CIDR=""
    [ -n "$POD_CIDR" ] && break
    [ "$waited" -ge "$WEIR_POD_CIDR_WAIT" ] &&
      fail "node $NODE_NAME has no spec.podCIDR after ${waited}s (is kube-controller-manager run with --allocate-node-cidrs?)"
    say "node $NODE_NAME: no pod CIDR yet, retrying"
    sleep 2
    waited=$((waited + 2))
  done
fi
case "$POD_CIDR" in
  *[!0-9a-fA-F.:/]* | "") fail "pod CIDR $POD_CIDR is not a CIDR" ;;
esac

[ -x "$WEIR_CNI_BINARY" ] || fail "$WEIR_CNI_BINARY is missing"
[ -r "$CNI_CONF_TEMPLATE" ] || fail "$CNI_CONF_TEMPLATE is missing"
mkdir -p "$CNI_BIN_DIR" "$CNI_NET_DIR"

# The configuration first, in full, before anything on the host changes. The temporary name
# ends in .tmp: runtimes read only *.conf, *.conflist and *.json.
conf_tmp="$CNI_NET_DIR/.$CNI_CONF_NAME.$$.tmp"
bin_tmp="$CNI_BIN_DIR/.weir-cni.$$.tmp"
trap 'rm -f "$conf_tmp" "$bin_tmp"' EXIT
sed "s|__POD_CIDR__|$POD_CIDR|g" "$CNI_CONF_TEMPLATE" >"$conf_tmp"
jq -e '.plugins | length > 0' "$conf_tmp" >/dev/null ||
  fail "$CNI_CONF_TEMPLATE is not a conflist (JSON with a non-empty \"plugins\") once filled in; nothing changed"
grep -q __POD_CIDR__ "$conf_tmp" && fail "placeholder left in $CNI_CONF_TEMPLATE"

# The plugin before the configuration that names it.
cp "$WEIR_CNI_BINARY" "$bin_tmp"
chmod 0755 "$bin_tmp"
mv -f "$bin_tmp" "$CNI_BIN_DIR/weir-cni"
chmod 0644 "$conf_tmp"
mv -f "$conf_tmp" "$CNI_NET_DIR/$CNI_CONF_NAME"
say "installed $CNI_BIN_DIR/weir-cni and $CNI_NET_DIR/$CNI_CONF_NAME (pod CIDR $POD_CIDR)"

# The runtime uses the first configuration in name order: say if another one comes first.
for f in "$CNI_NET_DIR"/*.conf "$CNI_NET_DIR"/*.conflist "$CNI_NET_DIR"/*.json; do
  [ -e "$f" ] || continue
  name=${f##*/}
  if [ "$name" != "$CNI_CONF_NAME" ] && [ "$(printf '%s\n%s\n' "$name" "$CNI_CONF_NAME" | LC_ALL=C sort | head -n1)" = "$name" ]; then
    say "warning: $f sorts before $CNI_CONF_NAME, so the runtime uses it instead of weir's; remove it"
  fi
done
