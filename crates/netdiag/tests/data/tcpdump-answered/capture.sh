#!/bin/bash
# A client, a node that DNATs 10.50.0.1:30080 to a backend 10.60.0.2:8080 and masquerades,
# and the backend; tcpdump -i any on the node during one connection. $1: "listen" or "drop"
# (the backend drops the SYN: the capture shows it leave and nothing come back).
set -e
p=tlcap$$
for n in cl nd be; do ip netns add $p-$n; ip -n $p-$n link set lo up; done
trap 'for n in cl nd be; do ip netns del $p-$n 2>/dev/null; done' EXIT
ip -n $p-nd link add eth0 type veth peer name c0 netns $p-cl
ip -n $p-nd link add eth1 type veth peer name b0 netns $p-be
ip -n $p-nd addr add 10.50.0.1/24 dev eth0; ip -n $p-nd addr add 10.60.0.1/24 dev eth1
ip -n $p-nd link set eth0 up; ip -n $p-nd link set eth1 up
ip netns exec $p-nd sysctl -qw net.ipv4.ip_forward=1
ip -n $p-cl addr add 10.50.0.2/24 dev c0; ip -n $p-cl link set c0 up; ip -n $p-cl route add default via 10.50.0.1
ip -n $p-be addr add 10.60.0.2/24 dev b0; ip -n $p-be link set b0 up
ip netns exec $p-nd iptables-legacy -t nat -A PREROUTING -p tcp --dport 30080 -j DNAT --to-destination 10.60.0.2:8080
ip netns exec $p-nd iptables-legacy -t nat -A POSTROUTING -o eth1 -j MASQUERADE
if [ "$1" = drop ]; then ip netns exec $p-be iptables-legacy -A INPUT -p tcp --dport 8080 -j DROP; fi
ip netns exec $p-be nc -l -p 8080 >/dev/null 2>&1 &
ncpid=$!
sleep 0.3
ip netns exec $p-nd tcpdump -i any -nn -l -c ${2:-6} tcp port 30080 or tcp port 8080 > cap.out 2> cap.err &
tdpid=$!
sleep 1
ip netns exec $p-cl timeout 2 bash -c 'echo hi > /dev/tcp/10.50.0.1/30080' 2>/dev/null || true
sleep 1.5
kill $tdpid 2>/dev/null || true; wait $tdpid 2>/dev/null || true
kill $ncpid 2>/dev/null || true
echo "root@node:~# tcpdump -i any -nn tcp port 30080 or tcp port 8080"
cat cap.err
cat cap.out
ip netns exec $p-nd iptables-legacy-save > node-iptables.txt
ip -n $p-nd route > node-routes.txt
ip -n $p-nd addr > node-addr.txt
ip netns exec $p-nd sysctl net.ipv4.ip_forward net.ipv4.conf.all.rp_filter net.ipv4.conf.eth0.rp_filter net.ipv4.conf.eth1.rp_filter net.ipv4.conf.all.src_valid_mark net.ipv4.conf.eth0.src_valid_mark net.ipv4.conf.eth1.src_valid_mark > node-sysctl.txt
