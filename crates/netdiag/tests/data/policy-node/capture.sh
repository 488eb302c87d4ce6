#!/bin/sh
# Recaptures this directory: node n1 of weir-policy's golden table
# (crates/policy/tests/golden/before.nft) in a network namespace of its own, as `weir trace
# collect` saves it. n1's pods (web-0 10.0.0.1, web-1 10.0.0.2, db-0 10.0.0.3, free-0
# 10.0.0.4) sit behind routed veths; n2's (10.0.1.0/24) behind 192.168.1.2 on eth0.
# Root; run from the workspace root after `cargo build -p weir`.
set -eu
dir=crates/netdiag/tests/data/policy-node
ns=wpcap-$$
ip netns add "$ns"
trap 'ip netns del "$ns"' EXIT
x() { ip netns exec "$ns" "$@"; }
x ip link set lo up
x ip link add eth0 type veth peer name ext0
x ip link set ext0 up
x ip addr add 192.168.1.1/24 dev eth0
x ip link set eth0 up
for p in web0:10.0.0.1 web1:10.0.0.2 db0:10.0.0.3 free0:10.0.0.4; do
	n=${p%%:*}
	a=${p#*:}
	x ip link add "v$n" type veth peer name "p$n"
	x ip link set "v$n" up
	x ip link set "p$n" up
	x ip route add "$a" dev "v$n" scope link
done
x ip route add 10.0.1.0/24 via 192.168.1.2 dev eth0
x ip route add default via 192.168.1.254 dev eth0
x sysctl -qw net.ipv4.ip_forward=1 net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0
for i in $(x ls /proc/sys/net/ipv4/conf); do x sysctl -qw "net.ipv4.conf.$i.rp_filter=0"; done
x nft -f crates/policy/tests/golden/before.nft
find "$dir" -type f ! -name capture.sh ! -name objects.yaml -delete
target/debug/weir trace collect "$dir" --netns "$ns"
# The namespace's name is this run's; keep the manifest stable.
sed -i "s/$ns/wpcap/g" "$dir/manifest.json"
