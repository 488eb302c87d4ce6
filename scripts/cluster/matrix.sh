#!/usr/bin/env bash
# The probe matrix of a cluster up.sh started, with demo.yaml applied: what answers from the
# client pod (node-2) and from outside (the control plane's namespace), as a table
# (--json: one object per probe). Exit status 1 when any probe fails.
# Usage: matrix.sh RUN_DIR [--json]
set -uo pipefail
R=${1:?usage: matrix.sh RUN_DIR [--json]}
JSON=${2:-}
# shellcheck disable=SC1091
. "$R/env"
k() { "$KUBECTL" "$@"; }
get() { # from a pod: the served page's last line (the pod's name)
  k exec client -- sh -c "printf 'GET / HTTP/1.0\r\n\r\n' | busybox nc -w 2 $1 $2 | busybox tail -n 1" 2>/dev/null; }
outside() { nsenter --net="/run/netns/$CP_NS" curl -sf -m 3 "$1" 2>/dev/null; }
failed=0
rows=()
probe() { # FROM TO WHAT EXPECT GOT
  local ok=yes
  case $4 in
    any) [ -n "$5" ] || ok=no ;;
    *) [[ $5 == *"$4"* ]] || ok=no ;;
  esac
  [ $ok = yes ] || failed=1
  rows+=("$1|$2|$3|$ok|$5")
}
cip=$(k get svc web -o jsonpath='{.spec.clusterIP}')
while read -r name ip node; do
  probe "client (node-2)" "$name ($node)" "pod IP $ip:8080" "$name" "$(get "$ip" 8080)"
done < <(k get pods -l app=web -o jsonpath='{range .items[*]}{.metadata.name} {.status.podIP} {.spec.nodeName}{"\n"}{end}')
seen=$(for _ in 1 2 3 4 5 6 7 8 9; do get "$cip" 80; echo; done | sort -u | grep -c .)
probe "client (node-2)" "web" "ClusterIP $cip:80 (9 tries)" "3 distinct" "$seen distinct pods"
for ip in $NODE_IPS; do
  probe "outside" "web-np" "NodePort $ip:30080" any "$(outside "http://$ip:30080/")"
done
dns() { k exec client -- busybox nslookup "$1" 2>/dev/null | grep -E "^Address: |canonical name" | grep -v ":53$" | tr '\n' ' '; }
probe "client (node-2)" "web" "DNS: web" "$cip" "$(dns web)"
probe "client (node-2)" "web-headless" "DNS: web-headless" "Address" "$(dns web-headless)"
probe "client (node-2)" "docs" "DNS: docs (ExternalName)" "canonical name" "$(dns docs)"
if [ "$JSON" = --json ]; then
  printf '%s\n' "${rows[@]}" | jq -R 'split("|") | {from: .[0], to: .[1], probe: .[2], ok: (.[3] == "yes"), got: .[4]}' | jq -s .
else
  { echo "FROM|TO|PROBE|OK|GOT"; printf '%s\n' "${rows[@]}"; } | column -t -s '|'
fi
exit $failed
