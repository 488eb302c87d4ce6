#!/usr/bin/env bash
# NetworkPolicy enforced on a cluster up.sh started, with demo.yaml applied (its client pod on
# node-2): a namespace with one httpd pod per node; the client reaches both; a default-deny
# ingress policy applied with kubectl drops both (weir's policy drops, so "no answer within
# nc's 2 s") while the client still reaches web in its own namespace; the policy deleted, both
# answer again. One PASS or FAIL line per step; exit status 1 on any FAIL.
# Usage: netpol.sh RUN_DIR
set -uo pipefail
R=${1:?usage: netpol.sh RUN_DIR}
# shellcheck disable=SC1091
. "$R/env"
k() { "$KUBECTL" "$@"; }
NS=weir-netpol-check
failed=0
pass() { echo "PASS  $*"; }
fail() { echo "FAIL  $*"; failed=1; }
get() { # from the client pod: the served page (the pod's name), empty when nothing answers
  k exec client -- sh -c "printf 'GET / HTTP/1.0\r\n\r\n' | busybox nc -w 2 $1 8080 | busybox tail -n 1" 2>/dev/null
}
# Policies converge asynchronously (watch, then the agent's sync): ask up to 30 times, and say
# after how many tries the expected state held.
until_state() { # IP answers|silent -> the tries it took, or nothing
  local got
  for try in $(seq 1 30); do
    got=$(get "$1")
    case $2 in
      answers) [ -n "$got" ] && { echo "$try"; return 0; } ;;
      silent) [ -z "$got" ] && { echo "$try"; return 0; } ;;
    esac
    sleep 1
  done
  return 1
}

k create namespace "$NS" >/dev/null
for node in node-1 node-2; do
  k apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: target-$node, namespace: $NS, labels: {app: target}}
spec:
  nodeName: $node
  terminationGracePeriodSeconds: 1
  containers:
  - name: httpd
    image: localhost/weir/busybox:1.35
    imagePullPolicy: Never
    command: ["/bin/sh", "-c", "mkdir -p /www && echo \$HOSTNAME > /www/index.html && exec busybox httpd -f -p 8080 -h /www"]
    readinessProbe: {tcpSocket: {port: 8080}, periodSeconds: 1}
EOF
done
k -n "$NS" wait --for=condition=Ready pod -l app=target --timeout=60s >/dev/null || fail "the target pods never became Ready"
mapfile -t targets < <(k -n "$NS" get pods -l app=target -o jsonpath='{range .items[*]}{.metadata.name} {.status.podIP} {.spec.nodeName}{"\n"}{end}')

for t in "${targets[@]}"; do
  read -r name ip node <<<"$t"
  got=$(get "$ip")
  if [ "$got" = "$name" ]; then pass "no policy: client (node-2) -> $name ($ip, $node) answers '$got'"
  else fail "no policy: client (node-2) -> $name ($ip, $node) got '$got', not '$name'"; fi
done

k apply -f - >/dev/null <<EOF
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: default-deny, namespace: $NS}
spec: {podSelector: {}, policyTypes: [Ingress]}
EOF
echo "      kubectl apply: NetworkPolicy $NS/default-deny (every pod, Ingress, no rule)"
for t in "${targets[@]}"; do
  read -r name ip node <<<"$t"
  if n=$(until_state "$ip" silent); then pass "default-deny: client (node-2) -> $name ($ip, $node) dropped (no answer; try $n)"
  else fail "default-deny: client (node-2) -> $name ($ip, $node) still answers after 30 tries"; fi
done
cip=$(k get svc web -o jsonpath='{.spec.clusterIP}')
# the web Service listens on 80, its pods on 8080
got=$(k exec client -- sh -c "printf 'GET / HTTP/1.0\r\n\r\n' | busybox nc -w 2 $cip 80 | busybox tail -n 1" 2>/dev/null)
if [[ $got == web-* ]]; then pass "default-deny is scoped: client -> web ClusterIP $cip (namespace default) answers '$got'"
else fail "default-deny in $NS also stopped client -> web ClusterIP $cip (got '$got')"; fi

k -n "$NS" delete networkpolicy default-deny >/dev/null
echo "      kubectl delete: NetworkPolicy $NS/default-deny"
for t in "${targets[@]}"; do
  read -r name ip node <<<"$t"
  if n=$(until_state "$ip" answers); then pass "policy deleted: client (node-2) -> $name ($ip, $node) answers again (try $n)"
  else fail "policy deleted: client (node-2) -> $name ($ip, $node) still silent after 30 tries"; fi
done

k delete namespace "$NS" --wait=false >/dev/null
exit $failed
