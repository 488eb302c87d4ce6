#!/bin/sh
# Captures crates/netdiag/tests/data/ipvs-node: a node namespace running `weir proxy --proxy-mode
# ipvs` (the same services as crates/weir/tests/proxy_ipvs_vm.rs), collected with `weir trace
# collect` plus `ipvsadm -Sn` and `ipset save`. Run in the VM (the host kernel has no IPVS):
#   bash scripts/dev.sh vm -- 'sh crates/netdiag/tests/data/ipvs-node/capture.sh /tmp/out'
# (the VM's writes do not reach the host, so the directory is printed as a base64 tar:
#   ... | sed -n '/^BEGIN-TAR$/,/^END-TAR$/p' | sed '1d;$d' | base64 -d | tar -xz -C <here>). Topology:
#   client ns 10.0.0.2 -- 10.0.0.1 (veth) node ns 10.244.1.1 -- pod 10.244.1.11 (node-a)
#                                            10.244.2.1 -- pod 10.244.2.12 ("node-b")
set -e
OUT=${1:?usage: capture.sh OUTDIR}
WEIR=${WEIR:-/work/wt/tracemodel/target/debug/weir}
T=tm$$; N=$T-n; C=$T-c; P1=$T-1; P2=$T-2; D=/tmp/$T
inn() { ip netns exec "$@"; }
mkdir -p $D/m "$OUT"
cat > $D/m/services.yaml <<'YAML'
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.10
  ports: [{port: 80, targetPort: 8080, nodePort: 30080}]
status:
  loadBalancer: {ingress: [{ip: 192.0.2.80}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints:
  - {addresses: [10.244.1.11], nodeName: node-a}
  - {addresses: [10.244.2.12], nodeName: node-b}
---
apiVersion: v1
kind: Service
metadata: {name: loc, namespace: default}
spec:
  type: NodePort
  clusterIP: 10.96.0.11
  externalTrafficPolicy: Local
  ports: [{port: 80, targetPort: 8080, nodePort: 30081}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: loc-1, namespace: default, labels: {kubernetes.io/service-name: loc}}
addressType: IPv4
ports: [{port: 8080}]
endpoints:
  - {addresses: [10.244.1.11], nodeName: node-a}
  - {addresses: [10.244.2.12], nodeName: node-b}
---
apiVersion: v1
kind: Service
metadata: {name: empty, namespace: default}
spec:
  clusterIP: 10.96.0.12
  ports: [{port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: aff, namespace: default}
spec:
  clusterIP: 10.96.0.13
  sessionAffinity: ClientIP
  sessionAffinityConfig: {clientIP: {timeoutSeconds: 600}}
  ports: [{port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: aff-1, namespace: default, labels: {kubernetes.io/service-name: aff}}
addressType: IPv4
ports: [{port: 8080}]
endpoints:
  - {addresses: [10.244.1.11], nodeName: node-a}
  - {addresses: [10.244.2.12], nodeName: node-b}
YAML
for ns in $N $C $P1 $P2; do ip netns add $ns; inn $ns ip link set lo up; done
ip link add eth0 netns $N type veth peer name eth0 netns $C
inn $N ip addr add 10.0.0.1/24 dev eth0; inn $N ip link set eth0 up
inn $C ip addr add 10.0.0.2/24 dev eth0; inn $C ip link set eth0 up; inn $C ip route add default via 10.0.0.1
i=1; for P in $P1 $P2; do
  ip link add veth$i netns $N type veth peer name eth0 netns $P
  inn $N ip addr add 10.244.$i.1/24 dev veth$i; inn $N ip link set veth$i up
  inn $P ip addr add 10.244.$i.1$i/24 dev eth0; inn $P ip link set eth0 up; inn $P ip route add default via 10.244.$i.1
  i=$((i+1))
done
inn $N sysctl -qw net.ipv4.ip_forward=1
inn $N $WEIR proxy --proxy-mode ipvs --manifests $D/m --state-dir $D/state --cluster-cidr 10.244.0.0/16 \
  --hostname-override node-a --manifest-poll-interval 100ms --min-sync-period 0s >$D/proxy.log 2>&1 </dev/null &
PROXY=$!
end=$(($(date +%s) + 120))
until grep -q synced $D/proxy.log; do [ $(date +%s) -lt $end ] || { cat $D/proxy.log; exit 1; }; sleep 0.5; done
$WEIR trace collect --netns $N "$OUT"
inn $N ipvsadm -Sn > "$OUT/ipvsadm-Sn.txt"
inn $N ipset save > "$OUT/ipset-save.txt"
inn $N uname -r > "$OUT/uname-r.txt"
kill $PROXY; wait $PROXY 2>/dev/null || true
for ns in $N $C $P1 $P2; do ip netns del $ns; done
rm -rf $D
echo BEGIN-TAR; tar -C "$OUT" -cz . | base64; echo END-TAR
