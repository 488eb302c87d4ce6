#!/usr/bin/env bash
# A real two-node Kubernetes cluster with weir as its networking, in network namespaces on this
# machine (nothing can leave it: no namespace has a default route). The version is the build's:
# the current one scripts/cluster/kube/ pins (default), or 1.20 (scripts/cluster/build-kube.sh).
#
#   <name>-cp   control plane: etcd, kube-apiserver, controller-manager, scheduler; the underlay
#               bridge (the nodes' "switch") and the outside client of NodePort checks
#   <name>-n1   node-1: containerd (CRI) + kubelet calling weir-cni; weir proxy, weir routes
#   <name>-n2   node-2    (host-gw), weir dns (serving the kubelets' clusterDNS behind kube-dns)
#
# Usage: up.sh NAME RUN_DIR   (as root; NAME: at most 8 letters/digits, unique per cluster)
# Env: KUBE_BUILD (a build's OUT: default /opt/weir-tools/kube-<version go.mod pins>; a 1.20
#      build is recognised by having no VERSION file), WEIR_BIN (the directory holding weir and
#      weir-cni, default target/debug), WEIR_PROXY_MODE (nftables, iptables, ipvs, userspace:
#      weir proxy's mode; kube-proxy or kube-proxy-iptables, kube-proxy-nftables: upstream
#      kube-proxy of the build's version instead; 1.20's has no nftables mode), or
#      WEIR_PROXY_MODES: one per node ("kube-proxy nftables": the two side by side, as the API
#      benchmark runs them). WEIR_E2E_IMAGES: a directory of image tarballs (e2e-images.sh)
#      imported into every node's containerd beside pause and busybox. WEIR_POLICY: who enforces
#      NetworkPolicy on the nodes: weir (`weir policy`, the default; 1 says the same), 0 (nobody),
#      or kube-network-policies (SIG Network's reference, built by netpol-ref/build.sh into
#      NETPOL_REF_BUILD, default /opt/weir-tools/netpol-ref-<version its go.mod pins>); or
#      WEIR_POLICIES: one per node ("weir kube-network-policies": side by side, as the policy
#      benchmark runs them). WEIR_AGENTS=daemonset: weir-cni, its
#      conflist, the proxy, routes and policy come from deploy/'s DaemonSet instead (daemonset.sh
#      applies it), with WEIR_IMAGE_TAR imported into each node's containerd; weir dns still
#      runs on each node.
#      WEIR_CNI=reference: the reference bridge + host-local plugins (Debian's
#      containernetworking-plugins) as the nodes' CNI instead of weir-cni, weir as service
#      proxy, routes, DNS and policy beside it (the proxy-only install's shape). With
#      WEIR_AGENTS=daemonset too: the proxy comes from deploy/proxy-only's DaemonSet alone, and
#      the pod CIDRs' routes between the nodes are static (what the underlay's router or another
#      plugin would provide), so weir runs nothing on the nodes but that and weir dns.
#      WEIR_AUDIT_POLICY: an audit policy file; the apiserver then writes
#      its audit log (JSON lines) to RUN_DIR/audit.log (agent-compare.sh counts watches with it).
# RUN_DIR/env afterwards holds the facts a checker needs (shell syntax); down.sh RUN_DIR stops
# everything by PID and deletes the namespaces, even after a failed up.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
NAME=${1:?usage: up.sh NAME RUN_DIR}
R=${2:?usage: up.sh NAME RUN_DIR}
[[ $NAME =~ ^[a-z0-9]{1,8}$ ]] || { echo "up.sh: NAME must be 1-8 lowercase letters/digits" >&2; exit 2; }
KB=${KUBE_BUILD:-/opt/weir-tools/kube-$(bash "$HERE/kube/version.sh")}
BIN=$KB/bin
# 1.20 (Debian's source build) or the current version (Go modules, with its own etcd and
# containerd 2: a kubelet of 1.36+ refuses containerd 1.x)
if [ -f "$KB/VERSION" ]; then KUBE_VERSION=$(cat "$KB/VERSION"); LEGACY=""; else KUBE_VERSION=v1.20.2; LEGACY=1; fi
WEIR_BIN=${WEIR_BIN:-$ROOT/target/debug}
MODE=${WEIR_PROXY_MODE:-nftables}
read -r -a MODES <<<"${WEIR_PROXY_MODES:-$MODE $MODE}"
AGENTS=${WEIR_AGENTS:-processes}
# Only `reference` chooses: the lab reads WEIR_CNI as weir-cni's path, which means weir here.
CNI=weir; [ "${WEIR_CNI:-}" != reference ] || CNI=reference
policy=${WEIR_POLICY:-weir}
case $policy in 1) policy=weir ;; 0) policy=none ;; esac
read -r -a POLICIES <<<"${WEIR_POLICIES:-$policy $policy}"
NETPOL_REF=${NETPOL_REF_BUILD:-/opt/weir-tools/netpol-ref-$(awk '{ for (i = 1; i < NF; i++) if ($i == "sigs.k8s.io/kube-network-policies") { print $(i + 1); exit } }' "$HERE/netpol-ref/go.mod")}
for p in "${POLICIES[@]}"; do
  case $p in
    weir | none) ;;
    kube-network-policies)
      [ -x "$NETPOL_REF/bin/kube-network-policies" ] ||
        { echo "up.sh: no $NETPOL_REF/bin/kube-network-policies: run scripts/cluster/netpol-ref/build.sh $NETPOL_REF" >&2; exit 2; } ;;
    *) echo "up.sh: WEIR_POLICY: weir, 0 or kube-network-policies, not $p" >&2; exit 2 ;;
  esac
done
for b in kube-apiserver kubelet kube-controller-manager kube-scheduler kubectl; do
  [ -x "$BIN/$b" ] || { echo "up.sh: no $BIN/$b: run scripts/cluster/build-kube.sh $KB" >&2; exit 2; }
done
for b in weir weir-cni; do
  [ -x "$WEIR_BIN/$b" ] || { echo "up.sh: no $WEIR_BIN/$b: cargo build first" >&2; exit 2; }
done
[ -n "$LEGACY" ] || export PATH=$BIN:$PATH # etcd, containerd, its shim and ctr of the build
for c in etcd containerd runc ctr openssl gcc busybox; do
  command -v $c >/dev/null || { echo "up.sh: $c is missing (scripts/cluster/build-kube.sh installs it)" >&2; exit 2; }
done
mkdir -p "$R"
R=$(cd "$R" && pwd)
export PATH=$BIN:$PATH
CP=$NAME-cp
CP_IP=10.77.0.1
NODES=(node-1 node-2)
NODE_IPS=(10.77.0.11 10.77.0.12)
POD_CIDRS=(10.244.1.0/24 10.244.2.0/24)
cat >"$R/env" <<EOF
NAME=$NAME
RUN=$R
CP_NS=$CP
CP_IP=$CP_IP
NODES="${NODES[*]}"
NODE_NS="$NAME-n1 $NAME-n2"
NODE_IPS="${NODE_IPS[*]}"
POD_CIDRS="${POD_CIDRS[*]}"
KUBECONFIG=$R/kubeconfig
KUBECTL=$R/kubectl
KUBE_PROXY=$BIN/kube-proxy
KUBE_VERSION=$KUBE_VERSION
PROXY_MODES="${MODES[*]}"
POLICIES="${POLICIES[*]}"
AGENTS=$AGENTS
CNI=$CNI
EOF
# kubectl of the server's version, run where the apiserver is reachable: the control plane's namespace
cat >"$R/kubectl" <<EOF
#!/bin/sh
exec nsenter --net=/run/netns/$CP env KUBECONFIG=$R/kubeconfig $BIN/kubectl "\$@"
EOF
chmod +x "$R/kubectl"
kubectl() { "$R/kubectl" "$@"; }
step() { printf '[%s] %s\n' "$(date +%T)" "$*" >&2; }
# Start a process in a namespace with its log, PID file and command line under RUN_DIR
# (down.sh stops them; ctl.sh stops and starts one again).
bg() { local ns=$1 name=$2; shift 2
  printf '%s\n' "$ns" "$@" >"$R/$name.cmd"
  bash "$HERE/ctl.sh" "$R" start "$name"; }
wait_for() { local what=$1 tries=$2; shift 2
  for _ in $(seq 1 "$tries"); do "$@" >/dev/null 2>"$R/wait.err" && return 0; sleep 0.5; done
  echo "up.sh: timed out waiting for $what; the last try said:" >&2; tail -5 "$R/wait.err" >&2; return 1; }

step "namespaces and the underlay ($CP_IP/24 on a bridge in $CP)"
ip netns add "$CP"
ip -n "$CP" link set lo up
ip -n "$CP" link add br0 type bridge
ip -n "$CP" addr add $CP_IP/24 dev br0
ip -n "$CP" link set br0 up
for i in 0 1; do
  ns=$NAME-n$((i + 1))
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  ip link add "$NAME-e$i" type veth peer name eth0 netns "$ns"
  ip link set "$NAME-e$i" netns "$CP"
  ip -n "$CP" link set "$NAME-e$i" master br0 up
  ip -n "$ns" addr add "${NODE_IPS[$i]}/24" dev eth0
  ip -n "$ns" link set eth0 up
  # Service traffic the node sends itself needs a route before the OUTPUT DNAT (no default
  # route here: a real node's default route covers it).
  ip -n "$ns" route add 10.96.0.0/16 dev eth0
  # The underlay router of a real network knows the pod CIDRs (a VPC's route table): the
  # control plane reaches pods (webhooks, the apiserver's ClusterIP replies).
  ip -n "$CP" route add "${POD_CIDRS[$i]}" via "${NODE_IPS[$i]}"
done
if [ "$AGENTS" = daemonset ] && [ "$CNI" = reference ]; then
  # Nothing of weir routes the other node's pods here (the bridge plugin makes no routes): the
  # nodes get them as from the underlay's router or another plugin.
  ip -n "$NAME-n1" route add "${POD_CIDRS[1]}" via "${NODE_IPS[1]}"
  ip -n "$NAME-n2" route add "${POD_CIDRS[0]}" via "${NODE_IPS[0]}"
fi

step "PKI and kubeconfig (apiserver at https://$CP_IP:16443)"
P=$R/pki; mkdir -p "$P"
ossl() { openssl "$@" 2>/dev/null; }
ossl req -x509 -newkey rsa:2048 -nodes -days 30 -keyout "$P/ca.key" -out "$P/ca.crt" -subj "/CN=weir-cluster-ca"
ossl req -newkey rsa:2048 -nodes -keyout "$P/apiserver.key" -out "$P/apiserver.csr" -subj "/CN=kube-apiserver"
printf "subjectAltName=IP:127.0.0.1,IP:%s,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\nextendedKeyUsage=serverAuth\n" "$CP_IP" >"$P/srv.cnf"
ossl x509 -req -in "$P/apiserver.csr" -CA "$P/ca.crt" -CAkey "$P/ca.key" -CAcreateserial -days 30 -extfile "$P/srv.cnf" -out "$P/apiserver.crt"
ossl req -newkey rsa:2048 -nodes -keyout "$P/kubelet-client.key" -out "$P/kubelet-client.csr" -subj "/O=system:masters/CN=kube-apiserver-kubelet-client"
printf "extendedKeyUsage=clientAuth\n" >"$P/cli.cnf"
ossl x509 -req -in "$P/kubelet-client.csr" -CA "$P/ca.crt" -CAkey "$P/ca.key" -CAcreateserial -days 30 -extfile "$P/cli.cnf" -out "$P/kubelet-client.crt"
ossl genrsa -out "$P/sa.key" 2048
ossl rsa -in "$P/sa.key" -pubout -out "$P/sa.pub"
TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
echo "$TOKEN,admin,uid-admin,system:masters" >"$R/tokens.csv"
cat >"$R/kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: weir
  cluster: {server: "https://$CP_IP:16443", certificate-authority: "$P/ca.crt"}
users:
- name: admin
  user: {token: $TOKEN}
contexts:
- name: weir
  context: {cluster: weir, user: admin}
current-context: weir
KC

step "etcd and kube-apiserver in $CP"
bg "$CP" etcd etcd --name weir --data-dir "$R/etcd-data" \
  --listen-client-urls http://127.0.0.1:23790 --advertise-client-urls http://127.0.0.1:23790 \
  --listen-peer-urls http://127.0.0.1:23800 --initial-advertise-peer-urls http://127.0.0.1:23800 \
  --initial-cluster weir=http://127.0.0.1:23800 --listen-metrics-urls http://127.0.0.1:23810
# The apiserver's flags (bg saves the whole command line for ctl.sh, which restarts it).
cat >"$R/apiserver.args" <<EOF
--etcd-servers=http://127.0.0.1:23790
--bind-address=0.0.0.0
--advertise-address=$CP_IP
--secure-port=16443
--tls-cert-file=$P/apiserver.crt
--tls-private-key-file=$P/apiserver.key
--client-ca-file=$P/ca.crt
--token-auth-file=$R/tokens.csv
--authorization-mode=Node,RBAC
--service-account-issuer=https://kubernetes.default.svc.cluster.local
--service-account-key-file=$P/sa.pub
--service-account-signing-key-file=$P/sa.key
--api-audiences=https://kubernetes.default.svc.cluster.local
--service-cluster-ip-range=10.96.0.0/16
--service-node-port-range=30000-32767
--allow-privileged=true
--profiling=false
--kubelet-preferred-address-types=InternalIP
--kubelet-client-certificate=$P/kubelet-client.crt
--kubelet-client-key=$P/kubelet-client.key
--cert-dir=$R/apiserver-certs
EOF
[ -z "$LEGACY" ] || echo "--insecure-port=0" >>"$R/apiserver.args"
if [ -n "${WEIR_AUDIT_POLICY:-}" ]; then
  printf '%s\n' "--audit-policy-file=$WEIR_AUDIT_POLICY" "--audit-log-path=$R/audit.log" \
    --audit-log-format=json --audit-log-maxsize=0 >>"$R/apiserver.args"
fi
# shellcheck disable=SC2046
bg "$CP" kube-apiserver "$BIN/kube-apiserver" $(cat "$R/apiserver.args")
wait_for "the apiserver" 120 kubectl get --raw /readyz
# 1.20's flags that later versions removed: --port (insecure serving), --pod-eviction-timeout
legacy_kcm=(); legacy_sched=()
[ -z "$LEGACY" ] || { legacy_kcm=(--port=0 --pod-eviction-timeout=30s); legacy_sched=(--port=0); }
bg "$CP" kube-controller-manager "$BIN/kube-controller-manager" --kubeconfig="$R/kubeconfig" \
  --bind-address=127.0.0.1 --secure-port=10257 --leader-elect=false \
  --service-account-private-key-file="$P/sa.key" --root-ca-file="$P/ca.crt" --use-service-account-credentials=false \
  --cluster-cidr=10.244.0.0/16 --allocate-node-cidrs=false --cert-dir="$R/kcm-certs" \
  --node-monitor-grace-period=20s "${legacy_kcm[@]}"
bg "$CP" kube-scheduler "$BIN/kube-scheduler" --kubeconfig="$R/kubeconfig" \
  --bind-address=127.0.0.1 --secure-port=10259 --leader-elect=false --cert-dir="$R/sched-certs" "${legacy_sched[@]}"

step "local images (nothing is pulled): pause from the Kubernetes source, busybox"
mkdir -p "$R/images"
gcc -Os -static -DVERSION=3.4.1-weir -o "$R/images/pause" "$KB/pause.c" && strip "$R/images/pause"
python3 "$HERE/mkimage.py" "$R/images/pause.tar" localhost/weir/pause:3.4.1 '["/pause"]' pause="$R/images/pause" >/dev/null
python3 "$HERE/mkimage.py" "$R/images/busybox.tar" localhost/weir/busybox:1.35 '["/bin/sh"]' \
  bin/busybox=/bin/busybox bin/sh=@busybox >/dev/null

# containerd's configuration: version 2 for Debian's containerd 1.6 (1.20), version 3 for
# containerd 2. Everything under the node's directory (two containerds share this machine).
containerd_config_v2() { local n=$1 cb=$2
  cat <<CT
version = 2
root = "$n/containerd/root"
state = "$n/containerd/state"
[grpc]
  address = "$n/containerd/containerd.sock"
[ttrpc]
  address = "$n/containerd/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "$n/containerd/opt"
  [plugins."io.containerd.grpc.v1.cri"]
    restrict_oom_score_adj = true
    sandbox_image = "localhost/weir/pause:3.4.1"
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "$cb"
      conf_dir = "$n/cni/net.d"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = false
          Root = "$n/runc"
CT
}
containerd_config_v3() { local n=$1 cb=$2
  cat <<CT
version = 3
root = "$n/containerd/root"
state = "$n/containerd/state"
[grpc]
  address = "$n/containerd/containerd.sock"
[ttrpc]
  address = "$n/containerd/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins]
  [plugins.'io.containerd.internal.v1.opt']
    path = "$n/containerd/opt"
  # NRI's socket is host-wide (/var/run/nri): the second node's containerd would take the first's
  [plugins.'io.containerd.nri.v1.nri']
    disable = true
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = "overlayfs"
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = "localhost/weir/pause:3.4.1"
  [plugins.'io.containerd.cri.v1.runtime']
    restrict_oom_score_adj = true
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ["$cb"]
      conf_dir = "$n/cni/net.d"
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = "runc"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          SystemdCgroup = false
          Root = "$n/runc"
  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
CT
}

# weir-cni and the reference plugins containerd's CRI also calls (loopback; portmap chained)
mkdir -p "$R/cni-bin"
ln -sf "$WEIR_BIN/weir-cni" "$R/cni-bin/weir-cni"
for p in loopback portmap; do ln -sf "/usr/lib/cni/$p" "$R/cni-bin/$p"; done

for i in 0 1; do
  node=${NODES[$i]} ns=$NAME-n$((i + 1)) ip=${NODE_IPS[$i]} cidr=${POD_CIDRS[$i]}
  N=$R/$node; mkdir -p "$N/cni/net.d" "$N/kubelet" "$N/containerd" "$N/cni-bin"
  step "$node ($ns, $ip, pods $cidr): containerd, kubelet"
  cni_bin=$R/cni-bin
  if [ "$AGENTS" = daemonset ]; then
    # the DaemonSet's install-cni writes weir-cni and the conflist here; the rest are Debian's
    cni_bin=$N/cni-bin
    for p in loopback portmap; do ln -sf "/usr/lib/cni/$p" "$cni_bin/$p"; done
  fi
  if [ "$CNI" = reference ]; then
    # Another CNI plugin, weir only as service proxy (and, as processes, routes and policy):
    # the reference bridge + host-local, Debian's containernetworking-plugins.
    for p in bridge host-local; do ln -sf "/usr/lib/cni/$p" "$cni_bin/$p"; done
    cat >"$N/cni/net.d/10-bridge.conflist" <<CN
{"cniVersion": "1.0.0", "name": "reference", "plugins": [
  {"type": "bridge", "bridge": "cni0", "mtu": 1500, "isGateway": true, "isDefaultGateway": true,
   "ipMasq": true, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$cidr"}]],
            "dataDir": "$N/cni/networks"}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
CN
  elif [ "$AGENTS" != daemonset ]; then
  cat >"$N/cni/net.d/10-weir.conflist" <<CN
{"cniVersion": "1.0.0", "name": "weir", "plugins": [
  {"type": "weir-cni", "mode": "bridge", "bridge": "cni0", "mtu": 1500, "isGateway": true,
   "ipMasq": true, "hairpinMode": true, "clusterCIDR": "10.244.0.0/16",
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$cidr"}]], "routes": [{"dst": "0.0.0.0/0"}],
            "dataDir": "$N/cni/networks"}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
CN
  fi
  if [ -n "$LEGACY" ]; then containerd_config_v2 "$N" "$cni_bin"; else containerd_config_v3 "$N" "$cni_bin"; fi >"$N/containerd/config.toml"
  bg "$ns" "$node-containerd" containerd --config "$N/containerd/config.toml"
  A=$N/containerd/containerd.sock
  wait_for "$node's containerd" 60 ctr -a "$A" version
  ctr -a "$A" -n k8s.io images import "$R/images/pause.tar" >/dev/null
  ctr -a "$A" -n k8s.io images import "$R/images/busybox.tar" >/dev/null
  if [ -n "${WEIR_IMAGE_TAR:-}" ]; then
    ctr -a "$A" -n k8s.io images import "$WEIR_IMAGE_TAR" >/dev/null
  fi
  for t in "${WEIR_E2E_IMAGES:-/nonexistent}"/*.tar; do
    [ ! -f "$t" ] || ctr -a "$A" -n k8s.io images import "$t" >/dev/null
  done
  cat >"$N/kubelet/config.yaml" <<KL
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $ip
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication: {anonymous: {enabled: false}, webhook: {enabled: false}, x509: {clientCAFile: $P/ca.crt}}
authorization: {mode: AlwaysAllow}
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
makeIPTablesUtilChains: false
clusterDNS: ["10.96.0.10"]
clusterDomain: cluster.local
resolvConf: /dev/null
# No disk-based eviction: a test machine's disk may be 99% full, and the kubelet
# would then taint the node disk-pressure and schedule nothing ("0%" = no threshold).
evictionHard: {"memory.available": "100Mi", "nodefs.available": "0%", "imagefs.available": "0%", "nodefs.inodesFree": "0%", "imagefs.inodesFree": "0%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
nodeStatusUpdateFrequency: 4s
KL
  if [ -z "$LEGACY" ]; then
    # This machine mounts cgroup v1, which kubelets of 1.35+ refuse unless told otherwise.
    printf 'failCgroupV1: false\ncontainerRuntimeEndpoint: unix://%s\n' "$A" >>"$N/kubelet/config.yaml"
  fi
  cat >"$N/kubelet.args" <<EOF
--config=$N/kubelet/config.yaml
--kubeconfig=$R/kubeconfig
--root-dir=$N/kubelet/root
--cert-dir=$N/kubelet/pki
--hostname-override=$node
--node-ip=$ip
EOF
  [ -z "$LEGACY" ] || printf '%s\n' --container-runtime=remote "--container-runtime-endpoint=unix://$A" >>"$N/kubelet.args"
  # AWS_EC2_METADATA_DISABLED: the in-tree credential provider would probe the metadata address
  # shellcheck disable=SC2046
  bg "$ns" "$node-kubelet" env AWS_EC2_METADATA_DISABLED=true "$BIN/kubelet" $(cat "$N/kubelet.args")
done
for i in 0 1; do
  node=${NODES[$i]}
  wait_for "Node $node" 120 kubectl get node "$node"
  # The pod CIDR weir-cni's conflist uses; weir routes reads it from the Node (no allocation
  # by the controller-manager: its order of registration would pick which node gets which).
  kubectl patch node "$node" -p "{\"spec\":{\"podCIDR\":\"${POD_CIDRS[$i]}\",\"podCIDRs\":[\"${POD_CIDRS[$i]}\"]}}" >/dev/null
done

# weir dns with the settings deploy/dns's ConfigMap gives the cluster DNS (its DnsConfiguration:
# zone, TTL, pod records, cache; names outside the zone to the node's resolv.conf, as there);
# the flags given beside it (listen, health) win
dns_settings() {
  python3 - "$ROOT/deploy/dns/config.yaml" "$R/dns.yaml" <<'PY'
import sys, yaml
with open(sys.argv[2], "w") as f:
    f.write(yaml.safe_load(open(sys.argv[1]))["data"]["dns.yaml"])
print(f"--config={sys.argv[2]}")
PY
}
# kube-network-policies reads its API server the in-cluster way only (rest.InClusterConfig:
# KUBERNETES_SERVICE_HOST/PORT and the service account's files at their fixed path). It gets
# them in a mount namespace of its own: a tmpfs on /run (/var/run) holding this cluster's CA
# and admin token, so nothing on the host changes. Metrics on 127.0.0.1:9080; the DNS
# workaround for kernels before 6.12 is off (this kernel has the fix).
start_netpol_ref() { local ns=$1 node=$2 sa=$R/$2/netpol-sa
  mkdir -p "$sa"
  cp "$P/ca.crt" "$sa/ca.crt"
  printf '%s' "$TOKEN" >"$sa/token"
  local d=/run/secrets/kubernetes.io/serviceaccount
  bg "$ns" "$node-netpol" unshare --mount --propagation private sh -c "mount -t tmpfs tmpfs /run && mkdir -p $d && cp $sa/ca.crt $sa/token $d/ && exec env KUBERNETES_SERVICE_HOST=$CP_IP KUBERNETES_SERVICE_PORT=16443 $NETPOL_REF/bin/kube-network-policies --hostname-override=$node --metrics-bind-address=127.0.0.1:9080 --netfilter-bug-1766-fix=false"
}
step "weir on each node: proxy (${MODES[*]}), routes (host-gw), dns; policy: ${POLICIES[*]}"
for i in 0 1; do
  node=${NODES[$i]} ns=$NAME-n$((i + 1)) ip=${NODE_IPS[$i]}
  N=$R/$node
  cat >"$N/proxy.args" <<EOF
proxy
--kubeconfig=$R/kubeconfig
--hostname-override=$node
--proxy-mode=${MODES[$i]}
--cluster-cidr=10.244.0.0/16
--state-dir=$N/weir-proxy
--healthz-bind-address=127.0.0.1:10256
--metrics-bind-address=127.0.0.1:10249
EOF
  # Real kube-proxy of the build's version on the same node, for parity and benchmarks, in
  # each of its modes (processes <node>-kube-proxy-iptables and -nftables: started instead of
  # weir proxy when WEIR_PROXY_MODE=kube-proxy[-MODE]; ctl.sh starts one otherwise). It
  # touches no host-wide sysctl: conntrack limits and timeouts are left alone.
  for m in iptables nftables; do
    printf '%s\n' "$ns" "$BIN/kube-proxy" --kubeconfig="$R/kubeconfig" --hostname-override="$node" \
      --proxy-mode=$m --cluster-cidr=10.244.0.0/16 --conntrack-max-per-core=0 \
      --conntrack-tcp-timeout-established=0 --conntrack-tcp-timeout-close-wait=0 \
      --healthz-bind-address=127.0.0.1:10256 --metrics-bind-address=127.0.0.1:10249 >"$R/$node-kube-proxy-$m.cmd"
  done
  if [ "$AGENTS" = daemonset ]; then
    : # deploy/'s DaemonSet runs weir agent (proxy, routes, policy)
  elif [[ ${MODES[$i]} == kube-proxy* ]]; then
    m=${MODES[$i]#kube-proxy}; m=${m#-}
    bash "$HERE/ctl.sh" "$R" start "$node-kube-proxy-${m:-iptables}"
  else
    # shellcheck disable=SC2046
    bg "$ns" "$node-proxy" env RUST_LOG=info "$WEIR_BIN/weir" $(cat "$N/proxy.args")
  fi
  [ "$AGENTS" = daemonset ] || bg "$ns" "$node-routes" env RUST_LOG=info "$WEIR_BIN/weir" routes --kubeconfig="$R/kubeconfig" \
    --node-name="$node" --backend=host-gw --mtu-file="$N/routes-mtu" --metrics-bind-address=127.0.0.1:10263
  # shellcheck disable=SC2046
  bg "$ns" "$node-dns" env RUST_LOG=info "$WEIR_BIN/weir" dns --kubeconfig="$R/kubeconfig" \
    --listen="$ip:53" --healthz-bind-address=127.0.0.1:8081 $(dns_settings)
  # NetworkPolicy for the node's pods (WEIR_POLICY=0 leaves it out, as the proxy benchmark
  # does; deploy/'s DaemonSet runs its own)
  if [ "$AGENTS" = daemonset ] || [ "${POLICIES[$i]}" = none ]; then
    :
  elif [ "${POLICIES[$i]}" = weir ]; then
    bg "$ns" "$node-policy" env RUST_LOG=info "$WEIR_BIN/weir" policy --kubeconfig="$R/kubeconfig" \
      --node-name="$node" --healthz-bind-address=127.0.0.1:10258 --metrics-bind-address=127.0.0.1:10258
  else
    start_netpol_ref "$ns" "$node"
  fi
done

step "kube-dns: the kubelets' clusterDNS 10.96.0.10, served by weir dns on every node"
# v1 came with 1.21, and with it nodeName in place of v1beta1's topology map
SLICE_VERSION=v1; [ -z "$LEGACY" ] || SLICE_VERSION=v1beta1
slice_node() { if [ -n "$LEGACY" ]; then echo "topology: {kubernetes.io/hostname: $1}"; else echo "nodeName: $1"; fi; }
kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: dns, port: 53, protocol: UDP}, {name: dns-tcp, port: 53, protocol: TCP}]
---
apiVersion: discovery.k8s.io/$SLICE_VERSION
kind: EndpointSlice
metadata:
  name: kube-dns-nodes
  namespace: kube-system
  labels: {kubernetes.io/service-name: kube-dns, endpointslice.kubernetes.io/managed-by: weir-cluster-script}
addressType: IPv4
endpoints:
- addresses: ["${NODE_IPS[0]}"]
  conditions: {ready: true}
  $(slice_node "${NODES[0]}")
- addresses: ["${NODE_IPS[1]}"]
  conditions: {ready: true}
  $(slice_node "${NODES[1]}")
ports: [{name: dns, port: 53, protocol: UDP}, {name: dns-tcp, port: 53, protocol: TCP}]
EOF
if [ "$AGENTS" = daemonset ]; then
  if [ "$CNI" = reference ]; then step "up, waiting for weir's proxy-only DaemonSet"
  else step "up, waiting for weir's DaemonSet (a node is NotReady until install-cni writes the conflist)"; fi
  exit 0
fi
for node in "${NODES[@]}"; do
  wait_for "Node $node Ready" 120 sh -c "'$R/kubectl' get node $node | grep -q ' Ready'"
done
for i in 0 1; do
  ns=$NAME-n$((i + 1))
  wait_for "weir proxy ready on ${NODES[$i]}" 120 nsenter --net="/run/netns/$ns" curl -sf http://127.0.0.1:10256/healthz
  wait_for "weir dns ready on ${NODES[$i]}" 120 nsenter --net="/run/netns/$ns" curl -sf http://127.0.0.1:8081/healthz
  case ${POLICIES[$i]} in
    weir) wait_for "weir policy ready on ${NODES[$i]}" 120 nsenter --net="/run/netns/$ns" curl -sf http://127.0.0.1:10258/healthz ;;
    # its table is written once its informers have synced
    kube-network-policies) wait_for "kube-network-policies' table on ${NODES[$i]}" 120 ip netns exec "$ns" nft list table inet kube-network-policies ;;
  esac
done
kubectl get nodes -o wide >&2
step "up: KUBECONFIG=$R/kubeconfig ($BIN/kubectl)"
