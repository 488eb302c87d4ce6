//! IPv6 agreement with the kernel (root, ip6tables, nft): client — node — backend in network
//! namespaces, an IPv6 ClusterIP DNATed on the node (by ip6tables, then by nft) with a
//! reverse-path rule (`-m rpfilter --invert -j DROP`, then `fib saddr . iif oif missing
//! drop`). A real TCP connection from the client and `trace` on the node's live state must give
//! the same verdict; each case then flips the route that decides the reverse-path rule, so a
//! walk that always said "delivered" (or "dropped") fails. Neighbour discovery is the kernel's
//! here (trace assumes it works, and says so).

mod common;

use common::ns::Ns;

use std::net::TcpListener;
use std::time::Duration;

use weir_netdiag::trace::{self, Verdict};

/// How long a connection that the kernel lets through may take.
const CONNECT_LIMIT: Duration = Duration::from_secs(2);

/// Client fd00:50::2 — node (eth0 fd00:50::1, eth1 fd00:60::1, forwarding) — backend
/// fd00:60::2 listening on 8080. Addresses without duplicate address detection, so they are
/// usable at once.
fn topology(tag: &str) -> (Ns, Ns, Ns, TcpListener) {
    let client = Ns::new("wd6", &format!("{tag}c"));
    let node = Ns::new("wd6", &format!("{tag}n"));
    let backend = Ns::new("wd6", &format!("{tag}b"));
    node.sh(&format!(
        "ip link add eth0 type veth peer name c0 netns {} && ip link add eth1 type veth peer name b0 netns {}",
        client.0, backend.0
    ));
    node.sh("sysctl -qw net.ipv6.conf.all.forwarding=1 \
         && ip addr add fd00:50::1/64 dev eth0 nodad && ip addr add fd00:60::1/64 dev eth1 nodad \
         && ip link set eth0 up && ip link set eth1 up");
    client.sh(
        "ip addr add fd00:50::2/64 dev c0 nodad && ip link set c0 up \
         && ip -6 route add default via fd00:50::1 dev c0",
    );
    backend.sh(
        "ip addr add fd00:60::2/64 dev b0 nodad && ip link set b0 up \
         && ip -6 route add default via fd00:60::1 dev b0",
    );
    let listener = backend.listen("::", 8080);
    // The links settle (carrier, neighbour entries) before any verdict is compared.
    client.sh(
        "for i in 1 2 3 4 5 6 7 8 9 10; do ping -6 -c1 -W1 fd00:60::2 >/dev/null && exit 0; sleep 0.3; done; exit 1",
    );
    (client, node, backend, listener)
}

/// The kernel's and trace's verdicts for the client's connection to the ClusterIP, with the
/// trace (so a failing assertion can show it).
fn both(client: &Ns, node: &Ns, dst: &str, port: u16) -> (bool, trace::Trace) {
    let kernel = client.connects(&format!("[{dst}]:{port}"), CONNECT_LIMIT);
    let t = node.trace("fd00:50::2", dst, port, "eth0");
    (kernel, t)
}

/// A route on the node sending the client's address out of eth1: the reverse-path rule's
/// lookup then leaves by the wrong interface.
const WRONG_WAY: &str = "ip -6 route add fd00:50::2/128 via fd00:60::2 dev eth1";

fn needs() -> bool {
    weir_testkit::can_run(weir_testkit::missing(
        true,
        &["ip", "ip6tables-restore", "ip6tables-save", "nft", "ping"],
    ))
}

#[test]
fn v6_cluster_ip_by_ip6tables_with_rpfilter_agrees_with_the_kernel() {
    if !needs() {
        return;
    }
    let (client, node, _backend, _listener) = topology("i");
    node.sh(r#"ip6tables-restore <<'EOF'
*nat
:PREROUTING ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SEP-WEB - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-POSTROUTING - [0:0]
-A PREROUTING -j KUBE-SERVICES
-A POSTROUTING -j KUBE-POSTROUTING
-A KUBE-SERVICES -d fd00:96::10/128 -p tcp -m tcp --dport 80 -j KUBE-MARK-MASQ
-A KUBE-SERVICES -d fd00:96::10/128 -p tcp -m tcp --dport 80 -j KUBE-SEP-WEB
-A KUBE-SEP-WEB -p tcp -m tcp -j DNAT --to-destination [fd00:60::2]:8080
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MASQUERADE
COMMIT
*raw
:PREROUTING ACCEPT [0:0]
-A PREROUTING -m rpfilter --invert -j DROP
COMMIT
EOF"#);
    let (kernel, t) = both(&client, &node, "fd00:96::10", 80);
    assert!(kernel, "the kernel must DNAT and forward it");
    assert_eq!(t.verdict, Verdict::Delivered, "{:?}", t.cause);
    assert_eq!(t.endpoints, vec!["[fd00:60::2]:8080"]);

    node.sh(WRONG_WAY);
    let (kernel, t) = both(&client, &node, "fd00:96::10", 80);
    assert!(!kernel, "rpfilter must drop the request");
    assert_eq!(t.verdict, Verdict::Dropped);
    let cause = t.cause.as_deref().unwrap();
    assert!(cause.contains("-m rpfilter --invert -j DROP"), "{cause}");

    // Without the rule the request passes the node, and the kernel's reply goes the wrong
    // way (to the backend's side): both fail, for another reason than rpfilter.
    node.sh("ip6tables -t raw -F PREROUTING");
    let t = node.trace("fd00:50::2", "fd00:96::10", 80, "eth0");
    assert!(!t.cause.as_deref().unwrap_or("").contains("rpfilter"));
}

#[test]
fn v6_cluster_ip_by_nft_with_fib_agrees_with_the_kernel() {
    if !needs() {
        return;
    }
    let (client, node, _backend, _listener) = topology("n");
    node.sh(r#"nft -f - <<'EOF'
table inet weir {
  map svc6 { type ipv6_addr . inet_proto . inet_service : ipv6_addr . inet_service; elements = { fd00:96::10 . tcp . 80 : fd00:60::2 . 8080 } }
  chain raw-prerouting { type filter hook prerouting priority raw; policy accept;
    meta nfproto ipv6 fib saddr . iif oif missing drop
  }
  chain nat-prerouting { type nat hook prerouting priority dstnat; policy accept;
    ip6 daddr fd00:96::10 tcp dport 80 meta mark set meta mark | 0x4000
    dnat ip6 to ip6 daddr . meta l4proto . th dport map @svc6
  }
  chain nat-postrouting { type nat hook postrouting priority srcnat; policy accept;
    meta mark & 0x4000 == 0x4000 masquerade
  }
}
EOF"#);
    let (kernel, t) = both(&client, &node, "fd00:96::10", 80);
    assert!(kernel, "the kernel must DNAT and forward it");
    assert_eq!(t.verdict, Verdict::Delivered, "{:?}", t.cause);
    assert_eq!(t.endpoints, vec!["[fd00:60::2]:8080"]);

    node.sh(WRONG_WAY);
    let (kernel, t) = both(&client, &node, "fd00:96::10", 80);
    assert!(!kernel, "the fib rule must drop the request");
    assert_eq!(t.verdict, Verdict::Dropped);
    let cause = t.cause.as_deref().unwrap();
    assert!(cause.contains("fib saddr . iif oif missing"), "{cause}");
}

#[test]
fn v6_no_route_fails_in_the_kernel_and_in_trace() {
    if !needs() {
        return;
    }
    let (client, node, _backend, _listener) = topology("r");
    // Straight to the backend: no rules at all.
    let (kernel, t) = both(&client, &node, "fd00:60::2", 8080);
    assert!(kernel);
    assert_eq!(t.verdict, Verdict::Delivered, "{:?}", t.cause);
    assert!(t
        .assumptions
        .iter()
        .any(|a| a.contains("neighbour discovery is not modelled")));
    // Nowhere: the node has no route (and no default) for fd00:99::/64.
    let (kernel, t) = both(&client, &node, "fd00:99::1", 80);
    assert!(!kernel);
    assert_eq!(t.verdict, Verdict::Dropped);
    assert_eq!(t.cause.as_deref(), Some("routing: no route to fd00:99::1"));
    // An unreachable route: the same for both.
    node.sh("ip -6 route add unreachable fd00:60::2/128");
    let (kernel, t) = both(&client, &node, "fd00:60::2", 8080);
    assert!(!kernel);
    assert_eq!(t.verdict, Verdict::Dropped);
    assert!(
        t.cause.as_deref().unwrap().contains("unreachable"),
        "{:?}",
        t.cause
    );
}
